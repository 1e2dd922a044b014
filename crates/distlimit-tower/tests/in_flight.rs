//! `InFlightLayer`: at most N requests in flight per key, permits given back when the response
//! body ends or is dropped (cancellation included), renewed while a request runs, a bounded
//! queue with a deadline, and the failure conventions of the rate-limit layer. On the memory
//! store and the real clock; every wait is bounded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use distlimit_core::{Error, PermitDecision, PermitId, PermitLimit, PermitRequest, PermitStore};
use distlimit_memory::MemoryStore;
use distlimit_tower::{InFlightLayer, KeyExtractor, OnError, OnFull, PeerAddr};
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Service, ServiceExt, service_fn};
use tower_layer::Layer;

const USER: HeaderName = HeaderName::from_static("x-user-id");

/// The handler's own count of requests inside it, and the most it saw at once.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    peak: AtomicUsize,
}

/// A handler that sleeps `?ms=` (default 0) and counts itself in `gauge`.
fn handler(
    gauge: Arc<Gauge>,
) -> impl Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ 'static {
    service_fn(move |req: Request<()>| {
        let gauge = Arc::clone(&gauge);
        async move {
            let ms: u64 = req
                .uri()
                .query()
                .and_then(|q| q.strip_prefix("ms="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let inside = gauge.now.fetch_add(1, Ordering::SeqCst) + 1;
            gauge.peak.fetch_max(inside, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(ms.min(10_000))).await;
            gauge.now.fetch_sub(1, Ordering::SeqCst);
            Ok(Response::new(Full::new(Bytes::from_static(b"done"))))
        }
    })
}

fn request(user: &str, ms: u64) -> Request<()> {
    let mut req = Request::get(format!("/generate?ms={ms}"))
        .header(USER, user)
        .body(())
        .unwrap();
    req.extensions_mut()
        .insert(PeerAddr(SocketAddr::from(([203, 0, 113, 7], 4000))));
    req
}

fn layer(max: u32, lease_ms: u64, on_full: OnFull) -> InFlightLayer {
    let limit = PermitLimit::new(max, Duration::from_millis(lease_ms)).unwrap();
    InFlightLayer::builder(Arc::new(MemoryStore::new()), "generate", limit)
        .unwrap()
        .key(KeyExtractor::header(USER))
        .on_full(on_full)
        .build()
}

/// Sends `req` and reads the whole body: (status, Retry-After).
async fn send<S>(service: S, req: Request<()>) -> (StatusCode, Option<String>)
where
    S: Service<Request<()>, Response = Response<distlimit_tower::InFlightBody<Full<Bytes>>>>,
    S::Error: std::fmt::Debug,
{
    let response = service.oneshot(req).await.unwrap();
    let status = response.status();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    response.into_body().collect().await.unwrap();
    (status, retry)
}

/// N + k concurrent slow requests of one key: the handler never sees more than N at once,
/// exactly N are served, the k others are answered 429 with `Retry-After: 1`; then the key is
/// free again (every permit given back when its body ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_never_sees_more_than_max() {
    let gauge = Arc::new(Gauge::default());
    let service = layer(3, 10_000, OnFull::Reject).layer(handler(Arc::clone(&gauge)));
    let tasks: Vec<_> = (0..10)
        .map(|_| tokio::spawn(send(service.clone(), request("alice", 300))))
        .collect();
    let mut served = 0;
    for task in tasks {
        match task.await.unwrap() {
            (StatusCode::OK, _) => served += 1,
            (StatusCode::TOO_MANY_REQUESTS, retry) => assert_eq!(retry.as_deref(), Some("1")),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(served, 3);
    assert_eq!(gauge.peak.load(Ordering::SeqCst), 3);
    // Another user has their own permits; alice's are all back.
    assert_eq!(
        send(service.clone(), request("bob", 0)).await.0,
        StatusCode::OK
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    for _ in 0..3 {
        assert_eq!(
            send(service.clone(), request("alice", 0)).await.0,
            StatusCode::OK
        );
    }
}

/// Polls until `req` is served, for at most a second.
async fn served_within_a_second<S>(service: &S, user: &str) -> bool
where
    S: Service<Request<()>, Response = Response<distlimit_tower::InFlightBody<Full<Bytes>>>>
        + Clone,
    S::Error: std::fmt::Debug,
{
    for _ in 0..100 {
        if send(service.clone(), request(user, 0)).await.0 == StatusCode::OK {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// A request cancelled inside the handler (its future dropped, as when the client goes away)
/// gives its permit back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_request_gives_its_permit_back() {
    let gauge = Arc::new(Gauge::default());
    let service = layer(1, 60_000, OnFull::Reject).layer(handler(Arc::clone(&gauge)));
    let slow = service.clone().oneshot(request("alice", 10_000));
    assert!(
        tokio::time::timeout(Duration::from_millis(100), slow)
            .await
            .is_err()
    );
    assert!(served_within_a_second(&service, "alice").await);
}

/// A response whose body is dropped unread gives its permit back; until then it holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_body_gives_its_permit_back() {
    let gauge = Arc::new(Gauge::default());
    let service = layer(1, 60_000, OnFull::Reject).layer(handler(Arc::clone(&gauge)));
    let response = service.clone().oneshot(request("alice", 0)).await.unwrap();
    assert!(response.body().holds_permit());
    assert_eq!(
        send(service.clone(), request("alice", 0)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    drop(response);
    assert!(served_within_a_second(&service, "alice").await);
}

/// A request longer than the lease keeps its permit: it is renewed while the request runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_request_keeps_its_permit() {
    let gauge = Arc::new(Gauge::default());
    let service = layer(1, 150, OnFull::Reject).layer(handler(Arc::clone(&gauge)));
    let long = tokio::spawn(send(service.clone(), request("alice", 600)));
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            send(service.clone(), request("alice", 0)).await.0,
            StatusCode::TOO_MANY_REQUESTS,
            "a renewed permit must still be held past its first lease"
        );
    }
    assert_eq!(long.await.unwrap().0, StatusCode::OK);
    assert_eq!(gauge.peak.load(Ordering::SeqCst), 1);
}

/// Queued requests wait for a permit (and get it when one is given back), up to their
/// deadline; past `max_waiting` they are answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_waits_up_to_its_deadline() {
    let gauge = Arc::new(Gauge::default());
    let queue = OnFull::Queue {
        max_waiting: 1,
        deadline: Duration::from_secs(2),
    };
    let service = layer(1, 60_000, queue).layer(handler(Arc::clone(&gauge)));
    let first = tokio::spawn(send(service.clone(), request("alice", 200)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let queued = tokio::spawn(send(service.clone(), request("alice", 0)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The queue holds one: a third is answered at once.
    assert_eq!(
        send(service.clone(), request("alice", 0)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(first.await.unwrap().0, StatusCode::OK);
    assert_eq!(queued.await.unwrap().0, StatusCode::OK);
    assert_eq!(gauge.peak.load(Ordering::SeqCst), 1);

    let short = OnFull::Queue {
        max_waiting: 10,
        deadline: Duration::from_millis(100),
    };
    let service = layer(1, 60_000, short).layer(handler(Arc::clone(&gauge)));
    let slow = tokio::spawn(send(service.clone(), request("alice", 500)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    assert_eq!(
        send(service.clone(), request("alice", 0)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_eq!(slow.await.unwrap().0, StatusCode::OK);
}

/// A store that always fails.
struct Down;

#[async_trait]
impl PermitStore for Down {
    async fn acquire(&self, _: &PermitRequest<'_>) -> Result<PermitDecision, Error> {
        Err(Error::Unavailable {
            store: "down",
            source: "refused".into(),
        })
    }
    async fn release(&self, _: &PermitRequest<'_>, _: PermitId) -> Result<bool, Error> {
        Ok(false)
    }
    async fn renew(&self, _: &PermitRequest<'_>, _: PermitId) -> Result<bool, Error> {
        Ok(false)
    }
}

/// A store error fails closed (503 with `Retry-After`) by default, or lets the request through.
#[tokio::test]
async fn a_store_error_follows_on_error() {
    let limit = PermitLimit::new(1, Duration::from_secs(1)).unwrap();
    let gauge = Arc::new(Gauge::default());
    let closed = InFlightLayer::builder(Arc::new(Down), "p", limit)
        .unwrap()
        .build()
        .layer(handler(Arc::clone(&gauge)));
    assert_eq!(
        send(closed, request("alice", 0)).await,
        (StatusCode::SERVICE_UNAVAILABLE, Some("1".to_owned()))
    );
    let open = InFlightLayer::builder(Arc::new(Down), "p", limit)
        .unwrap()
        .on_error(OnError::FailOpen)
        .build()
        .layer(handler(Arc::clone(&gauge)));
    assert_eq!(send(open, request("alice", 0)).await.0, StatusCode::OK);
}
