#![doc = include_str!("../README.md")]

mod clock;
mod permits;
mod shard;
mod sync;
#[cfg(all(test, distlimit_loom))]
mod tests;

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use distlimit_core::{
    Clock, Decision, Error, Grant, LeaseStore, NoopObserver, Observer, Request, Settle, Store,
    validate_batch, validate_settles,
};

pub use clock::FastClock;
use shard::{Id, Table};
use smallvec::SmallVec;
use sync::Lock;

/// The store name the memory store reports to its [`Observer`].
pub const STORE_NAME: &str = "memory";

/// The number of shards.
pub const SHARDS: usize = 64;

/// The largest batch [`MemoryStore::decide_all_into`] decides without allocating.
pub const INLINE: usize = 8;

/// The default cap on the number of keys a store holds: 1 048 576 (from about 30 MiB for GCRA
/// states of 8-byte keys to about 150 MiB for token buckets of long keys).
pub const DEFAULT_MAX_KEYS: usize = 1 << 20;

/// The hasher a store uses by default: foldhash, seeded at random per store.
pub type DefaultHasher = foldhash::quality::RandomState;

/// The shard of a key's hash. Bits 32..38 pick it: hashbrown uses the low bits for the slot and
/// the top seven for its control bytes, so the shard index is independent of both.
#[inline]
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize % SHARDS
}

/// A shard on its own cache lines, so that locking one never slows its neighbours.
#[repr(align(128))]
#[derive(Debug)]
struct Padded<T>(T);

/// The in-process store: see the [crate documentation](crate).
pub struct MemoryStore<C = FastClock, S = DefaultHasher> {
    shards: Box<[Padded<Lock<Table>>; SHARDS]>,
    hasher: S,
    clock: C,
    max_keys_per_shard: usize,
    evictions: AtomicU64,
    observer: Arc<dyn Observer>,
    permits: permits::PermitTable,
}

/// Configures a [`MemoryStore`].
///
/// ```
/// use distlimit_core::ManualClock;
/// use distlimit_memory::MemoryStore;
///
/// let store = MemoryStore::builder()
///     .max_keys(100_000)
///     .clock(ManualClock::new(0))
///     .build();
/// assert_eq!(store.max_keys(), 100_032); // rounded up to a multiple of 64 shards
/// ```
#[derive(Clone)]
pub struct Builder<C = FastClock, S = DefaultHasher> {
    clock: C,
    hasher: S,
    max_keys: usize,
    observer: Arc<dyn Observer>,
}

impl MemoryStore {
    /// A store with the default clock, hasher and key cap.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// Configures a store.
    pub fn builder() -> Builder {
        Builder {
            clock: FastClock::new(),
            hasher: DefaultHasher::default(),
            max_keys: DEFAULT_MAX_KEYS,
            observer: Arc::new(NoopObserver),
        }
    }
}

impl<C: Clock> MemoryStore<C> {
    /// A store reading `clock`, with the default hasher and key cap.
    pub fn with_clock(clock: C) -> Self {
        MemoryStore::builder().clock(clock).build()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

/// The shards, built one by one on the heap: `Box::new` of the whole array would first build
/// it on the stack, more than a loom thread's stack holds.
fn new_shards() -> Box<[Padded<Lock<Table>>; SHARDS]> {
    let shards: Box<[_]> = (0..SHARDS)
        .map(|_| Padded(Lock::new(Table::default())))
        .collect();
    match shards.try_into() {
        Ok(shards) => shards,
        Err(_) => unreachable!("exactly SHARDS shards were collected"),
    }
}

impl<C, S> Builder<C, S> {
    /// The most keys the store holds (default [`DEFAULT_MAX_KEYS`]), rounded up to a multiple of
    /// [`SHARDS`]. Each shard holds at most `max_keys / 64`; when a shard is full, inserting a new
    /// key drops its expired entries, or else evicts, of a few entries sampled at positions the
    /// client cannot choose, the one that becomes fresh soonest (the one with the most units
    /// left). An evicted key starts over as a fresh key, so it may be admitted up to one extra
    /// burst; evictions are counted ([`MemoryStore::evictions`], [`Observer::on_evict`]).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The clock decisions read.
    pub fn clock<C2: Clock>(self, clock: C2) -> Builder<C2, S> {
        Builder {
            clock,
            hasher: self.hasher,
            max_keys: self.max_keys,
            observer: self.observer,
        }
    }

    /// The hasher that places keys; it must be seeded at random (the default is) or clients
    /// can choose keys that collide.
    pub fn hasher<S2: BuildHasher>(self, hasher: S2) -> Builder<C, S2> {
        Builder {
            clock: self.clock,
            hasher,
            max_keys: self.max_keys,
            observer: self.observer,
        }
    }

    /// Where evictions are reported ([`Observer::on_evict`], store [`STORE_NAME`]); none by
    /// default.
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = observer;
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore<C, S> {
        MemoryStore {
            shards: new_shards(),
            hasher: self.hasher,
            clock: self.clock,
            max_keys_per_shard: self.max_keys.div_ceil(SHARDS).max(1),
            evictions: AtomicU64::new(0),
            observer: self.observer,
            permits: permits::PermitTable::new(self.max_keys),
        }
    }
}

impl<C: Clock, S: BuildHasher> MemoryStore<C, S> {
    /// The hash of a request's (key, policy) and its shard index.
    #[inline]
    fn locate<'r>(&self, request: &Request<'r>) -> (Id<'r>, u64, usize) {
        let id = Id {
            key: request.key().as_bytes(),
            policy: request.policy().as_bytes(),
        };
        let hash = id.hash(&self.hasher);
        (id, hash, shard_of(hash))
    }

    /// Decides one request now: the synchronous fast path. Never allocates for a known key and
    /// never fails (the key was validated when the [`Request`] was built).
    // Always inlined (with `FastClock::now_us`): as calls they cost the policy crate's
    // `check_now` about 3 ns with 10 000 keys (`cargo bench -p distlimit-policy --bench limiter`).
    #[inline(always)]
    pub fn decide_sync(&self, request: &Request<'_>) -> Decision {
        self.decide_at(request, self.clock.now_us())
    }

    /// Decides one request at an explicit time (µs since the epoch) instead of the store's
    /// clock, for callers that already read the time for a batch of work.
    #[inline]
    pub fn decide_at(&self, request: &Request<'_>, now_us: u64) -> Decision {
        let (id, hash, shard) = self.locate(request);
        let (limit, cost) = (request.limit(), request.cost());
        let shard = &self.shards[shard].0;
        if cost == 0 {
            return shard.lock().evaluate(hash, id, limit, now_us, 0);
        }
        let (max, hasher) = (self.max_keys_per_shard, &self.hasher);
        // Not through `charged`: the decision returned out of its closure cost a hot key's
        // decision about 2 ns (`examples/profile.rs race`).
        let mut table = shard.lock();
        let decision = table.decide(hash, id, limit, now_us, cost, max, hasher);
        let evicted = table.take_evicted();
        drop(table);
        self.count_eviction(evicted);
        decision
    }

    /// Runs `f` on `shard`'s table under its lock, then counts a live key it evicted.
    #[inline]
    fn charged<R>(&self, shard: &Lock<Table>, f: impl FnOnce(&mut Table) -> R) -> R {
        let mut table = shard.lock();
        let out = f(&mut table);
        let evicted = table.take_evicted();
        drop(table);
        self.count_eviction(evicted);
        out
    }

    /// Settles a batch synchronously: see [`Store::settle_all`]. Each settle is applied under
    /// its shard's lock, one after the other.
    pub fn settle_all_sync(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        validate_settles(settles)?;
        let now = self.clock.now_us();
        let (max, hasher) = (self.max_keys_per_shard, &self.hasher);
        let settle = |s: &Settle<'_>| {
            let r = s.request();
            let (id, hash, shard) = self.locate(r);
            let (limit, cost, report) = (r.limit(), r.cost(), s.is_report());
            self.charged(&self.shards[shard].0, |t| {
                t.settle(hash, id, limit, report, now, cost, max, hasher)
            })
        };
        Ok(settles.iter().map(settle).collect())
    }

    /// Counts a live key evicted to make room for an insert (`evicted`), in the store's total
    /// and to its observer.
    #[inline]
    fn count_eviction(&self, evicted: bool) {
        if evicted {
            self.evictions.fetch_add(1, Ordering::Relaxed);
            self.observer.on_evict(STORE_NAME, 1);
        }
    }

    /// Decides a batch all-or-nothing, synchronously: see [`Store::decide_all`].
    ///
    /// The shards involved are locked in ascending order, so batches never deadlock.
    pub fn decide_all_sync(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        let undecided = Decision::denied(0, 0, Duration::ZERO, Duration::ZERO);
        let mut decisions = vec![undecided; requests.len()];
        self.decide_all_into(requests, &mut decisions)?;
        Ok(decisions)
    }

    /// [`decide_all_sync`](Self::decide_all_sync) into the caller's buffer, one slot per
    /// request: a batch of up to [`INLINE`] requests allocates nothing (what
    /// [`Store::decide_all_now`] answers with).
    ///
    /// # Errors
    ///
    /// An invalid batch ([`validate_batch`]), or `decisions` not as long as `requests`.
    pub fn decide_all_into(
        &self,
        requests: &[Request<'_>],
        decisions: &mut [Decision],
    ) -> Result<(), Error> {
        validate_batch(requests)?;
        if decisions.len() != requests.len() {
            return Err(Error::InvalidRequest(
                "a decision buffer not as long as the batch",
            ));
        }
        let now = self.clock.now_us();
        // Pushed one by one: cheaper than `collect` into a `SmallVec` for a batch of two.
        let mut located: SmallVec<[(Id<'_>, u64, usize); INLINE]> = SmallVec::new();
        let mut shard_ids: SmallVec<[usize; INLINE]> = SmallVec::new();
        for r in requests {
            let at = self.locate(r);
            shard_ids.push(at.2);
            located.push(at);
        }
        shard_ids.sort_unstable();
        shard_ids.dedup();
        let mut guards: SmallVec<[_; INLINE]> = SmallVec::new();
        for &s in &shard_ids {
            guards.push((s, self.shards[s].0.lock()));
        }
        let guard_of = |shard: usize| shard_ids.binary_search(&shard).unwrap_or(0);

        // Looked up once: each entry's place is found in the first pass and reused by the
        // second, the shard locks held, nothing inserted or removed in between.
        let mut places: SmallVec<[shard::At; INLINE]> = SmallVec::new();
        for ((d, r), &(id, hash, shard)) in decisions.iter_mut().zip(requests).zip(&located) {
            let table = &guards[guard_of(shard)].1;
            let at = table.find(hash, id, r.limit());
            *d = table.evaluate_at(at, r.limit(), now, r.cost());
            places.push(at);
        }
        if !decisions.iter().all(Decision::is_allowed) {
            // Nothing is charged: a request that alone would pass reports its state as it is.
            for (((d, r), &(_, _, shard)), &at) in decisions
                .iter_mut()
                .zip(requests)
                .zip(&located)
                .zip(&places)
            {
                if d.is_allowed() {
                    *d = guards[guard_of(shard)].1.evaluate_at(at, r.limit(), now, 0);
                }
            }
            return Ok(());
        }
        // Known keys first: a fresh key's insert may move the other entries of its table.
        for fresh in [false, true] {
            for ((r, &(id, hash, shard)), &at) in requests.iter().zip(&located).zip(&places) {
                if r.cost() == 0 || at.is_fresh() != fresh {
                    continue;
                }
                let table = &mut guards[guard_of(shard)].1;
                let (max, hasher) = (self.max_keys_per_shard, &self.hasher);
                table.decide_at(at, hash, id, r.limit(), now, r.cost(), max, hasher);
                self.count_eviction(table.take_evicted());
            }
        }
        Ok(())
    }

    /// Gives back `give_back` unspent units of `request`'s key, then withdraws up to `want`
    /// available units, atomically under the key's shard lock: [`LeaseStore::exchange`] without
    /// waiting. The token bucket and GCRA only (else [`Error::InvalidRequest`]).
    pub fn exchange_sync(
        &self,
        request: &Request<'_>,
        give_back: u64,
        want: u64,
    ) -> Result<Grant, Error> {
        request.limit().check_lease()?;
        let now = self.clock.now_us();
        let (id, hash, shard) = self.locate(request);
        let (limit, max, hasher) = (request.limit(), self.max_keys_per_shard, &self.hasher);
        Ok(self.charged(&self.shards[shard].0, |t| {
            t.give_back(hash, id, limit, now, give_back);
            t.take(hash, id, limit, now, want, max, hasher)
        }))
    }

    /// Drops every expired entry now and returns memory left behind by a flood. Never needed for
    /// correctness or to bound memory (a full table drops its expired entries before it grows); it
    /// locks each shard in turn.
    pub fn purge_expired(&self) {
        let now = self.clock.now_us();
        for shard in self.shards.iter() {
            shard.0.lock().purge(now, &self.hasher);
        }
        self.permits.purge(now);
    }
}

impl<C, S> MemoryStore<C, S> {
    /// The number of keys held now (expired ones not yet swept included).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().len()).sum()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of keys each shard holds now: a diagnostic of how evenly keys spread.
    pub fn shard_lens(&self) -> Vec<usize> {
        self.shards.iter().map(|s| s.0.lock().len()).collect()
    }

    /// The cap on the number of keys.
    pub fn max_keys(&self) -> usize {
        self.max_keys_per_shard * SHARDS
    }

    /// How many live keys were evicted because a shard was full.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// The clock the store reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<C: fmt::Debug, S> fmt::Debug for Builder<C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("clock", &self.clock)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl<C, S> fmt::Debug for MemoryStore<C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &SHARDS)
            .field("max_keys", &self.max_keys())
            .field("evictions", &self.evictions())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<C: Clock, S: BuildHasher + Send + Sync> Store for MemoryStore<C, S> {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        Ok(self.decide_sync(request))
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        self.decide_all_sync(requests)
    }

    /// Always `Some`: the memory store never waits.
    #[inline(always)]
    fn decide_now(&self, request: &Request<'_>) -> Option<Result<Decision, Error>> {
        Some(Ok(self.decide_sync(request)))
    }

    /// Always `Some`: the memory store never waits ([`MemoryStore::decide_all_into`]).
    fn decide_all_now(
        &self,
        requests: &[Request<'_>],
        decisions: &mut [Decision],
    ) -> Option<Result<(), Error>> {
        Some(self.decide_all_into(requests, decisions))
    }

    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        self.settle_all_sync(settles)
    }
}

/// Leases decided under the shard lock, exactly as [`Limit::take`](distlimit_core::Limit::take)
/// and [`Limit::give_back`](distlimit_core::Limit::give_back).
#[async_trait]
impl<C: Clock, S: BuildHasher + Send + Sync> LeaseStore for MemoryStore<C, S> {
    async fn exchange(
        &self,
        request: &Request<'_>,
        give_back: u64,
        want: u64,
    ) -> Result<Grant, Error> {
        self.exchange_sync(request, give_back, want)
    }
}
