//! The HTTP side: routes, the rate-limit layer, the shutdown signal.

use std::sync::Arc;

use crate::{IP_POLICY, POLICY, TOKENS_POLICY, USAGE_HEADER, USER_HEADER};
use axum::Router;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderName, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::get;
use distlimit_core::{Clock, SystemClock};
use distlimit_metrics::Metrics;
use distlimit_policy::Limiter;
use distlimit_tower::{
    ClientIpResolver, InFlightLayer, KeyExtractor, Meter, RateLimitHeaders, RateLimitLayer, Settle,
    TrustedProxies,
};

/// The longest `delay_ms` `GET /api/generate` accepts: 10 s.
pub const MAX_DELAY_MS: u64 = 10_000;

/// The most tokens `GET /api/generate` accepts to report: 2^52
/// ([`MAX_REPORT`](distlimit_core::MAX_REPORT)).
pub const MAX_TOKENS: u64 = distlimit_core::MAX_REPORT;

/// The most tokens `GET /api/generate?stream=1` streams: 100 000.
pub const MAX_STREAM_TOKENS: u64 = 100_000;

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
    /// Policy [`TOKENS_POLICY`] on `/api/generate`, keyed by `X-User-ID` (else the client IP),
    /// charged from the response: 1 token reserved, settled with the [`USAGE_HEADER`], or a
    /// streamed answer metered as it streams (the crate docs say how). `None` when the policy
    /// set does not define the policy (a `--policy` file without it): the route is not served.
    pub generate: Option<RateLimitLayer>,
    /// The concurrency limit of `/api/generate` ([`generate_limit`](crate::generate_limit)),
    /// checked before the tokens are reserved (a request over it reserves nothing); `None`
    /// from [`api_limits`], set by the demo ([`generate_in_flight`](crate::generate_in_flight)).
    pub in_flight: Option<InFlightLayer>,
}

/// The layer limiting `/api/data` ([`ApiLimits`]); the client IP is the socket peer, or what
/// `trusted` proxies forward. Denials carry `Retry-After` and the `RateLimit` headers of the
/// limit that denied.
///
/// No time limit on the checks: the memory store never waits, and the Redis store is wrapped in
/// a hybrid store whose own budget (`--redis-budget-ms`) hands slow calls to the local fallback.
pub fn api_limits(limiter: Arc<Limiter>, trusted: TrustedProxies) -> ApiLimits {
    api_limits_with(limiter, trusted, distlimit_tower::DEFAULT_BLOCK)
}

/// [`api_limits`], streamed answers reserving `stream_block` tokens at a time
/// (`--stream-block`).
pub fn api_limits_with(
    limiter: Arc<Limiter>,
    trusted: TrustedProxies,
    stream_block: u64,
) -> ApiLimits {
    let layer = RateLimitLayer::builder(limiter.clone(), IP_POLICY)
        .key(KeyExtractor::client_ip())
        .and(POLICY, KeyExtractor::header(USER_HEADER))
        .client_ip(ClientIpResolver::new(trusted.clone()))
        .headers(RateLimitHeaders::Denied)
        .timeout(None)
        .build();
    let generate = limiter.policies().get(TOKENS_POLICY).is_some().then(|| {
        RateLimitLayer::builder(limiter, TOKENS_POLICY)
            .key(KeyExtractor::header(USER_HEADER))
            .settle(
                Settle::from_header(USAGE_HEADER)
                    .estimate(1)
                    .metered(Meter::sse())
                    .block(stream_block),
            )
            .client_ip(ClientIpResolver::new(trusted))
            .headers(RateLimitHeaders::Denied)
            .timeout(None)
            .build()
    });
    ApiLimits {
        layer,
        generate,
        in_flight: None,
    }
}

/// The routes: `GET /api/data` behind `limits` (none: unlimited, for comparisons), and the
/// unlimited `GET /metrics` and `GET /healthz`.
///
/// The limits wrap the route's `GET` handler only (`route_layer`): a request no handler serves
/// (another path, 404, or another method, 405) spends nothing.
pub fn router(limits: Option<ApiLimits>, metrics: Metrics) -> Router {
    let (data, generate) = match limits {
        Some(limits) => {
            let served = limits.generate.is_some() || limits.in_flight.is_some();
            let mut route = get(generate);
            if let Some(layer) = limits.generate {
                route = route.route_layer(layer);
            }
            // The last layer runs first: a request over the concurrency limit reserves no tokens.
            if let Some(layer) = limits.in_flight {
                route = route.route_layer(layer);
            }
            (get(data).route_layer(limits.layer), served.then_some(route))
        }
        None => (get(data), Some(get(generate))),
    };
    let ops = Router::new()
        .route("/metrics", get(exposition))
        .route("/healthz", get(healthz))
        .with_state(metrics);
    let mut api = Router::new().route("/api/data", data);
    if let Some(generate) = generate {
        api = api.route("/api/generate", generate);
    }
    api.merge(ops)
}

/// `GET /api/generate?tokens=N&delay_ms=M`: answers after `M` ms (at most [`MAX_DELAY_MS`],
/// default 0) with `N` tokens used (at most [`MAX_TOKENS`], default 0) in the
/// [`USAGE_HEADER`], as an LLM endpoint reports its usage once the answer is done. With
/// `stream=1`, streams the `N` tokens (at most [`MAX_STREAM_TOKENS`]) as server-sent events
/// spread over the `M` ms, one `data:` line per token, then `event: done`. A bad value is a 400
/// problem document naming it (charged the reserved token).
async fn generate(uri: Uri) -> axum::response::Response {
    let entered = SystemClock.now_us();
    let mut tokens = 0;
    let mut delay_ms = 0;
    let mut stream = 0;
    for pair in uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let (slot, max) = match name {
            "tokens" => (&mut tokens, MAX_TOKENS),
            "delay_ms" => (&mut delay_ms, MAX_DELAY_MS),
            "stream" => (&mut stream, 1),
            _ => continue,
        };
        match value.parse::<u64>() {
            Ok(n) if n <= max => *slot = n,
            _ => return bad_parameter(name, max),
        }
    }
    if stream == 1 {
        if tokens > MAX_STREAM_TOKENS {
            return bad_parameter("tokens", MAX_STREAM_TOKENS);
        }
        return (
            [
                (CONTENT_TYPE, "text/event-stream"),
                (axum::http::header::CACHE_CONTROL, "no-cache"),
            ],
            axum::body::Body::new(crate::tokens::Tokens::new(
                tokens,
                std::time::Duration::from_millis(delay_ms),
            )),
        )
            .into_response();
    }
    if delay_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
    }
    let left = SystemClock.now_us();
    (
        [
            (CONTENT_TYPE, "application/json".to_owned()),
            (USAGE_HEADER, tokens.to_string()),
            (HANDLER_ENTERED, entered.to_string()),
            (HANDLER_LEFT, left.to_string()),
        ],
        format!(r#"{{"tokens":{tokens}}}"#),
    )
        .into_response()
}

/// The response header of `/api/generate` saying when the handler was entered, µs since the
/// Unix epoch (with [`HANDLER_LEFT`], a client of several instances on one host counts how
/// many requests were inside the handler at once).
const HANDLER_ENTERED: HeaderName = HeaderName::from_static("x-handler-entered-us");

/// The response header of `/api/generate` saying when the handler was left.
const HANDLER_LEFT: HeaderName = HeaderName::from_static("x-handler-left-us");

/// The 400 answer to a parameter of `/api/generate` that is not an integer up to `max`.
fn bad_parameter(name: &str, max: u64) -> axum::response::Response {
    (
        StatusCode::BAD_REQUEST,
        [(CONTENT_TYPE, "application/problem+json")],
        format!(
            r#"{{"type":"about:blank","title":"Bad Request","status":400,"detail":"{name} must be an integer from 0 to {max}"}}"#
        ),
    )
        .into_response()
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
