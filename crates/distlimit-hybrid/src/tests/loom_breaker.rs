//! The breaker's half-open election and its outcomes, explored over every interleaving by loom.

use loom::sync::Arc;
use loom::thread;

use crate::OpenRule;
use crate::breaker::{Breaker, Route};
use distlimit_core::BreakerState;

const COOL_OFF: u64 = 1_000;

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
            .map(|_| {
                let breaker = breaker.clone();
                thread::spawn(move || breaker.route(COOL_OFF))
            })
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
        let prober = {
            let breaker = breaker.clone();
            thread::spawn(move || breaker.failed(probe, COOL_OFF + 10))
        };
        let others: Vec<_> = (0..2)
            .map(|_| {
                let breaker = breaker.clone();
                thread::spawn(move || breaker.route(COOL_OFF + 10).0)
            })
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

/// Closed, two callers fail at once and a third succeeds: the breaker opens exactly once.
#[test]
fn loom_concurrent_failures_open_once() {
    loom::model(|| {
        let breaker = Arc::new(Breaker::new(OpenRule::ConsecutiveFailures(2), COOL_OFF));
        let handles: Vec<_> = (0..2)
            .map(|i| {
                let breaker = breaker.clone();
                thread::spawn(move || breaker.failed(Route::Primary, i).is_some())
            })
            .collect();
        let opened = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&o| o)
            .count();
        assert_eq!(opened, 1);
        assert_eq!(breaker.state(), BreakerState::Open);
    });
}
