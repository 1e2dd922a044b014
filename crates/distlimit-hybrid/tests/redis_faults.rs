//! Real faults against a real `redis-server` each test starts itself (by PID, on a free loopback
//! port): SIGKILL under load, restart, SIGSTOP (a hung server), `CLIENT PAUSE` (a slow server),
//! and a flood on one denied key. The primary is a `RedisStore` (wrapped in a pass-through
//! `FaultyStore` that counts the calls reaching it), the fallback a `MemoryStore`.
//!
//! Assertions are on counts (no error reaches a caller, calls that reached Redis, timeouts per
//! cool-off), never on wall-clock time; the decision latency p99 of each phase is printed
//! (`cargo test -p distlimit-hybrid --test integration redis_faults:: -- --nocapture`).
//!
//! Without a `redis-server` (`DISTLIMIT_REDIS_SERVER_BIN` or `PATH`) the tests skip with a note,
//! unless `DISTLIMIT_REQUIRE_REDIS=1` (`cargo xtask test`), which makes them fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use distlimit_core::{BreakerState, Limit, Quota, Source, StoreExt};
use distlimit_hybrid::Hybrid;
use distlimit_memory::MemoryStore;
use distlimit_redis::RedisStore;
use distlimit_test::FaultyStore;
use distlimit_test::server::RedisServer;

type Primary = FaultyStore<RedisStore>;
type HybridStore = Hybrid<Primary, MemoryStore>;

const BUDGET: Duration = Duration::from_millis(50);
const INSTANCES: u64 = 4;
/// Tasks deciding concurrently in the load phases.
const TASKS: usize = 8;
/// Budgets one task may wait before the default opening rule (3 failures over at least 50 ms)
/// opens the breaker, with the default 50 ms budget: `1 + ceil(50 ms / 50 ms)`.
const WAITS_BEFORE_OPEN: u64 = 2;
/// The most decisions one load task makes.
const PER_TASK: usize = 20_000;
/// The longest a load phase may run, whatever happens.
const HARD_LIMIT: Duration = Duration::from_secs(20);

/// A store on `server` with the given cool-off; the Redis store's own response timeout is far
/// above the budget, so the budget is what trips.
async fn store(server: &RedisServer, cool_off: Duration) -> Arc<HybridStore> {
    let redis = RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    Arc::new(
        Hybrid::builder(FaultyStore::new(redis), MemoryStore::new())
            .name("redis")
            .budget(BUDGET)
            .first_cool_off(cool_off)
            .cool_off(cool_off)
            .instances(INSTANCES)
            .build()
            .unwrap(),
    )
}

/// A generous limit: load decisions are admitted, so every one of them writes to Redis.
fn roomy() -> Limit {
    Limit::token_bucket(Quota::per_second(1_000_000).unwrap())
}

struct Sample {
    started: Instant,
    latency: Duration,
    source: Option<Source>,
}

/// `TASKS` tasks deciding on 64 keys until stopped (or the bounds); every sample.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Sample>>>,
}

impl Load {
    fn start(store: &Arc<HybridStore>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let begun = Instant::now();
        let tasks = (0..TASKS)
            .map(|t| {
                let (store, stop) = (store.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut samples = Vec::new();
                    for i in 0..PER_TASK {
                        if stop.load(Ordering::Relaxed) || begun.elapsed() > HARD_LIMIT {
                            break;
                        }
                        let key = format!("load:{}", (i * TASKS + t) % 64);
                        let started = Instant::now();
                        let result = store.check(&key, roomy()).await;
                        samples.push(Sample {
                            started,
                            latency: started.elapsed(),
                            source: result.ok().map(|d| d.source()),
                        });
                        // Paced like a service (about 1 000 decisions per second per task),
                        // which also yields the worker to the timer and the other tasks.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    samples
                })
            })
            .collect();
        Self { stop, tasks }
    }

    async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for t in self.tasks {
            all.extend(t.await.unwrap());
        }
        all
    }
}

fn p99<'a>(samples: impl Iterator<Item = &'a Sample>) -> (usize, Duration, Duration) {
    let mut l: Vec<Duration> = samples.map(|s| s.latency).collect();
    l.sort();
    if l.is_empty() {
        return (0, Duration::ZERO, Duration::ZERO);
    }
    let i = (l.len() * 99 / 100).min(l.len() - 1);
    (l.len(), l[i], l[l.len() - 1])
}

fn print_phase(
    test: &str,
    phase: &str,
    samples: &[Sample],
    from: Option<Instant>,
    to: Option<Instant>,
) {
    let (n, p99, max) = p99(samples
        .iter()
        .filter(|s| from.is_none_or(|f| s.started >= f) && to.is_none_or(|t| s.started < t)));
    eprintln!("{test}: {phase}: {n} decisions, p99 {p99:?}, max {max:?}");
}

/// Decides one request every 10 ms until the breaker is closed again (bounded); the time it took.
async fn until_closed(store: &HybridStore, bound: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < bound {
        let d = store.check("recovery", roomy()).await.unwrap();
        if d.source() == Source::Primary {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_then_restart() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let cool_off = Duration::from_millis(500);
    let store = store(&server, cool_off).await;
    let load = Load::start(&store);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Bracketed: a decision started before `killing` may still be answered by Redis; one
    // started after `killed` cannot be (`kill` returns once the process is reaped and its port
    // closed), even if this thread was preempted around the kill.
    let killing = Instant::now();
    server.kill();
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let samples = load.stop().await;

    let errors = samples.iter().filter(|s| s.source.is_none()).count();
    assert_eq!(errors, 0, "no error reaches a caller");
    let after: Vec<&Sample> = samples.iter().filter(|s| s.started >= killed).collect();
    assert!(!after.is_empty());
    assert!(
        after.iter().all(|s| s.source == Some(Source::Fallback)),
        "every decision after the kill comes from the fallback"
    );
    assert!(samples.iter().any(|s| s.source == Some(Source::Primary)));
    assert_eq!(store.breaker_state(), BreakerState::Open);
    print_phase("sigkill", "before", &samples, None, Some(killing));
    print_phase("sigkill", "after the kill", &samples, Some(killed), None);

    // The fallback enforces this instance's share: burst 8 over 4 instances is 2 here.
    let limit = Limit::gcra(Quota::per_hour(8).unwrap());
    let mut allowed = 0;
    for _ in 0..10 {
        let d = store.check("share", limit).await.unwrap();
        assert_eq!((d.source(), d.limit()), (Source::Fallback, 2));
        allowed += usize::from(d.is_allowed());
    }
    assert_eq!(allowed, 2);

    // While it is down, at most one call per cool-off reaches for Redis.
    let calls = store.primary().calls();
    let down = Instant::now();
    for _ in 0..200 {
        store.check("down", roomy()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let probes = store.primary().calls() - calls;
    let cool_offs = down.elapsed().as_millis() / cool_off.as_millis() + 1;
    assert!(
        probes as u128 <= cool_offs,
        "{probes} probes in {cool_offs} cool-offs"
    );

    // Restart: back on the primary within the cool-off and a probe or two.
    server.restart().unwrap();
    let probes_before = store.stats().probes;
    let took = until_closed(&store, Duration::from_secs(15)).await;
    let probes = store.stats().probes - probes_before;
    eprintln!("restart: back on the primary after {took:?}, {probes} probe(s)");
    assert!(took.is_some(), "the breaker closes once Redis is back");
    assert!(probes <= 2, "{probes} probes to recover");
    assert_eq!(store.breaker_state(), BreakerState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_the_budget_trips_the_breaker() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let cool_off = Duration::from_millis(500);
    let store = store(&server, cool_off).await;
    let load = Load::start(&store);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stopped = Instant::now();
    server.pause().unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let samples = load.stop().await;
    let elapsed = stopped.elapsed();
    server.resume().unwrap();

    assert_eq!(samples.iter().filter(|s| s.source.is_none()).count(), 0);
    let stats = store.stats();
    // The calls that waited out the budget: before the breaker opens, each task waits at most
    // `1 + ceil(50 ms / budget)` budgets (the default opening rule: a run of failures lasting
    // 50 ms; two with the 50 ms budget), then one probe per cool-off.
    let calls = stats.timeouts;
    assert!(calls >= 1, "the budget ran out: {stats:?}");
    let bound =
        WAITS_BEFORE_OPEN * TASKS as u64 + (elapsed.as_millis() / cool_off.as_millis()) as u64 + 1;
    assert!(
        calls <= bound,
        "{calls} calls waited for the hung Redis (bound {bound})"
    );
    assert!(stats.probes >= 1, "{stats:?}");
    print_phase("sigstop", "before", &samples, None, Some(stopped));
    print_phase("sigstop", "stopped", &samples, Some(stopped), None);
    eprintln!("sigstop: {calls} calls waited the budget in {elapsed:?}; {stats:?}");

    let took = until_closed(&store, Duration::from_secs(15)).await;
    eprintln!("sigstop: back on the primary {took:?} after SIGCONT");
    assert!(took.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_a_slow_server_trips_the_budget() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let cool_off = Duration::from_millis(300);
    let store = store(&server, cool_off).await;
    let load = Load::start(&store);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let paused = Instant::now();
    server.command(&["CLIENT", "PAUSE", "1500", "ALL"]).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let calls = store.stats().timeouts;
    let elapsed = paused.elapsed();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let samples = load.stop().await;

    assert_eq!(samples.iter().filter(|s| s.source.is_none()).count(), 0);
    assert!(calls >= 1);
    // As with SIGSTOP: each task's waits before the breaker opens, then one probe per cool-off.
    let bound =
        WAITS_BEFORE_OPEN * TASKS as u64 + (elapsed.as_millis() / cool_off.as_millis()) as u64 + 1;
    assert!(
        calls <= bound,
        "{calls} calls waited for the paused Redis (bound {bound})"
    );
    eprintln!("client pause: {calls} calls waited the budget in {elapsed:?}");
    let resumed = paused + Duration::from_millis(1500);
    print_phase("client pause", "before", &samples, None, Some(paused));
    print_phase(
        "client pause",
        "paused",
        &samples,
        Some(paused),
        Some(resumed),
    );
    print_phase("client pause", "after", &samples, Some(resumed), None);
    let took = until_closed(&store, Duration::from_secs(15)).await;
    assert!(took.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_on_one_denied_key_reaches_redis_once_per_retry_period() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = store(&server, Duration::from_secs(5)).await;
    // 10 per minute, 10 at once: after the burst, one unit per 6 s.
    let limit = Limit::token_bucket(Quota::per_minute(10).unwrap());
    let scripts =
        |s: &RedisServer| s.command_calls("evalsha").unwrap() + s.command_calls("eval").unwrap();
    server.command(&["CONFIG", "RESETSTAT"]).unwrap();
    let start = Instant::now();
    let mut allowed = 0u64;
    let mut flood = 0u64;
    while flood < 20_000 && start.elapsed() < HARD_LIMIT {
        let d = store.check("abuser", limit).await.unwrap();
        allowed += u64::from(d.is_allowed());
        flood += 1;
    }
    let elapsed = start.elapsed();
    let calls = scripts(&server);
    // Every admission, and one denial per retry period (6 s), plus the one in progress.
    let periods = elapsed.as_secs() / 6 + 1;
    eprintln!(
        "flood: {flood} requests in {elapsed:?}: {allowed} admitted, {calls} scripts ran in Redis, \
         {} answered by the blocked-key cache",
        store.stats().blocked
    );
    assert!(
        calls <= allowed + periods + 1,
        "{calls} scripts for {flood} requests"
    );
    assert!(store.stats().blocked >= flood - calls);
    assert_eq!(store.breaker_state(), BreakerState::Closed);
}
