//! Store failures and misconfiguration over loopback TCP: the failure mode decides, and no
//! request hangs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use distlimit_test::{Fault, FaultKind, FaultyStore};
use distlimit_tower::{OnError, RateLimitLayer};
use http::StatusCode;
use serde_json::json;
use support::{app, frozen_store, get_path, limiter, serve, serve_router};

#[tokio::test]
async fn a_store_error_fails_closed_with_a_503_problem() {
    let store = FaultyStore::new(frozen_store()).with_default(Fault::Fail(FaultKind::Unavailable));
    let addr = serve(RateLimitLayer::new(limiter(store), "api")).await;
    let reply = get_path(addr, "/api/data", &[]).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(
        reply.json(),
        json!({
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": 503,
            "detail": "The rate limiter is unavailable; retry later.",
            "retry_after": 1,
        })
    );
}

#[tokio::test]
async fn fail_closed_waits_are_configurable() {
    let store = FaultyStore::new(frozen_store()).with_default(Fault::Fail(FaultKind::Protocol));
    let layer = RateLimitLayer::builder(limiter(store), "api")
        .on_error(OnError::FailClosed {
            retry_after: Duration::from_millis(2500),
        })
        .build();
    let reply = get_path(serve(layer).await, "/api/data", &[]).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.header("retry-after"), Some("3"));
}

#[tokio::test]
async fn a_store_error_fails_open_when_configured() {
    let limiter = limiter(FaultyStore::new(frozen_store()));
    let layer = RateLimitLayer::builder(limiter.clone(), "api")
        .on_error(OnError::FailOpen)
        .build();
    let addr = serve(layer).await;
    limiter
        .store()
        .set_default(Fault::Fail(FaultKind::Unavailable));
    // Far beyond the quota of 2: every request passes while the store is down.
    for _ in 0..5 {
        let reply = get_path(addr, "/api/data", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, "data");
    }
    // The store back: enforced again.
    limiter.store().set_default(Fault::Pass);
    let statuses = [
        get_path(addr, "/api/data", &[]).await.status,
        get_path(addr, "/api/data", &[]).await.status,
        get_path(addr, "/api/data", &[]).await.status,
    ];
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(limiter.store().calls(), 8);
}

#[tokio::test]
async fn a_hanging_store_is_answered_within_the_timeout() {
    let limiter = limiter(FaultyStore::new(frozen_store()).with_default(Fault::Hang));
    let layer = RateLimitLayer::builder(limiter.clone(), "api")
        .timeout(Some(Duration::from_millis(100)))
        .build();
    let addr = serve(layer).await;
    // `get_path` gives up after `GUARD` (20 s): the store never answers, the layer does.
    let reply = get_path(addr, "/api/data", &[]).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(limiter.store().calls(), 1);

    // Failing open after the timeout lets the request through.
    let layer = RateLimitLayer::builder(limiter, "api")
        .timeout(Some(Duration::from_millis(100)))
        .on_error(OnError::FailOpen)
        .build();
    let reply = get_path(serve(layer).await, "/api/data", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn an_unknown_policy_is_a_500_problem() {
    let addr = serve(RateLimitLayer::new(limiter(frozen_store()), "nope")).await;
    let reply = get_path(addr, "/api/data", &[]).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(reply.json()["detail"], "The rate limiter is misconfigured.");
}

#[tokio::test]
async fn a_server_without_peer_addresses_is_a_500_problem() {
    let layer = RateLimitLayer::new(limiter(frozen_store()), "api");
    let addr = serve_router(app().layer(layer), false).await;
    let reply = get_path(addr, "/api/data", &[]).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        reply.json()["detail"],
        "The rate limiter cannot identify the client."
    );
}
