//! Property tests of the lease model ([`Limit::take`], [`Limit::give_back`]) for the token
//! bucket and GCRA:
//!
//! 1. a take never grants more than was available (a peek's `remaining`) nor more than asked;
//! 2. `take(k)` then `give_back(k)` at the same instant leaves a state that decides exactly like
//!    the one before, at that instant and after, also when the limit changed in between;
//! 3. giving back never raises a key above its capacity;
//! 4. clients holding leases (taken, spent locally, the rest given back when the lease ends)
//!    never spend more, in total, than the algorithm admits from a fresh key;
//! 5. the window algorithms answer `LeaseUnsupported` and change nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use distlimit_core::{Algorithm, LeaseUnsupported, Limit, Quota, State};
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

/// A state reached by a few random decisions, so tests start from partly spent keys.
fn warmed(limit: &Limit, costs: &[(u64, u64)]) -> (State, u64) {
    let mut state = State::fresh(limit.algorithm());
    let mut now = 1_000_000_000;
    for &(advance, cost) in costs {
        now += advance;
        limit.decide(&mut state, now, cost % (limit.capacity() + 1));
    }
    (state, now)
}

/// The admitted-cost bound of a fresh key over `elapsed` µs.
fn bound(limit: &Limit, elapsed: u64) -> u64 {
    let q = limit.quota();
    match limit.algorithm() {
        Algorithm::Gcra => q.burst() + elapsed / q.emission_interval_us(),
        _ => {
            let (rate, token) = q.refill_units();
            q.burst() + (elapsed as u128 * rate as u128 / token as u128) as u64
        }
    }
}

/// Whether two states decide alike now and later, for every cost up to the capacity.
fn alike(limit: &Limit, a: &State, b: &State, now: u64) -> Result<(), TestCaseError> {
    let period = limit.quota().period_us();
    for t in [
        now,
        now + 1,
        now + period / 3,
        now + period,
        now + 5 * period,
    ] {
        for cost in [0, 1, limit.capacity() / 2, limit.capacity()] {
            prop_assert_eq!(
                limit.evaluate(Some(a), t, cost),
                limit.evaluate(Some(b), t, cost),
                "at +{} cost {}",
                t - now,
                cost
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn take_grants_at_most_what_is_available(
        limit in limit(),
        history in prop::collection::vec((0u64..2_000_000, 0u64..70), 0..8),
        want in 0u64..100,
    ) {
        let (mut state, now) = warmed(&limit, &history);
        let available = limit.evaluate(Some(&state), now, 0).remaining();
        let grant = limit.take(&mut state, now, want).unwrap();
        prop_assert_eq!(grant.granted, want.min(available));
        if grant.granted > 0 {
            prop_assert!(grant.decision.is_allowed());
            prop_assert_eq!(grant.decision.remaining(), available - grant.granted);
            prop_assert_eq!(limit.evaluate(Some(&state), now, 0).remaining(), available - grant.granted);
        } else if want > 0 {
            // Nothing available: the peek's denial, with the wait for one unit.
            prop_assert!(grant.decision.is_denied());
            prop_assert!(grant.decision.retry_after_us() >= 1);
        }
    }

    #[test]
    fn take_then_give_back_restores_the_state(
        limit in limit(),
        history in prop::collection::vec((0u64..2_000_000, 0u64..70), 0..8),
        want in 0u64..100,
        back_in_time in 0u64..3,
    ) {
        let (before, now) = warmed(&limit, &history);
        // Also at an instant before the last decision (a clock that went back).
        let now = now - back_in_time.min(now);
        let mut state = before.clone();
        let grant = limit.take(&mut state, now, want).unwrap();
        limit.give_back(&mut state, now, grant.granted).unwrap();
        alike(&limit, &before, &state, now)?;
    }

    /// A lease taken under one quota and given back after the limit changed (a reload) leaves
    /// the key as if the lease had never been taken: the next decision under the new limit
    /// sees what the key's own decisions spent, carried over, and no more nor less.
    #[test]
    fn take_then_give_back_across_a_limit_change_restores_the_state(
        from in limit(),
        to in quota(),
        history in prop::collection::vec((0u64..2_000_000, 0u64..70), 0..8),
        want in 0u64..100,
    ) {
        let to = Limit::new(from.algorithm(), to);
        let (before, now) = warmed(&from, &history);
        let mut state = before.clone();
        let mut written = Some(*from.quota());
        let grant = from.take_from(&mut state, &mut written, now, want).unwrap();
        to.give_back_from(&mut state, &mut written, now, grant.granted).unwrap();
        for cost in [0, 1, to.capacity() / 2, to.capacity()] {
            prop_assert_eq!(
                to.evaluate_from(Some(&state), written.as_ref(), now, cost),
                to.evaluate_from(Some(&before), Some(from.quota()), now, cost),
                "cost {}",
                cost
            );
        }
    }

    #[test]
    fn giving_back_never_exceeds_the_capacity(
        limit in limit(),
        history in prop::collection::vec((0u64..2_000_000, 0u64..70), 0..8),
        units in prop::sample::select(vec![0u64, 1, 5, 60, u64::MAX]),
    ) {
        let (mut state, now) = warmed(&limit, &history);
        limit.give_back(&mut state, now, units).unwrap();
        prop_assert!(limit.evaluate(Some(&state), now, 0).remaining() <= limit.capacity());
        let grant = limit.take(&mut state, now, u64::MAX).unwrap();
        prop_assert!(grant.granted <= limit.capacity());
    }

    #[test]
    fn leases_never_spend_more_than_the_limit(
        limit in limit(),
        // Per step: which client, how far time moves, how many units it spends, how many it
        // asks for when its lease is short.
        steps in prop::collection::vec((0usize..3, 0u64..300_000, 1u64..5, 1u64..30), 1..200),
        horizon in prop::sample::select(vec![1_000u64, 100_000, 1_000_000]),
    ) {
        let start = 5_000_000_000u64;
        let mut now = start;
        let mut state = State::fresh(limit.algorithm());
        // Per client: units held and when the lease ends.
        let mut leases = [(0u64, 0u64); 3];
        let (mut spent, mut taken, mut returned) = (0u64, 0u64, 0u64);
        for (client, advance, cost, want) in steps {
            now += advance % (limit.quota().period_us() + 1);
            let cost = cost.min(limit.capacity());
            let lease = &mut leases[client];
            if lease.1 <= now && lease.0 > 0 {
                limit.give_back(&mut state, now, lease.0).unwrap();
                returned += lease.0;
                lease.0 = 0;
            }
            if lease.0 < cost {
                let grant = limit.take(&mut state, now, want.max(cost) - lease.0).unwrap();
                taken += grant.granted;
                lease.0 += grant.granted;
                lease.1 = now + horizon;
            }
            if lease.0 >= cost {
                lease.0 -= cost;
                spent += cost;
            }
            // Units are withdrawn before they are spent, so what was spent is within what the
            // key admits from fresh over the run.
            prop_assert!(spent <= bound(&limit, now - start), "spent {spent} at +{}", now - start);
            let held: u64 = leases.iter().map(|l| l.0).sum();
            prop_assert_eq!(taken, spent + returned + held, "no unit lost or spent twice");
        }
    }

    #[test]
    fn window_algorithms_cannot_lease(q in quota(), want in 0u64..10) {
        for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingLog, Algorithm::SlidingWindow] {
            let limit = Limit::new(algorithm, q);
            let mut state = State::fresh(algorithm);
            prop_assert_eq!(limit.take(&mut state, 0, want), Err(LeaseUnsupported(algorithm)));
            prop_assert_eq!(limit.give_back(&mut state, 0, want), Err(LeaseUnsupported(algorithm)));
            prop_assert_eq!(&state, &State::fresh(algorithm));
        }
    }

    #[test]
    fn carried_take_agrees_with_carried_decide(
        from in limit(),
        to_quota in quota(),
        history in prop::collection::vec((0u64..2_000_000, 0u64..70), 0..8),
        want in 1u64..100,
    ) {
        // Taking under a changed quota carries over like decide_from does.
        let to = Limit::new(from.algorithm(), to_quota);
        let (state, now) = warmed(&from, &history);
        let written = Some(*from.quota());
        let available = to.evaluate_from(Some(&state), written.as_ref(), now, 0).remaining();
        let (mut a, mut wa) = (state.clone(), written);
        let grant = to.take_from(&mut a, &mut wa, now, want).unwrap();
        prop_assert_eq!(grant.granted, want.min(available));
        if grant.granted > 0 {
            let (mut b, mut wb) = (state, written);
            prop_assert_eq!(grant.decision, to.decide_from(&mut b, &mut wb, now, grant.granted));
            prop_assert_eq!(a, b);
            prop_assert_eq!(wa, wb);
        }
    }
}
