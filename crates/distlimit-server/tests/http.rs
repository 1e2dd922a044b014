//! The JSON API, `/ready`, `/metrics` and graceful shutdown over loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

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
