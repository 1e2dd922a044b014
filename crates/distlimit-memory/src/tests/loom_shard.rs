//! Concurrent decisions on shared keys, explored over every interleaving by loom.

use distlimit_core::{Key, Limit, ManualClock, Quota, Request};
use loom::sync::Arc;
use loom::thread;

use crate::MemoryStore;

type Store = MemoryStore<ManualClock, foldhash::quality::FixedState>;

/// A store with a fixed hash seed: loom replays the model many times and needs every run to
/// take the same path (a random seed would move keys between shards from one run to the next).
fn store(seed: u64) -> Arc<Store> {
    Arc::new(
        MemoryStore::builder()
            .clock(ManualClock::new(1_000_000))
            .hasher(foldhash::quality::FixedState::with_seed(seed))
            .build(),
    )
}

/// Of N concurrent requests on one fresh key, exactly `burst` pass: none lost, none doubled. Run
/// for token-bucket states of an 8-byte key and a short id (the two compact bucket maps) and of
/// a 40-byte id (the wide map), and for GCRA states of an 8-byte key, a short id and a long one
/// (the three compact GCRA maps).
#[test]
fn loom_exactly_burst_of_concurrent_requests_on_a_fresh_key_pass() {
    let long = "a key of forty bytes, a long compact id.";
    let bucket = Limit::token_bucket(Quota::per_hour(2).unwrap());
    let gcra = Limit::gcra(Quota::per_hour(2).unwrap());
    for limit in [bucket, gcra] {
        for key in ["8 bytes!", "k", long] {
            burst_race(limit, key);
        }
    }
}

fn burst_race(limit: Limit, key: &'static str) {
    loom::model(move || {
        let store = store(1);
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let store = store.clone();
                thread::spawn(move || {
                    store
                        .decide_sync(&Request::new(Key::new(key).unwrap(), limit))
                        .is_allowed()
                })
            })
            .collect();
        let allowed = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&a| a)
            .count();
        assert_eq!(allowed, 2, "{key}");
        let after = store.decide_sync(&Request::peek(Key::new(key).unwrap(), limit));
        assert_eq!(after.remaining(), 0, "{key}");
        assert_eq!(store.len(), 1, "{key}");
    });
}

/// A batch and a single request race for the last unit of a shared key: exactly one wins, and a
/// losing batch charges none of its keys. Run with seeds that put the batch's two keys in one
/// shard and in two shards.
#[test]
fn loom_batch_is_all_or_nothing_under_a_race() {
    // Outside the model no loom primitive may be touched: compute the shards from the hash.
    let same_shard = |seed| {
        let hasher = foldhash::quality::FixedState::with_seed(seed);
        let [a, b] = [&b"a"[..], b"shared"]
            .map(|key| crate::shard_of(crate::shard::Id { key, policy: b"" }.hash(&hasher)));
        a == b
    };
    let seeds: Vec<u64> = [true, false]
        .into_iter()
        .filter_map(|same| (0..1_000).find(|&seed| same_shard(seed) == same))
        .collect();
    assert_eq!(seeds.len(), 2, "no seed for one of the cases");
    for seed in seeds {
        batch_race(seed);
    }
}

fn batch_race(seed: u64) {
    loom::model(move || {
        let store = store(seed);
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
