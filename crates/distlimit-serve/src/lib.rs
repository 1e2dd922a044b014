#![doc = include_str!("../README.md")]
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};

#[cfg(feature = "cli")]
mod args;
mod coalesce;
#[cfg(feature = "cli")]
pub use crate::args::{MAX_TIMEOUT_MS, ServeArgs};
pub use crate::coalesce::CoalesceWrites;
#[cfg(feature = "logging")]
pub mod logging;
// The one file poller (`distlimit-policy`'s): every file a binary reloads runs through it.
pub use distlimit_policy::{FileWatcher, Reload, Reloadable, poll_files};
#[cfg(feature = "store")]
pub mod store;
#[cfg(feature = "tls")]
mod tls;
#[cfg(feature = "tls")]
pub use crate::tls::{Alpn, MAX_TLS_FILE_BYTES, Tls, TlsError, TlsFiles, TlsReload, TlsWatcher};
/// The stream of a connection after its TLS handshake (tokio-rustls'), from [`Tls::accept`].
#[cfg(feature = "tls")]
pub type TlsConnection = tokio_rustls::server::TlsStream<Connection>;

/// The TLS of [`serve_inner`]: none without the `tls` feature.
#[cfg(feature = "tls")]
type MaybeTls = Option<Tls>;
#[cfg(not(feature = "tls"))]
type MaybeTls = Option<NoTls>;
/// No TLS, without the `tls` feature.
#[cfg(not(feature = "tls"))]
#[derive(Clone, Debug)]
enum NoTls {}

/// Default of [`ServeConfig::header_read_timeout`]: 10 s.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`ServeConfig::idle_timeout`]: 5 s.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default of [`ServeConfig::max_connections`]: 10 000 (lowered to fit the descriptor limit).
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Default of [`ServeConfig::shutdown_timeout`]: 10 s.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Descriptors kept out of the connection cap for everything else the process opens (standard
/// streams, the runtime's epoll and wakers, Redis connections, the policy file).
pub const RESERVED_DESCRIPTORS: usize = 64;

/// The first wait after an accept error that a retry cannot fix at once (out of descriptors or
/// memory); it doubles up to [`MAX_ACCEPT_BACKOFF`] while the errors last.
const MIN_ACCEPT_BACKOFF: Duration = Duration::from_millis(10);
/// The longest wait between accept attempts after errors.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// The limits of [`serve`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServeConfig {
    /// A request's head (request line and headers) must be complete within this time of the
    /// connection starting to wait for it: at accept, and after each response on a keep-alive
    /// connection. It bounds a client trickling its head. A connection on which no request has
    /// started this long after accept is closed, whatever the protocol (an HTTP/2 client that
    /// connects and never sends a request), so that a long
    /// [`idle_timeout`](Self::idle_timeout) never lets silent sockets hold slots. Checked by
    /// the connection's idle timer: after a response, a head not complete is cut between 1 and
    /// 1.25 times this later; at accept, at this time exactly.
    pub header_read_timeout: Duration,
    /// A connection with no request in progress on which no byte moves for this long is closed:
    /// an idle keep-alive connection, or a client that stalls mid-head. Behind a load balancer,
    /// set it (and `header_read_timeout`) above the balancer's own idle timeout.
    pub idle_timeout: Duration,
    /// At most this many connections are served at once; more wait in the listener's accept
    /// backlog until one closes. Lowered at start to the process's descriptor limit minus
    /// [`RESERVED_DESCRIPTORS`], so the process never runs out of descriptors.
    pub max_connections: usize,
    /// After the shutdown signal, requests in progress get this long to finish; then the
    /// remaining connections (idle or half-sent) are closed and [`serve`] returns.
    pub shutdown_timeout: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
        }
    }
}

impl ServeConfig {
    /// [`max_connections`](Self::max_connections) lowered to the descriptors this process may
    /// open (its soft `RLIMIT_NOFILE`) minus [`RESERVED_DESCRIPTORS`]; at least 1.
    pub fn connection_cap(&self) -> usize {
        #[cfg(unix)]
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        #[cfg(not(unix))]
        let limit: Option<u64> = None;
        let limit = limit.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
        self.max_connections
            .min(limit.saturating_sub(RESERVED_DESCRIPTORS))
            .max(1)
    }
}

/// Serves `router` on `listener` with the limits of `config` until `shutdown` completes; then
/// stops accepting, lets the requests in progress finish within
/// [`shutdown_timeout`](ServeConfig::shutdown_timeout), closes what is left and returns.
///
/// Each request carries axum's `ConnectInfo<SocketAddr>` (the socket peer). HTTP/1.1 only.
/// Accept errors never end the server: they are logged, and those a retry cannot fix at once
/// (such as running out of descriptors) back off from 10 ms to 1 s instead of spinning.
///
/// # Errors
///
/// None today: the result leaves room for errors of the listener that end serving.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_inner(listener, router, config, None, shutdown).await
}

/// [`serve`] over TLS (feature `tls`): each connection's handshake runs on the connection's own
/// task, within the [`header_read_timeout`](ServeConfig::header_read_timeout), with the
/// certificate `tls` holds when it starts (ALPN `http/1.1`); a failed handshake (a plaintext
/// client, an untrusted client certificate, a timeout) is logged at debug with the peer and
/// closes that connection only.
///
/// # Errors
///
/// None today, as [`serve`].
#[cfg(feature = "tls")]
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    config: ServeConfig,
    tls: Tls,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_inner(listener, router, config, Some(tls), shutdown).await
}

async fn serve_inner(
    listener: TcpListener,
    router: Router,
    config: ServeConfig,
    tls: MaybeTls,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    // Every handler turned into its route (layers applied) once, here: a `Router<()>` that was
    // not given its state builds each handler's service stack again for every request (axum's
    // boxed handlers), three allocations per request behind one `route_layer`.
    let router = router.with_state(());
    let mut acceptor = Acceptor::new(listener, &config);
    // HTTP/1.1 waits for a head whenever no request is in progress: a connection quiet for the
    // header read timeout is cut like an idle one.
    acceptor.idle_timeout = config.idle_timeout.min(config.header_read_timeout);
    // No hyper timer (a sleep armed and cancelled per request, see the crate documentation):
    // the connection's [`IdleCheck`] enforces the header read timeout as well.
    let http = http1::Builder::new();
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        // Reap finished connections so the set holds only live ones.
        while connections.try_join_next().is_some() {}
        let connection = tokio::select! {
            () = &mut shutdown => break,
            connection = acceptor.accept() => connection,
        };
        let info = connection.info();
        let service = InFlight {
            inner: TowerToHyperService::new(router.clone()),
            info: info.clone(),
        };
        let watcher = graceful.watcher();
        let http = http.clone();
        #[cfg_attr(not(feature = "tls"), allow(unused_variables))]
        let handshake_timeout = config.header_read_timeout;
        let tls = tls.clone();
        connections.spawn(async move {
            let served = match tls {
                #[cfg(feature = "tls")]
                Some(tls) => match tls.accept(connection, Alpn::Http1, handshake_timeout).await {
                    Ok(stream) => {
                        watcher
                            .watch(http.serve_connection(TokioIo::new(stream), service))
                            .await
                    }
                    Err(error) => {
                        tracing::debug!("connection from {}: TLS handshake: {error}", info.peer);
                        return;
                    }
                },
                #[cfg(not(feature = "tls"))]
                Some(never) => match never {},
                None => {
                    watcher
                        .watch(http.serve_connection(TokioIo::new(connection), service))
                        .await
                }
            };
            if let Err(error) = served {
                tracing::debug!("connection from {}: {error}", info.peer);
            }
        });
    }
    drop(acceptor);
    let in_progress = connections.len();
    if in_progress > 0 {
        tracing::info!(
            "stopping: {in_progress} connections open, waiting at most {:?} for their requests",
            config.shutdown_timeout
        );
    }
    if tokio::time::timeout(config.shutdown_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "stopping: {} connections still open after {:?}, closed",
            connections.len(),
            config.shutdown_timeout
        );
    }
    connections.shutdown().await;
    Ok(())
}

/// Accepts connections under the limits of a [`ServeConfig`]: at most its connection cap open
/// at once (further clients wait in the kernel's accept backlog), accept errors logged and
/// retried with a backoff, and each [`Connection`] closed once idle. [`serve`] runs on it; a
/// server of another protocol (the gRPC port of `distlimit-server`) uses it directly.
#[derive(Debug)]
pub struct Acceptor {
    listener: TcpListener,
    permits: Arc<Semaphore>,
    idle_timeout: Duration,
    header_read_timeout: Duration,
    backoff: Duration,
}

impl Acceptor {
    /// Accepts on `listener` with the cap ([`ServeConfig::connection_cap`]) and idle timeout of
    /// `config`.
    pub fn new(listener: TcpListener, config: &ServeConfig) -> Self {
        let cap = config.connection_cap();
        tracing::info!(
            "serving at most {cap} connections (header read {:?}, idle {:?}, shutdown {:?})",
            config.header_read_timeout,
            config.idle_timeout,
            config.shutdown_timeout
        );
        Self {
            listener,
            permits: Arc::new(Semaphore::new(cap)),
            idle_timeout: config.idle_timeout,
            header_read_timeout: config.header_read_timeout,
            backoff: MIN_ACCEPT_BACKOFF,
        }
    }

    /// The next connection, once fewer than the cap are open. Errors are logged, never
    /// returned: those of one connection are skipped, the others (out of descriptors or memory)
    /// retried after a pause that doubles from 10 ms to 1 s while they last. Cancel-safe.
    pub async fn accept(&mut self) -> Connection {
        loop {
            // Without a slot the listener is not polled: new clients wait in the backlog.
            let Ok(permit) = self.permits.clone().acquire_owned().await else {
                // The semaphore is never closed; wait as if it were full.
                return std::future::pending().await;
            };
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    self.backoff = MIN_ACCEPT_BACKOFF;
                    let _ = stream.set_nodelay(true);
                    return Connection {
                        stream,
                        info: ConnectionInfo {
                            peer,
                            activity: Arc::default(),
                        },
                        idle: IdleCheck::new(self.idle_timeout, self.header_read_timeout),
                        _permit: permit,
                    };
                }
                Err(error) if is_connection_error(&error) => {
                    tracing::debug!("accept: {error}");
                }
                Err(error) => {
                    tracing::warn!("accept: {error}; retrying in {:?}", self.backoff);
                    drop(permit);
                    tokio::time::sleep(self.backoff).await;
                    self.backoff = (self.backoff * 2).min(MAX_ACCEPT_BACKOFF);
                }
            }
        }
    }
}

/// Errors of one connection that the peer caused; the next accept is unaffected.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// What a connection's requests share: its peer and its count of requests in progress.
/// Requests mark themselves with [`ConnectionInfo::start_request`], or through
/// [`TrackRequestsLayer`] when the info is in their extensions.
#[derive(Clone, Debug)]
pub struct ConnectionInfo {
    /// The socket peer.
    pub peer: SocketAddr,
    activity: Arc<Activity>,
}

impl ConnectionInfo {
    /// Marks a request in progress on this connection until the guard is dropped: the
    /// connection is not idle meanwhile.
    pub fn start_request(&self) -> RequestGuard {
        self.activity.touch();
        self.activity.in_flight.fetch_add(1, Ordering::Relaxed);
        RequestGuard(self.activity.clone())
    }
}

/// A request in progress on its connection (see [`ConnectionInfo::start_request`]).
#[derive(Debug)]
pub struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An accepted TCP connection that holds one of its [`Acceptor`]'s slots until dropped, and
/// ends itself (its reads return end of file) once no request has been in progress on it, and
/// none started or ended, for the idle timeout, or when no request has started within the
/// header read timeout of accept. Bytes alone do not count: a client trickling a request that
/// never starts, or pinging, is idle.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    info: ConnectionInfo,
    idle: IdleCheck,
    _permit: OwnedSemaphorePermit,
}

impl Connection {
    /// The peer and the request count, to hand to the connection's requests.
    pub fn info(&self) -> ConnectionInfo {
        self.info.clone()
    }
}

/// How many requests a connection has started and ended, and how many are in progress.
#[derive(Debug, Default)]
struct Activity {
    /// Requests started and ended: a counter, not a clock, so that the hot path reads no time.
    events: AtomicU64,
    in_flight: AtomicUsize,
}

impl Activity {
    fn touch(&self) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }
}

/// The idle timeout is checked this many times per period: a silent connection is closed
/// between 1 and 1 + 1/`IDLE_CHECKS` idle periods after its last activity.
const IDLE_CHECKS: u32 = 4;

/// The idle timeout of a [`Connection`], checked when its reads are polled: a timer that fires
/// [`IDLE_CHECKS`] times per period (one clock read per check, none per read), and at the first
/// request's deadline while no request has started.
#[derive(Debug)]
struct IdleCheck {
    timer: Pin<Box<Sleep>>,
    /// The waker the timer holds, while it is pending since its last reset.
    armed: Option<std::task::Waker>,
    tick: Duration,
    seen: u64,
    quiet: u32,
    /// Until a request starts: when the connection is closed if none has (only when it comes
    /// before the idle timeout).
    first_request_by: Option<Instant>,
}

impl IdleCheck {
    /// Closes after `idle` without requests, or `first_request` after now if none has started.
    fn new(idle: Duration, first_request: Duration) -> Self {
        let tick = idle / IDLE_CHECKS;
        Self {
            timer: Box::pin(tokio::time::sleep(tick.min(first_request))),
            armed: None,
            tick,
            seen: 0,
            quiet: 0,
            first_request_by: (first_request < idle).then(|| Instant::now() + first_request),
        }
    }

    /// True once the connection has been idle for the whole period, or has started no request
    /// by the first request's deadline.
    fn poll_expired(&mut self, cx: &mut Context<'_>, activity: &Activity) -> bool {
        // Between checks, a pointer comparison and one atomic load when the timer, pending,
        // last registered this task's waker (a connection's reads are polled by one task).
        // Polling the `Sleep` on every read cost about 360 instructions each, twice per
        // request (callgrind).
        if self
            .armed
            .as_ref()
            .is_some_and(|waker| waker.will_wake(cx.waker()))
            && !self.timer.is_elapsed()
        {
            return false;
        }
        if self.timer.as_mut().poll(cx).is_pending() {
            self.arm(cx);
            return false;
        }
        let now = Instant::now();
        let events = activity.events.load(Ordering::Relaxed);
        let busy = activity.in_flight.load(Ordering::Relaxed) > 0;
        if let Some(deadline) = self.first_request_by {
            if events > 0 || busy {
                self.first_request_by = None;
            } else if now >= deadline {
                return true;
            }
        }
        if events != self.seen || busy {
            (self.seen, self.quiet) = (events, 0);
        } else {
            self.quiet += 1;
        }
        if self.quiet >= IDLE_CHECKS {
            return true;
        }
        // From now, not from the last deadline: a check late by a long request counts once.
        let next = now + self.tick;
        let next = self.first_request_by.map_or(next, |first| next.min(first));
        self.timer.as_mut().reset(next);
        // Registers the waker for the next check.
        self.armed = None;
        if self.timer.as_mut().poll(cx).is_pending() {
            self.arm(cx);
        }
        false
    }

    /// Notes that the pending timer holds the waker of `cx`.
    fn arm(&mut self, cx: &Context<'_>) {
        match &mut self.armed {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            armed => *armed = Some(cx.waker().clone()),
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.idle.poll_expired(cx, &this.info.activity) {
            tracing::debug!("connection from {}: idle, closed", this.info.peer);
            // End of file: the protocol closes the connection.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A hyper service that gives each request its connection's peer address (axum's
/// `ConnectInfo`) and counts it in progress on the connection.
struct InFlight<S> {
    inner: S,
    info: ConnectionInfo,
}

impl<S> hyper::service::Service<hyper::Request<Incoming>> for InFlight<S>
where
    S: hyper::service::Service<hyper::Request<Incoming>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Counted<S::Future>;

    fn call(&self, mut request: hyper::Request<Incoming>) -> Self::Future {
        request.extensions_mut().insert(ConnectInfo(self.info.peer));
        Counted {
            guard: self.info.start_request(),
            inner: self.inner.call(request),
        }
    }
}

pin_project_lite::pin_project! {
    /// A response future during which its request counts as in progress on its connection.
    #[derive(Debug)]
    struct Counted<F> {
        #[pin]
        inner: F,
        guard: RequestGuard,
    }
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().inner.poll(cx)
    }
}

/// A tower layer counting each request in progress on its connection, from the call until its
/// response body ends (a streaming response, such as a gRPC watch, stays in progress while it
/// streams), for servers (such as tonic's) that put the [`ConnectionInfo`] into the request's
/// extensions. A request without it passes uncounted.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrackRequestsLayer;

impl<S> tower_layer::Layer<S> for TrackRequestsLayer {
    type Service = TrackRequests<S>;

    fn layer(&self, inner: S) -> TrackRequests<S> {
        TrackRequests { inner }
    }
}

/// The service of [`TrackRequestsLayer`].
#[derive(Clone, Debug)]
pub struct TrackRequests<S> {
    inner: S,
}

impl<S, B, R> tower_service::Service<http::Request<B>> for TrackRequests<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>,
{
    type Response = http::Response<TrackedBody<R>>;
    type Error = S::Error;
    type Future = TrackedResponse<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let guard = request
            .extensions()
            .get::<ConnectionInfo>()
            .map(ConnectionInfo::start_request);
        TrackedResponse {
            inner: self.inner.call(request),
            guard,
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`TrackRequests`]: hands the request's guard to the body.
    #[derive(Debug)]
    pub struct TrackedResponse<F> {
        #[pin]
        inner: F,
        guard: Option<RequestGuard>,
    }
}

impl<F, R, E> Future for TrackedResponse<F>
where
    F: Future<Output = Result<http::Response<R>, E>>,
{
    type Output = Result<http::Response<TrackedBody<R>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx))?;
        let guard = this.guard.take();
        Poll::Ready(Ok(response.map(|inner| TrackedBody { inner, guard })))
    }
}

pin_project_lite::pin_project! {
    /// A response body during which its request counts as in progress, until it ends or is
    /// dropped.
    #[derive(Debug)]
    pub struct TrackedBody<B> {
        #[pin]
        inner: B,
        guard: Option<RequestGuard>,
    }
}

impl<B: http_body::Body> http_body::Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            // The response is complete: the request is no longer in progress.
            *this.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Reads the file at `path`, at most `limit` bytes: for files an operator points a server at
/// (configuration, certificates), which it reads again on every reload. A larger file, or a
/// path to something that never ends (`/dev/zero`), is an [`io::ErrorKind::InvalidData`] error
/// instead of memory exhausted or a reload that never returns.
///
/// # Errors
///
/// Those of opening and reading the file, and the one above.
pub fn read_at_most(path: &std::path::Path, limit: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {limit} bytes"),
        ));
    }
    Ok(bytes)
}

/// Counts SIGHUPs from now on, so the default action (ending the process at once, without
/// draining or a log line) never happens: each SIGHUP is logged at INFO with `what` it does,
/// and bumps the returned channel's value, which the file pollers of the binaries await to read
/// their files at once. Installed when called, like [`shutdown_signal`]; where SIGHUP cannot be
/// listened to (not Unix, or the handler cannot be installed) the value never changes. Needs a
/// Tokio runtime.
pub fn hangup_signal(what: &'static str) -> tokio::sync::watch::Receiver<u64> {
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(mut hangup) => {
                tokio::spawn(async move {
                    while hangup.recv().await.is_some() {
                        tracing::info!("SIGHUP: {what}");
                        tx.send_modify(|count| *count += 1);
                    }
                });
            }
            Err(error) => {
                tracing::warn!("SIGHUP cannot be handled: {error}");
                // Held forever so that receivers wait instead of seeing a closed channel.
                std::mem::forget(tx);
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = what;
        std::mem::forget(tx);
    }
    rx
}

/// Completes at Ctrl-C (SIGINT) or SIGTERM. The handlers are installed when this is called, not
/// when the future is first polled, so a signal right after the service logs that it listens is
/// not lost (nor does it kill the process). A signal that cannot be listened to is never
/// awaited. Needs a Tokio runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{Signal, SignalKind, signal};
        async fn next(signal: Option<&mut Signal>) {
            match signal {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        let mut interrupt = signal(SignalKind::interrupt()).ok();
        let mut terminate = signal(SignalKind::terminate()).ok();
        async move {
            tokio::select! {
                () = next(interrupt.as_mut()) => {}
                () = next(terminate.as_mut()) => {}
            }
        }
    }
    #[cfg(not(unix))]
    async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Sends `n` requests for `/` on one keep-alive connection, each answered 200 `ok`.
    async fn get_ok(stream: &mut TcpStream, n: usize) {
        let mut buf = vec![0u8; 1024];
        for _ in 0..n {
            stream
                .write_all(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n")
                .await
                .unwrap();
            let n = stream.read(&mut buf).await.unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
            assert!(buf[..n].ends_with(b"ok"));
        }
    }

    /// Serves `app` with `config` on a loopback port, and connects to it.
    async fn connect(app: Router, config: ServeConfig) -> TcpStream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, app, config, std::future::pending()));
        TcpStream::connect(addr).await.unwrap()
    }

    /// A layer that wraps nothing and counts how often it is applied.
    #[derive(Clone)]
    struct CountLayers(Arc<AtomicUsize>);

    impl<S> tower_layer::Layer<S> for CountLayers {
        type Service = S;

        fn layer(&self, inner: S) -> S {
            self.0.fetch_add(1, Ordering::Relaxed);
            inner
        }
    }

    /// A route's layers are applied once for the router, not once per request: a `Router<()>`
    /// that is not given its state rebuilds each handler's stack on every call (axum's boxed
    /// handlers), an allocation per layer and request.
    #[tokio::test]
    async fn route_layers_are_applied_once_not_per_request() {
        let applied = Arc::new(AtomicUsize::new(0));
        let app = Router::new().route(
            "/",
            axum::routing::get(|| async { "ok" }).route_layer(CountLayers(applied.clone())),
        );
        let before = applied.load(Ordering::Relaxed);
        let mut stream = connect(app, ServeConfig::default()).await;
        get_ok(&mut stream, 20).await;
        let during = applied.load(Ordering::Relaxed) - before;
        assert!(during <= 1, "applied {during} times for 20 requests");
    }

    /// After a response, a keep-alive connection whose next head never completes is closed by
    /// the connection's idle timer at the header read timeout (no hyper timer), however long
    /// the idle timeout; before, a complete request on it is served.
    #[tokio::test]
    async fn a_head_not_completed_within_the_header_read_timeout_is_cut() {
        let config = ServeConfig {
            header_read_timeout: Duration::from_millis(400),
            idle_timeout: Duration::from_secs(60),
            ..ServeConfig::default()
        };
        let app = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let mut stream = connect(app, config).await;
        get_ok(&mut stream, 3).await;
        let mut buf = vec![0u8; 1024];
        let answered = std::time::Instant::now();
        stream.write_all(b"GET / HTTP/1.1\r\nho").await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("closed within 5 s")
            .unwrap();
        let waited = answered.elapsed();
        assert_eq!(n, 0, "closed, no answer: {:?}", &buf[..n]);
        // Between 1 and 1.25 periods after the last response (plus a loaded machine's slack).
        assert!(waited >= Duration::from_millis(390), "{waited:?}");
        assert!(waited < Duration::from_secs(3), "{waited:?}");
    }
}
