//! The reference model of leases ([`Limit::take`], [`Limit::give_back`]) for the token bucket
//! and GCRA.

use super::{Algorithm, Gcra, Limit, State, TokenBucket};
use crate::Quota;
use crate::lease::{Grant, LeaseUnsupported};

impl Limit {
    /// Whether this limit's algorithm can lease: the token bucket and GCRA.
    pub fn check_lease(&self) -> Result<(), LeaseUnsupported> {
        self.check_debt().map_err(|e| LeaseUnsupported(e.0))
    }

    /// Withdraws up to `want` of the units available at `now_us`, atomically: the units
    /// granted are charged to `state` as one admitted request of that cost would be. Grants 0
    /// (and changes nothing) when nothing is available, or for `want = 0`.
    ///
    /// ```
    /// use distlimit_core::{Limit, Quota, State};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limit = Limit::gcra(Quota::per_second(10)?);
    /// let mut state = State::fresh(limit.algorithm());
    /// assert_eq!(limit.take(&mut state, 0, 4)?.granted, 4);
    /// assert_eq!(limit.take(&mut state, 0, 100)?.granted, 6);
    /// let none = limit.take(&mut state, 0, 1)?;
    /// assert_eq!(none.granted, 0);
    /// assert_eq!(none.decision.retry_after().as_millis(), 100);
    /// limit.give_back(&mut state, 0, 3)?;
    /// assert_eq!(limit.take(&mut state, 0, 100)?.granted, 3);
    /// # Ok(()) }
    /// ```
    pub fn take(
        &self,
        state: &mut State,
        now_us: u64,
        want: u64,
    ) -> Result<Grant, LeaseUnsupported> {
        self.take_from(state, &mut None, now_us, want)
    }

    /// Returns `units` unspent units to `state` at `now_us`: the inverse of consuming them. The
    /// token bucket gets the tokens back, capped at its burst; GCRA moves its arrival time back
    /// by `units × T`, never before `now_us`. A state of another algorithm (a fresh key) is
    /// left as it is. More than the capacity counts as the capacity (no key can owe more).
    pub fn give_back(
        &self,
        state: &mut State,
        now_us: u64,
        units: u64,
    ) -> Result<(), LeaseUnsupported> {
        self.check_lease()?;
        let units = units.min(self.capacity());
        match state {
            State::TokenBucket(s) if self.algorithm == Algorithm::TokenBucket => {
                s.give_back(&self.quota, now_us, units)
            }
            State::Gcra(s) if self.algorithm == Algorithm::Gcra => {
                s.give_back(&self.quota, now_us, units)
            }
            _ => {}
        }
        Ok(())
    }

    /// [`take`](Self::take) on a state written under the quota `written`, as
    /// [`decide_from`](Self::decide_from): a state written under another quota is carried over
    /// when units are granted.
    pub fn take_from(
        &self,
        state: &mut State,
        written: &mut Option<Quota>,
        now_us: u64,
        want: u64,
    ) -> Result<Grant, LeaseUnsupported> {
        self.check_lease()?;
        let peek = self.evaluate_from(Some(state), written.as_ref(), now_us, 0);
        let granted = want.min(peek.remaining());
        let decision = match granted {
            0 => peek,
            _ => self.decide_from(state, written, now_us, granted),
        };
        Ok(Grant { granted, decision })
    }

    /// [`give_back`](Self::give_back) on a state written under the quota `written`: the units
    /// go back under that quota, the one they were taken under, and the state stays written
    /// under it (the next decision carries it over). Carrying over first would be wrong when the
    /// limit was lowered: the carry-over caps what was spent at the new capacity, units still
    /// held included, and giving them back after it would return units the cap already dropped.
    pub fn give_back_from(
        &self,
        state: &mut State,
        written: &mut Option<Quota>,
        now_us: u64,
        units: u64,
    ) -> Result<(), LeaseUnsupported> {
        self.check_lease()?;
        if units == 0 || state.algorithm() != self.algorithm {
            return Ok(());
        }
        let quota = written.unwrap_or(self.quota);
        Limit::new(self.algorithm, quota).give_back(state, now_us, units)
    }
}

impl TokenBucket {
    /// Adds `units` tokens back at `now`, capped at a full bucket (see [`Limit::give_back`]).
    pub fn give_back(&mut self, q: &Quota, now: u64, units: u64) {
        let (_, token) = q.refill_units();
        self.deficit = self
            .deficit_at(q, now)
            .saturating_sub(units.saturating_mul(token));
        self.last_us = self.last_us.max(now);
    }
}

impl Gcra {
    /// Moves the arrival time back by `units × T`, never before `now` (see
    /// [`Limit::give_back`]).
    pub fn give_back(&mut self, q: &Quota, now: u64, units: u64) {
        if self.tat_us > now {
            let back = units.saturating_mul(q.emission_interval_us());
            self.tat_us = self.tat_us.saturating_sub(back).max(now);
        }
    }
}
