//! The sliding window log: exact, one entry per admitted instant.

use super::Model;
use crate::Quota;

/// Sliding log state: `(instant, cost)` entries, oldest first, instants strictly increasing
/// (requests admitted at the same microsecond share one entry).
///
/// An entry counts while `instant + period > now`. Expired entries are dropped when a request is
/// admitted, so the log never holds more than `limit` entries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlidingLog {
    // A Vec rather than a VecDeque: 24 bytes instead of 32 keeps every `State` at 32 bytes
    // (stores hold millions); dropping expired entries shifts at most `limit` pairs.
    entries: Vec<(u64, u64)>,
}

impl SlidingLog {
    /// Builds a log from `(instant µs, cost)` entries, for drivers that store logs themselves.
    /// Entries are sorted and entries of one instant merged; zero costs are dropped.
    pub fn from_entries<I: IntoIterator<Item = (u64, u64)>>(entries: I) -> Self {
        let mut sorted: Vec<(u64, u64)> = entries.into_iter().filter(|e| e.1 > 0).collect();
        sorted.sort_unstable();
        let mut log = Self::default();
        for (t, cost) in sorted {
            log.push(t, cost);
        }
        log
    }

    /// The `(instant µs, cost)` entries, oldest first.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = (u64, u64)> + '_ {
        self.entries.iter().copied()
    }

    fn push(&mut self, t: u64, cost: u64) {
        match self.entries.last_mut() {
            Some(last) if last.0 >= t => last.1 = last.1.saturating_add(cost),
            _ => self.entries.push((t, cost)),
        }
    }

    /// The entries still inside the window at `now`.
    fn live(&self, q: &Quota, now: u64) -> impl Iterator<Item = &(u64, u64)> {
        let period = q.period_us();
        self.entries
            .iter()
            .skip_while(move |(t, _)| t.saturating_add(period) <= now)
    }

    fn used(&self, q: &Quota, now: u64) -> u64 {
        self.live(q, now).fold(0, |sum, e| sum.saturating_add(e.1))
    }
}

impl Model for SlidingLog {
    fn available(&self, q: &Quota, now: u64) -> u64 {
        q.limit().saturating_sub(self.used(q, now))
    }

    fn retry_after(&self, q: &Quota, now: u64, want: u64) -> u64 {
        // Wait until enough of the oldest live entries have left the window.
        let target = q.limit() - want;
        let mut used = self.used(q, now);
        for &(t, cost) in self.live(q, now) {
            used = used.saturating_sub(cost);
            if used <= target {
                return t.saturating_add(q.period_us()).saturating_sub(now);
            }
        }
        // Unreachable for a consistent log (`want` is at most the limit); answer the
        // conservative bound rather than panic on a stored state that was tampered with.
        q.period_us()
    }

    fn reset_after(&self, q: &Quota, now: u64, extra: u64) -> u64 {
        let newest = match self.live(q, now).last() {
            Some(&(t, _)) if extra == 0 => t,
            Some(&(t, _)) => t.max(now),
            None if extra == 0 => return 0,
            None => now,
        };
        newest.saturating_add(q.period_us()).saturating_sub(now)
    }

    fn consume(&mut self, q: &Quota, now: u64, cost: u64) {
        let period = q.period_us();
        let expired = self
            .entries
            .iter()
            .take_while(|(t, _)| t.saturating_add(period) <= now)
            .count();
        self.entries.drain(..expired);
        self.push(now, cost);
    }

    fn expires_at(&self, q: &Quota) -> u64 {
        self.entries
            .last()
            .map_or(0, |(t, _)| t.saturating_add(q.period_us()))
    }
}
