//! The series of a store's calls to its server: how many decisions each coalesced call carried,
//! the calls in flight and the callers waiting for one (`distlimit-redis`' coalescing).

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::labels::StoreLabels;

/// The upper bounds of `distlimit_store_call_decisions`' buckets: 1, 2, 4, … 128 (the Redis
/// store's largest coalesced call).
const CALL_BUCKETS: [f64; 8] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

fn call_histogram() -> Histogram {
    Histogram::new(CALL_BUCKETS)
}

/// The families fed by `distlimit_core::RedisObserver` (the Redis store's calls).
#[derive(Debug)]
pub(crate) struct CallFamilies {
    decisions: Family<StoreLabels, Histogram, fn() -> Histogram>,
    in_flight: Family<StoreLabels, Gauge>,
    waiting: Family<StoreLabels, Gauge>,
}

impl CallFamilies {
    pub(crate) fn new() -> Self {
        Self {
            decisions: Family::new_with_constructor(call_histogram),
            in_flight: Family::default(),
            waiting: Family::default(),
        }
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "store_call_decisions",
            "Decisions carried by one coalesced call to a store's server",
            self.decisions.clone(),
        );
        registry.register(
            "store_calls_in_flight",
            "Calls in flight on a store's connections (at most its pool size or call limit)",
            self.in_flight.clone(),
        );
        registry.register(
            "store_callers_waiting",
            "Decisions queued for a store's next call",
            self.waiting.clone(),
        );
    }

    pub(crate) fn on_coalesced(&self, store: &'static str, decisions: usize) {
        #[allow(clippy::cast_precision_loss)] // at most a few hundred: exact in an f64
        self.decisions
            .get_or_create(&StoreLabels { store })
            .observe(decisions as f64);
    }

    pub(crate) fn on_connections(&self, store: &'static str, in_flight: usize, waiting: usize) {
        let labels = StoreLabels { store };
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.in_flight.get_or_create(&labels).set(gauge(in_flight));
        self.waiting.get_or_create(&labels).set(gauge(waiting));
    }
}

#[cfg(test)]
mod tests {
    use distlimit_core::RedisObserver;

    use crate::Metrics;

    #[test]
    fn coalesced_calls_and_connections_are_exported() {
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
