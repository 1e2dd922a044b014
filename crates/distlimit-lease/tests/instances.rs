//! Two and three instances (separate processes) leasing one key of a real Redis at a steady
//! rate above the limit: zero over-admission, and under-admission at most 5% of what the limit
//! allows over the run.
//!
//! The test binary re-runs itself as the instances (`DISTLIMIT_LEASE_CHILD` set): each waits
//! for a common start instant, offers requests at a steady pace for the run, and prints what it
//! admitted. The parent sums them and compares with the algorithm's bound from a fresh key over
//! the run (`burst + ⌊elapsed × limit / period⌋`, GCRA: `burst + ⌊elapsed / T⌋`), where elapsed
//! runs from the start instant to the last instance's last answer.
//!
//! 2 s per run by default (the CI version); `DISTLIMIT_LEASE_RUN_SECS=10` for the 10 s one (see
//! the README). On `DISTLIMIT_REDIS_URL` as `cargo xtask test` sets it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlimit_core::{Key, Limit, Quota, Request, Store};
use distlimit_lease::Leased;
use distlimit_redis::RedisStore;

const CHILD: &str = "DISTLIMIT_LEASE_CHILD";

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn run_secs() -> u64 {
    std::env::var("DISTLIMIT_LEASE_RUN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2)
        .clamp(1, 60)
}

/// The limit of a run: 1 000 per second, 500 at once. The burst lets a run ride out a stall of
/// every process on a loaded machine for up to half a second: the key then fills up instead of
/// losing refills, which would count as under-admission though no lease held them.
fn limit(gcra: bool) -> Limit {
    let quota = Quota::per_second(1_000).unwrap().with_burst(500).unwrap();
    if gcra {
        Limit::gcra(quota)
    } else {
        Limit::token_bucket(quota)
    }
}

/// One instance: from `start_us` for `secs`, `rate` requests per second in steady 1 ms steps.
fn child() {
    let var = |name: &str| std::env::var(name).unwrap();
    let url = var("DISTLIMIT_REDIS_URL");
    let prefix = var("DISTLIMIT_LEASE_PREFIX");
    let start_us: u64 = var("DISTLIMIT_LEASE_START_US").parse().unwrap();
    let secs: u64 = var("DISTLIMIT_LEASE_SECS").parse().unwrap();
    let rate: u64 = var("DISTLIMIT_LEASE_RATE").parse().unwrap();
    let gcra = var("DISTLIMIT_LEASE_GCRA") == "1";
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        // A shared test machine may stall a call past the default 200 ms.
        let redis = RedisStore::builder(url)
            .prefix(prefix)
            .response_timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let store = Leased::for_policies(["hot"]).build(redis);
        let limit = limit(gcra);
        let request = Request::new(Key::new("one-key").unwrap(), limit)
            .with_policy("hot")
            .unwrap();
        let end_us = start_us + secs * 1_000_000;
        tokio::time::sleep(Duration::from_micros(start_us.saturating_sub(now_us()))).await;
        let (mut offered, mut admitted, mut errors) = (0u64, 0u64, 0u64);
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        let mut last_us = now_us();
        loop {
            tick.tick().await;
            let now = now_us();
            if now >= end_us {
                break;
            }
            // Catch up with the steady pace: `rate` per second since the start.
            let due = (now - start_us) * rate / 1_000_000;
            while offered < due {
                offered += 1;
                match store.decide(&request).await {
                    Ok(d) if d.is_allowed() => admitted += 1,
                    Ok(_) => {}
                    Err(e) => {
                        errors += 1;
                        eprintln!("instance error: {e}");
                    }
                }
                last_us = now_us();
            }
        }
        let stats = store.stats();
        println!(
            "RESULT admitted={admitted} offered={offered} errors={errors} end_us={last_us} \
             calls={} held={}",
            stats.store_calls, stats.held
        );
    });
}

fn field(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
        .parse()
        .unwrap()
}

/// `test`'s name for the harness's `--exact`: its path in the test binary (`instances::test`
/// when this file is a module of `tests/main.rs`).
fn harness_name(test: &str) -> String {
    match module_path!().split_once("::") {
        Some((_binary, module)) => format!("{module}::{test}"),
        None => test.to_owned(),
    }
}

/// Runs `instances` processes on one fresh key and checks the counts.
fn race(test: &str, instances: u64, gcra: bool) {
    let Some(url) = distlimit_test::server::var("DISTLIMIT_REDIS_URL") else {
        return;
    };
    let secs = run_secs();
    let start_us = now_us() + 1_000_000;
    let prefix = String::from_utf8(distlimit_test::unique_prefix(test)).unwrap();
    let prefix = prefix.trim_end_matches(':').to_owned();
    let limit = limit(gcra);
    // Twice the limit in all, shared evenly.
    let per_second = 2 * limit.quota().limit() / instances;
    let children: Vec<_> = (0..instances)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .arg(harness_name(test))
                .args(["--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD, "1")
                .env("DISTLIMIT_REDIS_URL", &url)
                .env("DISTLIMIT_LEASE_PREFIX", &prefix)
                .env("DISTLIMIT_LEASE_START_US", start_us.to_string())
                .env("DISTLIMIT_LEASE_SECS", secs.to_string())
                .env("DISTLIMIT_LEASE_RATE", per_second.to_string())
                .env("DISTLIMIT_LEASE_GCRA", if gcra { "1" } else { "0" })
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let (mut admitted, mut offered, mut calls, mut end_us) = (0, 0, 0, 0);
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "an instance failed: {stdout}");
        // The harness prints the test's name on the same line first.
        let line = stdout
            .lines()
            .find_map(|l| Some(&l[l.find("RESULT")?..]))
            .unwrap_or_else(|| panic!("no result from an instance: {stdout}"));
        assert_eq!(field(line, "errors"), 0, "{line}");
        admitted += field(line, "admitted");
        offered += field(line, "offered");
        calls += field(line, "calls");
        end_us = end_us.max(field(line, "end_us"));
    }
    let q = limit.quota();
    let elapsed = end_us - start_us;
    let bound = if gcra {
        q.burst() + elapsed / q.emission_interval_us()
    } else {
        q.burst() + elapsed * q.limit() / q.period_us()
    };
    let under = bound.saturating_sub(admitted);
    println!(
        "{test}: {instances} instances, {secs} s, {}: offered {offered}, admitted {admitted}, \
         bound {bound}, under-admission {under} ({:.2}%), {calls} Redis calls ({:.3} per decision)",
        limit.algorithm(),
        100.0 * under as f64 / bound as f64,
        calls as f64 / offered as f64,
    );
    assert!(admitted <= bound, "over-admission: {admitted} > {bound}");
    assert!(
        under * 20 <= bound,
        "under-admission {under} above 5% of {bound}"
    );
}

#[test]
fn two_instances_token_bucket() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    race("two_instances_token_bucket", 2, false);
}

#[test]
fn three_instances_gcra() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    race("three_instances_gcra", 3, true);
}
