//! The Store conformance suite, run against the memory store.
#![allow(clippy::unwrap_used)]

use distlimit_memory::MemoryStore;

distlimit_test::conformance_tests!(|clock| async move { MemoryStore::with_clock(clock) });

/// `Store::decide_now` answers what `decide` would, charging alike, and `Arc` forwards it.
#[tokio::test]
async fn decide_now_is_decide_without_waiting() {
    use std::sync::Arc;

    use distlimit_core::{Key, Limit, Quota, Request, Store};

    let clock = distlimit_test::new_clock();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::with_clock(clock.clone()));
    let limit = Limit::token_bucket(Quota::per_second(1).unwrap().with_burst(3).unwrap());
    let key = Key::new("k").unwrap();
    let request = Request::new(key, limit);
    let mut answers = Vec::new();
    for i in 0..4 {
        let decision = if i % 2 == 0 {
            store.decide_now(&request).unwrap().unwrap()
        } else {
            store.decide(&request).await.unwrap()
        };
        answers.push((decision.is_allowed(), decision.remaining()));
    }
    assert_eq!(answers, [(true, 2), (true, 1), (true, 0), (false, 0)]);
}

distlimit_test::permit_conformance_tests!(|clock| async move { MemoryStore::with_clock(clock) });
