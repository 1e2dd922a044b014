//! Durable decisions (`RedisStoreBuilder::durable`): an admission is answered only once `WAIT`
//! says enough replicas hold its write.
//!
//! * `a_failover_to_a_lagging_replica_*`: a Sentinel set whose replica lags by [`LAG`] (it
//!   replicates through a `Proxy` that delays the primary's stream). Several stores spend one
//!   key of a capped limit (a token bucket that does not refill during the test); the primary is
//!   killed (SIGKILL) right after; what the proxy still holds dies with it, as a lagging
//!   replica's backlog lives in the dying primary's output buffer; the sentinels promote the
//!   replica, and the stores spend the key again. Without the option the promoted replica has
//!   not seen the first admissions and admits the whole limit again; with it, never more than
//!   the limit in all.
//! * `with_two_replicas_*`: a Sentinel set with a second replica; the primary killed and never
//!   restarted: the other replica, pointed at the promoted one, acknowledges again, so the
//!   stores admit again by themselves, never past the limit.
//! * `without_enough_replicas_*`: the typed error (multiplexed, pool, a lease exchange), what a
//!   hybrid's failure modes make of it, one `WAIT` per call; the configurations refused.
//! * `in_a_cluster_*`: a private Cluster: one `WAIT` per call on the script's node, and a
//!   shard whose replica is killed answers `NotDurable` while the others admit.
//!
//! Servers: private ones (`distlimit_test::server`), so the shared servers of `cargo xtask
//! test` are never faulted; without `redis-server` the tests skip with a note, or fail under
//! `DISTLIMIT_REQUIRE_REDIS=1`. Numbers:
//! `cargo test -p distlimit-redis --test integration durable:: -- --nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use support::blocking;

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use distlimit_core::{Error, Key, LeaseStore, Limit, Quota, Request, StoreExt};
use distlimit_hybrid::{FailureMode, Hybrid};
use distlimit_memory::MemoryStore;
use distlimit_redis::hash_slot;
use distlimit_redis::{NotDurable, RedisStore};
use distlimit_test::Proxy;
use distlimit_test::server::{Cluster, RedisServer, SERVICE, Sentinel, server_bin_or_skip};

/// The tests that start servers run one at a time: a killed primary's port is free until the
/// test restarts it, and a server another test started on it meanwhile would be taken for the
/// old primary by the sentinels (and made a replica of the promoted one).
static SERVERS: LazyLock<tokio::sync::Mutex<()>> = LazyLock::new(Default::default);

/// The limit of the key every store spends.
const LIMIT: u64 = 100;
/// Decisions before the kill (all admitted).
const BEFORE: usize = 60;
/// Decisions after the promotion: more than the limit, so the key runs out whatever the
/// replica holds.
const AFTER: usize = 150;
/// Stores (each its own connection to the primary, as several processes would have).
const STORES: usize = 3;
/// How far behind the primary the replica is: the proxy delays the primary's stream to it.
const LAG: Duration = Duration::from_millis(400);
/// How long `WAIT` waits for the replica: above the lag.
const WAIT_TIMEOUT: Duration = Duration::from_millis(1500);
/// The stores' response timeout: above the `WAIT` timeout.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);
/// The longest the sentinels may take to name the replica after the kill (1 s of
/// `down-after-milliseconds`, an election), on a loaded machine.
const PROMOTION_BOUND: Duration = Duration::from_secs(20);
/// The longest a restarted server may take to sync from the new primary, or the stores to
/// follow the promotion.
const SETTLE_BOUND: Duration = Duration::from_secs(15);

/// Polls `check` every 20 ms until it succeeds; fails the test after `bound`.
async fn poll(bound: Duration, what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let start = Instant::now();
    loop {
        match blocking(&mut check) {
            Ok(()) => return,
            Err(why) if start.elapsed() > bound => panic!("{what} after {bound:?}: {why}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Whether `primary` counts a replica for `WAIT`: one in state `online`. After a diskless
/// sync a primary puts its replica online only at the replica's first `REPLCONF ACK`, up to a
/// second after the replica's own `master_link_status` says `up`.
fn online(primary: &RedisServer) -> Result<(), String> {
    let info = primary.info("replication")?;
    if info.contains("state=online") {
        Ok(())
    } else {
        Err(format!("no replica online: {info}"))
    }
}

/// A token bucket of `limit` a day: nothing refills during a test.
fn daily(limit: u64) -> Limit {
    Limit::token_bucket(Quota::per_day(limit).unwrap())
}

/// The primary `sentinel` names for [`SERVICE`], as `host:port`.
fn named(sentinel: &RedisServer) -> Option<String> {
    let addr: Vec<String> = sentinel
        .query(
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(SERVICE),
        )
        .ok()?;
    Some(addr.join(":"))
}

/// `count` decisions on `key`, spread over `stores`, all at once; how many were admitted.
async fn spend(stores: &[RedisStore], key: &str, count: usize) -> (usize, Vec<Error>) {
    let tasks: Vec<_> = (0..count)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            let key = key.to_owned();
            tokio::spawn(async move { store.check(&key, daily(LIMIT)).await })
        })
        .collect();
    let mut admitted = 0;
    let mut errors = Vec::new();
    for task in tasks {
        match tokio::time::timeout(2 * RESPONSE_TIMEOUT, task).await {
            Ok(Ok(Ok(d))) if d.is_allowed() => admitted += 1,
            Ok(Ok(Ok(_))) => {}
            Ok(Ok(Err(e))) => errors.push(e),
            other => panic!("a decision did not end: {other:?}"),
        }
    }
    (admitted, errors)
}

/// What one run admitted before the kill and after the promotion.
struct Run {
    before: usize,
    after: usize,
    /// Decisions after the promotion that failed.
    errors: usize,
}

/// The failover scenario, with durable decisions on or off.
async fn failover_to_a_lagging_replica(durable: bool) -> Option<Run> {
    let _alone = SERVERS.lock().await;
    let bin = server_bin_or_skip()?;
    let mut proxy = None;
    let mut set = blocking(|| {
        Sentinel::start_replicating_via(&bin, |primary| {
            let p = Proxy::start(primary).map_err(|e| e.to_string())?;
            let addr = p.addr();
            proxy = Some(p);
            Ok(addr)
        })
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let proxy = proxy.expect("the set replicates through the proxy");
    eprintln!("{} (replica through {})", set.describe(), proxy.addr());
    poll(SETTLE_BOUND, "the replica is not online", || {
        online(set.primary())
    })
    .await;
    proxy.set_delays(Duration::ZERO, LAG);

    let sentinels: Vec<String> = set.sentinels().iter().map(RedisServer::url).collect();
    let prefix = support::unique_prefix(if durable { "durable" } else { "async" });
    let mut stores = Vec::new();
    for _ in 0..STORES {
        let mut builder = RedisStore::sentinel(sentinels.clone(), SERVICE)
            .prefix(&prefix)
            .response_timeout(RESPONSE_TIMEOUT);
        if durable {
            builder = builder.durable(1, WAIT_TIMEOUT);
        }
        stores.push(support::connect(builder, "Sentinel set").await);
    }

    let started = Instant::now();
    let (before, errors) = spend(&stores, "quota", BEFORE).await;
    let spent = started.elapsed();
    // The replica's backlog dies with the primary: hold it, kill the primary, drop it.
    proxy.hold();
    set.primary_mut().kill();
    proxy.cut();
    let killed = Instant::now();
    eprintln!(
        "durable {durable}: {before} of {BEFORE} admitted before the kill, in {spent:.1?} \
         (errors: {errors:?})"
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(before, BEFORE, "every decision before the kill is admitted");

    let replica = set.replica().addr();
    poll(
        PROMOTION_BOUND,
        "the replica was not promoted",
        || match named(&set.sentinels()[0]) {
            Some(addr) if addr == replica => Ok(()),
            other => Err(format!("the sentinels name {other:?}")),
        },
    )
    .await;
    eprintln!("promoted {:.1?} after the kill", killed.elapsed());

    // A replica for the new primary (the old one, restarted empty), so that `WAIT 1` can be
    // answered again; the same in both runs.
    let port = set.replica().port().to_string();
    let old = set.primary_mut();
    blocking(|| old.restart()).unwrap_or_else(|e| panic!("{e}"));
    blocking(|| old.command(&["REPLICAOF", "127.0.0.1", &port])).unwrap();
    let new = set.replica();
    poll(SETTLE_BOUND, "the old primary did not sync", || online(new)).await;

    // Every store follows the promotion (a probe on a key of its own).
    for (i, store) in stores.iter().enumerate() {
        let deadline = Instant::now() + SETTLE_BOUND;
        while store
            .check(&format!("probe-{i}"), daily(LIMIT))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "store {i} did not follow");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let (after, errors) = spend(&stores, "quota", AFTER).await;
    eprintln!(
        "durable {durable}: {after} of {AFTER} admitted after the promotion, {} in all \
         (limit {LIMIT}; {} errors: {:?})",
        before + after,
        errors.len(),
        errors.first()
    );
    Some(Run {
        before,
        after,
        errors: errors.len(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_lagging_replica_never_over_admits_with_durable_decisions() {
    let Some(run) = failover_to_a_lagging_replica(true).await else {
        return;
    };
    assert!(
        run.before + run.after <= LIMIT as usize,
        "{} + {} admitted, limit {LIMIT}",
        run.before,
        run.after
    );
    // The promoted replica held every admission, so the rest of the limit is admitted after
    // (less only what decisions that failed charged: never more).
    assert!(run.after > 0, "nothing admitted after the promotion");
    if run.errors == 0 {
        assert_eq!(run.before + run.after, LIMIT as usize);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_lagging_replica_over_admits_without_durable_decisions() {
    let Some(run) = failover_to_a_lagging_replica(false).await else {
        return;
    };
    // The promoted replica had not received the admissions before the kill: it admits the
    // whole limit again.
    assert!(
        run.before + run.after > LIMIT as usize,
        "{} + {} admitted, limit {LIMIT}: no over-admission without durable decisions",
        run.before,
        run.after
    );
}

/// A Sentinel set with two replicas and `durable(1, …)`: the primary is killed and never
/// restarted. The sentinels promote one replica and point the other at it, which answers
/// `WAIT 1` again: the stores admit again by themselves, and never more than the limit in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_replicas_a_failover_admits_again_by_itself_and_never_over_admits() {
    let _alone = SERVERS.lock().await;
    let Some(bin) = server_bin_or_skip() else {
        return;
    };
    let mut set = blocking(|| Sentinel::start(&bin)).unwrap_or_else(|e| panic!("{e}"));
    let primary_port = set.primary().port().to_string();
    let second = blocking(|| {
        RedisServer::spawn(&bin, "second replica", |_, _| {
            Ok(["--replicaof", "127.0.0.1", &primary_port]
                .map(std::ffi::OsString::from)
                .to_vec())
        })
    })
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}, second replica {}", set.describe(), second.addr());
    poll(SETTLE_BOUND, "two replicas are not online", || {
        let info = set.primary().info("replication")?;
        match info.matches("state=online").count() {
            2 => Ok(()),
            n => Err(format!("{n} online: {info}")),
        }
    })
    .await;
    // Every sentinel knows both replicas (from the primary's `INFO`, every 10 s), so the one
    // not promoted is pointed at the new primary.
    poll(
        PROMOTION_BOUND,
        "the sentinels do not list two replicas",
        || {
            for sentinel in set.sentinels() {
                let replicas: Vec<redis::Value> =
                    sentinel.query(redis::cmd("SENTINEL").arg("replicas").arg(SERVICE))?;
                if replicas.len() != 2 {
                    return Err(format!("{}: {} replicas", sentinel.addr(), replicas.len()));
                }
            }
            Ok(())
        },
    )
    .await;

    let sentinels: Vec<String> = set.sentinels().iter().map(RedisServer::url).collect();
    let prefix = support::unique_prefix("two-replicas");
    let mut stores = Vec::new();
    for _ in 0..STORES {
        let builder = RedisStore::sentinel(sentinels.clone(), SERVICE)
            .prefix(&prefix)
            .response_timeout(RESPONSE_TIMEOUT)
            .durable(1, WAIT_TIMEOUT);
        stores.push(support::connect(builder, "Sentinel set").await);
    }
    let (before, errors) = spend(&stores, "quota", BEFORE).await;
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(before, BEFORE, "every decision before the kill is admitted");
    set.primary_mut().kill();
    let killed = Instant::now();

    // One decision at a time until one is admitted again, with nothing restarted.
    let (mut during, mut failed) = (0, 0);
    for i in 0.. {
        match stores[i % STORES].check("quota", daily(LIMIT)).await {
            Ok(d) if d.is_allowed() => {
                during += 1;
                break;
            }
            Ok(d) => panic!("denied with {} of {LIMIT} spent: {d:?}", before + during),
            Err(_) => failed += 1,
        }
        let bound = PROMOTION_BOUND + SETTLE_BOUND;
        assert!(
            killed.elapsed() < bound,
            "nothing admitted {bound:?} after the kill"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "admitting again {:.1?} after the kill ({failed} decisions failed meanwhile)",
        killed.elapsed()
    );
    let (after, errors) = spend(&stores, "quota", AFTER).await;
    let total = before + during + after;
    eprintln!(
        "{total} admitted in all (limit {LIMIT}); {} errors after",
        errors.len()
    );
    assert!(total <= LIMIT as usize, "{total} admitted, limit {LIMIT}");
    // A failed decision charges one unit at most: the rest of the limit is admitted.
    assert!(
        total + failed + errors.len() >= LIMIT as usize,
        "{total} admitted, {failed} + {} failed, limit {LIMIT}",
        errors.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_enough_replicas_an_admission_is_a_typed_error_the_failure_mode_answers() {
    let _alone = SERVERS.lock().await;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let wait = Duration::from_millis(50);
    let store = support::connect(
        RedisStore::builder(server.url())
            .prefix(support::unique_prefix("durable-alone"))
            .durable(1, wait),
        "private server",
    )
    .await;
    let limit = daily(2);
    // No replica: the admission's write is on the primary only.
    let e = store.check("k", limit).await.unwrap_err();
    let not = NotDurable::of(&e).unwrap_or_else(|| panic!("{e:?}"));
    assert_eq!((not.replicas, not.acknowledged, not.timeout), (1, 0, wait));
    assert!(e.is_transient() && !e.is_not_sent(), "{e:?}");
    // The units stay charged (an under-admission): one left.
    let e = store.check("k", limit).await.unwrap_err();
    assert!(NotDurable::of(&e).is_some(), "{e:?}");
    // A denial admits nothing: answered as it is.
    let d = store.check("k", limit).await.unwrap();
    assert!(d.is_denied(), "{d:?}");
    // A peek reads only: no WAIT.
    let waits = server.command_calls("wait").unwrap();
    let d = store.check_cost("peek", limit, 0).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(server.command_calls("wait").unwrap(), waits);

    // A lease exchange that grants units needs the replicas too.
    let request = Request::new(Key::new("lease").unwrap(), daily(10));
    let e = store.exchange(&request, 0, 5).await.unwrap_err();
    assert!(NotDurable::of(&e).is_some(), "{e:?}");
    // The pool sends the WAIT on the connection of the script as well.
    let pooled = support::connect(
        RedisStore::builder(server.url())
            .prefix(support::unique_prefix("durable-pool"))
            .pool(2)
            .durable(1, wait),
        "private server",
    )
    .await;
    let e = pooled.check("k", limit).await.unwrap_err();
    assert!(NotDurable::of(&e).is_some(), "{e:?}");

    // What a hybrid's failure modes make of it.
    for (mode, admits) in [
        (FailureMode::FailClosed, None),
        (FailureMode::FailOpen, Some(true)),
        (FailureMode::Fallback, Some(true)),
    ] {
        let hybrid = Hybrid::builder(store.clone(), MemoryStore::new())
            .budget(Duration::from_secs(1))
            .default_failure_mode(mode)
            .build()
            .unwrap();
        let got = hybrid
            .check(&format!("hybrid-{mode:?}"), daily(10))
            .await
            .map(|d| d.is_allowed());
        match admits {
            None => assert!(got.is_err(), "{mode:?}: {got:?}"),
            Some(a) => assert_eq!(got.ok(), Some(a), "{mode:?}"),
        }
    }

    // With a replica: admitted, one WAIT per script call (coalesced under load).
    let mut replica = RedisServer::start().expect("a second server");
    replica
        .command(&["REPLICAOF", "127.0.0.1", &server.port().to_string()])
        .unwrap();
    poll(SETTLE_BOUND, "the replica did not sync", || online(&server)).await;
    let store = support::connect(
        RedisStore::builder(server.url())
            .prefix(support::unique_prefix("durable-replica"))
            .durable(1, WAIT_TIMEOUT)
            .response_timeout(RESPONSE_TIMEOUT),
        "private server",
    )
    .await;
    let (scripts, waits) = (
        server.command_calls("evalsha").unwrap(),
        server.command_calls("wait").unwrap(),
    );
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.check(&format!("k{}", i % 4), daily(100)).await })
        })
        .collect();
    for task in tasks {
        match task.await.unwrap() {
            Ok(d) => assert!(d.is_allowed(), "{d:?}"),
            Err(e) => panic!(
                "{e:?}\nprimary: {}\nreplica: {}{}",
                server.info("replication").unwrap_or_default(),
                replica.info("replication").unwrap_or_default(),
                replica.log_tail()
            ),
        }
    }
    let scripts = server.command_calls("evalsha").unwrap() - scripts;
    let waits = server.command_calls("wait").unwrap() - waits;
    eprintln!("64 decisions: {scripts} script calls, {waits} WAITs");
    assert_eq!(waits, scripts, "one WAIT per script call");
    assert!(scripts <= 64);
    replica.kill();
}

#[tokio::test]
async fn durable_decisions_refuse_what_they_do_not_support() {
    let refused = |builder: distlimit_redis::RedisStoreBuilder| async move {
        match builder.connect().await {
            Err(Error::Config { message, .. }) => message,
            other => panic!("{other:?}"),
        }
    };
    let ms = Duration::from_millis;
    let m = refused(RedisStore::builder("redis://127.0.0.1:1").durable(0, ms(10))).await;
    assert!(m.contains("replica"), "{m}");
    for timeout in [ms(0), ms(200), ms(300)] {
        let m = refused(
            RedisStore::builder("redis://127.0.0.1:1")
                .response_timeout(ms(200))
                .durable(1, timeout),
        )
        .await;
        assert!(m.contains("WAIT timeout"), "{m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_each_slot_waits_for_its_own_primarys_replica() {
    let _alone = SERVERS.lock().await;
    let Some(bin) = server_bin_or_skip() else {
        return;
    };
    let mut cluster = blocking(|| Cluster::start(&bin)).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", cluster.describe());
    for node in cluster.nodes() {
        let info = blocking(|| node.info("replication")).unwrap();
        if info.contains("role:master") {
            poll(SETTLE_BOUND, "a primary's replica is not online", || {
                online(node)
            })
            .await;
        }
    }
    let urls: Vec<String> = cluster.nodes().iter().map(RedisServer::url).collect();
    let prefix = support::unique_prefix("durable-cluster");
    let store = support::connect(
        RedisStore::cluster(urls)
            .prefix(&prefix)
            .durable(1, WAIT_TIMEOUT)
            .response_timeout(RESPONSE_TIMEOUT),
        "private Cluster",
    )
    .await;
    let calls = |name: &str| -> u64 {
        cluster
            .nodes()
            .iter()
            .map(|n| n.command_calls(name).unwrap())
            .sum()
    };
    // Scripts are not preloaded in a Cluster: a node's first calls answer `NOSCRIPT` and are
    // sent again as `EVAL`, each attempt with its `WAIT`.
    let scripts_now = || calls("evalsha") + calls("eval");
    let (scripts, waits) = blocking(|| (scripts_now(), calls("wait")));
    // Keys over every shard, all admitted.
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.check(&format!("c{}", i % 16), daily(100)).await })
        })
        .collect();
    for task in tasks {
        let d = task.await.unwrap().unwrap();
        assert!(d.is_allowed(), "{d:?}");
    }
    let (scripts, waits) = blocking(|| (scripts_now() - scripts, calls("wait") - waits));
    eprintln!("64 decisions on 16 keys: {scripts} script calls, {waits} WAITs");
    assert_eq!(
        waits, scripts,
        "one WAIT per script call, on the script's node"
    );

    // The replica of one key's shard gone: that key's admissions fail typed, others pass.
    let key = "c0";
    let slot = hash_slot(&store.redis_key("", Key::new(key).unwrap()));
    let (primary, _) = blocking(|| cluster.shard_of(slot)).unwrap();
    let other = (1..16)
        .map(|i| format!("c{i}"))
        .find(|k| {
            let s = hash_slot(&store.redis_key("", Key::new(k).unwrap()));
            blocking(|| cluster.shard_of(s)).unwrap().0 != primary
        })
        .expect("a key on another shard");
    // The replicas as the primary itself lists them (`slaveN:ip=…,port=…`): gossip may not
    // have told every node yet.
    let info = blocking(|| cluster.nodes()[primary].info("replication")).unwrap();
    let replicas: Vec<usize> = info
        .lines()
        .filter(|l| l.starts_with("slave"))
        .filter_map(|l| {
            l.split("port=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u16>()
                .ok()
        })
        .filter_map(|port| cluster.nodes().iter().position(|n| n.port() == port))
        .collect();
    eprintln!("{key}: slot {slot}, primary node {primary}, replicas {replicas:?}");
    assert!(
        !replicas.is_empty(),
        "the shard of {key} has no replica: {info}"
    );
    for &r in &replicas {
        cluster.nodes_mut()[r].kill();
    }
    // Once the primary has seen its replica go.
    let node = &cluster.nodes()[primary];
    poll(SETTLE_BOUND, "the primary still lists its replica", || {
        let info = node.info("replication")?;
        if info.contains("connected_slaves:0") {
            Ok(())
        } else {
            Err(info)
        }
    })
    .await;
    let e = store.check(key, daily(100)).await.unwrap_err();
    assert!(NotDurable::of(&e).is_some(), "{e:?}");
    let d = store.check(&other, daily(100)).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
}
