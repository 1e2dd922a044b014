//! The concurrency limit of `GET /api/generate`: at most `--max-in-flight` requests in flight
//! per user ([`InFlightLayer`]), across every instance sharing the store. The route and its
//! handler are in `app.rs`.

use std::sync::Arc;
use std::time::Duration;

use distlimit_core::{Error, Observer, PermitLimit, PermitStore};
use distlimit_tower::{ClientIpResolver, InFlightLayer, KeyExtractor, TrustedProxies};

use crate::USER_HEADER;

/// The state name of the concurrency limit of `/api/generate`.
pub const GENERATE_POLICY: &str = "generate";

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
