//! envoyproxy/ratelimit's `share_threshold`, `value_to_metric` and `quota_mode` (per rule and
//! the global `--quota-mode`, `--shadow-mode`), applied by the decision of the
//! real binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use support::binary::Binary;
use support::*;

#[tokio::test]
async fn share_threshold_values_share_one_counter_and_others_do_not() {
    let dir = config_dir(
        "
domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: k
    value: v*
    rate_limit: { unit: hour, requests_per_unit: 1 }
",
    );
    let server = Binary::with_config(dir.path(), &[]);
    let mut c = server.client().await;
    align(3600, Duration::from_secs(2)).await;
    let one = |k: &str, v: &str| request("d", vec![descriptor(&[(k, v)])]);
    let a = call(&mut c, one("files", "files/a")).await;
    let b = call(&mut c, one("files", "files/b")).await;
    assert_eq!((a.overall_code, b.overall_code), (OK, OVER_LIMIT));
    // Without share_threshold each value has its own counter.
    let a = call(&mut c, one("k", "v1")).await;
    let b = call(&mut c, one("k", "v2")).await;
    assert_eq!((a.overall_code, b.overall_code), (OK, OK));
}

#[tokio::test]
async fn value_to_metric_names_the_decision_series_by_the_value() {
    let dir = config_dir(
        "
domain: d
descriptors:
  - key: user
    value: u*
    value_to_metric: true
    descriptors:
      - key: plan
        value: free
        rate_limit: { unit: hour, requests_per_unit: 5 }
",
    );
    let server = Binary::with_config(dir.path(), &[]);
    let mut c = server.client().await;
    let r = call(
        &mut c,
        request("d", vec![descriptor(&[("user", "u42"), ("plan", "free")])]),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    let text = server.metrics();
    let line = r#"distlimit_decisions_total{policy="d/user_u42.plan_free",outcome="allowed",source="primary"} 1"#;
    assert!(text.contains(line), "{line} missing from\n{text}");
}

const QUOTA: &str = "
domain: d
descriptors:
  - key: q
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: h
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: x
    rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: zero
    rate_limit: { unit: hour, requests_per_unit: 0 }
";

#[tokio::test]
async fn quota_mode_denies_only_when_every_quota_rule_is_over() {
    let dir = config_dir(QUOTA);
    let server = Binary::with_config(dir.path(), &[]);
    let mut c = server.client().await;
    align(3600, Duration::from_secs(2)).await;
    let d = |k: &'static str| descriptor(&[(k, "1")]);
    let both = || request("d", vec![d("q"), d("h")]);
    assert_eq!(call(&mut c, both()).await.overall_code, OK);
    // q is over its limit, h is not: OK, q's status still reads OVER_LIMIT, and h was charged
    // (q's denial vetoes nothing).
    let second = call(&mut c, both()).await;
    assert_eq!(second.overall_code, OK, "{second:?}");
    assert_eq!(second.statuses[0].code, OVER_LIMIT);
    assert_eq!(second.statuses[1].code, OK);
    assert_eq!(second.statuses[1].limit_remaining, 8);
    // Every quota rule over: OVER_LIMIT.
    let alone = call(&mut c, request("d", vec![d("q")])).await;
    assert_eq!(alone.overall_code, OVER_LIMIT);
    // A rule without quota_mode over its limit denies, whatever the quota rules say.
    let hard = call(&mut c, request("d", vec![d("h"), d("zero")])).await;
    assert_eq!(hard.overall_code, OVER_LIMIT, "{hard:?}");
    // The only quota rule over, an ordinary rule allowed: every quota rule is over, and the
    // denied request charged nothing.
    let mixed = call(&mut c, request("d", vec![d("q"), d("x")])).await;
    assert_eq!(mixed.overall_code, OVER_LIMIT, "{mixed:?}");
    // One quota rule over, one not, an ordinary rule allowed: OK, and both were charged (h was
    // not by the denied requests above, x not by the one before).
    let mixed = call(&mut c, request("d", vec![d("q"), d("h"), d("x")])).await;
    assert_eq!(mixed.overall_code, OK, "{mixed:?}");
    assert_eq!(mixed.statuses[0].code, OVER_LIMIT);
    assert_eq!(
        (
            mixed.statuses[1].limit_remaining,
            mixed.statuses[2].limit_remaining
        ),
        (7, 9)
    );
}

#[tokio::test]
async fn the_global_quota_mode_puts_every_descriptor_in_quota_mode() {
    let dir = config_dir(QUOTA);
    let server = Binary::with_config(dir.path(), &["--quota-mode"]);
    let mut c = server.client().await;
    align(3600, Duration::from_secs(2)).await;
    let d = |k: &'static str| descriptor(&[(k, "1")]);
    // The zero limit is over, x is not: OK.
    let r = call(&mut c, request("d", vec![d("zero"), d("x")])).await;
    assert_eq!(r.overall_code, OK, "{r:?}");
    assert_eq!(r.statuses[0].code, OVER_LIMIT);
    // Every descriptor over: OVER_LIMIT.
    let r = call(&mut c, request("d", vec![d("zero")])).await;
    assert_eq!(r.overall_code, OVER_LIMIT, "{r:?}");
    // An unmatched descriptor counts as a quota descriptor that passed (as in envoyproxy).
    let r = call(&mut c, request("d", vec![d("zero"), d("unknown")])).await;
    assert_eq!(r.overall_code, OK, "{r:?}");
}

#[tokio::test]
async fn the_global_shadow_mode_never_answers_over_limit() {
    let dir = config_dir(QUOTA);
    let server = Binary::with_config(dir.path(), &["--shadow-mode"]);
    let mut c = server.client().await;
    let r = call(&mut c, request("d", vec![descriptor(&[("zero", "1")])])).await;
    assert_eq!(r.overall_code, OK, "{r:?}");
    assert_eq!(r.statuses[0].code, OVER_LIMIT);
}

/// The forms of envoyproxy's YAML that were refused (a byte order mark, merge keys,
/// `metadata`, an empty `descriptors:`, `unlimited: true` with `requests_per_unit`) are served.
#[tokio::test]
async fn envoyproxys_yaml_forms_are_served() {
    let dir = config_dir(
        "\u{feff}domain: d
descriptors:
  - key: a
    metadata: { owner: { team: [x, y] } }
    rate_limit: &defaults
      unit: hour
      requests_per_unit: 7
  - key: b
    rate_limit:
      <<: *defaults
      requests_per_unit: 1
    descriptors:
  - key: c
    rate_limit: { unlimited: true, requests_per_unit: 10 }
",
    );
    let server = Binary::with_config(dir.path(), &[]);
    let mut c = server.client().await;
    align(3600, Duration::from_secs(2)).await;
    let one = |k: &str| request("d", vec![descriptor(&[(k, "1")])]);
    let a = call(&mut c, one("a")).await;
    assert_eq!((a.overall_code, a.statuses[0].limit_remaining), (OK, 6));
    let b = call(&mut c, one("b")).await;
    let limit = b.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (1, 3)); // the merged unit: HOUR
    assert_eq!(call(&mut c, one("b")).await.overall_code, OVER_LIMIT);
    let unlimited = call(&mut c, one("c")).await;
    assert_eq!(unlimited.statuses[0].limit_remaining, u32::MAX);
}
