//! The token bucket, exact in integers.

use super::{Model, div_ceil};
use crate::Quota;

/// Token bucket state, stored as a *deficit*: how far the bucket is below full.
///
/// With `g = gcd(limit, period_us)`, `L' = limit / g` and `P' = period_us / g` (see
/// [`Quota::refill_units`]), units are `1 / P'` of a token: refilling `elapsed` µs adds exactly
/// `elapsed × L'` units (the rate `limit / period_us` tokens per µs, as `L' / P' = limit /
/// period_us`), and a bucket holds `burst × P' ≤ 2^52` units. A round quota counts in small units:
/// `Quota::per_day(1_000_000)` has `P' = 86 400`, `L' = 1`.
///
/// The all-zero state is a full bucket, whatever the quota. Units depend on the quota (see
/// [`State::carried`](crate::State::carried)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    /// Units (`1 / P'` of a token) missing from a full bucket at `last_us`.
    pub deficit: u64,
    /// When the deficit was last updated (µs since the epoch).
    pub last_us: u64,
}

impl TokenBucket {
    /// The deficit at `now`: the stored one minus what refilled since `last_us`.
    #[inline]
    pub(crate) fn deficit_at(&self, q: &Quota, now: u64) -> u64 {
        let (rate, _) = q.refill_units();
        let elapsed = now.saturating_sub(self.last_us);
        // `elapsed × L'` saturates at u64::MAX, which empties any deficit: the same answer as the
        // Lua scripts' overflow-free form `elapsed ≥ ⌈deficit / L'⌉ ? 0 : deficit − elapsed × L'`,
        // without a division on the hot path.
        self.deficit.saturating_sub(elapsed.saturating_mul(rate))
    }

    /// This state, written under `from`, as a state of `to` that has spent at `now` the whole
    /// tokens it had spent under `from` (refilled at `from`'s rate until `now`), capped at `to`'s
    /// burst; it refills at `to`'s rate from `now` on.
    pub(crate) fn carried(&self, from: &Quota, to: &Quota, now: u64) -> Self {
        if (from.burst(), from.refill_units()) == (to.burst(), to.refill_units()) {
            return *self;
        }
        let spent = div_ceil(self.deficit_at(from, now), from.refill_units().1);
        TokenBucket {
            deficit: spent.min(to.burst()).saturating_mul(to.refill_units().1),
            last_us: self.last_us.max(now),
        }
    }
}

/// `burst × P'`: the units of a full bucket (at most 2^52 for a valid quota).
fn capacity_units(q: &Quota) -> u64 {
    q.burst().saturating_mul(q.refill_units().1)
}

impl Model for TokenBucket {
    #[inline]
    fn available(&self, q: &Quota, now: u64) -> u64 {
        let (_, token) = q.refill_units();
        capacity_units(q).saturating_sub(self.deficit_at(q, now)) / token
    }

    #[inline]
    fn retry_after(&self, q: &Quota, now: u64, want: u64) -> u64 {
        let (rate, token) = q.refill_units();
        let allowed_deficit = q.burst().saturating_sub(want).saturating_mul(token);
        let refill = div_ceil(
            self.deficit_at(q, now).saturating_sub(allowed_deficit),
            rate,
        );
        // Nothing refills before `last_us` (the clock went back): wait until then first.
        self.last_us.saturating_sub(now).saturating_add(refill)
    }

    #[inline]
    fn reset_after(&self, q: &Quota, now: u64, extra: u64) -> u64 {
        let (rate, token) = q.refill_units();
        let refill = div_ceil(
            self.deficit_at(q, now)
                .saturating_add(extra.saturating_mul(token)),
            rate,
        );
        if refill == 0 {
            0
        } else {
            // As in `retry_after`: the refill starts at `last_us` at the earliest.
            self.last_us.saturating_sub(now).saturating_add(refill)
        }
    }

    #[inline]
    fn consume(&mut self, q: &Quota, now: u64, cost: u64) {
        let (_, token) = q.refill_units();
        self.deficit = self
            .deficit_at(q, now)
            .saturating_add(cost.saturating_mul(token));
        self.last_us = self.last_us.max(now);
    }

    fn expires_at(&self, q: &Quota) -> u64 {
        let (rate, _) = q.refill_units();
        self.last_us.saturating_add(div_ceil(self.deficit, rate))
    }
}
