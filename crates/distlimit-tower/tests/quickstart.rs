//! `RateLimitLayer::per_client` over real HTTP on loopback: one limit per client IP (two
//! clients on 127.0.0.1 and 127.0.0.2), or per header value with the IP as fallback; and the
//! layer on routes only, so requests no route serves spend nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::net::{IpAddr, SocketAddr};

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use distlimit_tower::{KeyExtractor, Quota, RateLimitLayer};
use http::{HeaderName, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use support::{GUARD, serve_router};

/// A GET from the loopback address `from`, over a fresh connection; the status and `RateLimit`.
async fn get_from(
    server: SocketAddr,
    from: &str,
    method: Method,
    headers: &[(&str, &str)],
) -> (StatusCode, Option<String>) {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(from.parse::<IpAddr>().unwrap()));
    let client = Client::builder(TokioExecutor::new()).build::<_, Full<Bytes>>(connector);
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{server}/hello"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let exchange = async {
        let res = client
            .request(req.body(Full::new(Bytes::new())).unwrap())
            .await
            .unwrap();
        let status = res.status();
        let ratelimit = res
            .headers()
            .get("ratelimit")
            .map(|v| v.to_str().unwrap().to_owned());
        res.into_body().collect().await.unwrap();
        (status, ratelimit)
    };
    tokio::time::timeout(GUARD, exchange)
        .await
        .expect("answered")
}

async fn serve(layer: RateLimitLayer) -> SocketAddr {
    // On the method router: axum answers 405 in the method router's fallback, which
    // `Router::route_layer` wraps too (404s it does not).
    let app = Router::new().route("/hello", get(|| async { "hello" }).route_layer(layer));
    serve_router(app, true).await
}

#[tokio::test]
async fn per_client_limits_each_client_ip() {
    // Two at once, then one every 30 s: the third request within the test is denied.
    let layer = RateLimitLayer::per_client(Quota::per_minute(2).unwrap()).build();
    let server = serve(layer).await;

    for _ in 0..2 {
        let (status, _) = get_from(server, "127.0.0.1", Method::GET, &[]).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, ratelimit) = get_from(server, "127.0.0.1", Method::GET, &[]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let ratelimit = ratelimit.unwrap();
    assert!(
        ratelimit.starts_with(r#""default/client";r=0;t="#),
        "{ratelimit}"
    );
    // Another client has its own quota.
    for _ in 0..2 {
        let (status, _) = get_from(server, "127.0.0.2", Method::GET, &[]).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, _) = get_from(server, "127.0.0.2", Method::GET, &[]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn per_client_keyed_by_a_header_falls_back_to_the_ip() {
    let layer = RateLimitLayer::per_client(Quota::per_hour(1).unwrap())
        .key(KeyExtractor::header(HeaderName::from_static("x-user-id")))
        .build();
    let server = serve(layer).await;
    let alice = [("x-user-id", "alice")];
    let bob = [("x-user-id", "bob")];

    let get = |from, headers| get_from(server, from, Method::GET, headers);
    assert_eq!(get("127.0.0.1", &alice).await.0, StatusCode::OK);
    // The same user from another address: the same key.
    assert_eq!(
        get("127.0.0.2", &alice).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(get("127.0.0.1", &bob).await.0, StatusCode::OK);
    // Without the header: keyed by IP, one quota per address.
    assert_eq!(get("127.0.0.1", &[]).await.0, StatusCode::OK);
    assert_eq!(get("127.0.0.1", &[]).await.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(get("127.0.0.2", &[]).await.0, StatusCode::OK);
}

#[tokio::test]
async fn router_route_layer_still_charges_a_405() {
    // What the README warns about: `Router::route_layer` keeps 404s free, not 405s.
    let layer = RateLimitLayer::per_client(Quota::per_hour(1).unwrap()).build();
    let app = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route_layer(layer);
    let server = serve_router(app, true).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    for _ in 0..2 {
        let missing = client
            .get(format!("http://{server}/nowhere").parse().unwrap())
            .await
            .unwrap();
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    }
    let (status, _) = get_from(server, "127.0.0.1", Method::POST, &[]).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let (status, _) = get_from(server, "127.0.0.1", Method::GET, &[]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn on_routes_only_a_405_or_404_spends_nothing() {
    let layer = RateLimitLayer::per_client(Quota::per_hour(1).unwrap()).build();
    let server = serve(layer).await;

    // `/hello` serves GET only: POST is 405 and `/nowhere` 404, neither charged.
    for _ in 0..3 {
        let (status, _) = get_from(server, "127.0.0.1", Method::POST, &[]).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let missing = client
        .get(format!("http://{server}/nowhere").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    // The one unit of the hour is still there, and spent by the first GET.
    let (status, _) = get_from(server, "127.0.0.1", Method::GET, &[]).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = get_from(server, "127.0.0.1", Method::GET, &[]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}
