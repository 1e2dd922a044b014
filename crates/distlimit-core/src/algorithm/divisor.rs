//! Exact division by a quota's constants without a hardware division: [`Divisor`] and the
//! one-pass decisions of the token bucket and GCRA that use them ([`QuotaDivisors`]).

use super::{Gcra, Model, TokenBucket};
use crate::{Decision, Quota};

/// Dividends below `2^DIVIDEND_BITS` are divided by multiplication; larger ones by `/`.
const DIVIDEND_BITS: u32 = 53;

/// Exact `n / d` for one fixed `d ≥ 1`, for every `n < 2^53` (every value the algorithms
/// divide for a valid quota) by a multiplication and a shift instead of a hardware division
/// (tens of cycles on a decision's critical path), by `/` above.
///
/// For `d ≥ 2`, with `l = ⌈log2 d⌉`, `b = max(53, 64 − l)` and `m = ⌊2^(b + l) / d⌋ + 1 < 2^64`:
/// `2^(b + l) < m × d ≤ 2^(b + l) + d ≤ 2^(b + l) + 2^l`, so for `n = q × d + r < 2^b`,
/// `q ≤ n / d < m × n / 2^(b + l) ≤ n / d + n / (d × 2^b) < q + (r + 1) / d ≤ q + 1`: `q` is
/// the high word of `m × n` shifted right by `b + l − 64` (Granlund and Montgomery's bound).
///
/// ```
/// use distlimit_core::algorithm::Divisor;
///
/// let by = Divisor::new(86_400);
/// assert_eq!(by.div(1_000_000_007), 1_000_000_007 / 86_400);
/// assert_eq!(by.div_ceil(86_401), 2);
/// assert_eq!(by.div(u64::MAX), u64::MAX / 86_400);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Divisor {
    d: u64,
    /// `m` above (0 for `d = 1`).
    magic: u64,
    /// `b + l − 64`.
    shift: u32,
}

impl Divisor {
    /// The divisor `d` (0 is read as 1).
    pub fn new(d: u64) -> Self {
        let d = d.max(1);
        if d == 1 {
            return Self {
                d,
                magic: 0,
                shift: 0,
            };
        }
        let l = u64::BITS - (d - 1).leading_zeros();
        let b = DIVIDEND_BITS.max(u64::BITS - l);
        let magic = ((1u128 << (b + l)) / u128::from(d)) as u64 + 1;
        Self {
            d,
            magic,
            shift: b + l - u64::BITS,
        }
    }

    /// `⌊n / d⌋`.
    #[inline(always)]
    pub fn div(&self, n: u64) -> u64 {
        if self.d == 1 {
            n
        } else if n < 1 << DIVIDEND_BITS {
            ((u128::from(n) * u128::from(self.magic)) >> u64::BITS) as u64 >> self.shift
        } else {
            n / self.d
        }
    }

    /// `⌈n / d⌉`.
    #[inline(always)]
    pub fn div_ceil(&self, n: u64) -> u64 {
        let q = self.div(n);
        // `q × d ≤ n`: no overflow.
        q + u64::from(q * self.d != n)
    }
}

/// The divisors of a quota's algorithms, computed once per quota (a store keeps them next to
/// the quota): the token bucket's refill per µs and units per token
/// ([`Quota::refill_units`]), GCRA's emission interval ([`Quota::emission_interval_us`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaDivisors {
    rate: Divisor,
    token: Divisor,
    interval: Divisor,
}

impl QuotaDivisors {
    /// The divisors of `quota`.
    pub fn new(quota: &Quota) -> Self {
        let (rate, token) = quota.refill_units();
        Self {
            rate: Divisor::new(rate),
            token: Divisor::new(token),
            interval: Divisor::new(quota.emission_interval_us()),
        }
    }
}

impl TokenBucket {
    /// [`Limit::decide`](crate::Limit::decide) of `cost` units under a token-bucket limit of
    /// `quota`, on this state directly and in one pass: the refilled deficit computed once, and
    /// no hardware division for dividends below 2^53. `divisors` must be
    /// `QuotaDivisors::new(quota)`. For stores that keep token-bucket states apart from a
    /// [`State`](crate::State).
    ///
    /// ```
    /// use distlimit_core::algorithm::{QuotaDivisors, TokenBucket};
    /// use distlimit_core::Quota;
    ///
    /// # fn main() -> Result<(), distlimit_core::QuotaError> {
    /// let quota = Quota::per_second(1)?;
    /// let divisors = QuotaDivisors::new(&quota);
    /// let mut state = TokenBucket::default();
    /// assert!(state.decide_with(&quota, &divisors, 0, 1).is_allowed());
    /// let denied = state.decide_with(&quota, &divisors, 0, 1);
    /// assert_eq!(denied.retry_after().as_micros(), 1_000_000);
    /// # Ok(()) }
    /// ```
    #[inline(always)]
    pub fn decide_with(
        &mut self,
        quota: &Quota,
        divisors: &QuotaDivisors,
        now: u64,
        cost: u64,
    ) -> Decision {
        let (_, token) = quota.refill_units();
        let burst = quota.burst();
        let deficit = self.deficit_at(quota, now);
        let full = burst.saturating_mul(token);
        let available = divisors.token.div(full.saturating_sub(deficit)).min(burst);
        let wait = self.last_us.saturating_sub(now);
        let rate = &divisors.rate;
        if cost > burst {
            let reset = reset_after(rate, wait, deficit);
            return Decision::from_micros_exact(false, burst, available, reset, u64::MAX);
        }
        let want = cost.max(1);
        if want <= available {
            let spent = deficit.saturating_add(cost.saturating_mul(token));
            if cost > 0 {
                self.deficit = spent;
                self.last_us = self.last_us.max(now);
            }
            let reset = reset_after(rate, wait, spent);
            Decision::from_micros_exact(true, burst, available - cost, reset, 0)
        } else {
            let allowed_deficit = burst.saturating_sub(want).saturating_mul(token);
            let refill = rate.div_ceil(deficit.saturating_sub(allowed_deficit));
            let retry = wait.saturating_add(refill);
            let reset = reset_after(rate, wait, deficit);
            Decision::from_micros_exact(false, burst, available, reset, retry.max(1))
        }
    }

    /// [`State::expires_at`](crate::State::expires_at) of this state under `quota` without a
    /// hardware division: `divisors` must be `QuotaDivisors::new(quota)`. For stores that
    /// derive a state's expiry instead of storing it.
    #[inline]
    pub fn expires_with(&self, divisors: &QuotaDivisors) -> u64 {
        self.last_us
            .saturating_add(divisors.rate.div_ceil(self.deficit))
    }
}

/// `Model::reset_after` of a token bucket with a deficit of `units`, `wait` µs before its
/// refill starts.
#[inline(always)]
fn reset_after(rate: &Divisor, wait: u64, units: u64) -> u64 {
    match rate.div_ceil(units) {
        0 => 0,
        refill => wait.saturating_add(refill),
    }
}

/// A GCRA state read with its quota's divisors: [`Model::available`] without a hardware
/// division.
struct ScaledGcra<'a> {
    state: &'a mut Gcra,
    interval: &'a Divisor,
}

impl Model for ScaledGcra<'_> {
    #[inline(always)]
    fn available(&self, q: &Quota, now: u64) -> u64 {
        match self.state.tat_us.saturating_sub(now) {
            0 => q.burst(),
            debt => q.burst().saturating_sub(self.interval.div_ceil(debt)),
        }
    }

    #[inline(always)]
    fn retry_after(&self, q: &Quota, now: u64, want: u64) -> u64 {
        self.state.retry_after(q, now, want)
    }

    #[inline(always)]
    fn reset_after(&self, q: &Quota, now: u64, extra: u64) -> u64 {
        self.state.reset_after(q, now, extra)
    }

    #[inline(always)]
    fn consume(&mut self, q: &Quota, now: u64, cost: u64) {
        self.state.consume(q, now, cost)
    }

    fn expires_at(&self, q: &Quota) -> u64 {
        self.state.expires_at(q)
    }
}

impl Gcra {
    /// [`decide`](Gcra::decide) without a hardware division: `divisors` must be
    /// `QuotaDivisors::new(quota)`.
    ///
    /// ```
    /// use distlimit_core::algorithm::{Gcra, QuotaDivisors};
    /// use distlimit_core::Quota;
    ///
    /// # fn main() -> Result<(), distlimit_core::QuotaError> {
    /// let quota = Quota::per_second(1)?.with_burst(2)?;
    /// let divisors = QuotaDivisors::new(&quota);
    /// let mut state = Gcra::default();
    /// assert_eq!(state.decide_with(&quota, &divisors, 0, 1).remaining(), 1);
    /// # Ok(()) }
    /// ```
    #[inline(always)]
    pub fn decide_with(
        &mut self,
        quota: &Quota,
        divisors: &QuotaDivisors,
        now: u64,
        cost: u64,
    ) -> Decision {
        let mut scaled = ScaledGcra {
            state: self,
            interval: &divisors.interval,
        };
        super::decide(&mut scaled, quota, quota.burst(), now, cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limit, State};
    use proptest::prelude::*;

    /// Dividends around the multiplication's bound and the divisor's multiples.
    fn dividend() -> impl Strategy<Value = u64> {
        prop_oneof![
            any::<u64>(),
            0u64..1 << 20,
            (1u64 << 53) - (1 << 20)..(1u64 << 53) + (1 << 20),
            0u64..1 << 53,
        ]
    }

    fn divisor() -> impl Strategy<Value = u64> {
        prop_oneof![1u64..100, any::<u64>(), 1u64..1 << 40, Just(86_400_000_000)]
    }

    #[test]
    fn powers_of_two_and_their_neighbours_divide_exactly() {
        for k in 0..64 {
            for d in [(1u64 << k) - 1, 1 << k, (1u64 << k) + 1] {
                let by = Divisor::new(d);
                let d = d.max(1);
                for n in [0, 1, d - 1, d, d + 1, (1 << 53) - 1, 1 << 53, u64::MAX] {
                    assert_eq!(by.div(n), n / d, "{n} / {d}");
                    assert_eq!(by.div_ceil(n), n.div_ceil(d), "⌈{n} / {d}⌉");
                }
            }
        }
    }

    proptest! {
        #[test]
        fn divisors_divide_exactly(d in divisor(), n in dividend(), k in 0u64..4) {
            let by = Divisor::new(d);
            // Multiples of d and their neighbours, where rounding errors would show.
            for n in [n, (n / d).saturating_mul(d).saturating_add(k).saturating_sub(2)] {
                prop_assert_eq!(by.div(n), n / d);
                prop_assert_eq!(by.div_ceil(n), n.div_ceil(d));
            }
        }

        /// The one-pass decisions answer and charge exactly as `Limit::decide`, whatever the
        /// state (debt past a full bucket, `last_us` after now, sizes past 2^53 included).
        #[test]
        fn one_pass_decisions_match_the_model(
            (limit, period, burst) in (1u64..2_000, 1u64..100_000_000_000, 1u64..1_000_000),
            deficit in dividend(),
            last in prop_oneof![0u64..1 << 52, any::<u64>()],
            now in prop_oneof![0u64..1 << 52, any::<u64>()],
            near in any::<bool>(),
            cost in prop_oneof![0u64..4, any::<u64>(), 0u64..2_000_000],
        ) {
            let Ok(quota) = Quota::from_parts(limit, period, burst) else { return Ok(()) };
            let divisors = QuotaDivisors::new(&quota);
            let now = if near { last.saturating_add(now % 10_000_000) } else { now };

            let tb = TokenBucket { deficit, last_us: last };
            let mut state = State::TokenBucket(tb);
            let expected = Limit::token_bucket(quota).decide(&mut state, now, cost);
            prop_assert_eq!(tb.expires_with(&divisors), State::TokenBucket(tb).expires_at(&quota));
            let mut fast = tb;
            prop_assert_eq!(fast.decide_with(&quota, &divisors, now, cost), expected);
            prop_assert_eq!(State::TokenBucket(fast), state);

            let gcra = Gcra { tat_us: deficit };
            let mut state = State::Gcra(gcra);
            let expected = Limit::gcra(quota).decide(&mut state, now, cost);
            let mut fast = gcra;
            prop_assert_eq!(fast.decide_with(&quota, &divisors, now, cost), expected);
            prop_assert_eq!(State::Gcra(fast), state);
        }
    }
}
