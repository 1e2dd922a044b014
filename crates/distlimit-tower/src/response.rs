//! The layer's own answers: RFC 9457 problem documents over HTTP, trailers-only statuses over
//! gRPC (the table is the crate documentation's "What the layer answers").

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

use crate::RateLimitBody;
use distlimit_policy::{Listed, Verdict};

use crate::headers::{Computed, ceil_secs, push_json_string, push_u64};

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
    /// The limiter denied the request: its headers and problem document.
    Denied(Computed),
    /// The store failed (or did not answer in time) and the layer fails closed.
    Unavailable { retry_after: Duration },
    /// The layer is misconfigured for this request.
    Misconfigured { detail: &'static str },
    /// No permit is free for the key ([`InFlightLayer`](crate::InFlightLayer)): retry in a
    /// second.
    Full,
}

impl Rejection {
    /// The answer to a request whose key needs the client IP when no peer address is known
    /// (logged).
    pub(crate) fn no_peer() -> Self {
        tracing::error!(
            "distlimit-tower: no peer address on the request; serve with ConnectInfo \
             (axum), TcpConnectInfo (tonic) or insert a PeerAddr extension"
        );
        let detail = "The rate limiter cannot identify the client.";
        Rejection::Misconfigured { detail }
    }

    /// The answer, as a gRPC status when `grpc`.
    pub(crate) fn into_response<B>(self, grpc: bool) -> Response<RateLimitBody<B>> {
        if grpc { self.grpc() } else { self.http() }
    }

    fn http<B>(self) -> Response<RateLimitBody<B>> {
        let mut response = Response::new(RateLimitBody::empty());
        let headers = response.headers_mut();
        // At most seven headers (a denial with the legacy trio): the map allocates once.
        headers.reserve(7);
        let (status, body) = match self {
            Rejection::Denied(computed) => {
                computed.apply(headers);
                headers.insert(CONTENT_TYPE, PROBLEM_JSON);
                (StatusCode::TOO_MANY_REQUESTS, computed.problem())
            }
            Rejection::Unavailable { retry_after } => problem(
                headers,
                StatusCode::SERVICE_UNAVAILABLE,
                "The rate limiter is unavailable; retry later.",
                Some(ceil_secs(retry_after).max(1)),
            ),
            Rejection::Misconfigured { detail } => {
                problem(headers, StatusCode::INTERNAL_SERVER_ERROR, detail, None)
            }
            Rejection::Full => problem(
                headers,
                StatusCode::TOO_MANY_REQUESTS,
                "Too many requests in flight; retry soon.",
                Some(1),
            ),
        };
        *response.body_mut() = RateLimitBody::full(body);
        *response.status_mut() = status;
        response
    }

    fn grpc<B>(self) -> Response<RateLimitBody<B>> {
        let mut response = Response::new(RateLimitBody::empty());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        let (code, message, retry_after) = match self {
            Rejection::Denied(computed) => {
                computed.apply(headers);
                (8, "rate limit exceeded", computed.retry_after)
            }
            Rejection::Unavailable { retry_after } => {
                (14, "rate limiter unavailable", Some(retry_after))
            }
            Rejection::Misconfigured { detail: _ } => (13, "rate limiter misconfigured", None),
            Rejection::Full => (
                8,
                "too many requests in flight",
                Some(Duration::from_secs(1)),
            ),
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

/// The problem document of a denial that can pass later, up to its `retry_after` value.
const DENIED_UNTIL: &str = concat!(
    r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","#,
    r#""title":"Too Many Requests","status":429,"#,
    r#""detail":"Too many requests; retry after the number of seconds in retry_after.","#,
    r#""retry_after":"#,
);
/// The problem document of a denial that can never pass, up to its last members.
const DENIED_NEVER: &str = concat!(
    r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","#,
    r#""title":"Too Many Requests","status":429,"#,
    r#""detail":"Too many requests; this request cannot pass under the current policy.""#,
);

/// Appends the problem document of a denial: the wait when it can pass later, and the tiers
/// that denied (the policy, for a deny-listed key) of the `verdicts` that denied, in
/// `violated-policies`. From constant prefixes, the document written member by member cost a
/// third of the denial's formatting (callgrind, `benches/http.rs` of distlimit-demo).
pub(crate) fn push_denial_problem<'v>(
    s: &mut String,
    verdicts: impl Iterator<Item = &'v Verdict>,
    retry_after: Option<u64>,
) {
    match retry_after {
        Some(secs) => {
            s.push_str(DENIED_UNTIL);
            push_u64(s, secs);
        }
        None => s.push_str(DENIED_NEVER),
    }
    let mut items = 0;
    let mut item = |s: &mut String, parts: &[&str]| {
        s.push_str(if items == 0 {
            r#","violated-policies":["#
        } else {
            ","
        });
        push_json_string(s, parts);
        items += 1;
    };
    for verdict in verdicts.filter(|v| !v.is_allowed()) {
        let policy = verdict.policy();
        if verdict.listed() == Some(Listed::Deny) {
            item(s, &[policy]);
        }
        let tiers = verdict.tiers().filter(|t| !t.is_shadow());
        for tier in tiers.filter(|t| t.decision().is_denied()) {
            item(s, &[policy, "/", tier.name()]);
        }
    }
    s.push_str(if items > 0 { "]}" } else { "}" });
}

/// The problem document (RFC 9457) of an answer other than a denial, its `Content-Type` and
/// `Retry-After` (`retry_after` seconds) inserted into `headers`; members in this order, as
/// serde_json would write them (the same order as a denial's).
fn problem(
    headers: &mut HeaderMap,
    status: StatusCode,
    detail: &str,
    retry_after: Option<u64>,
) -> (StatusCode, Bytes) {
    headers.insert(CONTENT_TYPE, PROBLEM_JSON);
    // `title` and `detail` are this crate's and `http`'s constants, with nothing to escape in
    // JSON (the tests pin every answer's bytes).
    let mut s = String::from(r#"{"type":"about:blank","title":""#);
    s.push_str(status.canonical_reason().unwrap_or_default());
    s.push_str(r#"","status":"#);
    push_u64(&mut s, status.as_u16().into());
    s.push_str(r#","detail":""#);
    s.push_str(detail);
    s.push('"');
    if let Some(secs) = retry_after {
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        s.push_str(r#","retry_after":"#);
        push_u64(&mut s, secs);
    }
    s.push('}');
    (status, Bytes::from(s))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::fmt::Write as _;
    use std::sync::Arc;

    use distlimit_core::{Limit, ManualClock, Quota};
    use distlimit_memory::MemoryStore;
    use distlimit_policy::{Limiter, Policy, PolicySet, Tier};
    use http_body::Body as _;

    use super::*;

    /// Status, headers in order, and body of an answer, as text.
    fn render(rejection: Rejection, grpc: bool) -> String {
        let response = rejection.into_response::<String>(grpc);
        let mut out = format!("{}\n", response.status().as_u16());
        for (name, value) in response.headers() {
            let _ = writeln!(out, "{name}: {}", value.to_str().unwrap());
        }
        let mut body = std::pin::pin!(response.into_body());
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        while let std::task::Poll::Ready(Some(Ok(frame))) = body.as_mut().poll_frame(&mut cx) {
            out.push_str(std::str::from_utf8(frame.data_ref().unwrap()).unwrap());
        }
        out
    }

    async fn denial(name: &str, tier: &str, list: bool, full: bool, legacy: bool) -> Rejection {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let store = MemoryStore::builder().clock(clock).build();
        let quota = Quota::new(1, Duration::from_millis(1500)).unwrap();
        let policy = Policy::new(name)
            .tier(Tier::new(tier, Limit::token_bucket(quota)))
            .tier(Tier::new(
                "day",
                Limit::fixed_window(Quota::per_day(9).unwrap()),
            ))
            .deny("blocked");
        let limiter = Limiter::new(Arc::new(store), PolicySet::new([policy]).unwrap());
        let key: &[u8] = if list { b"blocked" } else { b"k" };
        let verdict = loop {
            let verdict = limiter.check(name, key).await.unwrap();
            if !verdict.is_allowed() {
                break verdict;
            }
        };
        Rejection::Denied(Computed::new(std::slice::from_ref(&verdict), full, legacy))
    }

    /// Every answer's status, headers (in order) and body, byte for byte: escaped names,
    /// legacy headers, a listed key, gRPC.
    #[tokio::test]
    async fn answers_are_byte_for_byte() {
        let unavailable = || Rejection::Unavailable {
            retry_after: Duration::from_millis(1500),
        };
        let cases = [
            render(denial("api", "second", false, true, false).await, false),
            render(denial("api", "second", false, false, false).await, false),
            render(denial("api", "second", false, true, true).await, false),
            render(
                denial("a\"b\\c\n\u{1}\u{7f}", "é x", false, true, false).await,
                false,
            ),
            render(denial("api", "second", true, true, true).await, false),
            render(denial("api", "second", false, true, true).await, true),
            render(unavailable(), false),
            render(unavailable(), true),
            render(
                Rejection::Misconfigured {
                    detail: "The rate limiter cannot identify the client.",
                },
                false,
            ),
            render(Rejection::Misconfigured { detail: "x" }, true),
        ];
        let want = [
            "429\nretry-after: 2\nratelimit: \"api/second\";r=0;t=2, \"api/day\";r=8;t=6400\nratelimit-policy: \"api/second\";q=1;w=2, \"api/day\";q=9;w=86400\ncontent-type: application/problem+json\n{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"Too many requests; retry after the number of seconds in retry_after.\",\"retry_after\":2,\"violated-policies\":[\"api/second\"]}",
            "429\nretry-after: 2\ncontent-type: application/problem+json\n{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"Too many requests; retry after the number of seconds in retry_after.\",\"retry_after\":2,\"violated-policies\":[\"api/second\"]}",
            "429\nretry-after: 2\nratelimit: \"api/second\";r=0;t=2, \"api/day\";r=8;t=6400\nratelimit-policy: \"api/second\";q=1;w=2, \"api/day\";q=9;w=86400\nx-ratelimit-limit: 1\nx-ratelimit-remaining: 0\nx-ratelimit-reset: 2\ncontent-type: application/problem+json\n{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"Too many requests; retry after the number of seconds in retry_after.\",\"retry_after\":2,\"violated-policies\":[\"api/second\"]}",
            "429\nretry-after: 2\nratelimit: \"a\\\"b\\\\c???/? x\";r=0;t=2, \"a\\\"b\\\\c???/day\";r=8;t=6400\nratelimit-policy: \"a\\\"b\\\\c???/? x\";q=1;w=2, \"a\\\"b\\\\c???/day\";q=9;w=86400\ncontent-type: application/problem+json\n{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"Too many requests; retry after the number of seconds in retry_after.\",\"retry_after\":2,\"violated-policies\":[\"a\\\"b\\\\c\\n\\u0001\u{7f}/é x\"]}",
            "429\ncontent-type: application/problem+json\n{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"Too many requests; this request cannot pass under the current policy.\",\"violated-policies\":[\"api\"]}",
            "200\ncontent-type: application/grpc\nretry-after: 2\nratelimit: \"api/second\";r=0;t=2, \"api/day\";r=8;t=6400\nratelimit-policy: \"api/second\";q=1;w=2, \"api/day\";q=9;w=86400\nx-ratelimit-limit: 1\nx-ratelimit-remaining: 0\nx-ratelimit-reset: 2\ngrpc-status: 8\ngrpc-message: rate limit exceeded\ngrpc-retry-pushback-ms: 1500\n",
            "503\ncontent-type: application/problem+json\nretry-after: 2\n{\"type\":\"about:blank\",\"title\":\"Service Unavailable\",\"status\":503,\"detail\":\"The rate limiter is unavailable; retry later.\",\"retry_after\":2}",
            "200\ncontent-type: application/grpc\ngrpc-status: 14\ngrpc-message: rate limiter unavailable\nretry-after: 2\ngrpc-retry-pushback-ms: 1500\n",
            "500\ncontent-type: application/problem+json\n{\"type\":\"about:blank\",\"title\":\"Internal Server Error\",\"status\":500,\"detail\":\"The rate limiter cannot identify the client.\"}",
            "200\ncontent-type: application/grpc\ngrpc-status: 13\ngrpc-message: rate limiter misconfigured\n",
        ];
        for (got, want) in cases.iter().zip(want) {
            assert_eq!(got, want);
        }
        for prefix in [DENIED_UNTIL, DENIED_NEVER] {
            assert!(prefix.starts_with(&format!(r#"{{"type":"{QUOTA_EXCEEDED}","#)));
        }
    }
}
