//! Reports (forced charges) and give-backs on leased keys: the units a lease holds pay a report
//! first, the rest goes to the store as debt; give-backs go to the store. Nothing is lost and
//! nothing counted twice: what the store charged = the units admitted + reported − given back +
//! the units the lease holds, at one instant, for any sequence.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use distlimit_core::{
    Clock, Key, Limit, ManualClock, Quota, Request, Settle, State, Store, StoreExt,
};
use distlimit_lease::Leased;
use distlimit_memory::MemoryStore;
use proptest::prelude::*;

#[derive(Clone, Copy, Debug)]
enum Op {
    Decide(u64),
    Report(u64),
    GiveBack(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..5).prop_map(Op::Decide),
        (0u64..40).prop_map(Op::Report),
        (0u64..4).prop_map(Op::GiveBack),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn reports_on_a_leased_key_are_conserved(gcra in any::<bool>(), ops in prop::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let clock = ManualClock::new(1_700_000_000_000_000);
            let memory = Arc::new(MemoryStore::with_clock(clock.clone()));
            let leased = Leased::matching(|_| true).clock(clock.clone()).build(memory.clone());
            let quota = Quota::per_hour(20).unwrap();
            let limit = if gcra { Limit::gcra(quota) } else { Limit::token_bucket(quota) };
            let key = Key::new("k").unwrap();
            let mut model = State::fresh(limit.algorithm());
            let now = clock.now_us();
            let mut admitted_units = 0u64;
            for op in ops {
                match op {
                    Op::Decide(cost) => {
                        let d = leased.decide(&Request::new(key, limit).with_cost(cost)).await.unwrap();
                        if d.is_allowed() {
                            admitted_units += cost;
                            // The model charges what the lease and the store charged together.
                            limit.force(&mut model, now, cost).unwrap();
                        }
                    }
                    Op::Report(cost) => {
                        leased.settle(Settle::Report(Request::new(key, limit).with_cost(cost))).await.unwrap();
                        limit.force(&mut model, now, cost).unwrap();
                    }
                    Op::GiveBack(units) => {
                        // Only units reserved by an admitted decision go back (the contract).
                        let units = units.min(admitted_units);
                        admitted_units -= units;
                        leased.settle(Settle::GiveBack(Request::new(key, limit).with_cost(units))).await.unwrap();
                        limit.give_back(&mut model, now, units).unwrap();
                    }
                }
                // The store charged what the model charged plus the units the lease holds.
                let held = leased.stats().held;
                let store_peek = memory.decide(&Request::peek(key, limit)).await.unwrap();
                let model_peek = {
                    let mut m = model.clone();
                    limit.force(&mut m, now, held).unwrap()
                };
                prop_assert_eq!(store_peek.remaining(), model_peek.remaining(), "held {}", held);
                prop_assert_eq!(store_peek.retry_after(), model_peek.retry_after(), "held {}", held);
            }
            Ok(())
        })?;
    }
}
