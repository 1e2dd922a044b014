//! The rate-limiting algorithms as data ([`Algorithm`], [`Limit`], [`State`]) with a pure
//! reference implementation each.
//!
//! Every algorithm works on integer microseconds and integer units, so the arithmetic is exact:
//! no floating point, no rounding drift, and for a valid [`Quota`] (see its bounds) and times
//! below 2^52 µs (the year 2112) every intermediate value stays below 2^53, so the Lua scripts of
//! the Redis driver compute the very same numbers. The functions here never panic, whatever state,
//! time or cost they are given.
//!
//! | algorithm | state | capacity | admitted cost in any interval of length `d` |
//! |---|---|---|---|
//! | [`TokenBucket`](Algorithm::TokenBucket) | 16 B | `burst` | ≤ `burst + ⌊d × limit / period⌋` |
//! | [`Gcra`](Algorithm::Gcra) | 8 B | `burst` | ≤ `burst + ⌊d / T⌋`, `T = ⌈period / limit⌉` µs |
//! | [`FixedWindow`](Algorithm::FixedWindow) | 16 B | `limit` | ≤ `limit` per aligned window, so ≤ `2 × limit` when `d ≤ period` |
//! | [`SlidingLog`](Algorithm::SlidingLog) | ≤ `limit` entries | `limit` | ≤ `limit` when `d ≤ period` (exact) |
//! | [`SlidingWindow`](Algorithm::SlidingWindow) | 24 B | `limit` | ≤ `limit` per aligned window, ≤ `2 × limit` when `d ≤ period` |
//!
//! The largest intermediate values, for `limit ≤ 2^32`, `period ≤ 2^50` µs and
//! `burst × P' ≤ 2^52` with `g = gcd(limit, period)`, `L' = limit / g`, `P' = period / g`:
//!
//! * token bucket: the deficit, at most `burst × P' ≤ 2^52` units of `1 / P'` token; a refill
//!   `elapsed × L'` is only computed below `deficit + L'`; `last + ⌈deficit / L'⌉ < 2^53`;
//! * GCRA: an admission leaves a debt `tat − now` of at most
//!   `burst × ⌈period / limit⌉ ≤ burst × P' ≤ 2^52` µs, so `tat < 2^53`;
//! * fixed window and sliding log: counts and sums of live costs are at most `limit ≤ 2^32`,
//!   instants at most `now + period`;
//! * sliding window counter: `limit × steps ≤ 2^32 × 2^20 = 2^52`, and window ends
//!   `start + 2 × period < 2^52 + 2^51`.
//!
//! Common rules, checked by property tests for every algorithm:
//! * A request whose cost exceeds the capacity is denied with `retry_after` = [`NEVER`](crate::NEVER)
//!   and changes nothing.
//! * A denied request changes nothing; it is never charged.
//! * Cost 0 is a *peek*: it changes nothing and reports whether one unit would pass now.
//! * `retry_after` is exact: at `now + retry_after` the same request passes if nothing else was
//!   consumed, one microsecond earlier it does not.
//! * Splitting equal-time requests differently (`3` vs `1 + 2` at the same instant) ends in the
//!   same state.
//! * Time going backwards refills nothing.
//!
//! The token bucket and GCRA also take *forced* charges ([`Limit::force`]: usage reported
//! after the fact, charged past the limit as debt that later requests wait out) and give-backs
//! ([`Limit::give_back`]); the window algorithms refuse both ([`DebtUnsupported`]). A forced
//! charge may take the token bucket's deficit beyond `burst × P'` and GCRA's arrival time beyond
//! `now + burst × T`, up to [`MAX_DEFICIT`] and [`MAX_TAT`] (below 2^53, so the scripts stay
//! exact): see the `debt` rules on [`Limit::force`].
//!
//! A state's numbers are counted in units of the quota it was written under (GCRA's `T`, the
//! token bucket's `1 / P'`, the windows' period). Read under another quota, it is carried over
//! ([`State::carried`], [`Limit::decide_from`]): what the key had spent under the old quota, in
//! whole units rounded up, it has spent under the new one, capped at the new capacity, so a
//! raised limit frees a denied key at once and a lowered one never hands out a fresh bucket.
//! Stores record the quota (or the parameters that matter) next to each state.

mod debt;
mod divisor;
mod fixed_window;
mod gcra;
mod lease;
mod sliding_log;
mod sliding_window;
mod token_bucket;

use std::fmt;
use std::str::FromStr;

pub use debt::{DebtUnsupported, MAX_DEFICIT, MAX_REPORT, MAX_TAT};
pub use divisor::{Divisor, QuotaDivisors};
pub use fixed_window::FixedWindow;
pub use gcra::Gcra;
pub use sliding_log::SlidingLog;
pub use sliding_window::SlidingWindow;
pub use token_bucket::TokenBucket;

use crate::{Decision, Quota};

/// `⌈a / b⌉` for `b > 0`.
#[inline]
pub(crate) fn div_ceil(a: u64, b: u64) -> u64 {
    // Round quotas often divide by 1 (a token bucket refilling one unit per µs of its reduced
    // period): skip the hardware division, which costs more than the rest of the arithmetic.
    if b <= 1 { a } else { a.div_ceil(b) }
}

/// Which algorithm counts a key's consumption.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// A bucket of `burst` tokens refilled continuously at `limit / period`, exactly: tokens are
    /// counted in units of `1 / P'` token with `P' = period / gcd(limit, period)` (in µs), so no
    /// refill is lost to rounding (see [`Quota::refill_units`]).
    ///
    /// `Quota::per_minute(60)?.with_burst(10)?`: 10 requests at once, then one per second.
    #[default]
    TokenBucket,
    /// The generic cell rate algorithm: one timestamp per key (the theoretical arrival time).
    /// Admits like a token bucket of `burst` refilled one unit every `T = ⌈period / limit⌉` µs;
    /// the emission interval `T` is rounded *up* to a whole microsecond, so it never admits more
    /// than the quota (`per_second(3)` admits one every 333 334 µs).
    Gcra,
    /// Counts per window of `period`, windows aligned to multiples of `period` since the Unix
    /// epoch (a one-minute window starts at every whole minute, for every key at once). Admits
    /// `limit` per window, so up to `2 × limit` across a window boundary.
    FixedWindow,
    /// Keeps one entry per admitted instant and admits when the cost in the last `period`
    /// (the half-open interval `(now − period, now]`) stays within `limit`. Exact, but stores up
    /// to `limit` entries per key: for small limits.
    SlidingLog,
    /// The sliding window counter ([`SlidingWindow`]): the count of the previous aligned window,
    /// weighted by how much of it still overlaps the sliding window, plus the current count,
    /// exactly in integers. An approximation of the sliding log in 24 bytes.
    SlidingWindow,
}

impl Algorithm {
    /// Every algorithm, for tests and documentation.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
    ];

    /// The algorithm's name as used in configuration: `token_bucket`, `gcra`, `fixed_window`,
    /// `sliding_log`, `sliding_window`.
    #[inline]
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown algorithm name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown algorithm {0:?}: expected token_bucket, gcra, fixed_window, sliding_log or sliding_window"
)]
pub struct UnknownAlgorithm(pub String);

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownAlgorithm(s.to_owned()))
    }
}

/// A quota enforced by an algorithm: what one key is limited to.
///
/// ```
/// use distlimit_core::{Limit, ManualClock, Quota, State};
///
/// # fn main() -> Result<(), distlimit_core::QuotaError> {
/// let limit = Limit::gcra(Quota::per_second(2)?);
/// let mut state = State::fresh(limit.algorithm());
/// assert!(limit.decide(&mut state, 0, 1).is_allowed());
/// assert!(limit.decide(&mut state, 0, 1).is_allowed());
/// let denied = limit.decide(&mut state, 0, 1);
/// assert!(denied.is_denied());
/// assert_eq!(denied.retry_after().as_micros(), 500_000);
/// assert!(limit.decide(&mut state, 500_000, 1).is_allowed());
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    algorithm: Algorithm,
    quota: Quota,
}

impl Limit {
    /// `quota` enforced by `algorithm`.
    pub fn new(algorithm: Algorithm, quota: Quota) -> Self {
        Self { algorithm, quota }
    }

    /// `quota` as a token bucket.
    #[inline]
    pub fn token_bucket(quota: Quota) -> Self {
        Self::new(Algorithm::TokenBucket, quota)
    }

    /// `quota` by GCRA.
    #[inline]
    pub fn gcra(quota: Quota) -> Self {
        Self::new(Algorithm::Gcra, quota)
    }

    /// `quota` per fixed window.
    #[inline]
    pub fn fixed_window(quota: Quota) -> Self {
        Self::new(Algorithm::FixedWindow, quota)
    }

    /// `quota` by sliding log.
    #[inline]
    pub fn sliding_log(quota: Quota) -> Self {
        Self::new(Algorithm::SlidingLog, quota)
    }

    /// `quota` by sliding window counter.
    #[inline]
    pub fn sliding_window(quota: Quota) -> Self {
        Self::new(Algorithm::SlidingWindow, quota)
    }

    /// The algorithm.
    #[inline]
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The quota.
    #[inline]
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The most units one request may cost: `burst` for the token bucket and GCRA, `limit` for
    /// the window algorithms.
    #[inline]
    pub fn capacity(&self) -> u64 {
        match self.algorithm {
            Algorithm::TokenBucket | Algorithm::Gcra => self.quota.burst(),
            Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow => {
                self.quota.limit()
            }
        }
    }

    /// Decides a request of `cost` units at `now_us` against `state`, charging it when admitted.
    ///
    /// The state is changed only when the request is admitted with a cost above zero. A state of
    /// another algorithm counts as a fresh key, and is replaced by this algorithm's state when
    /// such a request is admitted (peeks and denials leave it as it was).
    #[inline(always)]
    pub fn decide(&self, state: &mut State, now_us: u64, cost: u64) -> Decision {
        let decision = self.evaluate(Some(state), now_us, cost);
        if decision.is_allowed() && cost > 0 {
            if state.algorithm() != self.algorithm {
                *state = State::fresh(self.algorithm);
            }
            state.consume(&self.quota, now_us, cost);
        }
        decision
    }

    /// [`decide`](Self::decide) on a state written under the quota `written` (`None`: unknown,
    /// read as written under this limit's quota), keeping `written` up to date: it becomes this
    /// limit's quota whenever the state is rewritten.
    ///
    /// A state of this algorithm written under another quota is first
    /// [carried over](State::carried) at `now_us`. A request with a cost keeps the carried state
    /// even when it is denied (it charges nothing, it re-expresses the state under this quota),
    /// so the conversion happens once, at the first such request under the new quota, and the
    /// state refills at the new rate from then on. A peek (cost 0) and a cost above the capacity
    /// change nothing.
    ///
    /// ```
    /// use distlimit_core::{Limit, Quota, State};
    ///
    /// # fn main() -> Result<(), distlimit_core::QuotaError> {
    /// let hourly = Limit::gcra(Quota::per_hour(1)?);
    /// let (mut state, mut written) = (State::fresh(hourly.algorithm()), None);
    /// assert!(hourly.decide_from(&mut state, &mut written, 0, 1).is_allowed());
    /// assert!(hourly.decide_from(&mut state, &mut written, 1, 1).is_denied());
    /// // Raised to 60 per minute with a burst of 100: the one unit spent carries over.
    /// let raised = Limit::gcra(Quota::per_minute(60)?.with_burst(100)?);
    /// let decision = raised.decide_from(&mut state, &mut written, 2, 1);
    /// assert!(decision.is_allowed());
    /// assert_eq!(decision.remaining(), 98);
    /// # Ok(()) }
    /// ```
    pub fn decide_from(
        &self,
        state: &mut State,
        written: &mut Option<Quota>,
        now_us: u64,
        cost: u64,
    ) -> Decision {
        if let Some(from) = written
            && state.algorithm() == self.algorithm
            && *from != self.quota
        {
            let carried = state.carried(from, &self.quota, now_us);
            if cost == 0 || cost > self.capacity() {
                return self.evaluate(Some(&carried), now_us, cost);
            }
            *state = carried;
            *written = Some(self.quota);
            return self.decide(state, now_us, cost);
        }
        let decision = self.decide(state, now_us, cost);
        if decision.is_allowed() && cost > 0 {
            *written = Some(self.quota);
        }
        decision
    }

    /// What [`decide_from`](Self::decide_from) would answer, without changing anything.
    pub fn evaluate_from(
        &self,
        state: Option<&State>,
        written: Option<&Quota>,
        now_us: u64,
        cost: u64,
    ) -> Decision {
        match (state, written) {
            (Some(s), Some(from)) if s.algorithm() == self.algorithm && *from != self.quota => {
                self.evaluate(Some(&s.carried(from, &self.quota, now_us)), now_us, cost)
            }
            _ => self.evaluate(state, now_us, cost),
        }
    }

    /// What [`decide`](Self::decide) would answer, without changing anything. `None`, or a state
    /// of another algorithm, stands for a fresh key.
    #[inline(always)]
    pub fn evaluate(&self, state: Option<&State>, now_us: u64, cost: u64) -> Decision {
        let q = &self.quota;
        match state {
            Some(State::TokenBucket(s)) if self.algorithm == Algorithm::TokenBucket => {
                evaluate(s, q, self.capacity(), now_us, cost)
            }
            Some(State::Gcra(s)) if self.algorithm == Algorithm::Gcra => {
                evaluate(s, q, self.capacity(), now_us, cost)
            }
            Some(State::FixedWindow(s)) if self.algorithm == Algorithm::FixedWindow => {
                evaluate(s, q, self.capacity(), now_us, cost)
            }
            Some(State::SlidingLog(s)) if self.algorithm == Algorithm::SlidingLog => {
                evaluate(s, q, self.capacity(), now_us, cost)
            }
            Some(State::SlidingWindow(s)) if self.algorithm == Algorithm::SlidingWindow => {
                evaluate(s, q, self.capacity(), now_us, cost)
            }
            _ => self.evaluate(Some(&State::fresh(self.algorithm)), now_us, cost),
        }
    }
}

/// What one algorithm must answer about its state; the shared rules live in [`evaluate`].
pub(crate) trait Model {
    /// Units that could be spent at `now`.
    fn available(&self, q: &Quota, now: u64) -> u64;
    /// µs from `now` until `want` units are available; `want` exceeds `available` and is at most
    /// the capacity.
    fn retry_after(&self, q: &Quota, now: u64, want: u64) -> u64;
    /// µs from `now` until the state is back to full capacity, after `extra` more units were spent.
    fn reset_after(&self, q: &Quota, now: u64, extra: u64) -> u64;
    /// Charges `cost` (at most `available`) at `now`.
    fn consume(&mut self, q: &Quota, now: u64, cost: u64);
    /// The instant from which the state is equivalent to a fresh one: a store may forget it then.
    fn expires_at(&self, q: &Quota) -> u64;
}

#[inline]
fn evaluate<M: Model>(m: &M, q: &Quota, capacity: u64, now: u64, cost: u64) -> Decision {
    let available = m.available(q, now).min(capacity);
    if cost > capacity {
        return Decision::from_micros_exact(
            false,
            capacity,
            available,
            m.reset_after(q, now, 0),
            u64::MAX,
        );
    }
    let want = cost.max(1);
    if want <= available {
        let remaining = available - cost;
        Decision::from_micros_exact(true, capacity, remaining, m.reset_after(q, now, cost), 0)
    } else {
        Decision::from_micros_exact(
            false,
            capacity,
            available,
            m.reset_after(q, now, 0),
            m.retry_after(q, now, want).max(1),
        )
    }
}

/// Decides `cost` units on `m` and charges them when admitted: [`Limit::decide`] for one
/// algorithm's state.
#[inline(always)]
fn decide<M: Model>(m: &mut M, q: &Quota, capacity: u64, now: u64, cost: u64) -> Decision {
    let decision = evaluate(m, q, capacity, now, cost);
    if decision.is_allowed() && cost > 0 {
        m.consume(q, now, cost);
    }
    decision
}

/// The stored state of one key, for one algorithm.
///
/// The all-zero state of every algorithm ([`State::fresh`]) is a key never seen: a store that
/// finds no state for a key uses it, and a store may delete a state once
/// [`expires_at`](State::expires_at) has passed, without changing any decision.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum State {
    /// See [`Algorithm::TokenBucket`].
    TokenBucket(TokenBucket),
    /// See [`Algorithm::Gcra`].
    Gcra(Gcra),
    /// See [`Algorithm::FixedWindow`].
    FixedWindow(FixedWindow),
    /// See [`Algorithm::SlidingLog`].
    SlidingLog(SlidingLog),
    /// See [`Algorithm::SlidingWindow`].
    SlidingWindow(SlidingWindow),
}

impl State {
    /// The state of a key never seen.
    pub fn fresh(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::TokenBucket => State::TokenBucket(TokenBucket::default()),
            Algorithm::Gcra => State::Gcra(Gcra::default()),
            Algorithm::FixedWindow => State::FixedWindow(FixedWindow::default()),
            Algorithm::SlidingLog => State::SlidingLog(SlidingLog::default()),
            Algorithm::SlidingWindow => State::SlidingWindow(SlidingWindow::default()),
        }
    }

    /// The algorithm this state belongs to.
    #[inline]
    pub fn algorithm(&self) -> Algorithm {
        match self {
            State::TokenBucket(_) => Algorithm::TokenBucket,
            State::Gcra(_) => Algorithm::Gcra,
            State::FixedWindow(_) => Algorithm::FixedWindow,
            State::SlidingLog(_) => Algorithm::SlidingLog,
            State::SlidingWindow(_) => Algorithm::SlidingWindow,
        }
    }

    /// The instant (µs since the epoch) from which this state, under `quota`, decides exactly like
    /// a fresh one, so a store may delete it. Stores derive key TTLs from it.
    pub fn expires_at(&self, quota: &Quota) -> u64 {
        match self {
            State::TokenBucket(s) => s.expires_at(quota),
            State::Gcra(s) => s.expires_at(quota),
            State::FixedWindow(s) => s.expires_at(quota),
            State::SlidingLog(s) => s.expires_at(quota),
            State::SlidingWindow(s) => s.expires_at(quota),
        }
    }

    /// This state, written under `from`, as a state of `to` at `now`: what the key had spent
    /// under `from` (in whole units, rounded up) it has spent under `to`, capped at `to`'s
    /// capacity. Unchanged when the parameters the algorithm counts in are equal, and for the
    /// sliding log (its entries are instants, judged under `to` as they are).
    pub fn carried(&self, from: &Quota, to: &Quota, now_us: u64) -> State {
        match self {
            State::TokenBucket(s) => State::TokenBucket(s.carried(from, to, now_us)),
            State::Gcra(s) => State::Gcra(s.carried(from, to, now_us)),
            State::FixedWindow(s) => State::FixedWindow(s.carried(from, to, now_us)),
            State::SlidingLog(s) => State::SlidingLog(s.clone()),
            State::SlidingWindow(s) => State::SlidingWindow(s.carried(from, to, now_us)),
        }
    }

    #[inline]
    fn consume(&mut self, q: &Quota, now: u64, cost: u64) {
        match self {
            State::TokenBucket(s) => s.consume(q, now, cost),
            State::Gcra(s) => s.consume(q, now, cost),
            State::FixedWindow(s) => s.consume(q, now, cost),
            State::SlidingLog(s) => s.consume(q, now, cost),
            State::SlidingWindow(s) => s.consume(q, now, cost),
        }
    }
}
