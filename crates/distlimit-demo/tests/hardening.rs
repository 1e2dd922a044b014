//! The built `distlimit-demo` binary against clients that misbehave, over real sockets:
//! half-sent requests, idle connections, and SIGTERM while they are open.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use support::{DemoProcess, Http};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A request whose head never ends (no blank line).
const HALF_SENT: &[u8] = b"GET /api/data HTTP/1.1\r\nHost: demo\r\nX-User-ID: slow";

/// The usual default descriptor limit, given to the demo process.
const DEMO_NOFILE: u64 = 1024;

/// How many half-sent requests the test keeps open: more than the demo's 1 024 descriptors,
/// fewer if this test process itself may not open that many (its limit is never raised).
fn attackers() -> u64 {
    let own = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    let wanted = 1100;
    let fits = own.saturating_sub(200);
    if fits < wanted {
        eprintln!(
            "this process may open {own} descriptors: {fits} half-sent requests, not {wanted}"
        );
    }
    wanted.min(fits)
}

/// Keeps `count` half-sent requests open on `addr`: each task reconnects as soon as the server
/// closes its connection, until `stop`. Counts the requests sent and the connections the
/// server closed.
fn hold_half_sent(
    addr: SocketAddr,
    count: u64,
    stop: &Arc<AtomicBool>,
    sent: &Arc<AtomicU64>,
    closed: &Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..count)
        .map(|_| {
            let (stop, sent, closed) = (stop.clone(), sent.clone(), closed.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut conn) = TcpStream::connect(addr).await else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    // Once in the accept backlog the connection is established; the write lands
                    // in the kernel's buffers either way.
                    if conn.write_all(HALF_SENT).await.is_err() {
                        continue;
                    }
                    sent.fetch_add(1, Ordering::Relaxed);
                    let mut sink = [0_u8; 1024];
                    loop {
                        tokio::select! {
                            read = conn.read(&mut sink) => match read {
                                Ok(0) | Err(_) => {
                                    closed.fetch_add(1, Ordering::Relaxed);
                                    break;
                                }
                                Ok(_) => {}
                            },
                            () = tokio::time::sleep(Duration::from_millis(100)) => {
                                if stop.load(Ordering::Relaxed) {
                                    return;
                                }
                            }
                        }
                    }
                }
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_served_while_more_half_sent_requests_than_descriptors_are_open() {
    let demo = DemoProcess::start_with_nofile(DEMO_NOFILE, &["--header-read-timeout-ms", "2000"]);
    let count = attackers();
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, closed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let tasks = hold_half_sent(demo.addr, count, &stop, &sent, &closed);
    // All of them connected and sent their half request (at most 30 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    while sent.load(Ordering::Relaxed) < count {
        assert!(
            Instant::now() < deadline,
            "{} of {count} half-sent",
            sent.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let http = Http::new();
    let started = Instant::now();
    let reply = http.get(demo.addr, "/api/data", Some("legit")).await;
    let waited = started.elapsed();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    // Served at most one header-read timeout after the half-sent ones ahead of it were accepted
    // (plus slack for a loaded machine), not never.
    assert!(waited < Duration::from_secs(15), "served after {waited:?}");
    // The attackers still hold their half-sent requests (reconnecting as the header-read
    // timeout cuts them).
    assert!(!tasks.iter().any(|t| t.is_finished()));

    // Many times, not once: every request is served.
    for i in 0..5 {
        let reply = http.get(demo.addr, "/api/data", Some("legit")).await;
        assert_eq!(reply.status, StatusCode::OK, "request {i}");
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let log = demo.log().join("\n");
    assert!(!log.contains("Too many open files"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_and_idle_connections_are_closed_after_their_timeouts() {
    let demo = DemoProcess::start(&[
        "--header-read-timeout-ms",
        "1500",
        "--idle-timeout-ms",
        "1000",
    ]);
    // A head trickled one byte every 500 ms: never idle for 1 s, cut at the header timeout.
    let trickle = async {
        let mut conn = TcpStream::connect(demo.addr).await.unwrap();
        let started = Instant::now();
        for byte in HALF_SENT {
            if conn.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            if started.elapsed() > Duration::from_secs(20) {
                panic!("a trickled head was not cut within 20 s");
            }
        }
        started.elapsed()
    };
    // A connection that sends nothing: closed at the idle timeout.
    let idle = async {
        let mut conn = TcpStream::connect(demo.addr).await.unwrap();
        let started = Instant::now();
        let mut buf = [0_u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(20), conn.read(&mut buf))
            .await
            .expect("an idle connection was not closed within 20 s");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        started.elapsed()
    };
    let (trickled, idled) = tokio::join!(trickle, idle);
    assert!(trickled >= Duration::from_millis(1400), "{trickled:?}");
    assert!(idled >= Duration::from_millis(900), "{idled:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_within_the_deadline_with_a_half_sent_request_open() {
    let mut demo = DemoProcess::start(&["--shutdown-timeout-ms", "1000"]);
    let mut half = TcpStream::connect(demo.addr).await.unwrap();
    half.write_all(HALF_SENT).await.unwrap();
    // A keep-alive connection that was served once and stays open.
    let http = Http::new();
    assert_eq!(
        http.get(demo.addr, "/api/data", Some("alice")).await.status,
        StatusCode::OK
    );
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    let status = tokio::task::spawn_blocking(move || {
        let status = demo.terminate();
        (status, demo.log())
    })
    .await
    .unwrap();
    let took = started.elapsed();
    let (status, log) = status;
    assert!(status.success(), "{status:?}\n{}", log.join("\n"));
    // The deadline is 1 s; the header-read (10 s) and idle (5 s) timeouts never came into it.
    assert!(took < Duration::from_secs(4), "exit {took:?} after SIGTERM");
    assert!(log.iter().any(|line| line.contains("stopped")));
}
