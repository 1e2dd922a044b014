//! Regional pools (`pool.lua`, the region store's op 6) against a Rust model of the pool, step
//! by step on random sequences of spends and deposits at random times (client time), on a
//! private `redis-server`: the reply and the stored state equal the model's, and every step
//! conserves units (what a pool holds changes only by what was given back, granted, sent home
//! and deposited). Also: a value at the key that is not a pool is the group's `BadState`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use distlimit_core::Error;
use distlimit_redis::test_hook::{POOL_REPLY, TimeSource, pool_step};
use distlimit_test::server::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::aio::MultiplexedConnection;

const EPOCH: u64 = distlimit_test::EPOCH_US;

/// A pool's state, as `pool.lua` stores it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Pool {
    units: u64,
    expires: u64,
    claim: u64,
    demand: u64,
    since: u64,
    denied: u64,
    failing: u64,
    target: u64,
    lag: u64,
}

/// The model of one step of `pool.lua`: the new state and the reply.
fn model(
    pool: Option<Pool>,
    now: u64,
    [horizon, capacity, claim_ttl, _keep]: [u64; 4],
    [action, a, b, c]: [u64; 4],
) -> (Pool, [u64; POOL_REPLY]) {
    let mut p = pool.unwrap_or(Pool {
        since: now,
        ..Pool::default()
    });
    let (mut granted, mut back, mut want) = (0, 0, 0);
    if action == 1 {
        p.units += a;
        let take = b.min(p.units);
        if take > 0 && take >= c {
            granted = take;
            p.units -= take;
        }
        p.demand += b;
        let expired = p.units > 0 && now >= p.expires && p.failing == 0;
        if now >= p.claim
            && (now >= p.denied || expired)
            && (p.units * 2 < p.target || granted < b || expired)
        {
            let elapsed = (now - p.since).max(1000);
            let span = (3 * p.lag).max(20_000).min(horizon);
            let t = (p.demand * span).div_ceil(elapsed).max(b).min(capacity);
            if expired {
                back = p.units;
                p.units = 0;
            }
            want = if b == 0 { 0 } else { t.saturating_sub(p.units) };
            if back > 0 || want > 0 {
                (p.claim, p.demand, p.since, p.target) = (now + claim_ttl, 0, now, t);
            }
        }
    } else {
        if p.claim > 0 {
            let took = (now as i128 - (p.claim as i128 - claim_ttl as i128)).max(0) as u64;
            p.lag = if p.lag == 0 {
                took
            } else {
                (3 * p.lag + took) / 4
            };
        }
        if c == 1 {
            p.units += a;
            (p.claim, p.failing, p.expires) = (0, 0, now + horizon);
            p.denied = if a == 0 { now + b } else { 0 };
        } else {
            (p.claim, p.failing) = (now + b, 1);
        }
    }
    let reply = [granted, p.units, back, want, p.denied, p.failing, now];
    (p, reply)
}

#[derive(Clone, Debug)]
enum Op {
    /// Give back, want, at least.
    Spend(u64, u64, u64),
    /// Granted, retry or backoff, home answered.
    Deposit(u64, u64, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..4, 0u64..12, 0u64..12).prop_map(|(a, b, c)| Op::Spend(a, b, c)),
        1 => (0u64..40, 0u64..300_000, prop::bool::weighted(0.8))
            .prop_map(|(a, b, ok)| Op::Deposit(a, b, ok)),
    ]
}

async fn read_state(conn: &mut MultiplexedConnection, key: &[u8]) -> Option<Pool> {
    let v: Option<Vec<u8>> = redis::cmd("GET").arg(key).query_async(conn).await.unwrap();
    let v = v?;
    assert_eq!((v.len(), v[0]), (73, 7), "a pool's state");
    let d: Vec<u64> = v[1..]
        .chunks_exact(8)
        .map(|c| f64::from_be_bytes(c.try_into().unwrap()) as u64)
        .collect();
    Some(Pool {
        units: d[0],
        expires: d[1],
        claim: d[2],
        demand: d[3],
        since: d[4],
        denied: d[5],
        failing: d[6],
        target: d[7],
        lag: d[8],
    })
}

async fn check(
    conn: &mut MultiplexedConnection,
    key: &[u8],
    parameters: [u64; 4],
    steps: Vec<(u64, Op)>,
) -> Result<(), TestCaseError> {
    let mut now = EPOCH;
    let mut pool = None;
    for (dt, op) in steps {
        now += dt;
        let action = match op {
            Op::Spend(a, b, c) => [1, a, b, c],
            Op::Deposit(a, b, ok) => [2, a, b, u64::from(ok)],
        };
        let before = pool.map_or(0, |p: Pool| p.units);
        let (next, expected) = model(pool, now, parameters, action);
        let reply = pool_step(conn, key, parameters, action, TimeSource::Client(now))
            .await
            .unwrap();
        prop_assert_eq!(reply, expected, "step {:?} at {}", action, now);
        prop_assert_eq!(read_state(conn, key).await, Some(next));
        // Conservation: the pool changes only by what was given back, granted, sent home and
        // deposited.
        let [granted, units, back, ..] = reply;
        let added = match op {
            Op::Spend(a, ..) => a,
            Op::Deposit(a, _, true) => a,
            Op::Deposit(..) => 0,
        };
        prop_assert_eq!(before + added, units + granted + back);
        let ttl: i64 = redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap();
        prop_assert!(ttl > 0 && ttl as u64 <= parameters[3]);
        pool = Some(next);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_lua_matches_the_model() {
    let server = RedisServer::start().expect("this test needs redis-server");
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 96,
        ..Config::default()
    });
    let keys = std::sync::atomic::AtomicU64::new(0);
    let strategy = (
        prop::sample::select(vec![30_000u64, 200_000, 1_000_000]),
        1u64..40,
        prop::collection::vec((0u64..150_000, op()), 1..40),
    );
    let handle = tokio::runtime::Handle::current();
    tokio::task::block_in_place(|| {
        runner
            .run(&strategy, |(horizon, capacity, steps)| {
                let n = keys.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let key = format!("pool-model:{n}").into_bytes();
                let parameters = [horizon, capacity, 100_000, 60_000];
                // A multiplexed connection is a cheap handle to one connection.
                let mut conn = conn.clone();
                handle.block_on(check(&mut conn, &key, parameters, steps))
            })
            .unwrap();
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_is_not_a_pool_is_bad_state() {
    let server = RedisServer::start().expect("this test needs redis-server");
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("SET")
        .arg("not-a-pool")
        .arg("hello")
        .query_async(&mut conn)
        .await
        .unwrap();
    let answer = pool_step(
        &mut conn,
        b"not-a-pool",
        [1_000_000, 10, 100_000, 60_000],
        [1, 0, 1, 1],
        TimeSource::Client(EPOCH),
    )
    .await;
    assert!(matches!(answer, Err(Error::BadState { .. })), "{answer:?}");
    let value: String = redis::cmd("GET")
        .arg("not-a-pool")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(value, "hello", "the bad value is left as it was");
}
