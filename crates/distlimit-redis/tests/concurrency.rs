//! Concurrency: one limit enforced across many tasks, connections and OS processes sharing one
//! Redis, with no races between them; and why server time is the default (clock skew).
//!
//! Servers: the shared ones from `cargo xtask test` (see `support`). The multi-process test
//! re-executes this test binary: with `DISTLIMIT_WORKER=1` the hidden test
//! `worker_process_entry` becomes a worker that decides on one key and prints its count.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use distlimit_core::{Limit, ManualClock, Quota, StoreExt};
use distlimit_redis::RedisStore;

/// Stores (each its own connection), tasks per store and attempts per task for the one-key race.
const STORES: usize = 8;
const TASKS: usize = 32;
const ATTEMPTS: usize = 10;
/// The limit of the one-key race: a burst of 100 with a long period, so nothing refills during
/// the test (one unit per 36 s).
const L: u64 = 100;

fn burst_limit() -> Limit {
    Limit::token_bucket(Quota::per_hour(L).unwrap())
}

/// `STORES` × `TASKS` tasks, each `ATTEMPTS` decisions on `key` through `stores`; the number
/// admitted. Any error fails the test.
async fn race(stores: &[RedisStore], key: &str, limit: Limit) -> u64 {
    let mut tasks = Vec::new();
    for store in stores {
        for _ in 0..TASKS {
            let store = store.clone();
            let key = key.to_owned();
            tasks.push(tokio::spawn(async move {
                let mut allowed = 0u64;
                for _ in 0..ATTEMPTS {
                    match store.check(&key, limit).await {
                        Ok(d) if d.is_allowed() => allowed += 1,
                        Ok(_) => {}
                        Err(e) => panic!("decision failed: {e} ({e:?})"),
                    }
                }
                allowed
            }));
        }
    }
    let mut allowed = 0;
    for task in tasks {
        allowed += tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("a task took over 60 s")
            .unwrap();
    }
    allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn many_tasks_over_many_connections_admit_exactly_the_limit_standalone() {
    let Some(url) = support::standalone_url() else {
        return;
    };
    let prefix = support::unique_prefix("race");
    let mut stores = Vec::new();
    for _ in 0..STORES {
        let builder = RedisStore::builder(&url)
            .prefix(&prefix)
            .response_timeout(Duration::from_secs(5));
        stores.push(support::connect(builder, "standalone Redis server").await);
    }
    let start = Instant::now();
    let allowed = race(&stores, "one-key", burst_limit()).await;
    eprintln!(
        "standalone: {} decisions from {STORES} connections in {:?}",
        STORES * TASKS * ATTEMPTS,
        start.elapsed()
    );
    assert_eq!(allowed, L, "{STORES}×{TASKS} tasks on one key");
    // And the key is spent for everyone.
    assert!(
        stores[0]
            .check("one-key", burst_limit())
            .await
            .unwrap()
            .is_denied()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn many_tasks_over_many_connections_admit_exactly_the_limit_cluster() {
    let Some(urls) = support::cluster_urls() else {
        return;
    };
    let prefix = support::unique_prefix("race-cluster");
    let mut stores = Vec::new();
    for _ in 0..STORES {
        let builder = RedisStore::cluster(urls.clone())
            .prefix(&prefix)
            .response_timeout(Duration::from_secs(5));
        stores.push(support::connect(builder, "Cluster").await);
    }
    // Several keys, so more than one primary is raced on.
    for key in ["one-key", "another-key", "a-third-key"] {
        let allowed = race(&stores, key, burst_limit()).await;
        assert_eq!(
            allowed, L,
            "{STORES}×{TASKS} tasks on {key:?} in the Cluster"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Several OS processes

const ENV_WORKER: &str = "DISTLIMIT_WORKER";
const ENV_WORKER_URL: &str = "DISTLIMIT_WORKER_URL";
const ENV_WORKER_PREFIX: &str = "DISTLIMIT_WORKER_PREFIX";
const ENV_WORKER_ATTEMPTS: &str = "DISTLIMIT_WORKER_ATTEMPTS";
const WORKER_KEY: &str = "process-key";
const WORKER_TASKS: usize = 8;
const PROCESSES: usize = 4;
/// What a worker prints before its count.
const ALLOWED_MARK: &str = "DISTLIMIT_WORKER_ALLOWED=";

/// Does nothing unless `DISTLIMIT_WORKER=1`: then it is one worker process of
/// `several_processes_on_one_key_admit_exactly_the_limit`, printing how many it was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn worker_process_entry() {
    if std::env::var(ENV_WORKER).as_deref() != Ok("1") {
        return;
    }
    let url = std::env::var(ENV_WORKER_URL).unwrap();
    let prefix = std::env::var(ENV_WORKER_PREFIX).unwrap();
    let attempts: usize = std::env::var(ENV_WORKER_ATTEMPTS).unwrap().parse().unwrap();
    let store = RedisStore::builder(url)
        .prefix(prefix)
        .response_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for t in 0..WORKER_TASKS {
        let store = store.clone();
        let n = attempts / WORKER_TASKS + usize::from(t < attempts % WORKER_TASKS);
        tasks.push(tokio::spawn(async move {
            let mut allowed = 0u64;
            for _ in 0..n {
                if store
                    .check(WORKER_KEY, burst_limit())
                    .await
                    .unwrap()
                    .is_allowed()
                {
                    allowed += 1;
                }
            }
            allowed
        }));
    }
    let mut allowed = 0;
    for task in tasks {
        allowed += task.await.unwrap();
    }
    // Straight to the process' stdout, past the test harness' capture.
    let mut out = std::io::stdout().lock();
    writeln!(out, "{ALLOWED_MARK}{allowed}").unwrap();
    out.flush().unwrap();
}

/// `test`'s name for the harness's `--exact`: its path in the test binary (`concurrency::test`
/// when this file is a module of `tests/main.rs`).
fn harness_name(test: &str) -> String {
    match module_path!().split_once("::") {
        Some((_binary, module)) => format!("{module}::{test}"),
        None => test.to_owned(),
    }
}

#[test]
fn several_processes_on_one_key_admit_exactly_the_limit() {
    let Some(url) = support::standalone_url() else {
        return;
    };
    let prefix = String::from_utf8(support::unique_prefix("processes")).unwrap();
    let exe = std::env::current_exe().unwrap();
    let attempts = 100; // per process: 4 × 100 = 400 attempts for a limit of 100
    let mut children = Vec::new();
    for _ in 0..PROCESSES {
        let child = Command::new(&exe)
            .arg(harness_name("worker_process_entry"))
            .args(["--exact", "--nocapture"])
            .env(ENV_WORKER, "1")
            .env(ENV_WORKER_URL, &url)
            .env(ENV_WORKER_PREFIX, &prefix)
            .env(ENV_WORKER_ATTEMPTS, attempts.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        children.push(child);
    }
    // Wait for all of them, at most 60 s; on a timeout kill every one still running (by PID).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut statuses = vec![None; PROCESSES];
    while statuses.iter().any(Option::is_none) && Instant::now() < deadline {
        for (child, status) in children.iter_mut().zip(&mut statuses) {
            if status.is_none() {
                *status = child.try_wait().unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if statuses.iter().any(Option::is_none) {
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("worker processes still running after 60 s: killed");
    }
    let mut total = 0u64;
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "worker failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let count = stdout
            .lines()
            .find_map(|line| line.strip_prefix(ALLOWED_MARK))
            .unwrap_or_else(|| panic!("no {ALLOWED_MARK} line in the worker's stdout:\n{stdout}"));
        total += count.trim().parse::<u64>().unwrap();
    }
    assert_eq!(total, L, "{PROCESSES} processes on one key");
}

// ---------------------------------------------------------------------------------------------
// Clock skew

/// The skew scenario: a per-minute limit of `SKEW_L`, two instances 5 minutes apart.
const SKEW_L: u64 = 10;
const SKEW: Duration = Duration::from_secs(5 * 60);

fn per_minute() -> Limit {
    Limit::token_bucket(Quota::per_minute(SKEW_L).unwrap())
}

async fn count_allowed(store: &RedisStore, key: &str, attempts: u64) -> u64 {
    let mut allowed = 0;
    for _ in 0..attempts {
        if store.check(key, per_minute()).await.unwrap().is_allowed() {
            allowed += 1;
        }
    }
    allowed
}

/// Why client time is for tests only: two instances whose clocks are 5 minutes apart each see
/// a full bucket the other already spent, so together they admit twice a per-minute limit
/// within the same instant.
#[tokio::test]
async fn client_time_with_skewed_clocks_over_admits_which_is_why_server_time_is_the_default() {
    let Some(url) = support::standalone_url() else {
        return;
    };
    let prefix = support::unique_prefix("skew-client");
    let t0 = 1_800_000_000_000_000; // microseconds since the epoch
    let behind = ManualClock::new(t0);
    let ahead = ManualClock::new(t0 + u64::try_from(SKEW.as_micros()).unwrap());
    let a = support::connect(
        RedisStore::builder(&url)
            .prefix(&prefix)
            .client_clock(behind),
        "standalone Redis server",
    )
    .await;
    let b = support::connect(
        RedisStore::builder(&url)
            .prefix(&prefix)
            .client_clock(ahead),
        "standalone Redis server",
    )
    .await;
    let from_a = count_allowed(&a, "skewed", 2 * SKEW_L).await;
    let from_b = count_allowed(&b, "skewed", 2 * SKEW_L).await;
    let again_a = count_allowed(&a, "skewed", 2 * SKEW_L).await;
    let total = from_a + from_b + again_a;
    eprintln!(
        "client time, clocks {SKEW:?} apart: {from_a} + {from_b} + {again_a} = {total} admitted \
         for a limit of {SKEW_L} per minute"
    );
    assert_eq!(from_a, SKEW_L);
    // The instance 5 minutes ahead sees the bucket refilled: the danger is real.
    assert_eq!(from_b, SKEW_L);
    assert!(total > SKEW_L, "client time over-admits under skew");
}

/// The same two instances judged by Redis' `TIME` (the default): whatever their local clocks
/// say, they admit exactly the limit together.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_time_admits_exactly_the_limit_across_instances_whatever_their_clocks() {
    let Some(url) = support::standalone_url() else {
        return;
    };
    let prefix = support::unique_prefix("skew-server");
    let mut stores = Vec::new();
    for _ in 0..2 {
        stores.push(
            support::connect(
                RedisStore::builder(&url).prefix(&prefix),
                "standalone Redis server",
            )
            .await,
        );
    }
    let start = Instant::now();
    // Sequentially, as in the client-time scenario, then concurrently.
    let from_a = count_allowed(&stores[0], "skewed", 2 * SKEW_L).await;
    let from_b = count_allowed(&stores[1], "skewed", 2 * SKEW_L).await;
    let mut tasks = Vec::new();
    for store in &stores {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            count_allowed(&store, "skewed", 2 * SKEW_L).await
        }));
    }
    let mut concurrent = 0;
    for task in tasks {
        concurrent += task.await.unwrap();
    }
    let elapsed = start.elapsed();
    let total = from_a + from_b + concurrent;
    // One unit refills every 6 s of server time: count those a very slow run could see.
    let refilled = elapsed.as_secs() / 6;
    eprintln!("server time: {from_a} + {from_b} + {concurrent} = {total} in {elapsed:?}");
    assert_eq!(from_a, SKEW_L);
    assert!(
        from_b <= refilled,
        "{from_b} admitted after the limit was spent"
    );
    assert!(
        (SKEW_L..=SKEW_L + refilled).contains(&total),
        "{total} admitted for a limit of {SKEW_L}"
    );
}
