//! The hybrid store's per-policy failure modes through the layer, over loopback TCP: its
//! fallback decisions are enforced like any other, fail-open passes, fail-closed is a 503.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use distlimit_hybrid::{FailureMode, Hybrid};
use distlimit_test::{Fault, FaultKind, FaultyStore};
use distlimit_tower::{RateLimitLayer, RouteTable};
use http::{Method, StatusCode};
use support::{frozen_store, get_path, limiter, send, serve};

fn routes() -> RouteTable {
    RouteTable::new()
        .route(None, "/api", "api")
        .route(None, "/login", "login")
}

#[tokio::test]
async fn the_policy_failure_mode_decides_during_an_outage() {
    let primary =
        FaultyStore::new(frozen_store()).with_default(Fault::Fail(FaultKind::Unavailable));
    let store = Hybrid::builder(primary, frozen_store())
        .instances(1)
        // Covers the store policies `login/<tier>` of every tier of `login`.
        .failure_mode("login", FailureMode::FailClosed)
        .build()
        .unwrap();
    let addr = serve(RateLimitLayer::new(limiter(store), routes())).await;

    // `api` falls back to the local store, which enforces the same 2 per 600 ms.
    for _ in 0..2 {
        assert_eq!(
            get_path(addr, "/api/data", &[]).await.status,
            StatusCode::OK
        );
    }
    let denied = get_path(addr, "/api/data", &[]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.header("retry-after"), Some("1"));
    assert_eq!(denied.header("ratelimit"), Some(r#""api/second";r=0;t=1"#));

    // `login` fails closed: the hybrid store returns the error, the layer answers 503.
    let closed = send(addr, Method::POST, "/login", &[]).await;
    assert_eq!(closed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(closed.header("retry-after"), Some("1"));
}

#[tokio::test]
async fn the_fallback_advertises_the_share_it_enforces() {
    let primary =
        FaultyStore::new(frozen_store()).with_default(Fault::Fail(FaultKind::Unavailable));
    // Two instances: during the outage each enforces 1 of `api`'s 2 per 600 ms.
    let store = Hybrid::builder(primary, frozen_store())
        .instances(2)
        .build()
        .unwrap();
    let addr = serve(RateLimitLayer::new(limiter(store), routes())).await;

    assert_eq!(
        get_path(addr, "/api/data", &[]).await.status,
        StatusCode::OK
    );
    let denied = get_path(addr, "/api/data", &[]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some(r#""api/second";q=1;w=1"#)
    );
    assert_eq!(denied.header("ratelimit"), Some(r#""api/second";r=0;t=1"#));
}

#[tokio::test]
async fn a_fail_open_policy_passes_everything_during_an_outage() {
    let primary =
        FaultyStore::new(frozen_store()).with_default(Fault::Fail(FaultKind::Unavailable));
    let store = Hybrid::builder(primary, frozen_store())
        .default_failure_mode(FailureMode::FailOpen)
        .build()
        .unwrap();
    let addr = serve(RateLimitLayer::new(limiter(store), routes())).await;
    // Far beyond 1 per minute.
    for _ in 0..5 {
        let reply = send(addr, Method::POST, "/login", &[]).await;
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (StatusCode::OK, "welcome")
        );
    }
}
