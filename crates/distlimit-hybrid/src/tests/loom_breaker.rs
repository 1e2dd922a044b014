//! The breaker's half-open election and its outcomes, and the opening rules' counting, explored
//! over every interleaving by loom.

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;

use crate::OpenRule;
use crate::breaker::{Breaker, Route, Transition};
use distlimit_core::BreakerState;

const COOL_OFF: u64 = 1_000;

/// Runs `f` on a loom thread of its own with a handle to `breaker`.
fn spawn<T: Send + 'static>(
    breaker: &Arc<Breaker>,
    f: impl FnOnce(&Breaker) -> T + Send + 'static,
) -> thread::JoinHandle<T> {
    let breaker = breaker.clone();
    thread::spawn(move || f(&breaker))
}

/// An open breaker whose cool-off is over at `COOL_OFF`.
fn cooled() -> Arc<Breaker> {
    let breaker = Breaker::new(OpenRule::ConsecutiveFailures(1), COOL_OFF);
    assert!(breaker.failed(Route::Primary, 0).is_some());
    Arc::new(breaker)
}

/// Of three callers arriving after the cool-off, exactly one probes (and reports the transition
/// to half-open); the others use the fallback.
#[test]
fn loom_exactly_one_of_concurrent_callers_probes() {
    loom::model(|| {
        let breaker = cooled();
        let handles: Vec<_> = (0..3)
            .map(|_| spawn(&breaker, move |breaker| breaker.route(COOL_OFF)))
            .collect();
        let routes: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let probes = routes
            .iter()
            .filter(|(r, _)| matches!(r, Route::Probe { .. }))
            .count();
        let transitions = routes.iter().filter(|(_, t)| t.is_some()).count();
        assert_eq!(probes, 1);
        assert_eq!(transitions, 1);
        assert!(
            routes
                .iter()
                .all(|(r, _)| matches!(r, Route::Probe { .. } | Route::Fallback))
        );
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
    });
}

/// The prober fails while two other callers arrive: the breaker re-opens with a fresh cool-off,
/// and neither of the others ever probes or reaches the primary.
#[test]
fn loom_a_failed_probe_reopens_and_nobody_else_probes() {
    loom::model(|| {
        let breaker = cooled();
        let (probe, _) = breaker.route(COOL_OFF);
        assert!(matches!(probe, Route::Probe { .. }));
        let prober = spawn(&breaker, move |breaker| {
            breaker.failed(probe, COOL_OFF + 10)
        });
        let others: Vec<_> = (0..2)
            .map(|_| spawn(&breaker, move |breaker| breaker.route(COOL_OFF + 10).0))
            .collect();
        let reopened = prober.join().unwrap();
        assert_eq!(reopened.map(|t| t.to), Some(BreakerState::Open));
        for other in others {
            assert_eq!(other.join().unwrap(), Route::Fallback);
        }
        assert_eq!(breaker.state(), BreakerState::Open);
        // The cool-off restarted at the failure.
        assert_eq!(
            breaker.route(COOL_OFF + 10 + COOL_OFF - 1).0,
            Route::Fallback
        );
        assert!(matches!(
            breaker.route(COOL_OFF + 10 + COOL_OFF).0,
            Route::Probe { .. }
        ));
    });
}

/// The states a sequence of reported transitions passes through, from `from`, checked to be a
/// path of the state machine: each transition starts where the previous one ended.
fn follow(from: BreakerState, mut transitions: Vec<Transition>) -> BreakerState {
    // Reports from different threads arrive in any order; the breaker's word orders them. Sort
    // them into the one order in which each starts where the last ended.
    let mut state = from;
    while !transitions.is_empty() {
        let next = transitions
            .iter()
            .position(|t| t.from == state)
            .unwrap_or_else(|| panic!("no transition from {state:?} in {transitions:?}"));
        state = transitions.remove(next).to;
    }
    state
}

/// The prober succeeds while another caller routes and a request sent while the breaker was
/// still closed fails late: the probe closes the breaker exactly once, the other caller never
/// probes, and the reported transitions explain the final state.
#[test]
fn loom_a_successful_probe_races_routes_and_a_late_failure() {
    loom::model(|| {
        let breaker = Arc::new(Breaker::new(OpenRule::ConsecutiveFailures(1), COOL_OFF));
        // A request sent while closed; it fails after the breaker opened and was probed.
        let late = breaker.route(0).0;
        assert_eq!(late, Route::Primary);
        let opened = breaker.failed(Route::Primary, 0).unwrap();
        let (probe, half) = breaker.route(COOL_OFF);
        assert!(matches!(probe, Route::Probe { .. }));
        let prober = spawn(&breaker, move |breaker| breaker.succeeded(probe));
        let other = spawn(&breaker, move |breaker| breaker.route(COOL_OFF + 3));
        let late_failure = breaker.failed(late, COOL_OFF + 2);
        let closed = prober.join().unwrap();
        let (route, routed) = other.join().unwrap();

        assert_eq!(closed.map(|t| t.to), Some(BreakerState::Closed));
        assert!(routed.is_none(), "nobody else probes");
        assert!(matches!(route, Route::Primary | Route::Fallback));
        let mut transitions = vec![opened, half.unwrap()];
        transitions.extend(closed);
        transitions.extend(late_failure);
        let end = follow(BreakerState::Closed, transitions);
        assert_eq!(end, breaker.state());
        // A late failure re-opens only a breaker that is closed again (the rule opens at one).
        if late_failure.is_some() {
            assert_eq!(breaker.state(), BreakerState::Open);
        }
    });
}

/// The prober's outcome tells nothing while two callers arrive: exactly one of them may become
/// the next prober, never both, and the breaker is half-open if and only if one did.
#[test]
fn loom_an_inconclusive_probe_hands_over_to_exactly_one_caller() {
    loom::model(|| {
        let breaker = cooled();
        let (probe, _) = breaker.route(COOL_OFF);
        assert!(matches!(probe, Route::Probe { .. }));
        let prober = spawn(&breaker, move |breaker| breaker.inconclusive(probe));
        let other = spawn(&breaker, move |breaker| breaker.route(COOL_OFF).0);
        let mine = breaker.route(COOL_OFF).0;
        let reopened = prober.join().unwrap();
        let theirs = other.join().unwrap();

        assert_eq!(reopened.map(|t| t.to), Some(BreakerState::Open));
        let probes = [mine, theirs]
            .iter()
            .filter(|r| matches!(r, Route::Probe { .. }))
            .count();
        assert!(probes <= 1, "{mine:?} {theirs:?}");
        let expected = if probes == 1 {
            BreakerState::HalfOpen
        } else {
            BreakerState::Open
        };
        assert_eq!(breaker.state(), expected);
    });
}

/// The default kind of rule (a run of failures that must last): two failures race a success.
/// The breaker opens at most once, only when both failures ran with no success between them
/// and the run lasted, and a run the success ended leaves no failure counted behind it.
#[test]
fn loom_a_success_racing_failures_resets_the_run() {
    loom::model(|| {
        let rule = OpenRule::Failing {
            failures: 2,
            for_at_least: Duration::from_micros(10),
        };
        let breaker = Arc::new(Breaker::new(rule, COOL_OFF));
        let first = spawn(&breaker, move |breaker| breaker.failed(Route::Primary, 0));
        let success = spawn(&breaker, move |breaker| breaker.succeeded(Route::Primary));
        let second = breaker.failed(Route::Primary, 10);
        let first = first.join().unwrap();
        assert_eq!(success.join().unwrap(), None);

        // The failure at 0 cannot open alone (a run of one); only the one at 10 may.
        assert_eq!(first, None);
        match second {
            Some(t) => {
                assert_eq!((t.from, t.to), (BreakerState::Closed, BreakerState::Open));
                assert_eq!(breaker.state(), BreakerState::Open);
            }
            None => assert_eq!(breaker.state(), BreakerState::Closed),
        }
        assert!(breaker.run_is_consistent());
        if second.is_none() {
            // Whatever the interleaving, the next failure starts or continues a run of at most
            // two; it opens only if that run lasted.
            let next = breaker.failed(Route::Primary, 10);
            assert!(breaker.run_is_consistent());
            if next.is_some() {
                assert_eq!(breaker.state(), BreakerState::Open);
            }
        }
    });
}

/// Closed, two callers fail at once (under a window rule while a third succeeds, which does not
/// reset a window): the breaker opens exactly once.
#[test]
fn loom_concurrent_failures_open_once() {
    let window = OpenRule::FailuresInWindow {
        failures: 2,
        window: Duration::from_micros(100),
    };
    for (rule, success) in [(OpenRule::ConsecutiveFailures(2), false), (window, true)] {
        loom::model(move || {
            let breaker = Arc::new(Breaker::new(rule, COOL_OFF));
            let handles: Vec<_> = (0..2)
                .map(|i| {
                    spawn(&breaker, move |breaker| {
                        breaker.failed(Route::Primary, i).is_some()
                    })
                })
                .collect();
            if success {
                assert_eq!(breaker.succeeded(Route::Primary), None);
            }
            let opened = handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .filter(|&o| o)
                .count();
            assert_eq!(opened, 1);
            assert_eq!(breaker.state(), BreakerState::Open);
        });
    }
}
