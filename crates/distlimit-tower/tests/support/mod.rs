//! Shared helpers: a limiter on a frozen clock, an axum app served over loopback TCP, and a
//! hyper client.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use bytes::Bytes;
use distlimit_core::{ManualClock, Store};
use distlimit_memory::MemoryStore;
use distlimit_policy::{Limiter, PolicySet};
use distlimit_tower::RateLimitLayer;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Every test's network wait is bounded by this (a liveness guard, not a performance check).
pub const GUARD: Duration = Duration::from_secs(20);

/// 2 per 600 ms (a unit every 300 ms) for `api`; 1 per minute for `login`; 3 an hour for
/// `ip` and 2 an hour for `user` (fixed windows: on the frozen clock, 46 minutes into the
/// hour, they never refill).
pub const POLICIES: &str = r#"
[[policy]]
name = "api"
tiers = [{ name = "second", algorithm = "token_bucket", limit = 2, per = "600ms" }]

[[policy]]
name = "login"
tiers = [{ name = "minute", algorithm = "fixed_window", limit = 1, per = "1m" }]

[[policy]]
name = "ip"
tiers = [{ name = "hour", algorithm = "fixed_window", limit = 3, per = "1h" }]

[[policy]]
name = "user"
tiers = [{ name = "hour", algorithm = "fixed_window", limit = 2, per = "1h" }]
"#;

/// A memory store on a frozen clock, so every header value is exact.
pub fn frozen_store() -> MemoryStore<ManualClock> {
    // A whole minute, so fixed windows start at a known point.
    MemoryStore::builder()
        .clock(ManualClock::new(1_700_000_040_000_000))
        .build()
}

pub fn limiter<S: Store>(store: S) -> Arc<Limiter<S>> {
    let policies = PolicySet::from_toml_str(POLICIES).unwrap();
    Arc::new(Limiter::new(Arc::new(store), policies))
}

/// An app with `GET /api/data`, `POST /login`, `GET /health`, behind `layer`, served on a free
/// loopback port with the peer address recorded.
pub async fn serve(layer: RateLimitLayer) -> SocketAddr {
    serve_router(app().layer(layer), true).await
}

pub fn app() -> Router {
    Router::new()
        .route("/api/data", get(|| async { "data" }))
        .route("/login", post(|| async { "welcome" }))
        .route("/health", get(|| async { "ok" }))
}

pub async fn serve_router(router: Router, connect_info: bool) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        if connect_info {
            let app = router.into_make_service_with_connect_info::<SocketAddr>();
            axum::serve(listener, app).await.unwrap();
        } else {
            axum::serve(listener, router).await.unwrap();
        }
    });
    addr
}

/// A response as the client saw it.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

/// Sends one request over a fresh HTTP/1.1 connection.
pub async fn send(addr: SocketAddr, method: Method, path: &str, headers: &[(&str, &str)]) -> Reply {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::new(Bytes::new())).unwrap();
    let exchange = async {
        let res = client.request(req).await.unwrap();
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    };
    tokio::time::timeout(GUARD, exchange)
        .await
        .expect("the server answered")
}

pub async fn get_path(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    send(addr, Method::GET, path, headers).await
}
