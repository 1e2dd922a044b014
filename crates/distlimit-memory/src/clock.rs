//! [`FastClock`]: wall-clock microseconds from the CPU's time-stamp counter.

use std::fmt;

use distlimit_core::{Clock, SystemClock};

/// A clock that reads the CPU's time-stamp counter (through `quanta`) and anchors it to the
/// wall clock once, at creation.
///
/// Reading it costs a few nanoseconds where `SystemTime::now()` costs tens (measured by the
/// `clock` group of `cargo xtask bench`): on the memory store's hot path the clock read is a
/// large share of a decision. It is monotonic: it does not follow NTP steps of the wall clock
/// after creation, which is what a local rate limiter wants. Where the CPU has no usable
/// invariant TSC, `quanta` falls back to the OS monotonic clock.
#[derive(Clone)]
pub struct FastClock {
    clock: quanta::Clock,
    base_raw: u64,
    base_epoch_us: u64,
    /// Microseconds per raw tick, in units of 2^-64 µs: a reading is scaled by one multiplication.
    us_per_tick: u64,
}

impl FastClock {
    /// A clock anchored to the system wall clock now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let base_raw = clock.raw();
        // 2^40 ticks in ns, then one tick in 2^-64 µs: a tick of either of quanta's sources (the
        // TSC, or the OS clock in ns) is shorter than a µs, so the fraction fits 64 bits.
        let ns = u128::from(clock.delta_as_nanos(0, 1 << 40));
        Self {
            clock,
            base_raw,
            base_epoch_us: SystemClock.now_us(),
            us_per_tick: u64::try_from((ns << 24) / 1_000).unwrap_or(u64::MAX),
        }
    }
}

impl Default for FastClock {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for FastClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FastClock")
            .field("base_epoch_us", &self.base_epoch_us)
            .finish_non_exhaustive()
    }
}

impl Clock for FastClock {
    // Always inlined: see `MemoryStore::decide_sync`.
    #[inline(always)]
    fn now_us(&self) -> u64 {
        let ticks = self.clock.raw().saturating_sub(self.base_raw);
        let elapsed_us = (u128::from(ticks) * u128::from(self.us_per_tick)) >> 64;
        self.base_epoch_us.saturating_add(elapsed_us as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
