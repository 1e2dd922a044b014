//! A global tier next to per-key tiers on the Cluster: the two states live in different slots,
//! so a batch is decided one slot at a time, the global tier first, and a later denial gives the
//! earlier units back. Never more admitted than either limit allows, with many concurrent
//! clients on several keys.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use distlimit_core::{Algorithm, Key, Limit, Quota, Request, Store};
use distlimit_redis::{RedisStore, hash_slot};

const GLOBAL: &str = "*";

fn tiers<'a>(user: &'a str, global: Limit, per_key: Limit) -> [Request<'a>; 2] {
    [
        Request::new(Key::new(GLOBAL).unwrap(), global)
            .with_policy("endpoint")
            .unwrap(),
        Request::new(Key::new(user).unwrap(), per_key)
            .with_policy("user")
            .unwrap(),
    ]
}

async fn cluster(tag: &str) -> Option<RedisStore> {
    let urls = support::cluster_urls()?;
    Some(
        support::connect(
            RedisStore::cluster(urls).prefix(support::unique_prefix(tag)),
            "Cluster",
        )
        .await,
    )
}

/// What a peek says is left on `user`'s state of `policy`.
async fn left(store: &RedisStore, policy: &str, user: &str, limit: Limit) -> u64 {
    let peek = Request::peek(Key::new(user).unwrap(), limit)
        .with_policy(policy)
        .unwrap();
    store.decide(&peek).await.unwrap().remaining()
}

/// What is left of the global tier: never more than `exact`, and `exact` once the refunds'
/// transient shortfall has passed (GCRA and the token bucket credit a refund less the time
/// since the charge, a few milliseconds of a 12-minute emission interval here).
async fn settles_at(store: &RedisStore, limit: Limit, exact: u64, what: &str) {
    let start = Instant::now();
    loop {
        let now = left(store, "endpoint", GLOBAL, limit).await;
        assert!(
            now <= exact,
            "{what}: {now} left of the global tier, at most {exact}"
        );
        if now == exact {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{what}: {now} left of the global tier, {exact} expected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_global_tier_and_a_per_key_tier_are_decided_across_slots() {
    let Some(store) = cluster("tiers").await else {
        return;
    };
    let users = ["alice", "bob", "carol", "dave"];
    for user in users {
        assert_ne!(
            hash_slot(&store.redis_key("user", Key::new(user).unwrap())),
            hash_slot(&store.redis_key("endpoint", Key::new(GLOBAL).unwrap())),
            "the test needs the tiers in different slots"
        );
    }
    for algorithm in Algorithm::ALL {
        let global = Limit::new(algorithm, Quota::per_hour(5).unwrap());
        let per_key = Limit::new(algorithm, Quota::per_hour(2).unwrap());
        let what = |s: &str| format!("{algorithm}: {s}");
        let store = cluster(&format!("tiers-{algorithm}")).await.unwrap();

        // alice: two admitted; the third is denied by her own tier, and the global unit it
        // took first is given back.
        for i in 0..2 {
            let d = store
                .decide_all(&tiers(users[0], global, per_key))
                .await
                .unwrap();
            assert!(
                d.iter().all(|d| d.is_allowed()),
                "{}",
                what(&format!("{i}: {d:?}"))
            );
        }
        let d = store
            .decide_all(&tiers(users[0], global, per_key))
            .await
            .unwrap();
        assert!(d[1].is_denied(), "{}", what(&format!("{d:?}")));
        settles_at(&store, global, 3, &what("after alice's denial")).await;

        // bob takes two, carol one: the global tier is spent.
        for user in [users[1], users[1], users[2]] {
            let d = store
                .decide_all(&tiers(user, global, per_key))
                .await
                .unwrap();
            assert!(
                d.iter().all(|d| d.is_allowed()),
                "{}",
                what(&format!("{user}: {d:?}"))
            );
        }
        // dave is denied by the global tier; his own tier is not charged.
        let d = store
            .decide_all(&tiers(users[3], global, per_key))
            .await
            .unwrap();
        assert!(d[0].is_denied(), "{}", what(&format!("{d:?}")));
        assert!(d[1].is_allowed(), "{}", what(&format!("{d:?}")));
        assert_eq!(
            left(&store, "user", users[3], per_key).await,
            2,
            "{}",
            what("dave")
        );
        assert_eq!(
            left(&store, "endpoint", GLOBAL, global).await,
            0,
            "{}",
            what("spent")
        );

        // Per-key tier first: the batch's order is the order of the slots.
        let d = store
            .decide_all(&[
                tiers(users[3], global, per_key)[1],
                tiers(users[3], global, per_key)[0],
            ])
            .await
            .unwrap();
        assert!(
            d[0].is_allowed() && d[1].is_denied(),
            "{}",
            what(&format!("{d:?}"))
        );
        let start = Instant::now();
        while left(&store, "user", users[3], per_key).await != 2 {
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "{}",
                what("dave's unit given back")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_never_exceed_either_tier() {
    let Some(_) = support::cluster_urls() else {
        return;
    };
    const GLOBAL_LIMIT: u64 = 20;
    const PER_KEY_LIMIT: u64 = 3;
    const USERS: usize = 8;
    const TASKS: usize = 16;
    const ATTEMPTS: usize = 12;
    for algorithm in Algorithm::ALL {
        let store = cluster(&format!("tiers-race-{algorithm}")).await.unwrap();
        let global = Limit::new(algorithm, Quota::per_hour(GLOBAL_LIMIT).unwrap());
        let per_key = Limit::new(algorithm, Quota::per_hour(PER_KEY_LIMIT).unwrap());
        let admitted: Arc<[AtomicU64; USERS]> = Arc::new(Default::default());
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let (store, admitted) = (store.clone(), admitted.clone());
                tokio::spawn(async move {
                    for i in 0..ATTEMPTS {
                        let u = (t + i) % USERS;
                        let user = format!("user-{u}");
                        let d = store
                            .decide_all(&tiers(&user, global, per_key))
                            .await
                            .unwrap();
                        if d.iter().all(|d| d.is_allowed()) {
                            admitted[u].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let per_user: Vec<u64> = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        let total: u64 = per_user.iter().sum();
        assert!(
            per_user.iter().all(|&n| n <= PER_KEY_LIMIT),
            "{algorithm}: a user admitted beyond the per-key limit: {per_user:?}"
        );
        assert!(
            total <= GLOBAL_LIMIT,
            "{algorithm}: {total} admitted beyond the global limit: {per_user:?}"
        );
        assert!(total > 0, "{algorithm}: nothing admitted");
        // Every unit the global tier holds is an admitted request's: the refunds of the
        // denied ones gave theirs back.
        settles_at(&store, global, GLOBAL_LIMIT - total, algorithm.name()).await;
        for (u, &n) in per_user.iter().enumerate() {
            let user = format!("user-{u}");
            let start = Instant::now();
            loop {
                let now = left(&store, "user", &user, per_key).await;
                assert!(now <= PER_KEY_LIMIT - n, "{algorithm}: {user}: {now} left");
                if now == PER_KEY_LIMIT - n {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(2),
                    "{algorithm}: {user}: {now} left, {} expected",
                    PER_KEY_LIMIT - n
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// A deterministic pseudo-random sequence (SplitMix64), so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

/// With the clock standing still during a batch (client time), a refund is exact: random
/// sequences of cross-slot batches, with random costs, tier orders and pauses, decide step by
/// step exactly as the memory store's atomic batches (the reference model) do, for every
/// algorithm.
#[tokio::test]
async fn cross_slot_batches_decide_as_the_model_when_time_stands_still() {
    let Some(_) = support::cluster_urls() else {
        return;
    };
    for algorithm in Algorithm::ALL {
        for seed in 0..4u64 {
            let clock = distlimit_test::new_clock();
            let redis = support::cluster_store(clock.clone(), &format!("tiers-model-{algorithm}"))
                .await
                .unwrap();
            let memory = distlimit_memory::MemoryStore::with_clock(clock.clone());
            let mut rng = Rng(seed * 31 + algorithm.name().len() as u64);
            let global = Limit::new(algorithm, Quota::from_parts(6, 2_000_000, 8).unwrap());
            let per_key = Limit::new(algorithm, Quota::from_parts(3, 1_000_000, 4).unwrap());
            let users = ["u0", "u1", "u2"];
            for step in 0..150 {
                let user = users[rng.below(3) as usize];
                let [g, k] = tiers(user, global, per_key);
                let (g, k) = (g.with_cost(rng.below(3)), k.with_cost(1 + rng.below(2)));
                let batch = if rng.below(4) == 0 { [k, g] } else { [g, k] };
                let want = memory.decide_all(&batch).await.unwrap();
                let got = redis.decide_all(&batch).await.unwrap();
                assert_eq!(
                    got, want,
                    "{algorithm}, seed {seed}, step {step}: {batch:?}"
                );
                clock.advance(Duration::from_micros(rng.below(400_000)));
            }
        }
    }
}
