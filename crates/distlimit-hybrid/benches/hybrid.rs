//! What the hybrid store costs and saves, side by side in one run against one private
//! `redis-server`:
//!
//! * `closed`: `Hybrid` (closed breaker, blocked-key cache on) over a `RedisStore` against that
//!   same `RedisStore` called bare (`Hybrid::primary`: one connection, the same keys), one
//!   decision in flight, random keys out of 100 000 (nearly all admitted: the expensive path).
//! * `open`: `Hybrid` with its breaker open (a primary that always fails, a one-hour cool-off)
//!   over a `MemoryStore` fallback (1 or 4 instances; answered through `Store::decide_now`, or
//!   awaited behind a wrapper that never answers it), against the bare `MemoryStore`, both
//!   called through `Store::decide` on one runtime, on one hot key and on 10 000 keys.
//!
//! Every comparison alternates the two contenders in rounds, each going first in every other
//! round, so the machine's drifting load and any order effect fall on both alike.
//! * `flood`: 100 000 requests on one denied key with and without the blocked-key cache, counting
//!   the scripts Redis ran (`INFO commandstats`).
//! * `outage`: 8 paced tasks deciding while the server is stopped with SIGSTOP (a hung server),
//!   under the default opening rule: the latency distribution, how many decisions waited the
//!   time budget, and the slowest.
//!
//! Run with `cargo bench -p distlimit-hybrid --bench hybrid [-- closed|open|flood|outage]` (or
//! `cargo xtask bench`); it starts
//! `redis-server` from `DISTLIMIT_REDIS_SERVER_BIN` or the `PATH` and kills it by its PID.

// A benchmark binary: it prints its table, and setup that cannot fail in practice aborts loudly.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use distlimit_core::{Decision, Error, Key, Limit, Quota, Request, Settle, Store, StoreExt};
use distlimit_hybrid::{Hybrid, OpenRule};
use distlimit_memory::MemoryStore;
use distlimit_redis::RedisStore;
use distlimit_test::server::RedisServer;
use distlimit_test::{Fault, FaultKind, FaultyStore};

/// Rounds per comparison: each round runs both contenders back to back, and the ratio reported is
/// the median of the rounds' ratios, which a shared machine's drifting load affects least.
const ROUNDS: usize = 61;
const REDIS_PER_ROUND: usize = 500;
const MEMORY_PER_ROUND: usize = 50_000;
const FLOOD: usize = 100_000;
const BUDGET: Duration = Duration::from_millis(50);

fn main() {
    // `cargo bench` passes `--bench`; other arguments select groups by name.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |group: &str| filters.is_empty() || filters.iter().any(|f| group.contains(f));
    let Some(server) = RedisServer::start() else {
        println!("skipped: no redis-server");
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("redis-server on {} (pid {:?})", server.url(), server.pid());
    if wanted("closed") {
        rt.block_on(closed(&server));
    }
    if wanted("open") {
        rt.block_on(open());
    }
    if wanted("flood") {
        rt.block_on(flood(&server));
    }
    if wanted("outage") {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(outage(&server));
    }
}

async fn redis(server: &RedisServer) -> RedisStore {
    RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The medians of `a`'s and `b`'s per-round times, and the median of the per-round ratios b / a.
fn compare(a: Vec<f64>, b: Vec<f64>) -> (f64, f64, f64) {
    let ratios = a.iter().zip(&b).map(|(a, b)| b / a).collect();
    (median(a), median(b), median(ratios))
}

/// A cheap xorshift for key choice, the same sequence for every contender.
struct Keys(u64);

impl Keys {
    fn next(&mut self, space: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % space
    }
}

/// `space` key names (at most 100 000).
fn names(space: u64) -> Vec<String> {
    (0..space.min(100_000))
        .map(|i| format!("{i:012}"))
        .collect()
}

async fn run_round<S: Store + ?Sized>(store: &S, limit: Limit, n: usize, names: &[String]) -> f64 {
    let mut keys = Keys(0x9E37_79B9_7F4A_7C15);
    let start = Instant::now();
    for _ in 0..n {
        let name = &names[keys.next(names.len() as u64) as usize];
        let request = Request::new(Key::new(name).unwrap(), limit);
        black_box(store.decide(&request).await.unwrap());
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

/// `ROUNDS` rounds of `n` decisions on `bare` (under `limits.0`) and on `hybrid` (under
/// `limits.1`), alternating which goes first; their per-round times (ns per decision).
async fn rounds<A: Store, B: Store>(
    bare: &A,
    hybrid: &B,
    (bare_limit, limit): (Limit, Limit),
    n: usize,
    names: &[String],
) -> (Vec<f64>, Vec<f64>) {
    run_round(bare, bare_limit, n, names).await;
    run_round(hybrid, limit, n, names).await;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            a.push(run_round(bare, bare_limit, n, names).await);
            b.push(run_round(hybrid, limit, n, names).await);
        } else {
            b.push(run_round(hybrid, limit, n, names).await);
            a.push(run_round(bare, bare_limit, n, names).await);
        }
    }
    (a, b)
}

async fn closed(server: &RedisServer) {
    let hybrid = Hybrid::builder(redis(server).await, MemoryStore::new())
        .budget(BUDGET)
        .build()
        .unwrap();
    let bare = hybrid.primary();
    let limit = Limit::gcra(Quota::per_second(100).unwrap());
    let names = names(100_000);
    let (a, b) = rounds(bare, &hybrid, (limit, limit), REDIS_PER_ROUND, &names).await;
    let (a, b, ratio) = compare(a, b);
    println!(
        "closed, 1 in flight: bare RedisStore {:.1} µs, Hybrid {:.1} µs: {ratio:.3}x (target <= \
         1.05)",
        a / 1e3,
        b / 1e3,
    );
    assert_eq!(hybrid.stats().fallback, 0);
    // What any time budget costs: the same store under a bare `tokio::time::timeout`.
    let timed = Budgeted(bare);
    let (a, b) = rounds(bare, &timed, (limit, limit), REDIS_PER_ROUND, &names).await;
    let (a, b, ratio) = compare(a, b);
    println!(
        "closed, reference: bare RedisStore {:.1} µs, under tokio::time::timeout alone {:.1} µs: \
         {ratio:.3}x",
        a / 1e3,
        b / 1e3,
    );
}

/// A store under a bare `tokio::time::timeout` of the hybrid's budget, nothing else.
struct Budgeted<'a>(&'a RedisStore);

#[async_trait::async_trait]
#[warn(clippy::missing_trait_methods)]
impl Store for Budgeted<'_> {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        tokio::time::timeout(BUDGET, self.0.decide(request))
            .await
            .unwrap_or(Err(Error::Timeout {
                store: "redis",
                after: BUDGET,
            }))
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        tokio::time::timeout(BUDGET, self.0.decide_all(requests))
            .await
            .unwrap_or(Err(Error::Timeout {
                store: "redis",
                after: BUDGET,
            }))
    }

    fn decide_now(&self, request: &Request<'_>) -> Option<Result<Decision, Error>> {
        self.0.decide_now(request)
    }

    // Batches are always awaited (`decide_all`): `None` is always a correct answer.
    fn decide_all_now(&self, _: &[Request<'_>], _: &mut [Decision]) -> Option<Result<(), Error>> {
        None
    }

    // Not measured here: forwarded as it is.
    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        self.0.settle_all(settles).await
    }
}

/// A store that must be awaited: forwards `decide` and `decide_all`, never answers at once.
struct Awaited(MemoryStore);

#[async_trait::async_trait]
#[warn(clippy::missing_trait_methods)]
impl Store for Awaited {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        self.0.decide(request).await
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        self.0.decide_all(requests).await
    }

    /// Never answers at once: what this wrapper exists to measure.
    fn decide_now(&self, _: &Request<'_>) -> Option<Result<Decision, Error>> {
        None
    }

    // Batches are always awaited (`decide_all`): `None` is always a correct answer.
    fn decide_all_now(&self, _: &[Request<'_>], _: &mut [Decision]) -> Option<Result<(), Error>> {
        None
    }

    // Not measured here: forwarded as it is.
    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        self.0.settle_all(settles).await
    }
}

async fn open() {
    for (label, space) in [("one hot key", 1u64), ("10 000 keys", 10_000)] {
        for instances in [1, 4] {
            open_case(label, space, instances, MemoryStore::new(), "").await;
            open_case(
                label,
                space,
                instances,
                Awaited(MemoryStore::new()),
                ", awaited fallback",
            )
            .await;
        }
    }
}

async fn open_case<F: Store>(label: &str, space: u64, instances: u64, fallback: F, how: &str) {
    const RATE: u64 = 1_000_000_000;
    let limit = Limit::gcra(Quota::per_second(RATE).unwrap());
    let bare = MemoryStore::new();
    let failing =
        FaultyStore::new(MemoryStore::new()).with_default(Fault::Fail(FaultKind::Unavailable));
    let hybrid = Hybrid::builder(failing, fallback)
        .open_after(OpenRule::ConsecutiveFailures(1))
        .cool_off(Duration::from_secs(3600))
        .instances(instances)
        .build()
        .unwrap();
    hybrid.check("open it", limit).await.unwrap();
    let names = names(space);
    // The bare store decides the limit the fallback does: this instance's share.
    let share = Limit::gcra(Quota::per_second(RATE / instances).unwrap());
    let (a, b) = rounds(&bare, &hybrid, (share, limit), MEMORY_PER_ROUND, &names).await;
    let (a, b, ratio) = compare(a, b);
    println!(
        "open, {label}, {instances} instance(s){how}: bare MemoryStore {a:.1} ns, Hybrid on its \
         fallback {b:.1} ns: {ratio:.2}x (target <= 2)"
    );
    assert_eq!(hybrid.primary().calls(), 1);
}

async fn flood(server: &RedisServer) {
    let limit = Limit::token_bucket(Quota::per_minute(10).unwrap());
    let mut calls = Vec::new();
    for (label, cache) in [
        ("without the cache", None),
        ("with the cache", Some(10_000)),
    ] {
        let hybrid = Hybrid::builder(redis(server).await, MemoryStore::new())
            .blocked_cache(cache)
            .build()
            .unwrap();
        server.command(&["CONFIG", "RESETSTAT"]).unwrap();
        let key = format!("abuser {label}");
        let start = Instant::now();
        let mut allowed = 0;
        for _ in 0..FLOOD {
            allowed += usize::from(hybrid.check(&key, limit).await.unwrap().is_allowed());
        }
        let elapsed = start.elapsed();
        let scripts =
            server.command_calls("evalsha").unwrap() + server.command_calls("eval").unwrap();
        println!(
            "flood of {FLOOD} on one key, {label}: {scripts} Redis calls, {allowed} admitted, \
             {:.2} µs per request",
            elapsed.as_nanos() as f64 / FLOOD as f64 / 1e3
        );
        calls.push(scripts as f64);
    }
    println!(
        "flood: {:.3}% fewer Redis calls with the cache (target >= 99%)",
        100.0 * (1.0 - calls[1] / calls[0])
    );
}

async fn outage(server: &RedisServer) {
    let cool_off = Duration::from_secs(1);
    let hybrid = Arc::new(
        Hybrid::builder(redis(server).await, MemoryStore::new())
            .budget(BUDGET)
            .cool_off(cool_off)
            .instances(4)
            .build()
            .unwrap(),
    );
    let limit = Limit::gcra(Quota::per_second(1_000_000).unwrap());
    hybrid.check("warm", limit).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    server.pause().unwrap();
    let started = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let (hybrid, stop) = (hybrid.clone(), stop.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                for i in 0..100_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let key = format!("{}", (i * 8 + t) % 1000);
                    let start = Instant::now();
                    hybrid.check(&key, limit).await.unwrap();
                    latencies.push(start.elapsed());
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                latencies
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed();
    server.resume().unwrap();
    all.sort();
    let at = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    let waited = all.iter().filter(|&&l| l >= BUDGET).count();
    let stats = hybrid.stats();
    println!(
        "outage (SIGSTOP), {} decisions in {elapsed:.1?} from 8 tasks: p50 {:?}, p99 {:?}, \
         p99.9 {:?}, max {:?}; {waited} waited the {BUDGET:?} budget ({} timeouts: {} calls \
         sent before the breaker opened, then {} probes, one per {cool_off:?} cool-off)",
        all.len(),
        at(0.5),
        at(0.99),
        at(0.999),
        all[all.len() - 1],
        stats.timeouts,
        stats.timeouts - stats.probes,
        stats.probes,
    );
}
