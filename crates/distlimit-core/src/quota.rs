//! [`Quota`]: how much may be consumed, how fast, and how much at once.

use std::time::Duration;

/// Longest period a quota may have, in microseconds: 2^50 µs, about 35.7 years.
///
/// With times below 2^52 µs (the year 2112), the ends of the current and the next window
/// (`start + 2 × period`) stay below 2^53.
pub const MAX_PERIOD_US: u64 = 1 << 50;

/// Largest limit a quota may have: 2^32 (4 294 967 296) units per period.
///
/// The sliding window counter compares `limit × steps` with `steps ≤ 2^20` (see
/// [`WINDOW_STEPS`]), which stays within 2^52.
pub const MAX_LIMIT: u64 = 1 << 32;

/// Largest value of `burst × reduced period` a quota may have: 2^52.
///
/// The *reduced period* is `period_us / gcd(limit, period_us)`: the token bucket counts in
/// `1 / reduced period` of a token (see [`Quota::refill_units`]), so its capacity is
/// `burst × reduced period` units, and GCRA's `burst × ⌈period / limit⌉` µs is never more.
///
/// Together with [`MAX_LIMIT`] and [`MAX_PERIOD_US`] this bound keeps every intermediate value
/// below 2^53, so the Lua scripts compute bit-identical decisions (see [`algorithm`](crate::algorithm)).
///
/// A round limit has a small reduced period, so large quotas fit with their default burst
/// (`burst = limit`):
///
/// | quota | reduced period | `burst × reduced period` |
/// |---|---|---|
/// | `per_second(4_000_000_000)` | 1 | 4 × 10^9 |
/// | `per_day(100_000)` | 864 000 | 8.64 × 10^10 |
/// | `per_day(10_000_000)` | 8 640 | 8.64 × 10^10 |
/// | `per_day(1_234_567)` | 86 400 000 000 (`gcd = 1`) | 1.07 × 10^17: **too large** |
///
/// `per_day(1_234_567)` fits with a burst of up to 52 124 (`2^52 / 86 400 000 000`), and
/// `per_day(1_200_000)` (reduced period 72 000) fits with its default burst.
pub const MAX_SCALED: u64 = 1 << 52;

/// The sliding window counter weighs the previous window in at most this many steps: 2^20.
///
/// See [`Quota::window_granule`].
pub const WINDOW_STEPS: u64 = 1 << 20;

/// A rate limit: `limit` units per `period`, with up to `burst` units at once.
///
/// * **limit** and **period** give the sustained rate: `Quota::per_minute(60)` refills one unit
///   per second.
/// * **burst** is the capacity of the token bucket and GCRA algorithms: how many units a client
///   that was idle long enough may spend at once. It defaults to `limit`. The window algorithms
///   ignore it: they admit `limit` units per window.
///
/// Periods are whole microseconds (a sub-microsecond remainder is dropped).
///
/// # Bounds
///
/// So that every algorithm computes exactly in integers below 2^53, a quota needs
/// `period_us ≤` [`MAX_PERIOD_US`], `limit ≤` [`MAX_LIMIT`] and
/// `burst × period_us / gcd(limit, period_us) ≤` [`MAX_SCALED`] (a round limit allows a large
/// burst: see the examples there). Anything else is a [`QuotaError`].
///
/// ```
/// use distlimit_core::{Quota, QuotaError};
/// use std::time::Duration;
///
/// # fn main() -> Result<(), distlimit_core::QuotaError> {
/// // 100 requests per minute, of which at most 10 at once.
/// let quota = Quota::per_minute(100)?.with_burst(10)?;
/// assert_eq!(quota.limit(), 100);
/// assert_eq!(quota.period(), Duration::from_secs(60));
/// assert_eq!(quota.burst(), 10);
///
/// // Zero is never a valid limit.
/// assert!(Quota::per_second(0).is_err());
///
/// // Large round quotas fit; an unround one needs a smaller burst.
/// assert!(Quota::per_day(10_000_000).is_ok());
/// assert!(matches!(
///     Quota::per_day(1_234_567),
///     Err(QuotaError::TooLarge { what: "burst", value: 1_234_567, max: 52_124 })
/// ));
/// assert!(Quota::from_parts(1_234_567, 86_400_000_000, 52_124).is_ok());
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    period_us: u64,
    burst: u64,
    /// `limit / gcd(limit, period_us)`: token-bucket units refilled per µs.
    refill_per_us: u64,
    /// `period_us / gcd(limit, period_us)`: token-bucket units per token.
    token_units: u64,
    /// `⌈period_us / limit⌉`: GCRA's emission interval.
    emission_us: u64,
    /// `⌈period_us / 2^20⌉`: the sliding window's granule.
    granule_us: u64,
    /// `⌈period_us / granule_us⌉`: the sliding window's steps per window.
    window_steps: u64,
}

/// Why a [`Quota`] could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The limit was zero: nothing could ever be admitted.
    #[error("invalid quota: the limit must be at least 1")]
    ZeroLimit,
    /// The period was shorter than one microsecond.
    #[error("invalid quota: the period must be at least 1 microsecond")]
    ZeroPeriod,
    /// The burst was zero: nothing could ever be admitted.
    #[error("invalid quota: the burst must be at least 1")]
    ZeroBurst,
    /// A part of the quota is beyond the exact integer range (see [`Quota`]'s bounds). For the
    /// burst, `max` is the largest burst this limit and period allow,
    /// `MAX_SCALED / (period_us / gcd(limit, period_us))`.
    #[error("invalid quota: {}", too_large_message(.what, *.value, *.max))]
    TooLarge {
        /// `"period"` ([`MAX_PERIOD_US`]), `"limit"` ([`MAX_LIMIT`]) or `"burst"` ([`MAX_SCALED`]).
        what: &'static str,
        /// The offending period (µs), limit or burst.
        value: u64,
        /// The largest value allowed for it.
        max: u64,
    },
}

/// The message of [`QuotaError::TooLarge`].
fn too_large_message(what: &str, value: u64, max: u64) -> String {
    match what {
        "period" => format!(
            "the period of {value} µs exceeds {max} µs (2^50 µs, about 35.7 years), \
             the longest period computed exactly"
        ),
        "limit" => {
            format!("the limit of {value} exceeds {max} (2^32), the largest limit computed exactly")
        }
        "burst" => format!(
            "the burst of {value} exceeds {max}, the largest burst this limit and period allow \
             (burst × period in µs / gcd(limit, period in µs) must stay within 2^52); \
             use a smaller burst, or a rounder limit that shares more factors with the period"
        ),
        _ => format!("the {what} of {value} exceeds {max}, beyond the exact integer range"),
    }
}

/// The greatest common divisor (Euclid).
const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Quota {
    /// `limit` units per `period`, burst equal to `limit`.
    pub fn new(limit: u64, period: Duration) -> Result<Self, QuotaError> {
        let period_us = u64::try_from(period.as_micros()).unwrap_or(u64::MAX);
        Self::from_parts(limit, period_us, limit)
    }

    /// `limit` units per second.
    pub fn per_second(limit: u64) -> Result<Self, QuotaError> {
        Self::from_parts(limit, 1_000_000, limit)
    }

    /// `limit` units per minute.
    pub fn per_minute(limit: u64) -> Result<Self, QuotaError> {
        Self::from_parts(limit, 60_000_000, limit)
    }

    /// `limit` units per hour.
    pub fn per_hour(limit: u64) -> Result<Self, QuotaError> {
        Self::from_parts(limit, 3_600_000_000, limit)
    }

    /// `limit` units per day.
    pub fn per_day(limit: u64) -> Result<Self, QuotaError> {
        Self::from_parts(limit, 86_400_000_000, limit)
    }

    /// The same rate with another burst (capacity).
    pub fn with_burst(self, burst: u64) -> Result<Self, QuotaError> {
        Self::from_parts(self.limit, self.period_us, burst)
    }

    /// Builds a quota from its raw parts: `limit` units per `period_us` microseconds, `burst` at
    /// once. Drivers use this to rebuild a quota they stored.
    ///
    /// Checks, in this order: a zero limit, period or burst, then the bounds of [`Quota`]: the
    /// period, the limit, the burst.
    pub fn from_parts(limit: u64, period_us: u64, burst: u64) -> Result<Self, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        if period_us == 0 {
            return Err(QuotaError::ZeroPeriod);
        }
        if burst == 0 {
            return Err(QuotaError::ZeroBurst);
        }
        if period_us > MAX_PERIOD_US {
            return Err(QuotaError::TooLarge {
                what: "period",
                value: period_us,
                max: MAX_PERIOD_US,
            });
        }
        if limit > MAX_LIMIT {
            return Err(QuotaError::TooLarge {
                what: "limit",
                value: limit,
                max: MAX_LIMIT,
            });
        }
        let g = gcd(limit, period_us);
        let token_units = period_us / g;
        let max_burst = MAX_SCALED / token_units;
        if burst > max_burst {
            return Err(QuotaError::TooLarge {
                what: "burst",
                value: burst,
                max: max_burst,
            });
        }
        // Derived once here, so that no decision divides for them.
        let granule_us = period_us.div_ceil(WINDOW_STEPS);
        Ok(Self {
            limit,
            period_us,
            burst,
            refill_per_us: limit / g,
            token_units,
            emission_us: period_us.div_ceil(limit),
            granule_us,
            window_steps: period_us.div_ceil(granule_us),
        })
    }

    /// Units per period.
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period.
    #[inline]
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.period_us)
    }

    /// The period in microseconds.
    #[inline]
    pub fn period_us(&self) -> u64 {
        self.period_us
    }

    /// Units that may be spent at once by the token bucket and GCRA.
    #[inline]
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The token bucket's exact scale: `(refill per µs, units per token)`, that is
    /// `(limit / g, period_us / g)` with `g = gcd(limit, period_us)`, computed once when the quota
    /// is built.
    ///
    /// The bucket counts in `1 / (period_us / g)` of a token: `elapsed` µs refill
    /// `elapsed × limit / g` units, exactly the rate `limit / period_us` tokens per µs, and a full
    /// bucket holds `burst × period_us / g ≤ 2^52` units ([`MAX_SCALED`]). Drivers that evaluate
    /// the token bucket elsewhere (the Redis Lua script) pass these two numbers along.
    ///
    /// ```
    /// use distlimit_core::Quota;
    ///
    /// # fn main() -> Result<(), distlimit_core::QuotaError> {
    /// // One million per day: gcd = 1 000 000, so one unit per µs and 86 400 units per token.
    /// assert_eq!(Quota::per_day(1_000_000)?.refill_units(), (1, 86_400));
    /// // Three per second: gcd = 1.
    /// assert_eq!(Quota::per_second(3)?.refill_units(), (3, 1_000_000));
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn refill_units(&self) -> (u64, u64) {
        (self.refill_per_us, self.token_units)
    }

    /// The sliding window counter's weighting: `(granule µs, steps per window)`, that is
    /// `gr = ⌈period_us / 2^20⌉` and `steps = ⌈period_us / gr⌉ ≤ 2^20` ([`WINDOW_STEPS`]).
    /// How they weigh the previous window: see [`SlidingWindow`](crate::algorithm::SlidingWindow).
    ///
    /// ```
    /// use distlimit_core::Quota;
    ///
    /// # fn main() -> Result<(), distlimit_core::QuotaError> {
    /// assert_eq!(Quota::per_second(10)?.window_granule(), (1, 1_000_000));
    /// assert_eq!(Quota::per_hour(10)?.window_granule(), (3_434, 1_048_341));
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn window_granule(&self) -> (u64, u64) {
        (self.granule_us, self.window_steps)
    }

    /// GCRA's emission interval `T = ⌈period_us / limit⌉` µs: one unit is admitted every `T`.
    ///
    /// ```
    /// # use distlimit_core::Quota;
    /// assert_eq!(Quota::per_second(3)?.emission_interval_us(), 333_334);
    /// # Ok::<(), distlimit_core::QuotaError>(())
    /// ```
    #[inline]
    pub fn emission_interval_us(&self) -> u64 {
        self.emission_us
    }
}
