//! The sliding window counter: two aligned windows, the previous one weighted.

use super::{Model, div_ceil};
use crate::Quota;

/// Sliding window counter state: the current aligned window's start, the previous window's
/// count and the current window's count.
///
/// The previous window is weighted in steps of a *granule* (see [`Quota::window_granule`]):
/// `gr = ⌈period / 2^20⌉` µs and `steps = ⌈period / gr⌉ ≤ 2^20`. At `elapsed` µs into the
/// current window (`0 ≤ elapsed < period`) the previous window weighs
/// `w = ⌈(period − elapsed) / gr⌉` steps (`w = steps` at the window start, `w ≥ 1` until its
/// end), and a request of `cost` passes when
///
/// `prev × w + (current + cost) × steps ≤ limit × steps`,
///
/// evaluated as `current + cost ≤ ⌊(limit × steps − prev × w) / steps⌋`, so that no product
/// exceeds `limit × steps ≤ 2^52`.
///
/// Windows up to 2^20 µs (about 1.05 s) have `gr = 1` and `steps = period`: the weight is
/// `(period − elapsed) / period`, per microsecond. Longer windows are weighted in steps of `gr` µs
/// (between 2^19 and 2^20 steps per window; `gr = 3 434` µs for an hour): a request may pass up
/// to about one granule earlier or later than with per-microsecond weighting, and never more
/// than `limit` per aligned window.
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
    #[inline]
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

    /// This state, written under `from`, as a state of `to`: the units `from` counts at `now`
    /// (the previous window's weighted count rounded up, plus the current count), capped at `to`'s
    /// limit, as the current count of `to`'s window that holds `now`.
    pub(crate) fn carried(&self, from: &Quota, to: &Quota, now: u64) -> Self {
        if from.period_us() == to.period_us() {
            return *self;
        }
        let period = from.period_us();
        let (gr, steps) = from.window_granule();
        let (start, prev, cur) = self.at(from, now);
        let elapsed = now.saturating_sub(start).min(period);
        let weight = div_ceil(period - elapsed, gr);
        let spent = div_ceil(prev.saturating_mul(weight), steps).saturating_add(cur);
        if spent == 0 {
            return SlidingWindow::default();
        }
        SlidingWindow {
            start_us: now - now % to.period_us(),
            previous: 0,
            current: spent.min(to.limit()),
        }
    }
}

/// The earliest `e` in `0..period` at which the weight `⌈(period − e) / gr⌉` is at most `x`,
/// for `1 ≤ x ≤ steps`: `⌈(period − e) / gr⌉ ≤ x ⇔ period − e ≤ x × gr` (as `x` is an integer),
/// so `e ≥ period − x × gr` (`x × gr < period + gr`: no overflow).
fn earliest_elapsed(period: u64, gr: u64, x: u64) -> u64 {
    period.saturating_sub(x * gr)
}

impl Model for SlidingWindow {
    #[inline]
    fn available(&self, q: &Quota, now: u64) -> u64 {
        let period = q.period_us();
        let (gr, steps) = q.window_granule();
        let (start, prev, cur) = self.at(q, now);
        // Before `start` (the clock went back) the weight is that of the window start.
        let elapsed = now.saturating_sub(start).min(period);
        let weight = div_ceil(period - elapsed, gr);
        let budget = (q.limit() * steps).saturating_sub(prev.saturating_mul(weight)) / steps;
        budget.saturating_sub(cur)
    }

    #[inline]
    fn retry_after(&self, q: &Quota, now: u64, want: u64) -> u64 {
        let period = q.period_us();
        let (gr, steps) = q.window_granule();
        let limit = q.limit();
        let (start, prev, cur) = self.at(q, now);
        // Later in the current window, as the previous window's weight shrinks: with
        // A = limit − cur − want, it passes once prev × w ≤ A × steps, i.e. w ≤ X = ⌊A × steps /
        // prev⌋. Measured from `start`, not from `now`: before `start` (the clock went back) the
        // weight does not shrink. (It is denied now, so X < steps; `min` only guards arbitrary
        // states against overflow.)
        if prev > 0 && cur.saturating_add(want) <= limit {
            let x = ((limit - cur - want) * steps / prev).min(steps);
            if x >= 1 {
                let at = earliest_elapsed(period, gr, x);
                return start.saturating_add(at).saturating_sub(now);
            }
        }
        // In the next window, where `cur` becomes the weighted previous count: it passes once
        // cur × w ≤ (limit − want) × steps.
        let to_next = start.saturating_add(period).saturating_sub(now);
        if cur == 0 {
            return to_next;
        }
        let x = (limit.saturating_sub(want) * steps / cur).min(steps);
        if x >= 1 {
            to_next.saturating_add(earliest_elapsed(period, gr, x))
        } else {
            // Only the window after the next one admits it.
            to_next.saturating_add(period)
        }
    }

    #[inline]
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

    #[inline]
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
