//! `GET /api/generate`: a slow route held to `--max-in-flight` requests in flight per user
//! (the concurrency limit, [`InFlightLayer`]), across every instance sharing the store.
//!
//! The handler here is a placeholder: it waits `?delay_ms=` (at most
//! [`MAX_GENERATE_DELAY_MS`]) and answers `{"message":"generated"}` with the times it entered
//! and left, in microseconds since the Unix epoch, in `x-handler-entered-us` and
//! `x-handler-left-us`, so a client of several instances on one host can count how many
//! requests were inside the handler at once.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::http::Uri;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use distlimit_core::{Error, Observer, PermitLimit, PermitStore};
use distlimit_tower::{ClientIpResolver, InFlightLayer, KeyExtractor, TrustedProxies};

use crate::USER_HEADER;

/// The state name of the concurrency limit of `/api/generate`.
pub const GENERATE_POLICY: &str = "generate";

/// The longest `?delay_ms=` the placeholder handler waits.
pub const MAX_GENERATE_DELAY_MS: u64 = 10_000;

/// The concurrency limit of `/api/generate`: at most `max_in_flight` requests per user
/// (`X-User-ID`, else the client IP) in flight, each permit leased for `lease`; one more is
/// answered `429` with `Retry-After: 1`. Permit events go to `observer`
/// (`distlimit_permits_total`, `distlimit_permits_held` on `/metrics`). A store failure answers `503` (fail closed; with
/// Redis, the hybrid's failure mode answers first).
///
/// # Errors
///
/// An invalid limit ([`Error::InvalidPermit`]): `max_in_flight` 0 or above 65 536, a lease
/// under 1 ms or over a day.
pub fn generate_limit(
    permits: Arc<dyn PermitStore>,
    max_in_flight: u32,
    lease: Duration,
    trusted: TrustedProxies,
    observer: Arc<dyn Observer>,
) -> Result<InFlightLayer, Error> {
    let limit = PermitLimit::new(max_in_flight, lease)?;
    Ok(
        InFlightLayer::builder(Arc::new(permits), GENERATE_POLICY, limit)?
            .key(KeyExtractor::header(USER_HEADER))
            .client_ip(ClientIpResolver::new(trusted))
            .timeout(None)
            .observer(observer)
            .build(),
    )
}

/// The `/api/generate` route behind `limit`.
pub fn generate_routes(limit: InFlightLayer) -> Router {
    Router::new().route("/api/generate", get(generate).route_layer(limit))
}

/// `delay_ms` of the query, when it is a number.
fn delay_ms(uri: &Uri) -> u64 {
    uri.query()
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("delay_ms=")?.parse().ok())
        .unwrap_or(0)
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

async fn generate(uri: Uri) -> impl IntoResponse {
    let entered = now_us();
    let ms = delay_ms(&uri).min(MAX_GENERATE_DELAY_MS);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    let left = now_us();
    (
        [
            (CONTENT_TYPE, "application/json".to_owned()),
            (
                axum::http::HeaderName::from_static("x-handler-entered-us"),
                entered.to_string(),
            ),
            (
                axum::http::HeaderName::from_static("x-handler-left-us"),
                left.to_string(),
            ),
        ],
        r#"{"message":"generated"}"#,
    )
}
