//! The circuit breaker: one atomic word (state and the instant it was entered), a
//! compare-and-swap to elect the one prober, and the rule that opens it.
//!
//! The breaker knows nothing of stores or time sources: callers pass `now` (microseconds) and
//! report outcomes. Every method returns the [`Transition`] it made, if any, so the caller reports
//! it exactly once (only the thread whose compare-and-swap succeeded gets it).

use std::sync::atomic::Ordering;
use std::time::Duration;

use distlimit_core::BreakerState;

use crate::OpenRule;
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Mutex};

const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;
const TAG_BITS: u32 = 2;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
/// The largest instant a word holds; later ones saturate (the year 146 000).
const MAX_AT: u64 = u64::MAX >> TAG_BITS;

/// A state and the instant (µs) it was entered, in one word.
fn pack(tag: u64, at_us: u64) -> u64 {
    (at_us.min(MAX_AT) << TAG_BITS) | tag
}

fn tag(word: u64) -> u64 {
    word & TAG_MASK
}

fn at(word: u64) -> u64 {
    word >> TAG_BITS
}

fn state_of(word: u64) -> BreakerState {
    match tag(word) {
        CLOSED => BreakerState::Closed,
        OPEN => BreakerState::Open,
        _ => BreakerState::HalfOpen,
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A state change, for the observer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Transition {
    pub(crate) from: BreakerState,
    pub(crate) to: BreakerState,
}

impl Transition {
    fn new(from: BreakerState, to: BreakerState) -> Option<Self> {
        Some(Self { from, to })
    }
}

/// Where one decision goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// Closed: ask the primary.
    Primary,
    /// This caller won the half-open compare-and-swap: it probes the primary. `word` is the
    /// half-open state it installed; `opened_at` when the breaker had opened.
    Probe { word: u64, opened_at: u64 },
    /// Open, or half-open with another caller probing: the primary is not touched.
    Fallback,
}

/// What the primary's failures are counted with.
#[derive(Debug)]
enum Failures {
    /// A run of failures without a success between them: the breaker opens at the
    /// `threshold`-th failure of a run that began at least `lasting_us` earlier.
    Streak {
        threshold: u64,
        lasting_us: u64,
        /// Whether a run is going on: read without the lock by every success, so that the
        /// usual success (nothing failing) costs one relaxed load.
        failing: AtomicBool,
        run: Mutex<Run>,
    },
    /// The instants of the last `threshold` failures: the breaker opens when all of them lie
    /// within `window_us`.
    Window { window_us: u64, ring: Mutex<Ring> },
}

/// The current run of failures.
#[derive(Debug, Default)]
struct Run {
    count: u64,
    since_us: u64,
}

#[derive(Debug)]
struct Ring {
    at: Box<[u64]>,
    next: usize,
    filled: usize,
}

/// The breaker's state machine. See the crate documentation for the states.
#[derive(Debug)]
pub(crate) struct Breaker {
    word: AtomicU64,
    /// The first cool-off after the breaker opens; it doubles after each failed probe, up to
    /// `cool_off_us`.
    first_cool_off_us: u64,
    cool_off_us: u64,
    /// Probes failed since the breaker opened: sets the cool-off. Relaxed: it only times the
    /// next probe, the state word decides who probes.
    failed_probes: AtomicU32,
    failures: Failures,
}

impl Breaker {
    /// A closed breaker. `rule` was validated by the builder (a threshold of at least 1).
    pub(crate) fn new(rule: OpenRule, cool_off_us: u64) -> Self {
        let streak = |failures: u32, lasting: Duration| Failures::Streak {
            threshold: u64::from(failures.max(1)),
            lasting_us: micros(lasting),
            failing: AtomicBool::new(false),
            run: Mutex::new(Run::default()),
        };
        let failures = match rule {
            OpenRule::ConsecutiveFailures(n) => streak(n, Duration::ZERO),
            OpenRule::Failing {
                failures,
                for_at_least,
            } => streak(failures, for_at_least),
            OpenRule::FailuresInWindow { failures, window } => Failures::Window {
                window_us: micros(window),
                ring: Mutex::new(Ring {
                    at: vec![0; failures.max(1) as usize].into_boxed_slice(),
                    next: 0,
                    filled: 0,
                }),
            },
        };
        Self {
            word: AtomicU64::new(pack(CLOSED, 0)),
            first_cool_off_us: cool_off_us,
            cool_off_us,
            failed_probes: AtomicU32::new(0),
            failures,
        }
    }

    /// The same breaker with a cool-off that starts at `first_us` when it opens and doubles
    /// after each failed probe up to the cool-off it was made with.
    pub(crate) fn with_first_cool_off(mut self, first_us: u64) -> Self {
        self.first_cool_off_us = first_us.min(self.cool_off_us);
        self
    }

    /// The cool-off after `failed` probes since the breaker opened.
    fn cool_off(&self, failed: u32) -> u64 {
        self.first_cool_off_us
            .saturating_mul(1 << failed.min(63))
            .min(self.cool_off_us)
    }

    /// The current state.
    pub(crate) fn state(&self) -> BreakerState {
        state_of(self.word.load(Ordering::Acquire))
    }

    /// Whether a run's lock-free flag agrees with its count (the success path reads the flag).
    #[cfg(test)]
    pub(crate) fn run_is_consistent(&self) -> bool {
        match &self.failures {
            Failures::Streak { failing, run, .. } => {
                let run = run.lock();
                failing.load(Ordering::Relaxed) == (run.count > 0)
            }
            Failures::Window { .. } => true,
        }
    }

    /// Where a decision at `now_us` goes: [`Breaker::route_with`] with the time known.
    #[cfg(test)]
    pub(crate) fn route(&self, now_us: u64) -> (Route, Option<Transition>) {
        self.route_with(|| now_us)
    }

    /// Where a decision goes. After the cool-off, the first caller to swap the open state for
    /// half-open becomes the prober; everyone else, meanwhile, uses the fallback.
    ///
    /// One atomic load; `now_us` is called for the time only while the breaker is open (closed
    /// and half-open route without it).
    #[inline]
    pub(crate) fn route_with(&self, now_us: impl FnOnce() -> u64) -> (Route, Option<Transition>) {
        let word = self.word.load(Ordering::Acquire);
        match tag(word) {
            CLOSED => (Route::Primary, None),
            OPEN => {
                let now_us = now_us();
                let opened_at = at(word);
                if !self.cooled(opened_at, now_us) {
                    return (Route::Fallback, None);
                }
                let half = pack(HALF_OPEN, now_us);
                match self
                    .word
                    .compare_exchange(word, half, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => (
                        Route::Probe {
                            word: half,
                            opened_at,
                        },
                        Transition::new(BreakerState::Open, BreakerState::HalfOpen),
                    ),
                    Err(_) => (Route::Fallback, None),
                }
            }
            _ => (Route::Fallback, None),
        }
    }

    /// Where a decision at `now_us` goes if it must not wait: like [`Breaker::route_with`], but
    /// never elects a prober (a probe is a primary call, which waits). `None` when the cool-off
    /// is over: the caller awaits the decision, where one caller probes.
    pub(crate) fn route_now(&self, now_us: impl FnOnce() -> u64) -> Option<Route> {
        let word = self.word.load(Ordering::Acquire);
        match tag(word) {
            CLOSED => Some(Route::Primary),
            OPEN => (!self.cooled(at(word), now_us())).then_some(Route::Fallback),
            _ => Some(Route::Fallback),
        }
    }

    /// The primary answered. A probe's success closes the breaker; a closed breaker's resets the
    /// consecutive-failure count.
    pub(crate) fn succeeded(&self, route: Route) -> Option<Transition> {
        match route {
            Route::Primary => {
                if let Failures::Streak { failing, .. } = &self.failures
                    && failing.load(Ordering::Relaxed)
                {
                    self.reset_failures();
                }
                None
            }
            Route::Probe { word, .. } => {
                self.swap(word, pack(CLOSED, 0))?;
                self.reset_failures();
                self.failed_probes.store(0, Ordering::Relaxed);
                Transition::new(BreakerState::HalfOpen, BreakerState::Closed)
            }
            Route::Fallback => None,
        }
    }

    /// The primary failed at `now_us`. A failed probe restarts the cool-off, doubled; a closed
    /// breaker opens when the rule says so, with the first cool-off.
    pub(crate) fn failed(&self, route: Route, now_us: u64) -> Option<Transition> {
        match route {
            Route::Primary => {
                if !self.count_failure(now_us) {
                    return None;
                }
                self.swap(pack(CLOSED, 0), pack(OPEN, now_us))?;
                self.reset_failures();
                self.failed_probes.store(0, Ordering::Relaxed);
                Transition::new(BreakerState::Closed, BreakerState::Open)
            }
            Route::Probe { word, .. } => {
                self.swap(word, pack(OPEN, now_us))?;
                self.failed_probes.fetch_add(1, Ordering::Relaxed);
                Transition::new(BreakerState::HalfOpen, BreakerState::Open)
            }
            Route::Fallback => None,
        }
    }

    /// The probe told nothing (the request was invalid, or the caller gave up on it): back to
    /// open as it was, so the next caller probes at once.
    pub(crate) fn inconclusive(&self, route: Route) -> Option<Transition> {
        match route {
            Route::Probe { word, opened_at } => {
                self.swap(word, pack(OPEN, opened_at))?;
                Transition::new(BreakerState::HalfOpen, BreakerState::Open)
            }
            Route::Primary | Route::Fallback => None,
        }
    }

    /// Whether the cool-off of a breaker opened at `opened_at` is over at `now_us`. A clock
    /// that went back before the opening counts as a finished cool-off, so that a stepped clock
    /// never keeps the breaker open for longer.
    fn cooled(&self, opened_at: u64, now_us: u64) -> bool {
        now_us < opened_at
            || now_us - opened_at >= self.cool_off(self.failed_probes.load(Ordering::Relaxed))
    }

    fn swap(&self, from: u64, to: u64) -> Option<()> {
        self.word
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| ())
    }

    /// Counts one failure; whether the rule now says open.
    fn count_failure(&self, now_us: u64) -> bool {
        match &self.failures {
            Failures::Streak {
                threshold,
                lasting_us,
                failing,
                run,
            } => {
                let mut run = run.lock();
                if run.count == 0 {
                    run.since_us = now_us;
                    failing.store(true, Ordering::Relaxed);
                }
                run.count = run.count.saturating_add(1);
                run.count >= *threshold && now_us.saturating_sub(run.since_us) >= *lasting_us
            }
            Failures::Window { window_us, ring } => {
                let mut ring = ring.lock();
                let len = ring.at.len();
                let next = ring.next;
                if let Some(slot) = ring.at.get_mut(next) {
                    *slot = now_us;
                }
                ring.next = (next + 1) % len;
                ring.filled = (ring.filled + 1).min(len);
                // The oldest of the last `len` failures is the one `next` now points at.
                let oldest = ring.at.get(ring.next).copied().unwrap_or(now_us);
                ring.filled == len && now_us.saturating_sub(oldest) < *window_us
            }
        }
    }

    fn reset_failures(&self) {
        match &self.failures {
            Failures::Streak { failing, run, .. } => {
                let mut run = run.lock();
                run.count = 0;
                failing.store(false, Ordering::Relaxed);
            }
            Failures::Window { ring, .. } => {
                let mut ring = ring.lock();
                ring.filled = 0;
                ring.next = 0;
            }
        }
    }
}

#[cfg(all(test, not(distlimit_loom)))]
mod tests {
    use std::time::Duration;

    use super::*;

    const COOL: u64 = 5_000_000;

    #[test]
    fn words_round_trip() {
        for t in [CLOSED, OPEN, HALF_OPEN] {
            let w = pack(t, 1_700_000_000_000_000);
            assert_eq!((tag(w), at(w)), (t, 1_700_000_000_000_000));
        }
        assert_eq!(at(pack(OPEN, u64::MAX)), MAX_AT);
    }

    #[test]
    fn consecutive_failures_open_and_a_success_resets() {
        let b = Breaker::new(OpenRule::ConsecutiveFailures(3), COOL);
        assert_eq!(b.failed(Route::Primary, 1), None);
        assert_eq!(b.failed(Route::Primary, 2), None);
        assert_eq!(b.succeeded(Route::Primary), None);
        assert_eq!(b.failed(Route::Primary, 3), None);
        assert_eq!(b.failed(Route::Primary, 4), None);
        assert_eq!(b.state(), BreakerState::Closed);
        let t = b.failed(Route::Primary, 5).unwrap();
        assert_eq!((t.from, t.to), (BreakerState::Closed, BreakerState::Open));
        assert_eq!(b.state(), BreakerState::Open);
        // A late failure of a request sent while closed changes nothing.
        assert_eq!(b.failed(Route::Primary, 6), None);
    }

    #[test]
    fn failing_rule_needs_a_run_that_lasts() {
        let rule = OpenRule::Failing {
            failures: 3,
            for_at_least: Duration::from_millis(50),
        };
        let b = Breaker::new(rule, COOL);
        // A burst: many failures within a few milliseconds, then a success.
        for at in 0..100 {
            assert_eq!(b.failed(Route::Primary, 1_000_000 + at * 10), None);
        }
        assert!(b.run_is_consistent());
        assert_eq!(b.succeeded(Route::Primary), None);
        assert!(b.run_is_consistent());
        // A run opens once it has three failures and lasted 50 ms; the success above reset
        // the earlier run.
        assert_eq!(b.failed(Route::Primary, 2_000_000), None);
        assert_eq!(b.failed(Route::Primary, 2_010_000), None);
        assert_eq!(b.failed(Route::Primary, 2_049_999), None, "not 50 ms yet");
        assert!(b.failed(Route::Primary, 2_050_000).is_some());
        let b = Breaker::new(rule, COOL);
        assert_eq!(b.failed(Route::Primary, 0), None);
        assert_eq!(b.failed(Route::Primary, 60_000), None, "two failures");
        let t = b.failed(Route::Primary, 60_001).unwrap();
        assert_eq!((t.from, t.to), (BreakerState::Closed, BreakerState::Open));
    }

    #[test]
    fn window_rule_needs_the_failures_within_the_window() {
        let rule = OpenRule::FailuresInWindow {
            failures: 3,
            window: Duration::from_secs(1),
        };
        let b = Breaker::new(rule, COOL);
        assert_eq!(b.failed(Route::Primary, 0), None);
        assert_eq!(b.failed(Route::Primary, 600_000), None);
        // Three failures, but spread over 1.2 s.
        assert_eq!(b.failed(Route::Primary, 1_200_000), None);
        // A success does not reset a window.
        assert_eq!(b.succeeded(Route::Primary), None);
        // 600 000, 1 200 000, 1 500 000: within one second.
        assert!(b.failed(Route::Primary, 1_500_000).is_some());
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn cool_off_then_one_probe_then_close_or_reopen() {
        let b = Breaker::new(OpenRule::ConsecutiveFailures(1), COOL);
        b.failed(Route::Primary, 100);
        assert_eq!(b.route(100 + COOL - 1).0, Route::Fallback);
        let (probe, t) = b.route(100 + COOL);
        assert!(matches!(probe, Route::Probe { opened_at: 100, .. }));
        assert_eq!(t.unwrap().to, BreakerState::HalfOpen);
        assert_eq!(b.route(100 + COOL).0, Route::Fallback);
        assert_eq!(b.route(u64::MAX).0, Route::Fallback);

        // A failed probe restarts the cool-off from the failure.
        let now = 200 + COOL;
        assert_eq!(b.failed(probe, now).unwrap().to, BreakerState::Open);
        assert_eq!(b.route(now + COOL - 1).0, Route::Fallback);
        let (probe, _) = b.route(now + COOL);
        assert_eq!(b.succeeded(probe).unwrap().to, BreakerState::Closed);
        assert_eq!(b.route(now + COOL).0, Route::Primary);
        // The outcome of a stale probe is ignored.
        assert_eq!(b.failed(probe, now + COOL), None);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn the_cool_off_doubles_after_each_failed_probe_and_starts_over_once_closed() {
        const FIRST: u64 = 100_000;
        let b =
            Breaker::new(OpenRule::ConsecutiveFailures(1), 1_000_000).with_first_cool_off(FIRST);
        let mut now = 0;
        b.failed(Route::Primary, now);
        // Cool-offs of 0.1, 0.2, 0.4, 0.8 s, then the full 1 s.
        for wait in [FIRST, 2 * FIRST, 4 * FIRST, 8 * FIRST, 1_000_000, 1_000_000] {
            assert_eq!(b.route(now + wait - 1).0, Route::Fallback, "before {wait}");
            let (probe, _) = b.route(now + wait);
            assert!(matches!(probe, Route::Probe { .. }), "after {wait}");
            now += wait;
            assert_eq!(b.failed(probe, now).unwrap().to, BreakerState::Open);
        }
        let (probe, _) = b.route(now + 1_000_000);
        now += 1_000_000;
        assert_eq!(b.succeeded(probe).unwrap().to, BreakerState::Closed);
        // The next outage starts with the first cool-off again.
        b.failed(Route::Primary, now);
        assert_eq!(b.route(now + FIRST - 1).0, Route::Fallback);
        assert!(matches!(b.route(now + FIRST).0, Route::Probe { .. }));
        // A first cool-off longer than the cool-off is the cool-off.
        let b = Breaker::new(OpenRule::ConsecutiveFailures(1), FIRST).with_first_cool_off(COOL);
        b.failed(Route::Primary, 0);
        assert!(matches!(b.route(FIRST).0, Route::Probe { .. }));
    }

    #[test]
    fn an_inconclusive_probe_lets_the_next_caller_probe() {
        let b = Breaker::new(OpenRule::ConsecutiveFailures(1), COOL);
        b.failed(Route::Primary, 0);
        let (probe, _) = b.route(COOL);
        assert_eq!(b.inconclusive(probe).unwrap().to, BreakerState::Open);
        assert!(matches!(b.route(COOL).0, Route::Probe { .. }));
    }

    #[test]
    fn a_clock_stepped_back_ends_the_cool_off() {
        let b = Breaker::new(OpenRule::ConsecutiveFailures(1), COOL);
        b.failed(Route::Primary, 10_000_000);
        assert!(matches!(b.route(9_000_000).0, Route::Probe { .. }));
    }
}
