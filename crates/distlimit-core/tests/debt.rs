//! Property tests of forced charges ([`Limit::force`]) and settling for the token bucket and
//! GCRA:
//!
//! 1. conservation: reserve/settle/report sequences at one instant charge exactly the sum of the
//!    actual costs (the token bucket's deficit, GCRA's arrival time), debt included;
//! 2. a key in debt is denied exactly until its debt has refilled and one unit with it: at
//!    `now + retry_after` one unit passes, a microsecond earlier it does not;
//! 3. settling below the estimate gives back exactly the difference, and a give-back never
//!    raises a key above its capacity;
//! 4. reserve `r` then settle to `a` ends where a forced charge of `a` ends;
//! 5. forced charges saturate at `MAX_DEFICIT` / `MAX_TAT`, never wrap;
//! 6. the window algorithms answer `DebtUnsupported` and change nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use distlimit_core::{
    Algorithm, DebtUnsupported, Key, Limit, MAX_DEFICIT, MAX_REPORT, MAX_TAT, Quota, Request,
    Settle, State, validate_settles,
};
use proptest::prelude::*;

fn quota() -> impl Strategy<Value = Quota> {
    (
        1u64..=50,
        prop::sample::select(vec![1_000u64, 7_000, 1_000_000, 3_600_000_000]),
        1u64..=60,
    )
        .prop_map(|(limit, period, burst)| Quota::from_parts(limit, period, burst).unwrap())
}

fn limit() -> impl Strategy<Value = Limit> {
    (quota(), prop::bool::ANY).prop_map(|(q, gcra)| {
        if gcra {
            Limit::gcra(q)
        } else {
            Limit::token_bucket(q)
        }
    })
}

/// What the state has charged at `now`, in the algorithm's own units: the token bucket's
/// deficit (units of `1 / P'`), GCRA's `tat − now` (µs).
fn charged(state: &State, limit: &Limit, now: u64) -> u128 {
    match state {
        State::TokenBucket(s) => {
            assert!(s.last_us <= now);
            let (rate, _) = limit.quota().refill_units();
            u128::from(s.deficit.saturating_sub((now - s.last_us) * rate))
        }
        State::Gcra(s) => u128::from(s.tat_us.saturating_sub(now)),
        _ => 0,
    }
}

/// One unit of cost in the algorithm's own units.
fn unit(limit: &Limit) -> u128 {
    match limit.algorithm() {
        Algorithm::Gcra => u128::from(limit.quota().emission_interval_us()),
        _ => u128::from(limit.quota().refill_units().1),
    }
}

/// A step: reserve `estimate` and settle to `actual`, or report `actual` alone.
#[derive(Clone, Copy, Debug)]
enum Step {
    Reserve { estimate: u64, actual: u64 },
    Report { actual: u64 },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            (0u64..=70, 0u64..=200)
                .prop_map(|(estimate, actual)| Step::Reserve { estimate, actual }),
            (0u64..=200).prop_map(|actual| Step::Report { actual }),
        ],
        1..30,
    )
}

/// Runs `step` at `now`: the units actually charged.
fn run(limit: &Limit, state: &mut State, now: u64, step: Step) -> u64 {
    match step {
        Step::Reserve { estimate, actual } => {
            if !limit.decide(state, now, estimate).is_allowed() {
                return 0;
            }
            if actual < estimate {
                limit.give_back(state, now, estimate - actual).unwrap();
            } else {
                limit.force(state, now, actual - estimate).unwrap();
            }
            actual
        }
        Step::Report { actual } => {
            limit.force(state, now, actual).unwrap();
            actual
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// 1. At one instant, what the state charged is exactly the sum of the actual costs.
    #[test]
    fn charges_are_the_sum_of_the_actual_costs(limit in limit(), steps in steps()) {
        let now = 1_000_000_000;
        let mut state = State::fresh(limit.algorithm());
        let mut total = 0u128;
        for step in steps {
            total += u128::from(run(&limit, &mut state, now, step));
            prop_assert_eq!(charged(&state, &limit, now), total * unit(&limit));
        }
    }

    /// 2. A key in debt is denied exactly until its debt and one unit have refilled, with time
    /// passing between the steps.
    #[test]
    fn debt_is_waited_out_exactly(
        limit in limit(),
        steps in prop::collection::vec((steps(), 0u64..5_000_000), 1..4),
    ) {
        let mut now = 1_000_000_000;
        let mut state = State::fresh(limit.algorithm());
        for (steps, advance) in steps {
            now += advance;
            for step in steps {
                run(&limit, &mut state, now, step);
            }
            let peek = limit.evaluate(Some(&state), now, 0);
            if peek.is_denied() {
                let at = now + peek.retry_after_us();
                prop_assert!(limit.evaluate(Some(&state), at - 1, 1).is_denied());
                prop_assert!(limit.evaluate(Some(&state), at, 1).is_allowed());
                // The debt is in the state: the units available are 0 all along.
                prop_assert_eq!(peek.remaining(), 0);
            }
            // A forced charge answers the peek after it.
            let mut forced = state.clone();
            let answer = limit.force(&mut forced, now, 0).unwrap();
            prop_assert_eq!(answer, peek);
        }
    }

    /// 3. Settling below the estimate gives back exactly the difference; a give-back never
    /// raises a key above its capacity.
    #[test]
    fn give_backs_return_the_difference_and_never_more(
        limit in limit(),
        estimate in 1u64..=60,
        actual in 0u64..=60,
        extra in 0u64..1_000,
    ) {
        let now = 1_000_000_000;
        let estimate = estimate.min(limit.capacity());
        let actual = actual.min(estimate);
        let mut state = State::fresh(limit.algorithm());
        let before = limit.evaluate(Some(&state), now, 0).remaining();
        prop_assert!(limit.decide(&mut state, now, estimate).is_allowed());
        let after = limit.give_back(&mut state, now, estimate - actual).map(|()| {
            limit.evaluate(Some(&state), now, 0).remaining()
        }).unwrap();
        prop_assert_eq!(before - after, actual);
        limit.give_back(&mut state, now, extra).unwrap();
        prop_assert!(limit.evaluate(Some(&state), now, 0).remaining() <= limit.capacity());
        prop_assert!(charged(&state, &limit, now) <= u128::from(limit.capacity()) * unit(&limit));
    }

    /// 4. Reserve then settle ends where a forced charge of the actual cost ends.
    #[test]
    fn reserve_then_settle_is_a_forced_charge(
        limit in limit(),
        warm in prop::collection::vec(0u64..100, 0..5),
        estimate in 0u64..=60,
        actual in 0u64..=200,
    ) {
        let now = 1_000_000_000;
        let mut state = State::fresh(limit.algorithm());
        for cost in warm {
            limit.force(&mut state, now, cost).unwrap();
        }
        let mut forced = state.clone();
        limit.force(&mut forced, now, actual).unwrap();
        let mut settled = state.clone();
        if run(&limit, &mut settled, now, Step::Reserve { estimate, actual }) == actual {
            // The same units charged and the same answer from here on; the raw states may
            // differ in bookkeeping alone (a full bucket's instant, when nothing was charged).
            prop_assert_eq!(charged(&settled, &limit, now), charged(&forced, &limit, now));
            for later in [now, now + 1, now + 1_000_000] {
                prop_assert_eq!(
                    limit.evaluate(Some(&settled), later, 1),
                    limit.evaluate(Some(&forced), later, 1)
                );
            }
        }
    }
}

/// 5. Forced charges saturate at the documented bounds.
#[test]
fn forced_charges_saturate_below_2_pow_53() {
    let quota = Quota::per_second(1).unwrap();
    let now = 1_700_000_000_000_000;
    let tb = Limit::token_bucket(quota);
    let mut state = State::fresh(tb.algorithm());
    tb.force(&mut state, now, MAX_REPORT).unwrap();
    tb.force(&mut state, now, MAX_REPORT).unwrap();
    assert_eq!(
        state,
        State::TokenBucket(distlimit_core::algorithm::TokenBucket {
            deficit: MAX_DEFICIT,
            last_us: now
        })
    );
    let gcra = Limit::gcra(quota);
    let mut state = State::fresh(gcra.algorithm());
    let d = gcra.force(&mut state, now, MAX_REPORT).unwrap();
    assert_eq!(
        state,
        State::Gcra(distlimit_core::algorithm::Gcra { tat_us: MAX_TAT })
    );
    assert_eq!(d.retry_after_us(), MAX_TAT - now);
}

/// 6. The window algorithms refuse, changing nothing; batches refuse them and mixes.
#[test]
fn windows_refuse_debt() {
    let quota = Quota::per_second(5).unwrap();
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
    ] {
        let limit = Limit::new(algorithm, quota);
        let mut state = State::fresh(algorithm);
        let before = state.clone();
        assert_eq!(
            limit.force(&mut state, 1, 3),
            Err(DebtUnsupported(algorithm))
        );
        assert_eq!(state, before);
        let key = Key::new("k").unwrap();
        let request = Request::new(key, limit);
        assert!(validate_settles(&[Settle::Report(request)]).is_err());
        assert!(validate_settles(&[Settle::GiveBack(request)]).is_err());
    }
    let limit = Limit::gcra(quota);
    let (a, b) = (Key::new("a").unwrap(), Key::new("b").unwrap());
    let (a, b) = (Request::new(a, limit), Request::new(b, limit));
    assert!(validate_settles(&[Settle::GiveBack(a), Settle::Report(b)]).is_ok());
    assert!(validate_settles(&[Settle::GiveBack(a), Settle::Report(a)]).is_err());
    assert!(validate_settles(&[Settle::Report(a.with_cost(MAX_REPORT + 1))]).is_err());
}
