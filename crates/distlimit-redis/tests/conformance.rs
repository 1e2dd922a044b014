//! The `distlimit-test` conformance suite against real Redis servers: standalone (multiplexed and
//! pooled), Sentinel and Cluster, each store in client-time mode on the check's `ManualClock` and
//! under a key prefix of its own, so suites sharing a server never meet.
//!
//! * `standalone`, `pool`: the whole suite through `distlimit_test::conformance_tests!`, on
//!   `DISTLIMIT_REDIS_URL` (or, outside `cargo xtask test`, a private `redis-server`).
//! * `durable`: the whole suite on a durable store (`durable(1, …)`, every admission waits
//!   for the `WAIT` of one replica), on a private primary with one replica.
//! * `sentinel`: the whole suite, check by check (so that it can skip without a Sentinel set
//!   outside `cargo xtask test`); `sentinel::runs_every_check` proves none is left out.
//! * `cluster`: every check but three, the ones whose batches span several identities (several
//!   slots, decided slot by slot): `key_bytes_are_opaque`, `decide_all_is_all_or_nothing` and
//!   `concurrent_batches_are_atomic` run in `tests/cluster_conformance.rs`. `cluster_batches`
//!   checks the same properties with one identity's policies (one script), and
//!   `cluster::runs_every_other_check` proves nothing else is left out.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::sync::Arc;

use distlimit_core::{Algorithm, Decision, Key, Limit, Quota, Request, Store};

distlimit_test::conformance_tests!(standalone, |clock| async move {
    support::standalone_store(clock, "standalone", |b| b).await
});

distlimit_test::conformance_tests!(pool, |clock| async move {
    support::standalone_store(clock, "pool", |b| b.pool(8)).await
});

distlimit_test::conformance_tests!(standalone_hashed, |clock| async move {
    support::standalone_store(clock, "hashed", |b| b.hash_identities(true)).await
});

// Durable decisions, as `--redis-durable-replicas 1` builds them: a primary with one replica.
distlimit_test::conformance_tests!(durable, |clock| async move {
    support::durable_store(clock, "durable").await
});

/// One `#[tokio::test]` per named check, on a store from `$factory(clock, tag)` (`None`: skip),
/// and `NAMES`, the checks run.
macro_rules! checks {
    ($factory:path, $tag:literal; $($name:ident => $check:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let clock = distlimit_test::new_clock();
                let Some(store) = $factory(clock.clone(), $tag).await else {
                    return;
                };
                let store = std::sync::Arc::new(store);
                distlimit_test::$check(&store, &clock).await;
            }
        )*

        /// The checks this module runs.
        const NAMES: &[&str] = &[$(stringify!($name)),*];
    };
}

mod sentinel {
    use super::*;

    checks! {
        support::sentinel_store, "sentinel";
        fresh_key_admits_capacity => check_fresh_key_admits_capacity,
        retry_after_is_exact => check_retry_after_is_exact,
        matches_reference_model => check_matches_reference_model,
        peek_changes_nothing => check_peek_changes_nothing,
        cost_above_capacity_is_never => check_cost_above_capacity_is_never,
        denied_request_is_not_charged => check_denied_request_is_not_charged,
        keys_are_independent => check_keys_are_independent,
        key_bytes_are_opaque => check_key_bytes_are_opaque,
        decide_all_is_all_or_nothing => check_decide_all_is_all_or_nothing,
        decide_all_rejects_invalid_batches => check_decide_all_rejects_invalid_batches,
        limit_change_follows_model => check_limit_change_follows_model,
        clock_going_backwards_follows_model => check_clock_going_backwards_follows_model,
        idle_key_decides_as_fresh => check_idle_key_decides_as_fresh,
        concurrent_requests_admit_exactly_limit => check_concurrent_requests_admit_exactly_limit,
        concurrent_batches_are_atomic => check_concurrent_batches_are_atomic,
        store_ext_validates_keys => check_store_ext_validates_keys,
        policies_are_independent => check_policies_are_independent,
        settling_follows_model => check_settling_follows_model,
    }

    #[test]
    fn runs_every_check() {
        let mut ours = NAMES.to_vec();
        let mut all = distlimit_test::CHECKS.to_vec();
        ours.sort_unstable();
        all.sort_unstable();
        assert_eq!(ours, all, "the Sentinel module must run the whole suite");
    }
}

mod cluster {
    use super::*;

    /// Checks that batch several identities: in `tests/cluster_conformance.rs`.
    const MULTI_IDENTITY_BATCHES: &[&str] = &[
        "key_bytes_are_opaque",
        "decide_all_is_all_or_nothing",
        "concurrent_batches_are_atomic",
    ];

    checks! {
        support::cluster_store, "cluster";
        fresh_key_admits_capacity => check_fresh_key_admits_capacity,
        retry_after_is_exact => check_retry_after_is_exact,
        matches_reference_model => check_matches_reference_model,
        peek_changes_nothing => check_peek_changes_nothing,
        cost_above_capacity_is_never => check_cost_above_capacity_is_never,
        denied_request_is_not_charged => check_denied_request_is_not_charged,
        keys_are_independent => check_keys_are_independent,
        decide_all_rejects_invalid_batches => check_decide_all_rejects_invalid_batches,
        limit_change_follows_model => check_limit_change_follows_model,
        clock_going_backwards_follows_model => check_clock_going_backwards_follows_model,
        idle_key_decides_as_fresh => check_idle_key_decides_as_fresh,
        concurrent_requests_admit_exactly_limit => check_concurrent_requests_admit_exactly_limit,
        store_ext_validates_keys => check_store_ext_validates_keys,
        policies_are_independent => check_policies_are_independent,
        settling_follows_model => check_settling_follows_model,
    }

    #[test]
    fn runs_every_other_check() {
        let mut ours = NAMES.to_vec();
        ours.extend_from_slice(MULTI_IDENTITY_BATCHES);
        ours.sort_unstable();
        let mut all = distlimit_test::CHECKS.to_vec();
        all.sort_unstable();
        assert_eq!(
            ours, all,
            "the Cluster module must run every check but the multi-identity batches"
        );
    }
}

/// What the three checks left out on the Cluster verify, with batches over one identity's
/// policies: all-or-nothing, atomic under concurrency, tricky key bytes.
mod cluster_batches {
    use super::*;

    const HOUR: u64 = 3_600_000_000;

    fn quota(limit: u64, burst: u64) -> Quota {
        Quota::from_parts(limit, HOUR, burst).unwrap()
    }

    fn named<'a>(key: Key<'a>, policy: &'a str, limit: Limit, cost: u64) -> Request<'a> {
        Request::new(key, limit)
            .with_cost(cost)
            .with_policy(policy)
            .unwrap()
    }

    async fn store(tag: &str) -> Option<distlimit_redis::RedisStore> {
        support::cluster_store(distlimit_test::new_clock(), tag).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn one_identity_batches_are_all_or_nothing() {
        let Some(store) = store("cluster-all-or-nothing").await else {
            return;
        };
        for (i, &algorithm) in Algorithm::ALL.iter().enumerate() {
            let id = format!("user-{{{i}}}\0é");
            let key = Key::new(&id).unwrap();
            let la = Limit::new(algorithm, quota(10, 10));
            let lb = Limit::new(Algorithm::ALL[(i + 1) % 5], quota(3, 3));
            let lc = Limit::new(Algorithm::ALL[(i + 2) % 5], quota(8, 8));
            let tiers = [
                named(key, "a", la, 1),
                named(key, "b", lb, 1),
                named(key, "c", lc, 2),
            ];
            for _ in 0..3 {
                let ds = store.decide_all(&tiers).await.unwrap();
                assert!(ds.iter().all(Decision::is_allowed), "{algorithm}: {ds:?}");
            }
            let ds = store.decide_all(&tiers).await.unwrap();
            assert!(
                ds[0].is_allowed() && ds[1].is_denied() && ds[2].is_allowed(),
                "{algorithm}: {ds:?}"
            );
            let a = store.decide(&named(key, "a", la, 0)).await.unwrap();
            let c = store.decide(&named(key, "c", lc, 0)).await.unwrap();
            assert_eq!((a.remaining(), c.remaining()), (7, 2), "{algorithm}");
            // A cost above capacity makes the batch impossible and charges nobody.
            let ds = store
                .decide_all(&[named(key, "a", la, 1), named(key, "d", la, 11)])
                .await
                .unwrap();
            assert!(ds[0].is_allowed() && ds[1].is_never(), "{ds:?}");
            let a = store.decide(&named(key, "a", la, 0)).await.unwrap();
            assert_eq!(a.remaining(), 7);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_one_identity_batches_are_atomic() {
        const TASKS: usize = 32;
        let Some(store) = store("cluster-concurrent").await else {
            return;
        };
        let store = Arc::new(store);
        for (i, &algorithm) in Algorithm::ALL.iter().enumerate() {
            let shared = Limit::new(algorithm, quota(10, 10));
            let own = Limit::new(Algorithm::ALL[(i + 3) % 5], quota(5, 5));
            let id: Arc<str> = format!("race-{i}-{{}}").into();
            let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
            let tasks: Vec<_> = (0..TASKS)
                .map(|t| {
                    let (store, id, barrier) = (store.clone(), id.clone(), barrier.clone());
                    tokio::spawn(async move {
                        let key = Key::new(&*id).unwrap();
                        let policy = format!("own-{t}");
                        let s = named(key, "shared", shared, 1);
                        let o = named(key, &policy, own, 1);
                        barrier.wait().await;
                        let batch = if t % 2 == 0 { [s, o] } else { [o, s] };
                        let ds = store.decide_all(&batch).await.unwrap();
                        let (s, o) = if t % 2 == 0 {
                            (ds[0], ds[1])
                        } else {
                            (ds[1], ds[0])
                        };
                        assert!(o.is_allowed());
                        let left = store
                            .decide(&named(key, &policy, own, 0))
                            .await
                            .unwrap()
                            .remaining();
                        (s.is_allowed(), left)
                    })
                })
                .collect();
            let mut admitted = 0;
            for task in tasks {
                let (allowed, left) = task.await.unwrap();
                assert_eq!(left, if allowed { 4 } else { 5 }, "{algorithm}");
                admitted += usize::from(allowed);
            }
            assert_eq!(admitted, 10, "{algorithm}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn tricky_identities_are_distinct_and_batch_with_their_policies() {
        let Some(store) = store("cluster-tricky").await else {
            return;
        };
        let ids: Vec<Vec<u8>> = [
            &b"a{b}"[..],
            b"a{b",
            b"{a}b",
            b"a}b{",
            b"{}",
            b"{a}",
            b"a",
            b"a\0b",
            b"%7Ba%7D",
            b"\xff",
            "😀".as_bytes(),
        ]
        .iter()
        .map(|s| [b"tricky:".as_slice(), s].concat())
        .chain([vec![b'{'; distlimit_core::MAX_KEY_LEN]])
        .collect();
        let limit = Limit::gcra(quota(64, 64));
        for (j, id) in ids.iter().enumerate() {
            let key = Key::new(id).unwrap();
            let d = store
                .decide(&Request::new(key, limit).with_cost(j as u64 + 1))
                .await
                .unwrap();
            assert_eq!(d.remaining(), 64 - (j as u64 + 1), "{key:?}");
            let batch = [named(key, "", limit, 0), named(key, "x", limit, 1)];
            let ds = store.decide_all(&batch).await.unwrap();
            assert!(ds.iter().all(Decision::is_allowed), "{key:?}: {ds:?}");
        }
        for (j, id) in ids.iter().enumerate() {
            let key = Key::new(id).unwrap();
            let p = store.decide(&Request::peek(key, limit)).await.unwrap();
            assert_eq!(p.remaining(), 64 - (j as u64 + 1), "{key:?}");
        }
        // Several identities in one batch: decided across their slots.
        let a = Key::new(&ids[0]).unwrap();
        let b = Key::new(&ids[1]).unwrap();
        let r = store
            .decide_all(&[Request::new(a, limit), Request::new(b, limit)])
            .await;
        assert!(
            matches!(&r, Ok(ds) if ds.iter().all(Decision::is_allowed)),
            "{r:?}"
        );
    }
}
