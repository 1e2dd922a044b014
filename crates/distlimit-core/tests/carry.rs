//! Carry-over of spent units across a quota change (`State::carried`, `Limit::decide_from`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use distlimit_core::{Algorithm, Limit, Quota, State};
use proptest::prelude::*;

fn quota_strategy() -> impl Strategy<Value = Quota> {
    (
        prop_oneof![1u64..=10, 1u64..=1_000],
        prop_oneof![
            Just(1_000_000u64),
            Just(60_000_000),
            Just(3_600_000_000),
            1u64..=5_000_000
        ],
        1u64..=200,
    )
        .prop_filter_map("a valid quota", |(l, p, b)| Quota::from_parts(l, p, b).ok())
}

/// Units the limit counts as spent at `now` (capacity minus available).
fn spent(limit: &Limit, state: &State, now: u64) -> u64 {
    limit.capacity() - limit.evaluate(Some(state), now, 0).remaining()
}

const NOW0: u64 = 1_700_000_000_000_000;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// What a key had spent under the old quota it has spent under the new one, capped at the
    /// new capacity; lowering never hands out a fresh bucket; the carried state is kept even
    /// when the request is denied.
    #[test]
    fn spent_units_carry_over_capped(
        algorithm in prop_oneof![
            Just(Algorithm::TokenBucket), Just(Algorithm::Gcra),
            Just(Algorithm::FixedWindow), Just(Algorithm::SlidingWindow)
        ],
        old in quota_strategy(),
        new in quota_strategy(),
        costs in prop::collection::vec((0u64..50_000_000, 1u64..20), 0..8),
        gap in 0u64..5_000_000_000,
    ) {
        let (lo, ln) = (Limit::new(algorithm, old), Limit::new(algorithm, new));
        let mut state = State::fresh(algorithm);
        let mut now = NOW0;
        for (advance, cost) in costs {
            now += advance;
            lo.decide(&mut state, now, cost.min(lo.capacity()));
        }
        now += gap;
        let before = spent(&lo, &state, now);
        let carried_spent = before.min(ln.capacity());
        let peek = ln.evaluate_from(Some(&state), Some(&old), now, 0);
        prop_assert_eq!(peek.remaining(), ln.capacity() - carried_spent);
        if before > 0 {
            prop_assert!(peek.remaining() < ln.capacity(), "a fresh bucket after a change");
        }
        // A denied request keeps the carried state; an admitted one charges it.
        let mut decided = state.clone();
        let mut written = Some(old);
        let cost = ln.capacity();
        let d = ln.decide_from(&mut decided, &mut written, now, cost);
        let carried = state.carried(&old, &new, now);
        prop_assert_eq!(written, Some(new));
        if d.is_denied() {
            prop_assert_eq!(&decided, &carried);
        }
        prop_assert_eq!(d, ln.evaluate(Some(&carried), now, cost));
        // The same quota converts nothing.
        prop_assert_eq!(state.carried(&old, &old, now), state);
    }

    /// Token bucket and GCRA: after the change the key refills at the new rate, exactly as a
    /// fresh new-quota key charged the carried units at that instant.
    #[test]
    fn buckets_refill_at_the_new_rate(
        algorithm in prop_oneof![Just(Algorithm::TokenBucket), Just(Algorithm::Gcra)],
        old in quota_strategy(),
        new in quota_strategy(),
        spend in 1u64..200,
        gap in 0u64..5_000_000_000,
        want in 1u64..200,
    ) {
        // An unchanged quota converts nothing: the state keeps its partial refill
        // (checked in `spent_units_carry_over_capped`), so it is no fresh key charged whole units.
        prop_assume!(old != new);
        let (lo, ln) = (Limit::new(algorithm, old), Limit::new(algorithm, new));
        let mut state = State::fresh(algorithm);
        lo.decide(&mut state, NOW0, spend.min(lo.capacity()));
        let now = NOW0 + gap;
        let units = spent(&lo, &state, now).min(ln.capacity());
        let mut twin = State::fresh(algorithm);
        ln.decide(&mut twin, now, units);
        let want = want.min(ln.capacity());
        prop_assert_eq!(
            ln.evaluate_from(Some(&state), Some(&old), now, want),
            ln.evaluate(Some(&twin), now, want)
        );
    }
}

/// The case: 1 per hour spent and denied, then 60 per minute with a burst of 100.
#[test]
fn raising_one_per_hour_admits_the_denied_key_at_once() {
    let old = Quota::per_hour(1).unwrap();
    let new = Quota::per_minute(60).unwrap().with_burst(100).unwrap();
    for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let (lo, ln) = (Limit::new(algorithm, old), Limit::new(algorithm, new));
        let mut state = State::fresh(algorithm);
        assert!(lo.decide(&mut state, NOW0, 1).is_allowed());
        assert!(lo.decide(&mut state, NOW0 + 1, 1).is_denied());
        // Read under the new quota without the stamp: today's hour-long denial.
        assert!(
            ln.evaluate(Some(&state), NOW0 + 2, 1).is_denied(),
            "{algorithm}"
        );
        let d = ln.decide_from(&mut state, &mut Some(old), NOW0 + 2, 1);
        assert!(d.is_allowed(), "{algorithm}");
        assert_eq!(d.remaining(), 98, "{algorithm}");
    }
}

/// Lowering 60/min to 1/h after 50 spent: capped to the one unit, denied for the hour, even
/// for a key that keeps asking (the conversion is kept on denial).
#[test]
fn lowering_never_refreshes_even_under_repeated_denials() {
    let old = Quota::per_minute(60).unwrap().with_burst(100).unwrap();
    let new = Quota::per_hour(1).unwrap();
    for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let (lo, ln) = (Limit::new(algorithm, old), Limit::new(algorithm, new));
        let mut state = State::fresh(algorithm);
        assert!(lo.decide(&mut state, NOW0, 50).is_allowed());
        let mut written = Some(old);
        for s in 1..200u64 {
            let d = ln.decide_from(&mut state, &mut written, NOW0 + s * 1_000_000, 1);
            assert!(d.is_denied(), "{algorithm} at {s} s");
            assert_eq!(written, Some(new));
        }
    }
}
