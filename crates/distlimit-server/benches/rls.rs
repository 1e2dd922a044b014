//! Decisions/s and p50/p99 latency of `ShouldRateLimit` over gRPC on loopback, at 1, 64 and
//! 256 requests in flight, side by side with the store's own `decide_all` (and the checker
//! without gRPC) in the same run: memory store, and Redis when a `redis-server` can be started.
//! The server is the `distlimit-server` binary in its own process (the client, this process,
//! does not share its runtime); its CPU time per decision is read from `/proc`.
//!
//! `cargo bench -p distlimit-server --bench rls [-- memory|redis]` (bounded: at most `ROUNDS`
//! decisions and `MAX_TIME` per line).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs,
    unreachable_pub
)]

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use distlimit_core::{Key, Limit, Quota, Request, Store};
use distlimit_memory::MemoryStore;
use distlimit_server::check::{CheckRequest, Descriptor};
use distlimit_server::{Args, Checker, Server};
use distlimit_test::server::RedisServer;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

const ROUNDS: u64 = 100_000;
const MAX_TIME: Duration = Duration::from_secs(3);
const KEYS: u64 = 10_000;
const CONFIG: &str = "
domain: bench
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 4294967295 }
";

struct Line {
    count: usize,
    per_sec: f64,
    p50: Duration,
    p99: Duration,
}

/// Runs `op(i)` from `in_flight` tasks until `ROUNDS` calls or `MAX_TIME`.
async fn run<F, Fut>(in_flight: usize, op: F) -> Line
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..in_flight {
        let (op, next) = (op.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ROUNDS || started.elapsed() > MAX_TIME {
                    return latencies;
                }
                let t = Instant::now();
                op(i).await;
                latencies.push(t.elapsed());
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    all.sort_unstable();
    let at = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    Line {
        count: all.len(),
        per_sec: all.len() as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
    }
}

fn key(i: u64) -> String {
    format!("u{}", i % KEYS)
}

fn grpc_request(i: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: key(i),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

/// The `distlimit-server` binary, started on `config` with `flags`; killed when dropped.
struct ServerProcess {
    child: Child,
    grpc: String,
}

impl ServerProcess {
    fn start(config: &Path, flags: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_distlimit-server"))
            .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--config"])
            .arg(config)
            .args(flags)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("distlimit-server starts");
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let grpc = loop {
            let line = lines.next().expect("a log line").unwrap();
            if let Some((_, rest)) = line.split_once("grpc listening on ") {
                break rest.trim().to_owned();
            }
        };
        // Drain the log so the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, grpc }
    }

    /// User plus system CPU time the process has used so far.
    fn cpu(&self) -> Duration {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the command name (which ends with ')'): utime and stime are the 12th and
        // 13th, in clock ticks of 1/100 s.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let ticks: u64 = after
            .split_whitespace()
            .skip(11)
            .take(2)
            .filter_map(|f| f.parse::<u64>().ok())
            .sum();
        Duration::from_millis(ticks * 10)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn bench_store(name: &str, flags: &[&str], store: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.yaml");
    std::fs::write(&path, CONFIG).unwrap();
    let mut argv = vec!["distlimit-server", "--config", path.to_str().unwrap()];
    argv.extend_from_slice(flags);
    let args = Args::parse_from(argv);
    // The checker without gRPC, in this process, on its own store connections.
    let checker: Arc<Checker> = Server::build(&args).await.unwrap().checker().clone();
    let server = ServerProcess::start(&path, flags);
    // Eight HTTP/2 connections, as a few Envoy workers would hold.
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(
            RateLimitServiceClient::connect(format!("http://{}", server.grpc))
                .await
                .unwrap(),
        );
    }
    let limit =
        Limit::fixed_window(Quota::from_parts(u64::from(u32::MAX), 3_600_000_000, 1).unwrap());

    println!("\n{name}");
    println!(
        "{:>9} | {:>34} | {:>34} | {:>34} | {:>12} | {:>11} | {:>14}",
        "in flight",
        "store decide_all",
        "checker (no gRPC)",
        "gRPC ShouldRateLimit",
        "gRPC / store",
        "+p50 gRPC",
        "server CPU/dec"
    );
    for in_flight in [1usize, 64, 256] {
        let s = store.clone();
        let own = run(in_flight, move |i| {
            let s = s.clone();
            async move {
                let k = key(i);
                let request = Request::new(Key::new(&k).unwrap(), limit)
                    .with_policy("bench/user")
                    .unwrap();
                s.decide_all(&[request]).await.unwrap();
            }
        })
        .await;
        let c = checker.clone();
        let direct = run(in_flight, move |i| {
            let c = c.clone();
            async move {
                let k = key(i);
                let request = CheckRequest {
                    domain: "bench",
                    descriptors: vec![Descriptor {
                        entries: vec![("user", k.as_str())],
                        ..Descriptor::default()
                    }],
                    hits: 1,
                };
                c.check(&request).await.unwrap();
            }
        })
        .await;
        let pool = clients.clone();
        let cpu_before = server.cpu();
        let over_grpc = run(in_flight, move |i| {
            let mut client = pool[(i % pool.len() as u64) as usize].clone();
            async move {
                client.should_rate_limit(grpc_request(i)).await.unwrap();
            }
        })
        .await;
        let server_cpu = server.cpu().saturating_sub(cpu_before);
        let show = |l: &Line| {
            format!(
                "{:>8.0}/s p50 {:>7.1}µs p99 {:>7.1}µs",
                l.per_sec,
                l.p50.as_secs_f64() * 1e6,
                l.p99.as_secs_f64() * 1e6
            )
        };
        println!(
            "{in_flight:>9} | {} | {} | {} | {:>11.1}% | {:>9.1}µs | {:>12.1}µs",
            show(&own),
            show(&direct),
            show(&over_grpc),
            over_grpc.per_sec / own.per_sec * 100.0,
            (over_grpc.p50.as_secs_f64() - own.p50.as_secs_f64()) * 1e6,
            server_cpu.as_secs_f64() * 1e6 / over_grpc.count as f64,
        );
    }
}

/// `cargo bench --bench rls -- callgrind`: the server's instructions per decision on the memory
/// store and on Redis, counted by callgrind (repeatable on a busy machine, unlike time): the server runs
/// under `valgrind --tool=callgrind`, gets 500 requests to warm up, then its counters are
/// zeroed and `CALLGRIND_REQUESTS` more are sent, 64 in flight on 8 connections.
async fn instructions_per_decision(name: &str, flags: &[&str]) {
    const CALLGRIND_REQUESTS: u64 = 4_000;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bench.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let out = dir.path().join("callgrind.out");
    let mut child = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(env!("CARGO_BIN_EXE_distlimit-server"))
        .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--config"])
        .arg(&config)
        .args(flags)
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("valgrind starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let grpc = loop {
        let line = lines.next().expect("a log line").unwrap();
        if let Some((_, rest)) = line.split_once("grpc listening on ") {
            break rest.trim().to_owned();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(
            RateLimitServiceClient::connect(format!("http://{grpc}"))
                .await
                .unwrap(),
        );
    }
    let send = |count: u64| {
        let pool = clients.clone();
        let next = Arc::new(AtomicU64::new(0));
        async move {
            let mut tasks = Vec::new();
            for _ in 0..64 {
                let (pool, next) = (pool.clone(), next.clone());
                tasks.push(tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= count {
                            return;
                        }
                        let mut client = pool[(i % pool.len() as u64) as usize].clone();
                        client.should_rate_limit(grpc_request(i)).await.unwrap();
                    }
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
        }
    };
    send(500).await;
    let pid = child.id().to_string();
    let control = |flag: &str| {
        let status = Command::new("callgrind_control")
            .args([flag, pid.as_str()])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "callgrind_control {flag}");
    };
    control("--zero");
    send(CALLGRIND_REQUESTS).await;
    control("--dump");
    let _ = child.kill();
    let _ = child.wait();
    // The dump after the zeroing: its `totals:` line counts the measured requests only.
    let mut dumps: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().contains("callgrind.out"))
        .collect();
    dumps.sort();
    // `RLS_CALLGRIND_OUT=path` keeps the profile, for `callgrind_annotate`.
    if let (Ok(keep), Some(dump)) = (std::env::var("RLS_CALLGRIND_OUT"), dumps.last()) {
        std::fs::copy(dump, keep).unwrap();
    }
    let total: u64 = dumps
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .filter_map(|text| {
            text.lines()
                .find_map(|l| {
                    l.strip_prefix("totals: ")
                        .or_else(|| l.strip_prefix("summary: "))
                })
                .and_then(|n| n.trim().parse::<u64>().ok())
        })
        .max()
        .unwrap_or(0);
    println!(
        "server instructions per decision ({name}, 64 in flight, {CALLGRIND_REQUESTS} requests): {}",
        total / CALLGRIND_REQUESTS
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // `cargo bench --bench rls -- memory` (or `redis`) runs one store only.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if only.iter().any(|o| o == "callgrind") {
        runtime.block_on(async {
            instructions_per_decision("memory store", &[]).await;
            if let Some(redis) = RedisServer::start() {
                let url = redis.url();
                let flags = ["--redis", url.as_str(), "--redis-budget-ms", "5000"];
                instructions_per_decision("redis, hybrid", &flags).await;
            }
        });
        return;
    }
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    runtime.block_on(async {
        if wanted("memory") {
            bench_store("memory store", &[], Arc::new(MemoryStore::new())).await;
        }
        if !wanted("redis") {
            return;
        }
        let Some(redis) = RedisServer::start() else {
            println!("\nredis: skipped (no redis-server)");
            return;
        };
        let url = redis.url();
        let own: Arc<dyn Store> =
            Arc::new(distlimit_redis::RedisStore::connect(&url).await.unwrap());
        bench_store(
            "redis (hybrid over RedisStore; the store column is RedisStore alone)",
            &[
                "--redis",
                url.as_str(),
                "--redis-budget-ms",
                "1000",
                "--redis-timeout-ms",
                "1000",
            ],
            own,
        )
        .await;
        drop(redis);
    });
}
