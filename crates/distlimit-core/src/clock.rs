//! [`Clock`]: where stores that keep their own time read it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in integer microseconds since the Unix epoch.
///
/// Every algorithm works on this unit, so the Rust model and the Lua scripts (which read Redis'
/// `TIME`) agree exactly. A clock may go backwards (NTP steps); the algorithms tolerate that by
/// never refilling for negative elapsed time.
pub trait Clock: Send + Sync {
    /// Microseconds since the Unix epoch.
    fn now_us(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now_us(&self) -> u64 {
        (**self).now_us()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now_us(&self) -> u64 {
        (**self).now_us()
    }
}

/// The operating system's wall clock ([`SystemTime`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[inline]
    fn now_us(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
}

/// A clock that only moves when told to, for deterministic tests. Clones share one time.
///
/// ```
/// use distlimit_core::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(1_000);
/// let shared = clock.clone();
/// clock.advance(Duration::from_millis(2));
/// assert_eq!(shared.now_us(), 3_000);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `now_us` microseconds.
    pub fn new(now_us: u64) -> Self {
        Self(Arc::new(AtomicU64::new(now_us)))
    }

    /// Moves the clock forward by `by` (saturating).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        // fetch_update never fails with a closure that always returns Some.
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Sets the clock to `now_us`, forwards or backwards.
    pub fn set_us(&self, now_us: u64) {
        self.0.store(now_us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_us(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
