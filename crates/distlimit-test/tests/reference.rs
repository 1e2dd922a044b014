//! The suite against the reference store, through every entry point: the macro (one test per
//! check), `run_all`, trait objects, and `FaultyStore` passing through.

use crate::support;

use std::sync::Arc;

use distlimit_core::{ManualClock, Store};
use distlimit_test::{CHECKS, Fault, FaultyStore, run_all};
use support::{Backend, ReferenceStore};

distlimit_test::conformance_tests!(|clock| async move { ReferenceStore::new(clock) });

async fn boxed(clock: ManualClock) -> Box<dyn Store> {
    Box::new(ReferenceStore::new(clock))
}

distlimit_test::conformance_tests!(boxed_dyn, boxed);

distlimit_test::conformance_tests!(faulty_pass_through, |clock| async move {
    FaultyStore::new(ReferenceStore::new(clock))
});

distlimit_test::conformance_tests!(faulty_with_delays, |clock| async move {
    let store = FaultyStore::new(ReferenceStore::new(clock));
    // Passing through after a zero delay still yields to the runtime: more interleaving.
    store.set_default(Fault::Delay(std::time::Duration::ZERO));
    store
});

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_all_passes() {
    run_all(|clock| async move { ReferenceStore::new(clock) }).await;
}

#[tokio::test(flavor = "current_thread")]
async fn run_all_passes_on_a_current_thread_runtime() {
    run_all(|clock| async move { Arc::new(ReferenceStore::new(clock)) as Arc<dyn Store> }).await;
}

#[test]
fn checks_are_listed_once() {
    assert_eq!(CHECKS.len(), 18);
    for (i, name) in CHECKS.iter().enumerate() {
        assert!(!CHECKS[..i].contains(name), "{name} twice");
    }
    assert_eq!(CHECKS[0], "fresh_key_admits_capacity");
}

/// Check futures are `Send`, so callers may spawn them (for example, to run checks concurrently
/// against one shared server).
#[test]
fn check_futures_are_send() {
    fn assert_send<F: std::future::Future + Send>(_: F) {}
    let clock = distlimit_test::new_clock();
    let store = Arc::new(ReferenceStore::new(clock.clone()));
    assert_send(distlimit_test::check_matches_reference_model(
        &*store, &clock,
    ));
    assert_send(distlimit_test::check_decide_all_is_all_or_nothing(
        &*store, &clock,
    ));
    assert_send(distlimit_test::check_concurrent_batches_are_atomic(
        &store, &clock,
    ));
    assert_send(distlimit_test::check_store_ext_validates_keys(
        &*store, &clock,
    ));
    assert_send(run_all(|clock| async move { ReferenceStore::new(clock) }));
}

/// The whole suite, three times at once against one shared backend, each client with its own
/// clocks (as Redis clients in client-time mode): the checks' keys never collide.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suites_share_one_backend() {
    let backend = Backend::default();
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let backend = backend.clone();
            tokio::spawn(run_all(move |clock| {
                let backend = backend.clone();
                async move { ReferenceStore::on(&backend, clock) }
            }))
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
}
