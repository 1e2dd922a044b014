//! Concurrent decisions on shared keys, explored over every interleaving by loom.

use distlimit_core::{Key, Limit, ManualClock, Quota, Request};
use loom::sync::Arc;
use loom::thread;

use crate::MemoryStore;

fn store() -> Arc<MemoryStore<ManualClock>> {
    Arc::new(MemoryStore::with_clock(ManualClock::new(1_000_000)))
}

/// Of N concurrent requests on one fresh key, exactly `burst` pass: none lost, none doubled.
#[test]
fn loom_exactly_burst_of_concurrent_requests_on_a_fresh_key_pass() {
    loom::model(|| {
        let store = store();
        let limit = Limit::token_bucket(Quota::per_hour(2).unwrap());
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let store = store.clone();
                thread::spawn(move || {
                    store
                        .decide_sync(&Request::new(Key::new("k").unwrap(), limit))
                        .is_allowed()
                })
            })
            .collect();
        let allowed = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&a| a)
            .count();
        assert_eq!(allowed, 2);
        let after = store.decide_sync(&Request::peek(Key::new("k").unwrap(), limit));
        assert_eq!(after.remaining(), 0);
        assert_eq!(store.len(), 1);
    });
}

/// A batch and a single request race for the last unit of a shared key: exactly one wins, and a
/// losing batch charges none of its keys.
#[test]
fn loom_batch_is_all_or_nothing_under_a_race() {
    loom::model(|| {
        let store = store();
        let limit = Limit::gcra(Quota::per_hour(1).unwrap());
        let batch = {
            let store = store.clone();
            thread::spawn(move || {
                let requests = [
                    Request::new(Key::new("a").unwrap(), limit),
                    Request::new(Key::new("shared").unwrap(), limit),
                ];
                let decisions = store.decide_all_sync(&requests).unwrap();
                decisions.iter().all(|d| d.is_allowed())
            })
        };
        let single = {
            let store = store.clone();
            thread::spawn(move || {
                store
                    .decide_sync(&Request::new(Key::new("shared").unwrap(), limit))
                    .is_allowed()
            })
        };
        let batch_won = batch.join().unwrap();
        let single_won = single.join().unwrap();
        assert!(batch_won ^ single_won, "exactly one may take the last unit");
        let a_left = store
            .decide_sync(&Request::peek(Key::new("a").unwrap(), limit))
            .remaining();
        assert_eq!(a_left, if batch_won { 0 } else { 1 });
    });
}
