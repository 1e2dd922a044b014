//! Requests per second, and server CPU time per request, of the demo service with the
//! rate-limit layer (memory store, a limit that never denies) against the same routes without
//! it, under the same loopback load: a hyper HTTP/1.1 client on keep-alive connections.
//!
//! The two servers are separate processes (this executable, re-run with `BENCH_ROLE=server`),
//! so the client's own work is not counted in theirs, and each server's CPU time is read from
//! `/proc/<pid>/task/*/schedstat` around every round. Rounds alternate in back-to-back pairs so that machine
//! noise hits both alike; the medians of the pairs' ratios are the result.
//!
//! `cargo bench -p distlimit-demo --bench http`; pinned, servers on CPU 0 and the client on
//! CPU 1: `BENCH_SERVER_CPUS=0 taskset -c 1 cargo bench -p distlimit-demo --bench http`.
//!
//! Knobs (environment): `BENCH_CONNECTIONS` (32), `BENCH_REQUESTS` per round (20000),
//! `BENCH_ROUND_SECS` (3, the time bound of a round), `BENCH_ROUNDS` (31 pairs),
//! `BENCH_SERVER_CPUS` (a `taskset -c` list for both servers; unset: not pinned),
//! `BENCH_SERVER_THREADS` (1) and `BENCH_CLIENT_THREADS` (1) worker threads.
//! `BENCH_SIDE` (`with` or `without`) instead runs one side alone, server and client in this
//! process, for `BENCH_REQUESTS × BENCH_ROUNDS` requests (for `perf stat`, `perf record` or
//! `valgrind --tool=callgrind`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use distlimit_demo::{DATA_BODY, ServeConfig, api_limits, limiter, router, serve};
use distlimit_memory::MemoryStore;
use distlimit_metrics::Metrics;
use distlimit_policy::PolicySet;
use distlimit_tower::TrustedProxies;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

/// Never denies: a million per second per user.
const BENCH_POLICY: &str = r#"
[[policy]]
name = "api"
tiers = [{ name = "burst", algorithm = "token_bucket", limit = 1000000, per = "1s" }]

[[policy]]
name = "api-ip"
tiers = [{ name = "client", algorithm = "token_bucket", limit = 1000000000, per = "1s" }]
"#;

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn runtime(threads: u64) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::try_from(threads.max(1)).unwrap())
        .enable_all()
        .build()
        .unwrap()
}

async fn start(with_layer: bool) -> SocketAddr {
    let metrics = Metrics::new();
    let layer = with_layer.then(|| {
        let policies = PolicySet::from_toml_str(BENCH_POLICY).unwrap();
        let limiter = limiter(Arc::new(MemoryStore::new()), policies, &metrics);
        api_limits(limiter, TrustedProxies::none())
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        listener,
        router(layer, metrics),
        ServeConfig::default(),
        std::future::pending(),
    ));
    addr
}

/// One round: `connections` keep-alive connections share `requests`, within `bound`.
/// Returns (requests answered 200, elapsed).
async fn round(
    addr: SocketAddr,
    connections: u64,
    requests: u64,
    bound: Duration,
) -> (u64, Duration) {
    let issued = Arc::new(AtomicU64::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + bound;
    let tasks: Vec<_> = (0..connections)
        .map(|c| {
            let (issued, ok) = (issued.clone(), ok.clone());
            tokio::spawn(async move {
                let stream = TcpStream::connect(addr).await.unwrap();
                stream.set_nodelay(true).unwrap();
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream))
                        .await
                        .unwrap();
                tokio::spawn(conn);
                let user = format!("bench-user-{c}");
                while issued.fetch_add(1, Ordering::Relaxed) < requests && Instant::now() < deadline
                {
                    let request = Request::get("/api/data")
                        .header("host", "bench")
                        .header("x-user-id", &user)
                        .body(Empty::<Bytes>::new())
                        .unwrap();
                    let response = sender.send_request(request).await.unwrap();
                    let status = response.status();
                    let body = response.into_body().collect().await.unwrap().to_bytes();
                    assert_eq!(status, StatusCode::OK, "the bench limit must never deny");
                    assert_eq!(&body[..], DATA_BODY.as_bytes());
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (ok.load(Ordering::Relaxed), start.elapsed())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A server process: the demo's routes with or without the layer, until its stdin closes.
struct Server {
    child: Child,
    addr: SocketAddr,
    /// Keeps the pipe open; the server reads nothing else from it.
    _stdout: BufReader<ChildStdout>,
}

impl Server {
    fn spawn(with_layer: bool) -> Self {
        let exe = std::env::current_exe().unwrap();
        let mut command = match std::env::var("BENCH_SERVER_CPUS") {
            Ok(cpus) => {
                let mut taskset = Command::new("taskset");
                taskset.arg("-c").arg(cpus).arg(exe);
                taskset
            }
            Err(_) => Command::new(exe),
        };
        let mut child = command
            .env("BENCH_ROLE", "server")
            .env("BENCH_LAYER", if with_layer { "with" } else { "without" })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the server process");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("unexpected server output {line:?}"));
        Self {
            child,
            addr,
            _stdout: stdout,
        }
    }

    /// The CPU time (user and system, all threads, in nanoseconds: the first field of each
    /// thread's `/proc/<pid>/task/<tid>/schedstat`) the server has used so far.
    fn cpu(&self) -> Duration {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.child.id())).unwrap();
        let nanos = tasks
            .map(|task| {
                let path = task.unwrap().path().join("schedstat");
                let stat = std::fs::read_to_string(path).unwrap_or_default();
                stat.split_whitespace()
                    .next()
                    .and_then(|ns| ns.parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum();
        Duration::from_nanos(nanos)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Closing stdin ends the server; it is our own child, waited for by PID.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// `BENCH_ROLE=server`: serve until stdin closes.
fn server_role() {
    let with_layer = match std::env::var("BENCH_LAYER").as_deref() {
        Ok("with") => true,
        Ok("without") => false,
        other => panic!("BENCH_LAYER must be `with` or `without`, not {other:?}"),
    };
    let runtime = runtime(knob("BENCH_SERVER_THREADS", 1));
    let addr = runtime.block_on(start(with_layer));
    println!("listening {addr}");
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

fn main() {
    let connections = knob("BENCH_CONNECTIONS", 32);
    let requests = knob("BENCH_REQUESTS", 20_000);
    let bound = Duration::from_secs(knob("BENCH_ROUND_SECS", 3));
    let rounds = knob("BENCH_ROUNDS", 31);
    if std::env::var("BENCH_ROLE").as_deref() == Ok("server") {
        server_role();
        return;
    }
    if let Ok(side) = std::env::var("BENCH_SIDE") {
        runtime(2).block_on(one_side(&side, connections, requests * rounds, bound * 10));
        return;
    }
    let servers = [Server::spawn(true), Server::spawn(false)];
    let client = runtime(knob("BENCH_CLIENT_THREADS", 1));
    client.block_on(async {
        // Warm-up: connections, allocator, the limiter's keys.
        for server in &servers {
            round(server.addr, connections, requests / 4, bound).await;
        }
        println!(
            "{connections} connections, {requests} requests or {bound:?} per round, {rounds} pairs of rounds, server CPUs: {}",
            std::env::var("BENCH_SERVER_CPUS").unwrap_or_else(|_| "any".into())
        );
        println!("pair  with layer (req/s, µs CPU/req)  without (req/s, µs CPU/req)  ratio req/s  ratio CPU/req");
        let mut rates = [Vec::new(), Vec::new()];
        let mut cpus = [Vec::new(), Vec::new()];
        let (mut rate_ratios, mut cpu_ratios) = (Vec::new(), Vec::new());
        for pair in 0..rounds {
            // Back to back, alternating which goes first, so that drift and other load on the
            // machine hit both alike; each pair gives one ratio.
            let mut rate = [0.0; 2];
            let mut cpu = [0.0; 2];
            let order = if pair % 2 == 0 { [0, 1] } else { [1, 0] };
            for side in order {
                let server = &servers[side];
                let before = server.cpu();
                let (n, elapsed) = round(server.addr, connections, requests, bound).await;
                let used = server.cpu() - before;
                rate[side] = n as f64 / elapsed.as_secs_f64();
                cpu[side] = used.as_secs_f64() * 1e6 / n as f64;
            }
            let (rate_ratio, cpu_ratio) = (rate[0] / rate[1], cpu[0] / cpu[1]);
            println!(
                "{pair:>4}  {:>14.0}  {:>12.2}  {:>14.0}  {:>12.2}  {rate_ratio:>11.3}  {cpu_ratio:>13.3}",
                rate[0], cpu[0], rate[1], cpu[1]
            );
            for side in 0..2 {
                rates[side].push(rate[side]);
                cpus[side].push(cpu[side]);
            }
            rate_ratios.push(rate_ratio);
            cpu_ratios.push(cpu_ratio);
        }
        let [rates_with, rates_without] = rates;
        let [cpus_with, cpus_without] = cpus;
        let (rate_ratio, cpu_ratio) = (median(rate_ratios), median(cpu_ratios));
        println!(
            "median: with layer {:.0} req/s and {:.2} µs CPU/req, without {:.0} req/s and {:.2} µs CPU/req",
            median(rates_with),
            median(cpus_with),
            median(rates_without),
            median(cpus_without),
        );
        println!(
            "median ratios: throughput {rate_ratio:.3} (layer cost {:.1} %), server CPU per request {cpu_ratio:.3} (+{:.1} %)",
            (1.0 - rate_ratio) * 100.0,
            (cpu_ratio - 1.0) * 100.0
        );
    });
}

/// `BENCH_SIDE=with` or `without`: one server and its client in this process, for profiling
/// one side.
async fn one_side(side: &str, connections: u64, requests: u64, bound: Duration) {
    let layered = match side {
        "with" => true,
        "without" => false,
        other => panic!("BENCH_SIDE must be `with` or `without`, not {other:?}"),
    };
    let addr = start(layered).await;
    round(addr, connections, requests / 40, bound).await;
    let (n, elapsed) = round(addr, connections, requests, bound).await;
    println!(
        "{side} layer: {n} requests in {elapsed:.2?}, {:.0} req/s",
        n as f64 / elapsed.as_secs_f64()
    );
}
