//! Example-based tests with concrete numbers: what each algorithm answers, documented by
//! example. Times are µs since the Unix epoch, driven by hand.

// Test helpers outside #[test] functions may unwrap too: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use distlimit_core::algorithm::{SlidingLog, SlidingWindow, TokenBucket};
use distlimit_core::{
    Algorithm, Clock, Decision, Limit, ManualClock, NEVER, Quota, State, UnknownAlgorithm,
};

const SECOND: u64 = 1_000_000;
/// 2023-11-14T22:13:20Z, 20 s past a whole minute.
const T0: u64 = 1_700_000_000_000_000;

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).expect("fits")
}

/// Decides `cost` and returns the decision, for terse tests.
fn at(limit: &Limit, state: &mut State, now: u64, cost: u64) -> Decision {
    limit.decide(state, now, cost)
}

fn peek(limit: &Limit, state: &State, now: u64) -> Decision {
    limit.evaluate(Some(state), now, 0)
}

// ---------------------------------------------------------------------------------------------
// Token bucket
// ---------------------------------------------------------------------------------------------

#[test]
fn token_bucket_burst_then_one_per_second() {
    // 60 per minute, 10 at once.
    let limit = Limit::token_bucket(Quota::per_minute(60).unwrap().with_burst(10).unwrap());
    assert_eq!(limit.capacity(), 10);
    let mut s = State::fresh(limit.algorithm());

    for i in 1..=10 {
        let d = at(&limit, &mut s, T0, 1);
        assert!(d.is_allowed());
        assert_eq!(d.limit(), 10);
        assert_eq!(d.remaining(), 10 - i);
        // Each token takes a second to come back.
        assert_eq!(d.reset_after(), Duration::from_secs(i));
        assert_eq!(d.retry_after(), Duration::ZERO);
    }
    let denied = at(&limit, &mut s, T0, 1);
    assert!(denied.is_denied());
    assert_eq!(denied.remaining(), 0);
    assert_eq!(denied.retry_after(), Duration::from_secs(1));
    assert_eq!(denied.reset_after(), Duration::from_secs(10));

    // One microsecond early: still denied, and told so exactly.
    let early = at(&limit, &mut s, T0 + SECOND - 1, 1);
    assert!(early.is_denied());
    assert_eq!(early.retry_after(), Duration::from_micros(1));

    let d = at(&limit, &mut s, T0 + SECOND, 1);
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);

    // Idle for ten seconds after the last one: full again, and no more than full.
    assert_eq!(peek(&limit, &s, T0 + 11 * SECOND).remaining(), 10);
    assert_eq!(peek(&limit, &s, T0 + 1_000 * SECOND).remaining(), 10);
    assert_eq!(s.expires_at(limit.quota()), T0 + 11 * SECOND);
    assert!(at(&limit, &mut s, T0 + 11 * SECOND, 10).is_allowed());
}

#[test]
fn token_bucket_refills_exactly_without_rounding_loss() {
    // 3 per second: one token every 333 333.3 µs, counted exactly.
    let limit = Limit::token_bucket(Quota::per_second(3).unwrap());
    let mut s = State::fresh(limit.algorithm());
    assert!(at(&limit, &mut s, 0, 3).is_allowed());

    let denied = at(&limit, &mut s, 0, 1);
    assert_eq!(denied.retry_after(), Duration::from_micros(333_334));
    assert!(at(&limit, &mut s.clone(), 333_333, 1).is_denied());
    assert_eq!(peek(&limit, &s, 500_000).remaining(), 1);
    assert_eq!(peek(&limit, &s, 666_666).remaining(), 1);
    assert_eq!(peek(&limit, &s, 666_667).remaining(), 2);
    // Exactly 3 tokens after exactly one second.
    assert_eq!(peek(&limit, &s, 999_999).remaining(), 2);
    assert_eq!(peek(&limit, &s, SECOND).remaining(), 3);
}

#[test]
fn token_bucket_weighted_costs_and_capacity() {
    let limit = Limit::token_bucket(Quota::per_second(10).unwrap().with_burst(5).unwrap());
    let mut s = State::fresh(limit.algorithm());

    // More than the burst can never pass, and changes nothing.
    let never = at(&limit, &mut s, 0, 6);
    assert!(never.is_denied() && never.is_never());
    assert_eq!(never.retry_after(), NEVER);
    assert_eq!(never.remaining(), 5);
    assert_eq!(s, State::fresh(Algorithm::TokenBucket));

    assert_eq!(at(&limit, &mut s, 0, 4).remaining(), 1);
    // 3 more need 2 more tokens: 200 ms at 10 per second.
    let denied = at(&limit, &mut s, 0, 3);
    assert_eq!(denied.remaining(), 1);
    assert_eq!(denied.retry_after(), Duration::from_millis(200));
    assert!(at(&limit, &mut s, 200_000, 3).is_allowed());
}

#[test]
fn token_bucket_deficit_carries_over_a_changed_quota() {
    let small = Limit::token_bucket(Quota::per_minute(60).unwrap().with_burst(10).unwrap());
    let large = Limit::token_bucket(Quota::per_minute(60).unwrap().with_burst(20).unwrap());
    let mut s = State::fresh(Algorithm::TokenBucket);
    assert!(at(&small, &mut s, T0, 10).is_allowed());
    assert_eq!(
        s,
        State::TokenBucket(TokenBucket {
            // 60 per minute: gcd(60, 60 000 000) = 60, so a token is 1 000 000 units.
            deficit: 10 * 1_000_000,
            last_us: T0
        })
    );
    // The larger bucket is missing the same 10 tokens: no fresh bucket for a changed quota.
    assert_eq!(peek(&large, &s, T0).remaining(), 10);
}

#[test]
fn token_bucket_clock_going_back_refills_nothing_and_retry_after_stays_exact() {
    // Regression: retry_after and reset_after ignored that nothing refills before `last_us`.
    let limit = Limit::token_bucket(Quota::per_second(1).unwrap());
    let mut s = State::fresh(limit.algorithm());
    assert!(at(&limit, &mut s, 10 * SECOND, 1).is_allowed());

    // The clock steps back a second: still empty, not refilled.
    let denied = at(&limit, &mut s, 9 * SECOND, 1);
    assert!(denied.is_denied());
    // A second to get back to `last_us`, and a second to refill one token.
    assert_eq!(denied.retry_after(), Duration::from_secs(2));
    assert_eq!(denied.reset_after(), Duration::from_secs(2));
    assert!(at(&limit, &mut s.clone(), 11 * SECOND - 1, 1).is_denied());
    assert!(at(&limit, &mut s.clone(), 11 * SECOND, 1).is_allowed());
    assert_eq!(peek(&limit, &s, 11 * SECOND).remaining(), 1);
}

#[test]
fn token_bucket_per_day_refills_exactly_in_reduced_units() {
    // A million per day: gcd(1 000 000, 86 400 000 000) = 1 000 000, so the bucket counts one
    // unit per µs and 86 400 units per token: one token every 86.4 ms, exactly. (Scaled by the
    // whole period, the full bucket would be 8.64 × 10^16 units, beyond 2^53.)
    let quota = Quota::per_day(1_000_000).unwrap();
    assert_eq!(quota.refill_units(), (1, 86_400));
    let limit = Limit::token_bucket(quota);
    assert_eq!(limit.capacity(), 1_000_000);
    let mut s = State::fresh(limit.algorithm());

    let d = at(&limit, &mut s, T0, 1_000_000);
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
    // A whole day to refill the whole bucket.
    assert_eq!(us(d.reset_after()), 86_400_000_000);
    assert_eq!(
        s,
        State::TokenBucket(TokenBucket {
            deficit: 86_400_000_000,
            last_us: T0
        })
    );
    assert_eq!(s.expires_at(limit.quota()), T0 + 86_400_000_000);

    let denied = at(&limit, &mut s, T0, 1);
    assert_eq!(us(denied.retry_after()), 86_400);
    assert_eq!(peek(&limit, &s, T0 + 86_399).remaining(), 0);
    assert_eq!(peek(&limit, &s, T0 + 86_400).remaining(), 1);
    // No rounding drift: exactly k tokens after k × 86 400 µs, one less a microsecond before.
    for k in [2, 10, 12_345, 500_000, 999_999, 1_000_000] {
        assert_eq!(peek(&limit, &s, T0 + k * 86_400).remaining(), k);
        assert_eq!(peek(&limit, &s, T0 + k * 86_400 - 1).remaining(), k - 1);
    }
    // Half a day: half the bucket.
    assert_eq!(peek(&limit, &s, T0 + 43_200_000_000).remaining(), 500_000);
    let denied = at(&limit, &mut s, T0 + 43_200_000_000, 500_001);
    assert_eq!(us(denied.retry_after()), 86_400);
    assert!(at(&limit, &mut s, T0 + 43_200_086_400, 500_001).is_allowed());
}

#[test]
fn token_bucket_refill_faster_than_one_per_microsecond() {
    // 10^9 per hour: gcd = 200 000 000, so 5 units per µs and 18 units per token: 3.6 µs per
    // token, exactly.
    let quota = Quota::per_hour(1_000_000_000)
        .unwrap()
        .with_burst(10)
        .unwrap();
    assert_eq!(quota.refill_units(), (5, 18));
    let limit = Limit::token_bucket(quota);
    let mut s = State::fresh(limit.algorithm());
    assert!(at(&limit, &mut s, T0, 10).is_allowed());
    // The first token is back after ⌈18 / 5⌉ = 4 µs (3.6 µs, rounded up to whole µs).
    let denied = at(&limit, &mut s, T0, 1);
    assert_eq!(us(denied.retry_after()), 4);
    assert_eq!(peek(&limit, &s, T0 + 3).remaining(), 0);
    assert_eq!(peek(&limit, &s, T0 + 4).remaining(), 1);
    // 5 tokens after 18 µs, 10 after 36 µs; no more than the burst.
    assert_eq!(peek(&limit, &s, T0 + 17).remaining(), 4);
    assert_eq!(peek(&limit, &s, T0 + 18).remaining(), 5);
    assert_eq!(peek(&limit, &s, T0 + 35).remaining(), 9);
    assert_eq!(peek(&limit, &s, T0 + 36).remaining(), 10);
    assert_eq!(s.expires_at(limit.quota()), T0 + 36);
}

// ---------------------------------------------------------------------------------------------
// GCRA
// ---------------------------------------------------------------------------------------------

#[test]
fn gcra_emission_interval_is_rounded_up() {
    // 3 per second: T = ⌈1 000 000 / 3⌉ = 333 334 µs.
    let limit = Limit::gcra(Quota::per_second(3).unwrap());
    let mut s = State::fresh(limit.algorithm());
    for (i, reset) in [(2, 333_334), (1, 666_668), (0, 1_000_002)] {
        let d = at(&limit, &mut s, 0, 1);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), i);
        assert_eq!(us(d.reset_after()), reset);
    }
    assert_eq!(s.expires_at(limit.quota()), 1_000_002);

    let denied = at(&limit, &mut s, 0, 1);
    assert!(denied.is_denied());
    assert_eq!(us(denied.retry_after()), 333_334);
    assert!(at(&limit, &mut s.clone(), 333_333, 1).is_denied());
    assert!(at(&limit, &mut s.clone(), 333_334, 1).is_allowed());

    // Rounding up never admits more than the quota: after one second only 2 are back (the
    // token bucket, exact, would have 3), the third 2 µs later.
    assert_eq!(peek(&limit, &s, SECOND).remaining(), 2);
    assert_eq!(peek(&limit, &s, 1_000_001).remaining(), 2);
    assert_eq!(peek(&limit, &s, 1_000_002).remaining(), 3);
}

#[test]
fn gcra_two_per_second() {
    let limit = Limit::gcra(Quota::per_second(2).unwrap());
    let mut s = State::fresh(limit.algorithm());
    assert!(at(&limit, &mut s, 0, 1).is_allowed());
    assert!(at(&limit, &mut s, 0, 1).is_allowed());
    let denied = at(&limit, &mut s, 0, 1);
    assert_eq!(us(denied.retry_after()), 500_000);
    assert!(at(&limit, &mut s, 500_000, 1).is_allowed());
}

#[test]
fn gcra_burst_one_spaces_requests() {
    // 10 per second, one at a time: one every 100 ms.
    let limit = Limit::gcra(Quota::per_second(10).unwrap().with_burst(1).unwrap());
    assert_eq!(limit.capacity(), 1);
    let mut s = State::fresh(limit.algorithm());
    assert!(at(&limit, &mut s, T0, 1).is_allowed());
    let denied = at(&limit, &mut s, T0 + 50_000, 1);
    assert_eq!(us(denied.retry_after()), 50_000);
    assert!(at(&limit, &mut s, T0 + 2, 2).is_never());
    assert!(at(&limit, &mut s, T0 + 100_000, 1).is_allowed());
}

// ---------------------------------------------------------------------------------------------
// Fixed window
// ---------------------------------------------------------------------------------------------

#[test]
fn fixed_window_aligns_to_the_epoch_and_admits_twice_at_the_edge() {
    // 5 per second; the window [7 s, 8 s) is 300 ms old at 7.3 s.
    let limit = Limit::fixed_window(Quota::per_second(5).unwrap());
    assert_eq!(limit.capacity(), 5);
    let mut s = State::fresh(limit.algorithm());
    for i in (0..5).rev() {
        let d = at(&limit, &mut s, 7_300_000, 1);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), i);
        assert_eq!(us(d.reset_after()), 700_000);
    }
    assert_eq!(s.expires_at(limit.quota()), 8_000_000);
    let denied = at(&limit, &mut s, 7_300_000, 1);
    assert_eq!(us(denied.retry_after()), 700_000);
    let early = at(&limit, &mut s, 7_999_999, 1);
    assert!(early.is_denied());
    assert_eq!(us(early.retry_after()), 1);

    // A new window at 8 s: 5 more, so 10 within 700 001 µs.
    for _ in 0..5 {
        assert!(at(&limit, &mut s, 8_000_000, 1).is_allowed());
    }
    assert!(at(&limit, &mut s, 8_000_000, 1).is_denied());
}

#[test]
fn fixed_window_per_minute_windows_start_at_whole_minutes() {
    // T0 is 20 s past a whole minute: the window ends 40 s later, for every key alike.
    let limit = Limit::fixed_window(Quota::per_minute(2).unwrap());
    let mut a = State::fresh(limit.algorithm());
    let mut b = State::fresh(limit.algorithm());
    assert!(at(&limit, &mut a, T0, 2).is_allowed());
    assert!(at(&limit, &mut b, T0 + 30 * SECOND, 2).is_allowed());
    assert_eq!(
        at(&limit, &mut a, T0, 1).retry_after(),
        Duration::from_secs(40)
    );
    assert_eq!(
        at(&limit, &mut b, T0 + 30 * SECOND, 1).retry_after(),
        Duration::from_secs(10)
    );
    assert_eq!(a.expires_at(limit.quota()), b.expires_at(limit.quota()));
    assert!(at(&limit, &mut a, T0 + 40 * SECOND, 2).is_allowed());
    // More than the limit can never pass.
    assert!(at(&limit, &mut b, T0, 3).is_never());
}

// ---------------------------------------------------------------------------------------------
// Sliding log
// ---------------------------------------------------------------------------------------------

#[test]
fn sliding_log_is_exact() {
    let limit = Limit::sliding_log(Quota::per_second(3).unwrap());
    let mut s = State::fresh(limit.algorithm());
    for t in [0, 100_000, 200_000] {
        assert!(at(&limit, &mut s, t, 1).is_allowed());
    }
    let denied = at(&limit, &mut s, 500_000, 1);
    assert!(denied.is_denied());
    assert_eq!(denied.remaining(), 0);
    // The entry of t = 0 counts in (now − 1 s, now] until now = 1 s.
    assert_eq!(us(denied.retry_after()), 500_000);
    assert_eq!(us(denied.reset_after()), 700_000);
    assert!(at(&limit, &mut s, 999_999, 1).is_denied());
    assert!(at(&limit, &mut s, SECOND, 1).is_allowed());
    assert_eq!(
        s,
        State::SlidingLog(SlidingLog::from_entries([
            (100_000, 1),
            (200_000, 1),
            (SECOND, 1)
        ]))
    );

    // Two units need the two oldest entries gone: the one of 200 ms leaves at 1.2 s.
    let denied = at(&limit, &mut s, 1_050_000, 2);
    assert_eq!(us(denied.retry_after()), 150_000);
    assert!(at(&limit, &mut s, 1_199_999, 2).is_denied());
    assert!(at(&limit, &mut s, 1_200_000, 2).is_allowed());
    assert_eq!(s.expires_at(limit.quota()), 2_200_000);
}

#[test]
fn sliding_log_entries_are_sorted_and_merged() {
    let log = SlidingLog::from_entries([(5, 1), (3, 2), (5, 2), (4, 0), (9, 0)]);
    assert_eq!(log.entries().collect::<Vec<_>>(), vec![(3, 2), (5, 3)]);
    assert_eq!(SlidingLog::from_entries([]).entries().len(), 0);

    // Requests at one instant share one entry.
    let limit = Limit::sliding_log(Quota::per_second(10).unwrap());
    let mut s = State::fresh(limit.algorithm());
    for _ in 0..4 {
        assert!(at(&limit, &mut s, 42, 2).is_allowed());
    }
    assert_eq!(s, State::SlidingLog(SlidingLog::from_entries([(42, 8)])));
}

// ---------------------------------------------------------------------------------------------
// Sliding window counter
// ---------------------------------------------------------------------------------------------

#[test]
fn sliding_window_weights_the_previous_window() {
    // 10 per second. 8 in the window [0, 1 s); at 1.25 s the previous window still overlaps
    // the last second by 75 %: 8 × 0.75 = 6 count, so 4 remain.
    let limit = Limit::sliding_window(Quota::per_second(10).unwrap());
    let mut s = State::fresh(limit.algorithm());
    assert!(at(&limit, &mut s, 500_000, 8).is_allowed());
    assert_eq!(peek(&limit, &s, 1_250_000).remaining(), 4);

    let d = at(&limit, &mut s, 1_250_000, 4);
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
    // Back to full once both windows are over: 3 s − 1.25 s.
    assert_eq!(us(d.reset_after()), 1_750_000);
    assert_eq!(
        s,
        State::SlidingWindow(SlidingWindow {
            start_us: SECOND,
            previous: 8,
            current: 4
        })
    );
    assert_eq!(s.expires_at(limit.quota()), 3 * SECOND);

    // One more passes when 8 × (1 s − elapsed) / 1 s + 4 + 1 ≤ 10: elapsed ≥ 375 ms.
    let denied = at(&limit, &mut s, 1_250_000, 1);
    assert_eq!(us(denied.retry_after()), 125_000);
    assert!(at(&limit, &mut s, 1_374_999, 1).is_denied());
    assert!(at(&limit, &mut s, 1_375_000, 1).is_allowed());
}

#[test]
fn sliding_window_is_an_approximation_within_twice_the_limit() {
    // 10 per second: 10 at the very end of one window, then the weight of those 10 halves by
    // the middle of the next, so 5 more pass: 15 within 500 001 µs, more than the limit in a
    // sliding second (the sliding log would admit none) but within 2 × limit.
    let limit = Limit::sliding_window(Quota::per_second(10).unwrap());
    let mut s = State::fresh(limit.algorithm());
    assert!(at(&limit, &mut s, 999_999, 10).is_allowed());
    assert!(at(&limit, &mut s, SECOND, 1).is_denied());
    assert_eq!(peek(&limit, &s, 1_500_000).remaining(), 5);
    assert!(at(&limit, &mut s, 1_500_000, 5).is_allowed());
    assert!(at(&limit, &mut s, 1_500_000, 1).is_denied());

    let log = Limit::sliding_log(Quota::per_second(10).unwrap());
    let mut l = State::fresh(log.algorithm());
    assert!(at(&log, &mut l, 999_999, 10).is_allowed());
    assert_eq!(peek(&log, &l, 1_500_000).remaining(), 0);
}

#[test]
fn sliding_window_clock_going_back_keeps_retry_after_exact() {
    // Regression: retry_after counted the remaining weight from `now` instead of from the
    // window start when the clock had stepped back before it.
    let limit = Limit::sliding_window(Quota::new(3, Duration::from_micros(10)).unwrap());
    let mut s = State::fresh(limit.algorithm());
    assert!(at(&limit, &mut s, 5, 3).is_allowed());
    assert!(at(&limit, &mut s, 18, 1).is_allowed());
    assert_eq!(
        s,
        State::SlidingWindow(SlidingWindow {
            start_us: 10,
            previous: 3,
            current: 1
        })
    );
    // Back to 5 µs, before the window of 10 µs: weighted as at its start, so denied...
    let denied = at(&limit, &mut s, 5, 1);
    assert!(denied.is_denied());
    // ...until 3 × (10 − elapsed) ≤ (3 − 1 − 1) × 10, elapsed ≥ 7: at 17 µs, 12 µs from now.
    assert_eq!(us(denied.retry_after()), 12);
    assert!(at(&limit, &mut s.clone(), 16, 1).is_denied());
    assert!(at(&limit, &mut s.clone(), 17, 1).is_allowed());
}

#[test]
fn sliding_window_per_hour_weighs_in_granules() {
    // An hour is longer than 2^20 µs: the previous window is weighed in granules of
    // gr = ⌈3 600 000 000 / 2^20⌉ = 3 434 µs, steps = ⌈3 600 000 000 / 3 434⌉ = 1 048 341 per
    // window. At e µs into the window the previous one weighs w = ⌈(3 600 000 000 − e) / 3 434⌉
    // steps.
    let quota = Quota::per_hour(1_000).unwrap();
    assert_eq!(quota.window_granule(), (3_434, 1_048_341));
    let limit = Limit::sliding_window(quota);
    let hour = 3_600 * SECOND;
    // The first whole hour after T0.
    let h = (T0 / hour + 1) * hour;
    let mut s = State::fresh(limit.algorithm());
    assert!(at(&limit, &mut s, h - 1, 1_000).is_allowed());
    assert_eq!(
        s,
        State::SlidingWindow(SlidingWindow {
            start_us: h - hour,
            previous: 0,
            current: 1_000
        })
    );

    // At the start of the next hour the previous one weighs fully (w = steps)...
    assert_eq!(peek(&limit, &s, h).remaining(), 0);
    // ...and still does through the first granule, which is short: w drops to steps − 1 when
    // 3 600 000 000 − e ≤ 1 048 340 × 3 434 = 3 599 999 560, at e = 440.
    assert_eq!(peek(&limit, &s, h + 439).remaining(), 0);
    assert_eq!(peek(&limit, &s, h + 440).remaining(), 0);

    // A quarter hour in: w = ⌈2 700 000 000 / 3 434⌉ = 786 256, slightly above a quarter of the
    // steps, so ⌊1 000 × (1 048 341 − 786 256) / 1 048 341⌋ = 249 remain (per-µs weighting
    // would give 250).
    let quarter = h + 900 * SECOND;
    assert_eq!(peek(&limit, &s, quarter).remaining(), 249);
    // 250 pass once 1 000 × w ≤ 750 × 1 048 341, w ≤ X = 786 255: once
    // 3 600 000 000 − e ≤ 786 255 × 3 434 = 2 699 999 670, e ≥ 900 000 330. So 330 µs later
    // than per-µs weighting, always within one granule.
    let denied = at(&limit, &mut s, quarter, 250);
    assert!(denied.is_denied());
    assert_eq!(denied.remaining(), 249);
    assert_eq!(us(denied.retry_after()), 330);
    assert!(at(&limit, &mut s.clone(), quarter + 329, 250).is_denied());
    // The weight is constant within a granule: 250 from e = 900 000 330 to 900 003 763.
    assert_eq!(peek(&limit, &s, quarter + 330).remaining(), 250);
    assert_eq!(peek(&limit, &s, quarter + 330 + 3_433).remaining(), 250);
    // 251 need w ≤ ⌊749 × 1 048 341 / 1 000⌋ = 785 207: e ≥ 3 600 000 000 − 785 207 × 3 434
    // = 903 599 162.
    assert_eq!(
        us(at(&limit, &mut s, quarter, 251).retry_after()),
        3_599_162
    );
    assert_eq!(peek(&limit, &s, h + 903_599_161).remaining(), 250);
    assert_eq!(peek(&limit, &s, h + 903_599_162).remaining(), 251);

    let d = at(&limit, &mut s, quarter + 330, 250);
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
    assert_eq!(us(d.reset_after()), 2 * hour - 900_000_330);

    // In the last granule the previous hour weighs a single step: 1 000 / 1 048 341 < 1, so
    // with 250 in the current hour, 749 remain, until the window after.
    assert_eq!(peek(&limit, &s, h + hour - 1).remaining(), 749);
    assert_eq!(peek(&limit, &s, h + hour - 3_434).remaining(), 749);
    // In the next hour the 250 weigh in: ⌊1 000 − 250 × w / 1 048 341⌋ at its start is 750.
    assert_eq!(peek(&limit, &s, h + hour).remaining(), 750);
}

#[test]
fn sliding_window_up_to_2_pow_20_us_is_weighted_per_microsecond() {
    // 2^20 µs has granule 1: the weight drops every microsecond.
    let quota = Quota::from_parts(1 << 20, 1 << 20, 1 << 20).unwrap();
    assert_eq!(quota.window_granule(), (1, 1 << 20));
    // One microsecond more: granule 2, 2^19 + 1 steps.
    let longer = Quota::from_parts(1 << 20, (1 << 20) + 1, 1 << 20).unwrap();
    assert_eq!(longer.window_granule(), (2, (1 << 19) + 1));
    let limit = Limit::sliding_window(quota);
    let mut s = State::fresh(limit.algorithm());
    let period = 1u64 << 20;
    assert!(at(&limit, &mut s, period - 1, period).is_allowed());
    // At e µs into the next window, ⌊2^20 × e / 2^20⌋ = e are free.
    for e in [0, 1, 2, 3, 1_000, period - 1] {
        assert_eq!(peek(&limit, &s, period + e).remaining(), e);
    }
}

// ---------------------------------------------------------------------------------------------
// Common behaviour
// ---------------------------------------------------------------------------------------------

#[test]
fn fresh_states_expire_at_zero_and_peeks_change_nothing() {
    let quota = Quota::per_minute(100).unwrap().with_burst(10).unwrap();
    for algorithm in Algorithm::ALL {
        let limit = Limit::new(algorithm, quota);
        let fresh = State::fresh(algorithm);
        assert_eq!(fresh.algorithm(), algorithm);
        assert_eq!(fresh.expires_at(&quota), 0, "{algorithm}");
        let mut s = fresh.clone();
        let d = limit.decide(&mut s, T0, 0);
        assert!(d.is_allowed(), "{algorithm}");
        assert_eq!(d.remaining(), limit.capacity(), "{algorithm}");
        assert_eq!(d.reset_after(), Duration::ZERO, "{algorithm}");
        assert_eq!(s, fresh, "{algorithm}");
        assert_eq!(limit.evaluate(None, T0, 0), d, "{algorithm}");
    }
}

#[test]
fn capacity_is_burst_or_limit() {
    let quota = Quota::per_minute(100).unwrap().with_burst(10).unwrap();
    assert_eq!(Limit::token_bucket(quota).capacity(), 10);
    assert_eq!(Limit::gcra(quota).capacity(), 10);
    assert_eq!(Limit::fixed_window(quota).capacity(), 100);
    assert_eq!(Limit::sliding_log(quota).capacity(), 100);
    assert_eq!(Limit::sliding_window(quota).capacity(), 100);
    for algorithm in Algorithm::ALL {
        let limit = Limit::new(algorithm, quota);
        assert_eq!(limit.algorithm(), algorithm);
        assert_eq!(limit.quota(), &quota);
        let d = limit.evaluate(None, T0, limit.capacity() + 1);
        assert!(d.is_never(), "{algorithm}");
        assert_eq!(d.retry_after(), NEVER);
        assert!(limit.evaluate(None, T0, limit.capacity()).is_allowed());
    }
    assert_eq!(
        Limit::token_bucket(quota).algorithm(),
        Algorithm::TokenBucket
    );
    assert_eq!(Limit::gcra(quota).algorithm(), Algorithm::Gcra);
    assert_eq!(
        Limit::fixed_window(quota).algorithm(),
        Algorithm::FixedWindow
    );
    assert_eq!(Limit::sliding_log(quota).algorithm(), Algorithm::SlidingLog);
    assert_eq!(
        Limit::sliding_window(quota).algorithm(),
        Algorithm::SlidingWindow
    );
}

#[test]
fn a_state_of_another_algorithm_is_replaced_by_a_fresh_one() {
    let quota = Quota::per_second(5).unwrap();
    let tb = Limit::token_bucket(quota);
    let gcra = Limit::gcra(quota);
    let mut s = State::fresh(Algorithm::TokenBucket);
    assert!(tb.decide(&mut s, 0, 5).is_allowed());
    // GCRA sees a fresh key, and takes the state over.
    let d = gcra.decide(&mut s, 0, 5);
    assert!(d.is_allowed());
    assert_eq!(s.algorithm(), Algorithm::Gcra);
    assert_eq!(s.expires_at(&quota), 1_000_000);
}

#[test]
fn a_manual_clock_drives_a_limit() {
    let clock = ManualClock::new(T0);
    let limit = Limit::gcra(Quota::per_minute(1).unwrap());
    let mut s = State::fresh(limit.algorithm());
    assert!(limit.decide(&mut s, clock.now_us(), 1).is_allowed());
    let denied = limit.decide(&mut s, clock.now_us(), 1);
    clock.advance(denied.retry_after());
    assert_eq!(clock.now_us(), T0 + 60 * SECOND);
    assert!(limit.decide(&mut s, clock.now_us(), 1).is_allowed());
    clock.set_us(T0);
    assert!(limit.decide(&mut s, clock.now_us(), 0).is_denied());
}

#[test]
fn arbitrary_states_at_the_end_of_time_do_not_panic() {
    // Regression: the sliding window's retry_after overflowed (a debug panic) on a stored window
    // start near u64::MAX.
    let limit = Limit::sliding_window(Quota::per_second(1).unwrap());
    let mut s = State::SlidingWindow(SlidingWindow {
        start_us: u64::MAX,
        previous: 0,
        current: 1,
    });
    assert!(limit.decide(&mut s, 0, 1).is_denied());
    for algorithm in Algorithm::ALL {
        let limit = Limit::new(algorithm, Quota::from_parts(1, 1 << 50, 1).unwrap());
        let mut s = State::fresh(algorithm);
        assert!(
            limit.decide(&mut s, u64::MAX, 1).is_allowed(),
            "{algorithm}"
        );
        let _ = limit.decide(&mut s, 0, 1);
        let _ = limit.decide(&mut s, u64::MAX, u64::MAX);
        let _ = s.expires_at(limit.quota());
    }
}

// ---------------------------------------------------------------------------------------------
// Algorithm names
// ---------------------------------------------------------------------------------------------

#[test]
fn algorithm_names_round_trip() {
    let names = [
        (Algorithm::TokenBucket, "token_bucket"),
        (Algorithm::Gcra, "gcra"),
        (Algorithm::FixedWindow, "fixed_window"),
        (Algorithm::SlidingLog, "sliding_log"),
        (Algorithm::SlidingWindow, "sliding_window"),
    ];
    assert_eq!(names.map(|(a, _)| a), Algorithm::ALL);
    for (algorithm, name) in names {
        assert_eq!(algorithm.name(), name);
        assert_eq!(algorithm.to_string(), name);
        assert_eq!(name.parse::<Algorithm>(), Ok(algorithm));
        assert_eq!(algorithm.to_string().parse::<Algorithm>(), Ok(algorithm));
    }
    assert_eq!(Algorithm::default(), Algorithm::TokenBucket);
}

#[test]
fn unknown_algorithm_names_are_rejected() {
    for name in [
        "",
        "Gcra",
        "GCRA",
        "token-bucket",
        "tokenbucket",
        " gcra",
        "gcra ",
        "sliding_window_counter",
        "leaky_bucket",
    ] {
        let err = name.parse::<Algorithm>().unwrap_err();
        assert_eq!(err, UnknownAlgorithm(name.to_owned()));
        let message = err.to_string();
        assert!(message.contains(&format!("{name:?}")), "{message}");
        assert!(message.contains("token_bucket") && message.contains("sliding_window"));
    }
}

// ---------------------------------------------------------------------------------------------
// Decisions
// ---------------------------------------------------------------------------------------------

#[test]
fn decision_constructors() {
    let a = Decision::allowed(10, 3, Duration::from_secs(2));
    assert!(a.is_allowed() && !a.is_denied() && !a.is_never());
    assert_eq!((a.limit(), a.remaining()), (10, 3));
    assert_eq!(a.reset_after(), Duration::from_secs(2));
    assert_eq!(a.retry_after(), Duration::ZERO);

    let d = Decision::denied(10, 0, Duration::from_secs(2), Duration::from_millis(5));
    assert!(d.is_denied() && !d.is_never());
    assert_eq!(d.retry_after(), Duration::from_millis(5));

    // Anything beyond u64 µs saturates to NEVER.
    let n = Decision::denied(10, 0, Duration::MAX, Duration::MAX);
    assert!(n.is_never());
    assert_eq!(n.retry_after(), NEVER);
    assert_eq!(n.reset_after(), NEVER);
}

#[test]
fn most_restrictive_of_tiers() {
    // Per second 10 (3 left) and per minute 100 (40 left, denied later).
    let second = Decision::allowed(10, 3, Duration::from_millis(700));
    let minute = Decision::allowed(100, 40, Duration::from_secs(36));
    let folded = Decision::most_restrictive([&second, &minute]).unwrap();
    assert!(folded.is_allowed());
    assert_eq!((folded.limit(), folded.remaining()), (10, 3));
    assert_eq!(folded.reset_after(), Duration::from_secs(36));

    let hour = Decision::denied(1_000, 0, Duration::from_secs(3_000), Duration::from_secs(4));
    let folded = Decision::most_restrictive([&second, &minute, &hour]).unwrap();
    assert!(folded.is_denied());
    assert_eq!((folded.limit(), folded.remaining()), (1_000, 0));
    assert_eq!(folded.retry_after(), Duration::from_secs(4));
    assert_eq!(folded.reset_after(), Duration::from_secs(3_000));

    let never = Decision::denied(5, 5, Duration::ZERO, NEVER);
    assert!(
        Decision::most_restrictive([&second, &never])
            .unwrap()
            .is_never()
    );
    assert_eq!(Decision::most_restrictive(std::iter::empty()), None);
    assert_eq!(Decision::most_restrictive(&[]), None);
}
