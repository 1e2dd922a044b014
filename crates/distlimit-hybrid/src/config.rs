//! [`Builder`] and what it configures: [`OpenRule`], [`FailureMode`], [`ConfigError`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use distlimit_core::{Clock, MAX_POLICY_LEN, NoopObserver, Observer, SystemClock};

use crate::blocked::BlockedCache;
use crate::breaker::Breaker;
use crate::share::Share;
use crate::{Counters, Hybrid};

/// The default time budget of one primary call.
pub const DEFAULT_BUDGET: Duration = Duration::from_millis(50);
/// The default cool-off: the longest the breaker stays open before one caller probes.
pub const DEFAULT_COOL_OFF: Duration = Duration::from_secs(5);
/// The default first cool-off after the breaker opens; it doubles after each failed probe up
/// to the cool-off.
pub const DEFAULT_FIRST_COOL_OFF: Duration = Duration::from_millis(100);
/// The default bound of the blocked-key cache, in entries.
pub const DEFAULT_BLOCKED_ENTRIES: usize = 10_000;
/// The most failures [`OpenRule::FailuresInWindow`] may count.
pub const MAX_WINDOW_FAILURES: u32 = 4096;

/// When the breaker opens from closed. Only failures of the primary count: timeouts, lost
/// connections, invalid replies, configuration errors; never an error of the request itself
/// (invalid input, a bad state stored at its key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpenRule {
    /// After `n` primary failures in a row (a success resets the count): `ConsecutiveFailures(1)`
    /// opens at the first failure or timeout.
    ConsecutiveFailures(u32),
    /// When the primary keeps failing: at the `failures`-th failure in a row (a success resets
    /// the run) if the run's first failure was at least `for_at_least` earlier, so that a burst
    /// of timeouts that land together (a stalled instance) never opens it. The default.
    Failing {
        /// Failures in a row (at least 1).
        failures: u32,
        /// From the run's first failure to the one that opens.
        for_at_least: Duration,
    },
    /// After `failures` primary failures within `window` (sliding: the last `failures`
    /// failures are at most `window` apart), successes in between or not.
    FailuresInWindow {
        /// How many failures (1 to [`MAX_WINDOW_FAILURES`]).
        failures: u32,
        /// Within how long.
        window: Duration,
    },
}

/// The default opening rule: [`OpenRule::Failing`], 3 failures in a row over at least 50 ms.
pub const DEFAULT_OPEN_RULE: OpenRule = OpenRule::Failing {
    failures: 3,
    for_at_least: Duration::from_millis(50),
};

impl Default for OpenRule {
    /// [`DEFAULT_OPEN_RULE`].
    fn default() -> Self {
        DEFAULT_OPEN_RULE
    }
}

/// What a policy's decisions do while the primary cannot decide (it failed, or the breaker is
/// open).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureMode {
    /// The fallback store decides, enforcing this instance's share of the limit
    /// ([`Builder::instances`]). The default.
    #[default]
    Fallback,
    /// Admit without checking: an allowed decision with
    /// [`Source::FailOpen`](distlimit_core::Source::FailOpen).
    FailOpen,
    /// Return the error: the primary's, or [`Error::Unavailable`](distlimit_core::Error) naming
    /// this store while the breaker is open. An HTTP layer answers 503.
    FailClosed,
}

/// An invalid [`Builder`] setting, returned by [`Builder::build`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The primary's time budget was zero.
    #[error("the primary's time budget must be above zero")]
    ZeroBudget,
    /// The cool-off or the first cool-off was zero.
    #[error("the cool-off and the first cool-off must be above zero")]
    ZeroCoolOff,
    /// The instance count was zero.
    #[error("the instance count must be at least 1")]
    ZeroInstances,
    /// The opening rule counted zero failures, or more than [`MAX_WINDOW_FAILURES`] in a window.
    #[error("the opening rule must count 1 to {MAX_WINDOW_FAILURES} failures, not {0}")]
    Failures(u32),
    /// The opening rule's window was zero.
    #[error("the opening rule's window must be above zero")]
    ZeroWindow,
    /// The blocked-key cache was given room for zero entries (use `blocked_cache(None)`).
    #[error("the blocked-key cache needs room for at least one entry")]
    ZeroBlockedEntries,
    /// A policy name given a failure mode was longer than any request's can be.
    #[error("policy name of {0} bytes is longer than {MAX_POLICY_LEN}")]
    PolicyTooLong(usize),
}

/// Configures a [`Hybrid`]; from [`Hybrid::builder`].
pub struct Builder<P, F, C = SystemClock> {
    primary: P,
    fallback: F,
    clock: C,
    name: &'static str,
    budget: Duration,
    cool_off: Duration,
    first_cool_off: Duration,
    rule: OpenRule,
    modes: HashMap<Box<str>, FailureMode>,
    default_mode: FailureMode,
    instances: u64,
    blocked_entries: Option<usize>,
    observer: Arc<dyn Observer>,
}

impl<P, F> Builder<P, F> {
    pub(crate) fn new(primary: P, fallback: F) -> Self {
        Self {
            primary,
            fallback,
            clock: SystemClock,
            name: "primary",
            budget: DEFAULT_BUDGET,
            cool_off: DEFAULT_COOL_OFF,
            first_cool_off: DEFAULT_FIRST_COOL_OFF,
            rule: OpenRule::default(),
            modes: HashMap::new(),
            default_mode: FailureMode::default(),
            instances: 1,
            blocked_entries: Some(DEFAULT_BLOCKED_ENTRIES),
            observer: Arc::new(NoopObserver),
        }
    }
}

impl<P, F, C> Builder<P, F, C> {
    /// The primary's name in [`Observer`] events and in the errors this store makes
    /// (`"primary"` unless set; `"redis"` reads well).
    pub fn name(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }

    /// The most one primary call may take (default [`DEFAULT_BUDGET`], 50 ms), in wall time
    /// from the call to its answer being polled (what that counts besides Redis: the crate
    /// documentation). A call still running then is dropped and counts as a failure
    /// ([`Error::Timeout`](distlimit_core::Error)).
    pub fn budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// The longest the breaker stays open before one caller probes the primary (default
    /// [`DEFAULT_COOL_OFF`], 5 s), reached by doubling [`first_cool_off`](Self::first_cool_off).
    pub fn cool_off(mut self, cool_off: Duration) -> Self {
        self.cool_off = cool_off;
        self
    }

    /// The cool-off after the breaker opens (default [`DEFAULT_FIRST_COOL_OFF`], 100 ms;
    /// at most [`cool_off`](Self::cool_off)). Each failed probe doubles it, up to the cool-off,
    /// and closing starts it over (why: the crate documentation); equal to it, it is fixed.
    pub fn first_cool_off(mut self, first: Duration) -> Self {
        self.first_cool_off = first;
        self
    }

    /// When the breaker opens (default [`DEFAULT_OPEN_RULE`]).
    pub fn open_after(mut self, rule: OpenRule) -> Self {
        self.rule = rule;
        self
    }

    /// The failure mode of the policy named `policy` ([`Request::policy`](distlimit_core::Request::policy)).
    /// A mode set for `api` also covers the store policies `api/<tier>` that the
    /// `distlimit-policy` limiter sends for `api`'s tiers, unless one of them has its own.
    pub fn failure_mode(mut self, policy: &str, mode: FailureMode) -> Self {
        self.modes.insert(policy.into(), mode);
        self
    }

    /// The failure mode of every policy not named by [`failure_mode`](Self::failure_mode)
    /// (default [`FailureMode::Fallback`]).
    pub fn default_failure_mode(mut self, mode: FailureMode) -> Self {
        self.default_mode = mode;
        self
    }

    /// How many instances share the global limit (default 1). On the fallback each instance
    /// enforces `limit / instances` and `burst / instances` (rounded down, at least 1).
    pub fn instances(mut self, instances: u64) -> Self {
        self.instances = instances;
        self
    }

    /// The blocked-key cache: at most `max_entries` denied keys remembered (default
    /// [`DEFAULT_BLOCKED_ENTRIES`]), or `None` to turn it off.
    pub fn blocked_cache(mut self, max_entries: Option<usize>) -> Self {
        self.blocked_entries = max_entries;
        self
    }

    /// Where breaker transitions and primary errors are reported (default: nowhere).
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = observer;
        self
    }

    /// The clock of the breaker's cool-off and the blocked-key cache (default
    /// [`SystemClock`]); a [`ManualClock`](distlimit_core::ManualClock) makes tests
    /// deterministic.
    pub fn clock<C2: Clock>(self, clock: C2) -> Builder<P, F, C2> {
        Builder {
            primary: self.primary,
            fallback: self.fallback,
            clock,
            name: self.name,
            budget: self.budget,
            cool_off: self.cool_off,
            first_cool_off: self.first_cool_off,
            rule: self.rule,
            modes: self.modes,
            default_mode: self.default_mode,
            instances: self.instances,
            blocked_entries: self.blocked_entries,
            observer: self.observer,
        }
    }

    /// Checks the settings and builds the store.
    pub fn build(self) -> Result<Hybrid<P, F, C>, ConfigError> {
        if self.budget.is_zero() {
            return Err(ConfigError::ZeroBudget);
        }
        if self.cool_off.is_zero() || self.first_cool_off.is_zero() {
            return Err(ConfigError::ZeroCoolOff);
        }
        if self.instances == 0 {
            return Err(ConfigError::ZeroInstances);
        }
        match self.rule {
            OpenRule::ConsecutiveFailures(0) | OpenRule::Failing { failures: 0, .. } => {
                return Err(ConfigError::Failures(0));
            }
            OpenRule::FailuresInWindow { failures, .. }
                if failures == 0 || failures > MAX_WINDOW_FAILURES =>
            {
                return Err(ConfigError::Failures(failures));
            }
            OpenRule::FailuresInWindow { window, .. } if window.is_zero() => {
                return Err(ConfigError::ZeroWindow);
            }
            _ => {}
        }
        if let Some(policy) = self.modes.keys().find(|p| p.len() > MAX_POLICY_LEN) {
            return Err(ConfigError::PolicyTooLong(policy.len()));
        }
        let blocked = match self.blocked_entries {
            Some(0) => return Err(ConfigError::ZeroBlockedEntries),
            Some(n) => Some(BlockedCache::new(n)),
            None => None,
        };
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        Ok(Hybrid {
            primary: self.primary,
            fallback: self.fallback,
            clock: self.clock,
            name: self.name,
            budget: self.budget,
            breaker: Breaker::new(self.rule, micros(self.cool_off))
                .with_first_cool_off(micros(self.first_cool_off)),
            modes: self.modes,
            default_mode: self.default_mode,
            share: Share::new(self.instances),
            blocked,
            observer: self.observer,
            counters: Counters::default(),
        })
    }
}
