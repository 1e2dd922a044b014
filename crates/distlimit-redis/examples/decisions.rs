//! A fixed number of decisions against a running Redis, for counting what one decision costs
//! inside Redis: run `redis-server` under `valgrind --tool=callgrind`, send a warm-up, zero its
//! counters (`callgrind_control -z`), send `COUNT` decisions, dump (`callgrind_control -d`), and
//! divide. Instruction counts do not depend on the machine's load, where the bench's
//! `µs inside Redis` (wall time) moves by half between runs on a busy machine.
//!
//! ```sh
//! cargo run --release -p distlimit-redis --example decisions -- \
//!     redis://127.0.0.1:6390 gcra 64 20000 0 1
//! ```
//!
//! Arguments: the URL, the algorithm (`token_bucket`, `gcra`, `fixed_window`, `sliding_log`,
//! `sliding_window`), the tasks deciding at once, the number of decisions, coalescing (`1`) or
//! not (`0`), and a seed. Quota 100 per second, keys drawn from 100 000 12-digit identities
//! (nearly every decision admitted and written), as `benches/redis.rs` does.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::cell::Cell;
use std::fmt::Write as _;
use std::rc::Rc;
use std::time::Duration;

use distlimit_core::{Algorithm, Key, Limit, Quota, Request, Store};
use distlimit_redis::RedisStore;

/// xorshift64: the next key's randomness.
fn next(rng: &Cell<u64>) -> u64 {
    let mut x = rng.get();
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng.set(x);
    x
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: decisions URL ALGORITHM TASKS COUNT COALESCE(0|1) SEED";
    assert!(args.len() == 7, "{usage}");
    let url = args[1].clone();
    let algorithm = Algorithm::ALL
        .into_iter()
        .find(|a| a.name() == args[2])
        .expect(usage);
    let tasks: usize = args[3].parse().expect(usage);
    let count: usize = args[4].parse().expect(usage);
    let coalesce = args[5] == "1";
    let seed: u64 = args[6].parse().expect(usage);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let store = RedisStore::builder(&url)
            .coalesce(coalesce)
            .response_timeout(Duration::from_secs(30))
            .connect()
            .await
            .unwrap();
        let limit = Limit::new(algorithm, Quota::per_second(100).unwrap());
        let local = tokio::task::LocalSet::new();
        let remaining = Rc::new(Cell::new(count));
        let mut handles = Vec::new();
        for task in 0..tasks {
            let store = store.clone();
            let remaining = Rc::clone(&remaining);
            handles.push(local.spawn_local(async move {
                let rng = Cell::new(
                    0x9E37_79B9_7F4A_7C15 ^ ((task as u64 + 1) * 0x1234_5678_9ABC) ^ seed,
                );
                let mut errors = 0;
                let mut id = String::with_capacity(12);
                while remaining.get() > 0 {
                    remaining.set(remaining.get() - 1);
                    id.clear();
                    write!(id, "{:012}", next(&rng) % 100_000).unwrap();
                    let request = Request::new(Key::new(&id).unwrap(), limit);
                    if store.decide(&request).await.is_err() {
                        errors += 1;
                    }
                }
                errors
            }));
        }
        let errors: usize = local
            .run_until(async {
                let mut errors = 0;
                for handle in handles {
                    errors += handle.await.unwrap();
                }
                errors
            })
            .await;
        println!("{count} decisions, {errors} errors");
    });
}
