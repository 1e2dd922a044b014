//! Coalesced script calls on a real `redis-server`.
//!
//! * `coalesced_calls_decide_as_one_by_one`: random waves of concurrent requests (every
//!   algorithm, random keys, costs and quotas, some `decide_all` groups) on a coalescing store
//!   (one call in flight, so every caller that arrives while it is out queues and joins the next
//!   call), then the same requests one by one on a twin key space with coalescing off, and on the
//!   reference model (a memory store): the same decisions, errors and stored states.
//!   `coalesced_cluster_calls_decide_as_one_by_one`: the same on the Cluster
//!   (`DISTLIMIT_REDIS_CLUSTER_URLS`), where calls coalesce per hash slot.
//! * The conformance suite with coalescing off (`uncoalesced`) and on with one call in flight
//!   (`one_call_in_flight`, where concurrent checks really coalesce); the default (on) runs in
//!   `tests/conformance.rs`.
//! * A bad value at one key of a coalesced call fails that caller alone; bad input keeps its
//!   typed errors inside a coalesced call.
//! * One script, one encoding: decisions, batches and lease exchanges, alone or coalesced, all
//!   run the one entry script (the server caches one script, no `EVAL` is ever needed), and
//!   exchanges queued with decisions on one key stay exact.
//! * A server paused, then killed, under a coalesced call: every caller gets an error, none
//!   hangs, nothing is applied twice.
//! * Callers that give up (timeouts, dropped futures) at random, on four threads: no call slot
//!   stays taken, no decision is applied twice or answered without being applied; a queue of
//!   callers that all gave up sends nothing and frees its slot.
//!
//! Servers: `DISTLIMIT_REDIS_URL` (the xtask sets it; required under `DISTLIMIT_REQUIRE_REDIS=1`)
//! or a private `redis-server`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlimit_core::{
    Algorithm, Decision, Error, Key, LeaseStore, Limit, ManualClock, Quota, Request, Store,
};
use distlimit_memory::MemoryStore;
use distlimit_redis::{RedisObserver, RedisStore};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::{Guarded, RedisServer, blocking};
use tokio::task::JoinHandle;

distlimit_test::conformance_tests!(uncoalesced, |clock| async move {
    support::standalone_store(clock, "uncoalesced", |b| b.coalesce(false)).await
});

distlimit_test::conformance_tests!(one_call_in_flight, |clock| async move {
    support::standalone_store(clock, "one-call", |b| b.coalesce_in_flight(1)).await
});

/// Records the sizes of coalesced calls and the most callers seen waiting.
#[derive(Default)]
struct Sizes {
    calls: Mutex<Vec<usize>>,
    waiting: Mutex<usize>,
}

impl RedisObserver for Sizes {
    fn on_coalesced(&self, _store: &'static str, decisions: usize) {
        self.calls.lock().unwrap().push(decisions);
    }

    fn on_connections(&self, _store: &'static str, _in_use: usize, waiting: usize) {
        let mut most = self.waiting.lock().unwrap();
        *most = (*most).max(waiting);
    }
}

impl Sizes {
    fn largest(&self) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
    }
}

// ---------------------------------------------------------------------------------------------
// The differential test.

/// The algorithm and quota of each policy `p0`, `p1`, …: fixed per policy, so the memory store
/// (one table per algorithm) holds the same states as Redis.
#[derive(Clone, Debug)]
struct Policies(Vec<Limit>);

#[derive(Clone, Debug)]
struct Req {
    policy: usize,
    key: u8,
    cost: u64,
}

#[derive(Clone, Debug)]
enum Op {
    One(Req),
    /// A `decide_all` group: distinct (policy, key) pairs.
    All(Vec<Req>),
}

#[derive(Clone, Debug)]
struct Wave {
    /// µs the clock moves before the wave.
    advance: u64,
    ops: Vec<Op>,
}

const POLICY_NAMES: [&str; 8] = ["p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"];
const KEYS: u8 = 6;

fn quota_strategy() -> impl Strategy<Value = Quota> {
    (1..=20u64, 1..=5_000_000u64, 1..=20u64, any::<bool>()).prop_filter_map(
        "a valid quota",
        |(limit, period, burst, default_burst)| {
            Quota::from_parts(limit, period, if default_burst { limit } else { burst }).ok()
        },
    )
}

fn policies_strategy() -> impl Strategy<Value = Policies> {
    proptest::collection::vec(
        (
            proptest::sample::select(Algorithm::ALL.to_vec()),
            quota_strategy(),
        ),
        POLICY_NAMES.len(),
    )
    .prop_map(|v| Policies(v.into_iter().map(|(a, q)| Limit::new(a, q)).collect()))
}

fn req_strategy() -> impl Strategy<Value = Req> {
    let cost = prop_oneof![1 => Just(0u64), 6 => Just(1u64), 2 => 2..=6u64, 1 => 15..=40u64];
    (0..POLICY_NAMES.len(), 0..KEYS, cost).prop_map(|(policy, key, cost)| Req { policy, key, cost })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => req_strategy().prop_map(Op::One),
        1 => proptest::collection::vec(req_strategy(), 2..=4).prop_map(|reqs| {
            let mut seen = Vec::new();
            Op::All(
                reqs.into_iter()
                    .filter(|r| {
                        let id = (r.policy, r.key);
                        let new = !seen.contains(&id);
                        seen.push(id);
                        new
                    })
                    .collect(),
            )
        }),
    ]
}

fn wave_strategy() -> impl Strategy<Value = Wave> {
    let advance = prop_oneof![2 => Just(0u64), 2 => 1..=1_000u64, 3 => 1..=3_000_000u64];
    (advance, proptest::collection::vec(op_strategy(), 1..=48))
        .prop_map(|(advance, ops)| Wave { advance, ops })
}

fn key_name(key: u8) -> String {
    format!("user:{key}")
}

fn request<'a>(policies: &Policies, r: &Req, key: &'a str) -> Request<'a> {
    Request::new(Key::new(key).unwrap(), policies.0[r.policy])
        .with_cost(r.cost)
        .with_policy(POLICY_NAMES[r.policy])
        .unwrap()
}

/// One op on `store`: its decisions, or the kind of its error.
async fn decide<S: Store + ?Sized>(
    store: &S,
    policies: &Policies,
    op: &Op,
) -> Result<Vec<Decision>, &'static str> {
    let result = match op {
        Op::One(r) => {
            let key = key_name(r.key);
            store
                .decide(&request(policies, r, &key))
                .await
                .map(|d| vec![d])
        }
        Op::All(reqs) => {
            let keys: Vec<String> = reqs.iter().map(|r| key_name(r.key)).collect();
            let requests: Vec<Request<'_>> = reqs
                .iter()
                .zip(&keys)
                .map(|(r, k)| request(policies, r, k))
                .collect();
            store.decide_all(&requests).await
        }
    };
    result.map_err(|e| e.kind())
}

struct Stores {
    coalesced: RedisStore,
    coalesced_clock: ManualClock,
    serial: RedisStore,
    serial_clock: ManualClock,
    sizes: Arc<Sizes>,
    /// The standalone stores with their private servers, if any (without `cargo xtask test`);
    /// empty on the Cluster.
    _servers: Vec<Guarded>,
    /// Whether `DISTLIMIT_REDIS_URL` holds both stores' keys (their states are compared).
    standalone: bool,
}

async fn stores() -> Stores {
    let sizes = Arc::new(Sizes::default());
    let coalesced_clock = ManualClock::new(0);
    let observer: Arc<dyn RedisObserver> = sizes.clone();
    let coalesced = support::standalone_store(coalesced_clock.clone(), "coalesced", |b| {
        b.coalesce_in_flight(1).observer(observer)
    })
    .await;
    let serial_clock = ManualClock::new(0);
    let serial =
        support::standalone_store(serial_clock.clone(), "serial", |b| b.coalesce(false)).await;
    Stores {
        coalesced: coalesced.store.clone(),
        coalesced_clock,
        serial: serial.store.clone(),
        serial_clock,
        sizes,
        _servers: vec![coalesced, serial],
        standalone: true,
    }
}

/// The same pair on the Cluster, or `None` (a skip) without one.
async fn cluster_stores() -> Option<Stores> {
    let urls = support::cluster_urls()?;
    let sizes = Arc::new(Sizes::default());
    let observer: Arc<dyn RedisObserver> = sizes.clone();
    let coalesced_clock = ManualClock::new(0);
    let coalesced = RedisStore::cluster(urls.clone())
        .prefix(support::unique_prefix("cluster-coalesced"))
        .client_clock(coalesced_clock.clone())
        .coalesce_in_flight(1)
        .observer(observer);
    let serial_clock = ManualClock::new(0);
    let serial = RedisStore::cluster(urls)
        .prefix(support::unique_prefix("cluster-serial"))
        .client_clock(serial_clock.clone())
        .coalesce(false);
    Some(Stores {
        coalesced: support::connect(coalesced, "Cluster").await,
        coalesced_clock,
        serial: support::connect(serial, "Cluster").await,
        serial_clock,
        sizes,
        _servers: Vec::new(),
        standalone: false,
    })
}

/// Every `decide_all` group on one identity (its first request's key), its policies distinct:
/// one hash slot, so the group is one script in a Cluster.
fn one_identity_batches(waves: Vec<Wave>) -> Vec<Wave> {
    waves
        .into_iter()
        .map(|wave| Wave {
            advance: wave.advance,
            ops: wave
                .ops
                .into_iter()
                .map(|op| match op {
                    Op::All(reqs) => {
                        let key = reqs[0].key;
                        let mut seen = Vec::new();
                        Op::All(
                            reqs.into_iter()
                                .filter(|r| {
                                    let new = !seen.contains(&r.policy);
                                    seen.push(r.policy);
                                    new
                                })
                                .map(|r| Req { key, ..r })
                                .collect(),
                        )
                    }
                    one => one,
                })
                .collect(),
        })
        .collect()
}

async fn run_case(
    stores: &Stores,
    policies: &Policies,
    waves: &[Wave],
) -> Result<(), TestCaseError> {
    // The two Redis stores have key spaces of their own (their prefixes); the model is fresh.
    let model_clock = ManualClock::new(0);
    let model = MemoryStore::with_clock(model_clock.clone());
    let mut now = 1_700_000_000_000_000u64;
    for (w, wave) in waves.iter().enumerate() {
        now += wave.advance;
        for clock in [&stores.coalesced_clock, &stores.serial_clock, &model_clock] {
            clock.set_us(now);
        }
        // All of the wave at once: the first caller takes the one call slot, every other one
        // queues (in spawn order, on this current-thread runtime) and rides a coalesced call.
        let handles: Vec<_> = wave
            .ops
            .iter()
            .map(|op| {
                let (store, policies, op) =
                    (stores.coalesced.clone(), policies.clone(), op.clone());
                tokio::spawn(async move { decide(&store, &policies, &op).await })
            })
            .collect();
        let mut coalesced = Vec::with_capacity(handles.len());
        for h in handles {
            coalesced.push(h.await.unwrap());
        }
        for (i, op) in wave.ops.iter().enumerate() {
            let serial = decide(&stores.serial, policies, op).await;
            let reference = decide(&model, policies, op).await;
            prop_assert_eq!(
                &coalesced[i],
                &serial,
                "wave {} op {} {:?}: coalesced vs one by one",
                w,
                i,
                op
            );
            prop_assert_eq!(
                &coalesced[i],
                &reference,
                "wave {} op {} {:?}: coalesced vs the model",
                w,
                i,
                op
            );
        }
    }
    // The stored states and their TTLs (on the shared server; a private one is not reachable
    // from here).
    // (`cargo xtask test-cluster` runs the Cluster case with only the Cluster up.)
    let url = if stores.standalone {
        support::standalone_url().unwrap_or_default()
    } else {
        String::new()
    };
    let mut admin = if url.is_empty() {
        None
    } else {
        Some(
            redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap(),
        )
    };
    if let Some(admin) = admin.as_mut() {
        for (p, name) in POLICY_NAMES.iter().enumerate() {
            for k in 0..KEYS {
                let key = key_name(k);
                let key = Key::new(&key).unwrap();
                let a = stores.coalesced.redis_key(name, key);
                let b = stores.serial.redis_key(name, key);
                let (va, ta): (Option<Vec<u8>>, i64) = redis::pipe()
                    .get(&a)
                    .pttl(&a)
                    .query_async(admin)
                    .await
                    .unwrap();
                let (vb, tb): (Option<Vec<u8>>, i64) = redis::pipe()
                    .get(&b)
                    .pttl(&b)
                    .query_async(admin)
                    .await
                    .unwrap();
                prop_assert_eq!(&va, &vb, "state of policy {} key {}", p, k);
                // Written at other real instants: the TTLs differ by the time between them.
                prop_assert!(
                    (ta - tb).abs() < 5_000,
                    "TTL of policy {} key {}: {} vs {}",
                    p,
                    k,
                    ta,
                    tb
                );
            }
        }
    }
    Ok(())
}

#[test]
fn coalesced_calls_decide_as_one_by_one() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        policies_strategy(),
        proptest::collection::vec(wave_strategy(), 1..=5),
    );
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let result = runner.run(&strategy, |(policies, waves)| {
        rt.block_on(async {
            // A store pair per case: fresh key spaces.
            let stores = stores().await;
            let result = run_case(&stores, &policies, &waves).await;
            sizes.lock().unwrap().push(stores.sizes.largest());
            result
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let sizes = sizes.lock().unwrap();
    assert!(
        sizes.iter().any(|&s| s > 8),
        "no coalesced call carried more than 8 decisions: {sizes:?}"
    );
}

/// The same on the Cluster, where calls coalesce per hash slot: single decisions on one identity
/// and one-identity batches (a batch across slots is decided slot by slot, never coalesced).
#[test]
fn coalesced_cluster_calls_decide_as_one_by_one() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    if rt.block_on(async { support::cluster_urls() }).is_none() {
        return;
    }
    let mut runner = TestRunner::new(Config {
        cases: 12,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        policies_strategy(),
        proptest::collection::vec(wave_strategy(), 1..=4).prop_map(one_identity_batches),
    );
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let result = runner.run(&strategy, |(policies, waves)| {
        rt.block_on(async {
            let stores = cluster_stores().await.unwrap();
            let result = run_case(&stores, &policies, &waves).await;
            sizes.lock().unwrap().push(stores.sizes.largest());
            result
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let sizes = sizes.lock().unwrap();
    assert!(
        sizes.iter().any(|&s| s > 2),
        "no coalesced call carried more than 2 decisions: {sizes:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Bad values and bad input inside a coalesced call.

fn small() -> Limit {
    Limit::token_bucket(Quota::per_hour(10).unwrap())
}

/// Spawns every op at once: on a current-thread runtime, the first takes the store's one call
/// slot and the others queue behind it in spawn order.
fn spawn_all<T: Send + 'static>(
    store: &RedisStore,
    ops: Vec<Box<dyn FnOnce(RedisStore) -> futures_like::BoxFut<T> + Send>>,
) -> Vec<JoinHandle<T>> {
    ops.into_iter()
        .map(|op| tokio::spawn(op(store.clone())))
        .collect()
}

mod futures_like {
    pub(crate) type BoxFut<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;
}

type Answer = Result<Vec<Decision>, String>;

fn one(
    id: Vec<u8>,
    cost: u64,
) -> Box<dyn FnOnce(RedisStore) -> futures_like::BoxFut<Answer> + Send> {
    Box::new(move |store| {
        Box::pin(async move {
            let request = Request::new(Key::new(&id).unwrap(), small()).with_cost(cost);
            store
                .decide(&request)
                .await
                .map(|d| vec![d])
                .map_err(describe)
        })
    })
}

fn all(ids: Vec<Vec<u8>>) -> Box<dyn FnOnce(RedisStore) -> futures_like::BoxFut<Answer> + Send> {
    Box::new(move |store| {
        Box::pin(async move {
            let requests: Vec<Request<'_>> = ids
                .iter()
                .map(|id| Request::new(Key::new(id).unwrap(), small()))
                .collect();
            store.decide_all(&requests).await.map_err(describe)
        })
    })
}

/// An error's kind and message: what a caller can tell apart.
fn describe(e: Error) -> String {
    format!("{}: {e}", e.kind())
}

#[tokio::test(flavor = "current_thread")]
async fn a_bad_value_fails_only_its_own_caller_and_bad_input_keeps_its_errors() {
    let Some(url) = support::standalone_url() else {
        return;
    };
    let prefix = support::unique_prefix("coalesce-bad");
    let sizes = Arc::new(Sizes::default());
    let observer: Arc<dyn RedisObserver> = sizes.clone();
    let coalesced = RedisStore::builder(&url)
        .prefix(&prefix)
        .coalesce_in_flight(1)
        .observer(observer)
        .connect()
        .await
        .unwrap();
    let serial = RedisStore::builder(&url)
        .prefix(&prefix)
        .coalesce(false)
        .connect()
        .await
        .unwrap();
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // Bad values: two of another Redis type (WRONGTYPE), three unreadable strings.
    let bad: Vec<Vec<u8>> = (0..5).map(|i| format!("bad{i}").into_bytes()).collect();
    for (i, id) in bad.iter().enumerate() {
        let key = coalesced.redis_key("", Key::new(id).unwrap());
        let write = match i {
            0 => redis::cmd("RPUSH").arg(&key).arg("x").clone(),
            1 => redis::cmd("HSET").arg(&key).arg("f").arg("v").clone(),
            2 => redis::cmd("SET").arg(&key).arg("not a state").clone(),
            3 => redis::cmd("SET").arg(&key).arg("").clone(),
            _ => redis::cmd("SET").arg(&key).arg(&[1u8, 0, 0][..]).clone(),
        };
        let _: () = write.query_async(&mut admin).await.unwrap();
    }
    // Identities that must keep their bytes: braces, NUL, unicode, invalid UTF-8, the longest.
    let mut tricky: Vec<Vec<u8>> = [
        &b"user:{42}"[..],
        b"}{",
        b"a\0b",
        "é😀".as_bytes(),
        b"\xff\xfe",
        b"%7B",
    ]
    .iter()
    .map(|b| b.to_vec())
    .collect();
    tricky.push(vec![b'{'; distlimit_core::MAX_KEY_LEN]);

    let mut ops = vec![one(b"first".to_vec(), 1)];
    let mut expect: Vec<&str> = vec!["ok"];
    for (i, id) in tricky.iter().enumerate() {
        ops.push(one(id.clone(), i as u64 + 1));
        expect.push("ok");
    }
    for (i, id) in bad.iter().enumerate() {
        ops.push(one(id.clone(), 1));
        expect.push("bad");
        // A batch-mate of a bad value: the batch fails, and charges nothing.
        ops.push(all(vec![format!("mate{i}").into_bytes(), id.clone()]));
        expect.push("bad");
        ops.push(one(format!("after{i}").into_bytes(), 2));
        expect.push("ok");
    }
    ops.push(one(b"never".to_vec(), u64::MAX));
    expect.push("never");
    ops.push(all(vec![b"twice".to_vec(), b"twice".to_vec()]));
    expect.push("invalid_request");
    ops.push(all(tricky.clone()));
    expect.push("ok");
    let answers: Vec<Answer> = {
        let handles = spawn_all(&coalesced, ops);
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap());
        }
        out
    };
    assert!(sizes.largest() > 1, "no coalesced call formed");
    let mut i = 0;
    let mut check = |answer: &Answer, want: &str, what: &str| {
        match (want, answer) {
            ("ok", Ok(_)) => {}
            ("never", Ok(d)) => assert!(d[0].is_never(), "{what}: {d:?}"),
            ("bad", Err(e)) => assert!(e.starts_with("bad_state"), "{what}: {e}"),
            ("invalid_request", Err(e)) => assert!(e.starts_with("invalid_request"), "{what}: {e}"),
            _ => panic!("{what}: expected {want}, got {answer:?}"),
        }
        i += 1;
    };
    for (n, (answer, want)) in answers.iter().zip(&expect).enumerate() {
        check(answer, want, &format!("op {n}"));
    }
    // The same errors, word for word, as each request's own script gives.
    let mut n = 1 + tricky.len();
    for (i, id) in bad.iter().enumerate() {
        let alone = one(id.clone(), 1)(serial.clone()).await;
        assert_eq!(answers[n], alone, "bad{i} alone");
        let batch = all(vec![format!("mate{i}").into_bytes(), id.clone()])(serial.clone()).await;
        assert_eq!(answers[n + 1], batch, "bad{i} in a batch");
        n += 3;
    }
    // The tricky identities' decisions: their own costs, then one more in the batch.
    for (i, answer) in answers[1..=tricky.len()].iter().enumerate() {
        assert_eq!(answer.as_ref().unwrap()[0].remaining(), 10 - (i as u64 + 1));
    }
    let batch = answers.last().unwrap().as_ref().unwrap();
    for (i, d) in batch.iter().enumerate() {
        assert_eq!(
            d.remaining(),
            10 - (i as u64 + 2),
            "tricky {i} in the batch"
        );
    }
    // A failed batch charged its good batch-mates nothing; the bad values are left as they were.
    for i in 0..bad.len() {
        let mate = format!("mate{i}");
        let peek = Request::peek(Key::new(&mate).unwrap(), small());
        assert_eq!(
            serial.decide(&peek).await.unwrap().remaining(),
            10,
            "{mate}"
        );
    }
    let left: i64 = redis::cmd("EXISTS")
        .arg(
            bad.iter()
                .map(|id| coalesced.redis_key("", Key::new(id).unwrap()))
                .collect::<Vec<_>>(),
        )
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(left, 5);
}

// ---------------------------------------------------------------------------------------------
// One script, one encoding.

/// Decisions, batches and lease exchanges from 64 concurrent callers on one call slot (so most
/// are coalesced, mixed in one call): the server's script cache ends with exactly one script,
/// every call was an `EVALSHA` of it, and on the one GCRA key they share, with the clock
/// standing still, the units the exchanges granted plus the decisions admitted are exactly its
/// capacity: queued with each other, leases and decisions neither over- nor under-spend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_is_the_one_entry_script_and_leases_coalesce_exactly() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    const CAPACITY: u64 = 40;
    let sizes = Arc::new(Sizes::default());
    let observer: Arc<dyn RedisObserver> = sizes.clone();
    let store = RedisStore::builder(server.url())
        .coalesce_in_flight(1)
        .client_clock(ManualClock::new(1_700_000_000_000_000))
        .observer(observer)
        .connect()
        .await
        .unwrap();
    let hot = Limit::gcra(Quota::per_hour(CAPACITY).unwrap());
    let window = Limit::fixed_window(Quota::per_hour(1_000).unwrap());
    let tasks: Vec<JoinHandle<(u64, u64)>> = (0..64u64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let request = Request::new(Key::new("hot").unwrap(), hot);
                match i % 4 {
                    0 => {
                        let keys: Vec<String> = (0..3).map(|j| format!("batch-{i}-{j}")).collect();
                        let batch: Vec<Request<'_>> = keys
                            .iter()
                            .map(|k| Request::new(Key::new(k).unwrap(), window))
                            .collect();
                        let ds = store.decide_all(&batch).await.unwrap();
                        assert!(ds.iter().all(Decision::is_allowed), "{ds:?}");
                        (0, 0)
                    }
                    1 => (store.exchange(&request, 0, 2).await.unwrap().granted, 0),
                    _ => (
                        0,
                        u64::from(store.decide(&request).await.unwrap().is_allowed()),
                    ),
                }
            })
        })
        .collect();
    let (mut granted, mut admitted) = (0, 0);
    for task in tasks {
        let (g, a) = task.await.unwrap();
        granted += g;
        admitted += a;
    }
    // 16 exchanges of 2 and 32 decisions of 1: more than the capacity asked for.
    assert_eq!(
        granted + admitted,
        CAPACITY,
        "granted {granted}, admitted {admitted}"
    );
    assert!(
        sizes.calls.lock().unwrap().iter().any(|&n| n > 1),
        "no call was coalesced: {:?}",
        sizes.calls.lock().unwrap()
    );
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let memory: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(
        memory
            .lines()
            .any(|l| l.trim() == "number_of_cached_scripts:1"),
        "{memory}"
    );
    let commands: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(commands.contains("cmdstat_evalsha:"), "{commands}");
    assert!(!commands.contains("cmdstat_eval:"), "{commands}");
}

// ---------------------------------------------------------------------------------------------
// A server paused or killed under a coalesced call.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_or_killed_server_fails_every_caller_of_a_coalesced_call_once() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    const CALLERS: usize = 48;
    let timeout = Duration::from_millis(300);
    let sizes = Arc::new(Sizes::default());
    let observer: Arc<dyn RedisObserver> = sizes.clone();
    let store = RedisStore::builder(server.url())
        .coalesce_in_flight(1)
        .response_timeout(timeout)
        .observer(observer)
        .connect()
        .await
        .unwrap();
    // A counter: a fixed window far from full, so every applied request shows in `remaining`.
    let limit = Limit::fixed_window(Quota::per_hour(1_000_000).unwrap());
    let counter = move || Request::new(Key::new("counter").unwrap(), limit);
    let before = store.decide(&counter()).await.unwrap().remaining();
    // With the server paused: one caller takes the call slot, `CALLERS` queue behind it; the
    // first gives up (its future dropped), so the queue goes out as one coalesced call that
    // the paused server holds.
    let storm = || async {
        let first = {
            let store = store.clone();
            tokio::spawn(async move { store.decide(&counter()).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let callers: Vec<JoinHandle<(Result<Decision, Error>, Duration)>> = (0..CALLERS)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    let t = Instant::now();
                    (store.decide(&counter()).await, t.elapsed())
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        first.abort();
        callers
    };

    // Paused until every caller timed out, then resumed.
    blocking(|| server.pause()).unwrap();
    let callers = storm().await;
    for h in callers {
        let (result, took) = h.await.unwrap();
        assert!(matches!(&result, Err(Error::Timeout { .. })), "{result:?}");
        assert!(took < timeout * 2, "a caller waited {took:?}");
    }
    assert_eq!(sizes.largest(), CALLERS, "the queue went out as one call");
    blocking(|| server.resume()).unwrap();
    // The paused server decides what it read once it runs again: the first caller's call and
    // the coalesced one, each exactly once.
    let peek = Request::peek(Key::new("counter").unwrap(), limit);
    let after = store.decide(&peek).await.unwrap().remaining();
    assert_eq!(before - after, CALLERS as u64 + 1, "applied");

    // Killed with the coalesced call in flight: every caller of it gets the same transient
    // error at once, none waits out its timeout.
    blocking(|| server.pause()).unwrap();
    let callers = storm().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    blocking(|| server.kill());
    let mut seen = Vec::new();
    for h in callers {
        let (result, took) = h.await.unwrap();
        let e = result.unwrap_err();
        assert!(e.is_transient(), "{e:?}");
        assert!(took < timeout, "a caller waited {took:?}: {e}");
        seen.push(e.to_string());
    }
    seen.dedup();
    assert_eq!(seen.len(), 1, "one error for the whole call: {seen:?}");
    blocking(|| server.restart()).unwrap();
    // Back: the store decides again (a fresh server: the counter starts over).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match store.decide(&counter()).await {
            Ok(d) => {
                assert_eq!(d.remaining(), 1_000_000 - 1);
                break;
            }
            Err(e) if Instant::now() < deadline => {
                assert!(e.is_transient(), "{e:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("not back after a restart: {e:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Many threads, callers giving up at random.

/// Records the last report of calls in flight and callers waiting.
#[derive(Default)]
struct Last(Mutex<(usize, usize)>);

impl RedisObserver for Last {
    fn on_connections(&self, _store: &'static str, in_use: usize, waiting: usize) {
        *self.0.lock().unwrap() = (in_use, waiting);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_that_give_up_at_random_leave_no_slot_taken_and_no_decision_twice() {
    let Some(url) = support::standalone_url() else {
        return;
    };
    const CALLERS: usize = 3_000;
    let last = Arc::new(Last::default());
    let observer: Arc<dyn RedisObserver> = last.clone();
    let store = RedisStore::builder(&url)
        .prefix(support::unique_prefix("coalesce-give-up"))
        .coalesce_in_flight(1)
        .observer(observer)
        .connect()
        .await
        .unwrap();
    let limit = Limit::fixed_window(Quota::per_hour(1_000_000).unwrap());
    let counter = move || Request::new(Key::new("counter").unwrap(), limit);
    let before = store.decide(&counter()).await.unwrap().remaining();
    let started = Instant::now();
    let handles: Vec<JoinHandle<Option<bool>>> = (0..CALLERS)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                // Three callers in four give up after 0 to 299 µs: queued, sent, or answered.
                let wait = Duration::from_micros((i as u64 * 7_919) % 300);
                let request = counter();
                let decide = store.decide(&request);
                if i % 4 != 0 {
                    tokio::time::timeout(wait, decide)
                        .await
                        .ok()
                        .map(|r| r.is_ok())
                } else {
                    Some(decide.await.is_ok())
                }
            })
        })
        .collect();
    let mut answered_ok = 0u64;
    for h in handles {
        if h.await.unwrap() == Some(true) {
            answered_ok += 1;
        }
    }
    assert!(started.elapsed() < Duration::from_secs(20), "callers hung");
    // Whatever a caller that gave up had sent is decided by now (one round trip later).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let peek = Request::peek(Key::new("counter").unwrap(), limit);
    let after = store.decide(&peek).await.unwrap().remaining();
    let applied = before - after;
    assert!(
        answered_ok <= applied && applied <= CALLERS as u64,
        "{answered_ok} answered, {applied} applied, {CALLERS} callers"
    );
    // Every call slot is free again: the peek just now was the only call in flight.
    assert_eq!(*last.0.lock().unwrap(), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_of_callers_that_all_gave_up_frees_its_slot_and_sends_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let last = Arc::new(Last::default());
    let observer: Arc<dyn RedisObserver> = last.clone();
    let store = RedisStore::builder(server.url())
        .coalesce_in_flight(1)
        .response_timeout(Duration::from_millis(100))
        .observer(observer)
        .connect()
        .await
        .unwrap();
    let limit = Limit::fixed_window(Quota::per_hour(1_000_000).unwrap());
    let counter = move || Request::new(Key::new("counter").unwrap(), limit);
    let before = store.decide(&counter()).await.unwrap().remaining();
    // Paused: the first caller holds the one call slot until its response timeout; the others
    // queue behind it and give up there (their futures dropped) before it.
    blocking(|| server.pause()).unwrap();
    let first = {
        let store = store.clone();
        tokio::spawn(async move { store.decide(&counter()).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let queued: Vec<_> = (0..16)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let request = counter();
                tokio::time::timeout(Duration::from_millis(10), store.decide(&request)).await
            })
        })
        .collect();
    for h in queued {
        assert!(h.await.unwrap().is_err(), "a queued caller was answered");
    }
    // The first call times out: the slot passes to the queue, which holds only callers that gave
    // up; nothing is sent, and the slot is free again.
    assert!(matches!(first.await.unwrap(), Err(Error::Timeout { .. })));
    blocking(|| server.resume()).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let peek = Request::peek(Key::new("counter").unwrap(), limit);
    let after = store.decide(&peek).await.unwrap().remaining();
    assert_eq!(before - after, 1, "only the first caller's call ran");
    assert_eq!(*last.0.lock().unwrap(), (1, 0));
}
