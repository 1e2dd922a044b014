//! Keys chosen by an attacker: colliding keys, floods of unique keys.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use distlimit_core::{Key, Limit, ManualClock, Observer, Quota, Request};
use distlimit_memory::{MemoryStore, SHARDS};

/// The seed's shard function, FNV-1a 32-bit: unkeyed, so anyone can compute collisions.
fn fnv1a_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// 6 400 keys that all fall in shard 0 under FNV-1a mod 64.
fn fnv_colliding_keys() -> Vec<String> {
    (0u64..)
        .map(|i| format!("attacker-{i}"))
        .filter(|k| fnv1a_32(k.as_bytes()).is_multiple_of(64))
        .take(6_400)
        .collect()
}

fn store(max_keys: usize) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(ManualClock::new(1_700_000_000_000_000))
        .max_keys(max_keys)
        .build()
}

#[test]
fn keys_colliding_under_an_unkeyed_hash_spread_over_every_shard() {
    let keys = fnv_colliding_keys();
    let store = store(1 << 20);
    let limit = Limit::token_bucket(Quota::per_minute(100).unwrap());
    for key in &keys {
        assert!(
            store
                .decide_sync(&Request::new(Key::new(key).unwrap(), limit))
                .is_allowed()
        );
    }
    let lens = store.shard_lens();
    let mean = keys.len() / SHARDS;
    assert_eq!(lens.iter().sum::<usize>(), keys.len());
    assert!(
        lens.iter().all(|&n| n > 0),
        "every shard gets some: {lens:?}"
    );
    assert!(
        lens.iter().all(|&n| n <= 2 * mean),
        "no shard holds more than twice its share ({mean}): {lens:?}"
    );
}

#[test]
fn each_store_places_keys_with_its_own_secret_seed() {
    let limit = Limit::token_bucket(Quota::per_minute(100).unwrap());
    // The shard a key went to, seen from outside through the per-shard counts.
    let shard_of = |store: &MemoryStore<ManualClock>, key: &str| {
        let before = store.shard_lens();
        store.decide_sync(&Request::new(Key::new(key).unwrap(), limit));
        let after = store.shard_lens();
        (0..SHARDS).find(|&s| after[s] != before[s]).unwrap()
    };
    let (a, b) = (store(1 << 20), store(1 << 20));
    let differ = (0..200)
        .filter(|i| {
            let key = format!("user-{i}");
            shard_of(&a, &key) != shard_of(&b, &key)
        })
        .count();
    // With independent seeds a key lands in the same shard with probability 1/64.
    assert!(
        differ > 150,
        "two stores placed only {differ}/200 keys differently"
    );
}

#[test]
fn a_flood_of_unique_keys_never_exceeds_the_cap() {
    let store = store(6_400);
    let limit = Limit::token_bucket(Quota::per_hour(10).unwrap());
    for i in 0u64..100_000 {
        let key = i.to_le_bytes();
        assert!(
            store
                .decide_sync(&Request::new(Key::new(&key).unwrap(), limit))
                .is_allowed()
        );
        if i.is_multiple_of(10_000) {
            assert!(store.len() <= store.max_keys());
        }
    }
    assert!(store.len() <= store.max_keys());
    assert_eq!(store.evictions(), 100_000 - store.len() as u64);
}

#[test]
fn expired_keys_make_room_before_live_ones_are_evicted() {
    let store = store(6_400);
    let limit = Limit::gcra(Quota::per_second(10).unwrap());
    for i in 0u64..6_400 {
        store.decide_sync(&Request::new(Key::new(&i.to_le_bytes()).unwrap(), limit));
    }
    // The cap is per shard (max_keys / 64), so the fill itself may have evicted a few.
    let evicted_while_filling = store.evictions();
    // Every one of those keys expires after 100 ms.
    store.clock().advance(std::time::Duration::from_secs(1));
    for i in 10_000u64..12_000 {
        store.decide_sync(&Request::new(Key::new(&i.to_le_bytes()).unwrap(), limit));
    }
    assert_eq!(
        store.evictions(),
        evicted_while_filling,
        "only expired entries should have made room"
    );
    store.purge_expired();
    assert_eq!(store.len(), 2_000);
}

#[test]
fn the_state_of_a_known_client_survives_a_flood_of_expired_keys() {
    let store = store(1 << 16);
    let limit = Limit::token_bucket(Quota::per_hour(3).unwrap());
    let victim = Key::new("victim").unwrap();
    for _ in 0..3 {
        assert!(store.decide_sync(&Request::new(victim, limit)).is_allowed());
    }
    for i in 0u64..50_000 {
        store.decide_sync(&Request::new(Key::new(&i.to_le_bytes()).unwrap(), limit));
    }
    assert!(
        store.decide_sync(&Request::new(victim, limit)).is_denied(),
        "the victim's state was lost"
    );
}

/// Counts the evictions a store reports.
#[derive(Default)]
struct Evictions(AtomicU64);

impl Observer for Evictions {
    fn on_evict(&self, store: &'static str, evicted: u64) {
        assert_eq!(store, distlimit_memory::STORE_NAME);
        self.0.fetch_add(evicted, Ordering::Relaxed);
    }
}

/// A slow policy and the key cap: a flood of unique keys, each spending one unit, evicts keys
/// that were not denied, so denied clients stay denied; every eviction is reported.
#[test]
fn denied_keys_stay_denied_through_a_flood_of_unique_keys() {
    let quota = Quota::per_hour(1).unwrap().with_burst(5).unwrap();
    for limit in [Limit::gcra(quota), Limit::token_bucket(quota)] {
        let evictions = Arc::new(Evictions::default());
        let store = MemoryStore::builder()
            .clock(ManualClock::new(1_700_000_000_000_000))
            .max_keys(64 * 500)
            .observer(evictions.clone())
            .build();
        let decide = |key: &str| store.decide_sync(&Request::new(Key::new(key).unwrap(), limit));
        let denied: Vec<String> = (0..20).map(|i| format!("denied-user-{i}")).collect();
        for key in &denied {
            while decide(key).is_allowed() {}
        }
        for i in 0..200_000 {
            store.clock().advance(std::time::Duration::from_micros(10));
            assert!(decide(&format!("user-{i}")).is_allowed());
        }
        assert!(store.len() <= store.max_keys());
        let evicted = store.evictions();
        assert!(
            evicted >= 200_000 - 64 * 500,
            "{limit:?}: {evicted} evictions"
        );
        assert_eq!(evictions.0.load(Ordering::Relaxed), evicted);
        // A victim chosen at random would leave each denied key with probability about
        // e^(−200 000 / 32 000) ≈ 0.2 %.
        let still_denied = denied.iter().filter(|key| decide(key).is_denied()).count();
        assert_eq!(still_denied, 20, "{limit:?}");
    }
}
