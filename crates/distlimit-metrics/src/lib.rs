#![doc = include_str!("../README.md")]

mod labels;
mod policy;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use distlimit_core::observe::{BreakerState, Observer, Outcome, PolicyObserver};
use distlimit_core::{Decision, Error, PermitEvent, StreamEvent};
use prometheus_client::encoding::text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::labels::{
    BreakerLabels, EventLabels, PolicyLabels, StoreErrorLabels, StoreLabels, TransitionLabels,
};
use crate::policy::{Buckets, PolicyCache, PolicyFamilies};

/// The `Content-Type` of [`Metrics::encode`]'s output (OpenMetrics text, which Prometheus
/// scrapes natively).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `policy` label value shared by every policy past the
/// [`max_policies`](MetricsBuilder::max_policies) cap.
pub const OVERFLOW_POLICY: &str = "other";

/// How many distinct policy names get their own label value by default.
pub const DEFAULT_MAX_POLICIES: usize = 100;

/// A decision is near its limit when it was admitted and left fewer than this percentage of the
/// capacity (`remaining * 100 < limit * NEAR_LIMIT_PERCENT`).
pub const NEAR_LIMIT_PERCENT: u64 = 20;

/// The default latency buckets, in seconds: 1 µs to 100 ms in 1-2.5-5 steps. An in-process
/// decision takes tens of nanoseconds to a few microseconds, a Redis round trip 50 µs to a few
/// milliseconds, and a timeout the configured budget.
pub const DEFAULT_LATENCY_BUCKETS: [f64; 16] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
    5e-2, 1e-1,
];

/// Breaker states with their own `distlimit_breaker_state` series.
const BREAKER_STATES: [BreakerState; 3] = [
    BreakerState::Closed,
    BreakerState::Open,
    BreakerState::HalfOpen,
];

/// The upper bounds of `distlimit_store_call_decisions`' buckets: 1, 2, 4, … 128 (the Redis
/// store's largest coalesced call).
const CALL_BUCKETS: [f64; 8] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// The distlimit metrics: an [`Observer`] and its registry. Clones share the same series (the
/// handle is an `Arc`).
#[derive(Clone, Debug)]
pub struct Metrics {
    inner: Arc<Inner>,
}

/// Every family; the `help` texts of [`Inner::register`] say what each counts.
#[derive(Debug)]
struct Inner {
    registry: Registry,
    policy: PolicyFamilies,
    policies: PolicyCache,
    store_errors: Family<StoreErrorLabels, Counter>,
    breaker_state: Family<BreakerLabels, Gauge>,
    breaker_transitions: Family<TransitionLabels, Counter>,
    evictions: Family<StoreLabels, Counter>,
    lease_takes: Family<StoreLabels, Counter>,
    lease_taken: Family<StoreLabels, Counter>,
    lease_returned: Family<StoreLabels, Counter>,
    lease_held: Family<StoreLabels, Gauge>,
    permits: Family<EventLabels, Counter>,
    permits_held: Family<PolicyLabels, Gauge>,
    stream_units: Family<PolicyLabels, Counter>,
    stream_stopped: Family<PolicyLabels, Counter>,
    stream_blocks: Family<EventLabels, Counter>,
    stream_block_units: Family<EventLabels, Counter>,
    call_decisions: Family<StoreLabels, Histogram, fn() -> Histogram>,
    calls_in_flight: Family<StoreLabels, Gauge>,
    callers_waiting: Family<StoreLabels, Gauge>,
}

/// Configures [`Metrics`]: see [`Metrics::builder`].
#[derive(Clone, Debug)]
pub struct MetricsBuilder {
    max_policies: usize,
    buckets: Vec<f64>,
}

impl MetricsBuilder {
    /// How many distinct policy names get their own `policy` label value (default
    /// [`DEFAULT_MAX_POLICIES`]); decisions on further names count under [`OVERFLOW_POLICY`].
    #[must_use]
    pub fn max_policies(mut self, max: usize) -> Self {
        self.max_policies = max;
        self
    }

    /// The upper bounds, in seconds, of the decision latency histogram's buckets (default
    /// [`DEFAULT_LATENCY_BUCKETS`]). Values that are not finite are ignored; the rest are sorted
    /// and deduplicated.
    #[must_use]
    pub fn latency_buckets(mut self, buckets: impl IntoIterator<Item = f64>) -> Self {
        let mut buckets: Vec<f64> = buckets.into_iter().filter(|b| b.is_finite()).collect();
        buckets.sort_by(f64::total_cmp);
        buckets.dedup();
        self.buckets = buckets;
        self
    }

    /// Builds the metrics with their own registry (every series prefixed `distlimit_`).
    pub fn build(self) -> Metrics {
        let policy = PolicyFamilies {
            decisions: Family::default(),
            duration: Family::new_with_constructor(Buckets(self.buckets.into())),
            near_limit: Family::default(),
        };
        let mut inner = Inner {
            registry: Registry::with_prefix("distlimit"),
            policy,
            policies: PolicyCache::new(self.max_policies),
            store_errors: Family::default(),
            breaker_state: Family::default(),
            breaker_transitions: Family::default(),
            evictions: Family::default(),
            lease_takes: Family::default(),
            lease_taken: Family::default(),
            lease_returned: Family::default(),
            lease_held: Family::default(),
            permits: Family::default(),
            permits_held: Family::default(),
            stream_units: Family::default(),
            stream_stopped: Family::default(),
            stream_blocks: Family::default(),
            stream_block_units: Family::default(),
            call_decisions: Family::new_with_constructor(|| Histogram::new(CALL_BUCKETS)),
            calls_in_flight: Family::default(),
            callers_waiting: Family::default(),
        };
        let mut registry = std::mem::take(&mut inner.registry);
        inner.register(&mut registry);
        inner.registry = registry;
        Metrics {
            inner: Arc::new(inner),
        }
    }
}

impl Default for MetricsBuilder {
    fn default() -> Self {
        Self {
            max_policies: DEFAULT_MAX_POLICIES,
            buckets: DEFAULT_LATENCY_BUCKETS.to_vec(),
        }
    }
}

/// Registers each family (shared, not copied) under its name, with its help text.
macro_rules! register {
    ($registry:expr, $($family:expr => $name:literal, $help:literal;)*) => {
        $($registry.register($name, $help, $family.clone());)*
    };
}

impl Inner {
    fn register(&self, registry: &mut Registry) {
        register! { registry,
            self.policy.decisions => "decisions",
                "Rate-limit decisions by policy, outcome and the source that decided";
        }
        registry.register_with_unit(
            "decision_duration",
            "Time taken by one rate-limit decision",
            Unit::Seconds,
            self.policy.duration.clone(),
        );
        register! { registry,
            self.policy.near_limit => "near_limit",
                "Admitted decisions that left less than 20% of the capacity";
            self.store_errors => "store_errors",
                "Store failures by store and error kind, including those a fallback absorbed";
            self.breaker_state => "breaker_state",
                "Circuit breaker state: 1 for the current state, 0 for the others";
            self.breaker_transitions => "breaker_transitions", "Circuit breaker state changes";
            self.evictions => "evictions",
                "Live keys a store dropped to stay within its key cap; each starts over as fresh";
            self.lease_takes => "lease_takes",
                "Store calls of a lease client that withdrew units (leases taken)";
            self.lease_taken => "lease_taken_units", "Units a lease client withdrew from its store";
            self.lease_returned => "lease_returned_units",
                "Unspent units a lease client gave back when its leases ended";
            self.lease_held => "lease_held_units",
                "Units a lease client holds in leases now, all keys together";
            self.permits => "permits",
                "Concurrency permits by policy and event: acquired, rejected (the key was full), \
                 released, expired (found expired: a crashed or too slow holder)";
            self.permits_held => "permits_held",
                "Concurrency permits this process holds now (requests in flight), by policy";
            self.stream_units => "stream_units",
                "Units streamed responses passed on (metered as they streamed), by policy";
            self.stream_stopped => "stream_stopped",
                "Streamed responses stopped at their budget, by policy";
            self.stream_blocks => "stream_blocks",
                "Blocks of units reserved for streamed responses, and unused remainders returned \
                 when they ended, by policy and event";
            self.stream_block_units => "stream_block_units",
                "Units of the blocks of distlimit_stream_blocks_total, by policy and event";
            self.call_decisions => "store_call_decisions",
                "Decisions carried by one coalesced call to a store's server";
            self.calls_in_flight => "store_calls_in_flight",
                "Calls in flight on a store's connections (at most its pool size or call limit)";
            self.callers_waiting => "store_callers_waiting",
                "Decisions queued for a store's next call";
        }
    }
}

/// `n` as a gauge value, saturating.
fn gauge(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

impl Metrics {
    /// Metrics with the default configuration and their own registry.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder: policy label cap, latency buckets.
    pub fn builder() -> MetricsBuilder {
        MetricsBuilder::default()
    }

    /// Registers the same series (shared, not copied) into another registry, under a
    /// `distlimit_` prefix, for applications that expose one registry of their own.
    pub fn register_into(&self, registry: &mut Registry) {
        self.inner
            .register(registry.sub_registry_with_prefix("distlimit"));
    }

    /// Writes the OpenMetrics text exposition (ending with `# EOF`) to `writer`.
    ///
    /// # Errors
    ///
    /// Only those of `writer`.
    pub fn encode_to(&self, writer: &mut impl fmt::Write) -> fmt::Result {
        text::encode(writer, &self.inner.registry)
    }

    /// The OpenMetrics text exposition, served with [`CONTENT_TYPE`].
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(4096);
        // Writing to a `String` cannot fail, and the label encoders only fail with the writer.
        let _ = self.encode_to(&mut out);
        out
    }

    /// Sets `distlimit_breaker_state` of `store` to `state` without counting a transition: for
    /// a breaker's initial state, so that its series exist before the first transition.
    pub fn set_breaker_state(&self, store: &'static str, state: BreakerState) {
        for s in BREAKER_STATES.into_iter().chain([state]) {
            let labels = BreakerLabels {
                store,
                state: s.as_str(),
            };
            self.inner
                .breaker_state
                .get_or_create(&labels)
                .set(i64::from(s == state));
        }
    }

    /// How many policy names have their own label value (at most
    /// [`max_policies`](MetricsBuilder::max_policies)).
    pub fn policy_labels(&self) -> usize {
        self.inner.policies.len()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether an admitted `decision` left less than [`NEAR_LIMIT_PERCENT`] of its capacity.
pub fn is_near_limit(decision: &Decision) -> bool {
    decision.is_allowed()
        && u128::from(decision.remaining()) * 100
            < u128::from(decision.limit()) * u128::from(NEAR_LIMIT_PERCENT)
}

impl Observer for Metrics {
    fn on_decision(&self, policy: &str, outcome: Outcome, decision: &Decision, latency: Duration) {
        let inner = &*self.inner;
        inner.policies.with(policy, &inner.policy, |metrics| {
            metrics.on_decision(outcome, decision, latency);
        });
    }

    /// The policy's series, looked up (and its label created) once.
    fn policy_observer(&self, policy: &str) -> Option<Arc<dyn PolicyObserver>> {
        let inner = &*self.inner;
        Some(inner.policies.get(policy, &inner.policy))
    }

    fn on_store_error(&self, store: &'static str, _policy: &str, error: &Error) {
        self.inner
            .store_errors
            .get_or_create(&StoreErrorLabels {
                store,
                kind: error.kind(),
            })
            .inc();
    }

    fn on_breaker(&self, store: &'static str, from: BreakerState, to: BreakerState) {
        self.set_breaker_state(store, to);
        self.inner
            .breaker_transitions
            .get_or_create(&TransitionLabels {
                store,
                from: from.as_str(),
                to: to.as_str(),
            })
            .inc();
    }

    fn on_evict(&self, store: &'static str, evicted: u64) {
        self.inner
            .evictions
            .get_or_create(&StoreLabels { store })
            .inc_by(evicted);
    }

    fn on_permits(&self, policy: &str, event: PermitEvent, count: u64) {
        if count == 0 {
            return;
        }
        let policy: Arc<str> = policy.into();
        let event_labels = EventLabels {
            policy: policy.clone(),
            event: event.as_str(),
        };
        self.inner
            .permits
            .get_or_create(&event_labels)
            .inc_by(count);
        let held = match event {
            PermitEvent::Acquired => gauge(count),
            PermitEvent::Released => -gauge(count),
            _ => return,
        };
        let labels = PolicyLabels { policy };
        self.inner.permits_held.get_or_create(&labels).inc_by(held);
    }

    fn on_stream(&self, policy: &str, event: StreamEvent, units: u64) {
        let policy: Arc<str> = policy.into();
        let inner = &*self.inner;
        match event {
            StreamEvent::Metered => {
                let labels = PolicyLabels { policy };
                inner.stream_units.get_or_create(&labels).inc_by(units);
            }
            StreamEvent::Stopped => {
                inner
                    .stream_stopped
                    .get_or_create(&PolicyLabels { policy })
                    .inc();
            }
            _ => {
                let labels = EventLabels {
                    policy,
                    event: event.as_str(),
                };
                inner.stream_blocks.get_or_create(&labels).inc();
                inner
                    .stream_block_units
                    .get_or_create(&labels)
                    .inc_by(units);
            }
        }
    }
}

/// The lease client's events: `distlimit_lease_*`.
impl distlimit_core::LeaseObserver for Metrics {
    fn on_lease_taken(&self, store: &'static str, _policy: &str, units: u64) {
        if units > 0 {
            let labels = StoreLabels { store };
            self.inner.lease_takes.get_or_create(&labels).inc();
            self.inner.lease_taken.get_or_create(&labels).inc_by(units);
        }
    }

    fn on_lease_returned(&self, store: &'static str, _policy: &str, units: u64) {
        let labels = StoreLabels { store };
        self.inner
            .lease_returned
            .get_or_create(&labels)
            .inc_by(units);
    }

    fn on_lease_units(&self, store: &'static str, held: u64) {
        let labels = StoreLabels { store };
        self.inner
            .lease_held
            .get_or_create(&labels)
            .set(gauge(held));
    }
}

/// The Redis store's calls: `distlimit_store_call_decisions`, `distlimit_store_calls_in_flight`,
/// `distlimit_store_callers_waiting`.
impl distlimit_core::RedisObserver for Metrics {
    fn on_coalesced(&self, store: &'static str, decisions: usize) {
        #[allow(clippy::cast_precision_loss)] // at most a few hundred: exact in an f64
        let decisions = decisions as f64;
        let labels = StoreLabels { store };
        self.inner
            .call_decisions
            .get_or_create(&labels)
            .observe(decisions);
    }

    fn on_connections(&self, store: &'static str, in_use: usize, waiting: usize) {
        let labels = StoreLabels { store };
        self.inner
            .calls_in_flight
            .get_or_create(&labels)
            .set(gauge(in_use));
        self.inner
            .callers_waiting
            .get_or_create(&labels)
            .set(gauge(waiting));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn near_limit_is_under_twenty_percent_of_admitted() {
        let reset = Duration::from_secs(1);
        assert!(!is_near_limit(&Decision::allowed(100, 20, reset)));
        assert!(is_near_limit(&Decision::allowed(100, 19, reset)));
        assert!(is_near_limit(&Decision::allowed(10, 1, reset)));
        assert!(!is_near_limit(&Decision::allowed(10, 2, reset)));
        assert!(!is_near_limit(&Decision::denied(100, 0, reset, reset)));
        assert!(!is_near_limit(&Decision::allowed(
            u64::MAX,
            u64::MAX,
            reset
        )));
    }

    #[test]
    fn a_policy_handle_counts_like_decisions_by_name() {
        let metrics = Metrics::builder().max_policies(1).build();
        let allowed = Decision::allowed(10, 9, Duration::from_secs(1));
        let latency = Duration::from_micros(3);
        let api = metrics.policy_observer("api").unwrap();
        api.on_decision(Outcome::Allowed, &allowed, latency);
        metrics.on_decision("api", Outcome::Allowed, &allowed, latency);
        // Past the cap, the handle is the overflow label's.
        let other = metrics.policy_observer("login").unwrap();
        other.on_decision(Outcome::Denied, &allowed, latency);
        let text = metrics.encode();
        let line = |series: &str| {
            text.lines()
                .find(|l| l.starts_with(series))
                .map(str::to_owned)
        };
        let decisions =
            r#"distlimit_decisions_total{policy="api",outcome="allowed",source="primary"}"#;
        assert_eq!(line(decisions), Some(format!("{decisions} 2")));
        let count = r#"distlimit_decision_duration_seconds_count{policy="api"}"#;
        assert_eq!(line(count), Some(format!("{count} 2")));
        let overflow =
            r#"distlimit_decisions_total{policy="other",outcome="denied",source="primary"}"#;
        assert_eq!(line(overflow), Some(format!("{overflow} 1")));
        assert_eq!(metrics.policy_labels(), 1);
    }

    #[test]
    fn stream_events_are_counted_by_policy() {
        let metrics = Metrics::new();
        metrics.on_stream("tokens", StreamEvent::Reserved, 100);
        metrics.on_stream("tokens", StreamEvent::Reserved, 40);
        metrics.on_stream("tokens", StreamEvent::Returned, 7);
        metrics.on_stream("tokens", StreamEvent::Metered, 133);
        metrics.on_stream("tokens", StreamEvent::Stopped, 1);
        let text = metrics.encode();
        for series in [
            r#"distlimit_stream_units_total{policy="tokens"} 133"#,
            r#"distlimit_stream_stopped_total{policy="tokens"} 1"#,
            r#"distlimit_stream_blocks_total{policy="tokens",event="reserved"} 2"#,
            r#"distlimit_stream_block_units_total{policy="tokens",event="reserved"} 140"#,
            r#"distlimit_stream_blocks_total{policy="tokens",event="returned"} 1"#,
            r#"distlimit_stream_block_units_total{policy="tokens",event="returned"} 7"#,
        ] {
            assert!(text.lines().any(|l| l == series), "{series} in\n{text}");
        }
    }

    #[test]
    fn buckets_are_sorted_finite_and_unique() {
        let builder = Metrics::builder().latency_buckets([0.5, f64::NAN, 0.1, 0.5, f64::INFINITY]);
        assert_eq!(builder.buckets, vec![0.1, 0.5]);
    }

    #[test]
    fn coalesced_calls_and_connections_are_exported() {
        use distlimit_core::RedisObserver;
        let metrics = Metrics::new();
        metrics.on_coalesced("redis", 3);
        metrics.on_coalesced("redis", 100);
        metrics.on_connections("redis", 2, 5);
        let text = metrics.encode();
        for line in [
            r#"distlimit_store_call_decisions_count{store="redis"} 2"#,
            r#"distlimit_store_call_decisions_sum{store="redis"} 103.0"#,
            r#"distlimit_store_calls_in_flight{store="redis"} 2"#,
            r#"distlimit_store_callers_waiting{store="redis"} 5"#,
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }
}
