//! [`DelayProxy`]: a loopback TCP forwarder that delays every byte by a configurable one-way
//! time, and can cut the link and restore it: the distance and the partition between regions,
//! with real sockets.
//!
//! Each accepted connection gets its own connection to the upstream address. Bytes read on
//! either side are stamped when read and written to the other side `delay` later, in order, so
//! the link adds `delay` each way without bounding its throughput (a pipelined client still
//! gets many requests in flight, as over a long link).
//!
//! [`cut`](DelayProxy::cut) closes every open connection and black-holes new ones: they are
//! accepted but nothing is forwarded, so a client waits for its own timeout, as across a
//! partition. [`restore`](DelayProxy::restore) closes those and forwards again.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

struct Link {
    delay_us: AtomicU64,
    cut: AtomicBool,
    /// Bumped at every cut and restore: connections of an older epoch close.
    epoch: watch::Sender<u64>,
    /// Connections accepted in total.
    accepted: AtomicU64,
}

/// A delaying, cuttable TCP forwarder on a free loopback port: see the
/// [module documentation](self). Dropping it stops it and closes its connections.
pub struct DelayProxy {
    addr: SocketAddr,
    link: Arc<Link>,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for DelayProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelayProxy")
            .field("addr", &self.addr)
            .field("delay", &self.delay())
            .field("cut", &self.is_cut())
            .finish_non_exhaustive()
    }
}

impl DelayProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream` (a loopback address),
    /// delaying each direction by `one_way`. Must be called inside a Tokio runtime with I/O and
    /// time enabled.
    pub async fn start(upstream: SocketAddr, one_way: Duration) -> io::Result<Self> {
        if !upstream.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the delay proxy forwards to loopback addresses only",
            ));
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (epoch, _) = watch::channel(0);
        let link = Arc::new(Link {
            delay_us: AtomicU64::new(micros(one_way)),
            cut: AtomicBool::new(false),
            epoch,
            accepted: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, upstream, link.clone()));
        Ok(Self { addr, link, accept })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://` and the address: the URL of the Redis server behind the proxy.
    pub fn redis_url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The one-way delay now.
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.link.delay_us.load(Ordering::Relaxed))
    }

    /// Sets the one-way delay, for bytes read from now on.
    pub fn set_delay(&self, one_way: Duration) {
        self.link.delay_us.store(micros(one_way), Ordering::Relaxed);
    }

    /// Cuts the link: closes every open connection, and black-holes new ones until
    /// [`restore`](Self::restore).
    pub fn cut(&self) {
        self.link.cut.store(true, Ordering::SeqCst);
        self.link.epoch.send_modify(|e| *e += 1);
    }

    /// Restores the link: closes the black-holed connections, and forwards new ones.
    pub fn restore(&self) {
        self.link.cut.store(false, Ordering::SeqCst);
        self.link.epoch.send_modify(|e| *e += 1);
    }

    /// Whether the link is cut.
    pub fn is_cut(&self) -> bool {
        self.link.cut.load(Ordering::SeqCst)
    }

    /// Connections accepted since the proxy started.
    pub fn accepted(&self) -> u64 {
        self.link.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Every connection closes at an epoch change; the accept loop is gone, so none opens.
        self.link.epoch.send_modify(|e| *e += 1);
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, link: Arc<Link>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors or similar: wait instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        link.accepted.fetch_add(1, Ordering::Relaxed);
        let mut epoch = link.epoch.subscribe();
        epoch.mark_unchanged();
        let link = link.clone();
        tokio::spawn(async move {
            if link.cut.load(Ordering::SeqCst) {
                // Black-holed: held open, nothing forwarded, until the next cut or restore.
                let _ = epoch.changed().await;
                drop(client);
                return;
            }
            tokio::select! {
                _ = forward(client, upstream, &link) => {}
                _ = epoch.changed() => {}
            }
        });
    }
}

/// Forwards one connection both ways until either side closes.
async fn forward(client: TcpStream, upstream: SocketAddr, link: &Arc<Link>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        _ = pump(client_read, server_write, link.clone()) => {}
        _ = pump(server_read, client_write, link.clone()) => {}
    }
}

/// Copies `from` to `to`, each chunk written its delay after it was read.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, link: Arc<Link>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let delay = Duration::from_micros(link.delay_us.load(Ordering::Relaxed));
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    };
    // The reader ends first at EOF; the writer then drains what is queued and ends.
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(addr: SocketAddr) -> io::Result<Duration> {
        let mut s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        let start = Instant::now();
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"ping");
        Ok(start.elapsed())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn delays_both_ways_cuts_and_restores() {
        let proxy = DelayProxy::start(echo_server().await, Duration::from_millis(20))
            .await
            .unwrap();
        // Two delays per round trip (a lower bound: the proxy never forwards early).
        let rtt = round_trip(proxy.addr()).await.unwrap();
        assert!(rtt >= Duration::from_millis(40), "{rtt:?}");

        proxy.cut();
        let cut = tokio::time::timeout(Duration::from_millis(300), round_trip(proxy.addr())).await;
        assert!(cut.is_err(), "a cut link answered: {cut:?}");

        proxy.restore();
        proxy.set_delay(Duration::ZERO);
        round_trip(proxy.addr()).await.unwrap();
        assert!(proxy.accepted() >= 3);

        let far = DelayProxy::start("10.0.0.1:6379".parse().unwrap(), Duration::ZERO).await;
        assert!(far.is_err(), "only loopback upstreams");
    }
}
