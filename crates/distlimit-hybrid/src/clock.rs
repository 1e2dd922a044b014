//! [`FastClock`]: the default time source of the breaker and the blocked-key cache.

use std::time::{SystemTime, UNIX_EPOCH};

use distlimit_core::Clock;

/// A monotonic clock read from the CPU's time-stamp counter (through `quanta`), anchored once to
/// the wall clock: microseconds since the Unix epoch, like every distlimit clock, at a fraction
/// of the cost of `SystemTime::now` (the open breaker reads it on every decision).
///
/// It never goes backwards and ignores later wall-clock steps, which suits a cool-off and the
/// relative deadlines of the blocked-key cache.
#[derive(Clone, Debug)]
pub struct FastClock {
    clock: quanta::Clock,
    base_raw: u64,
    anchor_us: u64,
}

impl FastClock {
    /// A clock reading the wall-clock time now, then moving with the time-stamp counter.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let base_raw = clock.raw();
        let anchor_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        Self {
            clock,
            base_raw,
            anchor_us,
        }
    }
}

impl Default for FastClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for FastClock {
    #[inline]
    fn now_us(&self) -> u64 {
        let elapsed_ns = self.clock.delta_as_nanos(self.base_raw, self.clock.raw());
        self.anchor_us.saturating_add(elapsed_ns / 1_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlimit_core::SystemClock;

    #[test]
    fn follows_the_wall_clock_and_never_goes_back() {
        let clock = FastClock::new();
        let a = clock.now_us();
        let wall = SystemClock.now_us();
        assert!(a.abs_diff(wall) < 1_000_000, "{a} vs {wall}");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = clock.now_us();
        assert!(b >= a + 2_000, "{a} then {b}");
    }
}
