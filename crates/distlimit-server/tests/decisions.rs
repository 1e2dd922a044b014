//! What a client sends is decided, and answered as Envoy users know it: long values stay
//! limited, `OVER_LIMIT` reports nothing left, a request spending nothing is never over, the
//! headers come from the descriptor that denied, and a rule's state is keyed by its domain,
//! entries and unit (not by labels). Each test runs the real binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::google::protobuf::UInt64Value;
use support::binary::{Binary, LOADS_OK};
use support::*;

const PER_USER: &str = "
domain: d
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 2
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 15
";

#[tokio::test]
async fn a_client_at_its_limit_stays_over_it_with_long_values() {
    let dir = config_dir(PER_USER);
    let server = Binary::with_config(dir.path(), &[]);
    let mut client = server.client().await;
    align(3_600, Duration::from_secs(5)).await;
    for len in [4_097, 100_000] {
        let value = "u".repeat(len);
        let both = || {
            request(
                "d",
                vec![
                    descriptor(&[("user", &value)]),
                    descriptor(&[("remote_address", &format!("10.0.0.{}", len % 200))]),
                ],
            )
        };
        for i in 0..2 {
            let answer = call(&mut client, both()).await;
            assert_eq!(answer.overall_code, OK, "{len} bytes, request {i}");
        }
        let denied = call(&mut client, both()).await;
        assert_eq!(denied.overall_code, OVER_LIMIT, "{len} bytes");
        // The per-address descriptor was decided too (and not charged by the denial).
        assert_eq!(denied.statuses[1].limit_remaining, 13, "{len} bytes");
        // Another long value is another client.
        let other = "v".repeat(len);
        let answer = call(
            &mut client,
            request("d", vec![descriptor(&[("user", &other)])]),
        )
        .await;
        assert_eq!(answer.overall_code, OK);
    }
}

#[tokio::test]
async fn over_limit_leaves_nothing_and_spending_nothing_is_never_over() {
    let dir = config_dir(PER_USER);
    let server = Binary::with_config(dir.path(), &["--response-headers"]);
    let mut client = server.client().await;
    align(3_600, Duration::from_secs(5)).await;
    let with_hits = |value: &str, hits: Option<u64>| {
        let mut d = descriptor(&[("remote_address", value)]);
        d.hits_addend = hits.map(|value| UInt64Value { value });
        d
    };
    // 13 of 15 spent: 3 more is over the limit, and nothing remains (not 2).
    let answer = call(&mut client, request("d", vec![with_hits("a", Some(13))])).await;
    assert_eq!(answer.statuses[0].limit_remaining, 2);
    let over = call(&mut client, request("d", vec![with_hits("a", Some(3))])).await;
    assert_eq!(over.overall_code, OVER_LIMIT);
    assert_eq!(over.statuses[0].limit_remaining, 0);
    // Exactly at the limit, a request spending nothing is OK with 0 remaining.
    call(&mut client, request("d", vec![with_hits("a", Some(2))])).await;
    let peek = call(&mut client, request("d", vec![with_hits("a", Some(0))])).await;
    assert_eq!(peek.overall_code, OK);
    assert_eq!(
        (peek.statuses[0].code, peek.statuses[0].limit_remaining),
        (OK, 0)
    );
    // The headers of a denied request come from the descriptor that denied it, even when
    // another one has as little left.
    let denied = call(
        &mut client,
        request(
            "d",
            vec![
                with_hits("a", Some(0)),
                descriptor(&[("user", "x")]),
                with_hits("a", Some(1)),
            ],
        ),
    )
    .await;
    assert_eq!(denied.overall_code, OVER_LIMIT);
    let header = |name: &str| {
        denied
            .response_headers_to_add
            .iter()
            .find(|h| h.key == name)
            .map(|h| h.value.clone())
    };
    assert_eq!(header("ratelimit-limit").as_deref(), Some("15"));
    assert_eq!(header("ratelimit-remaining").as_deref(), Some("0"));
}

#[tokio::test]
async fn an_override_keeps_the_rules_state_only_in_the_same_unit() {
    let dir = config_dir(PER_USER);
    let server = Binary::with_config(dir.path(), &[]);
    let mut client = server.client().await;
    align(86_400, Duration::from_secs(5)).await;
    let overridden = |requests_per_unit: u32, unit: i32| {
        let mut d = descriptor(&[("remote_address", "o")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit,
            unit,
        });
        request("d", vec![d])
    };
    // 10/day once, then 42/hour: another unit, another counter (envoyproxy/ratelimit: 41).
    let day = call(&mut client, overridden(10, 4)).await;
    assert_eq!(day.statuses[0].limit_remaining, 9);
    let hour = call(&mut client, overridden(42, 3)).await;
    assert_eq!(hour.statuses[0].limit_remaining, 41);
    // The rule (15/hour) shares the hour's counter: 1 spent there, 1 here.
    let rule = call(
        &mut client,
        request("d", vec![descriptor(&[("remote_address", "o")])]),
    )
    .await;
    assert_eq!(rule.statuses[0].limit_remaining, 13);
}

/// `RateLimitRequest` as bytes on the wire: what a client with invalid UTF-8 sends.
#[derive(Clone, PartialEq, prost::Message)]
struct RawRequest {
    #[prost(bytes = "vec", tag = "1")]
    domain: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<RawDescriptor>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawDescriptor {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<RawEntry>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawEntry {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

#[tokio::test]
async fn a_client_at_its_limit_stays_over_it_with_invalid_utf8() {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;

    let dir = config_dir(PER_USER);
    let server = Binary::with_config(dir.path(), &[]);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    align(3_600, Duration::from_secs(5)).await;
    let mut answers = Vec::new();
    for _ in 0..3 {
        let request = RawRequest {
            domain: b"d".to_vec(),
            descriptors: vec![RawDescriptor {
                entries: vec![RawEntry {
                    key: b"user".to_vec(),
                    value: b"bad \xff\xfe utf-8".to_vec(),
                }],
            }],
        };
        grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<RawRequest, RateLimitResponse>::default();
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        );
        let answer = grpc
            .unary(tonic::Request::new(request), path, codec)
            .await
            .expect("decided, not a gRPC error")
            .into_inner();
        answers.push(answer.overall_code);
    }
    assert_eq!(answers, [OK, OK, OVER_LIMIT]);
}

#[tokio::test]
async fn toggling_detailed_metric_in_a_reload_keeps_the_state() {
    let yaml = |detailed: bool| {
        format!(
            "domain: d\ndescriptors:\n  - key: user\n    detailed_metric: {detailed}\n    \
             rate_limit: {{ unit: hour, requests_per_unit: 5 }}\n"
        )
    };
    let dir = config_dir(&yaml(false));
    let file = dir.path().join("config.yaml");
    let server = Binary::with_config(dir.path(), &[]);
    let mut client = server.client().await;
    align(3_600, Duration::from_secs(5)).await;
    let alice = || request("d", vec![descriptor(&[("user", "alice")])]);
    let mut admitted = 0;
    for detailed in [true, false, true] {
        for _ in 0..5 {
            if call(&mut client, alice()).await.overall_code == OK {
                admitted += 1;
            }
        }
        let loads = server.metric(LOADS_OK);
        std::fs::write(&file, yaml(detailed)).unwrap();
        server.wait_metric_above(LOADS_OK, loads);
    }
    // 5 per hour, whatever the metrics flag said (the state was renamed with it: 10, 15).
    assert_eq!(admitted, 5);
}
