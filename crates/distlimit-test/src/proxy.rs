//! [`Proxy`]: a TCP proxy on loopback for fault tests.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// Read buffer of one direction of one connection.
const CHUNK: usize = 64 * 1024;

/// How often a waiting writer looks at the shared state again (a cut, a release, a new delay
/// also wake it at once).
const TICK: Duration = Duration::from_millis(20);

/// A TCP proxy on loopback for fault tests: it forwards every connection it accepts
/// to one upstream address, and can add a delay in either direction, hold the bytes (buffer
/// them, forwarding nothing, until released), and cut every connection (dropping what it
/// buffered).
///
/// Plain threads and blocking sockets (two per connection), so it runs under any runtime or
/// none. Everything stops when it is dropped.
///
/// ```no_run
/// use std::time::Duration;
/// use distlimit_test::Proxy;
///
/// # fn main() -> std::io::Result<()> {
/// let upstream = "127.0.0.1:7000".parse().unwrap();
/// let proxy = Proxy::start(upstream)?;
/// // Clients connect to `proxy.addr()` instead of `upstream`.
/// proxy.set_delays(Duration::ZERO, Duration::from_millis(40)); // upstream's bytes arrive late
/// proxy.hold(); // nothing more is forwarded…
/// proxy.release(); // …until now
/// proxy.cut(); // every connection closed, buffered bytes dropped
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Added to the bytes going to the upstream.
    to_upstream: Duration,
    /// Added to the bytes going back to the client.
    to_client: Duration,
    held: bool,
    /// Bumped by every cut: writers of an older generation drop what they hold and end.
    generation: u64,
    /// Both sockets of every connection of the current generation, to shut down on a cut.
    sockets: Vec<TcpStream>,
    /// Connections accepted since the start.
    accepted: u64,
    stopped: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Proxy {
    /// Listens on a free loopback port and forwards each connection to `upstream` (connected
    /// when the client connects; a client whose upstream refuses is closed at once).
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    pub fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let accepting = Arc::clone(&shared);
        thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || accept(&listener, upstream, &accepting))?;
        Ok(Self { addr, shared })
    }

    /// [`start`](Self::start), then [`set_delay`](Self::set_delay)`(one_way)`: a link of
    /// `one_way` each way (the distance between two regions).
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    pub fn with_delay(upstream: SocketAddr, one_way: Duration) -> io::Result<Self> {
        let proxy = Self::start(upstream)?;
        proxy.set_delay(one_way);
        Ok(proxy)
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://` and [`addr`](Self::addr): the URL of the Redis server behind the proxy.
    pub fn redis_url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Connections accepted since the start.
    pub fn accepted(&self) -> u64 {
        self.shared.lock().accepted
    }

    /// Delays every byte by `delay` in both directions, from when it is read to when it is
    /// written on (bytes read before the change get the new delay too). Order is kept.
    pub fn set_delay(&self, delay: Duration) {
        self.set_delays(delay, delay);
    }

    /// Delays the bytes going to the upstream by `to_upstream` and those coming back from it by
    /// `to_client`.
    pub fn set_delays(&self, to_upstream: Duration, to_client: Duration) {
        let mut state = self.shared.lock();
        state.to_upstream = to_upstream;
        state.to_client = to_client;
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Stops forwarding in both directions: the bytes read are buffered (the connections stay
    /// open) until [`release`](Self::release), or dropped by [`cut`](Self::cut).
    pub fn hold(&self) {
        self.shared.lock().held = true;
    }

    /// Forwards again, the held bytes first (each still at least its delay after it was read).
    pub fn release(&self) {
        self.shared.lock().held = false;
        self.shared.changed.notify_all();
    }

    /// Closes every connection open now, both sides, and drops every byte read and not yet
    /// written on. New connections are accepted as before (and forwarded unless held).
    pub fn cut(&self) {
        let mut state = self.shared.lock();
        state.generation += 1;
        for socket in state.sockets.drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Partitions the link: [`hold`](Self::hold), then [`cut`](Self::cut). Every open
    /// connection is closed, and new ones are accepted but black-holed (nothing forwarded), so a
    /// client waits for its own timeout, as across a partition; until [`heal`](Self::heal).
    pub fn partition(&self) {
        self.hold();
        self.cut();
    }

    /// Heals a [`partition`](Self::partition): closes the black-holed connections (dropping what
    /// they held, which the partition lost) and forwards new ones.
    pub fn heal(&self) {
        self.cut();
        self.release();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.shared.lock().stopped = true;
        // Wakes the accepting thread, which then sees `stopped`.
        let _ = TcpStream::connect(self.addr);
    }
}

fn accept(listener: &TcpListener, upstream: SocketAddr, shared: &Arc<Shared>) {
    for client in listener.incoming() {
        if shared.lock().stopped {
            return;
        }
        let Ok(client) = client else { continue };
        let Ok(server) = TcpStream::connect(upstream) else {
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let generation = {
            let mut state = shared.lock();
            state.accepted += 1;
            match (client.try_clone(), server.try_clone()) {
                (Ok(c), Ok(s)) => state.sockets.extend([c, s]),
                _ => continue,
            }
            state.generation
        };
        for (from, to, up) in [(&client, &server, true), (&server, &client, false)] {
            let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                continue;
            };
            pump(from, to, up, generation, shared);
        }
    }
}

/// Forwards `from` to `to` (toward the upstream when `up`): a reader thread stamps each chunk
/// with when it was read, a writer thread writes it on once its delay has passed and the proxy
/// does not hold.
fn pump(mut from: TcpStream, to: TcpStream, up: bool, generation: u64, shared: &Arc<Shared>) {
    let (sender, chunks) = mpsc::channel::<(Instant, Vec<u8>)>();
    let _ = thread::Builder::new()
        .name("proxy-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if sender.send((Instant::now(), buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    let shared = Arc::clone(shared);
    let _ = thread::Builder::new()
        .name("proxy-write".into())
        .spawn(move || write_on(&chunks, to, up, generation, &shared));
}

fn write_on(
    chunks: &Receiver<(Instant, Vec<u8>)>,
    mut to: TcpStream,
    up: bool,
    generation: u64,
    shared: &Shared,
) {
    loop {
        let (read_at, bytes) = match chunks.recv_timeout(TICK) {
            Ok(chunk) => chunk,
            Err(RecvTimeoutError::Timeout) => {
                if shared.lock().generation != generation {
                    return;
                }
                continue;
            }
            // The reader ended (end of stream, or a cut): pass the end on.
            Err(RecvTimeoutError::Disconnected) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
        };
        // Wait for the chunk's time, and while held; a cut drops it.
        let mut state = shared.lock();
        loop {
            if state.generation != generation {
                return;
            }
            let delay = if up {
                state.to_upstream
            } else {
                state.to_client
            };
            let due = read_at + delay;
            let now = Instant::now();
            if !state.held && now >= due {
                break;
            }
            let wait = if state.held {
                TICK
            } else {
                (due - now).min(TICK)
            };
            state = shared
                .changed
                .wait_timeout(state, wait)
                .map(|(s, _)| s)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        drop(state);
        if to.write_all(&bytes).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback; returns its address.
    fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while let Ok(n @ 1..) = conn.read(&mut buf) {
                        if conn.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn round_trip(conn: &mut TcpStream, bytes: &[u8]) -> io::Result<Duration> {
        let start = Instant::now();
        conn.write_all(bytes)?;
        let mut got = vec![0u8; bytes.len()];
        conn.read_exact(&mut got)?;
        assert_eq!(got, bytes);
        Ok(start.elapsed())
    }

    #[test]
    fn forwards_delays_holds_and_cuts() {
        let proxy = Proxy::start(echo()).unwrap();
        let mut conn = TcpStream::connect(proxy.addr()).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        round_trip(&mut conn, b"hello").unwrap();
        assert_eq!(proxy.accepted(), 1);

        proxy.set_delays(Duration::from_millis(30), Duration::from_millis(50));
        let took = round_trip(&mut conn, b"slow").unwrap();
        assert!(took >= Duration::from_millis(80), "{took:?}");
        proxy.set_delay(Duration::ZERO);

        // Held: nothing comes back until released.
        proxy.hold();
        conn.write_all(b"held").unwrap();
        conn.set_read_timeout(Some(Duration::from_millis(150)))
            .unwrap();
        let mut buf = [0u8; 4];
        assert!(
            conn.read_exact(&mut buf).is_err(),
            "held bytes came through"
        );
        proxy.release();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"held");

        // Cut while held: the held bytes are dropped and the connection closed.
        proxy.hold();
        conn.write_all(b"lost").unwrap();
        thread::sleep(Duration::from_millis(50));
        proxy.cut();
        proxy.release();
        let mut rest = Vec::new();
        let _ = conn.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{rest:?}");

        // A new connection works.
        let mut again = TcpStream::connect(proxy.addr()).unwrap();
        again
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        round_trip(&mut again, b"again").unwrap();
        assert_eq!(proxy.accepted(), 2);
    }
}
