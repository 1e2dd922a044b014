//! The fixed window counter.

use super::Model;
use crate::Quota;

/// Fixed window state: the start of the window counted in, and its count.
///
/// Windows are aligned to multiples of the period since the Unix epoch. If the clock goes back
/// before `start_us`, the stored window stays current.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FixedWindow {
    /// Start of the window `count` belongs to (µs since the epoch).
    pub start_us: u64,
    /// Units admitted in that window.
    pub count: u64,
}

impl FixedWindow {
    /// The current window's start and count at `now`.
    #[inline]
    fn current(&self, q: &Quota, now: u64) -> (u64, u64) {
        let start = now - now % q.period_us();
        if start > self.start_us {
            (start, 0)
        } else {
            (self.start_us, self.count)
        }
    }

    /// This state, written under `from`, as a state of `to`: the count of `from`'s window that
    /// holds `now`, capped at `to`'s limit, counted in `to`'s window that holds `now`.
    pub(crate) fn carried(&self, from: &Quota, to: &Quota, now: u64) -> Self {
        if from.period_us() == to.period_us() {
            return *self;
        }
        let (_, spent) = self.current(from, now);
        if spent == 0 {
            return FixedWindow::default();
        }
        FixedWindow {
            start_us: now - now % to.period_us(),
            count: spent.min(to.limit()),
        }
    }
}

impl Model for FixedWindow {
    #[inline]
    fn available(&self, q: &Quota, now: u64) -> u64 {
        q.limit().saturating_sub(self.current(q, now).1)
    }

    #[inline]
    fn retry_after(&self, q: &Quota, now: u64, _want: u64) -> u64 {
        // `want` never exceeds the limit, so the next window admits it.
        let (start, _) = self.current(q, now);
        start.saturating_add(q.period_us()).saturating_sub(now)
    }

    #[inline]
    fn reset_after(&self, q: &Quota, now: u64, extra: u64) -> u64 {
        let (start, count) = self.current(q, now);
        if count.saturating_add(extra) == 0 {
            0
        } else {
            start.saturating_add(q.period_us()).saturating_sub(now)
        }
    }

    #[inline]
    fn consume(&mut self, q: &Quota, now: u64, cost: u64) {
        let (start, count) = self.current(q, now);
        self.start_us = start;
        self.count = count.saturating_add(cost);
    }

    fn expires_at(&self, q: &Quota) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.start_us.saturating_add(q.period_us())
        }
    }
}
