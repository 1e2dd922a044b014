//! The HTTP side: routes, the rate-limit layer, the shutdown signal.

use std::sync::Arc;

use crate::{POLICY, USER_HEADER};
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

/// The layer limiting `/api/data`: policy [`POLICY`], keyed by `X-User-ID`, else by the client
/// IP (through `trusted` proxies only); denials carry `Retry-After` and the `RateLimit` headers.
///
/// No time limit on the check: the memory store never waits, and the Redis store is wrapped in a
/// hybrid store whose own budget (`--redis-budget-ms`) hands slow calls to the local fallback.
pub fn rate_limit_layer(limiter: Arc<Limiter>, trusted: TrustedProxies) -> RateLimitLayer {
    RateLimitLayer::builder(limiter, POLICY)
        .key(KeyExtractor::header(USER_HEADER))
        .client_ip(ClientIpResolver::new(trusted))
        .headers(RateLimitHeaders::Denied)
        .timeout(None)
        .build()
}

/// The routes: `GET /api/data` behind `layer` (none: unlimited, for comparisons), and the
/// unlimited `GET /metrics` and `GET /healthz`.
pub fn router(layer: Option<RateLimitLayer>, metrics: Metrics) -> Router {
    let api = Router::new().route("/api/data", get(data));
    let api = match layer {
        Some(layer) => api.layer(layer),
        None => api,
    };
    let ops = Router::new()
        .route("/metrics", get(exposition))
        .route("/healthz", get(healthz))
        .with_state(metrics);
    api.merge(ops)
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

/// Completes at Ctrl-C or SIGTERM. A signal that cannot be listened to is never awaited.
pub async fn shutdown_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
