//! The cost of one `on_decision` on the hot path, against the plain prometheus-client way
//! (`Family::get_or_create` with an owned label set per call) and a no-op observer.
//!
//! `cargo bench -p distlimit-metrics --bench observer`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use distlimit_core::observe::{NoopObserver, Observer, Outcome};
use distlimit_core::{Decision, Source};
use distlimit_metrics::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    policy: String,
    outcome: &'static str,
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: String,
}

fn on_decision(c: &mut Criterion) {
    let decision = Decision::allowed(100, 50, Duration::from_secs(60));
    let latency = Duration::from_micros(3);
    let mut group = c.benchmark_group("on_decision");

    group.bench_function("noop", |b| {
        b.iter(|| {
            NoopObserver.on_decision(
                black_box("api"),
                Outcome::Allowed,
                black_box(&decision),
                latency,
            )
        })
    });

    let metrics = Metrics::new();
    group.bench_function("metrics_known_policy", |b| {
        b.iter(|| {
            metrics.on_decision(
                black_box("api"),
                Outcome::Allowed,
                black_box(&decision),
                latency,
            )
        })
    });

    let fallback = decision.with_source(Source::Fallback);
    group.bench_function("metrics_known_policy_fallback", |b| {
        b.iter(|| {
            metrics.on_decision(
                black_box("api"),
                Outcome::Allowed,
                black_box(&fallback),
                latency,
            )
        })
    });

    let capped = Metrics::builder().max_policies(0).build();
    group.bench_function("metrics_overflow_policy", |b| {
        b.iter(|| {
            capped.on_decision(
                black_box("api"),
                Outcome::Allowed,
                black_box(&decision),
                latency,
            )
        })
    });

    let decisions = Family::<Labels, Counter>::default();
    let durations = Family::<PolicyLabel, Histogram, _>::new_with_constructor(|| {
        Histogram::new(distlimit_metrics::DEFAULT_LATENCY_BUCKETS)
    });
    group.bench_function("plain_family_owned_labels", |b| {
        b.iter(|| {
            let policy: &str = black_box("api");
            let decision = black_box(&decision);
            decisions
                .get_or_create(&Labels {
                    policy: policy.to_owned(),
                    outcome: Outcome::Allowed.as_str(),
                    source: decision.source().as_str(),
                })
                .inc();
            durations
                .get_or_create(&PolicyLabel {
                    policy: policy.to_owned(),
                })
                .observe(latency.as_secs_f64());
        })
    });
    group.finish();
}

criterion_group!(benches, on_decision);
criterion_main!(benches);
