//! The reference model of forced charges ([`Limit::force`]; see the [module](super) docs).
//! Past [`MAX_DEFICIT`] and [`MAX_TAT`] a forced charge saturates: for the largest quotas that
//! is tens of thousands of periods of debt, for common ones far more than any key can report.
//! The window algorithms refuse it: a count per window cannot carry what exceeds the window
//! into the next one exactly.

use super::{Algorithm, Gcra, Limit, State, TokenBucket};
use crate::{Decision, Quota};

/// The largest deficit a forced charge leaves in a token bucket: `3 × 2^51` units of `1 / P'`
/// token, above a full bucket (`burst × P' ≤ 2^52`), so every bucket can hold some debt.
pub const MAX_DEFICIT: u64 = 3 << 51;

/// The latest theoretical arrival time a forced charge leaves in a GCRA state: `2^53 − 1` µs.
pub const MAX_TAT: u64 = (1 << 53) - 1;

/// The largest cost a forced charge or a give-back may carry: 2^52 (larger ones are an
/// invalid request, never rounded).
pub const MAX_REPORT: u64 = 1 << 52;

/// Forced charges (debt) need the token bucket or GCRA; the window algorithms answer this error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("reports and give-backs need the token bucket or GCRA, not {0}")]
pub struct DebtUnsupported(pub Algorithm);

impl From<DebtUnsupported> for crate::Error {
    fn from(_: DebtUnsupported) -> Self {
        crate::Error::InvalidRequest("reports and give-backs need the token bucket or GCRA")
    }
}

impl Limit {
    /// Whether this limit's algorithm can carry debt: the token bucket and GCRA.
    pub fn check_debt(&self) -> Result<(), DebtUnsupported> {
        match self.algorithm {
            Algorithm::TokenBucket | Algorithm::Gcra => Ok(()),
            other => Err(DebtUnsupported(other)),
        }
    }

    /// Charges `cost` units to `state` at `now_us` whatever is left: a *forced* charge (usage
    /// reported after the fact). What exceeds the units available becomes debt, up to
    /// [`MAX_DEFICIT`] or [`MAX_TAT`]. A state of another algorithm counts as fresh.
    ///
    /// Answers what a peek (cost 0) answers right after the charge: allowed when one unit is
    /// still available, else denied with the exact `retry_after` until one is (the debt paid and
    /// one unit refilled).
    ///
    /// ```
    /// use distlimit_core::{Limit, Quota, State};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limit = Limit::token_bucket(Quota::per_second(10)?);
    /// let mut state = State::fresh(limit.algorithm());
    /// // 25 units used where 10 were available: 15 of debt, then one unit to refill.
    /// let after = limit.force(&mut state, 0, 25)?;
    /// assert!(after.is_denied());
    /// assert_eq!(after.retry_after().as_millis(), 1_600);
    /// assert!(limit.decide(&mut state, 1_599_999, 1).is_denied());
    /// assert!(limit.decide(&mut state, 1_600_000, 1).is_allowed());
    /// # Ok(()) }
    /// ```
    pub fn force(
        &self,
        state: &mut State,
        now_us: u64,
        cost: u64,
    ) -> Result<Decision, DebtUnsupported> {
        self.force_from(state, &mut None, now_us, cost)
    }

    /// [`force`](Self::force) on a state written under the quota `written`, as
    /// [`decide_from`](Self::decide_from): a state written under another quota is carried over
    /// first (what it had spent, capped at the new capacity: debt does not survive a quota
    /// change), and `written` becomes this limit's quota.
    pub fn force_from(
        &self,
        state: &mut State,
        written: &mut Option<Quota>,
        now_us: u64,
        cost: u64,
    ) -> Result<Decision, DebtUnsupported> {
        self.check_debt()?;
        if let Some(from) = written
            && state.algorithm() == self.algorithm
            && *from != self.quota
        {
            *state = state.carried(from, &self.quota, now_us);
        }
        if state.algorithm() != self.algorithm {
            *state = State::fresh(self.algorithm);
        }
        match state {
            State::TokenBucket(s) => s.force(&self.quota, now_us, cost),
            State::Gcra(s) => s.force(&self.quota, now_us, cost),
            _ => {}
        }
        *written = Some(self.quota);
        Ok(self.evaluate(Some(state), now_us, 0))
    }
}

impl TokenBucket {
    /// Adds `cost` tokens to the deficit at `now`, past a full bucket if need be, up to
    /// [`MAX_DEFICIT`] (see [`Limit::force`]).
    pub fn force(&mut self, q: &Quota, now: u64, cost: u64) {
        let (_, token) = q.refill_units();
        self.deficit = self
            .deficit_at(q, now)
            .saturating_add(cost.saturating_mul(token))
            .min(MAX_DEFICIT);
        self.last_us = self.last_us.max(now);
    }
}

impl Gcra {
    /// Moves the arrival time `cost × T` after `max(tat, now)`, past `now + burst × T` if need
    /// be, up to [`MAX_TAT`] (see [`Limit::force`]).
    pub fn force(&mut self, q: &Quota, now: u64, cost: u64) {
        self.tat_us = self
            .tat_us
            .max(now)
            .saturating_add(cost.saturating_mul(q.emission_interval_us()))
            .min(MAX_TAT);
    }
}
