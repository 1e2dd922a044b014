//! A tower layer that rate-limits HTTP (axum, hyper) and gRPC (tonic) services with distlimit,
//! with client IPs taken only through trusted proxies.
//!
//! [`RateLimitLayer`] checks each request against a `distlimit_policy::Limiter` before the
//! inner service runs:
//!
//! * **Keys** ([`KeyExtractor`]): the client IP (IPv6 grouped by /64), a header such as
//!   `X-User-ID` falling back to the IP, or a closure.
//! * **Client IP** ([`ClientIpResolver`]): the socket peer, unless it is a trusted proxy
//!   ([`TrustedProxies`], empty by default); then `X-Forwarded-For` (or RFC 7239 `Forwarded`)
//!   walked from the right, skipping trusted hops; garbage falls back to the peer.
//! * **Policy per route or method** ([`PolicySelector`], [`RouteTable`]), and a **cost per
//!   request** from its head ([`RateLimitLayerBuilder::cost`]; one unit by default).
//! * **Denials**: HTTP 429 with an `application/problem+json` body, `Retry-After` in whole
//!   seconds rounded up, and the IETF `RateLimit` / `RateLimit-Policy` fields ([`headers`]);
//!   gRPC `RESOURCE_EXHAUSTED` with `retry-after` and `grpc-retry-pushback-ms` metadata.
//! * **Store failures** ([`OnError`]): 503 (gRPC `UNAVAILABLE`) or fail open, within a
//!   timeout, so a request never hangs on the store.
//!
//! # Example
//!
//! ```
//! use std::net::SocketAddr;
//! use std::sync::Arc;
//!
//! use distlimit_memory::MemoryStore;
//! use distlimit_policy::{Limiter, PolicySet};
//! use distlimit_tower::{KeyExtractor, PeerAddr, RateLimitLayer};
//! use http::{Request, Response, StatusCode};
//! use tower::{Layer, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policies = PolicySet::from_toml_str(
//!     r#"
//!     [[policy]]
//!     name = "api"
//!     tiers = [{ name = "second", algorithm = "token_bucket", limit = 1, per = "1s" }]
//!     "#,
//! )?;
//! let limiter = Arc::new(Limiter::new(Arc::new(MemoryStore::new()), policies));
//! let layer = RateLimitLayer::builder(limiter, "api")
//!     .key(KeyExtractor::header(http::HeaderName::from_static("x-user-id")))
//!     .build();
//! let service = layer.layer(service_fn(|_req: Request<String>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(String::from("hello")))
//! }));
//!
//! let request = || {
//!     let mut req = Request::new(String::new());
//!     req.headers_mut().insert("x-user-id", "alice".parse().unwrap());
//!     // Served by axum or tonic, the peer address comes from their connection info.
//!     let peer: SocketAddr = "192.0.2.1:4711".parse().unwrap();
//!     req.extensions_mut().insert(PeerAddr(peer));
//!     req
//! };
//! let ok = service.clone().oneshot(request()).await?;
//! assert_eq!(ok.status(), StatusCode::OK);
//! let denied = service.oneshot(request()).await?;
//! assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(denied.headers()["retry-after"], "1");
//! assert_eq!(denied.headers()["ratelimit"], r#""api/second";r=0;t=1"#);
//! assert_eq!(denied.headers()["content-type"], "application/problem+json");
//! # Ok(()) }
//! ```
//!
//! # Feature flags
//!
//! | feature | what it adds |
//! |---|---|
//! | `axum` | reads the peer address from axum's `ConnectInfo<SocketAddr>` |
//! | `tonic` | reads the peer address from tonic's `TcpConnectInfo` |
//!
//! Without them, insert a [`PeerAddr`] extension (plain hyper: in the per-connection service).

mod body;
mod client_ip;
mod future;
pub mod headers;
mod key;
mod layer;
mod policy;
mod request;
pub mod response;

pub use body::RateLimitBody;
pub use client_ip::{
    Cidr, CidrError, ClientIp, ClientIpResolver, ForwardedHeader, IpKey, TrustedProxies,
};
pub use distlimit_core::{Quota, QuotaError};
pub use future::ResponseFuture;
pub use headers::RateLimitHeaders;
pub use ipnet::IpNet;
pub use key::{DEFAULT_MAX_HEADER_KEY_LEN, KeyExtractor};
pub use layer::{DEFAULT_TIMEOUT, OnError, RateLimit, RateLimitLayer, RateLimitLayerBuilder};
pub use policy::{PolicySelector, RouteTable};
pub use request::{PeerAddr, RequestInfo};
