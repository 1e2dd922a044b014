//! The conformance suite on `Leased` over the memory store, every policy leasing: the checks a
//! lease meets exactly run here, check by check; `NOT_APPLICABLE` names the others and why, and
//! `every_check_is_run_or_explained` proves none is forgotten.
//!
//! A lease answers from units withdrawn earlier, so the checks that compare every decision with
//! the model's, field by field, do not apply: its `reset_after` counts the units it holds as
//! spent (they are, in the store), `remaining` is as of its last store call, a peek reads the
//! store (which counts those units as spent too), and `retry_after` of a request the lease
//! cannot pay is an estimate. Batches are leased too (their leased requests spent from leases,
//! all or nothing), so the batch checks that compare decisions or peeks with the model do not
//! apply either: `tests/accounting.rs` checks a mixed batch's all-or-nothing by conservation
//! (store + held + admitted = capacity). What does apply, and passes: costs above the capacity,
//! key independence, key validation, invalid batches, and exactly the limit admitted under
//! concurrent requests.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use distlimit_core::ManualClock;
use distlimit_lease::Leased;
use distlimit_memory::MemoryStore;

fn store(clock: ManualClock) -> Arc<Leased<MemoryStore<ManualClock>>> {
    Arc::new(
        Leased::matching(|_| true)
            .clock(clock.clone())
            .build(MemoryStore::with_clock(clock)),
    )
}

/// The checks that compare every decision with the model's exactly (see the module docs).
const NOT_APPLICABLE: &[&str] = &[
    "fresh_key_admits_capacity",
    "retry_after_is_exact",
    "matches_reference_model",
    "peek_changes_nothing",
    "denied_request_is_not_charged",
    "limit_change_follows_model",
    "clock_going_backwards_follows_model",
    "idle_key_decides_as_fresh",
    // Batches are leased: decisions and peeks are compared with the model's.
    "decide_all_is_all_or_nothing",
    "concurrent_batches_are_atomic",
    "key_bytes_are_opaque",
    "policies_are_independent",
    // Its walk mixes leased decisions (answered from the lease) with reports and give-backs;
    // `tests/debt.rs` checks reports on a leased key by conservation.
    "settling_follows_model",
];

macro_rules! run {
    ($($name:ident => $check:ident,)*) => {
        const RUN: &[&str] = &[$(stringify!($name),)*];
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let clock = distlimit_test::new_clock();
                let store = store(clock.clone());
                distlimit_test::$check(&store, &clock).await;
            }
        )*
    };
}

run! {
    cost_above_capacity_is_never => check_cost_above_capacity_is_never,
    keys_are_independent => check_keys_are_independent,
    decide_all_rejects_invalid_batches => check_decide_all_rejects_invalid_batches,
    concurrent_requests_admit_exactly_limit => check_concurrent_requests_admit_exactly_limit,
    store_ext_validates_keys => check_store_ext_validates_keys,
}

#[test]
fn every_check_is_run_or_explained() {
    for name in distlimit_test::CHECKS {
        assert!(
            RUN.contains(name) ^ NOT_APPLICABLE.contains(name),
            "{name}: run it or say why not"
        );
    }
    assert_eq!(
        RUN.len() + NOT_APPLICABLE.len(),
        distlimit_test::CHECKS.len()
    );
}
