//! The JSON API, `/ready`, `/metrics` and graceful shutdown over loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::*;

async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (StatusCode, hyper::HeaderMap, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

#[tokio::test]
async fn check_answers_json_with_429_over_the_limit() {
    let dir = config_dir(
        "
domain: api
descriptors:
  - key: user
    rate_limit: { name: per-user, unit: hour, requests_per_unit: 2 }
",
    );
    let server = Running::with_config(dir.path(), &["--response-headers"]).await;
    align(3_600, Duration::from_secs(5)).await;
    let body = r#"{"domain":"api","descriptors":[[{"key":"user","value":"alice"}],[{"key":"other","value":"x"}]]}"#;
    let (status, headers, text) = send(server.http, "POST", "/v1/check", body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["overall_code"], "OK");
    assert_eq!(json["statuses"][0]["current_limit"]["requests_per_unit"], 2);
    assert_eq!(json["statuses"][0]["current_limit"]["unit"], "hour");
    assert_eq!(json["statuses"][0]["limit_remaining"], 1);
    assert!(
        json["statuses"][0]["duration_until_reset_ms"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(json["statuses"][1].get("current_limit").is_none());
    assert_eq!(headers["ratelimit-policy"], r#""per-user";q=2;w=3600"#);

    let with_hits = r#"{"domain":"api","descriptors":[[{"key":"user","value":"alice"}]],"hits":2}"#;
    let (status, _, text) = send(server.http, "POST", "/v1/check", with_hits).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
    assert!(text.contains(r#""overall_code":"OVER_LIMIT""#), "{text}");

    for (bad, expected) in [
        (
            r#"{"domain":"","descriptors":[[{"key":"a","value":"b"}]]}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            r#"{"domain":"api","descriptors":[]}"#,
            StatusCode::BAD_REQUEST,
        ),
        (r#"{"domain":"api"}"#, StatusCode::UNPROCESSABLE_ENTITY),
        ("not json", StatusCode::BAD_REQUEST),
    ] {
        let (status, _, text) = send(server.http, "POST", "/v1/check", bad).await;
        assert_eq!(status, expected, "{bad}: {text}");
        assert!(text.contains("error"), "{text}");
    }
    let too_big = format!(
        r#"{{"domain":"api","descriptors":[[{{"key":"user","value":"{}"}}]]}}"#,
        "z".repeat(300 * 1024)
    );
    let (status, _, _) = send(server.http, "POST", "/v1/check", &too_big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);

    let (status, _, text) = send(server.http, "GET", "/metrics", "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        text.contains(
            r#"distlimit_decisions_total{policy="api/user",outcome="denied",source="primary"} 1"#
        ),
        "{text}"
    );
    server.stop().await;
}

#[tokio::test]
async fn ready_until_shutdown_which_finishes_in_time() {
    let server = Running::start(&["--shutdown-timeout-ms", "2000"]).await;
    let (status, _, text) = send(server.http, "GET", "/ready", "").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let http = server.http;
    let started = std::time::Instant::now();
    server.stop().await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        tokio::net::TcpStream::connect(http).await.is_err(),
        "the port is closed"
    );
}

#[tokio::test]
async fn requests_are_counted_by_configured_domain_protocol_and_result() {
    let dir = config_dir(
        "
domain: api
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 1 }
",
    );
    let server = Running::with_config(dir.path(), &[]).await;
    align(3_600, Duration::from_secs(5)).await;
    let mut client = server.client().await;
    for domain in ["api", "api", "not-configured-1", "not-configured-2"] {
        call(
            &mut client,
            request(domain, vec![descriptor(&[("user", "erin")])]),
        )
        .await;
    }
    let empty = client
        .should_rate_limit(request("api", vec![]))
        .await
        .unwrap_err();
    assert_eq!(empty.code(), tonic::Code::InvalidArgument);
    let body = r#"{"domain":"api","descriptors":[[{"key":"user","value":"frank"}]]}"#;
    send(server.http, "POST", "/v1/check", body).await;
    let (_, _, metrics) = send(server.http, "GET", "/metrics", "").await;
    for line in [
        r#"distlimit_server_requests_total{domain="api",protocol="grpc",result="ok"} 1"#,
        r#"distlimit_server_requests_total{domain="api",protocol="grpc",result="over_limit"} 1"#,
        r#"distlimit_server_requests_total{domain="api",protocol="grpc",result="invalid"} 1"#,
        r#"distlimit_server_requests_total{domain="unconfigured",protocol="grpc",result="ok"} 2"#,
        r#"distlimit_server_requests_total{domain="api",protocol="http",result="ok"} 1"#,
        r#"distlimit_server_request_duration_seconds_count{protocol="grpc"} 5"#,
        // The decision series are still served beside them.
        r#"distlimit_decisions_total{policy="api/user",outcome="allowed",source="primary"} 2"#,
    ] {
        assert!(metrics.contains(line), "{line} missing from\n{metrics}");
    }
    assert!(!metrics.contains("not-configured"), "{metrics}");
    server.stop().await;
}

/// `/v1/permits/*`: acquire up to `max_in_flight`, 429 past it with the wait until the earliest
/// permit expires, release (once) frees a place, renew answers whether the permit is held, bad
/// input is a 400 naming what was wrong.
#[tokio::test]
async fn permits_are_acquired_released_and_renewed_over_json() {
    let server = Running::start(&[]).await;
    let limit = r#""name":"jobs","key":"tenant-1","max_in_flight":2,"lease_ms":60000"#;
    let acquire = format!("{{{limit}}}");
    let mut permits = Vec::new();
    for in_flight in 1..=2 {
        let (status, _, text) = send(server.http, "POST", "/v1/permits/acquire", &acquire).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["acquired"], true);
        assert_eq!(json["in_flight"], in_flight);
        permits.push(json["permit"].as_u64().unwrap());
    }
    let (status, _, text) = send(server.http, "POST", "/v1/permits/acquire", &acquire).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["acquired"], false);
    let wait = json["retry_after_ms"].as_u64().unwrap();
    assert!((1..=60_000).contains(&wait), "{text}");

    let with = |permit: u64| format!("{{{limit},\"permit\":{permit}}}");
    let (status, _, text) = send(server.http, "POST", "/v1/permits/renew", &with(permits[1])).await;
    assert_eq!(
        (status, text.as_str()),
        (StatusCode::OK, r#"{"held":true}"#)
    );
    let (_, _, text) = send(
        server.http,
        "POST",
        "/v1/permits/release",
        &with(permits[0]),
    )
    .await;
    assert_eq!(text, r#"{"held":true}"#);
    let (_, _, text) = send(
        server.http,
        "POST",
        "/v1/permits/release",
        &with(permits[0]),
    )
    .await;
    assert_eq!(text, r#"{"held":false}"#);
    let (status, _, _) = send(server.http, "POST", "/v1/permits/acquire", &acquire).await;
    assert_eq!(status, StatusCode::OK);

    for bad in [
        r#"{"name":"jobs","key":"k","max_in_flight":0,"lease_ms":1000}"#,
        r#"{"name":"jobs","key":"k","max_in_flight":1,"lease_ms":0}"#,
        r#"{"name":"jobs","key":"","max_in_flight":1,"lease_ms":1000}"#,
        r#"{"name":"jobs","key":"k","max_in_flight":1,"lease_ms":1000,"permit":9007199254740992}"#,
    ] {
        let path = if bad.contains("permit\"") {
            "/v1/permits/release"
        } else {
            "/v1/permits/acquire"
        };
        let (status, _, text) = send(server.http, "POST", path, bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {text}");
        assert!(text.contains("error"), "{text}");
    }
    let (status, _, _) = send(
        server.http,
        "POST",
        "/v1/permits/release",
        r#"{"name":"jobs","key":"k","max_in_flight":1,"lease_ms":1000}"#,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    server.stop().await;
}

/// `/v1/permits/*` by TOML policy name: the policy's `max_in_flight` (2) and `in_flight_lease`
/// are the limit, and a reload raising it to 3 applies to the next acquire. A policy without
/// `max_in_flight`, no such policy, or `policy` next to an explicit limit is a 400 naming it.
#[tokio::test]
async fn permits_are_acquired_by_toml_policy_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limits.toml");
    let toml = |max: u32| {
        format!(
            "[[policy]]\nname = \"jobs\"\nmax_in_flight = {max}\nin_flight_lease = \"1m\"\n\
             tiers = [{{ name = \"t\", limit = 1, per = \"1s\" }}]\n\
             [[policy]]\nname = \"plain\"\ntiers = [{{ name = \"t\", limit = 1, per = \"1s\" }}]\n"
        )
    };
    std::fs::write(&file, toml(2)).unwrap();
    let mut server = Running::with_config(dir.path(), &[]).await;
    let acquire = r#"{"policy":"jobs","key":"tenant-1"}"#;
    let mut permits = Vec::new();
    for in_flight in 1..=2 {
        let (status, _, text) = send(server.http, "POST", "/v1/permits/acquire", acquire).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (json["in_flight"].as_u64(), json["max_in_flight"].as_u64()),
            (Some(in_flight), Some(2))
        );
        permits.push(json["permit"].as_u64().unwrap());
    }
    let (status, _, text) = send(server.http, "POST", "/v1/permits/acquire", acquire).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
    let wait: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        (30_000..=60_000).contains(&wait["retry_after_ms"].as_u64().unwrap()),
        "{text}"
    );
    // The same state as an explicit limit of that name: release by policy frees a place there.
    let release = format!(
        r#"{{"policy":"jobs","key":"tenant-1","permit":{}}}"#,
        permits[0]
    );
    let (_, _, text) = send(server.http, "POST", "/v1/permits/release", &release).await;
    assert_eq!(text, r#"{"held":true}"#);
    let (status, _, text) = send(server.http, "POST", "/v1/permits/acquire", acquire).await;
    assert_eq!(status, StatusCode::OK, "{text}");

    std::fs::write(&file, toml(3)).unwrap();
    let reload = server.next_reload().await;
    assert!(
        matches!(reload, distlimit_server::Reload::Applied { .. }),
        "{reload:?}"
    );
    let (status, _, text) = send(server.http, "POST", "/v1/permits/acquire", acquire).await;
    assert_eq!(status, StatusCode::OK, "the reloaded limit of 3: {text}");

    for (bad, says) in [
        (
            r#"{"policy":"plain","key":"k"}"#,
            r#"policy \"plain\": max_in_flight: the policy has no max_in_flight"#,
        ),
        (
            r#"{"policy":"nope","key":"k"}"#,
            r#"policy \"nope\": name: no such policy"#,
        ),
        (
            r#"{"policy":"jobs","key":"k","max_in_flight":5}"#,
            "give it without `name`, `max_in_flight` and `lease_ms`",
        ),
        (
            r#"{"policy":"jobs","name":"jobs","key":"k"}"#,
            "give it without",
        ),
        (
            r#"{"name":"jobs","key":"k","lease_ms":1000}"#,
            "missing `max_in_flight` (or give `policy`)",
        ),
    ] {
        let (status, _, text) = send(server.http, "POST", "/v1/permits/acquire", bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {text}");
        assert!(text.contains(says), "{bad}: {text}");
    }
    server.stop().await;
}
