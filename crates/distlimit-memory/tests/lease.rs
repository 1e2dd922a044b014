//! The memory store's leases ([`LeaseStore::exchange`]) against the reference model
//! (`Limit::give_back_from` then `Limit::take_from`) on random sequences of exchanges,
//! decisions and quota changes, for GCRA (in compact and wide entries) and the token bucket.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use distlimit_core::{Algorithm, Key, LeaseStore, Limit, ManualClock, Quota, Request, State};
use distlimit_memory::MemoryStore;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Decide(u64),
    Exchange(u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..12).prop_map(Op::Decide),
        (0u64..12, 0u64..15).prop_map(|(b, w)| Op::Exchange(b, w)),
    ]
}

fn quotas() -> Vec<Quota> {
    vec![
        Quota::per_second(10).unwrap(),
        Quota::per_second(10).unwrap().with_burst(4).unwrap(),
        Quota::from_parts(7, 1_000_000, 9).unwrap(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn exchanges_agree_with_the_model(
        gcra in prop::bool::ANY,
        key in prop::sample::select(vec!["8bytes!!", "a-short-key", "a key long enough for the long table, 40+", "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"]),
        policy in prop::sample::select(vec!["", "api"]),
        steps in prop::collection::vec((0u64..400_000, 0usize..3, op()), 1..60),
    ) {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let algorithm = if gcra { Algorithm::Gcra } else { Algorithm::TokenBucket };
        let mut state = State::fresh(algorithm);
        let mut written = None;
        let mut now = 1_000_000_000;
        for (advance, q, op) in steps {
            now += advance;
            clock.set_us(now);
            let limit = Limit::new(algorithm, quotas()[q]);
            let request = Request::new(Key::new(key).unwrap(), limit).with_policy(policy).unwrap();
            match op {
                Op::Decide(cost) => {
                    let got = store.decide_sync(&request.with_cost(cost));
                    let want = limit.decide_from(&mut state, &mut written, now, cost);
                    prop_assert_eq!(got, want);
                }
                Op::Exchange(back, want) => {
                    let got = store.exchange_sync(&request, back, want).unwrap();
                    limit.give_back_from(&mut state, &mut written, now, back).unwrap();
                    let model = limit.take_from(&mut state, &mut written, now, want).unwrap();
                    prop_assert_eq!(got, model);
                }
            }
            let peek = store.decide_sync(&request.with_cost(0));
            prop_assert_eq!(peek, limit.evaluate_from(Some(&state), written.as_ref(), now, 0));
        }
    }
}

#[tokio::test]
async fn the_window_algorithms_cannot_lease() {
    let store = MemoryStore::new();
    let limit = Limit::fixed_window(Quota::per_second(10).unwrap());
    let request = Request::new(Key::new("k").unwrap(), limit);
    let err = store.take(&request, 3).await.unwrap_err();
    assert!(err.is_invalid_input(), "{err}");
}

/// A GCRA state written under another quota is carried over by a request with a cost, but not
/// by a cost above the (new) capacity, which changes nothing (`Limit::decide_from`).
#[test]
fn a_cost_above_the_capacity_under_a_changed_quota_changes_nothing() {
    let clock = Arc::new(ManualClock::new(0));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let wide = Limit::gcra(Quota::per_second(10).unwrap());
    let narrow = Limit::gcra(Quota::per_second(10).unwrap().with_burst(4).unwrap());
    let key = Key::new("8bytes!!").unwrap();
    assert!(
        store
            .decide_sync(&Request::new(key, wide).with_cost(4))
            .is_allowed()
    );
    clock.set_us(429);
    assert!(
        store
            .decide_sync(&Request::new(key, narrow).with_cost(5))
            .is_never()
    );
    clock.set_us(100_000);
    assert_eq!(store.decide_sync(&Request::peek(key, wide)).remaining(), 7);
}
