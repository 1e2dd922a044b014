//! The exposition parses as strict OpenMetrics text, carries the expected series, and keeps the
//! `policy` label bounded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use distlimit_core::observe::{BreakerState, Observer, Outcome};
use distlimit_core::{Decision, Error, Source};
use distlimit_metrics::{Metrics, OVERFLOW_POLICY};
use prometheus_client::registry::Registry;
use support::openmetrics::parse;

const SECOND: Duration = Duration::from_secs(1);

fn allowed(remaining: u64) -> Decision {
    Decision::allowed(100, remaining, SECOND)
}

fn denied() -> Decision {
    Decision::denied(100, 0, SECOND, SECOND)
}

#[test]
fn every_event_shows_up_as_its_series() {
    let metrics = Metrics::new();
    let us = Duration::from_micros(1);
    metrics.on_decision("api", Outcome::Allowed, &allowed(50), 3 * us);
    metrics.on_decision("api", Outcome::Allowed, &allowed(10), 30 * us);
    metrics.on_decision("api", Outcome::Denied, &denied(), 300 * us);
    metrics.on_decision(
        "api",
        Outcome::Allowed,
        &allowed(99).with_source(Source::Fallback),
        us,
    );
    metrics.on_decision(
        "login",
        Outcome::Denied,
        &denied().with_source(Source::BlockedCache),
        us,
    );
    metrics.on_decision("login", Outcome::ShadowDenied, &denied(), us);
    metrics.on_decision(
        "login",
        Outcome::Allowed,
        &allowed(100).with_source(Source::FailOpen),
        Duration::from_secs(3),
    );
    let timeout = Error::Timeout {
        store: "redis",
        after: Duration::from_millis(50),
    };
    metrics.on_store_error("redis", "api", &timeout);
    metrics.on_store_error("redis", "login", &timeout);
    metrics.on_store_error("redis", "api", &Error::InvalidRequest("empty batch"));
    metrics.on_breaker("redis", BreakerState::Closed, BreakerState::Open);
    metrics.on_breaker("redis", BreakerState::Open, BreakerState::HalfOpen);
    metrics.on_evict("memory", 1);
    metrics.on_evict("memory", 2);

    let text = metrics.encode();
    let exposition = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));

    let decisions = |policy, outcome, source| {
        exposition.value(
            "distlimit_decisions_total",
            &[("policy", policy), ("outcome", outcome), ("source", source)],
        )
    };
    assert_eq!(decisions("api", "allowed", "primary"), Some(2.0));
    assert_eq!(decisions("api", "denied", "primary"), Some(1.0));
    assert_eq!(decisions("api", "allowed", "fallback"), Some(1.0));
    assert_eq!(decisions("login", "denied", "blocked_cache"), Some(1.0));
    assert_eq!(decisions("login", "shadow_denied", "primary"), Some(1.0));
    assert_eq!(decisions("login", "allowed", "fail_open"), Some(1.0));
    // Only combinations that happened are exported.
    assert_eq!(decisions("api", "shadow_denied", "primary"), None);
    assert_eq!(exposition.find("distlimit_decisions_total", &[]).len(), 6);

    let api = [("policy", "api")];
    assert_eq!(
        exposition.families["distlimit_decision_duration_seconds"],
        "histogram"
    );
    assert_eq!(
        exposition.value("distlimit_decision_duration_seconds_count", &api),
        Some(4.0)
    );
    let sum = exposition
        .value("distlimit_decision_duration_seconds_sum", &api)
        .unwrap();
    assert!((sum - 334e-6).abs() < 1e-12, "{sum}");
    let bucket = |le| {
        exposition.value(
            "distlimit_decision_duration_seconds_bucket",
            &[("policy", "api"), ("le", le)],
        )
    };
    assert_eq!(bucket("0.000001"), Some(1.0));
    assert_eq!(bucket("0.000005"), Some(2.0));
    assert_eq!(bucket("0.0001"), Some(3.0));
    assert_eq!(bucket("0.1"), Some(4.0));
    // A 3 s decision lands only in +Inf.
    let login_bucket = |le| {
        exposition.value(
            "distlimit_decision_duration_seconds_bucket",
            &[("policy", "login"), ("le", le)],
        )
    };
    assert_eq!(login_bucket("0.1"), Some(2.0));
    assert_eq!(login_bucket("+Inf"), Some(3.0));

    // remaining 10 of 100 is near the limit; 50, 99 and denials are not.
    assert_eq!(
        exposition.value("distlimit_near_limit_total", &api),
        Some(1.0)
    );
    assert_eq!(
        exposition.value("distlimit_near_limit_total", &[("policy", "login")]),
        Some(0.0)
    );

    let errors = |kind| {
        exposition.value(
            "distlimit_store_errors_total",
            &[("store", "redis"), ("kind", kind)],
        )
    };
    assert_eq!(errors("timeout"), Some(2.0));
    assert_eq!(errors("invalid_request"), Some(1.0));

    let state = |state| {
        exposition.value(
            "distlimit_breaker_state",
            &[("store", "redis"), ("state", state)],
        )
    };
    assert_eq!(state("closed"), Some(0.0));
    assert_eq!(state("open"), Some(0.0));
    assert_eq!(state("half_open"), Some(1.0));
    let transitions = |from, to| {
        exposition.value(
            "distlimit_breaker_transitions_total",
            &[("store", "redis"), ("from", from), ("to", to)],
        )
    };
    assert_eq!(transitions("closed", "open"), Some(1.0));
    assert_eq!(transitions("open", "half_open"), Some(1.0));
    assert_eq!(transitions("half_open", "closed"), None);

    assert_eq!(
        exposition.value("distlimit_evictions_total", &[("store", "memory")]),
        Some(3.0)
    );

    for family in [
        "distlimit_decisions",
        "distlimit_near_limit",
        "distlimit_store_errors",
        "distlimit_breaker_transitions",
        "distlimit_evictions",
    ] {
        assert_eq!(exposition.families[family], "counter", "{family}");
    }
    assert_eq!(exposition.families["distlimit_breaker_state"], "gauge");
    // No key ever reaches a label: the only label names are these.
    for sample in &exposition.samples {
        for name in sample.labels.keys() {
            assert!(
                [
                    "policy", "outcome", "source", "store", "kind", "state", "from", "to", "le"
                ]
                .contains(&name.as_str()),
                "{name}"
            );
        }
    }
}

#[test]
fn an_initial_breaker_state_is_exported_without_a_transition() {
    let metrics = Metrics::new();
    metrics.set_breaker_state("redis", BreakerState::Closed);
    let exposition = parse(&metrics.encode()).unwrap();
    let state = |state| {
        exposition.value(
            "distlimit_breaker_state",
            &[("store", "redis"), ("state", state)],
        )
    };
    assert_eq!(state("closed"), Some(1.0));
    assert_eq!(state("open"), Some(0.0));
    assert_eq!(state("half_open"), Some(0.0));
    assert!(
        exposition
            .find("distlimit_breaker_transitions_total", &[])
            .is_empty()
    );
}

#[test]
fn policy_label_values_are_capped_under_ten_thousand_names() {
    let metrics = Metrics::builder().max_policies(50).build();
    for i in 0..10_000 {
        let policy = format!("policy-{i}");
        metrics.on_decision(&policy, Outcome::Allowed, &allowed(1), Duration::ZERO);
    }
    assert_eq!(metrics.policy_labels(), 50);

    let exposition = parse(&metrics.encode()).unwrap();
    let decisions = exposition.find("distlimit_decisions_total", &[]);
    let policies: std::collections::BTreeSet<_> = decisions
        .iter()
        .map(|s| s.labels["policy"].clone())
        .collect();
    assert_eq!(policies.len(), 51);
    assert!(policies.contains(OVERFLOW_POLICY));
    assert!(policies.contains("policy-0") && policies.contains("policy-49"));
    assert!(!policies.contains("policy-50"));
    let other = [
        ("policy", OVERFLOW_POLICY),
        ("outcome", "allowed"),
        ("source", "primary"),
    ];
    assert_eq!(
        exposition.value("distlimit_decisions_total", &other),
        Some(9_950.0)
    );
    let total: f64 = decisions.iter().map(|s| s.value).sum();
    assert_eq!(total, 10_000.0);
    // Every per-policy family respects the same cap.
    assert_eq!(exposition.find("distlimit_near_limit_total", &[]).len(), 51);
    assert_eq!(
        exposition
            .find("distlimit_decision_duration_seconds_count", &[])
            .len(),
        51
    );
}

#[test]
fn concurrent_observers_lose_no_count() {
    let metrics = Metrics::new();
    let observer: Arc<dyn Observer> = Arc::new(metrics.clone());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let observer = observer.clone();
            std::thread::spawn(move || {
                for i in 0..5_000 {
                    // Policies appear concurrently, so their creation races too.
                    let policy = format!("p{}", (i + t) % 8);
                    observer.on_decision(&policy, Outcome::Denied, &denied(), Duration::ZERO);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let exposition = parse(&metrics.encode()).unwrap();
    let decisions = exposition.find("distlimit_decisions_total", &[("outcome", "denied")]);
    assert_eq!(decisions.len(), 8);
    assert_eq!(decisions.iter().map(|s| s.value).sum::<f64>(), 20_000.0);
}

#[test]
fn series_can_live_in_the_application_registry() {
    let metrics = Metrics::new();
    let mut registry = Registry::with_prefix("app");
    metrics.register_into(&mut registry);
    metrics.on_decision("api", Outcome::Allowed, &allowed(5), Duration::ZERO);

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let exposition = parse(&text).unwrap();
    let labels = [
        ("policy", "api"),
        ("outcome", "allowed"),
        ("source", "primary"),
    ];
    assert_eq!(
        exposition.value("app_distlimit_decisions_total", &labels),
        Some(1.0)
    );
    // The same series, not a copy.
    assert!(metrics.encode().contains(
        r#"distlimit_decisions_total{policy="api",outcome="allowed",source="primary"} 1"#
    ));
}

#[test]
fn the_parser_rejects_what_is_not_openmetrics() {
    let good = "# HELP a_total x\n# TYPE a counter\na_total 1\n# EOF\n";
    let good = good.replace("a_total x", "a x");
    assert!(parse(&good).is_ok());
    for bad in [
        "# TYPE a counter\na_total 1\n# EOF\n",       // no HELP
        "# HELP a x\n# TYPE a counter\na_total 1\n",  // no EOF
        "# HELP a x\n# TYPE a counter\na 1\n# EOF\n", // counter without _total
        "# HELP a x\n# TYPE a counter\na_total one\n# EOF\n", // value
        "# HELP a x\n# TYPE a counter\na_total{k=\"v} 1\n# EOF\n", // unterminated
        "# HELP a x\n# TYPE a counter\na_total 1\na_total 2\n# EOF\n", // duplicate
        "# HELP a x\n# TYPE a counter\nb_total 1\n# EOF\n", // undeclared
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
}
