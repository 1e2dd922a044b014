//! A value at a distlimit key that is not a valid state (another Redis type, garbage, an empty
//! string, written by another client): an [`Error::BadState`] of that request only, for every
//! algorithm, alone and in batches, on a standalone server and on the Cluster. The value is never
//! replaced, however many consuming requests come; once an operator deletes it, the key decides
//! as a fresh one.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use distlimit_core::{Algorithm, Error, Key, Limit, Quota, Request, Store, StoreExt};
use distlimit_redis::RedisStore;
use redis::aio::ConnectionLike;

/// The bad values: how each is written, and a word its error names.
#[derive(Clone, Copy, Debug)]
enum Bad {
    List,
    Hash,
    Garbage,
    Empty,
    /// The right tag byte, a wrong length.
    Truncated,
}

const BAD: [Bad; 5] = [
    Bad::List,
    Bad::Hash,
    Bad::Garbage,
    Bad::Empty,
    Bad::Truncated,
];

impl Bad {
    fn write(self, key: &[u8]) -> redis::Cmd {
        match self {
            Bad::List => redis::cmd("RPUSH").arg(key).arg("x").clone(),
            Bad::Hash => redis::cmd("HSET").arg(key).arg("f").arg("v").clone(),
            Bad::Garbage => redis::cmd("SET").arg(key).arg("not a state").clone(),
            Bad::Empty => redis::cmd("SET").arg(key).arg("").clone(),
            Bad::Truncated => redis::cmd("SET").arg(key).arg(&[1u8, 0, 0][..]).clone(),
        }
    }

    fn named(self) -> &'static str {
        match self {
            Bad::List | Bad::Hash => "WRONGTYPE",
            _ => "corrupt",
        }
    }
}

/// What is at `key` now, as `DUMP` serializes it (type and content), and its TTL.
async fn snapshot<C: ConnectionLike + Send>(conn: &mut C, key: &[u8]) -> (Vec<u8>, i64) {
    let dump: Vec<u8> = redis::cmd("DUMP").arg(key).query_async(conn).await.unwrap();
    let ttl: i64 = redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap();
    (dump, ttl)
}

fn expect_bad_state<T: std::fmt::Debug>(result: Result<T, Error>, bad: Bad, what: &str) {
    match result {
        Err(e @ Error::BadState { .. }) => {
            assert!(!e.is_transient(), "{what}");
            assert_eq!(e.kind(), "bad_state", "{what}");
            let message = e.to_string();
            assert!(message.contains(bad.named()), "{what}: {message}");
        }
        other => panic!("{what}: expected Error::BadState, got {other:?}"),
    }
}

/// Every algorithm, every bad value: single requests (peek, one unit, above the capacity) and
/// batches next to a good state of the same identity (one slot in a Cluster), again and again;
/// the value stays exactly as written, the good state is never charged, and after `DEL` the key
/// decides as a fresh one.
async fn bad_values_are_bad_state_and_left_alone<C: ConnectionLike + Send>(
    store: &RedisStore,
    conn: &mut C,
) {
    for algorithm in Algorithm::ALL {
        let limit = Limit::new(algorithm, Quota::per_hour(10).unwrap());
        for bad in BAD {
            let what = format!("{algorithm}, {bad:?}");
            let identity = format!("{algorithm}-{bad:?}");
            let key = Key::new(&identity).unwrap();
            let redis_key = store.redis_key("bad", key);
            let _: redis::Value = bad.write(&redis_key).query_async(conn).await.unwrap();
            let before = snapshot(conn, &redis_key).await;
            let request = Request::new(key, limit).with_policy("bad").unwrap();
            for _ in 0..3 {
                for cost in [0, 1, 11] {
                    let result = store.decide(&request.with_cost(cost)).await;
                    expect_bad_state(result, bad, &format!("{what}, cost {cost}"));
                }
                let good = Request::new(key, limit).with_policy("good").unwrap();
                for batch in [[good, request], [request, good]] {
                    let result = store.decide_all(&batch).await;
                    expect_bad_state(result, bad, &format!("{what}, batch"));
                }
            }
            assert_eq!(
                snapshot(conn, &redis_key).await,
                before,
                "{what}: left as it was"
            );
            let good = store
                .decide(&Request::peek(key, limit).with_policy("good").unwrap())
                .await
                .unwrap();
            assert_eq!(
                good.remaining(),
                10,
                "{what}: a failed batch charges nothing"
            );

            // The operator removes the value: the key is fresh again.
            let _: i64 = redis::cmd("DEL")
                .arg(&redis_key)
                .query_async(conn)
                .await
                .unwrap();
            let d = store.decide(&request).await.unwrap();
            assert!(d.is_allowed() && d.remaining() == 9, "{what}: {d:?}");
        }
    }
}

#[tokio::test]
async fn standalone_bad_values_are_bad_state_and_left_alone() {
    let Some(url) = support::standalone_url() else {
        return;
    };
    let store = RedisStore::builder(&url)
        .prefix(support::unique_prefix("bad-state"))
        .connect()
        .await
        .unwrap();
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    bad_values_are_bad_state_and_left_alone(&store, &mut conn).await;
}

#[tokio::test]
async fn cluster_bad_values_are_bad_state_and_left_alone() {
    let Some(urls) = support::cluster_urls() else {
        return;
    };
    let store = support::connect(
        RedisStore::cluster(urls.clone()).prefix(support::unique_prefix("bad-state")),
        "Cluster",
    )
    .await;
    let mut conn = redis::cluster::ClusterClient::new(urls)
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    bad_values_are_bad_state_and_left_alone(&store, &mut conn).await;
}

/// A bad value at one key is that key's error: other keys decide as usual, on the same
/// connection, between and after its errors.
#[tokio::test]
async fn one_bad_key_leaves_the_others_deciding() {
    let Some(url) = support::standalone_url() else {
        return;
    };
    for pool in [None, Some(2)] {
        let mut builder = RedisStore::builder(&url).prefix(support::unique_prefix("bad-one"));
        if let Some(size) = pool {
            builder = builder.pool(size);
        }
        let store = builder.connect().await.unwrap();
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let limit = Limit::gcra(Quota::per_hour(100).unwrap());
        let bad = store.redis_key("", Key::new("bad").unwrap());
        let _: () = redis::cmd("SET")
            .arg(&bad)
            .arg("garbage")
            .query_async(&mut conn)
            .await
            .unwrap();
        for i in 0..20 {
            expect_bad_state(store.check("bad", limit).await, Bad::Garbage, "bad key");
            let d = store.check(format!("good-{}", i % 4).as_str(), limit).await;
            assert!(d.as_ref().is_ok_and(|d| d.is_allowed()), "{pool:?}: {d:?}");
        }
    }
}

/// In a Cluster batch over several slots, a bad value in a later slot group is that request's
/// `BadState`, and the earlier group's units are given back (the clock stands still, so the
/// refund is exact for every algorithm).
#[tokio::test]
async fn cluster_bad_value_in_a_later_slot_refunds_the_earlier_one() {
    let Some(urls) = support::cluster_urls() else {
        return;
    };
    let clock = distlimit_test::new_clock();
    let store = support::cluster_store(clock, "bad-state-slots")
        .await
        .unwrap();
    let mut conn = redis::cluster::ClusterClient::new(urls)
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    for algorithm in Algorithm::ALL {
        let limit = Limit::new(algorithm, Quota::per_hour(10).unwrap());
        let global = Key::new("*").unwrap();
        let user = Key::new("bad-user").unwrap();
        let policy = algorithm.name();
        let bad = store.redis_key(policy, user);
        assert_ne!(
            distlimit_redis::hash_slot(&bad),
            distlimit_redis::hash_slot(&store.redis_key(policy, global))
        );
        let _: () = redis::cmd("SET")
            .arg(&bad)
            .arg("garbage")
            .query_async(&mut conn)
            .await
            .unwrap();
        let batch = [
            Request::new(global, limit).with_policy(policy).unwrap(),
            Request::new(user, limit).with_policy(policy).unwrap(),
        ];
        for _ in 0..3 {
            expect_bad_state(
                store.decide_all(&batch).await,
                Bad::Garbage,
                algorithm.name(),
            );
        }
        let peek = Request::peek(global, limit).with_policy(policy).unwrap();
        let left = store.decide(&peek).await.unwrap().remaining();
        assert_eq!(left, 10, "{algorithm}: refunded");
    }
}
