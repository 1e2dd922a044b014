//! distlimit's own TOML policies in the server: every algorithm, bursts, tiers, overrides,
//! shadow mode, over gRPC and `/v1/check`, next to YAML domains, with hot reload and bad files.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::net::SocketAddr;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::*;

const POLICIES: &str = r#"
[[policy]]
name = "per_user"
tiers = [
  { name = "minute", algorithm = "token_bucket", limit = 1, per = "1m", burst = 3 },
  { name = "hour", algorithm = "fixed_window", limit = 100, per = "1h" },
]

[[policy]]
name = "tenant_user"
tiers = [ { name = "ten_seconds", algorithm = "sliding_window", limit = 2, per = "10s" } ]

[[policy.override]]
key = "gold|alice"
tiers = [ { name = "ten_seconds", algorithm = "sliding_window", limit = 5, per = "10s" } ]

[[policy]]
name = "watch"
shadow = true
tiers = [ { name = "hour", algorithm = "gcra", limit = 1, per = "1h" } ]

[domain.api]
descriptors = [
  { keys = ["user"], policy = "per_user" },
  { keys = ["tenant", "user"], policy = "tenant_user" },
  { keys = ["path"], policy = "watch" },
]
"#;

async fn codes(
    server: &Running,
    domain: &str,
    entries: &[(&str, &str)],
    times: usize,
) -> Vec<Code> {
    let mut client = server.client().await;
    let mut out = Vec::new();
    for _ in 0..times {
        let answer = call(&mut client, request(domain, vec![descriptor(entries)])).await;
        out.push(Code::try_from(answer.overall_code).unwrap());
    }
    out
}

#[tokio::test]
async fn a_token_bucket_with_a_burst_and_two_tiers() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("limits.toml"), POLICIES).unwrap();
    let server = Running::with_config(dir.path(), &[]).await;
    let mut client = server.client().await;
    let answer = call(
        &mut client,
        request("api", vec![descriptor(&[("user", "alice")])]),
    )
    .await;
    assert_eq!(answer.overall_code, Code::Ok as i32);
    let status = &answer.statuses[0];
    let limit = status.current_limit.as_ref().unwrap();
    // The tightest tier: the bucket of 3, 2 left.
    assert_eq!(limit.name, "per_user/minute");
    assert_eq!(limit.requests_per_unit, 1);
    assert_eq!(limit.unit, PbUnit::Minute as i32);
    assert_eq!(status.limit_remaining, 2);
    // The burst of 3, then denied.
    assert_eq!(
        codes(&server, "api", &[("user", "alice")], 3).await,
        [Code::Ok, Code::Ok, Code::OverLimit]
    );
    let denied = call(
        &mut client,
        request("api", vec![descriptor(&[("user", "alice")])]),
    )
    .await;
    let status = &denied.statuses[0];
    assert_eq!(status.code, Code::OverLimit as i32);
    // One token a minute: the next in at most a minute.
    let retry = status.duration_until_reset.as_ref().unwrap();
    assert!(retry.seconds <= 60 && (retry.seconds > 0 || retry.nanos > 0));
    // Another user has a bucket of their own.
    assert_eq!(
        codes(&server, "api", &[("user", "bob")], 1).await,
        [Code::Ok]
    );
    server.stop().await;
}

#[tokio::test]
async fn every_algorithm_admits_its_limit() {
    for algorithm in [
        "token_bucket",
        "gcra",
        "fixed_window",
        "sliding_log",
        "sliding_window",
    ] {
        let toml = format!(
            r#"
[[policy]]
name = "p"
tiers = [ {{ name = "t", algorithm = "{algorithm}", limit = 3, per = "1h" }} ]

[domain.d]
descriptors = [ {{ keys = ["k"], policy = "p" }} ]
"#
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.toml"), toml).unwrap();
        let server = Running::with_config(dir.path(), &[]).await;
        align(3_600, std::time::Duration::from_secs(5)).await;
        assert_eq!(
            codes(&server, "d", &[("k", "v")], 4).await,
            [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit],
            "{algorithm}"
        );
        server.stop().await;
    }
}

#[tokio::test]
async fn several_keys_overrides_shadow_and_yaml_side_by_side() {
    let dir = config_dir(
        "
domain: legacy
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 1 }
",
    );
    std::fs::write(dir.path().join("limits.toml"), POLICIES).unwrap();
    let server = Running::with_config(dir.path(), &[]).await;
    // Two entries: the key is "acme|bob", two per ten seconds; no whole RLS unit.
    let mut client = server.client().await;
    let answer = call(
        &mut client,
        request(
            "api",
            vec![descriptor(&[("tenant", "acme"), ("user", "bob")])],
        ),
    )
    .await;
    let limit = answer.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (2, PbUnit::Unknown as i32)
    );
    assert_eq!(
        codes(&server, "api", &[("tenant", "acme"), ("user", "bob")], 2).await,
        [Code::Ok, Code::OverLimit]
    );
    // The override of "gold|alice": five.
    let gold = codes(&server, "api", &[("tenant", "gold"), ("user", "alice")], 6).await;
    assert_eq!(gold.iter().filter(|c| **c == Code::Ok).count(), 5);
    // Shadow mode: counted, never denied.
    assert_eq!(
        codes(&server, "api", &[("path", "/x")], 3).await,
        [Code::Ok, Code::Ok, Code::Ok]
    );
    // Keys no mapping names, and unknown domains: not limited.
    let free = call(
        &mut client,
        request("api", vec![descriptor(&[("user", "x"), ("extra", "y")])]),
    )
    .await;
    assert!(free.statuses[0].current_limit.is_none());
    // The YAML domain still decides as before.
    assert_eq!(
        codes(&server, "legacy", &[("user", "u")], 2).await,
        [Code::Ok, Code::OverLimit]
    );
    server.stop().await;
}

async fn post(addr: SocketAddr, body: &str) -> (StatusCode, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/v1/check"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn the_json_api_answers_policy_decisions() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("limits.toml"), POLICIES).unwrap();
    let server = Running::with_config(dir.path(), &[]).await;
    let body = r#"{"domain":"api","descriptors":[[{"key":"user","value":"carol"}]],"hits":3}"#;
    let (status, text) = post(server.http, body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let limit = &json["statuses"][0]["current_limit"];
    assert_eq!(limit["name"], "per_user/minute");
    assert_eq!(limit["unit"], "minute");
    assert_eq!(limit["window_ms"], 60_000);
    assert_eq!(json["statuses"][0]["limit_remaining"], 0);
    let (status, text) = post(server.http, body).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
    server.stop().await;
}

#[tokio::test]
async fn a_bad_toml_file_keeps_the_running_policies() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limits.toml");
    std::fs::write(&file, POLICIES).unwrap();
    let mut server = Running::with_config(dir.path(), &[]).await;
    let bad_files = [
        // TOML syntax.
        (
            "[[policy]]\nname = \"p\"\ntiers = [\n",
            ":3:",
            "limits.toml",
        ),
        // distlimit-policy's own checks, at the policy's line.
        (
            "\n[[policy]]\nname = \"p\"\ntiers = [ { name = \"t\", limit = 0, per = \"1s\" } ]\n",
            ":2:",
            "limit",
        ),
        (
            "[[policy]]\nname = \"p\"\ntiers = [ { name = \"t\", limit = 1, per = \"1 fortnight\" } ]\n",
            ":1:",
            "per",
        ),
        // A domain naming no policy.
        (
            "[[policy]]\nname = \"p\"\ntiers = [ { name = \"t\", limit = 1, per = \"1s\" } ]\n\n[domain.api]\ndescriptors = [ { keys = [\"user\"], policy = \"missing\" } ]\n",
            ":5:",
            "no policy named \"missing\"",
        ),
        // An unknown field.
        (
            "[domain.api]\ndescriptors = [ { keys = [\"user\"], polciy = \"p\" } ]\n",
            ":2:",
            "polciy",
        ),
    ];
    for (text, line, expected) in bad_files {
        std::fs::write(&file, text).unwrap();
        let distlimit_server::Reload::Rejected { error } = server.next_reload().await else {
            panic!("{text} was applied");
        };
        assert!(error.contains("limits.toml"), "{error}");
        assert!(error.contains(line), "{text}: {error}");
        assert!(error.contains(expected), "{text}: {error}");
        // The running policies still decide.
        let limit = call(
            &mut server.client().await,
            request("api", vec![descriptor(&[("user", "dave")])]),
        )
        .await
        .statuses[0]
            .current_limit
            .clone()
            .unwrap();
        assert_eq!(limit.name, "per_user/minute", "kept after {text}");
    }
    // A YAML file of a TOML domain is refused as a duplicate.
    std::fs::write(&file, POLICIES).unwrap();
    assert!(matches!(
        server.next_reload().await,
        distlimit_server::Reload::Applied { .. }
    ));
    std::fs::write(
        dir.path().join("api.yaml"),
        "domain: api\ndescriptors: []\n",
    )
    .unwrap();
    let distlimit_server::Reload::Rejected { error } = server.next_reload().await else {
        panic!("a duplicate domain was applied");
    };
    assert!(error.contains("defined by both"), "{error}");
    server.stop().await;
}

/// Two policies of one TOML domain; a descriptor with a `limit` override is held to a YAML-style
/// rule in the same domain.
const MIXED: &str = r#"
[[policy]]
name = "per_ip"
deny = ["6.6.6.6"]
tiers = [
  { name = "hour", algorithm = "token_bucket", limit = 3, per = "1h" },
  { name = "all", algorithm = "token_bucket", limit = 1000, per = "1h", scope = "global" },
]

[[policy]]
name = "per_user"
tiers = [ { name = "hour", algorithm = "token_bucket", limit = 1, per = "1h" } ]

[domain.mix]
descriptors = [
  { keys = ["ip"], policy = "per_ip" },
  { keys = ["user"], policy = "per_user" },
]
"#;

/// A descriptor `route=<value>` held to an override of two per hour.
fn route(
    value: &str,
) -> envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let mut d = descriptor(&[("route", value)]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 2,
        unit: 3, // HOUR in envoy.type.v3.RateLimitUnit
    });
    d
}

/// (overall code, [(code, remaining)] per descriptor) of one request.
async fn decide(
    client: &mut envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<tonic::transport::Channel>,
    descriptors: Vec<
        envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor,
    >,
) -> (Code, Vec<(Code, u32)>) {
    let answer = call(client, request("mix", descriptors)).await;
    let statuses = answer
        .statuses
        .iter()
        .map(|s| (Code::try_from(s.code).unwrap(), s.limit_remaining))
        .collect();
    (Code::try_from(answer.overall_code).unwrap(), statuses)
}

/// A denied request charges nothing: neither another TOML policy, nor a rule, nor a policy
/// when a rule denies. `prefix` keeps the keys of one run apart from another's on one store.
async fn a_denied_request_charges_no_policy_and_no_rule(flags: &[&str], prefix: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("limits.toml"), MIXED).unwrap();
    let server = Running::with_config(dir.path(), flags).await;
    let mut client = server.client().await;
    // The override is a fixed window of an hour: stay in one.
    align(3_600, std::time::Duration::from_secs(30)).await;
    let ip = format!("{prefix}10.0.0.1");
    let (alice, bob) = (format!("{prefix}alice"), format!("{prefix}bob"));
    let r1 = format!("{prefix}r1");
    let both = || vec![descriptor(&[("ip", &ip)]), descriptor(&[("user", &alice)])];

    // Two policies: admitted, both charged.
    assert_eq!(
        decide(&mut client, both()).await,
        (Code::Ok, vec![(Code::Ok, 2), (Code::Ok, 0)])
    );
    // The second policy denies: the first is not charged (2 left, as a peek sees it).
    assert_eq!(
        decide(&mut client, both()).await,
        (Code::OverLimit, vec![(Code::Ok, 2), (Code::OverLimit, 0)])
    );
    assert_eq!(
        decide(&mut client, vec![descriptor(&[("ip", &ip)])]).await,
        (Code::Ok, vec![(Code::Ok, 1)])
    );

    // A rule and a policy: the policy denies, the rule is not charged.
    let rule_and_user = |user: &str| vec![route(&r1), descriptor(&[("user", user)])];
    assert_eq!(
        decide(&mut client, rule_and_user(&bob)).await,
        (Code::Ok, vec![(Code::Ok, 1), (Code::Ok, 0)])
    );
    assert_eq!(
        decide(&mut client, rule_and_user(&bob)).await,
        (Code::OverLimit, vec![(Code::Ok, 1), (Code::OverLimit, 0)])
    );
    assert_eq!(
        decide(&mut client, vec![route(&r1)]).await,
        (Code::Ok, vec![(Code::Ok, 0)])
    );

    // The reverse: the rule is out (0 left) and denies; the policy is not charged.
    let carol = format!("{prefix}carol");
    assert_eq!(
        decide(&mut client, rule_and_user(&carol)).await,
        (Code::OverLimit, vec![(Code::OverLimit, 0), (Code::Ok, 1)])
    );
    assert_eq!(
        decide(&mut client, vec![descriptor(&[("user", &carol)])]).await,
        (Code::Ok, vec![(Code::Ok, 0)])
    );

    // A deny-listed key denies the request without the store: dave is not charged.
    let dave = format!("{prefix}dave");
    let listed = vec![
        descriptor(&[("user", &dave)]),
        descriptor(&[("ip", "6.6.6.6")]),
    ];
    let (code, statuses) = decide(&mut client, listed).await;
    assert_eq!((code, statuses[1].0), (Code::OverLimit, Code::OverLimit));
    assert_eq!(
        decide(&mut client, vec![descriptor(&[("user", &dave)])]).await,
        (Code::Ok, vec![(Code::Ok, 0)])
    );
    server.stop().await;
}

#[tokio::test]
async fn a_denied_request_charges_nothing_on_the_memory_store() {
    a_denied_request_charges_no_policy_and_no_rule(&[], "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_charges_nothing_on_redis() {
    let Some(redis) = distlimit_test::server::RedisServer::start() else {
        return;
    };
    let url = redis.url();
    // A budget no debug build on a loaded machine runs out of: the decisions come from Redis.
    let flags = ["--redis", url.as_str(), "--redis-budget-ms", "5000"];
    a_denied_request_charges_no_policy_and_no_rule(&flags, "redis-").await;
}

#[tokio::test]
async fn past_sixteen_store_requests_a_denied_batch_charges_the_later_ones_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("limits.toml"), MIXED).unwrap();
    let server = Running::with_config(dir.path(), &[]).await;
    let mut client = server.client().await;
    align(3_600, std::time::Duration::from_secs(30)).await;
    // r0 is out (two per hour).
    for _ in 0..2 {
        assert_eq!(decide(&mut client, vec![route("r0")]).await.0, Code::Ok);
    }
    // 19 rules and a policy: 20 store requests, two batches; r0 denies the first, so the
    // second (r16 to r18 and the policy) is only peeked at.
    let mut descriptors: Vec<_> = (0..19).map(|i| route(&format!("r{i}"))).collect();
    descriptors.push(descriptor(&[("user", "zed")]));
    let (code, statuses) = decide(&mut client, descriptors).await;
    assert_eq!(code, Code::OverLimit);
    assert_eq!(statuses.len(), 20);
    assert_eq!(statuses[0], (Code::OverLimit, 0));
    assert!(
        statuses[1..].iter().all(|s| s.0 == Code::Ok),
        "{statuses:?}"
    );
    // Nothing was charged: r1, r17 and zed have all they had.
    for (d, left) in [
        (route("r1"), 1),
        (route("r17"), 1),
        (descriptor(&[("user", "zed")]), 0),
    ] {
        assert_eq!(
            decide(&mut client, vec![d]).await,
            (Code::Ok, vec![(Code::Ok, left)])
        );
    }
    server.stop().await;
}
