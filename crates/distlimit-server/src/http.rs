//! The HTTP side: `POST /v1/check` (the decision as JSON), `POST /v1/report` (usage after the
//! response, charged even past the limit), `POST /v1/permits/*` (concurrency limits, see
//! `permits.rs`), `GET /metrics`, `GET /ready`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use crate::answer::HeaderNames;
use distlimit_core::SettleKind;

use crate::check::{CheckError, CheckRequest, CheckResponse, Checker, Descriptor};
use crate::config::Unit;
use crate::metrics::{Protocol, RequestResult};
use crate::permits;

/// The largest `POST /v1/check` body, in bytes.
pub const MAX_BODY: usize = 256 * 1024;

/// A `POST /v1/check` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonCheck {
    /// The configuration's domain.
    pub domain: String,
    /// The descriptors: each a list of entries.
    pub descriptors: Vec<Vec<JsonEntry>>,
    /// Units each descriptor spends (default 1; 0 is read as 1).
    #[serde(default)]
    pub hits: u32,
}

/// One entry of a descriptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonEntry {
    /// The entry's key.
    pub key: String,
    /// The entry's value.
    pub value: String,
}

/// The answer of `POST /v1/check`.
#[derive(Debug, Serialize)]
pub struct JsonAnswer {
    /// `OK` or `OVER_LIMIT`.
    pub overall_code: &'static str,
    /// One per descriptor.
    pub statuses: Vec<JsonStatus>,
}

/// One descriptor's answer.
#[derive(Debug, Serialize)]
pub struct JsonStatus {
    /// `OK` or `OVER_LIMIT`.
    pub code: &'static str,
    /// The limit applied; absent when none matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_limit: Option<JsonLimit>,
    /// Requests left in the window (4294967295 when unlimited).
    pub limit_remaining: u32,
    /// Milliseconds until the window ends; absent when not limited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_until_reset_ms: Option<u64>,
}

/// A limit, as in `current_limit`.
#[derive(Debug, Serialize)]
pub struct JsonLimit {
    /// The rule's name or path.
    pub name: String,
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// `second`, `minute`, `hour`, `day`, `week`, `month` or `year`; absent for a policy tier
    /// whose period is no whole unit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<&'static str>,
    /// The window, in milliseconds.
    pub window_ms: u64,
}

/// What the HTTP handlers share.
#[derive(Clone)]
pub struct HttpState {
    /// The decisions.
    pub checker: Arc<Checker>,
    /// Answers carry the rate-limit headers, under these names.
    pub headers: Option<HeaderNames>,
    /// False once shutdown began: `/ready` answers 503.
    pub ready: Arc<AtomicBool>,
    /// Where Redis stands (`None` without `--redis`): `/ready` names it.
    pub redis: Option<distlimit_serve::store::RedisStatus>,
    /// The time limit of one check.
    pub timeout: Duration,
    /// The concurrency permits (`/v1/permits/*`).
    pub permits: Arc<dyn distlimit_core::PermitStore>,
}

impl std::fmt::Debug for HttpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpState")
            .field("checker", &self.checker)
            .field("headers", &self.headers)
            .field("redis", &self.redis)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The routes.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/v1/check", post(decide::<false>))
        .route("/v1/permits/acquire", post(permits::acquire))
        .route("/v1/permits/release", post(permits::give_back::<false>))
        .route("/v1/permits/renew", post(permits::give_back::<true>))
        .route("/v1/report", post(decide::<true>))
        .route("/metrics", get(metrics))
        .route("/ready", get(ready))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

pub(crate) fn json(status: StatusCode, body: String) -> Response {
    (status, [(CONTENT_TYPE, "application/json")], body).into_response()
}

pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    json(status, serde_json::json!({ "error": message }).to_string())
}

/// `POST /v1/check`, or with `REPORT` `POST /v1/report`: the same body, each descriptor's
/// `hits` charged even past the limit (usage known after the response; see [`Checker::check`],
/// "Reports"), answered 200 once recorded, each status saying whether its key is over the limit
/// now.
async fn decide<const REPORT: bool>(
    State(state): State<HttpState>,
    body: Result<axum::Json<JsonCheck>, JsonRejection>,
) -> Response {
    let started = Instant::now();
    let settle = REPORT.then_some(SettleKind::Report);
    let body = match body {
        Ok(axum::Json(body)) => body,
        Err(rejection) => {
            let (result, elapsed) = (RequestResult::invalid, started.elapsed());
            state
                .checker
                .observe_request(Protocol::http, "", result, elapsed);
            return error(rejection.status(), &rejection.body_text());
        }
    };
    let request = CheckRequest {
        domain: &body.domain,
        descriptors: body
            .descriptors
            .iter()
            .map(|entries| Descriptor {
                entries: entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect(),
                settle,
                ..Descriptor::default()
            })
            .collect(),
        hits: u64::from(body.hits),
    };
    let decided = tokio::time::timeout(state.timeout, state.checker.check(&request)).await;
    let result = decided
        .as_ref()
        .map_or(RequestResult::unavailable, RequestResult::of);
    state
        .checker
        .observe_request(Protocol::http, &body.domain, result, started.elapsed());
    let answer = match decided {
        Err(_) => return error(StatusCode::SERVICE_UNAVAILABLE, "no decision in time"),
        Ok(Err(CheckError::InvalidArgument(message))) => {
            return error(StatusCode::BAD_REQUEST, &message);
        }
        Ok(Err(e)) => return error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        Ok(Ok(answer)) => answer,
    };
    let status = if answer.over_limit && settle.is_none() {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    let mut response = json(status, to_json(&answer));
    if let Some(names) = &state.headers {
        for (name, value) in answer.headers() {
            if let Ok(value) = HeaderValue::from_str(&value) {
                response.headers_mut().insert(names.header(name), value);
            }
        }
    }
    response
}

/// The JSON text of an answer.
pub fn to_json(answer: &CheckResponse) -> String {
    let code = |over: bool| if over { "OVER_LIMIT" } else { "OK" };
    let body = JsonAnswer {
        overall_code: code(answer.over_limit),
        statuses: answer
            .statuses
            .iter()
            .map(|s| JsonStatus {
                code: code(s.over_limit),
                current_limit: s.current_limit.as_ref().map(|l| JsonLimit {
                    name: l.name.clone(),
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit.map(Unit::name),
                    window_ms: u64::try_from(l.window.as_millis()).unwrap_or(u64::MAX),
                }),
                limit_remaining: s.limit_remaining,
                duration_until_reset_ms: s
                    .duration_until_reset
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            })
            .collect(),
    };
    serde_json::to_string(&body).unwrap_or_default()
}

async fn metrics(State(state): State<HttpState>) -> Response {
    (
        [(CONTENT_TYPE, distlimit_metrics::CONTENT_TYPE)],
        state.checker.request_metrics().encode(),
    )
        .into_response()
}

async fn ready(State(state): State<HttpState>) -> Response {
    if !state.ready.load(Ordering::Acquire) {
        return json(
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"status":"shutting down"}"#.into(),
        );
    }
    // Ready while Redis is down: the failure mode answers; the body says which.
    let body = match &state.redis {
        None => r#"{"status":"ready"}"#,
        Some(redis) if redis.is_deciding() => r#"{"status":"ready","redis":"up"}"#,
        Some(_) => r#"{"status":"ready","redis":"down"}"#,
    };
    json(StatusCode::OK, body.into())
}
