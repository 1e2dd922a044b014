//! Concurrency permits on real Redis servers: the permit conformance suite (client-time mode,
//! so the suite's clock drives expiry, and every acquire, release and renew is compared with the
//! reference model `Permits`), and on the server's own clock: the key's TTL follows its last
//! permit, expired permits come back, a bad value at the key is a typed error.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use distlimit_core::{Error, Key, PermitLimit, PermitRequest, PermitStore};
use distlimit_redis::{PERMIT_SUFFIX, RedisStore};
use support::RedisServer;

distlimit_test::permit_conformance_tests!(standalone, |clock| async move {
    support::standalone_store(clock, "permits", |b| b).await
});

distlimit_test::permit_conformance_tests!(uncoalesced, |clock| async move {
    support::standalone_store(clock, "permits-nc", |b| b.coalesce(false)).await
});

// Durable decisions (`durable(1, …)`): a primary with one replica.
distlimit_test::permit_conformance_tests!(durable, |clock| async move {
    support::durable_store(clock, "permits-durable").await
});

/// The permit suite on the Sentinel set and on the Cluster, check by check (each skips without
/// its servers outside `cargo xtask test`).
macro_rules! permit_checks {
    ($($name:ident => $check:ident,)*) => {
        mod sentinel {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let clock = distlimit_test::new_clock();
                    let tag = concat!("permits-", stringify!($name));
                    if let Some(store) = super::support::sentinel_store(clock.clone(), tag).await {
                        distlimit_test::$check(&std::sync::Arc::new(store), &clock).await;
                    }
                }
            )*
        }
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let clock = distlimit_test::new_clock();
                    let tag = concat!("permits-", stringify!($name));
                    if let Some(store) = super::support::cluster_store(clock.clone(), tag).await {
                        distlimit_test::$check(&std::sync::Arc::new(store), &clock).await;
                    }
                }
            )*
        }
        #[test]
        fn every_permit_check_runs_on_sentinel_and_cluster() {
            assert_eq!([$(stringify!($name)),*], distlimit_test::PERMIT_CHECKS);
        }
    };
}

permit_checks! {
    fresh_key_admits_max => check_permit_fresh_key_admits_max,
    release_frees_one_place => check_permit_release_frees_one_place,
    expires_after_lease => check_permit_expires_after_lease,
    renew_extends_lease => check_permit_renew_extends_lease,
    keys_and_states_are_independent => check_permit_keys_and_states_are_independent,
    concurrent_acquires_admit_exactly_max => check_permit_concurrent_acquires_admit_exactly_max,
    matches_model => check_permit_matches_model,
}

fn server() -> RedisServer {
    RedisServer::start().expect("a redis-server binary for the permit tests")
}

/// With the server's `TIME`: the permit set expires with its last permit (PTTL within the
/// lease), permits nobody releases come back after the lease, and the set disappears when its
/// last permit is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_time_leases_expire_and_keys_disappear() {
    let server = server();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let mut conn = server.connection().unwrap();
    let limit = PermitLimit::new(2, Duration::from_millis(300)).unwrap();
    let request = PermitRequest::new(Key::new("user:{7}").unwrap(), limit);
    let permit_key = store.permit_key("", Key::new("user:{7}").unwrap());
    assert!(permit_key.ends_with(PERMIT_SUFFIX));
    assert_ne!(
        permit_key,
        store.redis_key("", Key::new("user:{7}").unwrap())
    );

    let a = store.acquire(&request).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let b = store.acquire(&request).await.unwrap();
    assert!(a.is_allowed() && b.is_allowed());
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&permit_key)
        .query(&mut conn)
        .unwrap();
    assert!(
        (150..=301).contains(&pttl),
        "PTTL {pttl} ms, expected the last permit's lease"
    );
    let denied = store.acquire(&request).await.unwrap();
    assert!(denied.is_denied() && denied.retry_after() <= Duration::from_millis(150));

    // Nobody releases `a` (a crashed holder): it comes back after its lease, reported expired.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let c = store.acquire(&request).await.unwrap();
    assert!(
        c.is_allowed() && c.expired() == 1 && c.in_flight() == 2,
        "{c:?}"
    );
    assert!(!store.release(&request, a.permit().unwrap()).await.unwrap());
    // Nobody releases `b` and `c`: the whole set expires with them.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&permit_key)
        .query(&mut conn)
        .unwrap();
    assert_eq!(exists, 0, "the set must expire with its last permit");
    let d = store.acquire(&request).await.unwrap();
    assert!(d.is_allowed() && d.in_flight() == 1, "{d:?}");
    assert!(store.release(&request, d.permit().unwrap()).await.unwrap());
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&permit_key)
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        exists, 0,
        "the set must disappear with its last permit released"
    );
}

/// A value of another type at the permit key is the request's `BadState` error, and stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_value_at_the_permit_key_is_bad_state() {
    let server = server();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let mut conn = server.connection().unwrap();
    let key = Key::new("k").unwrap();
    let permit_key = store.permit_key("p", key);
    let _: () = redis::cmd("SET")
        .arg(&permit_key)
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let limit = PermitLimit::new(2, Duration::from_secs(1)).unwrap();
    let request = PermitRequest::new(key, limit).with_policy("p").unwrap();
    let err = store.acquire(&request).await.unwrap_err();
    assert!(matches!(err, Error::BadState { .. }), "{err:?}");
    let value: String = redis::cmd("GET").arg(&permit_key).query(&mut conn).unwrap();
    assert_eq!(value, "x");
}
