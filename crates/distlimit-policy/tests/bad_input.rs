//! Every kind of invalid configuration gives one clear error naming the policy and the field,
//! and a running limiter fed the bad file through the hot reload keeps deciding with its old set.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use distlimit_test::replace_file;
use std::sync::Arc;
use std::time::Duration;

use distlimit_memory::MemoryStore;
use std::error::Error;

use distlimit_policy::{Field, Limiter, PolicySet, Reload, watch};

use crate::support;
use support::next;

const GOOD: &str = r#"
[[policy]]
name = "api"
tiers = [ { name = "t", limit = 2, per = "1h" } ]
"#;

/// (what is wrong, the file, the exact error).
const CASES: &[(&str, &str, &str)] = &[
    (
        "unknown algorithm",
        r#"[[policy]]
name = "api"
tiers = [ { name = "burst", algorithm = "leaky_bucket", limit = 1, per = "1s" } ]"#,
        r#"policy "api", tier "burst": algorithm: unknown algorithm "leaky_bucket": expected token_bucket, gcra, fixed_window, sliding_log or sliding_window"#,
    ),
    (
        "zero limit",
        r#"[[policy]]
name = "api"
tiers = [ { name = "burst", limit = 0, per = "1s" } ]"#,
        r#"policy "api", tier "burst": limit: must be at least 1"#,
    ),
    (
        "zero period",
        r#"[[policy]]
name = "api"
tiers = [ { name = "burst", limit = 1, per = "0s" } ]"#,
        r#"policy "api", tier "burst": per: must be at least 1µs"#,
    ),
    (
        "zero burst",
        r#"[[policy]]
name = "api"
tiers = [ { name = "burst", limit = 1, per = "1s", burst = 0 } ]"#,
        r#"policy "api", tier "burst": burst: must be at least 1"#,
    ),
    (
        "limit too large",
        r#"[[policy]]
name = "api"
tiers = [ { name = "burst", limit = 99999999999, per = "1s" } ]"#,
        r#"policy "api", tier "burst": limit: 99999999999 exceeds 4294967296, the largest limit computed exactly"#,
    ),
    (
        "malformed duration",
        r#"[[policy]]
name = "api"
tiers = [ { name = "burst", limit = 1, per = "1 minute" } ]"#,
        r#"policy "api", tier "burst": per: "1 minute" is not a duration: expected a whole number and a unit (us, ms, s, m, h, d), such as "1s" or "15m""#,
    ),
    (
        "burst on a window algorithm",
        r#"[[policy]]
name = "api"
tiers = [ { name = "day", algorithm = "fixed_window", limit = 10, per = "1d", burst = 20 } ]"#,
        r#"policy "api", tier "day": burst: fixed_window has no burst (its capacity is the limit); remove the burst or use token_bucket or gcra"#,
    ),
    (
        "unknown scope",
        r#"[[policy]]
name = "api"
tiers = [ { name = "t", limit = 1, per = "1s", scope = "tenant" } ]"#,
        r#"policy "api", tier "t": scope: unknown scope "tenant": expected key or global"#,
    ),
    (
        "duplicate policy names",
        r#"[[policy]]
name = "api"
tiers = [ { name = "t", limit = 1, per = "1s" } ]
[[policy]]
name = "api"
tiers = [ { name = "t", limit = 2, per = "1s" } ]"#,
        r#"policy "api": name: two policies have this name"#,
    ),
    (
        "duplicate tier names",
        r#"[[policy]]
name = "api"
tiers = [ { name = "t", limit = 1, per = "1s" }, { name = "t", limit = 5, per = "1m" } ]"#,
        r#"policy "api", tier "t": name: two tiers have this name"#,
    ),
    (
        "no tiers",
        r#"[[policy]]
name = "api"
tiers = []"#,
        r#"policy "api": tiers: at least one tier is needed"#,
    ),
    (
        "too many tiers",
        r#"[[policy]]
name = "api"
tiers = [
  { name = "a", limit = 1, per = "1s" }, { name = "b", limit = 1, per = "1s" },
  { name = "c", limit = 1, per = "1s" }, { name = "d", limit = 1, per = "1s" },
  { name = "e", limit = 1, per = "1s" }, { name = "f", limit = 1, per = "1s" },
  { name = "g", limit = 1, per = "1s" }, { name = "h", limit = 1, per = "1s" },
  { name = "i", limit = 1, per = "1s" },
]"#,
        r#"policy "api": tiers: 9 tiers apply to one request, at most 8"#,
    ),
    (
        "a slash in a name",
        r#"[[policy]]
name = "api/v2"
tiers = [ { name = "t", limit = 1, per = "1s" } ]"#,
        r#"policy "api/v2": name: must not contain '/'"#,
    ),
    (
        "an empty policy name",
        r#"[[policy]]
name = ""
tiers = [ { name = "t", limit = 1, per = "1s" } ]"#,
        r#"policy "": name: must not be empty"#,
    ),
    (
        "a key on both lists",
        r#"[[policy]]
name = "api"
allow = ["10.0.0.1"]
deny = ["10.0.0.1"]
tiers = [ { name = "t", limit = 1, per = "1s" } ]"#,
        r#"policy "api": deny: key "10.0.0.1" is already listed in allow"#,
    ),
    (
        "an empty key",
        r#"[[policy]]
name = "api"
deny = [""]
tiers = [ { name = "t", limit = 1, per = "1s" } ]"#,
        r#"policy "api": deny: invalid key "": empty"#,
    ),
    (
        "a global tier in an override",
        r#"[[policy]]
name = "api"
tiers = [ { name = "t", limit = 1, per = "1s" } ]
[[policy.override]]
key = "tenant-42"
tiers = [ { name = "t", limit = 9, per = "1s", scope = "global" } ]"#,
        r#"policy "api", override "tenant-42", tier "t": scope: an override holds per-key tiers; global tiers belong to the policy"#,
    ),
    (
        "an invalid tier in an override",
        r#"[[policy]]
name = "api"
tiers = [ { name = "t", limit = 1, per = "1s" } ]
[[policy.override]]
key = "tenant-42"
tiers = [ { name = "t", algorithm = "token-bucket", limit = 9, per = "1s" } ]"#,
        r#"policy "api", override "tenant-42", tier "t": algorithm: unknown algorithm "token-bucket": expected token_bucket, gcra, fixed_window, sliding_log or sliding_window"#,
    ),
    (
        "malformed TOML",
        "[[policy]]\nname = \"api\"\ntiers = [ { name = \"t\", limit = 1, per = \"1s\" ",
        "toml: invalid at line 3, column 46",
    ),
    (
        "an unknown field",
        r#"[[policy]]
name = "api"
limit = 5
tiers = [ { name = "t", limit = 1, per = "1s" } ]"#,
        "toml: invalid at line 3, column 1",
    ),
    (
        "a missing field",
        r#"[[policy]]
name = "api"
tiers = [ { name = "t", limit = 1 } ]"#,
        "toml: invalid at line 3, column 11",
    ),
    (
        "a wrong type",
        r#"[[policy]]
name = "api"
tiers = [ { name = "t", limit = "ten", per = "1s" } ]"#,
        "toml: invalid at line 3, column 33",
    ),
];

#[test]
fn every_invalid_config_is_one_clear_line() {
    for (what, text, expected) in CASES {
        let e = PolicySet::from_toml_str(text).unwrap_err();
        assert_eq!(e.to_string(), *expected, "{what}");
        // A TOML error is the cause, kept as the source (and not repeated in the line).
        let toml_cause = e.source().is_some_and(|s| s.is::<toml::de::Error>());
        assert_eq!(toml_cause, e.field() == Field::Toml, "{what}");
    }
}

#[test]
fn an_empty_or_half_written_file_is_refused() {
    for text in ["", "\n# limits\n", "[[policy]]\nname = \"api\"\n"] {
        let e = PolicySet::from_toml_str(text).unwrap_err();
        assert!(
            matches!(e.field(), Field::Policy | Field::Toml),
            "{text:?}: {e}"
        );
    }
    assert_eq!(
        PolicySet::from_toml_str("").unwrap_err().field(),
        Field::Policy
    );
}

#[test]
fn a_long_name_is_not_echoed_whole() {
    let name = "x".repeat(5_000);
    let text = format!(
        "[[policy]]\nname = \"{name}\"\ntiers = [ {{ name = \"t\", limit = 1, per = \"1s\" }} ]"
    );
    let e = PolicySet::from_toml_str(&text).unwrap_err();
    assert_eq!(e.field(), Field::Name);
    assert_eq!(e.policy(), Some(format!("{}…", "x".repeat(64)).as_str()));
    assert!(e.to_string().len() < 120, "{e}");
}

#[tokio::test]
async fn a_bad_file_keeps_the_running_set() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    replace_file(&path, GOOD).unwrap();
    let limiter = Arc::new(Limiter::new(
        Arc::new(MemoryStore::new()),
        PolicySet::from_toml_str(GOOD).unwrap(),
    ));
    let watcher = watch(&limiter, &path, Duration::from_millis(5)).unwrap();
    let mut rx = watcher.subscribe();
    assert_eq!(next(&mut rx).await, Reload::Applied { generation: 1 });
    let running = limiter.policies();
    assert!(limiter.check("api", b"k").await.unwrap().is_allowed());

    for (what, text, expected) in CASES {
        replace_file(&path, text).unwrap();
        match next(&mut rx).await {
            Reload::Rejected { error } => assert_eq!(error.to_string(), *expected, "{what}"),
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(watcher.last_error().unwrap().to_string(), *expected);
        assert!(Arc::ptr_eq(&limiter.policies(), &running), "{what}");
    }
    // The old set kept deciding all along: the key's second unit, then a denial.
    assert!(limiter.check("api", b"k").await.unwrap().is_allowed());
    assert!(!limiter.check("api", b"k").await.unwrap().is_allowed());

    // Not UTF-8.
    replace_file(&path, b"\xff\xfe[[policy]]").unwrap();
    match next(&mut rx).await {
        Reload::Rejected { error } => assert_eq!(error.field(), Field::File),
        other => panic!("{other:?}"),
    }
    assert!(Arc::ptr_eq(&limiter.policies(), &running));
}
