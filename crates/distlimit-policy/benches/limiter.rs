//! What the limiter adds to a decision: `Limiter::check` next to calling the memory store
//! directly with the same request, in one criterion run, idle and while another thread
//! publishes policy sets.
//!
//! Run with `cargo bench -p distlimit-policy --bench limiter` (or `cargo xtask bench`).
//! Benchmark ids read `<group>/<contender>`; each group holds both contenders, run one after
//! the other on the same store, policy and keys.
//!
//! * `store`: the memory store called directly, the fastest way it can be: single-tier groups
//!   call `MemoryStore::decide_sync` (no future at all; what `Store::decide_now`, which the
//!   limiter uses, calls), `three_tiers` calls `Store::decide_all` (the same async call, future
//!   box included, that the limiter makes), with `Key::new` and
//!   `Request::new(..).with_policy("api/t")` built per decision like a caller does.
//! * `limiter`: `Limiter::check("api", key)` on the same store, policy and keys: snapshot load,
//!   policy lookup, request building, the store call, the verdict (built and dropped), the
//!   check's future polled once.
//! * `limiter_now`: `Limiter::check_now("api", key, 1)`, the synchronous check (no future),
//!   single-tier groups only: the like of `decide_sync`.
//! * `store_async` (paired rounds only, single-tier groups): the store's own async call,
//!   `Store::decide`, polled once (its future boxed, like every `#[async_trait]` method's): the
//!   like of `limiter`, the check's future.
//! * Each contender's call is a function of its own, never inlined into the benchmark's loop
//!   (see `decide_direct`).
//! * After each group's criterion runs, paired rounds (see `paired`) print each contender's
//!   fastest round against its baseline's: the figures the README reports.
//! * Each contender inspects its answer where it was returned (`decision.is_allowed()`,
//!   `matches!(&answer, Ok(verdict) if verdict.is_allowed())`): moving a verdict out of its
//!   `Result` first would add the caller's copy of 100 bytes to the limiter's side only.
//! * Groups: `hot_key` (one key), `keys_10k` (10 000 keys in turn, each key's state live when
//!   it comes round again), `keys_10k_fresh` (the same keys under policy `fresh`, whose states
//!   have expired when their key comes round again: the store's path for a new key, as in
//!   this bench's runs before 2026-11-30 07:10 UTC); `hot_key_swapping_paced`
//!   and `keys_10k_swapping_paced`: the same while a second thread publishes one of two
//!   prepared sets, then sleeps 100 µs (a few thousand publications per second, printed after
//!   the groups: far above any real reload rate, and the publisher does not take one of the
//!   machine's cores); `hot_key_swapping_spin`: the worst case, the publisher in a tight loop
//!   on its own core; `three_tiers`
//!   (`decide_all` of three requests against a three-tier policy).
//! * `snapshot/load_and_release`: an `ArcSwap` load of a policy set and the guard's release
//!   alone: the two atomic operations a check would make to see one consistent set without the
//!   limiter's per-thread cache (which makes them only after a publication).
//! * Each contender is measured interleaved with another (`store` with `limiter`, the limiters
//!   with `store`): chunks of 64 timed calls of its own alternate with 64 untimed calls of the
//!   other, so load from other processes on a shared machine hits both alike.
//! * The quotas admit everything during a run (see `LIMITS` and `FRESH`), so bookkeeping is
//!   measured and not the denial path. Futures are polled once with a no-op waker: the memory
//!   store never waits, and no runtime's cost is added to either side.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use distlimit_core::{Key, Limit, MAX_LIMIT, Quota, Request, Store};
use distlimit_memory::MemoryStore;
use distlimit_policy::{Limiter, Policy, PolicySet, Tier};

const KEYS: usize = 10_000;

fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the memory store never waits"),
    }
}

/// The limits of `api`'s tiers (built once: building a `Quota` costs more than a decision):
/// 100 units a second, a burst of 2^32. Nothing is denied during a run (a hot key drained at
/// 30 million calls a second empties its burst in over two minutes, and each hot group has a
/// key of its own), and every state stays live: a unit takes 10 ms to refill, longer than a
/// pass over the 10 000 keys, so each call finds its key's state.
static LIMITS: LazyLock<[Limit; 3]> = LazyLock::new(|| {
    let quota = Quota::per_second(100)
        .unwrap()
        .with_burst(MAX_LIMIT)
        .unwrap();
    [
        Limit::token_bucket(quota),
        Limit::gcra(quota),
        Limit::token_bucket(quota),
    ]
});

/// The limit of `fresh`'s tier: 2^32 units a second, the same burst. A state is full again a
/// fraction of a nanosecond after a call, so it has expired when its key comes round again:
/// every call takes the store's path for a new key (and its sweeps of expired entries).
static FRESH: LazyLock<Limit> = LazyLock::new(|| {
    let quota = Quota::per_second(MAX_LIMIT)
        .unwrap()
        .with_burst(MAX_LIMIT)
        .unwrap();
    Limit::token_bucket(quota)
});

fn limit(index: usize) -> Limit {
    LIMITS[index]
}

/// The policy a single-tier group checks, and what the store is called with directly.
#[derive(Clone, Copy)]
struct Target {
    /// The limiter's policy.
    policy: &'static str,
    /// Its tier's store policy: what the direct call names.
    store_policy: &'static str,
    limit: Limit,
}

/// `api` (states stay live).
fn live() -> Target {
    Target {
        policy: "api",
        store_policy: "api/t",
        limit: limit(0),
    }
}

/// `fresh` (every state has expired when its key comes round again).
fn fresh() -> Target {
    Target {
        policy: "fresh",
        store_policy: "fresh/t",
        limit: *FRESH,
    }
}

/// `api` with `tiers` tiers, `other`, and `fresh`.
fn set(tiers: usize) -> PolicySet {
    let mut api = Policy::new("api").tier(Tier::new("t", limit(0)));
    for i in 1..tiers {
        api = api.tier(Tier::new(format!("t{i}"), limit(i)));
    }
    PolicySet::builder()
        .policy(api)
        .policy(Policy::new("other").tier(Tier::new("t", limit(1))))
        .policy(Policy::new("fresh").tier(Tier::new("t", *FRESH)))
        .build()
        .unwrap()
}

fn keys() -> Vec<String> {
    (0..KEYS).map(|i| format!("user-{i:019}")).collect()
}

/// Calls per timed chunk. Each contender's measurement alternates a chunk of the other
/// contender's calls (not timed) with a chunk of its own (timed): both are measured under the
/// same machine load, which on a shared machine moves more than the difference measured.
const CHUNK: u64 = 64;

/// The time `iters` calls of `timed` take, interleaved chunk by chunk with calls of `other`.
fn interleaved(iters: u64, timed: &mut impl FnMut(), other: &mut impl FnMut()) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let n = CHUNK.min(iters - done);
        for _ in 0..n {
            other();
        }
        let started = Instant::now();
        for _ in 0..n {
            timed();
        }
        total += started.elapsed();
        done += n;
    }
    total
}

/// Group `name`: the `store` and `limiter` contenders, each measured interleaved with the
/// other, and `limiter_now` (if given) interleaved with `store`. Each closure makes one
/// contender's call (the key index cycles).
fn group<A: FnMut(), B: FnMut(), N: FnMut()>(
    c: &mut Criterion,
    name: &str,
    mut store: impl FnMut() -> A,
    mut limiter: impl FnMut() -> B,
    limiter_now: Option<&mut dyn FnMut() -> N>,
) {
    let mut group = c.benchmark_group(name);
    group.bench_function("store", |b| {
        let (mut timed, mut other) = (store(), limiter());
        b.iter_custom(|iters| interleaved(iters, &mut timed, &mut other));
    });
    group.bench_function("limiter", |b| {
        let (mut timed, mut other) = (limiter(), store());
        b.iter_custom(|iters| interleaved(iters, &mut timed, &mut other));
    });
    if let Some(limiter_now) = limiter_now {
        group.bench_function("limiter_now", |b| {
            let (mut timed, mut other) = (limiter_now(), store());
            b.iter_custom(|iters| interleaved(iters, &mut timed, &mut other));
        });
    }
    group.finish();
}

/// The contenders on `keys` (cycled) and `target`, in group `name`.
fn single_tier(
    c: &mut Criterion,
    name: &str,
    store: &MemoryStore,
    limiter: &Limiter<MemoryStore>,
    keys: &[String],
    target: Target,
) {
    let direct = || cycling(keys, move |key| decide_direct(store, key, target));
    let checks = || cycling(keys, move |key| check(limiter, key, target.policy));
    let checks_now = || cycling(keys, move |key| check_now(limiter, key, target.policy));
    group(c, name, direct, checks, Some(&mut || checks_now()));
    paired(name, "limiter", "store", &mut direct(), &mut checks());
    paired(
        name,
        "limiter_now",
        "store",
        &mut direct(),
        &mut checks_now(),
    );
    // The check's future against the store's own async call (its future boxed, as every
    // `#[async_trait]` method's): the like of `check`, where `decide_sync` is the like of
    // `check_now`.
    let direct_async = || cycling(keys, move |key| decide_direct_async(store, key, target));
    paired(
        name,
        "limiter",
        "store_async",
        &mut direct_async(),
        &mut checks(),
    );
}

/// Rounds of [`paired`].
const ROUNDS: usize = 201;
/// Calls per contender and round in [`paired`].
const ROUND_CALLS: u32 = 10_000;
/// Rounds of [`paired`] run before the recorded ones.
const WARM_UP_ROUNDS: usize = 50;

/// The difference between `store` (named `baseline`) and `contender` measured in paired
/// rounds, printed: each
/// round times `ROUND_CALLS` calls of each, back to back (which goes first alternates), for
/// `ROUNDS` rounds. Printed: each contender's fastest round (the least disturbed by other
/// processes) and the difference between the two, and the median of the rounds' differences.
/// Criterion's estimates above are means, which a burst of load on a shared machine inflates
/// for the slower contender more; these are the figures the README reports.
fn paired(
    group: &str,
    name: &str,
    baseline: &str,
    store: &mut impl FnMut(),
    contender: &mut impl FnMut(),
) {
    // Unrecorded rounds first: the first comparison of a run measured both contenders a third
    // slower (43.6 against 32.0 ns for the store) in one run out of two, on a machine still
    // warming up.
    for _ in 0..WARM_UP_ROUNDS {
        round_ns(store);
        round_ns(contender);
    }
    let (mut stores, mut contenders, mut differences) = (vec![], vec![], vec![]);
    for round in 0..ROUNDS {
        let (s, c) = if round % 2 == 0 {
            let s = round_ns(store);
            (s, round_ns(contender))
        } else {
            let c = round_ns(contender);
            (round_ns(store), c)
        };
        stores.push(s);
        contenders.push(c);
        differences.push(c - s);
    }
    for v in [&mut stores, &mut contenders, &mut differences] {
        v.sort_by(f64::total_cmp);
    }
    eprintln!(
        "{group}: paired rounds, {name} vs {baseline}: fastest {:.1} vs {:.1} ns, +{:.1} ns \
         (median of the rounds' differences +{:.1} ns)",
        contenders[0],
        stores[0],
        contenders[0] - stores[0],
        differences[ROUNDS / 2],
    );
}

/// Nanoseconds per call of `f` over one round of [`paired`] (generic, like criterion's loop in
/// `interleaved`).
fn round_ns(f: &mut impl FnMut()) -> f64 {
    let started = Instant::now();
    for _ in 0..ROUND_CALLS {
        f();
    }
    started.elapsed().as_secs_f64() * 1e9 / f64::from(ROUND_CALLS)
}

/// A contender: `call` with each of `keys` in turn (cycled), its answer asserted allowed.
fn cycling<'a>(keys: &'a [String], call: impl Fn(&str) -> bool + 'a) -> impl FnMut() + 'a {
    let mut i = 0;
    move || {
        i = (i + 1) % keys.len();
        assert!(call(&keys[i]));
    }
}

// Each contender's call is a function of its own, never inlined: whether the compiler inlines a
// contender into the benchmark's loop depends on how often and where the closure is used, not
// on the contender, and an inlined one is spared the call and the registers it saves (measured:
// the store's calls were inlined and the limiter's not, about 2 ns in the store's favor).

/// One decision of the store called directly: the request for `key` under `target`'s limit and
/// store policy built like a caller does, and `MemoryStore::decide_sync`. Whether it was
/// allowed.
#[inline(never)]
fn decide_direct(store: &MemoryStore, key: &str, target: Target) -> bool {
    let request = Request::new(Key::new(key).unwrap(), target.limit)
        .with_policy(target.store_policy)
        .unwrap();
    store.decide_sync(black_box(&request)).is_allowed()
}

/// [`decide_direct`] through the store's async call, `Store::decide`, polled once.
#[inline(never)]
fn decide_direct_async(store: &MemoryStore, key: &str, target: Target) -> bool {
    let request = Request::new(Key::new(key).unwrap(), target.limit)
        .with_policy(target.store_policy)
        .unwrap();
    matches!(&now(store.decide(black_box(&request))), Ok(decision) if decision.is_allowed())
}

/// One `Limiter::check(policy, key)`, polled once; whether it was allowed (the verdict is
/// dropped here).
#[inline(never)]
fn check(limiter: &Limiter<MemoryStore>, key: &str, policy: &str) -> bool {
    let answer = now(limiter.check(black_box(policy), key.as_bytes()));
    matches!(&answer, Ok(verdict) if verdict.is_allowed())
}

/// One `Limiter::check_now(policy, key, 1)`; whether it was allowed.
#[inline(never)]
fn check_now(limiter: &Limiter<MemoryStore>, key: &str, policy: &str) -> bool {
    let answer = limiter.check_now(black_box(policy), key.as_bytes(), 1);
    matches!(&answer, Some(Ok(verdict)) if verdict.is_allowed())
}

/// The three requests of the three-tier policy, decided together by the store directly.
#[inline(never)]
fn decide_all_direct(store: &MemoryStore, key: &str, limits: &[Limit; 3]) -> bool {
    let key = Key::new(key).unwrap();
    let requests = [
        Request::new(key, limits[0]).with_policy("api/t").unwrap(),
        Request::new(key, limits[1]).with_policy("api/t1").unwrap(),
        Request::new(key, limits[2]).with_policy("api/t2").unwrap(),
    ];
    let decisions = now(store.decide_all(black_box(&requests))).unwrap();
    decisions.iter().all(|d| d.is_allowed())
}

/// How the publishing thread paces itself.
#[derive(Clone, Copy)]
enum Publisher {
    /// One publication, then a sleep of this long.
    Paced(Duration),
    /// Publications back to back: the worst case, one core taken by the publisher.
    Spin,
}

/// Runs `f` while another thread publishes the limiter's set, alternating two prepared ones.
fn swapping(limiter: &Arc<Limiter<MemoryStore>>, publisher: Publisher, f: impl FnOnce()) {
    let stop = Arc::new(AtomicBool::new(false));
    let sets = [Arc::new(set(1)), Arc::new(set(1))];
    let swapper = {
        let (limiter, stop) = (limiter.clone(), stop.clone());
        thread::spawn(move || {
            let started = Instant::now();
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                limiter.replace_shared(sets[(swaps % 2) as usize].clone());
                swaps += 1;
                if let Publisher::Paced(pause) = publisher {
                    thread::sleep(pause);
                }
            }
            (swaps, started.elapsed())
        })
    };
    f();
    stop.store(true, Ordering::Relaxed);
    let (swaps, took) = swapper.join().unwrap();
    eprintln!(
        "{swaps} policy sets published meanwhile ({:.0} per second)",
        swaps as f64 / took.as_secs_f64()
    );
}

fn bench(c: &mut Criterion) {
    let store = Arc::new(MemoryStore::new());
    let limiter = Arc::new(Limiter::new(store.clone(), set(1)));
    let keys = keys();
    // Each hot group has a key of its own, so that no key's burst is drained by more than one
    // group's calls.
    let hot = |group: usize| &keys[group..=group];

    single_tier(c, "hot_key", &store, &limiter, hot(0), live());
    single_tier(c, "keys_10k", &store, &limiter, &keys, live());
    single_tier(c, "keys_10k_fresh", &store, &limiter, &keys, fresh());
    swapping(
        &limiter,
        Publisher::Paced(Duration::from_micros(100)),
        || {
            single_tier(
                c,
                "hot_key_swapping_paced",
                &store,
                &limiter,
                hot(1),
                live(),
            );
            single_tier(
                c,
                "keys_10k_swapping_paced",
                &store,
                &limiter,
                &keys,
                live(),
            );
        },
    );
    swapping(&limiter, Publisher::Spin, || {
        single_tier(c, "hot_key_swapping_spin", &store, &limiter, hot(2), live());
    });

    let limiter = Limiter::new(store.clone(), set(3));
    let limits = *LIMITS;
    let direct = || cycling(&keys, |key| decide_all_direct(&store, key, &limits));
    let checks = || cycling(&keys, |key| check(&limiter, key, "api"));
    group(
        c,
        "three_tiers",
        direct,
        checks,
        None::<&mut dyn FnMut() -> fn()>,
    );
    paired(
        "three_tiers",
        "limiter",
        "store",
        &mut direct(),
        &mut checks(),
    );
}

/// The snapshot alone: what every check pays to decide with one consistent policy set.
fn snapshot(c: &mut Criterion) {
    let policies = arc_swap::ArcSwap::from_pointee(set(1));
    c.bench_function("snapshot/load_and_release", |b| {
        b.iter(|| black_box(policies.load()).len());
    });
}

criterion_group!(benches, bench, snapshot);
criterion_main!(benches);
