//! Leases on Redis (`lease.lua`) against the reference model: random sequences of exchanges
//! (give back, then take), decisions and quota changes on one key, for GCRA and the token
//! bucket, compared step by step with `Limit::give_back_from`, `Limit::take_from` and
//! `Limit::decide_from`, and by a peek after every step. Also: the window algorithms are
//! refused, a bad value at the key is the request's `BadState`, and the Cluster runs it too.
//!
//! On `DISTLIMIT_REDIS_URL` (and `DISTLIMIT_REDIS_CLUSTER_URLS`) as `cargo xtask test` sets
//! them; under `DISTLIMIT_REQUIRE_REDIS=1` a missing server fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::sync::atomic::{AtomicU64, Ordering};

use distlimit_core::{
    Algorithm, Error, Key, LeaseStore, Limit, ManualClock, Quota, Request, State, Store,
};
use distlimit_redis::RedisStore;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

#[derive(Clone, Debug)]
enum Op {
    Decide(u64),
    Exchange(u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..12).prop_map(Op::Decide),
        (0u64..14, 0u64..15).prop_map(|(b, w)| Op::Exchange(b, w)),
    ]
}

fn quotas() -> [Quota; 3] {
    [
        Quota::per_second(10).unwrap(),
        Quota::per_second(10).unwrap().with_burst(4).unwrap(),
        Quota::from_parts(7, 1_000_000, 9).unwrap(),
    ]
}

type Steps = Vec<(u64, usize, Op)>;

fn steps() -> impl Strategy<Value = (bool, Steps)> {
    (
        prop::bool::ANY,
        prop::collection::vec((0u64..400_000, 0usize..3, op()), 1..40),
    )
}

/// Runs one random sequence on a fresh key of `store`, whose client clock is `clock`.
async fn check(
    store: &RedisStore,
    clock: &ManualClock,
    gcra: bool,
    steps: Steps,
) -> Result<(), TestCaseError> {
    static KEYS: AtomicU64 = AtomicU64::new(0);
    let name = format!("lease-{}", KEYS.fetch_add(1, Ordering::Relaxed));
    let algorithm = if gcra {
        Algorithm::Gcra
    } else {
        Algorithm::TokenBucket
    };
    let (mut state, mut written) = (State::fresh(algorithm), None);
    let mut now = 1_700_000_000_000_000;
    for (advance, q, op) in steps {
        now += advance;
        clock.set_us(now);
        let limit = Limit::new(algorithm, quotas()[q]);
        let request = Request::new(Key::new(&name).unwrap(), limit)
            .with_policy("p")
            .unwrap();
        match op {
            Op::Decide(cost) => {
                let got = store.decide(&request.with_cost(cost)).await.unwrap();
                let want = limit.decide_from(&mut state, &mut written, now, cost);
                prop_assert_eq!(got, want, "decide {}", cost);
            }
            Op::Exchange(back, want) => {
                let got = store.exchange(&request, back, want).await.unwrap();
                limit
                    .give_back_from(&mut state, &mut written, now, back)
                    .unwrap();
                let model = limit
                    .take_from(&mut state, &mut written, now, want)
                    .unwrap();
                prop_assert_eq!(got, model, "exchange {} {}", back, want);
            }
        }
        let peek = store.decide(&request.with_cost(0)).await.unwrap();
        let model = limit.evaluate_from(Some(&state), written.as_ref(), now, 0);
        prop_assert_eq!(peek, model, "peek");
    }
    Ok(())
}

/// The runtime the store was connected on drives every case (its connection's task lives there).
fn run(rt: &tokio::runtime::Runtime, store: RedisStore, clock: ManualClock, cases: u32) {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&steps(), |(gcra, steps)| {
            rt.block_on(check(&store, &clock, gcra, steps))
        })
        .unwrap();
}

#[test]
fn exchanges_agree_with_the_model() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = ManualClock::new(0);
    let guarded = rt.block_on(support::standalone_store(clock.clone(), "lease", |b| b));
    run(&rt, guarded.store.clone(), clock, 200);
}

#[test]
fn cluster_exchanges_agree_with_the_model() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = ManualClock::new(0);
    let Some(store) = rt.block_on(support::cluster_store(clock.clone(), "lease")) else {
        return;
    };
    run(&rt, store, clock, 40);
}

#[tokio::test]
async fn the_window_algorithms_and_bad_values_are_errors_of_the_request() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let guarded = support::standalone_store(clock, "lease-errors", |b| b).await;
    let store = &guarded.store;
    let window = Limit::fixed_window(Quota::per_second(10).unwrap());
    let err = store
        .take(&Request::new(Key::new("w").unwrap(), window), 3)
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err}");

    // A value that is no state, and a key of another Redis type: BadState, left as they are.
    let limit = Limit::gcra(Quota::per_second(10).unwrap());
    let url = support::standalone_url().unwrap_or_default();
    let client = redis::Client::open(url.as_str());
    let Ok(client) = client else {
        return;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        // A private server (no DISTLIMIT_REDIS_URL): only the first half applies.
        return;
    };
    for (name, write) in [("corrupt", false), ("list", true)] {
        let key = Key::new(name).unwrap();
        let redis_key = store.redis_key("", key);
        let mut cmd = if write {
            redis::cmd("RPUSH")
        } else {
            redis::cmd("SET")
        };
        cmd.arg(&redis_key).arg("garbage");
        let () = cmd.query_async(&mut conn).await.unwrap();
        for (back, want) in [(0, 3), (3, 0), (2, 2)] {
            let err = store
                .exchange(&Request::new(key, limit), back, want)
                .await
                .unwrap_err();
            assert!(matches!(err, Error::BadState { .. }), "{name}: {err:?}");
        }
        let _: () = redis::cmd("DEL")
            .arg(&redis_key)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}
