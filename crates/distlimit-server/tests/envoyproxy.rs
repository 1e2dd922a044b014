//! envoyproxy/ratelimit's service and integration tests, translated: the expectations of its
//! `test/service/ratelimit_test.go` and `test/integration/integration_test.go` (commit in
//! `tests/compat/NOTICE`) asked of the real `distlimit-server` binary over gRPC. Its service
//! tests mock the configuration and the cache; here each mocked limit is a YAML rule and each
//! mocked `OVER_LIMIT` is a rule spent to its limit first. Its integration tests run on its own
//! config directory (`tests/compat/integration/`, laid out as its `runtime/current/ratelimit/
//! config` and found through `RUNTIME_ROOT`/`RUNTIME_SUBDIRECTORY`), on the memory store and on
//! Redis. Its settings are given as its environment variables (`SHADOW_MODE`, `QUOTA_MODE`,
//! `LIMIT_RESPONSE_HEADERS_ENABLED`, `REDIS_URL`, ...).
//!
//! One binary per configuration and environment, many cases per binary. No real minute window
//! is slept through: a burst is aligned to its window (at most 3 s of waiting), per-second
//! expectations use fresh keys. Deliberate differences are in the crate README ("Differences
//! from envoyproxy/ratelimit"); where a case meets one, the comment names it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;
use distlimit_test::replace_file;

use std::path::{Path, PathBuf};
use std::time::Duration;

use distlimit_test::server::RedisServer;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, UInt64Value, Value};
use support::binary::{Binary, LOADS_ERROR, LOADS_OK};
use support::{OK, OVER_LIMIT, align, call, descriptor};
use tonic::transport::Channel;

const SECOND: i32 = 1;
const MINUTE: i32 = 2;
const HOUR: i32 = 3;
const DAY: i32 = 4;

fn unit_secs(unit: i32) -> u64 {
    match unit {
        SECOND => 1,
        MINUTE => 60,
        HOUR => 3_600,
        DAY => 86_400,
        other => panic!("unit {other}"),
    }
}

/// envoyproxy's `common.NewRateLimitRequest`: one descriptor per entry list, `hits_addend`.
fn req(domain: &str, descriptors: &[&[(&str, &str)]], hits_addend: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend,
    }
}

/// What one descriptor status must be: its code, its limit (requests per unit, unit) and the
/// remaining count.
type Status = (i32, Option<(u32, i32)>, u32);

/// Asserts `answer` is `overall` with `statuses`; a limited status's `duration_until_reset` is
/// set and within its unit (envoyproxy's tests copy it from the answer), an unlimited one's
/// is unset.
#[track_caller]
fn expect(answer: &RateLimitResponse, overall: i32, statuses: &[Status]) {
    let got: Vec<Status> = answer
        .statuses
        .iter()
        .map(|s| {
            let limit = s
                .current_limit
                .as_ref()
                .map(|l| (l.requests_per_unit, l.unit));
            (s.code, limit, s.limit_remaining)
        })
        .collect();
    assert_eq!(
        (answer.overall_code, got.as_slice()),
        (overall, statuses),
        "{answer:?}"
    );
    for (status, (_, limit, _)) in answer.statuses.iter().zip(statuses) {
        match limit {
            Some((_, unit)) => {
                let reset = status.duration_until_reset.as_ref().expect("a reset");
                let secs = reset.seconds as f64 + f64::from(reset.nanos) / 1e9;
                assert!(
                    secs > 0.0 && secs <= unit_secs(*unit) as f64,
                    "{reset:?} in unit {unit}"
                );
            }
            None => assert_eq!(status.duration_until_reset, None, "{answer:?}"),
        }
    }
}

/// The binary on the configuration directory `dir` with envoyproxy's environment `envs`.
fn start(dir: &Path, envs: &[(&str, &str)]) -> Binary {
    let dir = dir.to_str().unwrap();
    Binary::start(&["--config", dir, "--reload-interval-ms", "50"], envs)
}

fn decisions(policy: &str, outcome: &str) -> String {
    format!("distlimit_decisions_total{{policy=\"{policy}\",outcome=\"{outcome}\"")
}

fn compat_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/compat")
        .join(name)
}

/// envoyproxy's integration runtime: `<root>/runtime/current/ratelimit/config/` holding its
/// integration config files.
fn integration_runtime() -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("runtime/current/ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    for name in ["basic.yaml", "another.yaml", "share_threshold.yaml"] {
        std::fs::copy(compat_fixture("integration").join(name), config.join(name)).unwrap();
    }
    (root, config)
}

fn integration_envs(root: &Path) -> Vec<(&'static str, String)> {
    vec![
        (
            "RUNTIME_ROOT",
            root.join("runtime/current").to_str().unwrap().to_owned(),
        ),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
    ]
}

/// A value no earlier run used (envoyproxy draws a random integer).
fn fresh() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{nanos}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// `testBasicBaseConfig`, with its `getCacheKey` suffix (`_local` names the same rules under
/// other keys; the local cache itself is not part of the binary: a difference).
async fn basic_base_config(binary: &Binary, suffix: &str) {
    let mut c = binary.client().await;
    let key = |k: &str| format!("{k}{suffix}");

    // A domain with no configuration: OK, no limit.
    let r = call(&mut c, req("foo", &[&[(&key("hello"), "world")]], 1)).await;
    expect(&r, OK, &[(OK, None, 0)]);

    // 50 a second: 49 left after one, counted once in its statistic (total_hits there).
    let r = call(&mut c, req("basic", &[&[(&key("key1"), &fresh())]], 1)).await;
    expect(&r, OK, &[(OK, Some((50, SECOND)), 49)]);
    let hits = |policy: &str| {
        binary.metric(&decisions(policy, "allowed")) + binary.metric(&decisions(policy, "denied"))
    };
    assert_eq!(hits(&format!("basic/{}", key("key1"))), 1);

    // 20 a minute, a fresh value: 20 admitted with 19..0 left, then OVER_LIMIT with 0 left.
    let policy2 = format!("another/{}", key("key2"));
    let value = fresh();
    align(60, Duration::from_secs(3)).await;
    for i in 0..25_u32 {
        let r = call(&mut c, req("another", &[&[(&key("key2"), &value)]], 1)).await;
        let (code, left) = if i >= 20 {
            (OVER_LIMIT, 0)
        } else {
            (OK, 20 - (i + 1))
        };
        expect(&r, code, &[(code, Some((20, MINUTE)), left)]);
    }
    // Its over_limit statistic: 5 denials.
    assert_eq!(hits(&policy2), 25);
    assert_eq!(binary.metric(&decisions(&policy2, "denied")), 5);

    // Two keys of one domain: key2 (20 a minute) and key3 (10 an hour), fresh values.
    let value = fresh();
    align(60, Duration::from_secs(3)).await;
    for i in 0..15_u32 {
        let r = call(
            &mut c,
            req(
                "another",
                &[&[(&key("key2"), &value)], &[(&key("key3"), &value)]],
                1,
            ),
        )
        .await;
        if i < 10 {
            expect(
                &r,
                OK,
                &[
                    (OK, Some((20, MINUTE)), 20 - (i + 1)),
                    (OK, Some((10, HOUR)), 10 - (i + 1)),
                ],
            );
        } else {
            // Difference (all or nothing): key2 is not charged by a request key3 denies, so
            // it keeps 10 left, as envoyproxy answers with
            // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT (by default it answers 20 - (i + 1)).
            expect(
                &r,
                OVER_LIMIT,
                &[
                    (OK, Some((20, MINUTE)), 10),
                    (OVER_LIMIT, Some((10, HOUR)), 0),
                ],
            );
        }
    }

    // Statistics: key2 was decided 40 times (total_hits), over its limit 5 times (over_limit),
    // key3 15 and 5 times.
    let policy3 = format!("another/{}", key("key3"));
    assert_eq!(hits(&policy2), 40);
    assert_eq!(binary.metric(&decisions(&policy2, "denied")), 5);
    assert_eq!(hits(&policy3), 15);
    assert_eq!(binary.metric(&decisions(&policy3, "denied")), 5);

    // DurationUntilReset counts down.
    let value = fresh();
    let one = || req("another", &[&[(&key("key4"), &value)]], 1);
    let first = call(&mut c, one()).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = call(&mut c, one()).await;
    let reset = |r: &RateLimitResponse| {
        let d = r.statuses[0].duration_until_reset.unwrap();
        Duration::new(d.seconds as u64, d.nanos as u32)
    };
    expect(&second, OK, &[(OK, Some((20, DAY)), 18)]);
    assert!(reset(&second) < reset(&first), "{first:?} {second:?}");
}

/// `testShareThreshold`: values under a `share_threshold` wildcard spend one counter, values
/// under a plain wildcard their own.
async fn share_threshold(binary: &Binary) {
    let mut c = binary.client().await;
    let domain = "share-threshold-test";
    align(3_600, Duration::from_secs(3)).await;
    // Another run in this hour would have spent the shared counter: count what is left.
    for _ in 0..10 {
        let r = call(&mut c, req(domain, &[&[("files", "files/a.pdf")]], 1)).await;
        assert!(
            r.overall_code == OK || r.overall_code == OVER_LIMIT,
            "{r:?}"
        );
    }
    let r = call(&mut c, req(domain, &[&[("files", "files/b.csv")]], 1)).await;
    expect(&r, OVER_LIMIT, &[(OVER_LIMIT, Some((10, HOUR)), 0)]);
    for _ in 0..10 {
        let value = format!("files_no_share/{}", fresh());
        let r = call(&mut c, req(domain, &[&[("files_no_share", &value)]], 1)).await;
        expect(&r, OK, &[(OK, Some((10, HOUR)), 9)]);
    }
}

/// `testConfigReload`: a file added to the directory is served after the reload (counted in
/// the loads statistic), its removal reloads too.
async fn config_reload(binary: &Binary, config: &Path) {
    let mut c = binary.client().await;
    let block = || req("reload", &[&[("block", "foo")]], 1);
    expect(&call(&mut c, block()).await, OK, &[(OK, None, 0)]);
    let before = binary.metric(LOADS_OK);
    assert!(before >= 1, "the first load is counted");
    let reload = std::fs::read_to_string(compat_fixture("reload.yaml")).unwrap();
    replace_file(&config.join("reload.yaml"), &reload).unwrap();
    let after = binary.wait_metric_above(LOADS_OK, before);
    let r = call(&mut c, req("reload", &[&[("key1", &fresh())]], 1)).await;
    expect(&r, OK, &[(OK, Some((50, SECOND)), 49)]);
    // (Not in envoyproxy's test:) its zero limit denies.
    let r = call(&mut c, block()).await;
    expect(&r, OVER_LIMIT, &[(OVER_LIMIT, Some((0, SECOND)), 0)]);
    std::fs::remove_file(config.join("reload.yaml")).unwrap();
    binary.wait_metric_above(LOADS_OK, after);
    expect(&call(&mut c, block()).await, OK, &[(OK, None, 0)]);
    assert_eq!(binary.metric(LOADS_ERROR), 0);
}

/// envoyproxy's integration tests on the memory store: `TestBasicConfig` (its keys and its
/// `_local` keys), `TestShareThreshold`, `TestBasicReloadConfig`.
#[tokio::test]
async fn integration_on_the_memory_store() {
    let (root, config) = integration_runtime();
    let envs = integration_envs(root.path());
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let binary = start_with_envs(&envs, &[]);
    // config_load_success: the first load.
    assert_eq!(binary.metric(LOADS_OK), 1);
    basic_base_config(&binary, "").await;
    basic_base_config(&binary, "_local").await;
    share_threshold(&binary).await;
    config_reload(&binary, &config).await;
}

/// The same on Redis (`REDIS_SOCKET_TYPE=tcp`, `REDIS_URL`, as envoyproxy's integration
/// settings): a test that cannot start `redis-server` is skipped unless
/// `DISTLIMIT_REQUIRE_REDIS=1`.
#[tokio::test]
async fn integration_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (root, config) = integration_runtime();
    let mut envs = integration_envs(root.path());
    envs.push(("REDIS_SOCKET_TYPE", "tcp".to_owned()));
    envs.push(("REDIS_URL", redis.addr()));
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let binary = start_with_envs(&envs, &[]);
    basic_base_config(&binary, "").await;
    share_threshold(&binary).await;
    config_reload(&binary, &config).await;
    // Every decision was Redis's, none the fallback's.
    let body = binary.metrics();
    let decisions: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("distlimit_decisions_total{"))
        .collect();
    assert!(!decisions.is_empty());
    // Past the limit, the hybrid store's blocked-key cache answers without Redis: 4 of key2's
    // 5 denials, as envoyproxy counts `over_limit_with_local_cache` with its local cache.
    let elsewhere: Vec<&&str> = decisions
        .iter()
        .filter(|l| !l.contains("source=\"primary\""))
        .collect();
    assert_eq!(
        elsewhere,
        [
            &r#"distlimit_decisions_total{policy="another/key2",outcome="denied",source="blocked_cache"} 4"#
        ],
    );
}

/// The binary with only the environment `envs` (its config found through `RUNTIME_ROOT`).
fn start_with_envs(envs: &[(&str, &str)], flags: &[&str]) -> Binary {
    let mut all = vec!["--reload-interval-ms", "50"];
    all.extend_from_slice(flags);
    Binary::start(&all, envs)
}

// envoyproxy's `test/service/ratelimit_test.go`: each mocked limit is a rule here.
const DIFFERENT_DOMAIN: &str = "
domain: different-domain
descriptors:
  - key: foo
    value: bar
    rate_limit: { unit: minute, requests_per_unit: 10, name: key_name }
";
const RULE_SHADOW: &str = "
domain: rule-shadow
descriptors:
  - key: foo
    value: bar
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: hello
    value: world
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 10 }
";
const MIXED_SHADOW: &str = "
domain: mixed-shadow
descriptors:
  - key: foo
    value: bar
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: hello
    value: world
    rate_limit: { unit: minute, requests_per_unit: 10 }
";
const SOME_DOMAIN: &str = "
domain: some-domain
descriptors:
  - key: foo
    value: bar
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: baz
    value: qux
    rate_limit: { unlimited: true, requests_per_unit: 55 }
";
/// The quota tests' limits; each case spends its own values (`regular=<case>`).
/// The `metadata` of the rules are those of `TestMetadataReturnedFor*PassedDescriptors` and
/// `TestOverlappingMetadataReturnsTheFirstValue` (with a nested struct, merged).
const QUOTA_DOMAIN: &str = "
domain: quota-domain
descriptors:
  - key: regular
    metadata: { name: service_1, owner: { team: a } }
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: quota
    quota_mode: true
    metadata: { name: service_2, owner: { team: b, pager: p } }
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: quota1
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: quota2
    quota_mode: true
    metadata: { some_other_name: service_2 }
    rate_limit: { unit: minute, requests_per_unit: 3 }
";

/// A directory of the service tests' configuration files.
fn service_config() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, yaml) in [
        ("different-domain.yaml", DIFFERENT_DOMAIN),
        ("rule-shadow.yaml", RULE_SHADOW),
        ("mixed-shadow.yaml", MIXED_SHADOW),
        ("some-domain.yaml", SOME_DOMAIN),
        ("quota-domain.yaml", QUOTA_DOMAIN),
    ] {
        std::fs::write(dir.path().join(name), yaml).unwrap();
    }
    dir
}

/// Spends all of `entries`' limit of `rpu` in `domain` (its answer: OK, nothing left).
async fn spend(
    c: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    entries: &[(&str, &str)],
    rpu: u32,
) {
    let r = call(c, req(domain, &[entries], rpu)).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (OK, 0),
        "{r:?}"
    );
}

const FOO: &[(&str, &str)] = &[("foo", "bar")];
const HELLO: &[(&str, &str)] = &[("hello", "world")];
const TEN_A_MINUTE: Option<(u32, i32)> = Some((10, MINUTE));

/// `TestService`, `TestRuleShadowMode`, `TestMixedRuleShadowMode`, `TestUnlimited`,
/// `TestEmptyDomain`, `TestEmptyDescriptors`, `TestServiceHealthStatus` and the per-descriptor
/// quota tests (`TestServicePerDescriptorQuotaMode`, `TestServiceMixedPerDescriptorModes*`,
/// `TestServiceQuotaModeOnly*OverTheLimit`), on one binary.
#[tokio::test]
async fn service() {
    let dir = service_config();
    let binary = start(dir.path(), &[]);
    let mut c = binary.client().await;
    align(60, Duration::from_secs(3)).await;

    // TestService: a domain without configuration is OK without a limit.
    let r = call(&mut c, req("test-domain", &[HELLO], 1)).await;
    expect(&r, OK, &[(OK, None, 0)]);
    // A reload (a config event): counted.
    let loads = binary.metric(LOADS_OK);
    let file = dir.path().join("different-domain.yaml");
    replace_file(&file, format!("{DIFFERENT_DOMAIN}\n# reloaded\n")).unwrap();
    let loads = binary.wait_metric_above(LOADS_OK, loads);
    assert_eq!(loads, 2);
    spend(&mut c, "different-domain", FOO, 10).await;
    let r = call(&mut c, req("different-domain", &[FOO, HELLO], 1)).await;
    expect(
        &r,
        OVER_LIMIT,
        &[(OVER_LIMIT, TEN_A_MINUTE, 0), (OK, None, 0)],
    );
    // A load error keeps the running configuration; the order of descriptors does not matter.
    replace_file(&file, "domain: different-domain\ndescriptors: [\n").unwrap();
    binary.wait_metric_above(LOADS_ERROR, 0);
    let r = call(&mut c, req("different-domain", &[HELLO, FOO], 1)).await;
    expect(
        &r,
        OVER_LIMIT,
        &[(OK, None, 0), (OVER_LIMIT, TEN_A_MINUTE, 0)],
    );
    assert_eq!(
        (binary.metric(LOADS_OK), binary.metric(LOADS_ERROR)),
        (2, 1)
    );

    // TestRuleShadowMode: shadow rules over their limits answer OK.
    spend(&mut c, "rule-shadow", FOO, 10).await;
    spend(&mut c, "rule-shadow", HELLO, 10).await;
    let r = call(&mut c, req("rule-shadow", &[FOO, HELLO], 1)).await;
    expect(&r, OK, &[(OK, TEN_A_MINUTE, 0), (OK, TEN_A_MINUTE, 0)]);

    // TestMixedRuleShadowMode: the rule outside shadow mode denies.
    spend(&mut c, "mixed-shadow", FOO, 10).await;
    spend(&mut c, "mixed-shadow", HELLO, 10).await;
    let r = call(&mut c, req("mixed-shadow", &[FOO, HELLO], 1)).await;
    expect(
        &r,
        OVER_LIMIT,
        &[(OK, TEN_A_MINUTE, 0), (OVER_LIMIT, TEN_A_MINUTE, 0)],
    );

    // TestUnlimited: 9 left, no rule, unlimited (the largest count, no limit).
    let r = call(
        &mut c,
        req("some-domain", &[FOO, HELLO, &[("baz", "qux")]], 1),
    )
    .await;
    expect(
        &r,
        OK,
        &[(OK, TEN_A_MINUTE, 9), (OK, None, 0), (OK, None, u32::MAX)],
    );

    // TestEmptyDomain, TestEmptyDescriptors: refused (envoyproxy's message differs; it answers
    // gRPC UNKNOWN, this server INVALID_ARGUMENT).
    for request in [req("", &[HELLO], 1), req("test-domain", &[], 1)] {
        let error = c.should_rate_limit(request).await.unwrap_err();
        assert_eq!(error.code(), tonic::Code::InvalidArgument, "{error}");
    }
    assert_eq!(
        binary.metric_with("distlimit_server_requests_total{", "result=\"invalid\""),
        2
    );

    // TestServiceHealthStatus.
    assert_eq!(health(&binary, "").await, 1);

    quota_per_descriptor(&mut c).await;
}

/// `TestServicePerDescriptorQuotaMode`, `TestServiceMixedPerDescriptorModes`,
/// `TestServiceMixedPerDescriptorModesUnderLimit`, `TestServiceQuotaModeOnlyAllOverTheLimit`,
/// `TestServiceQuotaModeOnlySomeOverTheLimit`.
async fn quota_per_descriptor(c: &mut RateLimitServiceClient<Channel>) {
    let d = "quota-domain";
    let five = Some((5, MINUTE));
    let three = Some((3, MINUTE));
    // Regular over, quota under: OVER_LIMIT. (Difference, all or nothing: a denied request
    // charges nothing, so each status passed reports what is left, 3 of 3 here.)
    spend(c, d, &[("regular", "a")], 5).await;
    let r = call(c, req(d, &[&[("regular", "a")], &[("quota", "a")]], 1)).await;
    expect(&r, OVER_LIMIT, &[(OVER_LIMIT, five, 0), (OK, three, 3)]);
    // Regular under, the only quota descriptor over: every quota descriptor is, OVER_LIMIT,
    // and "regular" was not charged (envoyproxy increments it): 5 left, then 4 after one.
    spend(c, d, &[("quota", "b")], 3).await;
    let r = call(c, req(d, &[&[("regular", "b")], &[("quota", "b")]], 1)).await;
    expect(&r, OVER_LIMIT, &[(OK, five, 5), (OVER_LIMIT, three, 0)]);
    let r = call(c, req(d, &[&[("regular", "b")]], 1)).await;
    expect(&r, OK, &[(OK, five, 4)]);
    // Both under: OK.
    let r = call(c, req(d, &[&[("regular", "c")], &[("quota", "c")]], 1)).await;
    expect(&r, OK, &[(OK, five, 4), (OK, three, 2)]);
    // Two quota descriptors, both over: OVER_LIMIT.
    spend(c, d, &[("quota1", "d")], 5).await;
    spend(c, d, &[("quota2", "d")], 3).await;
    let r = call(c, req(d, &[&[("quota1", "d")], &[("quota2", "d")]], 1)).await;
    expect(
        &r,
        OVER_LIMIT,
        &[(OVER_LIMIT, five, 0), (OVER_LIMIT, three, 0)],
    );
    // One over, one under: OK, the one under charged.
    spend(c, d, &[("quota1", "e")], 5).await;
    let r = call(c, req(d, &[&[("quota1", "e")], &[("quota2", "e")]], 1)).await;
    expect(&r, OK, &[(OVER_LIMIT, five, 0), (OK, three, 2)]);
    let r = call(c, req(d, &[&[("quota2", "e")]], 1)).await;
    expect(&r, OK, &[(OK, three, 1)]);
}

/// `TestServiceGlobalShadowMode`, `TestServiceQuotaModeWithShadowMode`,
/// `TestServiceMixedModeWithShadowMode`: with `SHADOW_MODE=true` the request is OK, each
/// status still says what it would have been.
#[tokio::test]
async fn global_shadow_mode() {
    let dir = service_config();
    let binary = start(dir.path(), &[("SHADOW_MODE", "true")]);
    let mut c = binary.client().await;
    align(60, Duration::from_secs(3)).await;
    spend(&mut c, "different-domain", FOO, 10).await;
    let r = call(&mut c, req("different-domain", &[FOO, HELLO], 1)).await;
    expect(&r, OK, &[(OVER_LIMIT, TEN_A_MINUTE, 0), (OK, None, 0)]);
    // A regular and a quota descriptor, both over.
    let d = "quota-domain";
    spend(&mut c, d, &[("regular", "a")], 5).await;
    spend(&mut c, d, &[("quota", "a")], 3).await;
    let r = call(&mut c, req(d, &[&[("regular", "a")], &[("quota", "a")]], 1)).await;
    expect(
        &r,
        OK,
        &[
            (OVER_LIMIT, Some((5, MINUTE)), 0),
            (OVER_LIMIT, Some((3, MINUTE)), 0),
        ],
    );
}

/// `TestServiceGlobalQuotaMode`, `TestMetadataReturnedFor*PassedDescriptors` and
/// `TestOverlappingMetadataReturnsTheFirstValue` with `QUOTA_MODE=true` and
/// `RESPONSE_DYNAMIC_METADATA=true`: every descriptor is a quota descriptor, the request is
/// over only when all are; the dynamic metadata holds the request and the `metadata` of the
/// descriptors that passed, the first one's value kept for a key in several.
#[tokio::test]
async fn global_quota_mode() {
    let dir = service_config();
    let binary = start(
        dir.path(),
        &[
            ("QUOTA_MODE", "true"),
            ("RESPONSE_DYNAMIC_METADATA", "true"),
        ],
    );
    let mut c = binary.client().await;
    align(60, Duration::from_secs(3)).await;
    let d = "quota-domain";
    let (five, three) = (Some((5, MINUTE)), Some((3, MINUTE)));
    spend(&mut c, d, &[("regular", "a")], 5).await;
    spend(&mut c, d, &[("quota", "a")], 3).await;
    let r = call(&mut c, req(d, &[&[("regular", "a")], &[("quota", "a")]], 1)).await;
    expect(
        &r,
        OVER_LIMIT,
        &[(OVER_LIMIT, five, 0), (OVER_LIMIT, three, 0)],
    );
    // Nothing passed: the request, no `metadata`.
    assert_eq!(
        dynamic_metadata(&r),
        serde_json::json!({
            "domain": d,
            "descriptors": [{ "entries": ["regular=a"] }, { "entries": ["quota=a"] }],
            "hitsAddend": 1.0,
        })
    );
    // The regular descriptor passes, the quota one is over: OK, the first one's metadata.
    spend(&mut c, d, &[("quota", "b")], 3).await;
    let r = call(&mut c, req(d, &[&[("regular", "b")], &[("quota", "b")]], 1)).await;
    expect(&r, OK, &[(OK, five, 4), (OVER_LIMIT, three, 0)]);
    assert_eq!(
        dynamic_metadata(&r)["metadata"],
        serde_json::json!({ "name": "service_1", "owner": { "team": "a" } })
    );
    // Both pass: merged, the first value of `name` and `team` kept, structs merged.
    let r = call(&mut c, req(d, &[&[("regular", "c")], &[("quota", "c")]], 1)).await;
    expect(&r, OK, &[(OK, five, 4), (OK, three, 2)]);
    assert_eq!(
        dynamic_metadata(&r)["metadata"],
        serde_json::json!({ "name": "service_1", "owner": { "team": "a", "pager": "p" } })
    );
    // Both pass with different keys: both.
    let r = call(
        &mut c,
        req(d, &[&[("regular", "d")], &[("quota2", "d")]], 1),
    )
    .await;
    expect(&r, OK, &[(OK, five, 4), (OK, three, 2)]);
    assert_eq!(
        dynamic_metadata(&r)["metadata"],
        serde_json::json!({
            "name": "service_1",
            "owner": { "team": "a" },
            "some_other_name": "service_2",
        })
    );
    // A limit override drops the rule's metadata (as envoyproxy builds a new limit); the
    // descriptor's override and own `hits_addend` are written; a request `hits_addend` of 0 is
    // not.
    let mut overridden = descriptor(&[("regular", "e")]);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 7,
        unit: MINUTE,
    });
    overridden.hits_addend = Some(UInt64Value { value: 2 });
    let request = RateLimitRequest {
        domain: d.to_owned(),
        descriptors: vec![overridden],
        hits_addend: 0,
    };
    let r = call(&mut c, request).await;
    expect(&r, OK, &[(OK, Some((7, MINUTE)), 5)]);
    assert_eq!(
        dynamic_metadata(&r),
        serde_json::json!({
            "domain": d,
            "descriptors": [{
                "entries": ["regular=e"],
                "limit": "requests_per_unit:7 unit:MINUTE",
                "hitsAddend": 2.0,
            }],
        })
    );
}

/// A response's `dynamic_metadata` as JSON (numbers as floats, as `Struct` holds them).
#[track_caller]
fn dynamic_metadata(r: &RateLimitResponse) -> serde_json::Value {
    fn json(value: &Value) -> serde_json::Value {
        match &value.kind {
            None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
            Some(Kind::NumberValue(n)) => serde_json::json!(n),
            Some(Kind::StringValue(s)) => serde_json::json!(s),
            Some(Kind::BoolValue(b)) => serde_json::json!(b),
            Some(Kind::StructValue(s)) => object(s),
            Some(Kind::ListValue(l)) => l.values.iter().map(json).collect(),
        }
    }
    fn object(s: &Struct) -> serde_json::Value {
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), json(v)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
    object(r.dynamic_metadata.as_ref().expect("dynamic metadata"))
}

/// `TestServiceWithDefaultRatelimitHeaders`: with `LIMIT_RESPONSE_HEADERS_ENABLED=true` a
/// denied request carries the limit, nothing remaining and the seconds to the reset of the
/// descriptor that denied. (Header names are compared without case: HTTP/2 sends them in lower
/// case.) Without `RESPONSE_DYNAMIC_METADATA` no dynamic metadata.
#[tokio::test]
async fn response_headers() {
    let dir = service_config();
    let binary = start(dir.path(), &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]);
    let r = denied_with_headers(
        &binary,
        ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"],
    )
    .await;
    assert_eq!(r.dynamic_metadata, None);
    for name in [
        "a-ratelimit-limit",
        "a-ratelimit-remaining",
        "a-ratelimit-reset",
    ] {
        assert!(
            !r.response_headers_to_add.iter().any(|h| h.key == name),
            "{r:?}"
        );
    }
}

/// `TestServiceWithCustomRatelimitHeaders`: `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`
/// and `LIMIT_RESET_HEADER` rename the three headers (sent in lower case); the defaults are
/// gone. Over HTTP too.
#[tokio::test]
async fn custom_response_header_names() {
    let dir = service_config();
    let binary = start(
        dir.path(),
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_LIMIT_HEADER", "A-Ratelimit-Limit"),
            ("LIMIT_REMAINING_HEADER", "A-Ratelimit-Remaining"),
            ("LIMIT_RESET_HEADER", "A-Ratelimit-Reset"),
        ],
    );
    let r = denied_with_headers(
        &binary,
        [
            "A-Ratelimit-Limit",
            "A-Ratelimit-Remaining",
            "A-Ratelimit-Reset",
        ],
    )
    .await;
    let keys: Vec<&str> = r
        .response_headers_to_add
        .iter()
        .map(|h| h.key.as_str())
        .collect();
    assert_eq!(
        keys,
        [
            "ratelimit-policy",
            "ratelimit",
            "a-ratelimit-limit",
            "a-ratelimit-remaining",
            "a-ratelimit-reset",
        ]
    );
    let (status, head) = support::binary::http_head(
        binary.http,
        "/v1/check",
        r#"{"domain":"different-domain","descriptors":[[{"key":"foo","value":"bar"}]]}"#,
    );
    assert_eq!(status, 429, "{head}");
    assert!(head.contains("\r\na-ratelimit-limit: 10\r\n"), "{head}");
    assert!(head.contains("\r\na-ratelimit-remaining: 0\r\n"), "{head}");
    assert!(!head.contains("\r\nratelimit-limit:"), "{head}");
}

/// A header name HTTP does not allow stops the start, naming the variable.
#[test]
fn a_bad_header_name_stops_the_start() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_distlimit-server"))
        .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .env("LIMIT_RESPONSE_HEADERS_ENABLED", "true")
        .env("LIMIT_REMAINING_HEADER", "Remaining Requests")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            // Still serving: kill the child this test started, by its handle.
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let status = status.unwrap_or_else(|| panic!("started with a bad header name: {stderr}"));
    assert!(!status.success());
    assert!(stderr.contains("LIMIT_REMAINING_HEADER"), "{stderr}");
    assert!(stderr.contains("Remaining Requests"), "{stderr}");
}

/// Spends `different-domain`'s `foo=bar` and asks for it and `hello=world` again: denied by
/// the first, whose header values are checked (whatever their names).
async fn denied_with_headers(binary: &Binary, names: [&str; 3]) -> RateLimitResponse {
    let mut c = binary.client().await;
    align(60, Duration::from_secs(3)).await;
    spend(&mut c, "different-domain", FOO, 10).await;
    let r = call(&mut c, req("different-domain", &[FOO, HELLO], 1)).await;
    expect(
        &r,
        OVER_LIMIT,
        &[(OVER_LIMIT, TEN_A_MINUTE, 0), (OK, None, 0)],
    );
    let header = |name: &str| {
        r.response_headers_to_add
            .iter()
            .find(|h| h.key.eq_ignore_ascii_case(name))
            .map(|h| h.value.clone())
            .unwrap_or_else(|| panic!("no {name} in {r:?}"))
    };
    let [limit, remaining, reset] = names;
    assert_eq!(header(limit), "10");
    assert_eq!(header(remaining), "0");
    let reset: u64 = header(reset).parse().unwrap();
    assert!((1..=60).contains(&reset), "{reset}");
    r
}

/// `TestInitialLoadError`: envoyproxy serves errors ("no rate limit configuration loaded")
/// until a configuration loads; this binary refuses to start on a bad one, naming the file
/// (a difference: a pod that cannot limit is not made ready).
#[test]
fn a_bad_initial_configuration_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.yaml"), "domain: d\ndescriptors: [\n").unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_distlimit-server"))
        .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--config"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bad.yaml"), "{stderr}");
}

/// The gRPC health status of `service` (1 SERVING).
async fn health(binary: &Binary, service: &str) -> i32 {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", binary.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

/// `TestConfigLimitOverride` of its `config_test.go`, on `basic_config.yaml` served by the
/// binary: an override applies in a configured domain only, and its statistics are kept across
/// override values. (Difference: envoyproxy names an override's series with the request's
/// values, `key1_value1.subkey1_something`, one series per value a client sends; here it is
/// named by the keys, `key1.subkey1`, as every series without `detailed_metric`.)
#[tokio::test]
async fn limit_overrides() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        compat_fixture("basic_config.yaml"),
        dir.path().join("basic_config.yaml"),
    )
    .unwrap();
    let binary = start(dir.path(), &[]);
    let mut c = binary.client().await;
    align(86_400, Duration::from_secs(3)).await;
    let subkey = fresh();
    let overridden = |domain: &str, subkey: &str, requests_per_unit: u32, unit: i32| {
        let mut r = req(domain, &[&[("key1", "value1"), ("subkey1", subkey)]], 1);
        r.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit,
            unit,
        });
        r
    };
    let r = call(&mut c, overridden("foo_domain", &subkey, 10, DAY)).await;
    expect(&r, OK, &[(OK, None, 0)]);
    let r = call(&mut c, overridden("test-domain", &subkey, 10, DAY)).await;
    expect(&r, OK, &[(OK, Some((10, DAY)), 9)]);
    let series = || binary.metric(&decisions("test-domain/key1.subkey1", "allowed"));
    assert_eq!(series(), 1, "{}", binary.metrics());
    let r = call(&mut c, overridden("test-domain", &subkey, 42, HOUR)).await;
    expect(&r, OK, &[(OK, Some((42, HOUR)), 41)]);
    assert_eq!(series(), 2);
    // Another value: another counter (41 left), the same series.
    let other = format!("{subkey}_else");
    let r = call(&mut c, overridden("test-domain", &other, 42, HOUR)).await;
    expect(&r, OK, &[(OK, Some((42, HOUR)), 41)]);
    assert_eq!(series(), 3);
}
