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
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

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
    /// connection (hyper's `header_read_timeout`). It bounds a client trickling its head.
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
        let limit = descriptor_limit().unwrap_or(usize::MAX);
        self.max_connections
            .min(limit.saturating_sub(RESERVED_DESCRIPTORS))
            .max(1)
    }
}

#[cfg(unix)]
fn descriptor_limit() -> Option<usize> {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    limit.current.and_then(|n| usize::try_from(n).ok())
}

#[cfg(not(unix))]
fn descriptor_limit() -> Option<usize> {
    None
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
    let cap = config.connection_cap();
    tracing::info!(
        "serving at most {cap} connections (header read {:?}, idle {:?}, shutdown {:?})",
        config.header_read_timeout,
        config.idle_timeout,
        config.shutdown_timeout
    );
    let permits = Arc::new(Semaphore::new(cap));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout);
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let mut backoff = MIN_ACCEPT_BACKOFF;
    tokio::pin!(shutdown);
    loop {
        // Reap finished connections so the set holds only live ones.
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = accept(&listener, &permits) => accepted,
        };
        let (stream, peer, permit) = match accepted {
            Ok(accepted) => {
                backoff = MIN_ACCEPT_BACKOFF;
                accepted
            }
            Err(error) if is_connection_error(&error) => {
                tracing::debug!("accept: {error}");
                continue;
            }
            Err(error) => {
                tracing::warn!("accept: {error}; retrying in {backoff:?}");
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new());
        let io = TokioIo::new(Tracked {
            stream,
            activity: activity.clone(),
        });
        let service = InFlight {
            inner: TowerToHyperService::new(router.clone()),
            peer,
            activity: activity.clone(),
        };
        let conn = graceful.watch(http.serve_connection(io, service));
        let idle = config.idle_timeout;
        connections.spawn(async move {
            tokio::select! {
                served = conn => {
                    if let Err(error) = served {
                        tracing::debug!("connection from {peer}: {error}");
                    }
                }
                () = activity.idle_for(idle) => {
                    tracing::debug!("connection from {peer}: idle for {idle:?}, closed");
                }
            }
            drop(permit);
        });
    }
    drop(listener);
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

/// Waits for a free connection slot, then accepts. Without a slot the listener is not polled,
/// so new connections wait in the kernel's accept backlog.
async fn accept(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
) -> io::Result<(TcpStream, SocketAddr, tokio::sync::OwnedSemaphorePermit)> {
    let permit = permits
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| io::Error::other("connection slots closed"))?;
    let (stream, peer) = listener.accept().await?;
    Ok((stream, peer, permit))
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

/// How much a connection has done, and how many of its requests are in progress.
struct Activity {
    /// Reads and writes that moved at least one byte, and requests that ended: a counter, not
    /// a clock, so that the hot path reads no time.
    events: AtomicU64,
    in_flight: AtomicUsize,
}

/// The idle timeout is checked this many times per period: a silent connection is closed
/// between 1 and 1 + 1/`IDLE_CHECKS` idle periods after its last activity.
const IDLE_CHECKS: u32 = 4;

impl Activity {
    fn new() -> Self {
        Self {
            events: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }

    /// Completes once no request has been in progress and nothing has moved for `idle`.
    async fn idle_for(&self, idle: Duration) {
        let tick = idle / IDLE_CHECKS;
        let mut seen = self.events.load(Ordering::Relaxed);
        let mut quiet = 0;
        loop {
            tokio::time::sleep(tick).await;
            let now = self.events.load(Ordering::Relaxed);
            if now != seen || self.in_flight.load(Ordering::Relaxed) > 0 {
                (seen, quiet) = (now, 0);
                continue;
            }
            quiet += 1;
            if quiet >= IDLE_CHECKS {
                return;
            }
        }
    }
}

/// A TCP stream that records its activity.
struct Tracked {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
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
/// `ConnectInfo`) and counts the requests in progress on the connection's [`Activity`].
struct InFlight<S> {
    inner: S,
    peer: SocketAddr,
    activity: Arc<Activity>,
}

impl<S> hyper::service::Service<hyper::Request<Incoming>> for InFlight<S>
where
    S: hyper::service::Service<hyper::Request<Incoming>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Counted<S::Future>;

    fn call(&self, mut request: hyper::Request<Incoming>) -> Self::Future {
        request.extensions_mut().insert(ConnectInfo(self.peer));
        self.activity.in_flight.fetch_add(1, Ordering::Relaxed);
        Counted {
            inner: self.inner.call(request),
            guard: InFlightGuard(self.activity.clone()),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`InFlight`]: the request is in progress until it completes or
    /// is dropped.
    struct Counted<F> {
        #[pin]
        inner: F,
        guard: InFlightGuard,
    }
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().inner.poll(cx)
    }
}

struct InFlightGuard(Arc<Activity>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Completes at Ctrl-C (SIGINT) or SIGTERM. The handlers are installed when this is called, not
/// when the future is first polled, so a signal right after the service logs that it listens is
/// not lost (nor does it kill the process). A signal that cannot be listened to is never
/// awaited. Needs a Tokio runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt()).ok();
        let mut terminate = signal(SignalKind::terminate()).ok();
        async move {
            let interrupt = async {
                match &mut interrupt {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let terminate = async {
                match &mut terminate {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = interrupt => {}
                () = terminate => {}
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
