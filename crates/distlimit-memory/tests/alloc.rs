//! Allocation counting: a decision on a key the store already holds allocates nothing, and a
//! key costs a bounded number of bytes.

use distlimit_core::{Algorithm, Key, Limit, ManualClock, Quota, Request};
use distlimit_memory::MemoryStore;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const KEYS: u64 = 20_000;

// One test: dhat counts for the whole process, so nothing else may run beside it.
#[test]
fn decisions_on_known_keys_allocate_nothing_and_keys_cost_bounded_bytes() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let clock = ManualClock::new(1_700_000_000_000_000);

    // Bytes per key: GCRA states of 8-byte keys (16-byte entries), of 40-byte keys (64-byte
    // entries); token-bucket states of 8-byte keys (32-byte entries) and of 40-byte keys
    // (64-byte wide entries and the key on the heap).
    let gcra = Limit::gcra(Quota::per_second(10).unwrap());
    let bucket = Limit::token_bucket(Quota::per_second(10).unwrap());
    for (name, limit, key_len, bound) in [
        ("gcra, 8-byte", gcra, 8usize, 40u64),
        ("gcra, 40-byte", gcra, 40, 130),
        ("token bucket, 8-byte", bucket, 8, 80),
        ("token bucket, 40-byte", bucket, 40, 170),
    ] {
        let before = dhat::HeapStats::get();
        let store = MemoryStore::builder().clock(clock.clone()).build();
        for i in 0..KEYS {
            let mut key = vec![b'k'; key_len];
            key[..8].copy_from_slice(&i.to_le_bytes());
            store.decide_sync(&Request::new(Key::new(&key).unwrap(), limit));
        }
        let after = dhat::HeapStats::get();
        let per_key = (after.curr_bytes - before.curr_bytes) as u64 / KEYS;
        eprintln!("{name} keys: {per_key} bytes per key");
        assert!(per_key <= bound, "{name} keys cost {per_key} B each");
        drop(store);
    }

    for algorithm in Algorithm::ALL {
        let store = MemoryStore::builder().clock(clock.clone()).build();
        // A 4 µs period with the clock moving 1 to 3 µs a round: sliding logs stay short (a log
        // grows with the traffic inside its window, and growing is not a steady state).
        let limit = Limit::new(
            algorithm,
            Quota::from_parts(1_000_000_000, 4, 1_000_000_000).unwrap(),
        );
        let keys: Vec<[u8; 8]> = (0..1_000u64).map(u64::to_le_bytes).collect();
        let long_keys: Vec<String> = (0..1_000).map(|i| format!("user-{i:035}")).collect();
        let run = |rounds: u64| {
            for round in 0..rounds {
                clock.advance(std::time::Duration::from_micros(1 + round % 3));
                for key in &keys {
                    store.decide_sync(&Request::new(Key::new(key).unwrap(), limit));
                }
                for key in &long_keys {
                    let request = Request::new(Key::new(key).unwrap(), limit).with_cost(2);
                    store.decide_sync(&request);
                    store.decide_sync(&Request::peek(Key::new(key).unwrap(), limit));
                }
            }
        };
        // Warm up: insert every key (and let sliding logs reach their steady length).
        run(3);
        let before = dhat::HeapStats::get();
        run(20);
        let after = dhat::HeapStats::get();
        assert_eq!(
            after.total_blocks - before.total_blocks,
            0,
            "{algorithm}: {} allocations in {} decisions on known keys",
            after.total_blocks - before.total_blocks,
            20 * 3_000
        );
    }
}
