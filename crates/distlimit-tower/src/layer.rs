//! [`RateLimitLayer`] and the [`RateLimit`] service it wraps around an HTTP or gRPC service.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use distlimit_core::Store;
#[cfg(feature = "memory")]
use distlimit_core::{Limit, Quota};
#[cfg(feature = "memory")]
use distlimit_memory::MemoryStore;
use distlimit_policy::{CheckError, Checked, Limiter, Plan, PolicyConfigError, Verdict};
#[cfg(feature = "memory")]
use distlimit_policy::{Policy, PolicySet, Tier};
use http::{HeaderMap, HeaderValue, Request, Response};
use smallvec::SmallVec;
use tower_layer::Layer;
use tower_service::Service;

use crate::client_ip::IpKey;
use crate::future::ResponseFuture;
use crate::headers::Computed;
use crate::key::{Kind as KeyKind, header_key};
use crate::response::Rejection;
use crate::settle::{Reserved, Settlement, Sink, Spec};
use crate::stream::StreamConfig;
use crate::{
    ClientIpResolver, KeyExtractor, PolicySelector, RateLimitHeaders, RequestInfo, Settle,
};

/// What the layer does when the limiter's store fails, or does not answer within the
/// [timeout](RateLimitLayerBuilder::timeout).
///
/// The store may itself be a `distlimit_hybrid::Hybrid`, whose per-policy failure mode already
/// answers outages with fallback or fail-open decisions; this is what happens to the errors it
/// still returns (fail-closed policies), and to timeouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnError {
    /// Answer 503 (gRPC `UNAVAILABLE`) with `Retry-After` of `retry_after`, rounded up to whole
    /// seconds. The default, with one second.
    FailClosed {
        /// The wait suggested to the client.
        retry_after: Duration,
    },
    /// Let the request through unchecked.
    FailOpen,
}

impl Default for OnError {
    fn default() -> Self {
        OnError::FailClosed {
            retry_after: Duration::from_secs(1),
        }
    }
}

/// The default [timeout](RateLimitLayerBuilder::timeout) of one check.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// The units a request charges (see [`RateLimitLayerBuilder::cost`]).
type CostFn = dyn Fn(&RequestInfo<'_>) -> u64 + Send + Sync;

/// One limit of a layer: the policy a request is checked against and its key.
struct LimitSpec {
    policy: PolicySelector,
    key: KeyExtractor,
    /// `None`: the layer's [cost](RateLimitLayerBuilder::cost).
    cost: Option<Box<CostFn>>,
    /// Charged from the response: the cost is the estimate.
    settle: Option<Arc<Spec>>,
}

impl LimitSpec {
    /// A limit charged the layer's cost, not settled.
    fn new(policy: PolicySelector, key: KeyExtractor) -> Self {
        Self {
            policy,
            key,
            cost: None,
            settle: None,
        }
    }
}

impl fmt::Debug for LimitSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("policy", &self.policy)
            .field("key", &self.key)
            .field("cost", &self.cost.as_ref().map(|_| ".."))
            .field("settled", &self.settle.is_some())
            .finish()
    }
}

struct Config<S: ?Sized> {
    limiter: Arc<Limiter<S>>,
    /// The limiter again, for settles sent after the response (store type erased).
    sink: Arc<dyn Sink>,
    /// The builder's limit first, then those added with [`RateLimitLayerBuilder::and`]; never
    /// empty.
    limits: Vec<LimitSpec>,
    /// `None`: one unit per request.
    cost: Option<Box<CostFn>>,
    client_ip: ClientIpResolver,
    headers: RateLimitHeaders,
    legacy_headers: bool,
    on_error: OnError,
    timeout: Option<Duration>,
}

/// The one boxed future of a request: the limiter's check of its policy and key.
pub(crate) type CheckFuture = Pin<Box<dyn Future<Output = Step> + Send + 'static>>;

/// How a request starts, decided in `call` from its head, before anything is boxed.
pub(crate) enum Start {
    /// No policy applies: call the inner service right away.
    Unchecked,
    /// Answer without checking (the client cannot be identified).
    Reject(Rejection),
    /// Decided already: the limiter answered without waiting (`Limiter::check_all_now`).
    Decided(Step),
    /// Check with the limiter first.
    Check(CheckFuture),
}

/// A [`Config`] with its store type erased, so the service is not generic over the store.
///
/// (A `'static` bound on the store type in the `Service` impl would make futures holding the
/// service unprovably `Send` for `dyn Store`, a known compiler limitation.)
trait Decide: fmt::Debug + Send + Sync + 'static {
    fn start(self: Arc<Self>, head: RequestInfo<'_>) -> Start;
}

impl<S: Store + ?Sized + 'static> Decide for Config<S> {
    fn start(self: Arc<Self>, head: RequestInfo<'_>) -> Start {
        let info = head.resolved(&self.client_ip);
        // The request's cost, computed once for every limit without a cost of its own.
        let mut shared_cost = None;
        let mut check_of = |limit| self.check_of(limit, &info, &mut shared_cost);
        let mut checks = Checks::new();
        for limit in &self.limits {
            match check_of(limit) {
                Ok(Some(check)) => checks.push(check),
                Ok(None) => {}
                Err(rejection) => return Start::Reject(rejection),
            }
        }
        match checks.is_empty() {
            true => Start::Unchecked,
            false => self.start_checks(checks),
        }
    }
}

impl<S: Store + ?Sized + 'static> Config<S> {
    /// The check of `limit` for a request (`None`: its selector names no policy), borrowing
    /// the layer and the request; `shared_cost` is the layer's cost, computed once for every
    /// limit without a cost of its own.
    fn check_of<'r>(
        &'r self,
        limit: &'r LimitSpec,
        info: &RequestInfo<'r>,
        shared_cost: &mut Option<u64>,
    ) -> Result<Option<Check<'r>>, Rejection> {
        let Some(policy) = limit.policy.select_ref(info) else {
            return Ok(None);
        };
        let Some(key) = key_of(&limit.key, info) else {
            return Err(Rejection::no_peer());
        };
        let cost = match (&limit.settle, &limit.cost) {
            (Some(settle), _) => settle.estimate,
            (None, Some(cost)) => cost(info),
            (None, None) => *shared_cost
                .get_or_insert_with(|| self.cost.as_deref().map_or(1, |cost| cost(info))),
        };
        Ok(Some(Check {
            policy,
            key,
            cost,
            settle: limit.settle.as_ref().map(Cow::Borrowed),
        }))
    }

    /// Starts the check of a request's limits: one all-or-nothing batch, its policies resolved
    /// once ([`Limiter::check_all_now`]), decided here when the store answers at once (the
    /// memory store does, with nothing allocated up to [`INLINE`] limits), else its plan
    /// awaited, the checks owning what they borrowed from the request and the layer.
    fn start_checks(self: &Arc<Self>, checks: Checks<'_>) -> Start {
        let decided = {
            let batch = checks
                .iter()
                .map(|c| (&**c.policy, c.key.as_bytes(), c.cost));
            let batch: SmallVec<[(&str, &[u8], u64); INLINE]> = batch.collect();
            self.limiter.check_all_now::<Verdicts>(&batch)
        };
        let plan = match decided {
            Checked::Decided(result) => {
                let policy = checks.first().map_or("", |c| &**c.policy);
                return Start::Decided(self.step(policy, result.as_deref(), &checks));
            }
            Checked::Pending(plan) => plan,
        };
        let checks: Checks<'static> = checks.into_iter().map(Check::into_owned).collect();
        let config = Arc::clone(self);
        let mut check: CheckFuture = Box::pin(async move { config.check(&plan, &checks).await });
        // Polled once here (a future may be polled with any waker; the response future polls
        // it with the task's from then on): a store that answers its first poll is decided
        // without a clone of the inner service.
        match check.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(step) => Start::Decided(step),
            Poll::Pending => Start::Check(check),
        }
    }
}

/// The key `key` names for a request (a header's value borrowed from it), with the client IP
/// as the fallback; `None` when the key needs the client IP and no peer address is known.
pub(crate) fn key_of<'r>(key: &KeyExtractor, info: &RequestInfo<'r>) -> Option<RequestKey<'r>> {
    let found = match &key.0 {
        KeyKind::ClientIp => None,
        KeyKind::Header { name, max_len } => {
            header_key(info, name, *max_len).map(|value| RequestKey::Header(Cow::Borrowed(value)))
        }
        KeyKind::Custom(f) => f(info).map(RequestKey::Custom),
    };
    found.or_else(|| Some(RequestKey::Ip(info.client_ip()?.key())))
}

/// A request's key: a header value (borrowed from the request while its check is decided in
/// `call`; an owned clone shares its bytes, as the values hyper parses share the request's
/// buffer), an IP key on the stack, or a custom extractor's bytes.
#[derive(Clone)]
pub(crate) enum RequestKey<'r> {
    Header(Cow<'r, HeaderValue>),
    Ip(IpKey),
    Custom(Bytes),
}

/// A request's key, owned by its check.
pub(crate) type OwnedKey = RequestKey<'static>;

impl RequestKey<'_> {
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            RequestKey::Header(value) => value.as_bytes(),
            RequestKey::Ip(key) => key.as_bytes(),
            RequestKey::Custom(bytes) => bytes,
        }
    }

    /// The key owned (a header value's clone shares its bytes).
    pub(crate) fn into_owned(self) -> OwnedKey {
        match self {
            RequestKey::Header(value) => RequestKey::Header(Cow::Owned(value.into_owned())),
            RequestKey::Ip(key) => RequestKey::Ip(key),
            RequestKey::Custom(bytes) => RequestKey::Custom(bytes),
        }
    }
}

/// The most limits a request is checked against without allocating their list.
const INLINE: usize = 4;

/// The limits of one request.
type Checks<'r> = SmallVec<[Check<'r>; INLINE]>;

/// The verdicts of one request's limits.
type Verdicts = SmallVec<[Verdict; INLINE]>;

/// One limit of one request: its policy, key and cost (the estimate of a settled limit),
/// borrowing the layer's configuration and the request's head while it is decided in `call`;
/// owned ([`into_owned`](Self::into_owned)) only when the store must be awaited.
struct Check<'r> {
    policy: Cow<'r, Arc<str>>,
    key: RequestKey<'r>,
    cost: u64,
    settle: Option<Cow<'r, Arc<Spec>>>,
}

impl Check<'_> {
    fn into_owned(self) -> Check<'static> {
        Check {
            policy: Cow::Owned(self.policy.into_owned()),
            key: self.key.into_owned(),
            cost: self.cost,
            settle: self.settle.map(|spec| Cow::Owned(spec.into_owned())),
        }
    }
}

/// A tower [`Layer`] that checks every request against a [`Limiter`] before the inner service
/// sees it.
///
/// Build it with [`builder`](Self::builder) (or [`new`](Self::new) for the defaults) and add it
/// to an axum `Router` with `.layer(..)`, to a tonic server with
/// `Server::builder().layer(..)`, or to any tower stack (`ServiceBuilder`, then hyper-util's
/// `TowerToHyperService` for plain hyper).
///
/// Per request: the client is resolved from the socket peer (a [`PeerAddr`](crate::PeerAddr)
/// extension, axum's `ConnectInfo<SocketAddr>` with feature `axum`, tonic's `TcpConnectInfo`
/// with feature `tonic`) and, through trusted proxies only, the forwarding header
/// ([`ClientIpResolver`]); each limit's [`PolicySelector`] names its policy (none: the limit
/// does not apply) and its [`KeyExtractor`] the key; the limiter charges every limit's
/// [cost](RateLimitLayerBuilder::cost) in one all-or-nothing batch, within the timeout. A key
/// that needs the client IP when no peer address is known is answered 500 (gRPC `INTERNAL`): a
/// limiter that cannot tell clients apart must not quietly share one bucket. The crate
/// documentation's "What the layer answers" lists every answer, its "Cost per request" what a
/// request costs (allocations, clones of the inner service).
#[derive(Clone)]
pub struct RateLimitLayer {
    config: Arc<dyn Decide>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl<S: ?Sized> fmt::Debug for Config<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limits", &self.limits)
            .field("cost", &self.cost.as_ref().map(|_| ".."))
            .field("client_ip", &self.client_ip)
            .field("headers", &self.headers)
            .field("legacy_headers", &self.legacy_headers)
            .field("on_error", &self.on_error)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// A layer with the defaults: key by client IP, no trusted proxy, headers on denials only,
    /// fail closed, a one-second timeout.
    pub fn new<S: Store + ?Sized + 'static>(
        limiter: Arc<Limiter<S>>,
        policy: impl Into<PolicySelector>,
    ) -> Self {
        Self::builder(limiter, policy).build()
    }

    /// Configures a layer checking requests against `limiter` under the policy `policy` picks.
    pub fn builder<S: Store + ?Sized + 'static>(
        limiter: Arc<Limiter<S>>,
        policy: impl Into<PolicySelector>,
    ) -> RateLimitLayerBuilder<S> {
        let sink: Arc<dyn Sink> = limiter.clone();
        RateLimitLayerBuilder {
            config: Config {
                limiter,
                sink,
                limits: vec![LimitSpec::new(policy.into(), KeyExtractor::default())],
                cost: None,
                client_ip: ClientIpResolver::default(),
                headers: RateLimitHeaders::default(),
                legacy_headers: false,
                on_error: OnError::default(),
                timeout: Some(DEFAULT_TIMEOUT),
            },
        }
    }
}

#[cfg(feature = "memory")]
impl RateLimitLayer {
    /// The policy [`per_client`](Self::per_client) enforces; rate-limit headers name its tier
    /// `"default/client"`.
    pub const PER_CLIENT_POLICY: &'static str = "default";
    /// The tier of [`PER_CLIENT_POLICY`](Self::PER_CLIENT_POLICY).
    pub const PER_CLIENT_TIER: &'static str = "client";

    /// Configures a layer that gives every client `quota` by GCRA, on an embedded memory store
    /// (feature `memory`, on by default): the crate documentation's quick start. Clients are
    /// keyed by IP unless [`key`](RateLimitLayerBuilder::key) names another key; the builder is
    /// the one [`builder`](Self::builder) returns.
    ///
    /// ```
    /// use distlimit_tower::{KeyExtractor, Quota, RateLimitLayer};
    /// use http::HeaderName;
    ///
    /// // 60 requests a minute per client, up to 10 at once.
    /// let per_ip = RateLimitLayer::per_client(Quota::per_minute(60)?.with_burst(10)?).build();
    ///
    /// // Keyed by the `X-Api-Key` header, by IP where it is missing.
    /// let per_key = RateLimitLayer::per_client(Quota::per_second(5)?)
    ///     .key(KeyExtractor::header(HeaderName::from_static("x-api-key")))
    ///     .build();
    /// # let _ = (per_ip, per_key);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn per_client(quota: Quota) -> RateLimitLayerBuilder<MemoryStore> {
        let tier = Tier::new(Self::PER_CLIENT_TIER, Limit::gcra(quota));
        let policy = Policy::new(Self::PER_CLIENT_POLICY).tier(tier);
        // Cannot fail: fixed valid names and one GCRA tier of a valid quota. Were it to, the
        // empty set would answer every request 500 (unknown policy, logged), never admit it.
        let policies = PolicySet::new([policy]).unwrap_or_default();
        let limiter = Arc::new(Limiter::new(Arc::new(MemoryStore::new()), policies));
        Self::builder(limiter, Self::PER_CLIENT_POLICY)
    }
}

/// Configures a [`RateLimitLayer`].
pub struct RateLimitLayerBuilder<S: ?Sized = dyn Store> {
    config: Config<S>,
}

impl<S: ?Sized> fmt::Debug for RateLimitLayerBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl<S: Store + ?Sized + 'static> RateLimitLayerBuilder<S> {
    /// How requests are keyed under the builder's policy (default:
    /// [`KeyExtractor::client_ip`]). Limits added with [`and`](Self::and) name their own key.
    #[must_use]
    pub fn key(mut self, key: KeyExtractor) -> Self {
        if let Some(first) = self.config.limits.first_mut() {
            first.key = key;
        }
        self
    }

    /// Charges the builder's own limit from the response ([`Settle`]): each request reserves
    /// the estimate, settled with the actual cost when the response body ends (see
    /// [`and_settled`](Self::and_settled)).
    #[must_use]
    pub fn settle(mut self, settle: Settle) -> Self {
        if let Some(first) = self.config.limits.first_mut() {
            first.settle = Some(settle.spec);
        }
        self
    }

    /// Adds a limit: requests are also checked against the policy `policy` picks, keyed by
    /// `key`, charged the layer's [cost](Self::cost), in the one all-or-nothing batch of every
    /// limit that applies (the crate documentation's "Several limits, one decision").
    #[must_use]
    pub fn and(self, policy: impl Into<PolicySelector>, key: KeyExtractor) -> Self {
        self.limit(LimitSpec::new(policy.into(), key))
    }

    /// Adds a limit charged from the response ([`Settle`]): each request reserves the estimate
    /// in the layer's one all-or-nothing batch (with the other limits), and the reservation is
    /// settled with the actual cost when the response body ends: the difference given back, or
    /// the excess charged past the limit as debt that later requests wait out.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use distlimit_memory::MemoryStore;
    /// use distlimit_policy::{Limiter, PolicySet};
    /// use distlimit_tower::{KeyExtractor, RateLimitLayer, Settle};
    /// use http::HeaderName;
    ///
    /// let policies = PolicySet::from_toml_str(
    ///     r#"
    ///     [[policy]]
    ///     name = "requests"
    ///     tiers = [ { name = "minute", limit = 60, per = "1m" } ]
    ///
    ///     [[policy]]
    ///     name = "tokens"
    ///     tiers = [ { name = "minute", limit = 10000, per = "1m", algorithm = "token_bucket" } ]
    ///     "#,
    /// )?;
    /// let limiter = Arc::new(Limiter::new(Arc::new(MemoryStore::new()), policies));
    /// let user = KeyExtractor::header(HeaderName::from_static("x-user-id"));
    /// let layer = RateLimitLayer::builder(limiter, "requests")
    ///     .key(user.clone())
    ///     .and_settled(
    ///         "tokens",
    ///         user,
    ///         Settle::from_header(HeaderName::from_static("x-usage-tokens")).estimate(1),
    ///     )
    ///     .try_build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn and_settled(
        self,
        policy: impl Into<PolicySelector>,
        key: KeyExtractor,
        settle: Settle,
    ) -> Self {
        self.limit(LimitSpec {
            settle: Some(settle.spec),
            ..LimitSpec::new(policy.into(), key)
        })
    }

    /// Adds a limit, like [`and`](Self::and), charging `cost` units per request instead of the
    /// layer's cost: a per-request limit next to a per-byte one, say.
    #[must_use]
    pub fn and_with_cost<F>(
        self,
        policy: impl Into<PolicySelector>,
        key: KeyExtractor,
        cost: F,
    ) -> Self
    where
        F: Fn(&RequestInfo<'_>) -> u64 + Send + Sync + 'static,
    {
        self.limit(LimitSpec {
            cost: Some(Box::new(cost)),
            ..LimitSpec::new(policy.into(), key)
        })
    }

    fn limit(mut self, limit: LimitSpec) -> Self {
        self.config.limits.push(limit);
        self
    }

    /// The units each request charges, from its head (default: one). For requests that cost
    /// more than others: a batch endpoint charged per item, an upload per megabyte declared in
    /// `content-length`, a GraphQL query by its complexity.
    ///
    /// Every tier of every limit without a cost of its own ([`and_with_cost`](Self::and_with_cost))
    /// is charged `cost`, all or nothing. A cost of 0 charges nothing (denied only when not one
    /// unit is left); a cost above a tier's burst is answered 429 without `Retry-After`.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use distlimit_memory::MemoryStore;
    /// use distlimit_policy::{Limiter, PolicySet};
    /// use distlimit_tower::RateLimitLayer;
    ///
    /// let policies = PolicySet::from_toml_str(
    ///     r#"
    ///     [[policy]]
    ///     name = "uploads"
    ///     tiers = [ { name = "minute", limit = 100, per = "1m" } ]
    ///     "#,
    /// )?;
    /// let limiter = Arc::new(Limiter::new(Arc::new(MemoryStore::new()), policies));
    /// // One unit per started megabyte the client declares, at least one.
    /// let layer = RateLimitLayer::builder(limiter, "uploads")
    ///     .cost(|req| {
    ///         let bytes = req
    ///             .headers()
    ///             .get(http::header::CONTENT_LENGTH)
    ///             .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    ///             .unwrap_or(0);
    ///         bytes.div_ceil(1 << 20).max(1)
    ///     })
    ///     .build();
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&RequestInfo<'_>) -> u64 + Send + Sync + 'static,
    {
        self.config.cost = Some(Box::new(cost));
        self
    }

    /// How the client IP is found: trusted proxies, forwarding header, IPv4/IPv6 grouping
    /// (default: no trusted proxy, so the socket peer; IPv6 by /64).
    #[must_use]
    pub fn client_ip(mut self, resolver: ClientIpResolver) -> Self {
        self.config.client_ip = resolver;
        self
    }

    /// Which responses carry `RateLimit` and `RateLimit-Policy` (default: denials only).
    #[must_use]
    pub fn headers(mut self, headers: RateLimitHeaders) -> Self {
        self.config.headers = headers;
        self
    }

    /// Whether responses that carry rate-limit headers also carry the legacy
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (seconds) of the
    /// most restrictive tier (default: no).
    #[must_use]
    pub fn legacy_headers(mut self, legacy: bool) -> Self {
        self.config.legacy_headers = legacy;
        self
    }

    /// What a store failure or timeout does (default: 503 with `Retry-After: 1`).
    #[must_use]
    pub fn on_error(mut self, on_error: OnError) -> Self {
        self.config.on_error = on_error;
        self
    }

    /// The most one check may take before it counts as a store failure ([`OnError`]); `None`
    /// waits for the store (default: one second). Uses the Tokio timer.
    #[must_use]
    pub fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.config.timeout = timeout;
        self
    }

    /// The layer. Every policy the layer names ([`PolicySelector::policies`]) that the
    /// limiter's set defines is declared on the limiter ([`Limiter::declare`]), so a reload that
    /// drops one is refused. A policy the set does not define is answered per request as a
    /// store failure ([`OnError`]); [`try_build`](Self::try_build) refuses it instead.
    pub fn build(self) -> RateLimitLayer {
        for policy in self.config.policies() {
            // An undefined policy is reported by every check that uses it (see above).
            let _ = self.config.limiter.declare(&policy);
        }
        RateLimitLayer {
            config: Arc::new(self.config),
        }
    }

    /// The layer, once every policy it names is defined in the limiter's set and declared
    /// ([`Limiter::declare`]): a reload that drops one is refused, the running set kept.
    ///
    /// # Errors
    ///
    /// The first policy the limiter's active set does not define.
    pub fn try_build(self) -> Result<RateLimitLayer, PolicyConfigError> {
        for policy in self.config.policies() {
            self.config.limiter.declare(&policy)?;
        }
        Ok(RateLimitLayer {
            config: Arc::new(self.config),
        })
    }
}

impl<Inner> Layer<Inner> for RateLimitLayer {
    type Service = RateLimit<Inner>;

    fn layer(&self, inner: Inner) -> Self::Service {
        RateLimit {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around `Inner`: checks each request, then calls
/// `Inner` or answers itself.
#[derive(Clone, Debug)]
pub struct RateLimit<Inner> {
    inner: Inner,
    config: Arc<dyn Decide>,
}

impl<Inner, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<Inner>
where
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<crate::RateLimitBody<ResBody>>;
    type Error = Inner::Error;
    type Future = ResponseFuture<Inner, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        match self.config.clone().start(RequestInfo::of(&req)) {
            // The service polled ready serves the request now.
            Start::Unchecked => ResponseFuture::calling(self.inner.call(req), None, None),
            Start::Reject(rejection) | Start::Decided(Step::Reject(rejection)) => {
                ResponseFuture::rejected(rejection, is_grpc(req.headers()))
            }
            Start::Decided(Step::Pass(headers, settle)) => {
                ResponseFuture::calling(self.inner.call(req), headers, settle)
            }
            Start::Check(check) => {
                // The service that was polled ready goes into the future; a fresh clone stays.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::checking(check, inner, req)
            }
        }
    }
}

/// Whether a request is gRPC (`content-type: application/grpc...`): its rejections are gRPC
/// statuses.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(b"application/grpc"))
}

/// `future`'s output, awaited at most `timeout` (`None`: no limit); `None` when it timed out
/// (logged as `what` of `policy`). A future answered at its first poll (the memory store never
/// waits) needs no timer.
pub(crate) async fn within<F: Future>(
    timeout: Option<Duration>,
    future: F,
    policy: &str,
    what: &str,
) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let first = std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await;
    match (first, timeout) {
        (Poll::Ready(output), _) => Some(output),
        (Poll::Pending, None) => Some(future.await),
        (Poll::Pending, Some(limit)) => {
            let output = tokio::time::timeout(limit, future).await.ok();
            if output.is_none() {
                tracing::warn!(policy, ?limit, "distlimit-tower: {what} timed out");
            }
            output
        }
    }
}

/// What the layer does with one checked request.
pub(crate) enum Step {
    /// Call the inner service, adding these headers to its response, and settle the
    /// reservations of its settled limits when the response ends.
    Pass(Option<Computed>, Option<Box<Settlement>>),
    /// Answer without calling it.
    Reject(Rejection),
}

impl<S: Store + ?Sized> Config<S> {
    /// Every policy the layer's limits can name.
    fn policies(&self) -> impl Iterator<Item = Arc<str>> + '_ {
        self.limits.iter().flat_map(|limit| limit.policy.policies())
    }

    /// Decides a request's limits, planned as one all-or-nothing batch, awaiting the store.
    async fn check(&self, plan: &Plan, checks: &[Check<'_>]) -> Step {
        // Named in logs by its first policy (the layer's own, when it applies).
        let policy = checks.first().map_or("", |c| &**c.policy);
        let check = self.limiter.decide_plan(plan);
        match within(self.timeout, check, policy, "rate-limit check").await {
            Some(result) => self.step(policy, result.as_deref(), checks),
            None => self.on_error(),
        }
    }

    /// What a check's result (a verdict per limit of `checks`) means for the request.
    fn step(
        &self,
        policy: &str,
        result: Result<&[Verdict], &CheckError>,
        checks: &[Check<'_>],
    ) -> Step {
        match result {
            Ok(verdicts) if verdicts.iter().all(Verdict::is_allowed) => {
                let full = self.headers == RateLimitHeaders::Always;
                let headers = (full || self.legacy_headers)
                    .then(|| Computed::new(verdicts, full, self.legacy_headers));
                Step::Pass(headers, self.settlement(checks))
            }
            Ok(verdicts) => {
                let full = self.headers != RateLimitHeaders::Never;
                let computed = Computed::new(verdicts, full, self.legacy_headers);
                Step::Reject(Rejection::Denied(computed))
            }
            Err(CheckError::UnknownPolicy(name)) => {
                tracing::error!(policy = %name, "distlimit-tower: unknown rate-limit policy");
                let detail = "The rate limiter is misconfigured.";
                Step::Reject(Rejection::Misconfigured { detail })
            }
            Err(error) => {
                tracing::warn!(policy, %error, "distlimit-tower: rate-limit check failed");
                self.on_error()
            }
        }
    }

    fn on_error(&self) -> Step {
        match self.on_error {
            OnError::FailClosed { retry_after } => {
                Step::Reject(Rejection::Unavailable { retry_after })
            }
            OnError::FailOpen => Step::Pass(None, None),
        }
    }

    /// The reservations of an admitted request's settled limits, if it has any.
    fn settlement(&self, checks: &[Check<'_>]) -> Option<Box<Settlement>> {
        let reserved: SmallVec<[Reserved; 1]> = checks
            .iter()
            .filter_map(|c| {
                // The spec first: a limit not settled copies nothing.
                let spec = Arc::clone(c.settle.as_deref()?);
                Some(Reserved {
                    policy: Arc::clone(&c.policy),
                    key: Bytes::copy_from_slice(c.key.as_bytes()),
                    estimate: c.cost,
                    actual: None,
                    spec,
                })
            })
            .collect();
        if reserved.is_empty() {
            return None;
        }
        let config = StreamConfig {
            on_error: self.on_error,
            timeout: self.timeout,
        };
        Some(Box::new(Settlement::new(
            self.sink.clone(),
            reserved,
            config,
        )))
    }
}
