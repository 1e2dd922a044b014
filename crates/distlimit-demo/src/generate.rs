//! The concurrency limit of `GET /api/generate`: at most N requests in flight per user
//! ([`InFlightLayer`]), across every instance sharing the store; N is policy
//! [`GENERATE_POLICY`]'s `max_in_flight` when the policy file defines it, else
//! `--max-in-flight` ([`generate_in_flight`]). The route and its handler are in `app.rs`.

use std::sync::Arc;

use distlimit_core::{Error, Observer, PermitLimit, PermitStore};
use distlimit_policy::{PolicyConfigError, PolicySet};
use distlimit_tower::{ClientIpResolver, InFlightLayer, KeyExtractor, TrustedProxies};

use crate::USER_HEADER;

/// The state name of the concurrency limit of `/api/generate`, and the policy of a `--policy`
/// file that sets it (`max_in_flight`, `in_flight_lease`).
pub const GENERATE_POLICY: &str = "generate";

/// The concurrency limit of `/api/generate` with `policies`: policy [`GENERATE_POLICY`]'s
/// (`max_in_flight`, `in_flight_lease`) when `policies` defines it, else `flags` (the
/// `--max-in-flight` and `--in-flight-lease-ms` limit).
///
/// The policy file wins over the flags: it is the one configuration every instance of a fleet
/// reads (and the flags always have a value, their defaults included, so they cannot say
/// whether they were meant). Only the policy's concurrency limit is read: its tiers limit
/// nothing on `/api/generate` (the tokens are policy [`TOKENS_POLICY`](crate::TOKENS_POLICY)'s).
///
/// # Errors
///
/// A policy [`GENERATE_POLICY`] without `max_in_flight` (a
/// [`Field::MaxInFlight`](distlimit_policy::Field::MaxInFlight) error naming it): a policy
/// defined for the route that would limit nothing is refused, not ignored.
pub fn generate_in_flight(
    policies: &PolicySet,
    flags: PermitLimit,
) -> Result<PermitLimit, PolicyConfigError> {
    match policies.get(GENERATE_POLICY) {
        Some(_) => policies.in_flight(GENERATE_POLICY),
        None => Ok(flags),
    }
}

/// The concurrency limit of `/api/generate`: at most `limit.max_in_flight()` requests per user
/// (`X-User-ID`, else the client IP) in flight, each permit leased for `limit.lease()`; one more is
/// answered `429` with `Retry-After: 1`. Permit events go to `observer`
/// (`distlimit_permits_total`, `distlimit_permits_held` on `/metrics`). A store failure answers `503` (fail closed; with
/// Redis, the hybrid's failure mode answers first).
///
/// The limit is fixed when the layer is built: a reload of the policy file that changes
/// [`GENERATE_POLICY`]'s limit is applied to the rate limits but not to this one (the demo logs
/// a warning saying so; restart to change it).
///
/// # Errors
///
/// None today ([`GENERATE_POLICY`] is a valid state name); the `Result` is the layer
/// builder's.
pub fn generate_limit(
    permits: Arc<dyn PermitStore>,
    limit: PermitLimit,
    trusted: TrustedProxies,
    observer: Arc<dyn Observer>,
) -> Result<InFlightLayer, Error> {
    Ok(
        InFlightLayer::builder(Arc::new(permits), GENERATE_POLICY, limit)?
            .key(KeyExtractor::header(USER_HEADER))
            .client_ip(ClientIpResolver::new(trusted))
            .timeout(None)
            .observer(observer)
            .build(),
    )
}
