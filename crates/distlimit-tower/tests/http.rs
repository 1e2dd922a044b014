//! Real HTTP over loopback TCP: an axum app behind the layer, a hyper client.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use distlimit_tower::{KeyExtractor, RateLimitHeaders, RateLimitLayer, RouteTable};
use http::{HeaderName, Method, StatusCode};
use serde_json::json;
use support::{frozen_store, get_path, limiter, send, serve};

#[tokio::test]
async fn a_denial_is_a_429_problem_with_exact_headers() {
    let layer = RateLimitLayer::new(limiter(frozen_store()), "api");
    let addr = serve(layer).await;

    for _ in 0..2 {
        let ok = get_path(addr, "/api/data", &[]).await;
        assert_eq!(ok.status, StatusCode::OK);
        assert_eq!(ok.body, "data");
        // Headers on denials only, by default.
        assert_eq!(ok.header("ratelimit"), None);
        assert_eq!(ok.header("retry-after"), None);
    }
    let denied = get_path(addr, "/api/data", &[]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        denied.header("content-type"),
        Some("application/problem+json")
    );
    // The next unit comes in exactly 300 ms: rounded up to 1 s, never 0.
    assert_eq!(denied.header("retry-after"), Some("1"));
    assert_eq!(denied.header("ratelimit"), Some(r#""api/second";r=0;t=1"#));
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some(r#""api/second";q=2;w=1"#)
    );
    assert_eq!(denied.header("x-ratelimit-limit"), None);
    assert_eq!(
        denied.json(),
        json!({
            "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
            "title": "Too Many Requests",
            "status": 429,
            "detail": "Too many requests; retry after the number of seconds in retry_after.",
            "retry_after": 1,
            "violated-policies": ["api/second"],
        })
    );
}

#[tokio::test]
async fn allowed_responses_carry_headers_when_configured() {
    let layer = RateLimitLayer::builder(limiter(frozen_store()), "api")
        .headers(RateLimitHeaders::Always)
        .legacy_headers(true)
        .build();
    let addr = serve(layer).await;

    let ok = get_path(addr, "/api/data", &[]).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(ok.body, "data");
    // One of two units spent: full again in 300 ms.
    assert_eq!(ok.header("ratelimit"), Some(r#""api/second";r=1;t=1"#));
    assert_eq!(
        ok.header("ratelimit-policy"),
        Some(r#""api/second";q=2;w=1"#)
    );
    assert_eq!(ok.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(ok.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(ok.header("x-ratelimit-reset"), Some("1"));
    assert_eq!(ok.header("retry-after"), None);

    get_path(addr, "/api/data", &[]).await;
    let denied = get_path(addr, "/api/data", &[]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(denied.header("ratelimit"), Some(r#""api/second";r=0;t=1"#));
}

#[tokio::test]
async fn headers_never_leaves_only_retry_after() {
    let layer = RateLimitLayer::builder(limiter(frozen_store()), "login")
        .headers(RateLimitHeaders::Never)
        .build();
    let addr = serve(layer).await;
    assert_eq!(
        send(addr, Method::POST, "/login", &[]).await.status,
        StatusCode::OK
    );
    let denied = send(addr, Method::POST, "/login", &[]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    // The fixed minute window started on the minute: 60 s to go.
    assert_eq!(denied.header("retry-after"), Some("60"));
    assert_eq!(denied.header("ratelimit"), None);
    assert_eq!(denied.header("ratelimit-policy"), None);
    assert_eq!(denied.json()["violated-policies"], json!(["login/minute"]));
}

#[tokio::test]
async fn policies_are_chosen_per_route_and_method() {
    let routes =
        RouteTable::new()
            .route(None, "/api", "api")
            .route(Some(Method::POST), "/login", "login");
    let layer = RateLimitLayer::builder(limiter(frozen_store()), routes)
        .headers(RateLimitHeaders::Always)
        .build();
    let addr = serve(layer).await;

    let login = send(addr, Method::POST, "/login", &[]).await;
    assert_eq!(login.status, StatusCode::OK);
    assert_eq!(login.body, "welcome");
    assert_eq!(
        login.header("ratelimit-policy"),
        Some(r#""login/minute";q=1;w=60"#)
    );
    assert_eq!(
        send(addr, Method::POST, "/login", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The api policy is untouched by logins.
    let api = get_path(addr, "/api/data", &[]).await;
    assert_eq!(api.header("ratelimit"), Some(r#""api/second";r=1;t=1"#));
    // Unrouted paths and methods pass unchecked, without headers.
    for _ in 0..5 {
        let health = get_path(addr, "/health", &[]).await;
        assert_eq!(health.status, StatusCode::OK);
        assert_eq!(health.header("ratelimit"), None);
        // GET /login is not routed (405 from axum, not 429).
        let get_login = get_path(addr, "/login", &[]).await;
        assert_eq!(get_login.status, StatusCode::METHOD_NOT_ALLOWED);
    }
}

#[tokio::test]
async fn header_keys_fall_back_to_the_client_ip() {
    let limiter = limiter(frozen_store());
    let layer = RateLimitLayer::builder(limiter.clone(), "login")
        .key(KeyExtractor::header(HeaderName::from_static("x-user-id")))
        .build();
    let addr = serve(layer).await;
    let login = |headers: &'static [(&'static str, &'static str)]| async move {
        send(addr, Method::POST, "/login", headers).await.status
    };

    assert_eq!(login(&[("x-user-id", "alice")]).await, StatusCode::OK);
    assert_eq!(
        login(&[("x-user-id", "alice")]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(login(&[("x-user-id", "bob")]).await, StatusCode::OK);
    // No header: the client IP's own quota.
    assert_eq!(login(&[]).await, StatusCode::OK);
    assert_eq!(login(&[]).await, StatusCode::TOO_MANY_REQUESTS);
    // An oversized value, or one naming an address, is the client IP too (already spent).
    let long: &'static str = Box::leak("x".repeat(129).into_boxed_str());
    let oversized: &'static [(&str, &str)] = Box::leak(Box::new([("x-user-id", long)]));
    assert_eq!(login(oversized).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        login(&[("x-user-id", "198.51.100.7")]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // ... and naming another address did not spend that address's quota.
    let other = limiter.peek("login", b"198.51.100.7").await.unwrap();
    assert!(other.is_allowed());
    let alice = limiter.peek("login", b"alice").await.unwrap();
    assert!(!alice.is_allowed());
    let peer = limiter.peek("login", b"127.0.0.1").await.unwrap();
    assert!(!peer.is_allowed());
}

#[tokio::test]
async fn plain_hyper_with_a_peer_addr_extension() {
    use std::convert::Infallible;
    use std::sync::Arc;

    use distlimit_core::Store;
    use distlimit_policy::Limiter;
    use distlimit_tower::PeerAddr;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use hyper_util::service::TowerToHyperService;

    // A limiter over `dyn Store`, as a service choosing its store at startup would have.
    let store: Arc<dyn Store> = Arc::new(frozen_store());
    let policies = distlimit_policy::PolicySet::from_toml_str(support::POLICIES).unwrap();
    let limiter = Arc::new(Limiter::new(store, policies));
    let layer = RateLimitLayer::new(limiter, "login");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let service = tower::ServiceBuilder::new()
                .map_request(move |mut req: http::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(PeerAddr(peer));
                    req
                })
                .layer(layer.clone())
                .service_fn(|_req: http::Request<hyper::body::Incoming>| async {
                    Ok::<_, Infallible>(http::Response::new(String::from("hyper")))
                });
            tokio::spawn(async move {
                let io = TokioIo::new(stream);
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(io, TowerToHyperService::new(service))
                    .await;
            });
        }
    });

    let ok = send(addr, Method::POST, "/login", &[]).await;
    assert_eq!((ok.status, ok.body.as_str()), (StatusCode::OK, "hyper"));
    let denied = send(addr, Method::POST, "/login", &[]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.header("retry-after"), Some("60"));
    assert_eq!(
        denied.header("ratelimit"),
        Some(r#""login/minute";r=0;t=60"#)
    );
}

#[tokio::test]
async fn a_deny_listed_client_gets_no_retry_after() {
    use std::sync::Arc;

    use distlimit_policy::{Limiter, PolicySet};

    let policies = PolicySet::from_toml_str(
        r#"
        [[policy]]
        name = "blocked"
        deny = ["127.0.0.1"]
        tiers = [{ name = "second", limit = 5, per = "1s" }]
        "#,
    )
    .unwrap();
    let limiter = Arc::new(Limiter::new(Arc::new(frozen_store()), policies));
    let addr = serve(RateLimitLayer::new(limiter, "blocked")).await;
    let denied = get_path(addr, "/api/data", &[]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.header("retry-after"), None);
    assert_eq!(denied.header("ratelimit"), None);
    assert_eq!(
        denied.json(),
        json!({
            "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
            "title": "Too Many Requests",
            "status": 429,
            "detail": "Too many requests; this request cannot pass under the current policy.",
            "violated-policies": ["blocked"],
        })
    );
}

/// The cost a request names in `x-cost` (one unit without it).
fn cost_header(req: &distlimit_tower::RequestInfo<'_>) -> u64 {
    req.headers()
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// `api` (2 units per 600 ms, frozen clock) charged by `x-cost`: a cost of 0 charges nothing,
/// 2 takes the whole burst, 0 is then denied like 1, and 3 (above the burst) can never pass.
async fn requests_charge_their_cost(layer: RateLimitLayer) {
    let addr = serve(layer).await;
    let peek = get_path(addr, "/api/data", &[("x-cost", "0")]).await;
    assert_eq!(peek.status, StatusCode::OK);
    assert_eq!(peek.header("x-ratelimit-remaining"), Some("2"));
    let both = get_path(addr, "/api/data", &[("x-cost", "2")]).await;
    assert_eq!(both.status, StatusCode::OK);
    assert_eq!(both.header("x-ratelimit-remaining"), Some("0"));
    for cost in ["0", "1"] {
        let denied = get_path(addr, "/api/data", &[("x-cost", cost)]).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS, "cost {cost}");
        assert_eq!(denied.header("retry-after"), Some("1"), "cost {cost}");
    }
    let never = get_path(addr, "/api/data", &[("x-cost", "3")]).await;
    assert_eq!(never.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(never.header("retry-after"), None);
    assert_eq!(
        never.json()["detail"],
        "Too many requests; this request cannot pass under the current policy."
    );
}

#[tokio::test]
async fn requests_charge_the_cost_their_head_names() {
    // The memory store answers in `call` (`Limiter::check_all_now`).
    let layer = RateLimitLayer::builder(limiter(frozen_store()), "api")
        .headers(RateLimitHeaders::Always)
        .legacy_headers(true)
        .cost(cost_header)
        .build();
    requests_charge_their_cost(layer).await;
}

#[tokio::test]
async fn a_store_that_must_be_awaited_is_charged_the_cost_too() {
    // A store without `decide_now` is checked in the request's future (`Limiter::decide_plan`).
    let store = distlimit_test::FaultyStore::new(frozen_store())
        .with_default(distlimit_test::Fault::Delay(std::time::Duration::ZERO));
    let layer = RateLimitLayer::builder(limiter(store), "api")
        .headers(RateLimitHeaders::Always)
        .legacy_headers(true)
        .cost(cost_header)
        .build();
    requests_charge_their_cost(layer).await;
}
