//! Concurrency limits over JSON: `POST /v1/permits/acquire`, `/v1/permits/release` and
//! `/v1/permits/renew` on the server's store, each call naming its limit itself or by a TOML
//! policy (the crate documentation, "Concurrency limits", describes the calls and answers).

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use distlimit_core::{Error, Key, PermitId, PermitLimit, PermitRequest};
use serde::{Deserialize, Serialize};

use crate::http::{HttpState, error, json};

/// The body of every permit call: `policy`, or `name`, `max_in_flight` and `lease_ms`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonPermit {
    /// The TOML policy whose concurrency limit this is (its name is the state).
    pub policy: Option<String>,
    /// The concurrency limit's name (its state), without `policy`.
    pub name: Option<String>,
    /// The key held to the limit.
    pub key: String,
    /// The most permits the key holds at once, without `policy`.
    pub max_in_flight: Option<u32>,
    /// How long a permit lives without a renew, in milliseconds, without `policy`.
    pub lease_ms: Option<u64>,
    /// The permit to release or renew (absent for an acquire).
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

/// Why a call is not answered as asked: the status and the message of its JSON error answer.
pub(crate) struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        error(self.0, &self.1)
    }
}

/// A 400 saying `why`.
fn bad(why: impl ToString) -> Refusal {
    Refusal(StatusCode::BAD_REQUEST, why.to_string())
}

/// The request a call's body names (the limit's state and limit, and its key), or why not.
fn permit_request<'b>(
    state: &HttpState,
    body: &'b JsonPermit,
) -> Result<PermitRequest<'b>, Refusal> {
    let (name, limit) = match (&body.policy, &body.name, body.max_in_flight, body.lease_ms) {
        (Some(policy), None, None, None) => {
            let config = state.checker.config();
            let limit = match config.policies() {
                Some(set) => set.in_flight(policy),
                None => distlimit_policy::PolicySet::default().in_flight(policy),
            };
            (policy.as_str(), limit.map_err(bad)?)
        }
        (Some(_), _, _, _) => {
            return Err(bad(
                "`policy` names the limit: give it without `name`, `max_in_flight` and `lease_ms`",
            ));
        }
        (None, Some(name), Some(max), Some(lease_ms)) => {
            let limit = PermitLimit::new(max, Duration::from_millis(lease_ms)).map_err(bad)?;
            (name.as_str(), limit)
        }
        (None, name, max, lease) => {
            let missing = [
                (name.is_none(), "name"),
                (max.is_none(), "max_in_flight"),
                (lease.is_none(), "lease_ms"),
            ]
            .into_iter()
            .filter_map(|(missing, field)| missing.then_some(field))
            .collect::<Vec<_>>()
            .join("`, `");
            return Err(bad(format!("missing `{missing}` (or give `policy`)")));
        }
    };
    let key = Key::new(&body.key).map_err(bad)?;
    PermitRequest::new(key, limit)
        .with_policy(name)
        .map_err(|e| refusal(&e.into()))
}

/// The JSON body of a call, or why not (400, 415, 422).
fn json_body(body: Body) -> Result<JsonPermit, Refusal> {
    body.map(|Json(body)| body)
        .map_err(|rejection| Refusal(rejection.status(), rejection.body_text()))
}

/// An error of the store: 400 for the caller's input, else 503.
fn refusal(error: &Error) -> Refusal {
    let status = if error.is_invalid_input() {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    Refusal(status, error.to_string())
}

/// No answer from the store within the request timeout: 503 saying `message`.
fn late(message: &str) -> Refusal {
    Refusal(StatusCode::SERVICE_UNAVAILABLE, message.to_owned())
}

type Body = Result<Json<JsonPermit>, JsonRejection>;

pub(crate) async fn acquire(
    State(state): State<HttpState>,
    body: Body,
) -> Result<Response, Refusal> {
    let body = json_body(body)?;
    let request = permit_request(&state, &body)?;
    let decided = tokio::time::timeout(state.timeout, state.permits.acquire(&request)).await;
    let decision = decided
        .map_err(|_| late("no decision in time"))?
        .map_err(|e| refusal(&e))?;
    let acquired = JsonAcquired {
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
    let body = serde_json::to_string(&acquired).unwrap_or_default();
    Ok(json(status, body))
}

/// `release` or, with `RENEW`, `renew`.
pub(crate) async fn give_back<const RENEW: bool>(
    State(state): State<HttpState>,
    body: Body,
) -> Result<Response, Refusal> {
    let body = json_body(body)?;
    let request = permit_request(&state, &body)?;
    let permit = match body.permit.map(PermitId::new) {
        Some(permit) => permit.map_err(|e| refusal(&e.into()))?,
        None => return Err(bad("missing field `permit`")),
    };
    let call = async {
        if RENEW {
            state.permits.renew(&request, permit).await
        } else {
            state.permits.release(&request, permit).await
        }
    };
    let held = tokio::time::timeout(state.timeout, call).await;
    let held = held
        .map_err(|_| late("no answer in time"))?
        .map_err(|e| refusal(&e))?;
    let body = serde_json::to_string(&JsonHeld { held }).unwrap_or_default();
    Ok(json(StatusCode::OK, body))
}
