//! [`Quota`]: how much may be consumed, how fast, and how much at once.

use std::time::Duration;

/// Largest value of `limit × period` and `burst × period` (in microseconds) a quota may have.
///
/// Every algorithm works on integers scaled by the period. Keeping the products below 2^50 keeps
/// every intermediate value below 2^53, the largest integer a Lua number (an IEEE double) holds
/// exactly, so the Redis scripts and the Rust reference model compute bit-identical decisions.
/// 2^50 µs is about 35 years: `per_hour(312_000)` fits, and so does a one-day period with a limit
/// or burst of up to 13 031.
pub const MAX_SCALED: u64 = 1 << 50;

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
/// ```
/// use distlimit_core::Quota;
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
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    period_us: u64,
    burst: u64,
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
    /// `limit × period` or `burst × period` (in µs) exceeds [`MAX_SCALED`].
    #[error(
        "invalid quota: {what} × period ({value} × {period_us} µs) exceeds the exact integer range (2^50)"
    )]
    TooLarge {
        /// `"limit"` or `"burst"`.
        what: &'static str,
        /// The offending limit or burst.
        value: u64,
        /// The period in microseconds.
        period_us: u64,
    },
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
        for (what, value) in [("limit", limit), ("burst", burst)] {
            if u128::from(value) * u128::from(period_us) > u128::from(MAX_SCALED) {
                return Err(QuotaError::TooLarge {
                    what,
                    value,
                    period_us,
                });
            }
        }
        Ok(Self {
            limit,
            period_us,
            burst,
        })
    }

    /// Units per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period.
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.period_us)
    }

    /// The period in microseconds.
    pub fn period_us(&self) -> u64 {
        self.period_us
    }

    /// Units that may be spent at once by the token bucket and GCRA.
    pub fn burst(&self) -> u64 {
        self.burst
    }
}
