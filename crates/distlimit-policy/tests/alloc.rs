//! Allocation counting: a single-tier check through the limiter on the memory store allocates
//! nothing at all, through `check` or `check_now` (the store answers `Store::decide_now`, so
//! not even the store's own `async_trait` future box is made); a multi-tier check through
//! `check` is decided at once too (`Store::decide_all_now`) and allocates exactly one `Vec`, its
//! verdict's decisions (the store's `decide_all` would allocate that and its future box); both
//! also while another thread swaps the policies.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use distlimit_core::{Key, Limit, ManualClock, Quota, Request, Store};
use distlimit_memory::MemoryStore;
use distlimit_policy::{Limiter, Policy, PolicySet, Tier};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const ROUNDS: u64 = 100;

/// Runs a future that completes on its first poll (every memory store future does).
fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the memory store never waits"),
    }
}

fn blocks() -> u64 {
    dhat::HeapStats::get().total_blocks
}

fn limits() -> (Limit, Limit) {
    let big = Quota::per_second(1_000_000_000).unwrap();
    (Limit::token_bucket(big), Limit::gcra(big))
}

fn set(version: u64) -> PolicySet {
    let (a, b) = limits();
    let a = Limit::new(
        a.algorithm(),
        Quota::per_second(a.quota().limit() - version).unwrap(),
    );
    PolicySet::builder()
        .policy(Policy::new("one").tier(Tier::new("t", a)))
        .policy(
            Policy::new("two")
                .tier(Tier::new("t", a))
                .tier(Tier::new("u", b)),
        )
        .build()
        .unwrap()
}

// One test: dhat counts for the whole process, so nothing else may run beside it.
#[test]
fn a_check_allocates_only_what_the_store_does() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let store = Arc::new(
        MemoryStore::builder()
            .clock(ManualClock::new(1_700_000_000_000_000))
            .build(),
    );
    let limiter = Limiter::new(store.clone(), set(0));
    let keys: Vec<String> = (0..100).map(|i| format!("user-{i}")).collect();
    let (a, b) = limits();

    // The store itself, not through the `Arc` (whose `Store` impl adds a future box of its own).
    let direct = |tiers: usize, rounds: u64| {
        let store: &MemoryStore<ManualClock> = &store;
        for _ in 0..rounds {
            for key in &keys {
                let key = Key::new(key).unwrap();
                if tiers == 1 {
                    let one = Request::new(key, a).with_policy("one/t").unwrap();
                    assert!(now(store.decide(&one)).unwrap().is_allowed());
                } else {
                    let two = [
                        Request::new(key, a).with_policy("two/t").unwrap(),
                        Request::new(key, b).with_policy("two/u").unwrap(),
                    ];
                    assert_eq!(now(store.decide_all(&two)).unwrap().len(), 2);
                }
            }
        }
    };
    let through = |limiter: &Limiter<MemoryStore<ManualClock>>, tiers: usize, rounds: u64| {
        let policy = if tiers == 1 { "one" } else { "two" };
        for _ in 0..rounds {
            for key in &keys {
                let verdict = now(limiter.check(policy, key.as_bytes())).unwrap();
                assert!(verdict.is_allowed());
                assert_eq!(verdict.tiers().len(), tiers);
                // `check_now` decides one tier, leaves two to the future.
                match limiter.check_now(policy, key.as_bytes(), 1) {
                    Some(verdict) => assert!(tiers == 1 && verdict.unwrap().is_allowed()),
                    None => assert_eq!(tiers, 2),
                }
            }
        }
    };
    let checks = ROUNDS * keys.len() as u64;

    // Warm up: every key in the store.
    for tiers in [1, 2] {
        direct(tiers, 1);
        through(&limiter, tiers, 1);
    }
    let mut store_blocks = [0; 2];
    for tiers in [1, 2] {
        let before = blocks();
        direct(tiers, ROUNDS);
        store_blocks[tiers - 1] = blocks() - before;

        let before = blocks();
        through(&limiter, tiers, ROUNDS);
        let limiter_blocks = blocks() - before;
        eprintln!(
            "{checks} checks of {tiers} tiers: store {} blocks, limiter {limiter_blocks} blocks",
            store_blocks[tiers - 1]
        );
        let expected = if tiers == 1 { 0 } else { checks };
        assert_eq!(limiter_blocks, expected);
    }

    // Again while another thread swaps two prepared sets as fast as it can (publishing a
    // shared set allocates nothing; arc-swap's per-thread bookkeeping is set up in the warm-up).
    let sets = [Arc::new(set(0)), Arc::new(set(1))];
    let limiter = Arc::new(limiter);
    let stop = Arc::new(AtomicBool::new(false));
    let swapped = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (limiter, stop, swapped) = (limiter.clone(), stop.clone(), swapped.clone());
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(60) {
                limiter
                    .replace_shared(sets[(swaps % 2) as usize].clone())
                    .unwrap();
                swaps += 1;
                swapped.store(swaps, Ordering::Relaxed);
            }
            swaps
        })
    };
    // The swapping thread's own start-up (thread locals, arc-swap's per-thread node) allocates:
    // measure only once it is swapping.
    let started = Instant::now();
    while swapped.load(Ordering::Relaxed) < 1_000 && started.elapsed() < Duration::from_secs(60) {
        std::thread::yield_now();
    }
    for tiers in [1, 2] {
        through(&limiter, tiers, 1);
    }
    let mut swapping_blocks = [0; 2];
    for tiers in [1, 2] {
        let before = blocks();
        through(&limiter, tiers, ROUNDS);
        swapping_blocks[tiers - 1] = blocks() - before;
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    eprintln!("while {swaps} swaps: limiter {swapping_blocks:?} blocks");
    assert!(swaps > 0);
    assert_eq!(swapping_blocks, [0, checks]);
}
