//! Allocation counting for the layer's own answers: what a request the memory store denies
//! allocates, 429 and problem document included.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use distlimit_memory::MemoryStore;
use distlimit_policy::{Limiter, PolicySet};
use distlimit_tower::{KeyExtractor, PeerAddr, RateLimitLayer};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use tower::{Layer, Service};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const ROUNDS: u64 = 1000;
const USER: HeaderName = HeaderName::from_static("x-user-id");

/// Runs a future that completes on its first poll (the memory store answers at once).
fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the memory store never waits"),
    }
}

fn blocks() -> u64 {
    dhat::HeapStats::get().total_blocks
}

/// Allocations per request of one request per user of `users` (built before counting), each
/// answered `status`.
fn per_request<S>(service: &mut S, users: &[HeaderValue], status: StatusCode) -> f64
where
    S: Service<Request<()>, Response = Response<distlimit_tower::RateLimitBody<String>>>,
    S::Error: std::fmt::Debug,
{
    let peer = PeerAddr(SocketAddr::from(([192, 0, 2, 1], 40000)));
    let requests: Vec<_> = users
        .iter()
        .map(|user| {
            let mut req = Request::builder()
                .uri("/api")
                .header(USER, user.clone())
                .body(())
                .unwrap();
            req.extensions_mut().insert(peer);
            req
        })
        .collect();
    let before = blocks();
    for req in requests {
        let response = now(service.call(req)).unwrap();
        assert_eq!(response.status(), status);
    }
    #[allow(clippy::cast_precision_loss)]
    let per = (blocks() - before) as f64 / users.len() as f64;
    per
}

// One test: dhat counts for the whole process, so nothing else may run beside it.
#[test]
fn a_denied_request_allocates_little() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let policies = PolicySet::from_toml_str(
        r#"
        [[policy]]
        name = "api"
        tiers = [{ name = "burst", algorithm = "token_bucket", limit = 1, per = "1h", burst = 1 }]
        "#,
    )
    .unwrap();
    let limiter = Arc::new(Limiter::new(Arc::new(MemoryStore::new()), policies));
    let layer = RateLimitLayer::builder(limiter, "api")
        .key(KeyExtractor::header(USER))
        .build();
    let mut service = layer.layer(tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let users: Vec<_> = (0..ROUNDS)
        .map(|n| HeaderValue::try_from(format!("u{n}")).unwrap())
        .collect();
    // Warm the store's tables for these keys, then count.
    let _ = per_request(&mut service, &users, StatusCode::OK);
    let denied = per_request(&mut service, &users, StatusCode::TOO_MANY_REQUESTS);
    println!("allocations per denied request: {denied}");
    // The one buffer of `Retry-After`, `RateLimit`, `RateLimit-Policy` and the problem
    // document (text and shared bytes), and the header map (indices and entries).
    assert!(denied <= 4.0, "{denied} allocations per denied request");

    // Two limits, one batch (`RateLimitLayerBuilder::and`): per client IP, then per user.
    let policies = PolicySet::from_toml_str(
        r#"
        [[policy]]
        name = "api"
        tiers = [{ name = "burst", algorithm = "token_bucket", limit = 1, per = "1h", burst = 1 }]

        [[policy]]
        name = "api-ip"
        tiers = [{ name = "client", algorithm = "token_bucket", limit = 1000000, per = "1s" }]
        "#,
    )
    .unwrap();
    let limiter = Arc::new(Limiter::new(Arc::new(MemoryStore::new()), policies));
    let layer = RateLimitLayer::builder(limiter, "api-ip")
        .and("api", KeyExtractor::header(USER))
        .build();
    let mut service = layer.layer(tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let admitted = per_request(&mut service, &users, StatusCode::OK);
    let denied = per_request(&mut service, &users, StatusCode::TOO_MANY_REQUESTS);
    println!("two limits: allocations per admitted request {admitted}, per denied {denied}");
    // Decided at once (`Limiter::check_all_now`): no boxed future, no list; what an admitted
    // request allocates is the store's tables growing for new keys, a denied one only its
    // answer (as with one limit).
    assert!(
        admitted <= 1.0,
        "{admitted} allocations per admitted request"
    );
    assert!(denied <= 4.0, "{denied} allocations per denied request");
}
