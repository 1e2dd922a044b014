//! Concurrency limits over JSON: `POST /v1/permits/acquire`, `/v1/permits/release` and
//! `/v1/permits/renew`, on the server's store (the memory store, or the hybrid of Redis and
//! memory), for callers in any language.
//!
//! Each call names the limit itself: `name` (the state, at most 128 bytes), `key` (1 to 1024
//! bytes), `max_in_flight` (1 to 65 536) and `lease_ms` (1 to 86 400 000); release and renew
//! add the `permit` acquire answered. The caller releases when its request ends and renews
//! every third of the lease while it runs; a caller that crashes loses its permits after the
//! lease.
//!
//! Envoy's rate limit service (RLS v3) cannot express this: it has one call, before the
//! request, and nothing when the request ends, so it can count requests (a rate) but never give
//! a permit back. A concurrency limit needs the application (or a filter with a call at the end
//! of the stream) to call release.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::Response;
use distlimit_core::{Error, Key, PermitId, PermitLimit, PermitRequest};
use serde::{Deserialize, Serialize};

use crate::http::{HttpState, error, json};

/// The body of every permit call.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonPermit {
    /// The concurrency limit's name (its state).
    pub name: String,
    /// The key held to the limit.
    pub key: String,
    /// The most permits the key holds at once.
    pub max_in_flight: u32,
    /// How long a permit lives without a renew, in milliseconds.
    pub lease_ms: u64,
    /// The permit to release or renew (absent for an acquire).
    #[serde(default)]
    pub permit: Option<u64>,
}

/// The answer of `POST /v1/permits/acquire`: 200 with `acquired: true`, or 429.
#[derive(Debug, Serialize)]
pub struct JsonAcquired {
    /// Whether a permit was taken.
    pub acquired: bool,
    /// The permit, to release (absent when refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permit: Option<u64>,
    /// The key's live permits after the call.
    pub in_flight: u32,
    /// The limit.
    pub max_in_flight: u32,
    /// When refused: milliseconds until the earliest permit expires (one is released sooner
    /// when its request ends), rounded up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// The answer of release and renew: whether the permit was live.
#[derive(Debug, Serialize)]
pub struct JsonHeld {
    /// `true`: released (or renewed); `false`: it had expired or was never taken.
    pub held: bool,
}

fn parts(body: &JsonPermit) -> Result<(PermitLimit, Key<'_>), Error> {
    let limit = PermitLimit::new(body.max_in_flight, Duration::from_millis(body.lease_ms))?;
    Ok((limit, Key::new(&body.key)?))
}

fn refused(error: &Error) -> Response {
    if error.is_invalid_input() {
        error_response(StatusCode::BAD_REQUEST, error)
    } else {
        error_response(StatusCode::SERVICE_UNAVAILABLE, error)
    }
}

fn error_response(status: StatusCode, cause: &Error) -> Response {
    error(status, &cause.to_string())
}

/// The server's permit store, named in its `Debug` output only.
#[derive(Clone)]
pub(crate) struct Shared(pub(crate) std::sync::Arc<dyn distlimit_core::PermitStore>);

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PermitStore")
    }
}

type Body = Result<Json<JsonPermit>, JsonRejection>;

pub(crate) async fn acquire(State(state): State<HttpState>, body: Body) -> Response {
    let body = match body {
        Ok(Json(body)) => body,
        Err(rejection) => return error(rejection.status(), &rejection.body_text()),
    };
    let (limit, key) = match parts(&body) {
        Ok(parts) => parts,
        Err(e) => return refused(&e),
    };
    let request = match PermitRequest::new(key, limit).with_policy(&body.name) {
        Ok(r) => r,
        Err(e) => return refused(&e.into()),
    };
    let decided = tokio::time::timeout(state.timeout, state.permits.acquire(&request)).await;
    let decision = match decided {
        Err(_) => return error(StatusCode::SERVICE_UNAVAILABLE, "no decision in time"),
        Ok(Err(e)) => return refused(&e),
        Ok(Ok(d)) => d,
    };
    let answer = JsonAcquired {
        acquired: decision.is_allowed(),
        permit: decision.permit().map(PermitId::get),
        in_flight: decision.in_flight(),
        max_in_flight: decision.max_in_flight(),
        retry_after_ms: decision.is_denied().then(|| {
            u64::try_from(decision.retry_after().as_micros().div_ceil(1000)).unwrap_or(u64::MAX)
        }),
    };
    let status = if decision.is_allowed() {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    json(status, serde_json::to_string(&answer).unwrap_or_default())
}

async fn give_back(state: HttpState, body: Body, renew: bool) -> Response {
    let body = match body {
        Ok(Json(body)) => body,
        Err(rejection) => return error(rejection.status(), &rejection.body_text()),
    };
    let (limit, key) = match parts(&body) {
        Ok(parts) => parts,
        Err(e) => return refused(&e),
    };
    let permit = match body.permit.map(PermitId::new) {
        Some(Ok(permit)) => permit,
        Some(Err(e)) => return refused(&e.into()),
        None => return error(StatusCode::BAD_REQUEST, "missing field `permit`"),
    };
    let request = match PermitRequest::new(key, limit).with_policy(&body.name) {
        Ok(r) => r,
        Err(e) => return refused(&e.into()),
    };
    let call = async {
        if renew {
            state.permits.renew(&request, permit).await
        } else {
            state.permits.release(&request, permit).await
        }
    };
    match tokio::time::timeout(state.timeout, call).await {
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "no answer in time"),
        Ok(Err(e)) => refused(&e),
        Ok(Ok(held)) => json(
            StatusCode::OK,
            serde_json::to_string(&JsonHeld { held }).unwrap_or_default(),
        ),
    }
}

pub(crate) async fn release(State(state): State<HttpState>, body: Body) -> Response {
    give_back(state, body, false).await
}

pub(crate) async fn renew(State(state): State<HttpState>, body: Body) -> Response {
    give_back(state, body, true).await
}
