//! Decisions/s and p50/p99 latency of `ShouldRateLimit` over gRPC on loopback, at 1, 64 and
//! 256 requests in flight, side by side with the store's own `decide_all` (and the checker
//! without gRPC) in the same run: memory store, and Redis when a `redis-server` can be started.
//! The server is the `distlimit-server` binary in its own process (the client, this process,
//! does not share its runtime); its CPU time per decision is read from `/proc`.
//!
//! Two controls run in the same round, each in a process of its own started from this binary:
//! a bare tonic server of the same service answering OK without deciding anything (what gRPC
//! itself costs), and a TCP echo of 64 bytes (one loopback round trip between two processes,
//! the floor of any remote call on this machine).
//!
//! `cargo bench -p distlimit-server --bench rls [-- memory|redis|hot]` (bounded: at most `ROUNDS`
//! decisions and `MAX_TIME` per line). `-- hot`: one tenant's key on Redis, decided in Redis
//! and from token leases (`--lease`), side by side.
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
use distlimit_test::server::{RedisServer, info_field};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;
use tonic::transport::server::TcpIncoming;

/// The server's allocator, so that the bare tonic control (this binary) allocates alike.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

/// Runs `op(task, i)` from `in_flight` tasks (numbered from 0) until `ROUNDS` calls or
/// `MAX_TIME`.
async fn run<F, Fut>(in_flight: usize, op: F) -> Line
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..in_flight {
        let (op, next) = (op.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ROUNDS || started.elapsed() > MAX_TIME {
                    return latencies;
                }
                let t = Instant::now();
                op(task, i).await;
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

/// A server process of this bench (`distlimit-server`, or a control); killed when dropped.
struct ServerProcess {
    child: Child,
    grpc: String,
}

impl ServerProcess {
    /// The `distlimit-server` binary, started on `config` with `flags`.
    fn start(config: &Path, flags: &[&str]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_distlimit-server"));
        command
            .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--config"])
            .arg(config)
            .args(flags);
        Self::spawn(command)
    }

    /// A control ([`Control`]) in a process of its own: this bench binary, re-run.
    fn control(control: Control) -> Self {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command.env(CONTROL_ENV, control.name());
        Self::spawn(command)
    }

    /// Starts `command` and waits for its `grpc listening on ADDR` line.
    fn spawn(mut command: Command) -> Self {
        // `RLS_BENCH_SERVER_WORKERS=N`: the servers' runtimes get N worker threads (Tokio's
        // default: one per core).
        if let Ok(workers) = std::env::var("RLS_BENCH_SERVER_WORKERS") {
            command.env("TOKIO_WORKER_THREADS", workers);
        }
        let mut child = command
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the server starts");
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

    /// Eight HTTP/2 connections to its gRPC port, as a few Envoy workers would hold.
    async fn clients(&self) -> Vec<RateLimitServiceClient<Channel>> {
        let mut clients = Vec::new();
        for _ in 0..8 {
            clients.push(
                RateLimitServiceClient::connect(format!("http://{}", self.grpc))
                    .await
                    .unwrap(),
            );
        }
        clients
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The environment variable that makes this binary run a [`Control`] instead of the bench.
const CONTROL_ENV: &str = "DISTLIMIT_RLS_BENCH_CONTROL";

/// A server that decides nothing, to measure against.
#[derive(Clone, Copy)]
enum Control {
    /// tonic's server with its defaults (and `TCP_NODELAY`) on the same multi-thread runtime,
    /// answering every `ShouldRateLimit` with one constant OK status of the shape ours sends.
    BareTonic,
    /// Echoes 64-byte messages on each connection: one loopback round trip.
    Echo,
}

impl Control {
    fn name(self) -> &'static str {
        match self {
            Self::BareTonic => "bare-tonic",
            Self::Echo => "echo",
        }
    }

    /// Runs the control named `name` until killed.
    fn serve(name: &str) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            eprintln!("grpc listening on {}", listener.local_addr().unwrap());
            if name == Self::BareTonic.name() {
                tonic::transport::Server::builder()
                    .add_service(RateLimitServiceServer::new(Bare))
                    .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true)))
                    .await
                    .unwrap();
                return;
            }
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                socket.set_nodelay(true).unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; ECHO_BYTES];
                    while socket.read_exact(&mut buf).await.is_ok() {
                        if socket.write_all(&buf).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }
}

const ECHO_BYTES: usize = 64;

/// The bare tonic control's service.
struct Bare;

#[tonic::async_trait]
impl RateLimitService for Bare {
    async fn should_rate_limit(
        &self,
        _: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![DescriptorStatus {
                code: Code::Ok as i32,
                current_limit: Some(RateLimit {
                    name: "bench/user".into(),
                    requests_per_unit: u32::MAX,
                    unit: Unit::Hour as i32,
                }),
                limit_remaining: 4_294_967_000,
                duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration {
                    seconds: 1_234,
                    nanos: 0,
                }),
                ..DescriptorStatus::default()
            }],
            ..RateLimitResponse::default()
        }))
    }
}

fn show(what: &str, line: &Line, cpu: Option<Duration>) {
    let cpu = cpu.map_or(String::new(), |cpu| {
        format!(
            "{:>9.1}µs",
            cpu.as_secs_f64() * 1e6 / line.count.max(1) as f64
        )
    });
    println!(
        "    {what:<34} {:>9.0}/s  p50 {:>8.1}µs  p99 {:>8.1}µs  {cpu}",
        line.per_sec,
        line.p50.as_secs_f64() * 1e6,
        line.p99.as_secs_f64() * 1e6,
    );
}

/// Runs gRPC requests against `server` and returns the line and the server's CPU time.
async fn over_grpc(server: &ServerProcess, in_flight: usize) -> (Line, Duration) {
    let pool = server.clients().await;
    let cpu_before = server.cpu();
    let line = run(in_flight, move |_, i| {
        let mut client = pool[(i % pool.len() as u64) as usize].clone();
        async move {
            client.should_rate_limit(grpc_request(i)).await.unwrap();
        }
    })
    .await;
    (line, server.cpu().saturating_sub(cpu_before))
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
    let bare = ServerProcess::control(Control::BareTonic);
    let echo = ServerProcess::control(Control::Echo);
    let limit =
        Limit::fixed_window(Quota::from_parts(u64::from(u32::MAX), 3_600_000_000, 1).unwrap());

    println!("\n{name}");
    println!(
        "    {:<34} {:>11}  {:>14}  {:>14}  {:>11}",
        "", "calls", "", "", "server CPU"
    );
    for in_flight in [1usize, 64, 256] {
        println!("  {in_flight} in flight");
        let s = store.clone();
        let own = run(in_flight, move |_, i| {
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
        show("store decide_all", &own, None);
        let c = checker.clone();
        let direct = run(in_flight, move |_, i| {
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
        show("checker (no gRPC)", &direct, None);
        let mut sockets = Vec::new();
        for _ in 0..in_flight {
            sockets.push(Arc::new(tokio::sync::Mutex::new(
                tokio::net::TcpStream::connect(&echo.grpc).await.unwrap(),
            )));
        }
        let cpu_before = echo.cpu();
        let floor = run(in_flight, move |task, _| {
            let socket = sockets[task].clone();
            async move {
                let mut socket = socket.lock().await;
                let mut buf = [7u8; ECHO_BYTES];
                socket.write_all(&buf).await.unwrap();
                socket.read_exact(&mut buf).await.unwrap();
            }
        })
        .await;
        show(
            "TCP echo, 64 B (round-trip floor)",
            &floor,
            Some(echo.cpu().saturating_sub(cpu_before)),
        );
        let (control, control_cpu) = over_grpc(&bare, in_flight).await;
        show("bare tonic, decides nothing", &control, Some(control_cpu));
        let (ours, ours_cpu) = over_grpc(&server, in_flight).await;
        show("distlimit-server gRPC", &ours, Some(ours_cpu));
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "    => gRPC {:.1}% of the store's decisions/s; p50 over the store's {:+.1}µs \
             (bare tonic over the echo {:+.1}µs, ours over bare tonic {:+.1}µs); \
             server CPU {:.2}x bare tonic",
            ours.per_sec / own.per_sec * 100.0,
            us(ours.p50) - us(own.p50),
            us(control.p50) - us(floor.p50),
            us(ours.p50) - us(control.p50),
            (ours_cpu.as_secs_f64() / ours.count.max(1) as f64)
                / (control_cpu.as_secs_f64() / control.count.max(1) as f64).max(1e-12),
        );
    }
}

/// One tenant's key, hot: a TOML GCRA policy that never denies at these rates.
const HOT_CONFIG: &str = r#"
[[policy]]
name = "hot"
tiers = [ { name = "t", algorithm = "gcra", limit = 1000000, per = "1s" } ]

[domain.bench]
descriptors = [ { keys = ["tenant"], policy = "hot" } ]
"#;

/// Scripts Redis has run, and the CPU time its process has used.
fn redis_work(redis: &RedisServer) -> (u64, Duration) {
    let scripts = ["evalsha", "eval"]
        .iter()
        .map(|c| redis.command_calls(c).unwrap())
        .sum();
    let info = redis.info("cpu").unwrap();
    let cpu: f64 = ["used_cpu_sys", "used_cpu_user"]
        .iter()
        .filter_map(|f| info_field(&info, f)?.parse::<f64>().ok())
        .sum();
    (scripts, Duration::from_secs_f64(cpu))
}

/// `cargo bench --bench rls -- hot`: every request on one tenant's key, on Redis, from the
/// server deciding each in Redis and from the server spending token leases (`--lease hot`),
/// in the same run: decisions/s, latency, the server's CPU, and what Redis did per decision.
async fn bench_hot(redis: &RedisServer) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hot.toml");
    std::fs::write(&path, HOT_CONFIG).unwrap();
    let url = redis.url();
    let flags = ["--redis", url.as_str(), "--redis-budget-ms", "1000"];
    let leased: Vec<&str> = flags.iter().copied().chain(["--lease", "hot"]).collect();
    let servers = [
        (
            "server, every decision in Redis",
            ServerProcess::start(&path, &flags),
        ),
        ("server, --lease hot", ServerProcess::start(&path, &leased)),
    ];
    println!(
        "
redis, one hot key"
    );
    println!(
        "    {:<34} {:>11}  {:>14}  {:>14}  {:>11}  {:>13}  {:>12}",
        "", "calls", "", "", "server CPU", "Redis scripts", "Redis CPU"
    );
    for in_flight in [1usize, 64, 256] {
        println!("  {in_flight} in flight");
        for (what, server) in &servers {
            let pool = server.clients().await;
            let cpu_before = server.cpu();
            let (scripts_before, redis_before) = redis_work(redis);
            let line = run(in_flight, move |_, i| {
                let mut client = pool[(i % pool.len() as u64) as usize].clone();
                async move {
                    let request = RateLimitRequest {
                        domain: "bench".into(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry {
                                key: "tenant".into(),
                                value: "hot".into(),
                            }],
                            ..RateLimitDescriptor::default()
                        }],
                        hits_addend: 0,
                    };
                    let answer = client.should_rate_limit(request).await.unwrap();
                    assert_eq!(answer.into_inner().overall_code, Code::Ok as i32);
                }
            })
            .await;
            let (scripts, redis_cpu) = redis_work(redis);
            let per = |n: f64| n / line.count.max(1) as f64;
            let cpu = server.cpu().saturating_sub(cpu_before);
            println!(
                "    {what:<34} {:>9.0}/s  p50 {:>8.1}µs  p99 {:>8.1}µs  {:>9.1}µs  {:>13.4}  {:>10.2}µs",
                line.per_sec,
                line.p50.as_secs_f64() * 1e6,
                line.p99.as_secs_f64() * 1e6,
                per(cpu.as_secs_f64() * 1e6),
                per((scripts - scripts_before) as f64),
                per(redis_cpu.saturating_sub(redis_before).as_secs_f64() * 1e6),
            );
        }
    }
}

/// `cargo bench --bench rls -- callgrind`: the server's instructions per decision on the memory
/// store and on Redis, counted by callgrind (repeatable on a busy machine, unlike time): the server runs
/// under `valgrind --tool=callgrind`, gets 500 requests to warm up, then its counters are
/// zeroed and `CALLGRIND_REQUESTS` more are sent, 64 in flight on 8 connections.
/// `flags`: the server's, or `None` for the bare tonic control.
async fn instructions_per_decision(name: &str, flags: Option<&[&str]>) {
    const CALLGRIND_REQUESTS: u64 = 4_000;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bench.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    let out = dir.path().join("callgrind.out");
    let mut command = Command::new("valgrind");
    command
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()));
    match flags {
        Some(flags) => command
            .arg(env!("CARGO_BIN_EXE_distlimit-server"))
            .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--config"])
            .arg(&config)
            .args(flags),
        None => command
            .arg(std::env::current_exe().unwrap())
            .env(CONTROL_ENV, Control::BareTonic.name()),
    };
    let mut child = command
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
    // `RLS_CALLGRIND_OUT=prefix` keeps the profiles as `prefix.bare`, `prefix.memory` and
    // `prefix.redis`, for `callgrind_annotate`.
    if let (Ok(keep), Some(dump)) = (std::env::var("RLS_CALLGRIND_OUT"), dumps.last()) {
        let which = name.split([' ', ',']).next().unwrap_or("server");
        std::fs::copy(dump, format!("{keep}.{which}")).unwrap();
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
    if let Ok(control) = std::env::var(CONTROL_ENV) {
        Control::serve(&control);
        return;
    }
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
            instructions_per_decision("bare tonic control, decides nothing", None).await;
            instructions_per_decision("memory store", Some(&[])).await;
            if let Some(redis) = RedisServer::start() {
                let url = redis.url();
                let flags = ["--redis", url.as_str(), "--redis-budget-ms", "5000"];
                instructions_per_decision("redis, hybrid", Some(&flags)).await;
            }
        });
        return;
    }
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    runtime.block_on(async {
        if wanted("memory") {
            bench_store("memory store", &[], Arc::new(MemoryStore::new())).await;
        }
        if !wanted("redis") && !wanted("hot") {
            return;
        }
        let Some(redis) = RedisServer::start() else {
            println!("\nredis: skipped (no redis-server)");
            return;
        };
        if wanted("redis") {
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
        }
        if wanted("hot") {
            bench_hot(&redis).await;
        }
        drop(redis);
    });
}
