//! The generic cell rate algorithm.

use super::{Model, div_ceil};
use crate::{Decision, Quota};

/// GCRA state: the theoretical arrival time (TAT) of the next unit, in µs since the epoch.
///
/// With the emission interval `T = ⌈period / limit⌉` µs, a key is `⌈(tat − now) / T⌉` units in
/// debt; a request of `cost` passes when the debt plus `cost` stays within `burst`. The zero state
/// is a key with no debt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Gcra {
    /// The theoretical arrival time.
    pub tat_us: u64,
}

impl Gcra {
    /// [`Limit::decide`](crate::Limit::decide) of `cost` units under a GCRA limit of `quota`, on
    /// this state directly: for stores that keep GCRA states apart from a [`State`](crate::State).
    ///
    /// ```
    /// use distlimit_core::algorithm::Gcra;
    /// use distlimit_core::Quota;
    ///
    /// # fn main() -> Result<(), distlimit_core::QuotaError> {
    /// let quota = Quota::per_second(1)?;
    /// let mut state = Gcra::default();
    /// assert!(state.decide(&quota, 0, 1).is_allowed());
    /// assert!(state.decide(&quota, 0, 1).is_denied());
    /// # Ok(()) }
    /// ```
    #[inline(always)]
    pub fn decide(&mut self, quota: &Quota, now_us: u64, cost: u64) -> Decision {
        super::decide(self, quota, quota.burst(), now_us, cost)
    }

    /// This state, written under `from`, as a state of `to` that has spent at `now` the whole
    /// units it had spent under `from`, capped at `to`'s burst (see
    /// [`State::carried`](crate::State::carried)): for stores that keep GCRA states apart.
    pub fn carried(&self, from: &Quota, to: &Quota, now: u64) -> Self {
        if (from.burst(), from.emission_interval_us()) == (to.burst(), to.emission_interval_us()) {
            return *self;
        }
        let spent = div_ceil(self.tat_us.saturating_sub(now), from.emission_interval_us());
        match spent.min(to.burst()) {
            0 => *self,
            units => Gcra {
                tat_us: now.saturating_add(units.saturating_mul(to.emission_interval_us())),
            },
        }
    }
}

impl Model for Gcra {
    #[inline]
    fn available(&self, q: &Quota, now: u64) -> u64 {
        match self.tat_us.saturating_sub(now) {
            // An idle key: no division on the most common path.
            0 => q.burst(),
            debt => q
                .burst()
                .saturating_sub(div_ceil(debt, q.emission_interval_us())),
        }
    }

    #[inline]
    fn retry_after(&self, q: &Quota, now: u64, want: u64) -> u64 {
        let debt = self.tat_us.saturating_sub(now);
        debt.saturating_sub((q.burst() - want) * q.emission_interval_us())
    }

    #[inline]
    fn reset_after(&self, q: &Quota, now: u64, extra: u64) -> u64 {
        self.tat_us
            .saturating_sub(now)
            .saturating_add(extra.saturating_mul(q.emission_interval_us()))
    }

    #[inline]
    fn consume(&mut self, q: &Quota, now: u64, cost: u64) {
        self.tat_us = self
            .tat_us
            .max(now)
            .saturating_add(cost.saturating_mul(q.emission_interval_us()));
    }

    fn expires_at(&self, _q: &Quota) -> u64 {
        self.tat_us
    }
}
