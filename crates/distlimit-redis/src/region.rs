//! One limit across regions: [`RegionStore`] decides on the region's own Redis from units
//! leased in advance from a home store (hierarchical leases).
//!
//! Every region runs its own Redis and its own instances. The global budget of a key lives in
//! one *home* store (any [`LeaseStore`]: a [`RedisStore`] in the home region, reached across
//! regions). A region holds a *pool* of units per key in its own Redis, withdrawn from home by
//! [`LeaseStore::exchange`]; its instances spend from the pool, one atomic script call to the
//! region's Redis per decision (`pool.lua`, a group of the entry script), so decisions are
//! answered at the region's latency.
//!
//! # Why the limit holds
//!
//! A unit is spent at home (withdrawn) before any region can spend it, and a pool hands a unit
//! to one decision only (atomically, inside the region's Redis). So the units all regions admit
//! together never exceed what home granted, which never exceeds what the home store's limit
//! admits. Units go home only from the pool (taken out of it first): none is spent and returned.
//!
//! # Refills, ahead of need, one per key per region
//!
//! The call that spends also says when the pool needs units: below half the size of its last
//! refill, short of what a request asked, or holding units past the horizon. Then it *claims*
//! the refill (one claim per key per region at a time, for [`RegionBuilder::claim_timeout`]),
//! and the instance that got the claim asks home in a task of its own, while its request is
//! answered from the pool at once. A refill asks for the region's demand (units asked, admitted
//! or not) since the last refill, per second, times three times the measured refill lag (the
//! pool's moving average from claim to deposit; at least 20 ms, at most the horizon), at most
//! the capacity, less the units left; home grants what it has. When home has none, no refill
//! is claimed before home's own `retry_after`. A request its pool cannot pay whose step claimed
//! the refill (the first request of a key new to the region, say) waits for that refill (at most
//! the claim timeout) and spends again: it is served at home's latency, never past the limit
//! (every unit it spends came from home). Requests that find the refill under way are denied
//! until it lands.
//!
//! # Unused units go home
//!
//! Units deposited in a pool are due home after the [horizon](RegionBuilder::horizon) (1 s by
//! default). The next step on the pool that finds them due (a request, or
//! [`RegionStore::sweep`] for keys that went quiet) takes them out and gives them back with the
//! refill's exchange, in the same home call. Until then they stay spendable in the region, so a
//! unit withdrawn at `t` is admitted by `t + horizon` (see below for a home cut).
//!
//! # When home is unreachable
//!
//! No error reaches a caller for it: a refill that fails is counted
//! ([`RegionStats::refill_failures`]), and no other refill of that key is claimed in the region
//! for [`RegionBuilder::retry_after_failure`]. Meanwhile the region spends what its pools hold,
//! past their horizon too (they are not sent home while the last refill failed). When a pool
//! cannot pay, the request is denied (the limit still holds), or admitted if the operator chose
//! [`HomeUnreachable::Allow`] (fail open, marked `Source::FailOpen`: that key is not limited in
//! that region until home answers). The units a failed exchange was giving back may or may not be
//! back home (the call's fate is unknown): counted as lost, an under-admission.
//!
//! The region's own Redis failing is the region's store failing: its error reaches the caller,
//! as from a [`RedisStore`] (wrap the region store in a hybrid store for a failure mode).
//!
//! # What is decided where
//!
//! The token bucket and GCRA, costs up to the capacity: through the pool. Peeks (cost 0)
//! answer from the pool too (allowed when it holds a unit). The window algorithms and costs
//! above the capacity go to the home store (at home's latency). A batch
//! ([`Store::decide_all`]) is all or nothing: its regional requests are spent from their pools
//! one after the other, the others decided at home as one batch, and the pools' units put back
//! when any request is denied.
//!
//! # Settling
//!
//! A report ([`Store::settle_all`]) is paid first by the units the pool holds (withdrawn from
//! home already), the rest reported home, where what exceeds the key's units is debt: the
//! key's next refill finds home empty, so the key is denied in every region until the debt has
//! refilled, as on one Redis (units other regions' pools hold stay spendable there until their
//! horizon). A refill the report's step claims is made (and awaited) only after the report
//! reached home, so the pool learns when home has units again. A
//! give-back returns its units to the region's pool, spendable there at once and due home after
//! the horizon (where a full state takes no more): units reserved and given back in a region are
//! its own again even while home has none.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use distlimit_core::{
    Decision, Error, Grant, Key, LeaseStore, Limit, Request, Settle, Source, Store, StoreExt,
    validate_settles,
};

use crate::RedisStore;
use crate::script::{Group, Op, PoolAction, PoolParams, PoolReply as Step};

/// How long deposited units stay in a region's pool before they are due home: 1 s.
pub const DEFAULT_REGION_HORIZON: Duration = Duration::from_secs(1);

/// How long one instance's refill may take before another may claim one: 2 s.
pub const DEFAULT_CLAIM_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a region waits after a failed refill before claiming another: 250 ms.
pub const DEFAULT_RETRY_AFTER_FAILURE: Duration = Duration::from_millis(250);

/// The most keys [`RegionStore::sweep`] remembers per instance: 65 536.
pub const MAX_SWEPT_KEYS: usize = 1 << 16;

/// What a request its region's pool cannot pay gets while home is unreachable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HomeUnreachable {
    /// Denied: the limit holds (the default).
    #[default]
    Deny,
    /// Admitted (fail open, marked [`Source::FailOpen`]) until home answers: the key is unlimited.
    Allow,
}

/// Counts of what a [`RegionStore`] (one instance) did since it was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegionStats {
    /// Refills asked of home by this instance (each one `exchange`).
    pub refills: u64,
    /// Refills that failed (home unreachable or failing).
    pub refill_failures: u64,
    /// Units home granted to this instance's refills.
    pub from_home: u64,
    /// Units given back home.
    pub returned_home: u64,
    /// Units whose fate is unknown: given back by a failed exchange, or granted by home but not
    /// deposited (the region's Redis failed). An under-admission.
    pub lost: u64,
    /// Requests admitted without units because home was unreachable
    /// ([`HomeUnreachable::Allow`]).
    pub failed_open: u64,
}

/// Configures a [`RegionStore`].
#[derive(Clone, Debug)]
pub struct RegionBuilder {
    horizon: Duration,
    claim_timeout: Duration,
    retry_after_failure: Duration,
    home_unreachable: HomeUnreachable,
}

impl Default for RegionBuilder {
    fn default() -> Self {
        Self {
            horizon: DEFAULT_REGION_HORIZON,
            claim_timeout: DEFAULT_CLAIM_TIMEOUT,
            retry_after_failure: DEFAULT_RETRY_AFTER_FAILURE,
            home_unreachable: HomeUnreachable::Deny,
        }
    }
}

impl RegionBuilder {
    /// How long deposited units stay in a pool before they are due home, and the time a refill
    /// aims to last (default [`DEFAULT_REGION_HORIZON`], at least 1 ms). Keep it several times
    /// the round trip to home, so a refill arrives before the pool runs dry.
    pub fn horizon(mut self, horizon: Duration) -> Self {
        self.horizon = horizon.max(Duration::from_millis(1));
        self
    }

    /// How long a refill may take (default [`DEFAULT_CLAIM_TIMEOUT`], at least 1 ms): the home
    /// call is abandoned after it (a failure), and another instance may claim a refill.
    pub fn claim_timeout(mut self, timeout: Duration) -> Self {
        self.claim_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long a region waits after a failed refill before it claims another (default
    /// [`DEFAULT_RETRY_AFTER_FAILURE`]).
    pub fn retry_after_failure(mut self, wait: Duration) -> Self {
        self.retry_after_failure = wait;
        self
    }

    /// What a request the pool cannot pay gets while home is unreachable (default
    /// [`HomeUnreachable::Deny`]).
    pub fn home_unreachable(mut self, answer: HomeUnreachable) -> Self {
        self.home_unreachable = answer;
        self
    }

    /// A region store spending from pools in `region` (this region's Redis) whose units come
    /// from `home`. `region` may be the home store's own server: pools have keys of their own.
    pub fn build<H: LeaseStore + 'static>(self, home: H, region: RedisStore) -> RegionStore<H> {
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let horizon_us = us(self.horizon);
        let claim_us = us(self.claim_timeout);
        // A pool outlives its units' horizon and any claim: it is forgotten (its units lost)
        // only after ten horizons, and at least a minute, without a step.
        let keep_ms = (horizon_us.saturating_mul(10).max(claim_us) / 1000).max(60_000);
        RegionStore {
            shared: Arc::new(Shared {
                home,
                region,
                horizon_us,
                claim_us,
                claim_timeout: self.claim_timeout,
                backoff_us: us(self.retry_after_failure),
                keep_ms,
                home_unreachable: self.home_unreachable,
                counters: Mutex::default(),
                seen: Seen::default(),
            }),
        }
    }
}

/// The keys an instance stepped on since the last [`RegionStore::sweep`], with their limits.
#[derive(Default)]
struct Seen(Mutex<HashMap<PolicyKey, Limit>>);

/// A (policy, key) pair, owned.
type PolicyKey = (Box<str>, Box<[u8]>);

impl Seen {
    fn note(&self, policy: &str, key: &[u8], limit: Limit) {
        let Ok(mut seen) = self.0.lock() else { return };
        if seen.len() < MAX_SWEPT_KEYS {
            seen.insert((policy.into(), key.into()), limit);
        } else if let Some(known) = seen.get_mut(&(Box::from(policy), Box::from(key))) {
            *known = limit;
        }
    }

    fn take(&self) -> Vec<(PolicyKey, Limit)> {
        self.0
            .lock()
            .map(|mut seen| seen.drain().collect())
            .unwrap_or_default()
    }
}

struct Shared<H> {
    home: H,
    region: RedisStore,
    horizon_us: u64,
    claim_us: u64,
    claim_timeout: Duration,
    backoff_us: u64,
    keep_ms: u64,
    home_unreachable: HomeUnreachable,
    counters: Mutex<RegionStats>,
    seen: Seen,
}

/// A [`Store`] (and [`LeaseStore`]) for one region: see the [module documentation](self).
///
/// Refills run as tasks of the current Tokio runtime: decide inside one, as for the
/// [`RedisStore`] itself.
///
/// Cloning is cheap: clones share the connections, counters and settings.
pub struct RegionStore<H> {
    shared: Arc<Shared<H>>,
}

impl<H> Clone for RegionStore<H> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<H> fmt::Debug for RegionStore<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionStore")
            .field("region", &self.shared.region)
            .field("horizon_us", &self.shared.horizon_us)
            .field("home_unreachable", &self.shared.home_unreachable)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// What follows a pool's key after the state key of its (policy, key): 0xFF, which no policy
/// name (UTF-8) holds, and `pool`.
const POOL_SUFFIX: &[u8] = b"\xFFpool";

/// The `retry_after` of a lease exchange that found its pool empty while home has units
/// (a refill pending): 1 ms, so the lease asks again soon.
const PENDING_REFILL_RETRY_US: u64 = 1_000;

/// The pool of one (policy, key) under its limit, as a step names it.
#[derive(Clone, Copy)]
struct Pool<'a> {
    policy: &'a str,
    key: &'a [u8],
    limit: &'a Limit,
}

impl<'a> Pool<'a> {
    fn of(request: &'a Request<'_>) -> Self {
        Pool {
            policy: request.policy(),
            key: request.key().as_bytes(),
            limit: request.limit(),
        }
    }
}

impl RegionStore<()> {
    /// A builder with the defaults.
    pub fn builder() -> RegionBuilder {
        RegionBuilder::default()
    }
}

impl<H> RegionStore<H> {
    /// The region's own Redis.
    pub fn region(&self) -> &RedisStore {
        &self.shared.region
    }

    /// What this instance did since it was built.
    pub fn stats(&self) -> RegionStats {
        *self.counters()
    }

    fn counters(&self) -> MutexGuard<'_, RegionStats> {
        self.shared
            .counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

impl<H: LeaseStore + 'static> RegionStore<H> {
    async fn step(&self, pool: Pool<'_>, action: PoolAction) -> Result<Step, Error> {
        let s = &*self.shared;
        // The pool's key: the state key of (policy, key) in the region's layout, then
        // `POOL_SUFFIX`: never a state key, even on home's server.
        let buf = s.region.state_key(pool.policy, pool.key);
        let params = PoolParams {
            horizon_us: s.horizon_us,
            capacity: pool.limit.capacity(),
            claim_us: s.claim_us,
            keep_ms: s.keep_ms,
        };
        let op = Op::Pool(params, action);
        let group = Group::keyed(&buf, POOL_SUFFIX, op, s.region.time())?;
        s.region.send(group).await?.pool()
    }

    /// Spends from the pool (give back `back`, take `want` if at least `min`), and starts the
    /// refill the step claimed, if any.
    async fn spend(
        &self,
        request: &Request<'_>,
        back: u64,
        want: u64,
        min: u64,
    ) -> Result<Step, Error> {
        let spend = PoolAction::Spend { back, want, min };
        self.step_and_refill(Pool::of(request), spend).await
    }

    /// A step on the pool, then the refill it claimed, if any, in a task of its own.
    async fn step_and_refill(&self, pool: Pool<'_>, action: PoolAction) -> Result<Step, Error> {
        let step = self.step(pool, action).await?;
        self.start_refill(pool, &step);
        Ok(step)
    }

    /// Starts the refill `step` claimed, if any, in a task of its own (which a caller that
    /// awaits it and gives up does not cancel).
    fn start_refill(&self, pool: Pool<'_>, step: &Step) -> Option<tokio::task::JoinHandle<()>> {
        if step.back > 0 || step.want > 0 {
            // Owned: the refill outlives its request.
            let (policy, key): PolicyKey = (pool.policy.into(), pool.key.into());
            let (this, limit, back, want) = (self.clone(), *pool.limit, step.back, step.want);
            return Some(tokio::spawn(async move {
                let (policy, key, limit) = (&policy, &key, &limit);
                this.refill(Pool { policy, key, limit }, back, want).await
            }));
        }
        None
    }

    /// The claimed refill: one home exchange (at most the claim timeout), then its answer
    /// deposited in the pool.
    async fn refill(&self, target: Pool<'_>, back: u64, want: u64) {
        let s = &*self.shared;
        let Ok(key) = Key::new(target.key) else {
            return;
        };
        let Ok(request) = Request::new(key, *target.limit).with_policy(target.policy) else {
            return;
        };
        self.counters().refills += 1;
        let answer = tokio::time::timeout(s.claim_timeout, s.home.exchange(&request, back, want))
            .await
            .unwrap_or(Err(Error::Timeout {
                store: "region",
                after: s.claim_timeout,
            }));
        let (units, wait_us, ok) = match answer {
            Ok(grant) => {
                let mut c = self.counters();
                c.returned_home = c.returned_home.saturating_add(back);
                c.from_home = c.from_home.saturating_add(grant.granted);
                (grant.granted, grant.decision.retry_after_us().max(1), true)
            }
            Err(_) => {
                let mut c = self.counters();
                c.refill_failures += 1;
                c.lost = c.lost.saturating_add(back);
                (0, s.backoff_us, false)
            }
        };
        let deposit = PoolAction::Deposit { units, wait_us, ok };
        match self.step(target, deposit).await {
            // A pool holding units is one the sweep must look at once they are due.
            Ok(step) if step.units > 0 => {
                s.seen.note(target.policy, target.key, *target.limit);
            }
            Ok(_) => {}
            // The units granted are withdrawn at home and not in the pool: lost. The claim
            // ends by its own timeout.
            Err(_) => {
                let mut c = self.counters();
                c.lost = c.lost.saturating_add(units);
            }
        }
    }

    /// The decision for a request of `cost` after `step`.
    fn decision(&self, limit: &Limit, cost: u64, step: &Step) -> Decision {
        let capacity = limit.capacity();
        let interval = limit.quota().emission_interval_us();
        let reset_us = capacity.saturating_sub(step.units).saturating_mul(interval);
        if step.granted >= cost {
            return Decision::from_micros(true, capacity, step.units, reset_us, 0);
        }
        if step.failing && self.shared.home_unreachable == HomeUnreachable::Allow {
            self.counters().failed_open += 1;
            return Decision::from_micros(true, capacity, step.units, reset_us, 0)
                .with_source(Source::FailOpen);
        }
        // Until home has units, or the missing units at the limit's rate (an estimate: other
        // regions may take them first).
        let missing = cost.saturating_sub(step.units).max(1);
        let retry = step
            .denied_until
            .saturating_sub(step.now)
            .max(missing.saturating_mul(interval));
        Decision::from_micros(false, capacity, step.units, reset_us, retry)
    }

    /// Gives back home the units of pools that are due (past their horizon), for the keys this
    /// instance refilled since the last sweep (and those a sweep left holding units), which may
    /// have gone quiet; answers the keys swept. Keys in use are handled by their own requests
    /// too; a sweep only claims what no refill is claiming.
    pub async fn sweep(&self) -> usize {
        let seen = self.shared.seen.take();
        let n = seen.len();
        let (back, want, min) = (0, 0, 0);
        for ((policy, key), limit) in seen {
            // A step asking for nothing: it claims only the units that are due. A pool still
            // holding units is swept again next time.
            let pool = Pool {
                policy: &policy,
                key: &key,
                limit: &limit,
            };
            let step = self.step_and_refill(pool, PoolAction::Spend { back, want, min });
            if step.await.is_ok_and(|step| step.units > 0) {
                self.shared.seen.note(&policy, &key, limit);
            }
        }
        n
    }
}

/// Runs [`RegionStore::sweep`] every `every` on the current Tokio runtime until the store and
/// its clones are dropped.
pub fn spawn_region_sweeper<H: LeaseStore + 'static>(
    store: &RegionStore<H>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let weak = Arc::downgrade(&store.shared);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(shared) = weak.upgrade() else {
                return;
            };
            RegionStore { shared }.sweep().await;
        }
    })
}

#[async_trait]
impl<H: LeaseStore + 'static> Store for RegionStore<H> {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        if !Self::regional(request) {
            return self.shared.home.decide(request).await;
        }
        let cost = request.cost();
        if cost == 0 {
            // A peek: whether the pool holds a unit.
            let step = self.spend(request, 0, 0, 0).await?;
            let granted = step.units.min(1);
            return Ok(self.decision(request.limit(), 1, &Step { granted, ..step }));
        }
        let (back, want, min) = (0, cost, cost);
        let (pool, spend) = (Pool::of(request), PoolAction::Spend { back, want, min });
        let step = self.step(pool, spend).await?;
        let refill = self.start_refill(pool, &step);
        let Some(refill) = refill.filter(|_| step.granted < cost && step.want > 0) else {
            return Ok(self.decision(request.limit(), cost, &step));
        };
        // The pool cannot pay and this step claimed its refill (a key new to the region):
        // wait for it, then spend again.
        let _ = refill.await;
        let step = self.step_and_refill(pool, spend).await?;
        Ok(self.decision(request.limit(), cost, &step))
    }

    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        validate_settles(settles)?;
        let mut decisions = Vec::with_capacity(settles.len());
        for settle in settles {
            decisions.push(self.settle(settle).await?);
        }
        Ok(decisions)
    }

    /// All or nothing, as the module documentation's "What is decided where" says (the others
    /// only peeked at once a pool denied; a store's failure, too, puts the pools' units back).
    /// Until then those units are not spendable by other requests. A denied batch answers each
    /// regional request what its pool answered.
    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        distlimit_core::validate_batch(requests)?;
        if let [one] = requests {
            return Ok(vec![self.decide(one).await?]);
        }
        let mut spent: Vec<&Request<'_>> = Vec::new();
        let result = async {
            let mut decisions: Vec<Option<Decision>> = vec![None; requests.len()];
            let mut denied = false;
            for (request, decision) in requests.iter().zip(&mut decisions) {
                if Self::regional(request) {
                    // Regional requests after a denial: answered as peeks.
                    let sent = request.with_cost(if denied { 0 } else { request.cost() });
                    let decided = self.decide(&sent).await?;
                    if decided.is_allowed() && sent.cost() > 0 {
                        spent.push(request);
                    }
                    denied |= decided.is_denied();
                    *decision = Some(decided);
                }
            }
            let rest: Vec<Request<'_>> = requests
                .iter()
                .filter(|r| !Self::regional(r))
                .map(|r| r.with_cost(if denied { 0 } else { r.cost() }))
                .collect();
            if !rest.is_empty() {
                let mut answered = self.shared.home.decide_all(&rest).await?.into_iter();
                for (request, decision) in requests.iter().zip(&mut decisions) {
                    if !Self::regional(request) {
                        *decision = answered.next();
                    }
                }
            }
            decisions
                .into_iter()
                .collect::<Option<Vec<_>>>()
                .ok_or(Error::InvalidRequest(
                    "the store answered fewer decisions than requests",
                ))
        }
        .await;
        // Denied or failed: the batch charged nothing.
        if !matches!(&result, Ok(decisions) if decisions.iter().all(Decision::is_allowed)) {
            self.unspend(&spent).await;
        }
        result
    }
}

impl<H: LeaseStore + 'static> RegionStore<H> {
    /// Whether `request` is decided in the region (see the module documentation, "What is
    /// decided where").
    fn regional(request: &Request<'_>) -> bool {
        let limit = request.limit();
        request.cost() <= limit.capacity() && limit.check_lease().is_ok()
    }

    /// One settle (see the module documentation, "Settling"), answered by the pool's peek
    /// after it, or home's answer to the part of a report it got. If home fails, the units the
    /// pool paid go back into it: the report charged nothing.
    async fn settle(&self, settle: &Settle<'_>) -> Result<Decision, Error> {
        let (request, cost) = (settle.request(), settle.request().cost());
        let pool = Pool::of(request);
        let (back, want, min) = match settle.is_report() {
            true => (0, cost.min(request.limit().capacity()), 1),
            false => (cost, 0, 0),
        };
        let action = PoolAction::Spend { back, want, min };
        let step = self.step(pool, action).await?;
        if step.units > 0 {
            self.shared.seen.note(pool.policy, pool.key, *pool.limit);
        }
        let answer = match cost - step.granted {
            rest if settle.is_report() && rest > 0 => {
                let report = Settle::Report(request.with_cost(rest));
                self.shared.home.settle(report).await
            }
            _ => {
                let granted = step.units.min(1);
                Ok(self.decision(request.limit(), 1, &Step { granted, ..step }))
            }
        };
        if answer.is_err() && step.granted > 0 {
            let (back, want, min) = (step.granted, 0, 0);
            let _ = self.step(pool, PoolAction::Spend { back, want, min }).await;
        }
        // Awaited: a report's refill tells the pool what home has left (debt: none until then).
        if let Some(refill) = self.start_refill(pool, &step) {
            let _ = refill.await;
        }
        answer
    }

    /// Puts the units a denied or failed batch spent from pools back into them. A give-back
    /// that fails leaves them spent: an under-admission, never more than the limit.
    async fn unspend(&self, spent: &[&Request<'_>]) {
        for request in spent {
            let _ = self.spend(request, request.cost(), 0, 0).await;
        }
    }
}

/// Instances may lease from their region's pool (`Leased<RegionStore<_>>`): an exchange gives
/// back units to the pool and takes up to `want` of those it holds, as one step.
/// A pool found empty while home has units (a refill pending) answers `retry_after` 1 ms, not
/// the limit's refill time (an hour on a capped limit), since a lease does not ask again before
/// `retry_after` and would miss the units the refill brings.
#[async_trait]
impl<H: LeaseStore + 'static> LeaseStore for RegionStore<H> {
    async fn exchange(
        &self,
        request: &Request<'_>,
        give_back: u64,
        want: u64,
    ) -> Result<Grant, Error> {
        request.limit().check_lease()?;
        let want = want.min(request.limit().capacity());
        let step = self.spend(request, give_back, want, 1).await?;
        let mut decision = self.decision(request.limit(), step.granted.max(1), &step);
        if step.granted == 0 && step.denied_until <= step.now && !step.failing {
            // Home has units (a refill is on its way, or the next step claims one): see the doc.
            let retry = decision.retry_after_us().min(PENDING_REFILL_RETRY_US);
            let (limit, remaining) = (decision.limit(), decision.remaining());
            decision =
                Decision::from_micros(false, limit, remaining, decision.reset_after_us(), retry);
        }
        Ok(Grant {
            granted: step.granted,
            decision,
        })
    }
}
