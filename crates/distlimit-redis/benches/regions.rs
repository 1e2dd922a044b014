//! Decision latency in a far region: `RegionStore` (pools in the region's own Redis, refilled
//! from home across a 40 ms each-way link) against the single-region setup (`RedisStore` on
//! the same Redis, every decision there), and against deciding at home across the link.
//!
//! Run with `cargo bench -p distlimit-redis --bench regions`. It starts two `redis-server`s
//! (home and the far region) with the workspace's harness (`distlimit_test::server`: free
//! loopback ports, killed by PID at the end) and a `distlimit_test::Proxy` between them.
//! One decision in flight, token bucket of 1 000 000 per second (every decision admitted, so
//! pools keep being refilled ahead of need). The region store and the single-region store are
//! measured in interleaved rounds ([`ROUNDS`] × [`PER_ROUND`] decisions each), so that the load
//! of a shared machine drifts over both alike; the ratio of their medians is the row to read.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::time::{Duration, Instant};

use distlimit_core::{Key, Limit, Quota, Request, Store};
use distlimit_redis::{RedisStore, RegionBuilder};
use distlimit_test::Proxy;
use distlimit_test::server::RedisServer;

/// Interleaved rounds per store.
const ROUNDS: usize = 20;
/// Decisions per store per round.
const PER_ROUND: usize = 500;
/// Decisions made at home across the link (each a round trip of 80 ms).
const AT_HOME: usize = 30;

/// Times `n` decisions; answers how many were denied.
async fn time<S: Store>(
    store: &S,
    request: &Request<'_>,
    n: usize,
    out: &mut Vec<Duration>,
) -> usize {
    let mut denied = 0;
    for _ in 0..n {
        let start = Instant::now();
        let decision = store.decide(request).await.unwrap();
        out.push(start.elapsed());
        denied += usize::from(decision.is_denied());
    }
    denied
}

fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
    samples[i]
}

fn main() {
    let home = RedisServer::start().expect("the bench needs redis-server");
    let far = RedisServer::start().expect("the bench needs redis-server");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let link = Proxy::with_delay(home.addr().parse().unwrap(), Duration::from_millis(40)).unwrap();
        let home_store = RedisStore::builder(link.redis_url())
            .response_timeout(Duration::from_secs(1))
            .connect()
            .await
            .unwrap();
        let local = RedisStore::connect(&far.url()).await.unwrap();
        let region = RegionBuilder::default().build(
            home_store.clone(),
            RedisStore::connect(&far.url()).await.unwrap(),
        );
        let limit = Limit::token_bucket(Quota::per_second(1_000_000).unwrap());
        let key = Key::new("tenant-7").unwrap();
        let request = Request::new(key, limit).with_policy("bench").unwrap();
        let single = Request::new(key, limit).with_policy("single").unwrap();
        // Warm up at the measured pace for half a second: connections, the script cache, and
        // the pool's first refills (a key new to a region is denied there until they arrive,
        // about two round trips to home), then refills sized to this demand.
        let mut warm = Vec::new();
        let warm_until = Instant::now() + Duration::from_millis(500);
        while Instant::now() < warm_until {
            time(&region, &request, PER_ROUND, &mut warm).await;
            time(&local, &single, PER_ROUND, &mut warm).await;
            warm.clear();
        }
        let (mut ours, mut baseline) = (Vec::new(), Vec::new());
        let mut denied = 0;
        for _ in 0..ROUNDS {
            denied += time(&region, &request, PER_ROUND, &mut ours).await;
            denied += time(&local, &single, PER_ROUND, &mut baseline).await;
        }
        let mut at_home = Vec::new();
        time(&home_store, &single, AT_HOME, &mut at_home).await;
        let stats = region.stats();
        let (p50, b50) = (quantile(&mut ours, 0.5), quantile(&mut baseline, 0.5));
        let (p99, b99) = (quantile(&mut ours, 0.99), quantile(&mut baseline, 0.99));
        let h50 = quantile(&mut at_home, 0.5);
        println!("one decision in flight, far region, home 40 ms away each way");
        println!("| setup | p50 | p99 | p50 / single region |");
        println!("|---|---|---|---|");
        println!("| single region (`RedisStore` on the region's Redis) | {b50:?} | {b99:?} | 1.00 |");
        println!(
            "| `RegionStore` (pool in the region's Redis, home across the link) | {p50:?} | {p99:?} | {:.2} |",
            p50.as_secs_f64() / b50.as_secs_f64()
        );
        println!(
            "| `RedisStore` at home across the link | {h50:?} | | {:.0} |",
            h50.as_secs_f64() / b50.as_secs_f64()
        );
        println!(
            "region store: {} decisions ({denied} denied), {} refills ({} failed), {} units from home",
            ours.len(),
            stats.refills,
            stats.refill_failures,
            stats.from_home
        );
    });
}
