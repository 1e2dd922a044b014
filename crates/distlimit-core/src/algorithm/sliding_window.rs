//! The sliding window counter: two aligned windows, the previous one weighted.

use super::Model;
use crate::Quota;

/// Sliding window counter state: the current aligned window's start, the previous window's
/// count and the current window's count.
///
/// At `elapsed` µs into the current window, a request of `cost` passes when
/// `prev × (period − elapsed) + (current + cost) × period ≤ limit × period`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlidingWindow {
    /// Start of the window `current` belongs to (µs since the epoch).
    pub start_us: u64,
    /// Units admitted in the window before it.
    pub previous: u64,
    /// Units admitted in the window starting at `start_us`.
    pub current: u64,
}

impl SlidingWindow {
    /// `(window start, previous, current)` as seen at `now`.
    fn at(&self, q: &Quota, now: u64) -> (u64, u64, u64) {
        let period = q.period_us();
        let start = now - now % period;
        if start <= self.start_us {
            (self.start_us, self.previous, self.current)
        } else if start - self.start_us == period {
            (start, self.current, 0)
        } else {
            (start, 0, 0)
        }
    }
}

impl Model for SlidingWindow {
    fn available(&self, q: &Quota, now: u64) -> u64 {
        let period = q.period_us();
        let (start, prev, cur) = self.at(q, now);
        let weight = period - now.saturating_sub(start).min(period);
        let budget = (q.limit() * period).saturating_sub(prev.saturating_mul(weight)) / period;
        budget.saturating_sub(cur)
    }

    fn retry_after(&self, q: &Quota, now: u64, want: u64) -> u64 {
        let period = q.period_us();
        let limit = q.limit();
        let (start, prev, cur) = self.at(q, now);
        // Later in the current window, as the previous window's weight shrinks. Measured from
        // `start`, not from `now`: before `start` (the clock went back) the weight does not shrink.
        if prev > 0 && cur.saturating_add(want) <= limit {
            let slack = (limit - cur - want) * period / prev;
            if slack >= 1 {
                let at = period.saturating_sub(slack);
                return start.saturating_add(at).saturating_sub(now);
            }
        }
        // In the next window, where `cur` becomes the weighted previous count.
        let to_next = start.saturating_add(period).saturating_sub(now);
        if cur == 0 {
            return to_next;
        }
        let slack = (limit - want) * period / cur.min(limit);
        if slack >= 1 {
            to_next.saturating_add(period.saturating_sub(slack))
        } else {
            // Only the window after the next one admits it.
            to_next.saturating_add(period)
        }
    }

    fn reset_after(&self, q: &Quota, now: u64, extra: u64) -> u64 {
        let period = q.period_us();
        let (start, prev, cur) = self.at(q, now);
        let end = if cur.saturating_add(extra) > 0 {
            start.saturating_add(2 * period)
        } else if prev > 0 {
            start.saturating_add(period)
        } else {
            return 0;
        };
        end.saturating_sub(now)
    }

    fn consume(&mut self, q: &Quota, now: u64, cost: u64) {
        let (start, prev, cur) = self.at(q, now);
        *self = SlidingWindow {
            start_us: start,
            previous: prev,
            current: cur.saturating_add(cost),
        };
    }

    fn expires_at(&self, q: &Quota) -> u64 {
        let period = q.period_us();
        if self.current > 0 {
            self.start_us.saturating_add(2 * period)
        } else if self.previous > 0 {
            self.start_us.saturating_add(period)
        } else {
            0
        }
    }
}
