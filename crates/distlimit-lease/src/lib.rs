#![doc = include_str!("../README.md")]

mod account;

use std::collections::HashSet;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use distlimit_core::{
    Clock, Decision, Error, Key, LeaseStore, NoopObserver, Request, Settle, StateRef, Store,
    StoreExt, SystemClock,
};
use hashbrown::HashTable;
use parking_lot::{Mutex, RwLock};

use crate::account::{Account, Local};
pub use distlimit_core::LeaseObserver;

/// How long a lease lasts by default: 100 ms.
pub const DEFAULT_HORIZON: Duration = Duration::from_millis(100);

/// The most keys with a lease by default: 65 536 (see [`Builder::max_leases`]).
pub const DEFAULT_MAX_LEASES: usize = 1 << 16;

/// The most ended leases one [`Leased::sweep`] gives back: 1 024.
pub const SWEEP_BATCH: usize = 1024;

/// Shards of the lease table (by key hash), so keys on different threads rarely share a lock.
const SHARDS: usize = 16;

/// The store name reported to the [`LeaseObserver`].
pub const STORE_NAME: &str = "lease";

/// Which policies lease: every other request goes straight to the store.
#[derive(Clone)]
enum Policies {
    Names(HashSet<Box<str>>),
    /// Limiter policy names: a state leases when its (typed) policy is one.
    Limiter(HashSet<Box<str>>),
    Matching(Arc<dyn Fn(&str) -> bool + Send + Sync>),
}

impl Policies {
    fn lease(&self, state: StateRef<'_>) -> bool {
        match self {
            Policies::Names(names) => names.contains(state.as_str()),
            Policies::Limiter(names) => names.contains(state.policy()),
            Policies::Matching(f) => f(state.as_str()),
        }
    }
}

/// One key's lease and its single flight.
struct Slot {
    /// `policy ‖ 0xFF ‖ key`: a policy is UTF-8, which never holds the byte 0xFF.
    id: Box<[u8]>,
    policy_len: usize,
    hash: u64,
    account: Mutex<Account>,
    /// Held by the one caller asking the store for this key; the others wait for its answer.
    flight: tokio::sync::Mutex<()>,
}

impl Slot {
    fn is(&self, policy: &str, key: &[u8]) -> bool {
        self.policy_len == policy.len()
            && self.id[..self.policy_len] == *policy.as_bytes()
            && self.id[self.policy_len + 1..] == *key
    }

    /// The request this slot leases for, under `limit`.
    fn request(&self) -> Option<(&str, Key<'_>)> {
        let policy = std::str::from_utf8(&self.id[..self.policy_len]).ok()?;
        let key = Key::new(&self.id[self.policy_len + 1..]).ok()?;
        Some((policy, key))
    }
}

/// Counts of what a [`Leased`] store did since it was built, from [`Leased::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Decisions answered from a lease, without a store call.
    pub local: u64,
    /// Calls to the store's [`LeaseStore::exchange`] (takes and give-backs together).
    pub store_calls: u64,
    /// Units withdrawn from the store.
    pub taken: u64,
    /// Unspent units given back to the store.
    pub returned: u64,
    /// Units of ended leases whose give-back failed: neither spent nor known to be back (an
    /// under-admission until the key refills, never an over-admission).
    pub lost: u64,
    /// Units held in leases now.
    pub held: u64,
    /// Keys with a lease now.
    pub leases: u64,
}

#[derive(Default)]
struct Counters {
    local: AtomicU64,
    store_calls: AtomicU64,
    taken: AtomicU64,
    returned: AtomicU64,
    lost: AtomicU64,
    held: AtomicU64,
}

/// A [`Store`] that spends units withdrawn in advance from a [`LeaseStore`]: see the
/// [crate documentation](crate).
pub struct Leased<S> {
    inner: S,
    policies: Policies,
    horizon_us: u64,
    max_leases: usize,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn LeaseObserver>,
    hasher: foldhash::quality::RandomState,
    shards: Box<[RwLock<HashTable<Arc<Slot>>>]>,
    len: AtomicUsize,
    counters: Counters,
}

/// Configures a [`Leased`] store.
pub struct Builder {
    policies: Policies,
    horizon: Duration,
    max_leases: usize,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn LeaseObserver>,
}

impl Builder {
    /// How long a lease lasts (default [`DEFAULT_HORIZON`], at least 1 ms): its unspent units go
    /// back when it ends, and a key's lease size aims at its local rate times this.
    pub fn horizon(mut self, horizon: Duration) -> Self {
        self.horizon = horizon.max(Duration::from_millis(1));
        self
    }

    /// The most keys with a lease (default [`DEFAULT_MAX_LEASES`]); requests for further keys go
    /// straight to the store until [`Leased::sweep`] drops idle ones.
    pub fn max_leases(mut self, max_leases: usize) -> Self {
        self.max_leases = max_leases;
        self
    }

    /// The clock leases end by (default [`SystemClock`]).
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Where leases taken and returned are reported (policy and units; store [`STORE_NAME`]).
    pub fn observer(mut self, observer: Arc<dyn LeaseObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// Wraps `inner`.
    pub fn build<S: LeaseStore>(self, inner: S) -> Leased<S> {
        Leased {
            inner,
            policies: self.policies,
            horizon_us: u64::try_from(self.horizon.as_micros()).unwrap_or(u64::MAX),
            max_leases: self.max_leases,
            clock: self.clock,
            observer: self.observer,
            hasher: foldhash::quality::RandomState::default(),
            shards: (0..SHARDS).map(|_| RwLock::new(HashTable::new())).collect(),
            len: AtomicUsize::new(0),
            counters: Counters::default(),
        }
    }
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("horizon", &self.horizon)
            .field("max_leases", &self.max_leases)
            .finish_non_exhaustive()
    }
}

impl<S> fmt::Debug for Leased<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leased")
            .field("horizon_us", &self.horizon_us)
            .field("max_leases", &self.max_leases)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Leased<()> {
    /// A builder leasing for the policies named in `policies` (exact store policy names, such as
    /// a limiter's `"api/free"`).
    pub fn for_policies<I, P>(policies: I) -> Builder
    where
        I: IntoIterator<Item = P>,
        P: Into<Box<str>>,
    {
        Self::with(Policies::Names(
            policies.into_iter().map(Into::into).collect(),
        ))
    }

    /// A builder leasing for every tier of the `distlimit_policy::Limiter` policies named in
    /// `policies`: a request leases when the policy of its typed state
    /// ([`Request::state`](distlimit_core::Request::state)) is one; the limiter names a tier's
    /// state [`StateName::of_tier`](distlimit_core::StateName::of_tier). No name is parsed: a
    /// request named by [`Request::with_policy`] alone is its whole string's policy.
    ///
    /// ```
    /// use distlimit_core::{Key, Limit, Quota, Request, StateName, Store};
    /// use distlimit_lease::Leased;
    /// use distlimit_memory::MemoryStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let leased = Leased::for_limiter_policies(["api"]).build(MemoryStore::new());
    /// let limit = Limit::gcra(Quota::per_hour(1_000)?);
    /// let key = Key::new("tenant-7")?;
    /// for (policy, tier) in [("api", "free"), ("api", "paid"), ("apis", "free")] {
    ///     let state = StateName::of_tier(policy, tier)?;
    ///     leased.decide(&Request::new(key, limit).with_state(&state)).await?;
    /// }
    /// for policy in ["api", "api/other", "other"] {
    ///     leased.decide(&Request::new(key, limit).with_policy(policy)?).await?;
    /// }
    /// // A lease each for the three states of the policy `api`, none for the others (the
    /// // untyped "api/other" is a policy of that whole name).
    /// assert_eq!(leased.stats().leases, 3);
    /// # Ok(()) }
    /// ```
    pub fn for_limiter_policies<I, P>(policies: I) -> Builder
    where
        I: IntoIterator<Item = P>,
        P: Into<Box<str>>,
    {
        Self::with(Policies::Limiter(
            policies.into_iter().map(Into::into).collect(),
        ))
    }

    /// A builder leasing for the policies `predicate` accepts (called on every request: keep it
    /// cheap).
    pub fn matching(predicate: impl Fn(&str) -> bool + Send + Sync + 'static) -> Builder {
        Self::with(Policies::Matching(Arc::new(predicate)))
    }

    fn with(policies: Policies) -> Builder {
        Builder {
            policies,
            horizon: DEFAULT_HORIZON,
            max_leases: DEFAULT_MAX_LEASES,
            clock: Arc::new(SystemClock),
            observer: Arc::new(NoopObserver),
        }
    }
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

impl<S> Leased<S> {
    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// What this store did since it was built.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        Stats {
            local: c.local.load(Ordering::Relaxed),
            store_calls: c.store_calls.load(Ordering::Relaxed),
            taken: c.taken.load(Ordering::Relaxed),
            returned: c.returned.load(Ordering::Relaxed),
            lost: c.lost.load(Ordering::Relaxed),
            held: c.held.load(Ordering::Relaxed),
            leases: self.len.load(Ordering::Relaxed) as u64,
        }
    }
}

impl<S: LeaseStore> Leased<S> {
    /// Whether `request` is decided through a lease: a leased policy, a cost from 1 to the
    /// capacity, and the token bucket or GCRA. Peeks and everything else go to the store.
    fn leases(&self, request: &Request<'_>) -> bool {
        let limit = request.limit();
        request.cost() > 0
            && request.cost() <= limit.capacity()
            && limit.check_lease().is_ok()
            && self.policies.lease(request.state())
    }

    /// The slot of a request [`leases`](Self::leases) decides through, if there is room.
    fn leased_slot(&self, request: &Request<'_>) -> Option<Arc<Slot>> {
        self.leases(request).then(|| self.slot(request)).flatten()
    }

    /// The slot of `request`'s (policy, key), made if there is room; `None` at the cap.
    fn slot(&self, request: &Request<'_>) -> Option<Arc<Slot>> {
        let (policy, key) = (request.policy(), request.key().as_bytes());
        let mut hasher = self.hasher.build_hasher();
        hasher.write(policy.as_bytes());
        hasher.write_u8(0xFF);
        hasher.write(key);
        let hash = hasher.finish();
        let shard = &self.shards[(hash >> 56) as usize % SHARDS];
        if let Some(slot) = shard.read().find(hash, |s| s.is(policy, key)) {
            return Some(slot.clone());
        }
        let mut table = shard.write();
        if let Some(slot) = table.find(hash, |s| s.is(policy, key)) {
            return Some(slot.clone());
        }
        if self.len.load(Ordering::Relaxed) >= self.max_leases {
            return None;
        }
        self.len.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            id: [policy.as_bytes(), &[0xFF], key]
                .concat()
                .into_boxed_slice(),
            policy_len: policy.len(),
            hash,
            account: Mutex::new(Account::default()),
            flight: tokio::sync::Mutex::new(()),
        });
        table.insert_unique(hash, slot.clone(), |s| s.hash);
        Some(slot)
    }

    /// Decides from the lease alone, if it can: `None` when the store must be asked.
    fn decide_local(&self, slot: &Slot, request: &Request<'_>) -> Option<Decision> {
        let (now, cost) = (self.clock.now_us(), request.cost());
        match slot.account.lock().spend(request.limit(), now, cost) {
            Local::Spent(decision) => {
                bump(&self.counters.local, 1);
                self.counters.held.fetch_sub(cost, Ordering::Relaxed);
                Some(decision)
            }
            Local::Denied(decision) => Some(decision),
            Local::Ask => None,
        }
    }

    /// The store call for `request` when its lease cannot pay: one caller per key at a time;
    /// the ones waiting for it try the refilled lease first.
    async fn decide_leased(&self, slot: &Slot, request: &Request<'_>) -> Result<Decision, Error> {
        let _flight = slot.flight.lock().await;
        if let Some(decision) = self.decide_local(slot, request) {
            return Ok(decision);
        }
        let (limit, cost) = (request.limit(), request.cost());
        let now = self.clock.now_us();
        let (back, want) = slot.account.lock().begin(limit, now, cost, self.horizon_us);
        bump(&self.counters.store_calls, 1);
        // Units on their way back are no longer held. If this future is dropped mid-call (a
        // caller's timeout), they and any units granted are neither held nor spent: an
        // under-admission, never more than the limit.
        self.counters.held.fetch_sub(back, Ordering::Relaxed);
        let result = self.inner.exchange(request, back, want).await;
        let policy = request.policy();
        match result {
            Ok(grant) => {
                if back > 0 {
                    bump(&self.counters.returned, back);
                    self.observer.on_lease_returned(STORE_NAME, policy, back);
                }
                bump(&self.counters.taken, grant.granted);
                self.observer
                    .on_lease_taken(STORE_NAME, policy, grant.granted);
                // Counted before the account makes them spendable, so the count never wraps.
                let held = &self.counters.held;
                bump(held, grant.granted);
                let decision =
                    slot.account
                        .lock()
                        .granted(limit, now, cost, want, grant, self.horizon_us);
                // Held: + granted − spent by this request.
                if decision.is_allowed() {
                    held.fetch_sub(cost, Ordering::Relaxed);
                }
                self.observer
                    .on_lease_units(STORE_NAME, held.load(Ordering::Relaxed));
                Ok(decision)
            }
            Err(e) => {
                // The give-back's fate is unknown: those units are no longer held.
                bump(&self.counters.lost, back);
                Err(e)
            }
        }
    }

    /// A report on a leased policy, paid as the crate documentation's "Reports and give-backs"
    /// says.
    async fn report(&self, slot: &Slot, request: &Request<'_>) -> Result<Decision, Error> {
        let (limit, cost) = (request.limit(), request.cost());
        let drained = slot.account.lock().drain(limit, self.clock.now_us(), cost);
        self.counters.held.fetch_sub(drained, Ordering::Relaxed);
        let rest = Settle::Report(request.with_cost(cost - drained));
        let result = self.inner.settle(rest).await;
        if result.is_err() && drained > 0 {
            slot.account.lock().unspend(limit, drained);
            bump(&self.counters.held, drained);
        }
        result
    }

    /// Puts the units `spent` from leases by a batch that was then denied back into them.
    fn unspend(&self, spent: &[(&Slot, &Request<'_>)]) {
        for (slot, request) in spent {
            slot.account.lock().unspend(request.limit(), request.cost());
            bump(&self.counters.held, request.cost());
        }
    }

    /// Gives back the unspent units of ended leases (at most [`SWEEP_BATCH`] leases per call)
    /// and forgets keys idle for ten horizons, so memory stays bounded. Leases also end lazily,
    /// at their key's next request; call this periodically (or [`spawn_sweeper`]) so that
    /// units of keys that went quiet go back too. Returns the units given back.
    pub async fn sweep(&self) -> u64 {
        let now = self.clock.now_us();
        let idle = self.horizon_us.saturating_mul(10);
        let mut due: Vec<(Arc<Slot>, u64)> = Vec::new();
        for shard in self.shards.iter() {
            let slots: Vec<Arc<Slot>> = shard.read().iter().cloned().collect();
            for slot in slots {
                if due.len() >= SWEEP_BATCH {
                    break;
                }
                // A key whose store call is under way is left to it.
                let Ok(_flight) = slot.flight.try_lock() else {
                    continue;
                };
                let back = slot.account.lock().sweep(now);
                if back > 0 {
                    due.push((slot.clone(), back));
                }
            }
            // Idle keys holding nothing, which no request is using, are forgotten.
            shard.write().retain(|slot| {
                let account = slot.account.lock();
                let forget = account.held() == 0
                    && now.saturating_sub(account.used_us) >= idle
                    && Arc::strong_count(slot) == 1;
                if forget {
                    self.len.fetch_sub(1, Ordering::Relaxed);
                }
                !forget
            });
        }
        let mut returned = 0;
        for (slot, back) in due {
            let _flight = slot.flight.lock().await;
            let Some(limit) = slot.account.lock().limit else {
                continue;
            };
            let Some((policy, key)) = slot.request() else {
                continue;
            };
            let Ok(request) = Request::new(key, limit).with_policy(policy) else {
                continue;
            };
            bump(&self.counters.store_calls, 1);
            self.counters.held.fetch_sub(back, Ordering::Relaxed);
            match self.inner.give_back(&request, back).await {
                Ok(()) => {
                    returned += back;
                    bump(&self.counters.returned, back);
                    self.observer.on_lease_returned(STORE_NAME, policy, back);
                }
                Err(_) => bump(&self.counters.lost, back),
            }
        }
        self.observer
            .on_lease_units(STORE_NAME, self.counters.held.load(Ordering::Relaxed));
        returned
    }
}

/// Runs [`Leased::sweep`] every `every` on the current Tokio runtime until `leased` is dropped.
pub fn spawn_sweeper<S: LeaseStore + 'static>(
    leased: &Arc<Leased<S>>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let weak: Weak<Leased<S>> = Arc::downgrade(leased);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(leased) = weak.upgrade() else {
                return;
            };
            leased.sweep().await;
        }
    })
}

#[async_trait]
#[warn(clippy::missing_trait_methods)]
impl<S: LeaseStore> Store for Leased<S> {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        let Some(slot) = self.leased_slot(request) else {
            return self.inner.decide(request).await;
        };
        if let Some(decision) = self.decide_local(&slot, request) {
            return Ok(decision);
        }
        self.decide_leased(&slot, request).await
    }

    /// All or nothing, as the crate documentation's "Batches, all or nothing" says: a batch of
    /// one request is that request's decision; a leased request of a denied batch answers what
    /// it alone was answered.
    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        if let [one] = requests {
            return Ok(vec![self.decide(one).await?]);
        }
        let slots: Vec<Option<Arc<Slot>>> = requests.iter().map(|r| self.leased_slot(r)).collect();
        if slots.iter().all(Option::is_none) {
            return self.inner.decide_all(requests).await;
        }
        distlimit_core::validate_batch(requests)?;
        let mut decisions: Vec<Option<Decision>> = vec![None; requests.len()];
        let mut spent: Vec<(&Slot, &Request<'_>)> = Vec::new();
        let mut denied = false;
        for ((request, slot), decision) in requests.iter().zip(&slots).zip(&mut decisions) {
            let Some(slot) = slot else { continue };
            let decided = match self.decide_local(slot, request) {
                Some(decided) => decided,
                None => self
                    .decide_leased(slot, request)
                    .await
                    .inspect_err(|_| self.unspend(&spent))?,
            };
            if decided.is_allowed() {
                spent.push((slot, request));
            } else {
                denied = true;
            }
            *decision = Some(decided);
        }
        let rest: Vec<Request<'_>> = requests
            .iter()
            .zip(&slots)
            .filter(|(_, slot)| slot.is_none())
            .map(|(r, _)| if denied { r.with_cost(0) } else { *r })
            .collect();
        if !rest.is_empty() {
            let answered = self
                .inner
                .decide_all(&rest)
                .await
                .inspect_err(|_| self.unspend(&spent))?;
            denied |= answered.iter().any(Decision::is_denied);
            let mut answered = answered.into_iter();
            for (slot, decision) in slots.iter().zip(&mut decisions) {
                if slot.is_none() {
                    *decision = answered.next();
                }
            }
        }
        if denied {
            self.unspend(&spent);
        }
        decisions
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or(Error::InvalidRequest(
                "the store answered fewer decisions than requests",
            ))
    }

    /// A decision the lease can make alone (spent from it, or denied while the store has
    /// nothing); else the inner store's own `decide_now` for requests that do not lease.
    fn decide_now(&self, request: &Request<'_>) -> Option<Result<Decision, Error>> {
        let Some(slot) = self.leased_slot(request) else {
            return self.inner.decide_now(request);
        };
        self.decide_local(&slot, request).map(Ok)
    }

    // Batches are always awaited (`decide_all`): `None` is always a correct answer.
    fn decide_all_now(&self, _: &[Request<'_>], _: &mut [Decision]) -> Option<Result<(), Error>> {
        None
    }

    /// A single report on a leased policy is paid by this instance's lease first (see
    /// `report`); everything else goes to the store.
    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        if let [one] = settles
            && one.is_report()
            && one.request().cost() <= distlimit_core::MAX_REPORT
            && one.request().limit().check_lease().is_ok()
            && self.policies.lease(one.request().state())
            && let Some(slot) = self.slot(one.request())
        {
            return Ok(vec![self.report(&slot, one.request()).await?]);
        }
        self.inner.settle_all(settles).await
    }
}
