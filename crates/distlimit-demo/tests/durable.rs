//! Durable decisions through the binary (`--redis-durable-replicas 1 --failure-mode
//! fail-closed`): three `distlimit-demo` processes share a Sentinel set whose replica lags by
//! [`LAG`] (it replicates through a `Proxy` that delays the primary's stream). Clients are this
//! test, over HTTP, spreading one user's requests over the three processes on a capped limit
//! of [`LIMIT`] (a token bucket that does not refill during the test).
//!
//! [`BEFORE`] requests are admitted; the primary is killed (SIGKILL, by PID) right after, and
//! what the proxy still holds dies with it, as a lagging replica's backlog lives in the dying
//! primary's output buffer. Each client goes on sending a request every [`TRICKLE_EVERY`]
//! while the sentinels promote the replica and the old primary is restarted empty as the new
//! primary's replica, until every process admits again; then [`AFTER`] more requests are sent.
//!
//! * `three_processes_never_over_admit_through_a_failover_with_durable_decisions`: admitted
//!   in all ≤ [`LIMIT`], and ≥ [`LIMIT`] less the requests that failed (`503`: a failed
//!   request charges one unit at most); through the failover the processes answer `503`
//!   (fail closed) instead of admitting on their own;
//! * `three_processes_over_admit_through_a_failover_without_durable_decisions`: the same run
//!   without `--redis-durable-replicas` admits more than [`LIMIT`] (160 of 100): the promoted
//!   replica had not received the last admissions, so the check above can fail;
//! * `three_processes_over_admit_through_a_failover_with_durable_decisions_but_a_fallback`:
//!   with `--failure-mode fallback` instead, each process admits its share of the limit from
//!   memory through the failover (159 of 100): why a hard quota pairs durable decisions with
//!   `fail-closed`.
//!
//! Servers: private ones (`distlimit_test::server`), never the shared ones of `cargo xtask
//! test`; without `redis-server` the tests fail. Numbers: `cargo test -p distlimit-demo --test
//! durable -- --nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;
use distlimit_test::replace_file;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use distlimit_test::Proxy;
use distlimit_test::server::{RedisServer, SERVICE, Sentinel, server_bin};
use http::StatusCode;
use support::{DemoProcess, Http, Reply, unique};

/// The tests run one at a time: a killed primary's port is free until the test restarts it,
/// and a server another test started on it meanwhile would be taken for the old primary by
/// the sentinels.
static SERVERS: LazyLock<tokio::sync::Mutex<()>> = LazyLock::new(Default::default);

/// The user's capped limit.
const LIMIT: usize = 100;
/// Requests before the kill (all admitted).
const BEFORE: usize = 60;
/// Requests after the promotion: more than the limit, so the user runs out whatever the
/// replica holds.
const AFTER: usize = 150;
/// `distlimit-demo` processes.
const PROCESSES: usize = 3;
/// How far behind the primary the replica is: the proxy delays the primary's stream to it.
const LAG: Duration = Duration::from_millis(400);
/// `--redis-durable-timeout-ms`: how long `WAIT` waits for the replica, above the lag.
const WAIT_TIMEOUT_MS: &str = "1500";
/// `--redis-timeout-ms`: above the `WAIT` timeout.
const RESPONSE_TIMEOUT_MS: &str = "3000";
/// `--redis-budget-ms`: above both.
const BUDGET_MS: &str = "5000";
/// How often each client sends a request through the failover.
const TRICKLE_EVERY: Duration = Duration::from_millis(50);
/// The most requests a client sends through the failover.
const TRICKLE_MAX: usize = 400;
/// The longest the sentinels may take to name the replica after the kill (1 s of
/// `down-after-milliseconds`, an election), on a loaded machine.
const PROMOTION_BOUND: Duration = Duration::from_secs(20);
/// The longest a restarted server may take to sync from the new primary.
const SYNC_BOUND: Duration = Duration::from_secs(10);
/// The longest the three processes may take, once the old primary synced, to admit again:
/// each circuit breaker, opened by the failover, probes again after a cool-off that doubles
/// after each failed probe up to 5 s (`distlimit_hybrid::DEFAULT_COOL_OFF`).
const FOLLOW_BOUND: Duration = Duration::from_secs(25);

/// 100 a day, one user: nothing refills during a test. The per-address limit (every request
/// comes from 127.0.0.1) never denies.
const CAPPED: &str = r#"
[[policy]]
name = "api"
tiers = [{ name = "capped", algorithm = "token_bucket", limit = 1, per = "24h", burst = 100 }]

[[policy]]
name = "api-ip"
tiers = [{ name = "client", algorithm = "token_bucket", limit = 100000, per = "1s", burst = 100000 }]
"#;

/// Runs blocking `f` (a server command) on this multi-threaded runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

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

/// The primary `sentinel` names for [`SERVICE`], as `host:port`.
fn named(sentinel: &RedisServer) -> Option<String> {
    let addr = sentinel
        .command(&["SENTINEL", "get-master-addr-by-name", SERVICE])
        .ok()?;
    Some(addr.lines().collect::<Vec<_>>().join(":"))
}

/// What a batch of requests got.
#[derive(Debug, Default)]
struct Answers {
    admitted: usize,
    denied: usize,
    /// Answers other than 200 and 429 (a fail-closed `503`), with one body.
    failed: usize,
    failure: Option<String>,
}

impl Answers {
    /// Counts `reply`.
    fn count(&mut self, reply: &Reply) {
        match reply.status {
            StatusCode::OK => self.admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => self.denied += 1,
            other => {
                self.failed += 1;
                self.failure
                    .get_or_insert_with(|| format!("{other}: {}", reply.body));
            }
        }
    }

    /// Adds `other`'s counts.
    fn add(&mut self, other: Self) {
        self.admitted += other.admitted;
        self.denied += other.denied;
        self.failed += other.failed;
        if self.failure.is_none() {
            self.failure = other.failure;
        }
    }
}

/// Requests of `user` to `addr` one at a time, every [`TRICKLE_EVERY`], until `stop` or
/// [`TRICKLE_MAX`] of them.
async fn trickle(http: &Http, addr: SocketAddr, user: &str, stop: &AtomicBool) -> Answers {
    let mut answers = Answers::default();
    for _ in 0..TRICKLE_MAX {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        answers.count(&http.get(addr, "/api/data", Some(user)).await);
        tokio::time::sleep(TRICKLE_EVERY).await;
    }
    answers
}

/// `count` requests of `user`, spread over `demos`, all at once.
async fn spend(http: &Http, demos: &[DemoProcess], user: &str, count: usize) -> Answers {
    let tasks: Vec<_> = (0..count)
        .map(|i| {
            let (http, user) = (http.clone(), user.to_owned());
            let addr = demos[i % demos.len()].addr;
            tokio::spawn(async move { http.get(addr, "/api/data", Some(&user)).await })
        })
        .collect();
    let mut answers = Answers::default();
    for task in tasks {
        answers.count(&task.await.unwrap());
    }
    answers
}

/// What one run admitted before the kill, through the failover and after it.
struct Run {
    before: usize,
    through: Answers,
    after: Answers,
}

impl Run {
    /// Admitted in all.
    fn admitted(&self) -> usize {
        self.before + self.through.admitted + self.after.admitted
    }
}

/// The failover scenario through three processes, with durable decisions on or off, and
/// `--failure-mode failure_mode`.
async fn failover_through_three_processes(durable: bool, failure_mode: &str) -> Run {
    let _alone = SERVERS.lock().await;
    let bin = server_bin().expect("this test needs redis-server");
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
    poll(SYNC_BOUND, "the replica is not online", || {
        online(set.primary())
    })
    .await;
    proxy.set_delays(Duration::ZERO, LAG);

    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    replace_file(&policy, CAPPED).unwrap();
    let sentinels: Vec<String> = set.sentinels().iter().map(RedisServer::addr).collect();
    let url = format!("redis+sentinel://{}/{SERVICE}", sentinels.join(","));
    let mut args = vec![
        "--redis",
        &url,
        "--policy",
        policy.to_str().unwrap(),
        "--instances",
        "3",
        "--redis-budget-ms",
        BUDGET_MS,
        "--redis-timeout-ms",
        RESPONSE_TIMEOUT_MS,
        "--failure-mode",
        failure_mode,
    ];
    if durable {
        args.extend([
            "--redis-durable-replicas",
            "1",
            "--redis-durable-timeout-ms",
            WAIT_TIMEOUT_MS,
        ]);
    }
    let demos: Vec<DemoProcess> = (0..PROCESSES).map(|_| DemoProcess::start(&args)).collect();
    let http = Http::new();
    let user = unique(&format!("durable-{durable}-{failure_mode}"));

    let started = Instant::now();
    let before = spend(&http, &demos, &user, BEFORE).await;
    let spent = started.elapsed();
    // The replica's backlog dies with the primary: hold it, kill the primary, drop it.
    proxy.hold();
    set.primary_mut().kill();
    proxy.cut();
    let killed = Instant::now();
    // The clients go on sending through the failover, until every process follows.
    let stop = Arc::new(AtomicBool::new(false));
    let during: Vec<_> = demos
        .iter()
        .map(|demo| {
            let (http, user, addr, stop) = (http.clone(), user.clone(), demo.addr, stop.clone());
            tokio::spawn(async move { trickle(&http, addr, &user, &stop).await })
        })
        .collect();
    eprintln!("durable {durable}, {failure_mode}: before the kill, in {spent:.1?}: {before:?}");
    assert_eq!(
        before.admitted, BEFORE,
        "every request before the kill is admitted: {before:?}"
    );

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
    poll(SYNC_BOUND, "the old primary did not sync", || online(new)).await;
    eprintln!(
        "the old primary synced {:.1?} after the kill",
        killed.elapsed()
    );

    // Every process follows the promotion: a user of its own is admitted (its circuit breaker,
    // opened by the failover, closed again).
    let deadline = Instant::now() + FOLLOW_BOUND;
    for (i, demo) in demos.iter().enumerate() {
        let probe = unique(&format!("probe-{i}"));
        loop {
            let reply = http.get(demo.addr, "/api/data", Some(&probe)).await;
            if reply.status == StatusCode::OK {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "process {i} did not follow: {} {}\n{}",
                reply.status,
                reply.body,
                demo.log().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "process {i} follows {:.1?} after the kill",
            killed.elapsed()
        );
    }
    stop.store(true, Ordering::Relaxed);
    let mut through = Answers::default();
    for task in during {
        through.add(task.await.unwrap());
    }
    eprintln!(
        "every process follows {:.1?} after the kill; through the failover: {through:?}",
        killed.elapsed()
    );

    let after = spend(&http, &demos, &user, AFTER).await;
    eprintln!(
        "durable {durable}, {failure_mode}: after the promotion: {after:?}; {} admitted in all (limit {LIMIT})",
        before.admitted + through.admitted + after.admitted
    );
    if durable {
        for (i, demo) in demos.iter().enumerate() {
            assert!(
                demo.log().iter().any(|l| l.contains("durable decisions")),
                "process {i} did not log durable decisions"
            );
        }
    }
    Run {
        before: before.admitted,
        through,
        after,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_never_over_admit_through_a_failover_with_durable_decisions() {
    let run = failover_through_three_processes(true, "fail-closed").await;
    assert!(
        run.admitted() <= LIMIT,
        "{} + {} + {} admitted, limit {LIMIT}",
        run.before,
        run.through.admitted,
        run.after.admitted
    );
    // Fail closed: what could not be made durable through the failover was answered 503, never
    // admitted by a process on its own.
    assert!(run.through.failed > 0, "{:?}", run.through);
    // The promoted replica held every admission, so the rest of the limit is admitted after:
    // less only what failed requests charged (one unit each at most, those whose `WAIT` no
    // replica answered), never more.
    assert!(
        run.after.admitted > 0,
        "nothing admitted after the promotion"
    );
    let failed = run.through.failed + run.after.failed;
    assert!(
        run.admitted() + failed >= LIMIT,
        "{} admitted and {failed} failed, limit {LIMIT}",
        run.admitted()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_over_admit_through_a_failover_without_durable_decisions() {
    let run = failover_through_three_processes(false, "fail-closed").await;
    // The promoted replica had not received the last admissions before the kill: it admits
    // them again.
    assert!(
        run.admitted() > LIMIT,
        "{} + {} + {} admitted, limit {LIMIT}: no over-admission without durable decisions",
        run.before,
        run.through.admitted,
        run.after.admitted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_over_admit_through_a_failover_with_durable_decisions_but_a_fallback() {
    let run = failover_through_three_processes(true, "fallback").await;
    // Durable decisions keep what Redis admitted, but through the failover each process admits
    // its share of the limit from memory (`--instances 3`: a third each): a hard quota pairs
    // them with `fail-closed`.
    assert!(
        run.through.admitted > 0 && run.admitted() > LIMIT,
        "{} + {} + {} admitted, limit {LIMIT}: no over-admission with a fallback",
        run.before,
        run.through.admitted,
        run.after.admitted
    );
}
