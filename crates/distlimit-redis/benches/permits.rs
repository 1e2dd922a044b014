//! The cost of a concurrency permit (an acquire and its release) next to a plain rate-limit
//! decision, on the memory store and on Redis, at 1 and 256 in flight, side by side in one run.
//!
//! Run with `cargo bench -p distlimit-redis --bench permits`. It starts a private
//! `redis-server` (from `DISTLIMIT_REDIS_SERVER_BIN`, else `PATH`) through the workspace's
//! harness, killed by its PID at the end. Everything runs on one current-thread tokio runtime.
//!
//! * `decision`: `Store::decide` of GCRA, 1 000 000 per second (always admitted: every decision
//!   writes), on random keys out of [`KEY_SPACE`];
//! * `acquire+release`: `PermitStore::acquire` then `PermitStore::release` of the permit, max
//!   1 000 000 in flight (always admitted), on random keys out of [`KEY_SPACE`]: two calls, two
//!   round trips on Redis.
//!
//! Each cell is the median of [`ROUNDS`] rounds; the rounds interleave the two operations, so a
//! shared machine's load drifts over both alike. Each run stops after its count of operations or
//! [`RUN_LIMIT`], whichever comes first. The table gives operations per second and the ratio of
//! a pair's time to a decision's.

// A benchmark binary: it prints its table, and setup that cannot fail in practice aborts loudly.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlimit_core::{Key, Limit, PermitLimit, PermitRequest, PermitStore, Quota, Request, Store};
use distlimit_memory::MemoryStore;
use distlimit_redis::RedisStore;
use distlimit_test::server::RedisServer;

/// Distinct keys the operations pick from.
const KEY_SPACE: u64 = 100_000;
/// Rounds per cell (the median is reported).
const ROUNDS: usize = 3;
/// The most one run may take.
const RUN_LIMIT: Duration = Duration::from_secs(4);
/// Operations in flight.
const IN_FLIGHT: [usize; 2] = [1, 256];

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Decide,
    Pair,
}

/// A tiny deterministic generator (xorshift), one per task.
struct Rng(u64);

impl Rng {
    fn key(&mut self) -> String {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        format!("user:{:012}", self.0 % KEY_SPACE)
    }
}

/// Operations per second of `op` on `store` with `in_flight` tasks, `total` operations at most.
async fn run<S: Store + PermitStore + 'static>(
    store: &Arc<S>,
    op: Op,
    in_flight: usize,
    total: usize,
) -> f64 {
    let limit = Limit::gcra(Quota::per_second(1_000_000).unwrap());
    let permits = PermitLimit::new(1 << 16, Duration::from_secs(60)).unwrap();
    let started = Instant::now();
    let done = Rc::new(std::cell::Cell::new(0usize));
    let local = tokio::task::LocalSet::new();
    for task in 0..in_flight {
        let (store, done) = (Arc::clone(store), Rc::clone(&done));
        let per_task = total / in_flight;
        local.spawn_local(async move {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (task as u64 + 1));
            for _ in 0..per_task {
                if started.elapsed() > RUN_LIMIT {
                    break;
                }
                let key = rng.key();
                let key = Key::new(&key).unwrap();
                match op {
                    Op::Decide => {
                        let d = store.decide(&Request::new(key, limit)).await.unwrap();
                        assert!(d.is_allowed());
                    }
                    Op::Pair => {
                        let request = PermitRequest::new(key, permits);
                        let d = store.acquire(&request).await.unwrap();
                        let id = d.permit().expect("always admitted");
                        assert!(store.release(&request, id).await.unwrap());
                    }
                }
                done.set(done.get() + 1);
            }
        });
    }
    local.await;
    done.get() as f64 / started.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn cells<S: Store + PermitStore + 'static>(
    name: &str,
    store: Arc<S>,
    totals: [usize; 2],
    out: &mut Vec<String>,
) {
    for (&in_flight, &total) in IN_FLIGHT.iter().zip(&totals) {
        run(&store, Op::Decide, in_flight, total / 10).await;
        run(&store, Op::Pair, in_flight, total / 10).await;
        let (mut decide, mut pair) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            decide.push(run(&store, Op::Decide, in_flight, total).await);
            pair.push(run(&store, Op::Pair, in_flight, total).await);
        }
        let (d, p) = (median(decide), median(pair));
        out.push(format!(
            "| {name} | {in_flight} | {d:.0} | {p:.0} | {:.2} |",
            d / p
        ));
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server =
        RedisServer::start().expect("a redis-server binary (DISTLIMIT_REDIS_SERVER_BIN or PATH)");
    let mut rows = Vec::new();
    runtime.block_on(async {
        cells(
            "memory",
            Arc::new(MemoryStore::new()),
            [400_000, 400_000],
            &mut rows,
        )
        .await;
        let redis = RedisStore::connect(&server.url()).await.unwrap();
        cells("redis", Arc::new(redis), [20_000, 100_000], &mut rows).await;
    });
    println!(
        "| store | in flight | decisions/s | acquire+release pairs/s | pair time / decision time |"
    );
    println!("|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
    drop(server);
}
