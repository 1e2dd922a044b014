//! Usage reported after the response (Envoy's `apply_on_stream_done` with a
//! `distlimit.report` entry, `POST /v1/report`) and given back (`is_negative_hits`): charged even
//! past the limit as debt, on a TOML token bucket, over loopback; refused, typed, on a YAML rule.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::net::SocketAddr;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::*;

/// 10 tokens an hour per user: nothing refills during the test.
const POLICIES: &str = r#"
[[policy]]
name = "tokens"
tiers = [ { name = "hour", algorithm = "token_bucket", limit = 10, per = "1h" } ]

[domain.ai]
descriptors = [ { keys = ["user"], policy = "tokens" } ]
"#;

const YAML: &str = "
domain: api
descriptors:
  - key: user
    rate_limit: { name: per-user, unit: hour, requests_per_unit: 2 }
";

async fn post(addr: SocketAddr, path: &str, body: &str) -> (StatusCode, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn hits(mut request: RateLimitRequest, hits: u32) -> RateLimitRequest {
    request.hits_addend = hits;
    request
}

fn negative(mut d: RateLimitDescriptor) -> RateLimitDescriptor {
    d.is_negative_hits = true;
    d
}

#[tokio::test]
async fn reports_charge_past_the_limit_and_give_backs_return() {
    let dir = config_dir(YAML);
    std::fs::write(dir.path().join("limits.toml"), POLICIES).unwrap();
    let server = Running::with_config(dir.path(), &[]).await;
    let mut client = server.client().await;
    let code = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        Code::try_from(r.overall_code).unwrap()
    };

    // Check 1, then report 14 more at the end of the stream: 15 of 10, 5 of debt.
    let check = call(
        &mut client,
        request("ai", vec![descriptor(&[("user", "a")])]),
    )
    .await;
    assert_eq!(code(&check), Code::Ok);
    let report = request(
        "ai",
        vec![descriptor(&[("distlimit.report", "1"), ("user", "a")])],
    );
    let answer = call(&mut client, hits(report, 14)).await;
    assert_eq!(code(&answer), Code::OverLimit, "the key is in debt now");
    let check = call(
        &mut client,
        request("ai", vec![descriptor(&[("user", "a")])]),
    )
    .await;
    assert_eq!(code(&check), Code::OverLimit, "denied while in debt");

    // Give 7 back (a reservation larger than the use): 8 of 10 spent, one more passes.
    let back = request("ai", vec![negative(descriptor(&[("user", "a")]))]);
    let answer = call(&mut client, hits(back, 7)).await;
    assert_eq!(code(&answer), Code::Ok);
    let check = call(
        &mut client,
        hits(request("ai", vec![descriptor(&[("user", "a")])]), 2),
    )
    .await;
    assert_eq!(code(&check), Code::Ok);
    let check = call(
        &mut client,
        request("ai", vec![descriptor(&[("user", "a")])]),
    )
    .await;
    assert_eq!(code(&check), Code::OverLimit);

    // The JSON report: always 200 once recorded, the status says the key is over now.
    let body = r#"{"domain":"ai","descriptors":[[{"key":"user","value":"b"}]],"hits":12}"#;
    let (status, text) = post(server.http, "/v1/report", body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains(r#""code":"OVER_LIMIT""#), "{text}");
    let check = r#"{"domain":"ai","descriptors":[[{"key":"user","value":"b"}]]}"#;
    let (status, _) = post(server.http, "/v1/check", check).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);

    // A report on a YAML rule (a fixed window) cannot carry debt: a typed 400, nothing charged.
    let body = r#"{"domain":"api","descriptors":[[{"key":"user","value":"c"}]],"hits":5}"#;
    let (status, text) = post(server.http, "/v1/report", body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("cannot carry debt"), "{text}");
    let check = r#"{"domain":"api","descriptors":[[{"key":"user","value":"c"}]],"hits":2}"#;
    let (status, _) = post(server.http, "/v1/check", check).await;
    assert_eq!(status, StatusCode::OK, "the refused report charged nothing");
    server.stop().await;
}
