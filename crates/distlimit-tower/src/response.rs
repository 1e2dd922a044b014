//! The layer's own answers: RFC 9457 problem documents over HTTP, trailers-only statuses over
//! gRPC.
//!
//! | what | HTTP | gRPC |
//! |---|---|---|
//! | denied | 429, `Retry-After`, `RateLimit*` | `RESOURCE_EXHAUSTED` (8), `retry-after`, `grpc-retry-pushback-ms`, `ratelimit*` |
//! | store failed (fail closed) or timed out | 503, `Retry-After` | `UNAVAILABLE` (14), `retry-after`, `grpc-retry-pushback-ms` |
//! | unknown policy, no peer address | 500 | `INTERNAL` (13) |

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use serde::Serialize;

use crate::RateLimitBody;
use crate::headers::{Computed, ceil_secs};

/// `application/problem+json` (RFC 9457).
pub const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");
/// The problem type of a denial (draft-ietf-httpapi-ratelimit-headers, "Quota Exceeded").
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// gRPC metadata: the retry delay in milliseconds (gRFC A6 retry pushback).
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// Why the layer answers itself instead of calling the inner service.
#[derive(Debug)]
pub(crate) enum Rejection {
    /// The limiter denied the request (boxed: a denial allocates its body anyway, and the
    /// futures that carry a `Rejection` stay small).
    Denied(Box<Computed>),
    /// The store failed (or did not answer in time) and the layer fails closed.
    Unavailable { retry_after: Duration },
    /// The layer is misconfigured for this request.
    Misconfigured { detail: &'static str },
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    title: &'a str,
    status: u16,
    detail: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after: Option<u64>,
    #[serde(rename = "violated-policies", skip_serializing_if = "<[_]>::is_empty")]
    violated_policies: &'a [String],
}

impl Rejection {
    /// The answer, as a gRPC status when `grpc`.
    pub(crate) fn into_response<B>(self, grpc: bool) -> Response<RateLimitBody<B>> {
        if grpc { self.grpc() } else { self.http() }
    }

    fn http<B>(self) -> Response<RateLimitBody<B>> {
        let mut headers = HeaderMap::new();
        let (status, kind, detail, retry_after, violated) = match self {
            Rejection::Denied(mut computed) => {
                let retry_after = computed.retry_after_secs();
                let violated = std::mem::take(&mut computed.violated);
                (*computed).apply(&mut headers);
                let detail = if retry_after.is_some() {
                    "Too many requests; retry after the number of seconds in retry_after."
                } else {
                    "Too many requests; this request cannot pass under the current policy."
                };
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    QUOTA_EXCEEDED,
                    detail,
                    retry_after,
                    violated,
                )
            }
            Rejection::Unavailable { retry_after } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "about:blank",
                "The rate limiter is unavailable; retry later.",
                Some(ceil_secs(retry_after).max(1)),
                Vec::new(),
            ),
            Rejection::Misconfigured { detail } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "about:blank",
                detail,
                None,
                Vec::new(),
            ),
        };
        let problem = Problem {
            kind,
            title: status.canonical_reason().unwrap_or_default(),
            status: status.as_u16(),
            detail,
            retry_after,
            violated_policies: &violated,
        };
        // Serializing a struct of strings and integers cannot fail.
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        headers.insert(CONTENT_TYPE, PROBLEM_JSON);
        if let Some(secs) = retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        let mut response = Response::new(RateLimitBody::full(Bytes::from(body)));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }

    fn grpc<B>(self) -> Response<RateLimitBody<B>> {
        let mut response = Response::new(RateLimitBody::empty());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        let (code, message, retry_after) = match self {
            Rejection::Denied(computed) => {
                let retry_after = computed.retry_after;
                (*computed).apply(headers);
                (8, "rate limit exceeded", retry_after)
            }
            Rejection::Unavailable { retry_after } => {
                (14, "rate limiter unavailable", Some(retry_after))
            }
            Rejection::Misconfigured { detail: _ } => (13, "rate limiter misconfigured", None),
        };
        headers.insert(GRPC_STATUS, HeaderValue::from(code));
        headers.insert(GRPC_MESSAGE, HeaderValue::from_static(message));
        if let Some(wait) = retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(ceil_secs(wait).max(1)));
            let ms = wait.as_micros().div_ceil(1000).max(1);
            headers.insert(
                GRPC_RETRY_PUSHBACK_MS,
                HeaderValue::from(u64::try_from(ms).unwrap_or(u64::MAX)),
            );
        }
        response
    }
}
