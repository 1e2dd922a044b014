//! Decisions/s and p50/p99 latency of `ShouldRateLimit` over gRPC on loopback, at 1, 64 and
//! 256 requests in flight, side by side with the store's own `decide_all` (and the checker
//! without gRPC) in the same run: memory store, and Redis when a `redis-server` can be started.
//!
//! `cargo bench -p distlimit-server --bench rls` (bounded: at most `ROUNDS` decisions and
//! `MAX_TIME` per line).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs,
    unreachable_pub
)]

use std::future::Future;
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
use tokio::net::TcpListener;

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

async fn bench_store(name: &str, flags: &[&str], store: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.yaml");
    std::fs::write(&path, CONFIG).unwrap();
    let mut argv = vec![
        "distlimit-server",
        "--grpc",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--config",
        path.to_str().unwrap(),
    ];
    argv.extend_from_slice(flags);
    let args = Args::parse_from(argv);
    let server = Server::build(&args).await.unwrap();
    let checker: Arc<Checker> = server.checker().clone();
    let grpc = TcpListener::bind(args.grpc).await.unwrap();
    let http = TcpListener::bind(args.http).await.unwrap();
    let addr = grpc.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve(grpc, http, async move {
        let _ = stopped.await;
    }));
    // Eight HTTP/2 connections, as a few Envoy workers would hold.
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(
            RateLimitServiceClient::connect(format!("http://{addr}"))
                .await
                .unwrap(),
        );
    }
    let limit =
        Limit::fixed_window(Quota::from_parts(u64::from(u32::MAX), 3_600_000_000, 1).unwrap());

    println!("\n{name}");
    println!(
        "{:>9} | {:>28} | {:>28} | {:>28} | {:>13}",
        "in flight",
        "store decide_all",
        "checker (no gRPC)",
        "gRPC ShouldRateLimit",
        "gRPC / store"
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
        let over_grpc = run(in_flight, move |i| {
            let mut client = pool[(i % pool.len() as u64) as usize].clone();
            async move {
                client.should_rate_limit(grpc_request(i)).await.unwrap();
            }
        })
        .await;
        let show = |l: &Line| {
            format!(
                "{:>8.0}/s p50 {:>6.1}µs p99 {:>6.1}µs",
                l.per_sec,
                l.p50.as_secs_f64() * 1e6,
                l.p99.as_secs_f64() * 1e6
            )
        };
        println!(
            "{in_flight:>9} | {} | {} | {} | {:>5.1}% +{:.1}µs p50",
            show(&own),
            show(&direct),
            show(&over_grpc),
            over_grpc.per_sec / own.per_sec * 100.0,
            (over_grpc.p50.as_secs_f64() - own.p50.as_secs_f64()) * 1e6,
        );
    }
    let _ = stop.send(());
    let _ = serving.await;
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        bench_store("memory store", &[], Arc::new(MemoryStore::new())).await;
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
