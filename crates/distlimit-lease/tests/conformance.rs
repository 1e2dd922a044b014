//! The conformance suite on `Leased`, every policy leasing, over the memory store (`memory`),
//! over a real Redis (`redis`, in client-time mode on the check's clock: `DISTLIMIT_REDIS_URL`,
//! or a private `redis-server` outside `cargo xtask test`), and over the hybrid store of that
//! Redis and memory (`hybrid`, as `--lease` assembles it): the checks a lease meets exactly run
//! here, check by check, on both; `NOT_APPLICABLE` names the others and why, and
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
use std::time::Duration;

use distlimit_core::ManualClock;
use distlimit_hybrid::Hybrid;
use distlimit_lease::Leased;
use distlimit_memory::MemoryStore;
use distlimit_redis::RedisStore;
use distlimit_test::server::{self, RedisServer};

fn memory(clock: ManualClock) -> Arc<Leased<MemoryStore<ManualClock>>> {
    Arc::new(
        Leased::matching(|_| true)
            .clock(clock.clone())
            .build(MemoryStore::with_clock(clock)),
    )
}

/// `Leased` over Redis, and the private server it runs on, if any (killed when it drops).
type OnRedis = (Arc<Leased<RedisStore>>, Option<RedisServer>);

/// A Redis store in client-time mode on `clock`, under a prefix of its own, and the private
/// server it runs on, if any.
async fn connect(clock: ManualClock) -> (RedisStore, Option<RedisServer>) {
    let (url, own) = match std::env::var(server::ENV_URL) {
        Ok(url) if !url.trim().is_empty() => (url.trim().to_owned(), None),
        _ => {
            assert!(!server::required(), "{} is not set", server::ENV_URL);
            let own = RedisServer::start().expect("a redis-server binary");
            (own.url(), Some(own))
        }
    };
    let mut prefix = distlimit_test::unique_prefix("lease");
    prefix.pop(); // the key layout adds its own separator
    let store = RedisStore::builder(url)
        .prefix(prefix)
        .client_clock(clock)
        .connect()
        .await
        .unwrap();
    (store, own)
}

async fn redis(clock: ManualClock) -> OnRedis {
    let (store, own) = connect(clock.clone()).await;
    let leased = Leased::matching(|_| true).clock(clock).build(store);
    (Arc::new(leased), own)
}

type OnHybrid = Hybrid<RedisStore, MemoryStore<ManualClock>, ManualClock>;

/// `Leased` over the hybrid store of Redis and memory, as the binaries assemble `--lease` (its
/// blocked-key cache off).
async fn hybrid(clock: ManualClock) -> (Arc<Leased<OnHybrid>>, Option<RedisServer>) {
    let (redis, own) = connect(clock.clone()).await;
    let hybrid = Hybrid::builder(redis, MemoryStore::with_clock(clock.clone()))
        .clock(clock.clone())
        .budget(Duration::from_secs(10))
        // Its answers say `Source::BlockedCache`, which the exact comparison rejects by design
        // (as in the hybrid's own conformance runs).
        .blocked_cache(None)
        .build()
        .unwrap();
    let leased = Leased::matching(|_| true).clock(clock).build(hybrid);
    (Arc::new(leased), own)
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
        mod memory {
            use super::memory;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let clock = distlimit_test::new_clock();
                    let store = memory(clock.clone());
                    distlimit_test::$check(&store, &clock).await;
                }
            )*
        }
        mod hybrid {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let clock = distlimit_test::new_clock();
                    let (store, _server) = super::hybrid(clock.clone()).await;
                    distlimit_test::$check(&store, &clock).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let clock = distlimit_test::new_clock();
                    let (store, _server) = super::redis(clock.clone()).await;
                    distlimit_test::$check(&store, &clock).await;
                }
            )*
        }
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
