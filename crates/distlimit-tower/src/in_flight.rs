//! [`InFlightLayer`]: at most N requests in flight per key, across every instance sharing a
//! [`PermitStore`] (the crate documentation's "Requests in flight").

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use distlimit_core::{
    Error, Key, NoopObserver, Observer, PermitDecision, PermitEvent, PermitId, PermitLimit,
    PermitRequest, PermitStore, StateName,
};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;
use tower_layer::Layer;
use tower_service::Service;

use crate::layer::{OwnedKey, RequestKey, is_grpc, key_of};
use crate::response::Rejection;
use crate::{ClientIpResolver, KeyExtractor, OnError, RateLimitBody, RequestInfo};

/// What a request finding its key full does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnFull {
    /// Answer `429` at once with `Retry-After: 1` ("soon": a permit comes back when any request
    /// of the key ends, which no store can foresee). The default.
    Reject,
    /// Wait for a permit, up to `deadline`, then answer `429`; at most `max_waiting` requests
    /// of this layer wait at once (any more are answered `429` at once). A waiting request
    /// tries again when a request of this instance ends, and at least every 50 ms (a permit
    /// given back by another instance is seen on the next try).
    Queue {
        /// The most requests waiting at once.
        max_waiting: usize,
        /// The longest a request waits.
        deadline: Duration,
    },
}

/// The longest a queued request waits before it tries again.
const QUEUE_POLL: Duration = Duration::from_millis(50);

struct Config {
    store: Arc<dyn PermitStore>,
    state: StateName,
    limit: PermitLimit,
    key: KeyExtractor,
    client_ip: ClientIpResolver,
    on_full: OnFull,
    on_error: OnError,
    timeout: Option<Duration>,
    observer: Arc<dyn Observer>,
    /// Requests waiting in the queue.
    waiting: AtomicUsize,
    /// Signalled when a request of this layer gives its permit back.
    released: Notify,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight")
            .field("state", &self.state)
            .field("limit", &self.limit)
            .field("key", &self.key)
            .field("on_full", &self.on_full)
            .field("on_error", &self.on_error)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A tower [`Layer`] that holds every key to at most `max_in_flight` requests at once.
///
/// Per request: the key is found as [`RateLimitLayer`](crate::RateLimitLayer) finds it; a
/// permit, asked within the [timeout](InFlightLayerBuilder::timeout), is held until the response
/// ends or is dropped. Full: [`OnFull`]. A store error or timeout: [`OnError`] (fail open lets
/// the request through without a permit). No peer address for a key that needs it: `500`.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use axum::{Router, routing::get};
/// use distlimit_core::PermitLimit;
/// use distlimit_memory::MemoryStore;
/// use distlimit_tower::{InFlightLayer, KeyExtractor, OnFull};
/// use http::HeaderName;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Any `PermitStore`: a `RedisStore` shares the limit between instances.
/// let store = Arc::new(MemoryStore::new());
/// let layer = InFlightLayer::builder(store, "generate", PermitLimit::new(4, Duration::from_secs(30))?)?
///     .key(KeyExtractor::header(HeaderName::from_static("x-user-id")))
///     .on_full(OnFull::Queue { max_waiting: 100, deadline: Duration::from_secs(2) })
///     .build();
/// let app: Router = Router::new().route("/generate", get(|| async { "done" }).route_layer(layer));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct InFlightLayer {
    config: Arc<Config>,
}

/// Configures an [`InFlightLayer`].
#[derive(Debug)]
pub struct InFlightLayerBuilder {
    config: Config,
}

impl InFlightLayer {
    /// A builder: permits of `store` under the state named `policy`, held to `limit`.
    ///
    /// # Errors
    ///
    /// A policy name longer than [`MAX_POLICY_LEN`](distlimit_core::MAX_POLICY_LEN).
    pub fn builder<S: PermitStore + 'static>(
        store: Arc<S>,
        policy: &str,
        limit: PermitLimit,
    ) -> Result<InFlightLayerBuilder, distlimit_core::KeyError> {
        Ok(InFlightLayerBuilder {
            config: Config {
                store,
                state: StateName::new(policy)?,
                limit,
                key: KeyExtractor::client_ip(),
                client_ip: ClientIpResolver::default(),
                on_full: OnFull::Reject,
                on_error: OnError::default(),
                timeout: Some(crate::DEFAULT_TIMEOUT),
                observer: Arc::new(NoopObserver),
                waiting: AtomicUsize::new(0),
                released: Notify::new(),
            },
        })
    }
}

impl InFlightLayerBuilder {
    /// Which bytes of a request name its key (the client IP by default).
    pub fn key(mut self, key: KeyExtractor) -> Self {
        self.config.key = key;
        self
    }

    /// How the client IP is found (no trusted proxies by default).
    pub fn client_ip(mut self, resolver: ClientIpResolver) -> Self {
        self.config.client_ip = resolver;
        self
    }

    /// What a request finding its key full does ([`OnFull::Reject`] by default).
    pub fn on_full(mut self, on_full: OnFull) -> Self {
        self.config.on_full = on_full;
        self
    }

    /// What a store error or timeout does (fail closed with `503` by default).
    pub fn on_error(mut self, on_error: OnError) -> Self {
        self.config.on_error = on_error;
        self
    }

    /// The longest one acquire may take ([`DEFAULT_TIMEOUT`](crate::DEFAULT_TIMEOUT) by
    /// default; `None`: no limit). A queued request's wait is its deadline, not this.
    pub fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.config.timeout = timeout;
        self
    }

    /// Where permit events go ([`Observer::on_permits`]: acquired, rejected, released,
    /// expired, under the layer's state name); none by default.
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.config.observer = observer;
        self
    }

    /// The layer.
    pub fn build(self) -> InFlightLayer {
        InFlightLayer {
            config: Arc::new(self.config),
        }
    }
}

impl<Inner> Layer<Inner> for InFlightLayer {
    type Service = InFlight<Inner>;

    fn layer(&self, inner: Inner) -> Self::Service {
        InFlight {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`InFlightLayer`] wraps around `Inner`.
#[derive(Clone, Debug)]
pub struct InFlight<Inner> {
    inner: Inner,
    config: Arc<Config>,
}

/// The future of an [`InFlight`] service's response.
pub type InFlightFuture<ResBody, E> =
    Pin<Box<dyn Future<Output = Result<Response<InFlightBody<ResBody>>, E>> + Send>>;

impl<Inner, ReqBody, ResBody> Service<Request<ReqBody>> for InFlight<Inner>
where
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    Inner::Future: Send,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<InFlightBody<ResBody>>;
    type Error = Inner::Error;
    type Future = InFlightFuture<ResBody, Inner::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let config = Arc::clone(&self.config);
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let grpc = is_grpc(req.headers());
        let info = RequestInfo::of(&req).resolved(&config.client_ip);
        let reject =
            move |rejection: Rejection| rejection.into_response(grpc).map(InFlightBody::plain);
        let Some(key) = key_of(&config.key, &info).map(RequestKey::into_owned) else {
            let response = reject(Rejection::no_peer());
            return Box::pin(async move { Ok(response) });
        };
        Box::pin(async move {
            let guard = match config.acquire(&key).await {
                Acquired::Permit(permit) => Some(PermitGuard::start(config, key, permit)),
                Acquired::Full => {
                    config.report(PermitEvent::Rejected, 1);
                    return Ok(reject(Rejection::Full));
                }
                Acquired::Failed => match config.on_error {
                    OnError::FailOpen => None,
                    OnError::FailClosed { retry_after } => {
                        return Ok(reject(Rejection::Unavailable { retry_after }));
                    }
                },
            };
            let response = inner.call(req).await?;
            Ok(response.map(|body| InFlightBody {
                body: RateLimitBody::inner(body),
                guard,
            }))
        })
    }
}

enum Acquired {
    Permit(PermitId),
    Full,
    Failed,
}

impl Config {
    fn request<'a>(&'a self, key: &'a OwnedKey) -> Result<PermitRequest<'a>, Error> {
        Ok(PermitRequest::new(Key::new(key.as_bytes())?, self.limit).with_state(&self.state))
    }

    /// One acquire within the timeout.
    async fn try_acquire(&self, key: &OwnedKey) -> Result<PermitDecision, ()> {
        let request = self.request(key).map_err(|error| {
            tracing::warn!(%error, "distlimit-tower: bad concurrency-limit key");
        })?;
        let policy = self.state.as_str();
        let acquire = self.store.acquire(&request);
        let result = crate::layer::within(self.timeout, acquire, policy, "permit acquire")
            .await
            .ok_or(())?;
        let decision = result.map_err(|error| {
            tracing::warn!(policy, %error, "distlimit-tower: permit acquire failed");
        })?;
        self.report(PermitEvent::Expired, decision.expired().into());
        self.report(PermitEvent::Acquired, decision.is_allowed().into());
        Ok(decision)
    }

    fn report(&self, event: PermitEvent, count: u64) {
        if count > 0 {
            self.observer.on_permits(self.state.as_str(), event, count);
        }
    }

    async fn acquire(&self, key: &OwnedKey) -> Acquired {
        let first = match self.try_acquire(key).await {
            Ok(d) => d,
            Err(()) => return Acquired::Failed,
        };
        if let Some(permit) = first.permit() {
            return Acquired::Permit(permit);
        }
        let OnFull::Queue {
            max_waiting,
            deadline,
        } = self.on_full
        else {
            return Acquired::Full;
        };
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= max_waiting {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Acquired::Full;
        }
        let _waiting = Waiting(&self.waiting);
        let until = tokio::time::Instant::now() + deadline;
        let mut wait = first.retry_after().min(QUEUE_POLL);
        loop {
            let now = tokio::time::Instant::now();
            if now >= until {
                return Acquired::Full;
            }
            let sleep = tokio::time::sleep_until((now + wait).min(until));
            tokio::select! {
                () = sleep => {}
                () = self.released.notified() => {}
            }
            match self.try_acquire(key).await {
                Ok(d) => match d.permit() {
                    Some(permit) => return Acquired::Permit(permit),
                    None => wait = d.retry_after().min(QUEUE_POLL),
                },
                Err(()) => return Acquired::Failed,
            }
        }
    }
}

/// Counts a queued request out when it stops waiting, however it stops.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A held permit: renewed by a task while it lives, given back when dropped.
struct PermitGuard {
    config: Arc<Config>,
    key: Option<OwnedKey>,
    permit: PermitId,
    renew: Option<tokio::task::JoinHandle<()>>,
}

impl PermitGuard {
    fn start(config: Arc<Config>, key: OwnedKey, permit: PermitId) -> Self {
        let renew = tokio::runtime::Handle::try_current().ok().map(|runtime| {
            let (config, key) = (Arc::clone(&config), key.clone());
            runtime.spawn(async move {
                let every = config.limit.lease() / 3;
                loop {
                    tokio::time::sleep(every).await;
                    let Ok(request) = config.request(&key) else {
                        return;
                    };
                    match config.store.renew(&request, permit).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::warn!(
                                policy = %config.state.as_str(),
                                "distlimit-tower: a permit expired before its request ended"
                            );
                            return;
                        }
                        Err(error) => tracing::warn!(
                            policy = %config.state.as_str(),
                            %error,
                            "distlimit-tower: permit renew failed"
                        ),
                    }
                }
            })
        });
        Self {
            config,
            key: Some(key),
            permit,
            renew,
        }
    }
}

impl Drop for PermitGuard {
    fn drop(&mut self) {
        if let Some(renew) = self.renew.take() {
            renew.abort();
        }
        self.config.report(PermitEvent::Released, 1);
        let (Some(key), Ok(runtime)) = (self.key.take(), tokio::runtime::Handle::try_current())
        else {
            // No runtime to give it back on: the permit expires after its lease.
            return;
        };
        let (config, permit) = (Arc::clone(&self.config), self.permit);
        runtime.spawn(async move {
            if let Ok(request) = config.request(&key)
                && let Err(error) = config.store.release(&request, permit).await
            {
                tracing::warn!(
                    policy = %config.state.as_str(),
                    %error,
                    "distlimit-tower: permit release failed; it expires after its lease"
                );
            }
            config.released.notify_waiters();
        });
    }
}

pin_project_lite::pin_project! {
    /// The response body of an [`InFlight`] service: the inner body, holding the request's
    /// permit until it ends or is dropped; or the layer's own answer.
    pub struct InFlightBody<B> {
        #[pin]
        body: RateLimitBody<B>,
        guard: Option<PermitGuard>,
    }
}

impl<B> InFlightBody<B> {
    fn plain(body: RateLimitBody<B>) -> Self {
        Self { body, guard: None }
    }

    /// Whether the body still holds its request's permit.
    pub fn holds_permit(&self) -> bool {
        self.guard.is_some()
    }
}

impl<B> fmt::Debug for InFlightBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightBody")
            .field("holds_permit", &self.guard.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: Body<Data = Bytes>> Body for InFlightBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = this.body.poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = frame {
            // The body ended (or failed): the request is over.
            this.guard.take();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
