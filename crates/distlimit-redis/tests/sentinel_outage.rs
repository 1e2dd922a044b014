//! A Sentinel primary killed (SIGKILL) under load: while it is dead, the store asks the
//! sentinels at most once per lookup interval, not once per failing call, and it follows the
//! replica the sentinels promote as soon as they name it.
//!
//! Servers: a private Sentinel set (`distlimit_test::server::Sentinel`), so the shared servers of
//! `cargo xtask test` are never faulted. It needs only `redis-server`
//! (`DISTLIMIT_REDIS_SERVER_BIN` or the `PATH`): without it the test skips with a note, or fails
//! under `DISTLIMIT_REQUIRE_REDIS=1` (`cargo xtask test`). Numbers:
//! `cargo test -p distlimit-redis --test integration sentinel_outage:: -- --nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use support::blocking;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use distlimit_core::{Error, Limit, Quota, StoreExt};
use distlimit_redis::RedisStore;
use distlimit_test::server::{RedisServer, SERVICE, Sentinel, info_field, server_bin_or_skip};

/// The store's response timeout.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(250);
/// What a loaded 2-core machine may add to a call's time on top of the response timeout.
const SCHEDULING_SLACK: Duration = Duration::from_millis(500);
/// The store's least time between two lookups (`LOOKUP_INTERVAL` in `src/connection.rs`).
const LOOKUP_INTERVAL: Duration = Duration::from_millis(50);
/// Commands a sentinel may get per second from the other sentinels while the primary is down
/// (`PING`, hellos, `SENTINEL IS-MASTER-DOWN-BY-ADDR`, the failover's votes), generously.
const PEER_COMMANDS_PER_SECOND: u64 = 20;
/// Tasks deciding at once, each with one call in flight.
const TASKS: usize = 8;
/// Pause between two decisions of a task.
const PACE: Duration = Duration::from_millis(5);
/// The most decisions one task makes, whatever happens.
const PER_TASK: usize = 5_000;
/// The longest the sentinels may take to name the replica after the kill (1 s of
/// `down-after-milliseconds`, an election), on a loaded machine.
const PROMOTION_BOUND: Duration = Duration::from_secs(20);
/// From the sentinels naming the replica to the store's first decision on it, on a loaded
/// machine (the store looks up again at most [`LOOKUP_INTERVAL`] after its last lookup).
const FOLLOW_BOUND: Duration = Duration::from_secs(1);

/// Commands `sentinel` has served (`total_commands_processed`: a sentinel's `INFO` has no
/// `commandstats`).
fn commands(sentinel: &RedisServer) -> u64 {
    let info = sentinel.info("stats").unwrap();
    info_field(&info, "total_commands_processed")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no total_commands_processed in {info}"))
}

/// The primary `sentinel` names for [`SERVICE`], as `host:port`.
fn named(sentinel: &RedisServer) -> Option<String> {
    let fields: Vec<String> = sentinel
        .query(redis::cmd("SENTINEL").arg("MASTER").arg(SERVICE))
        .ok()?;
    let field = |name: &str| {
        let at = fields.iter().position(|f| f == name)?;
        fields.get(at + 1).cloned()
    };
    Some(format!("{}:{}", field("ip")?, field("port")?))
}

/// One decision of the load.
struct Sample {
    started: Instant,
    latency: Duration,
    result: Result<(), Error>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_sentinel_primary_is_looked_up_at_a_bounded_rate_and_then_followed() {
    let Some(bin) = server_bin_or_skip() else {
        return;
    };
    let set = blocking(|| Sentinel::start(&bin)).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", set.describe());
    let sentinels: Vec<String> = set.sentinels().iter().map(RedisServer::url).collect();
    let store = support::connect(
        RedisStore::sentinel(sentinels, SERVICE)
            .prefix(support::unique_prefix("sentinel-outage"))
            .response_timeout(RESPONSE_TIMEOUT),
        "Sentinel set",
    )
    .await;
    let limit = Limit::token_bucket(Quota::per_day(1_000_000).unwrap());

    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                let mut samples = Vec::new();
                for _ in 0..PER_TASK {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let started = Instant::now();
                    let result = store.check(&format!("outage-{task}"), limit).await;
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

    // Each lookup asks every sentinel `SENTINEL MASTERS`; the test asks the first one whether
    // the replica is promoted yet, so the commands are counted on the others.
    let counted = &set.sentinels()[1..];
    let before: Vec<u64> = blocking(|| counted.iter().map(commands).collect());
    let pid = set.primary().pid().expect("the primary runs");
    let killed = Instant::now();
    // SIGKILL by PID, as the harness signals its servers (it reaps the process on drop).
    let status = blocking(|| {
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
    });
    assert!(status.is_ok_and(|s| s.success()), "kill -KILL {pid}");

    let replica = set.replica().addr();
    let mut promoted = None;
    while killed.elapsed() < PROMOTION_BOUND {
        if blocking(|| named(&set.sentinels()[0])).as_deref() == Some(replica.as_str()) {
            promoted = Some(Instant::now());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after: Vec<u64> = blocking(|| counted.iter().map(commands).collect());
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut samples = Vec::new();
    for task in tasks {
        let task = tokio::time::timeout(Duration::from_secs(30), task);
        samples.extend(task.await.expect("a load task did not stop").unwrap());
    }
    let promoted = promoted.expect("the sentinels did not name the replica");
    let outage = promoted - killed;

    let during: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.started >= killed && s.started < promoted)
        .collect();
    let failed = during.iter().filter(|s| s.result.is_err()).count();
    // Failures that leave unknown whether the script ran (not marked `is_not_sent`): the calls
    // in flight at the kill, and those sent on the dead connection before it was dropped.
    let maybe_ran = during
        .iter()
        .filter(|s| s.result.as_ref().is_err_and(|e| !e.is_not_sent()))
        .count();
    let followed = samples
        .iter()
        .filter(|s| s.started >= promoted && s.result.is_ok())
        .map(|s| (s.started + s.latency).saturating_duration_since(promoted))
        .min();
    let max = samples.iter().map(|s| s.latency).max().unwrap_or_default();
    let served: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    // Per sentinel: one lookup at the kill, one in flight at the promotion and one per interval
    // between; the watcher's question once a second; the other sentinels' traffic.
    let bound = (outage.as_millis() / LOOKUP_INTERVAL.as_millis()) as u64
        + 2
        + (outage.as_secs() + 1) * (1 + PEER_COMMANDS_PER_SECOND);
    eprintln!(
        "primary dead for {outage:.1?}: {} decisions ({failed} failed, {maybe_ran} of them maybe \
         run); commands served by \
         two sentinels: {served:?} (bound {bound} each); the store answered again {followed:.1?} after \
         the sentinels named the replica; slowest call {max:.1?}",
        during.len()
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
    assert!(failed > 0, "no call failed while the primary was dead");
    // The rest were refused before anything was sent: the store says so.
    assert!(
        maybe_ran <= 2 * TASKS,
        "{maybe_ran} of {failed} failures not marked as never sent"
    );
    assert!(
        served.iter().all(|&n| n <= bound),
        "the sentinels served {served:?} commands in {outage:?} (bound {bound} each)"
    );
    let followed = followed.expect("the store never answered from the promoted replica");
    assert!(
        followed <= FOLLOW_BOUND,
        "the store answered again only {followed:?} after the promotion"
    );
}
