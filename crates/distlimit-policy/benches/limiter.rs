//! What the limiter adds to a decision: `Limiter::check_now` and `Limiter::check` next to the
//! memory store called directly with the same request, on the same store, policy and keys.
//!
//! Run with `cargo bench -p distlimit-policy --bench limiter`. Benchmark ids read
//! `<group>/<contender>`:
//!
//! * `store`: `MemoryStore::decide_sync` (no future), with `Key::new` and
//!   `Request::new(..).with_policy("api/t")` built per call like a caller does; in
//!   `three_tiers`, `Store::decide_all` of the three requests.
//! * `limiter_now`: `Limiter::check_now("api", key, 1)`: policy load and lookup, the request,
//!   the store's `decide_now`, the verdict (built and dropped).
//! * `limiter`: `Limiter::check("api", key)`, its future polled once with a no-op waker.
//! * Groups: `hot_key` (one key), `keys_10k` (10 000 keys in turn), `hot_key_publishing` (one
//!   key while another thread publishes a policy set every 100 µs), `three_tiers` (a policy of
//!   three tiers, 10 000 keys).
//!
//! After each group, paired rounds print each contender's fastest round of 10 000 calls next
//! to the store's (rounds alternate who goes first, so load from other processes hits both
//! alike): the figures the README reports. The quotas admit everything during a run, so the
//! admitting path is measured.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use distlimit_core::{Key, Limit, MAX_LIMIT, Quota, Request, Store};
use distlimit_memory::MemoryStore;
use distlimit_policy::{Limiter, Policy, PolicySet, Tier};

/// Polls a future once: the memory store never waits.
fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the memory store never waits"),
    }
}

/// 100 units a second with a burst of 2^32: nothing is denied during a run, and every key's
/// state stays live between its calls.
fn limit() -> Limit {
    Limit::token_bucket(
        Quota::per_second(100)
            .unwrap()
            .with_burst(MAX_LIMIT)
            .unwrap(),
    )
}

/// `api` with `tiers` tiers (`t`, `t1`, `t2`...), next to two other policies.
fn set(tiers: usize) -> PolicySet {
    let mut api = Policy::new("api").tier(Tier::new("t", limit()));
    for i in 1..tiers {
        api = api.tier(Tier::new(format!("t{i}"), limit()));
    }
    PolicySet::builder()
        .policy(Policy::new("other").tier(Tier::new("t", limit())))
        .policy(api)
        .policy(Policy::new("third").tier(Tier::new("t", limit())))
        .build()
        .unwrap()
}

// Each contender is a function of its own, never inlined, so that no side is spared a call.

#[inline(never)]
fn store_call(store: &MemoryStore, key: &str) -> bool {
    let request = Request::new(Key::new(key).unwrap(), limit())
        .with_policy("api/t")
        .unwrap();
    store.decide_sync(black_box(&request)).is_allowed()
}

#[inline(never)]
fn store_all(store: &MemoryStore, key: &str) -> bool {
    let key = Key::new(key).unwrap();
    let requests =
        ["api/t", "api/t1", "api/t2"].map(|p| Request::new(key, limit()).with_policy(p).unwrap());
    let decisions = now(store.decide_all(black_box(&requests))).unwrap();
    decisions.iter().all(|d| d.is_allowed())
}

#[inline(never)]
fn check_now(limiter: &Limiter<MemoryStore>, key: &str) -> bool {
    let answer = limiter.check_now(black_box("api"), key.as_bytes(), 1);
    matches!(answer, Some(Ok(verdict)) if verdict.is_allowed())
}

#[inline(never)]
fn check(limiter: &Limiter<MemoryStore>, key: &str) -> bool {
    let answer = now(limiter.check(black_box("api"), key.as_bytes()));
    matches!(answer, Ok(verdict) if verdict.is_allowed())
}

/// A contender over `keys`, cycled; each answer must be an admission.
fn cycling<'a>(keys: &'a [String], call: impl Fn(&str) -> bool + 'a) -> impl FnMut() + 'a {
    let mut i = 0;
    move || {
        i = (i + 1) % keys.len();
        assert!(call(&keys[i]));
    }
}

/// A named contender's call.
type Contender<'a> = (&'a str, Box<dyn FnMut() + 'a>);

/// Group `name`: the store and each contender in criterion, then in paired rounds.
fn group<'a>(
    c: &mut Criterion,
    name: &str,
    mut store: impl FnMut() + 'a,
    contenders: Vec<Contender<'a>>,
) {
    let mut g = c.benchmark_group(name);
    g.bench_function("store", |b| b.iter(&mut store));
    let mut contenders = contenders;
    for (contender, call) in &mut contenders {
        g.bench_function(*contender, |b| b.iter(&mut *call));
    }
    g.finish();
    for (contender, call) in &mut contenders {
        paired(name, contender, &mut store, call);
    }
}

/// Rounds of [`paired`], and calls per contender and round.
const ROUNDS: usize = 101;
const ROUND_CALLS: u32 = 10_000;

/// Prints the fastest of `ROUNDS` rounds of `contender` and of `store`, run back to back.
fn paired(group: &str, name: &str, store: &mut impl FnMut(), contender: &mut impl FnMut()) {
    let (mut best_store, mut best) = (f64::MAX, f64::MAX);
    for round in 0..ROUNDS {
        let (s, c) = if round % 2 == 0 {
            let s = round_ns(store);
            (s, round_ns(contender))
        } else {
            let c = round_ns(contender);
            (round_ns(store), c)
        };
        best_store = best_store.min(s);
        best = best.min(c);
    }
    eprintln!(
        "{group}: {name} {best:.1} ns, store {best_store:.1} ns: +{:.1} ns ({:.2}x)",
        best - best_store,
        best / best_store
    );
}

/// Nanoseconds per call of `f` over one round.
fn round_ns(f: &mut impl FnMut()) -> f64 {
    let started = Instant::now();
    for _ in 0..ROUND_CALLS {
        f();
    }
    started.elapsed().as_secs_f64() * 1e9 / f64::from(ROUND_CALLS)
}

fn single_tier(c: &mut Criterion, name: &str, limiter: &Limiter<MemoryStore>, keys: &[String]) {
    let store = limiter.store();
    group(
        c,
        name,
        cycling(keys, |k| store_call(store, k)),
        vec![
            (
                "limiter_now",
                Box::new(cycling(keys, |k| check_now(limiter, k))),
            ),
            ("limiter", Box::new(cycling(keys, |k| check(limiter, k)))),
        ],
    );
}

fn bench(c: &mut Criterion) {
    let keys: Vec<String> = (0..10_000).map(|i| format!("user-{i:019}")).collect();
    let limiter = Arc::new(Limiter::new(Arc::new(MemoryStore::new()), set(1)));
    single_tier(c, "hot_key", &limiter, &keys[..1]);
    single_tier(c, "keys_10k", &limiter, &keys);

    // A publisher at a few thousand sets a second, far above any real reload rate.
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (limiter, stop) = (limiter.clone(), stop.clone());
        let sets = [Arc::new(set(1)), Arc::new(set(1))];
        thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                limiter.replace_shared(sets[n % 2].clone()).unwrap();
                n += 1;
                thread::sleep(Duration::from_micros(100));
            }
        })
    };
    single_tier(c, "hot_key_publishing", &limiter, &keys[1..2]);
    stop.store(true, Ordering::Relaxed);
    publisher.join().unwrap();

    let three = Limiter::new(limiter.store().clone(), set(3));
    let store = three.store();
    group(
        c,
        "three_tiers",
        cycling(&keys, |k| store_all(store, k)),
        vec![("limiter", Box::new(cycling(&keys, |k| check(&three, k))))],
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
