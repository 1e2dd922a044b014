//! The gRPC port's serving limits on real sockets: the connection cap holds, silent or
//! trickling clients are closed at the first request's deadline instead of holding a slot, a
//! served connection lives until its own (long) idle timeout (the HTTP port's limits, shared
//! through `distlimit-serve`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IDLE_MS: u64 = 400;

const CONFIG: &str = "
domain: api
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 1000 }
";

async fn one_check(addr: SocketAddr) {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    check_on(&channel).await;
}

#[tokio::test]
async fn silent_sockets_hold_no_slot_past_the_first_request_deadline() {
    let dir = config_dir(CONFIG);
    let idle = IDLE_MS.to_string();
    // The gRPC idle timeout keeps its default (65 minutes): the first request's deadline
    // closes sockets that never start one.
    let server = Running::with_config(
        dir.path(),
        &["--max-connections", "2", "--header-read-timeout-ms", &idle],
    )
    .await;
    // Two sockets that never speak take both slots.
    let mut idle_a = TcpStream::connect(server.grpc).await.unwrap();
    let mut idle_b = TcpStream::connect(server.grpc).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A client past the cap waits in the accept queue until an idle one is closed.
    let started = Instant::now();
    let waiting = tokio::spawn(one_check(server.grpc));
    let limit = Duration::from_secs(5);
    closed_within(&mut idle_a, limit).await;
    closed_within(&mut idle_b, limit).await;
    tokio::time::timeout(limit, waiting)
        .await
        .expect("served once a slot is free")
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(IDLE_MS * 3 / 4),
        "served after {:?}, before any slot was free: the cap did not hold",
        started.elapsed()
    );
    server.stop().await;
}

#[tokio::test]
async fn a_client_trickling_its_preface_is_closed() {
    let dir = config_dir(CONFIG);
    let idle = IDLE_MS.to_string();
    let server = Running::with_config(
        dir.path(),
        &["--max-connections", "1", "--header-read-timeout-ms", &idle],
    )
    .await;
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut slow = TcpStream::connect(server.grpc).await.unwrap();
    let started = Instant::now();
    // One byte every 50 ms: bytes keep coming, but no request ever starts.
    let mut closed = false;
    for byte in preface.iter().cycle().take(200) {
        if slow.write_all(&[*byte]).await.is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 256];
        let read = tokio::time::timeout(Duration::from_millis(50), slow.read(&mut buf)).await;
        if let Ok(Ok(0) | Err(_)) = read {
            closed = true;
            break;
        }
    }
    assert!(closed, "a trickling client kept its connection for 10 s");
    assert!(started.elapsed() < Duration::from_secs(5));
    // Its slot is free again: the only one.
    tokio::time::timeout(Duration::from_secs(5), one_check(server.grpc))
        .await
        .expect("served");
    server.stop().await;
}

#[tokio::test]
async fn a_request_in_progress_keeps_its_connection_past_the_idle_timeout() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let dir = config_dir(CONFIG);
    let idle = IDLE_MS.to_string();
    let server = Running::with_config(dir.path(), &["--grpc-idle-timeout-ms", &idle]).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    // A health watch is one long request: it stays in progress while the stream is open.
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status, 1, "SERVING");
    // Three idle periods without a byte: the stream is still open (no end, no error).
    let quiet = tokio::time::timeout(Duration::from_millis(IDLE_MS * 3), watch.message()).await;
    assert!(quiet.is_err(), "the watch ended: {quiet:?}");
    // An open watch would hold the shutdown until its deadline.
    drop(watch);
    server.stop().await;
}

#[tokio::test]
async fn idle_http_sockets_are_closed_too() {
    let dir = config_dir(CONFIG);
    let idle = IDLE_MS.to_string();
    let server = Running::with_config(dir.path(), &["--idle-timeout-ms", &idle]).await;
    let mut socket = TcpStream::connect(server.http).await.unwrap();
    let took = closed_within(&mut socket, Duration::from_secs(5)).await;
    assert!(took >= Duration::from_millis(IDLE_MS * 3 / 4), "{took:?}");
    server.stop().await;
}

/// A channel to `addr` that counts the TCP connections it opens.
async fn counted_channel(addr: SocketAddr) -> (tonic::transport::Channel, Arc<AtomicUsize>) {
    let connects = Arc::new(AtomicUsize::new(0));
    let counter = connects.clone();
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            TcpStream::connect(addr)
                .await
                .map(hyper_util::rt::TokioIo::new)
        }
    });
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector(connector)
        .await
        .unwrap();
    (channel, connects)
}

async fn check_on(channel: &tonic::transport::Channel) {
    let mut client = RateLimitServiceClient::new(channel.clone());
    let answer = call(
        &mut client,
        request("api", vec![descriptor(&[("user", "alice")])]),
    )
    .await;
    assert_eq!(answer.statuses.len(), 1);
}

#[tokio::test]
async fn a_served_grpc_connection_outlives_the_first_request_deadline() {
    let dir = config_dir(CONFIG);
    let first = IDLE_MS.to_string();
    let server = Running::with_config(dir.path(), &["--header-read-timeout-ms", &first]).await;
    let (channel, connects) = counted_channel(server.grpc).await;
    check_on(&channel).await;
    // Three first-request deadlines later, the same connection serves again: an Envoy
    // connection that paused is not closed under it.
    tokio::time::sleep(Duration::from_millis(IDLE_MS * 3)).await;
    check_on(&channel).await;
    assert_eq!(
        connects.load(Ordering::SeqCst),
        1,
        "the connection was closed"
    );
    drop(channel);
    server.stop().await;
}

#[tokio::test]
async fn a_served_grpc_connection_is_closed_after_its_idle_timeout() {
    let dir = config_dir(CONFIG);
    let idle = IDLE_MS.to_string();
    let server = Running::with_config(dir.path(), &["--grpc-idle-timeout-ms", &idle]).await;
    let (channel, connects) = counted_channel(server.grpc).await;
    check_on(&channel).await;
    tokio::time::sleep(Duration::from_millis(IDLE_MS * 3)).await;
    // The server closed it; the channel reconnects.
    check_on(&channel).await;
    assert_eq!(connects.load(Ordering::SeqCst), 2);
    drop(channel);
    server.stop().await;
}
