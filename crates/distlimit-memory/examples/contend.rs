//! Threads contending for the store's shard locks: `<threads>` threads make 2 000 000 GCRA
//! decisions in all, each cycling over the same `<keys>` 8-byte keys (1: every thread on one
//! key, one shard; 64: a few shards), and the wall time per decision is printed.
//!
//! `cargo run --release -p distlimit-memory --example contend -- <threads> <keys>`; see
//! `docs/measurements/2026-12-04-spin-lock.md`.

// A measurement driver: bad arguments abort loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::time::Instant;

use distlimit_core::{Key, Limit, Quota, Request};
use distlimit_memory::MemoryStore;

const DECISIONS: u64 = 2_000_000;

fn main() {
    let arg = |i: usize| -> u64 {
        let usage = "usage: contend <threads> <keys>";
        std::env::args().nth(i).expect(usage).parse().expect(usage)
    };
    let (threads, keys) = (arg(1).max(1), arg(2).max(1));
    let store = Arc::new(MemoryStore::new());
    // Nothing is denied: a burst of 10^9.
    let limit = Limit::gcra(
        Quota::per_second(1)
            .unwrap()
            .with_burst(1_000_000_000)
            .unwrap(),
    );
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut allowed = 0u64;
                for i in 0..DECISIONS / threads {
                    let key = ((i * 7919 + t) % keys).to_le_bytes();
                    let request = Request::new(Key::new(&key).unwrap(), limit);
                    allowed += u64::from(store.decide_sync(&request).is_allowed());
                }
                allowed
            })
        })
        .collect();
    let allowed: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let per_decision = started.elapsed().as_nanos() as f64 / (DECISIONS / threads * threads) as f64;
    println!(
        "{threads} threads, {keys} keys: {per_decision:.1} ns per decision ({allowed} allowed)"
    );
}
