//! One hot key, one instance, side by side in one run: the lease wrapper on Redis, the plain
//! Redis store and the memory store, each deciding one request after another (token bucket,
//! 10^9 per second, a burst of 10^7, so nothing is denied).
//!
//! Criterion measures the time per decision (`decide`, and for the wrapper also `decide_now`,
//! the synchronous path the policy limiter tries first). A counted run per store then prints
//! decisions per second and Redis calls per decision, counted by Redis itself (`INFO
//! commandstats`: `EVALSHA` + `EVAL` calls) and, for the wrapper, by its own stats.
//!
//! Group `settle`: the cost of settling (a report, a give-back: `Store::settle_all`) next to a plain
//! decision, on the memory store and on Redis, with 1 and 256 requests in flight (256 tasks,
//! 256 keys; the time is per request).
//!
//! `cargo bench -p distlimit-lease --bench lease` (starts its own `redis-server`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use distlimit_core::{Decision, Error, Key, Limit, Quota, Request, Settle, Store, StoreExt};
use distlimit_lease::Leased;
use distlimit_memory::MemoryStore;
use distlimit_redis::RedisStore;
use distlimit_test::server::RedisServer;

fn limit() -> Limit {
    Limit::token_bucket(
        Quota::per_second(1_000_000_000)
            .unwrap()
            .with_burst(10_000_000)
            .unwrap(),
    )
}

fn request(limit: Limit) -> Request<'static> {
    Request::new(Key::new("hot-key").unwrap(), limit)
        .with_policy("hot")
        .unwrap()
}

/// `EVALSHA` + `EVAL` calls Redis has answered so far.
async fn script_calls(admin: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split(',')
                .find_map(|f| f.split_once("calls=").map(|(_, n)| n))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

/// `n` decisions one after another (bounded by `limit` in time); decisions per second.
async fn counted<S: Store>(
    store: &S,
    request: &Request<'_>,
    n: u64,
    within: Duration,
) -> (u64, f64) {
    let start = Instant::now();
    let mut done = 0;
    while done < n && start.elapsed() < within {
        for _ in 0..1_000 {
            assert!(store.decide(request).await.unwrap().is_allowed());
        }
        done += 1_000;
    }
    (done, done as f64 / start.elapsed().as_secs_f64())
}

fn bench(c: &mut Criterion) {
    let server = RedisServer::start()
        .expect("no redis-server: set DISTLIMIT_REDIS_SERVER_BIN or put it on PATH");
    let url = server.url();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (redis, mut admin) = rt.block_on(async {
        let redis = RedisStore::builder(&url)
            .response_timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let client = redis::Client::open(url.as_str()).unwrap();
        (
            redis,
            client.get_multiplexed_async_connection().await.unwrap(),
        )
    });
    let leased = Leased::for_policies(["hot"]).build(redis.clone());
    let memory = MemoryStore::new();
    let limit = limit();
    let request = request(limit);

    let mut group = c.benchmark_group("one_hot_key");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    group.bench_function("leased_redis/decide", |b| {
        b.iter(|| rt.block_on(leased.decide(&request)).unwrap())
    });
    group.bench_function("leased_redis/decide_now", |b| {
        b.iter(|| match leased.decide_now(&request) {
            Some(answer) => answer.unwrap(),
            None => rt.block_on(leased.decide(&request)).unwrap(),
        })
    });
    group.bench_function("redis/decide", |b| {
        b.iter(|| rt.block_on(redis.decide(&request)).unwrap())
    });
    group.bench_function("memory/decide", |b| {
        b.iter(|| rt.block_on(memory.decide(&request)).unwrap())
    });
    group.finish();

    let mut group = c.benchmark_group("settle");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let stores: [(&str, Arc<dyn Store>); 2] = [
        ("memory", Arc::new(MemoryStore::new())),
        ("redis", Arc::new(redis.clone())),
    ];
    let keys: Arc<Vec<String>> = Arc::new((0..256).map(|i| format!("settle-{i}")).collect());
    for (name, store) in &stores {
        for op in ["decide", "report", "give_back"] {
            group.bench_function(format!("{name}/{op}/1"), |b| {
                b.iter(|| rt.block_on(apply(&**store, op, request)).unwrap())
            });
            group.bench_function(format!("{name}/{op}/256"), |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let start = Instant::now();
                        for _ in 0..iters {
                            let mut tasks = tokio::task::JoinSet::new();
                            for i in 0..256 {
                                let (store, keys) = (store.clone(), keys.clone());
                                tasks.spawn(async move {
                                    let key = Key::new(&keys[i]).unwrap();
                                    let r = Request::new(key, limit);
                                    apply(&*store, op, r).await.unwrap();
                                });
                            }
                            while tasks.join_next().await.is_some() {}
                        }
                        // Per request: 256 per iteration.
                        start.elapsed() / 256
                    })
                })
            });
        }
    }
    group.finish();

    // Counted runs: decisions per second and Redis calls per decision.
    rt.block_on(async {
        let within = Duration::from_secs(3);
        println!("\nstore           decisions   decisions/s   Redis calls/decision");
        let before = (script_calls(&mut admin).await, leased.stats().store_calls);
        let (n, rate) = counted(&leased, &request, 3_000_000, within).await;
        let calls = script_calls(&mut admin).await - before.0;
        let own = leased.stats().store_calls - before.1;
        println!(
            "leased_redis  {n:>11} {rate:>13.0}   {:.6} (Redis) {:.6} (wrapper)",
            calls as f64 / n as f64,
            own as f64 / n as f64
        );
        let before = script_calls(&mut admin).await;
        let (n, rate) = counted(&redis, &request, 100_000, within).await;
        let calls = script_calls(&mut admin).await - before;
        println!(
            "redis         {n:>11} {rate:>13.0}   {:.6}",
            calls as f64 / n as f64
        );
        let (n, rate) = counted(&memory, &request, 3_000_000, within).await;
        println!("memory        {n:>11} {rate:>13.0}   0");
    });
    drop(server);
}

criterion_group!(benches, bench);
criterion_main!(benches);

/// Decides `request` (`op` "decide"), or settles it: a report, else a give-back.
async fn apply(store: &dyn Store, op: &str, request: Request<'_>) -> Result<Decision, Error> {
    match op {
        "decide" => store.decide(&request).await,
        "report" => store.settle(Settle::Report(request)).await,
        _ => store.settle(Settle::GiveBack(request)).await,
    }
}
