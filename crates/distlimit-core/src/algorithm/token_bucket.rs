//! The token bucket, exact in integers.

use super::{Model, div_ceil};
use crate::Quota;

/// Token bucket state, stored as a *deficit*: how far the bucket is below full.
///
/// Units are `1 / period_us` of a token, so refilling `elapsed` µs adds exactly
/// `elapsed × limit` units and a bucket holds `burst × period_us` units. The all-zero state is a
/// full bucket, whatever the quota, so a changed quota never hands out a fresh bucket: the deficit
/// carries over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    /// Units missing from a full bucket at `last_us`.
    pub deficit: u64,
    /// When the deficit was last updated (µs since the epoch).
    pub last_us: u64,
}

impl TokenBucket {
    /// The deficit at `now`: the stored one minus what refilled since `last_us`.
    fn deficit_at(&self, q: &Quota, now: u64) -> u64 {
        let elapsed = now.saturating_sub(self.last_us);
        // Compare first so that elapsed × limit cannot overflow (nor leave 2^53 in Lua).
        if elapsed >= div_ceil(self.deficit, q.limit()) {
            0
        } else {
            self.deficit
                .saturating_sub(elapsed.saturating_mul(q.limit()))
        }
    }
}

impl Model for TokenBucket {
    fn available(&self, q: &Quota, now: u64) -> u64 {
        let capacity = q.burst() * q.period_us();
        capacity.saturating_sub(self.deficit_at(q, now)) / q.period_us()
    }

    fn retry_after(&self, q: &Quota, now: u64, want: u64) -> u64 {
        let allowed_deficit = (q.burst() - want) * q.period_us();
        let refill = div_ceil(
            self.deficit_at(q, now).saturating_sub(allowed_deficit),
            q.limit(),
        );
        // Nothing refills before `last_us` (the clock went back): wait until then first.
        self.last_us.saturating_sub(now).saturating_add(refill)
    }

    fn reset_after(&self, q: &Quota, now: u64, extra: u64) -> u64 {
        let refill = div_ceil(
            self.deficit_at(q, now)
                .saturating_add(extra.saturating_mul(q.period_us())),
            q.limit(),
        );
        if refill == 0 {
            0
        } else {
            // As in `retry_after`: the refill starts at `last_us` at the earliest.
            self.last_us.saturating_sub(now).saturating_add(refill)
        }
    }

    fn consume(&mut self, q: &Quota, now: u64, cost: u64) {
        self.deficit = self
            .deficit_at(q, now)
            .saturating_add(cost.saturating_mul(q.period_us()));
        self.last_us = self.last_us.max(now);
    }

    fn expires_at(&self, q: &Quota) -> u64 {
        self.last_us
            .saturating_add(div_ceil(self.deficit, q.limit()))
    }
}
