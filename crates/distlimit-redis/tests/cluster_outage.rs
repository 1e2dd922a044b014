//! A Cluster primary killed (SIGKILL) under load: until its replica is promoted, calls on its
//! slots fail fast instead of each waiting out the response timeout, and the store follows the
//! promoted replica.
//!
//! Servers: a private Cluster (`distlimit_test::server::Cluster`), so the shared servers of
//! `cargo xtask test` are never faulted. It needs only `redis-server`
//! (`DISTLIMIT_REDIS_SERVER_BIN` or the `PATH`): without it the test skips with a note, or fails
//! under `DISTLIMIT_REQUIRE_REDIS=1`. Its name contains `cluster`, so it runs in the
//! `test-cluster` step of `cargo xtask test`. Numbers:
//! `cargo test -p distlimit-redis --test integration cluster_outage:: -- --nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use support::blocking;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use distlimit_core::{Error, Key, Limit, Quota, StoreExt};
use distlimit_redis::{RedisStore, hash_slot};
use distlimit_test::server::{Cluster, RedisServer, server_bin_or_skip};

/// The store's response timeout.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(250);
/// What a loaded 2-core machine may add to a call's time on top of the response timeout.
const SCHEDULING_SLACK: Duration = Duration::from_millis(500);
/// Tasks deciding at once, each with one call in flight.
const TASKS: usize = 8;
/// Pause between two decisions of a task.
const PACE: Duration = Duration::from_millis(5);
/// The most decisions one task makes, whatever happens.
const PER_TASK: usize = 5_000;
/// The longest the replica may take to be promoted after the kill (2 s of
/// `cluster-node-timeout`, an election), on a loaded machine.
const PROMOTION_BOUND: Duration = Duration::from_secs(20);
/// From the promotion to the store's first decision on the new primary.
const RECOVERY_BOUND: Duration = Duration::from_secs(5);

/// The addresses (`host:port`) of the primary serving `slot` and of its replicas, as `node`
/// sees the Cluster.
fn shard_of(node: &RedisServer, slot: u16) -> Option<(String, Vec<String>)> {
    let text = node.command(&["CLUSTER", "NODES"]).ok()?;
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let addr = |fields: &[&str]| fields[1].split('@').next().unwrap_or_default().to_owned();
    let primary = lines.iter().find(|f| {
        f.len() > 8
            && f[2].contains("master")
            && !f[2].contains("fail")
            && f[8..].iter().any(|range| {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
            })
    })?;
    let replicas = lines
        .iter()
        .filter(|f| f.len() > 3 && f[3] == primary[0])
        .map(|f| addr(f))
        .collect();
    Some((addr(primary), replicas))
}

/// One decision of the load.
struct Sample {
    started: Instant,
    latency: Duration,
    result: Result<(), Error>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_calls_to_a_dead_primary_fail_fast_and_the_promotion_is_followed() {
    let Some(bin) = server_bin_or_skip() else {
        return;
    };
    let cluster = blocking(|| Cluster::start(&bin)).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", cluster.describe());
    let urls: Vec<String> = cluster.nodes().iter().map(RedisServer::url).collect();
    let store = support::connect(
        RedisStore::cluster(urls)
            .prefix(support::unique_prefix("cluster-outage"))
            .response_timeout(RESPONSE_TIMEOUT),
        "Cluster",
    )
    .await;
    let slot_of = |id: &str| hash_slot(&store.redis_key("", Key::new(id).unwrap()));
    // A node may learn of the replicas a moment after the Cluster serves: ask for 10 s.
    let mut shard = None;
    let asked = Instant::now();
    while asked.elapsed() < Duration::from_secs(10) {
        shard = blocking(|| shard_of(&cluster.nodes()[0], slot_of("outage-0")));
        if shard.as_ref().is_some_and(|(_, r)| r.len() == 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (victim, replicas) = shard.expect("no view of the Cluster");
    let [replica] = &replicas[..] else {
        panic!("the primary {victim} has replicas {replicas:?}")
    };
    let victim_node = cluster.nodes().iter().find(|n| n.addr() == victim).unwrap();
    let replica_node = cluster
        .nodes()
        .iter()
        .find(|n| &n.addr() == replica)
        .unwrap();
    // Identities on the victim's slots only.
    let owner = |id: &str| blocking(|| shard_of(&cluster.nodes()[0], slot_of(id)));
    let ids: Arc<Vec<String>> = Arc::new(
        (0..10_000)
            .map(|i| format!("outage-{i}"))
            .filter(|id| owner(id).is_some_and(|(p, _)| p == victim))
            .take(TASKS)
            .collect(),
    );
    assert_eq!(ids.len(), TASKS);
    let limit = Limit::token_bucket(Quota::per_day(1_000_000).unwrap());

    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (store, stop, ids) = (store.clone(), stop.clone(), ids.clone());
            tokio::spawn(async move {
                let mut samples = Vec::new();
                for _ in 0..PER_TASK {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let started = Instant::now();
                    let result = store.check(&ids[task], limit).await;
                    samples.push(Sample {
                        started,
                        latency: started.elapsed(),
                        result: result.map(drop),
                    });
                    tokio::time::sleep(PACE).await;
                }
                samples
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let pid = victim_node.pid().expect("the primary runs");
    let killed = Instant::now();
    // SIGKILL by PID, as the harness signals its servers (it reaps the process on drop).
    let status = blocking(|| {
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
    });
    assert!(status.is_ok_and(|s| s.success()), "kill -KILL {pid}");
    let slot = slot_of(&ids[0]);
    let mut promoted = None;
    while killed.elapsed() < PROMOTION_BOUND {
        if blocking(|| shard_of(replica_node, slot)).is_some_and(|(p, _)| &p == replica) {
            promoted = Some(Instant::now());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut samples = Vec::new();
    for task in tasks {
        let task = tokio::time::timeout(Duration::from_secs(30), task);
        samples.extend(task.await.expect("a load task did not stop").unwrap());
    }
    let promoted = promoted.expect("the replica was not promoted");

    // The calls of the outage: after the dead primary's connection broke, before the promotion.
    let mut failures: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.started >= killed + Duration::from_millis(100) && s.started < promoted)
        .filter(|s| s.result.is_err())
        .collect();
    failures.sort_by_key(|s| s.latency);
    let n = failures.len();
    assert!(n > 0, "no call failed while the primary was dead");
    let median = failures[n / 2].latency;
    let p99 = failures[(n * 99).div_ceil(100) - 1].latency;
    let not_sent = failures
        .iter()
        .filter(|s| s.result.as_ref().is_err_and(Error::is_not_sent))
        .count();
    let recovery = samples
        .iter()
        .filter(|s| s.started >= promoted && s.result.is_ok())
        .map(|s| (s.started + s.latency).saturating_duration_since(promoted))
        .min();
    let max = samples.iter().map(|s| s.latency).max().unwrap_or_default();
    eprintln!(
        "primary {victim} dead for {:.1?}: {n} failed calls ({not_sent} marked not sent), \
         latency median {median:.1?}, p99 {p99:.1?}; the store answered again {recovery:.1?} \
         after the promotion; slowest call {max:.1?}; the fastest and slowest failures: {:?}, {:?}",
        promoted - killed,
        failures[0].result,
        failures[n - 1].result,
    );

    for s in &samples {
        if let Err(e) = &s.result {
            assert!(e.is_transient(), "a permanent error: {e:?}");
        }
    }
    assert!(
        max <= RESPONSE_TIMEOUT + SCHEDULING_SLACK,
        "a call took {max:?}, response timeout {RESPONSE_TIMEOUT:?}"
    );
    // Failing fast: most failures come back well within the response timeout.
    assert!(
        median < RESPONSE_TIMEOUT / 2,
        "failures took {median:?} (median), response timeout {RESPONSE_TIMEOUT:?}"
    );
    let recovery = recovery.expect("the store never answered from the promoted replica");
    assert!(
        recovery <= RECOVERY_BOUND,
        "the store answered again only {recovery:?} after the promotion"
    );
}
