//! Per-decision cost of distlimit's memory store next to governor's keyed limiter, a naive
//! `Mutex<HashMap>` token bucket and the seed design (64 FNV-1a shards), in one criterion run.
//!
//! Run with `cargo bench -p distlimit-memory --bench compare` (or `cargo xtask bench`).
//! Benchmark ids read `<group>/<key type>/<contender>`; every group holds every contender.
//!
//! * Contenders: `distlimit_tb` and `distlimit_gcra` (`MemoryStore::decide_sync` with the default
//!   `FastClock`, building `Request::new(Key::new(..)?, limit)` per decision like a caller does);
//!   `governor` (`DefaultKeyedRateLimiter`: dashmap + quanta); `mutex_hashmap` (one
//!   `std::sync::Mutex<HashMap<K, (f64, Instant)>>` token bucket); `seed` (string keys only:
//!   64 × `parking_lot::RwLock<HashMap<String, State>>`, FNV-1a 32 picks the shard, SipHash the
//!   slot, `Instant::now()`: two hashes per key where distlimit computes one keyed hash).
//! * Quota, the same for all: 1 unit per second sustained with a burst of 10^9. Nothing is ever
//!   denied during a run (checked), so the bookkeeping is measured and not the denial path, and
//!   every key's state stays live for the whole run: with 10^9 units per second instead,
//!   distlimit's expiry would drop each entry a microsecond after its last use and
//!   `new_keys` would compare its near-empty tables with governor's ever-growing map.
//! * Groups: `hot_key` (one key); `keys_10k`, `keys_100k`, `keys_1m` (N keys, inserted in one
//!   shuffled order and then visited in another, fixed one); `new_keys` (keys never seen, into a
//!   fresh store per bounded chunk); `rare_keys` (the demo's 1 000 000 users, `user-123456`,
//!   each state expired when its key comes back); `two_threads` (wall time per decision with 1 and 2 threads
//!   on distinct keys: 10 000 random keys per thread, and `*_hot`: one key per thread); `clock` and `hash` (the two costs distlimit's design choices are about).
//!   Key types: `u64` (distlimit gets its 8 little-endian bytes) and `string24`
//!   (`user-{:019}`, exactly 24 bytes).

// A benchmark: setup that cannot fail in practice aborts loudly rather than propagating errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::OnceCell;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{
    BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime,
};
use distlimit_core::{Clock, Key, Limit, Quota, Request, State, SystemClock};
use distlimit_memory::{DefaultHasher, FastClock, MemoryStore};
use governor::clock::Clock as _;

/// Sustained rate of the quota every contender enforces, in units per second.
const RATE_PER_SECOND: u32 = 1;
/// Burst of that quota: larger than the decisions any one key sees in a run.
const BURST: u32 = 1_000_000_000;
/// Key cap of the distlimit stores: far above every key count used here, so nothing is evicted.
const MAX_KEYS: usize = 1 << 24;
/// Most fresh keys inserted into one store in `new_keys` before it is rebuilt.
const NEW_KEYS_CHUNK: usize = 1 << 20;
/// Keys per thread in `two_threads`.
const THREAD_KEYS: usize = 10_000;

// ---------------------------------------------------------------------------------------------
// Contenders

/// One rate limiter under test, deciding one unit for a key of type `K`.
trait Contender<K>: Sync {
    /// Charges one unit to `key`; whether it was admitted.
    fn check(&self, key: &K) -> bool;

    /// Live keys dropped to respect a key cap (none may be, or the contenders would differ).
    fn evictions(&self) -> u64 {
        0
    }
}

fn distlimit_quota() -> Quota {
    Quota::per_second(u64::from(RATE_PER_SECOND))
        .and_then(|q| q.with_burst(u64::from(BURST)))
        .unwrap()
}

/// distlimit's memory store with the default `FastClock` and hasher.
struct Distlimit {
    store: MemoryStore,
    limit: Limit,
}

impl Distlimit {
    fn token_bucket() -> Self {
        Self::new(Limit::token_bucket(distlimit_quota()))
    }

    fn gcra() -> Self {
        Self::new(Limit::gcra(distlimit_quota()))
    }

    fn new(limit: Limit) -> Self {
        Self {
            store: MemoryStore::builder().max_keys(MAX_KEYS).build(),
            limit,
        }
    }
}

impl Contender<u64> for Distlimit {
    #[inline]
    fn check(&self, key: &u64) -> bool {
        let bytes = key.to_le_bytes();
        let request = Request::new(Key::new(&bytes).unwrap(), self.limit);
        self.store.decide_sync(&request).is_allowed()
    }

    fn evictions(&self) -> u64 {
        self.store.evictions()
    }
}

impl Contender<String> for Distlimit {
    #[inline]
    fn check(&self, key: &String) -> bool {
        let request = Request::new(Key::new(key).unwrap(), self.limit);
        self.store.decide_sync(&request).is_allowed()
    }

    fn evictions(&self) -> u64 {
        self.store.evictions()
    }
}

/// governor's default keyed limiter: dashmap, SipHash (std `RandomState`), quanta clock.
struct Governor<K: Hash + Eq + Clone>(governor::DefaultKeyedRateLimiter<K>);

impl<K: Hash + Eq + Clone> Governor<K> {
    fn new() -> Self {
        let quota = governor::Quota::per_second(NonZeroU32::new(RATE_PER_SECOND).unwrap())
            .allow_burst(NonZeroU32::new(BURST).unwrap());
        Self(governor::RateLimiter::keyed(quota))
    }
}

impl<K: Hash + Eq + Clone + Send + Sync> Contender<K> for Governor<K> {
    #[inline]
    fn check(&self, key: &K) -> bool {
        self.0.check_key(key).is_ok()
    }
}

/// The token bucket people write first: one mutex around a std `HashMap`, `f64` tokens.
struct MutexMap<K> {
    map: Mutex<HashMap<K, (f64, Instant)>>,
}

impl<K> MutexMap<K> {
    fn new() -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq + Clone + Send> Contender<K> for MutexMap<K> {
    #[inline]
    fn check(&self, key: &K) -> bool {
        let now = Instant::now();
        let mut map = self.map.lock().unwrap();
        let Some((tokens, last)) = map.get_mut(key) else {
            map.insert(key.clone(), (f64::from(BURST) - 1.0, now));
            return true;
        };
        let refill =
            now.saturating_duration_since(*last).as_secs_f64() * f64::from(RATE_PER_SECOND);
        *tokens = (*tokens + refill).min(f64::from(BURST));
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// FNV-1a, 32 bits.
#[inline]
fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for &b in bytes {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// The seed design: FNV-1a picks one of 64 `RwLock<HashMap<String, State>>`, whose SipHash then
/// hashes the key a second time; time from `Instant::now()`.
struct Seed {
    shards: Vec<parking_lot::RwLock<HashMap<String, State>>>,
    limit: Limit,
    base: Instant,
    base_us: u64,
}

impl Seed {
    fn new() -> Self {
        Self {
            shards: (0..64)
                .map(|_| parking_lot::RwLock::new(HashMap::new()))
                .collect(),
            limit: Limit::token_bucket(distlimit_quota()),
            base: Instant::now(),
            base_us: SystemClock.now_us(),
        }
    }
}

impl Contender<String> for Seed {
    #[inline]
    fn check(&self, key: &String) -> bool {
        let shard = &self.shards[fnv1a32(key.as_bytes()) as usize % 64];
        let now = self.base_us + self.base.elapsed().as_micros() as u64;
        let mut map = shard.write();
        if let Some(state) = map.get_mut(key.as_str()) {
            return self.limit.decide(state, now, 1).is_allowed();
        }
        let mut state = State::fresh(self.limit.algorithm());
        let allowed = self.limit.decide(&mut state, now, 1).is_allowed();
        map.insert(key.clone(), state);
        allowed
    }
}

// ---------------------------------------------------------------------------------------------
// Keys

/// A key type of the comparison.
trait BenchKey: Hash + Eq + Clone + Send + Sync + 'static {
    /// Its name in benchmark ids.
    const NAME: &'static str;
    /// The `i`-th key.
    fn nth(i: u64) -> Self;
}

impl BenchKey for u64 {
    const NAME: &'static str = "u64";

    fn nth(i: u64) -> Self {
        i
    }
}

impl BenchKey for String {
    const NAME: &'static str = "string24";

    fn nth(i: u64) -> Self {
        let key = format!("user-{i:019}");
        debug_assert_eq!(key.len(), 24);
        key
    }
}

/// The demo's user ids, `user-123456` (11 bytes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct UserId(String);

impl BenchKey for UserId {
    const NAME: &'static str = "user_id";

    fn nth(i: u64) -> Self {
        UserId(format!("user-{i:06}"))
    }
}

/// splitmix64: a fixed, dependency-free shuffle.
fn shuffle<T>(items: &mut [T], mut seed: u64) {
    for i in (1..items.len()).rev() {
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        items.swap(i, (z % (i as u64 + 1)) as usize);
    }
}

/// Keys `first..first + n`, shuffled, built in their shuffled order: a string key's bytes then
/// lie in memory in the order the loop reads them, as a request's key is hot in the buffer it
/// was parsed from (shuffling built strings would add a cache miss per request to every
/// contender).
fn shuffled_keys<K: BenchKey>(first: u64, n: usize) -> Vec<K> {
    let mut ids: Vec<u64> = (first..first + n as u64).collect();
    shuffle(&mut ids, first ^ n as u64);
    ids.into_iter().map(K::nth).collect()
}

// ---------------------------------------------------------------------------------------------
// Measurement loops

/// Times a contender built by `make` cycling through `keys`, one decision per iteration.
///
/// The contender is built and populated on first use, so a filtered run (`cargo bench --bench
/// compare -- keys_1m/u64`) builds only what it measures, and each one is measured right after
/// its own population and dropped before the next one is built.
fn bench_cycle<K: BenchKey, C: Contender<K>>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    make: impl FnOnce() -> C,
    keys: &[K],
) {
    let mut make = Some(make);
    let contender = OnceCell::new();
    let mut denied = 0u64;
    let mut i = 0;
    group.bench_function(format!("{}/{name}", K::NAME), |b| {
        let contender = contender.get_or_init(|| populated(make.take().unwrap()(), keys));
        b.iter(|| {
            let allowed = contender.check(black_box(&keys[i]));
            denied += u64::from(!allowed);
            i += 1;
            if i == keys.len() {
                i = 0;
            }
        });
    });
    assert_eq!(
        denied, 0,
        "{name} denied requests: the quota is too small for the run"
    );
}

/// Feeds every key to `contender` once, so that it knows them all, in an order unrelated to the
/// measured one: keys a contender copies to the heap then lie in memory in another order than
/// they are visited, as with real traffic (visiting them in allocation order would let the
/// hardware prefetcher hide the heap-key miss).
fn populated<K, C: Contender<K>>(contender: C, keys: &[K]) -> C {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    shuffle(&mut order, 0x5eed);
    for i in order {
        assert!(contender.check(&keys[i]));
    }
    assert_eq!(contender.evictions(), 0, "a key cap was hit");
    contender
}

/// `hot_key` and `keys_*` for one key type: every contender on the same shuffled keys.
fn cycle_group<K: BenchKey>(group: &mut BenchmarkGroup<'_, WallTime>, keys: &[K])
where
    Distlimit: Contender<K>,
{
    bench_cycle(group, "distlimit_tb", Distlimit::token_bucket, keys);
    bench_cycle(group, "distlimit_gcra", Distlimit::gcra, keys);
    bench_cycle(group, "governor", Governor::<K>::new, keys);
    bench_cycle(group, "mutex_hashmap", MutexMap::<K>::new, keys);
}

/// [`cycle_group`] for string keys, plus the seed design.
fn cycle_group_strings(group: &mut BenchmarkGroup<'_, WallTime>, keys: &[String]) {
    cycle_group(group, keys);
    bench_cycle(group, "seed", Seed::new, keys);
}

/// Times decisions on keys never seen: each chunk of at most `fresh.len()` iterations runs on a
/// store built (and dropped) outside the timing.
fn bench_fresh<K: BenchKey, C: Contender<K>>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    make: impl Fn() -> C,
    fresh: &[K],
) {
    group.bench_function(format!("{}/{name}", K::NAME), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(fresh.len() as u64) as usize;
                let contender = make();
                let start = Instant::now();
                for key in &fresh[..n] {
                    black_box(contender.check(black_box(key)));
                }
                total += start.elapsed();
                drop(contender);
                left -= n as u64;
            }
            total
        });
    });
}

fn new_keys_group<K: BenchKey>(group: &mut BenchmarkGroup<'_, WallTime>, fresh: &[K])
where
    Distlimit: Contender<K>,
{
    bench_fresh(group, "distlimit_tb", Distlimit::token_bucket, fresh);
    bench_fresh(group, "distlimit_gcra", Distlimit::gcra, fresh);
    bench_fresh(group, "governor", Governor::<K>::new, fresh);
    bench_fresh(group, "mutex_hashmap", MutexMap::<K>::new, fresh);
}

/// Runs `iters` decisions split over one thread per key set, each cycling through its own keys;
/// returns the wall time scaled to exactly `iters` decisions.
fn run_threads<C: Contender<u64>>(contender: &C, key_sets: &[Vec<u64>], iters: u64) -> Duration {
    let threads = key_sets.len() as u64;
    let per_thread = iters.div_ceil(threads).max(1);
    let barrier = Barrier::new(key_sets.len());
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = key_sets
            .iter()
            .map(|keys| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut i = 0;
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..per_thread {
                        black_box(contender.check(black_box(&keys[i])));
                        i += 1;
                        if i == keys.len() {
                            i = 0;
                        }
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let start = spans.iter().map(|s| s.0).min().unwrap();
    let end = spans.iter().map(|s| s.1).max().unwrap();
    (end - start).mul_f64(iters as f64 / (per_thread * threads) as f64)
}

/// Times a contender built by `make` (on first use, with every key of `key_sets` known to it)
/// with one thread, then with two, each on its own key set.
fn bench_threads<C: Contender<u64>>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    make: impl FnOnce() -> C,
    key_sets: &[Vec<u64>],
) {
    let mut make = Some(make);
    let contender = OnceCell::new();
    for threads in [1, 2] {
        let label = if threads == 1 {
            "1_thread"
        } else {
            "2_threads"
        };
        group.bench_function(format!("u64/{name}/{label}"), |b| {
            let contender = contender.get_or_init(|| {
                let contender = make.take().unwrap()();
                for key in key_sets.iter().flatten() {
                    assert!(contender.check(key));
                }
                contender
            });
            b.iter_custom(|iters| run_threads(contender, &key_sets[..threads], iters));
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Groups

fn hot_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("hot_key");
    cycle_group::<u64>(&mut group, &[u64::nth(42)]);
    cycle_group_strings(&mut group, &[String::nth(42)]);
    group.finish();
}

fn keys_n(c: &mut Criterion, name: &str, n: usize, samples: usize) {
    let mut group = c.benchmark_group(name);
    group.sample_size(samples);
    cycle_group::<u64>(&mut group, &shuffled_keys::<u64>(0, n));
    cycle_group_strings(&mut group, &shuffled_keys::<String>(0, n));
    group.finish();
}

fn keys_10k(c: &mut Criterion) {
    keys_n(c, "keys_10k", 10_000, 30);
}

fn keys_100k(c: &mut Criterion) {
    keys_n(c, "keys_100k", 100_000, 30);
}

fn keys_1m(c: &mut Criterion) {
    keys_n(c, "keys_1m", 1_000_000, 20);
}

fn new_keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("new_keys");
    group.sample_size(20);
    new_keys_group::<u64>(&mut group, &shuffled_keys(1 << 40, NEW_KEYS_CHUNK));
    let fresh: Vec<String> = shuffled_keys(1 << 40, NEW_KEYS_CHUNK);
    new_keys_group(&mut group, &fresh);
    bench_fresh(&mut group, "seed", Seed::new, &fresh);
    group.finish();
}

/// The demo's workload: 1 000 000 users (`user-123456`) in a shuffled cycle, each request in
/// policy `api/burst`, with a quota whose unit refills in 1 ms, so every key's state has expired
/// when the cycle comes back to it: the path of a key seen rarely, as under the demo's
/// 1 000 000-user HTTP load (a user every ~20 s, a unit refilled in 1 s).
fn rare_keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("rare_keys");
    group.sample_size(20);
    let keys = shuffled_keys::<UserId>(0, 1_000_000);
    let quota = Quota::per_second(1_000)
        .and_then(|q| q.with_burst(100))
        .unwrap();
    let rare = |limit: Limit| {
        move || RareKeys {
            store: MemoryStore::builder().max_keys(MAX_KEYS).build(),
            limit,
        }
    };
    bench_cycle(
        &mut group,
        "distlimit_tb",
        rare(Limit::token_bucket(quota)),
        &keys,
    );
    bench_cycle(
        &mut group,
        "distlimit_gcra",
        rare(Limit::gcra(quota)),
        &keys,
    );
    let governor = || {
        let quota = governor::Quota::per_second(NonZeroU32::new(1_000).unwrap())
            .allow_burst(NonZeroU32::new(100).unwrap());
        Governor(governor::RateLimiter::keyed(quota))
    };
    bench_cycle(&mut group, "governor", governor, &keys);
    group.finish();
}

/// [`Distlimit`] deciding in the demo's policy, `api/burst`.
struct RareKeys {
    store: MemoryStore,
    limit: Limit,
}

impl Contender<UserId> for RareKeys {
    #[inline]
    fn check(&self, key: &UserId) -> bool {
        let request = Request::new(Key::new(&key.0).unwrap(), self.limit)
            .with_policy("api/burst")
            .unwrap();
        self.store.decide_sync(&request).is_allowed()
    }

    fn evictions(&self) -> u64 {
        self.store.evictions()
    }
}

fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("two_threads");
    let key_sets: Vec<Vec<u64>> = (0..2)
        .map(|t| shuffled_keys((t * THREAD_KEYS) as u64, THREAD_KEYS))
        .collect();
    bench_threads(
        &mut group,
        "distlimit_tb",
        Distlimit::token_bucket,
        &key_sets,
    );
    bench_threads(&mut group, "distlimit_gcra", Distlimit::gcra, &key_sets);
    bench_threads(&mut group, "governor", Governor::<u64>::new, &key_sets);
    bench_threads(&mut group, "mutex_hashmap", MutexMap::<u64>::new, &key_sets);
    // One hot key per thread: distinct keys that (63 times in 64) live in different shards, so
    // the threads share no lock word. Random keys spread both threads over every shard, and a
    // shard's lock line then moves between the cores on most decisions.
    let hot: Vec<Vec<u64>> = (0..2).map(|t| vec![u64::nth(42 + t)]).collect();
    bench_threads(&mut group, "distlimit_gcra_hot", Distlimit::gcra, &hot);
    bench_threads(&mut group, "governor_hot", Governor::<u64>::new, &hot);
    group.finish();
}

fn clock(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock");
    let fast = FastClock::new();
    group.bench_function("fast_clock_now_us", |b| {
        b.iter(|| black_box(&fast).now_us())
    });
    group.bench_function("system_clock_now_us", |b| {
        b.iter(|| black_box(SystemClock).now_us())
    });
    group.bench_function("std_instant_now", |b| b.iter(Instant::now));
    let quanta = governor::clock::DefaultClock::default();
    group.bench_function("governor_quanta_now", |b| {
        b.iter(|| black_box(&quanta).now())
    });
    group.finish();
}

fn hash(c: &mut Criterion) {
    let mut group = c.benchmark_group("hash");
    let key = String::nth(42);
    let bytes = key.as_bytes();
    group.bench_function("fnv1a32_24b", |b| b.iter(|| fnv1a32(black_box(bytes))));
    let foldhash = DefaultHasher::default();
    group.bench_function("foldhash_quality_24b", |b| {
        b.iter(|| foldhash.hash_one(black_box(bytes)))
    });
    let siphash = std::hash::RandomState::new();
    group.bench_function("std_siphash_24b", |b| {
        b.iter(|| siphash.hash_one(black_box(bytes)))
    });
    group.finish();
}

/// A 2-core machine shared with other work: short warm-up and measurement, few samples, so the
/// whole run stays within a few minutes.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
        .without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = hot_key, keys_10k, keys_100k, keys_1m, new_keys, rare_keys, two_threads, clock, hash
}
criterion_main!(benches);
