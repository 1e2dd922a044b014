//! The gRPC port writes the responses of a connection's concurrent streams together: the real
//! binary, under pipelined load (4 connections × 16 streams in flight), makes far fewer write
//! system calls than it sends responses. Counted by the kernel (`syscw` of `/proc/<pid>/io`:
//! every `write`, `writev`, `sendmsg` of the process), not timed, so it holds on a loaded
//! machine; without `distlimit_serve::CoalesceWrites` the binary writes about once per response.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use support::{OK, config_dir, descriptor, request};
use tonic::transport::Channel;

const CONFIG: &str = "
domain: bench
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 1000000000 }
";

/// Connections, and streams in flight on each.
const CONNECTIONS: usize = 4;
const STREAMS: usize = 16;
/// Bursts of `CONNECTIONS × STREAMS` concurrent requests.
const BURSTS: usize = 50;

/// The binary, killed by PID on drop.
struct Binary(Child);

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the binary on `config` (ports chosen by the system); its gRPC address.
fn start(config: &str) -> (Binary, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_distlimit-server"))
        .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .args(["--config", config])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.split("grpc listening on ").nth(1) {
                let _ = tx.send(rest.trim().to_owned());
            }
        }
    });
    let binary = Binary(child);
    let addr = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the binary listens within 10 s");
    (binary, addr.parse().unwrap())
}

/// The write system calls `pid` has made so far, all threads together.
fn write_calls(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))
        .expect("/proc/<pid>/io (task I/O accounting) is readable");
    io.lines()
        .find_map(|line| line.strip_prefix("syscw:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("a syscw line")
}

/// `STREAMS` concurrent checks on each of `clients`; panics unless each is answered `OK`.
async fn burst(clients: &[RateLimitServiceClient<Channel>]) {
    let mut calls = tokio::task::JoinSet::new();
    for client in clients {
        for _ in 0..STREAMS {
            let mut client = client.clone();
            calls.spawn(async move {
                client
                    .should_rate_limit(request("bench", vec![descriptor(&[("user", "hot")])]))
                    .await
                    .expect("an answer")
                    .into_inner()
                    .overall_code
            });
        }
    }
    while let Some(code) = calls.join_next().await {
        assert_eq!(code.unwrap(), OK);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_responses_leave_in_few_writes() {
    let dir = config_dir(CONFIG);
    let (binary, addr) = start(dir.path().to_str().unwrap());
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        clients.push(RateLimitServiceClient::new(channel));
    }
    // Connections set up (settings, window updates) before counting.
    burst(&clients).await;
    let pid = binary.0.id();
    let before = write_calls(pid);
    let load = async {
        for _ in 0..BURSTS {
            burst(&clients).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), load)
        .await
        .expect("the load ends within 60 s");
    let writes = write_calls(pid) - before;
    let responses = (BURSTS * CONNECTIONS * STREAMS) as u64;
    eprintln!("{writes} write calls for {responses} responses");
    // One write per response without coalescing; at least 4 responses per write with it
    // (about 16 on an idle machine: a connection's whole burst).
    assert!(
        writes * 4 <= responses,
        "{writes} write calls for {responses} responses: the responses finished together are not \
         written together"
    );
    drop(binary);
}
