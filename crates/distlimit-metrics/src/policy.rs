//! Per-policy metric handles, cached so that a decision on a known policy costs one hash lookup
//! and no allocation: `Family::get_or_create` wants an owned label set, which for a policy name
//! means an allocation per call.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use std::time::Duration;

use distlimit_core::{Decision, Outcome, PolicyObserver, Source};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::histogram::Histogram;

use crate::labels::{DecisionLabels, PolicyLabels};

/// Outcomes with a cached counter (`Outcome` is non-exhaustive: others take the slow path).
const OUTCOMES: usize = 3;
/// Sources with a cached counter (`Source` is non-exhaustive: others take the slow path).
const SOURCES: usize = 4;

/// Builds the latency histograms with the configured buckets.
#[derive(Clone, Debug)]
pub(crate) struct Buckets(pub(crate) Arc<[f64]>);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

/// The families with a `policy` label.
#[derive(Clone, Debug)]
pub(crate) struct PolicyFamilies {
    pub(crate) decisions: Family<DecisionLabels, Counter>,
    pub(crate) duration: Family<PolicyLabels, Histogram, Buckets>,
    pub(crate) near_limit: Family<PolicyLabels, Counter>,
}

/// The handles of one policy label value: what [`Metrics`](crate::Metrics) hands out as the
/// policy's [`PolicyObserver`].
#[derive(Debug)]
pub(crate) struct PolicyMetrics {
    label: Arc<str>,
    /// The family its decision counters are created in, on first use.
    family: Family<DecisionLabels, Counter>,
    /// `[outcome][source]`, created on first use so that only combinations that happened are
    /// exported.
    decisions: [[OnceLock<Counter>; SOURCES]; OUTCOMES],
    pub(crate) duration: Histogram,
    pub(crate) near_limit: Counter,
}

impl PolicyMetrics {
    fn new(label: Arc<str>, families: &PolicyFamilies) -> Self {
        let labels = PolicyLabels {
            policy: label.clone(),
        };
        Self {
            duration: families.duration.get_or_create_owned(&labels),
            near_limit: families.near_limit.get_or_create_owned(&labels),
            decisions: Default::default(),
            family: families.decisions.clone(),
            label,
        }
    }

    /// Counts one decision.
    fn count(&self, outcome: Outcome, source: Source) {
        let labels = || DecisionLabels {
            policy: self.label.clone(),
            outcome: outcome.as_str(),
            source: source.as_str(),
        };
        match (outcome_index(outcome), source_index(source)) {
            (Some(o), Some(s)) => self.decisions[o][s]
                .get_or_init(|| self.family.get_or_create_owned(&labels()))
                .inc(),
            _ => self.family.get_or_create(&labels()).inc(),
        };
    }
}

impl PolicyObserver for PolicyMetrics {
    fn on_decision(&self, outcome: Outcome, decision: &Decision, latency: Duration) {
        self.count(outcome, decision.source());
        self.duration.observe(latency.as_secs_f64());
        if crate::is_near_limit(decision) {
            self.near_limit.inc();
        }
    }
}

fn outcome_index(outcome: Outcome) -> Option<usize> {
    match outcome {
        Outcome::Allowed => Some(0),
        Outcome::Denied => Some(1),
        Outcome::ShadowDenied => Some(2),
        _ => None,
    }
}

fn source_index(source: Source) -> Option<usize> {
    match source {
        Source::Primary => Some(0),
        Source::Fallback => Some(1),
        Source::BlockedCache => Some(2),
        Source::FailOpen => Some(3),
        _ => None,
    }
}

type Map = HashMap<Arc<str>, Arc<PolicyMetrics>, foldhash::fast::RandomState>;

/// Policy name → handles, read without locks (`ArcSwap`), copied on insert. At most `max`
/// names get their own label value; later ones share [`OVERFLOW_POLICY`](crate::OVERFLOW_POLICY).
#[derive(Debug)]
pub(crate) struct PolicyCache {
    map: ArcSwap<Map>,
    insert: Mutex<()>,
    overflow: OnceLock<Arc<PolicyMetrics>>,
    max: usize,
}

impl PolicyCache {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            map: ArcSwap::from_pointee(Map::default()),
            insert: Mutex::new(()),
            overflow: OnceLock::new(),
            max,
        }
    }

    /// The handles of `policy`, created (or, past the cap, the overflow label's) the first
    /// time.
    pub(crate) fn get(&self, policy: &str, families: &PolicyFamilies) -> Arc<PolicyMetrics> {
        if let Some(metrics) = self.map.load().get(policy) {
            return metrics.clone();
        }
        self.insert(policy, families)
            .unwrap_or_else(|| self.overflow(families))
    }

    /// Runs `f` on the handles of `policy`, creating them (or falling back to the overflow
    /// label) the first time.
    pub(crate) fn with<R>(
        &self,
        policy: &str,
        families: &PolicyFamilies,
        f: impl FnOnce(&PolicyMetrics) -> R,
    ) -> R {
        if let Some(metrics) = self.map.load().get(policy) {
            return f(metrics);
        }
        f(&self.get(policy, families))
    }

    /// The handles every policy past the cap shares.
    fn overflow(&self, families: &PolicyFamilies) -> Arc<PolicyMetrics> {
        let overflow = self.overflow.get_or_init(|| {
            let label = Arc::from(crate::OVERFLOW_POLICY);
            Arc::new(PolicyMetrics::new(label, families))
        });
        overflow.clone()
    }

    /// The number of policies with their own label value.
    pub(crate) fn len(&self) -> usize {
        self.map.load().len()
    }

    fn insert(&self, policy: &str, families: &PolicyFamilies) -> Option<Arc<PolicyMetrics>> {
        let _guard = self.insert.lock();
        let current = self.map.load_full();
        if let Some(metrics) = current.get(policy) {
            return Some(metrics.clone());
        }
        if current.len() >= self.max {
            return None;
        }
        let label: Arc<str> = Arc::from(policy);
        let metrics = Arc::new(PolicyMetrics::new(label.clone(), families));
        let mut next = Map::clone(&current);
        next.insert(label, metrics.clone());
        self.map.store(Arc::new(next));
        Some(metrics)
    }
}
