//! Limits charged from the response (`Settle`), on an axum router: the header's actual cost
//! settles the reservation when the body ends, a 5xx gives the estimate back, a response
//! dropped before its body ends gives it back too (or settles, when configured so).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use distlimit_memory::MemoryStore;
use distlimit_policy::{Limiter, PolicySet};
use distlimit_tower::{KeyExtractor, PeerAddr, RateLimitLayer, Settle};
use http::{HeaderName, Request};
use http_body_util::BodyExt;
use tower::ServiceExt;

const USER: HeaderName = HeaderName::from_static("x-user-id");
const USAGE: HeaderName = HeaderName::from_static("x-usage");

/// 100 tokens an hour: nothing refills while the test runs.
fn limiter() -> Arc<Limiter> {
    let policies = PolicySet::from_toml_str(
        r#"
        [[policy]]
        name = "tokens"
        tiers = [{ name = "hour", algorithm = "gcra", limit = 100, per = "1h" }]
        "#,
    )
    .unwrap();
    Arc::new(Limiter::new(Arc::new(MemoryStore::new()), policies))
}

fn app(limiter: Arc<Limiter>, settle: Settle) -> Router {
    let layer = RateLimitLayer::builder(limiter, "tokens")
        .key(KeyExtractor::header(USER))
        .settle(settle)
        .build();
    Router::new()
        .route(
            "/used/{n}",
            get(
                |axum::extract::Path(n): axum::extract::Path<u64>| async move {
                    ([(USAGE, n.to_string())], "done")
                },
            ),
        )
        .route(
            "/fail",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, [(USAGE, "50")], "boom") }),
        )
        .route_layer(layer)
}

fn request(path: &str) -> Request<axum::body::Body> {
    let mut request = Request::get(path)
        .header(USER, "alice")
        .body(axum::body::Body::empty())
        .unwrap();
    request
        .extensions_mut()
        .insert(PeerAddr(SocketAddr::from(([127, 0, 0, 1], 1))));
    request
}

/// Tokens left for alice (a peek), once the settle task ran.
async fn left(limiter: &Limiter) -> u64 {
    tokio::time::sleep(Duration::from_millis(50)).await;
    limiter
        .peek("tokens", b"alice")
        .await
        .unwrap()
        .decision()
        .remaining()
}

#[tokio::test]
async fn the_header_settles_a_5xx_and_a_drop_refund() {
    let limiter = limiter();
    let settle = Settle::from_header(USAGE).estimate(10);
    let app = app(limiter.clone(), settle);

    // Reserve 10, use 30: 30 charged.
    let response = app.clone().oneshot(request("/used/30")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
    assert_eq!(left(&limiter).await, 70);

    // Reserve 10, use 4: 4 charged.
    let response = app.clone().oneshot(request("/used/4")).await.unwrap();
    response.into_body().collect().await.unwrap();
    assert_eq!(left(&limiter).await, 66);

    // A 5xx: the estimate goes back, whatever the header says.
    let response = app.clone().oneshot(request("/fail")).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    response.into_body().collect().await.unwrap();
    assert_eq!(left(&limiter).await, 66);

    // Dropped before the body was read: the estimate goes back.
    let response = app.clone().oneshot(request("/used/20")).await.unwrap();
    drop(response);
    assert_eq!(left(&limiter).await, 66);

    // Over the quota: 200 used past the 66 left is debt; the next reservation is denied.
    let response = app.clone().oneshot(request("/used/200")).await.unwrap();
    response.into_body().collect().await.unwrap();
    assert_eq!(left(&limiter).await, 0);
    let denied = app.clone().oneshot(request("/used/1")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // 134 tokens of debt, then 10 for the estimate: 144 × 36 s.
    let retry: u64 = denied.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((144 * 36 - 1..=144 * 36).contains(&retry), "{retry}");
}

#[tokio::test]
async fn a_drop_settles_when_refunds_on_drop_are_off() {
    let limiter = limiter();
    let settle = Settle::from_header(USAGE)
        .estimate(10)
        .refund_on_drop(false);
    let app = app(limiter.clone(), settle);
    let response = app.oneshot(request("/used/25")).await.unwrap();
    drop(response);
    assert_eq!(left(&limiter).await, 75);
}
