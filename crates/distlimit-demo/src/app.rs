//! The HTTP side: routes, the rate-limit layer, the shutdown signal.

use std::sync::Arc;

use crate::{IP_POLICY, POLICY, USER_HEADER};
use axum::Router;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use distlimit_metrics::Metrics;
use distlimit_policy::Limiter;
use distlimit_tower::{
    ClientIpResolver, KeyExtractor, RateLimitHeaders, RateLimitLayer, TrustedProxies,
};

/// The body of `GET /api/data`.
pub const DATA_BODY: &str = r#"{"message":"Success"}"#;

/// The two limits on `/api/data`, one layer deciding both per request as one all-or-nothing
/// batch: the client IP's and the user's.
#[derive(Clone, Debug)]
pub struct ApiLimits {
    /// Policy [`IP_POLICY`], keyed by the client IP (one client cannot escape its limit by
    /// sending a new `X-User-ID` with every request), and policy [`POLICY`], keyed by
    /// `X-User-ID`, else by the client IP. A request denied by either is charged by neither,
    /// so a user over their own limit spends nothing of the address they share with others.
    pub layer: RateLimitLayer,
}

/// The layer limiting `/api/data` ([`ApiLimits`]); the client IP is the socket peer, or what
/// `trusted` proxies forward. Denials carry `Retry-After` and the `RateLimit` headers of the
/// limit that denied.
///
/// No time limit on the checks: the memory store never waits, and the Redis store is wrapped in
/// a hybrid store whose own budget (`--redis-budget-ms`) hands slow calls to the local fallback.
pub fn api_limits(limiter: Arc<Limiter>, trusted: TrustedProxies) -> ApiLimits {
    let layer = RateLimitLayer::builder(limiter, IP_POLICY)
        .key(KeyExtractor::client_ip())
        .and(POLICY, KeyExtractor::header(USER_HEADER))
        .client_ip(ClientIpResolver::new(trusted))
        .headers(RateLimitHeaders::Denied)
        .timeout(None)
        .build();
    ApiLimits { layer }
}

/// The routes: `GET /api/data` behind `limits` (none: unlimited, for comparisons), and the
/// unlimited `GET /metrics` and `GET /healthz`.
///
/// The limits wrap the route's `GET` handler only (`route_layer`): a request no handler serves
/// (another path, 404, or another method, 405) spends nothing.
pub fn router(limits: Option<ApiLimits>, metrics: Metrics) -> Router {
    let data = match limits {
        Some(limits) => get(data).route_layer(limits.layer),
        None => get(data),
    };
    let ops = Router::new()
        .route("/metrics", get(exposition))
        .route("/healthz", get(healthz))
        .with_state(metrics);
    Router::new().route("/api/data", data).merge(ops)
}

async fn data() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], DATA_BODY)
}

async fn exposition(State(metrics): State<Metrics>) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, distlimit_metrics::CONTENT_TYPE)],
        metrics.encode(),
    )
}

async fn healthz() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], r#"{"status":"ok"}"#)
}
