//! Crashes, not polite failovers: the primary of a Sentinel set, and the Cluster primary serving
//! the test keys' slot, die of SIGKILL under load. The replica takes over on its own (after the
//! sentinels' `down-after-milliseconds`, 1 s, or the Cluster's `cluster-node-timeout`, 2 s), and:
//!
//! - the `RedisStore` follows the new primary by itself and answers again within
//!   [`RECOVERY_BOUND`] of the promotion; every error meanwhile is transient and comes within
//!   the response timeout (plus [`SCHEDULING_SLACK`]); no key admits more than its budget beyond
//!   the writes the replica had not received at the kill (see [`check_budget`]);
//! - a `Hybrid` over it, on the same keys, answers every call (from its fallback while the
//!   primary is dead) and closes its breaker again after the promotion;
//! - the killed process, restarted on its port, comes back as a replica and decisions go on.
//!
//! Servers: each test starts a private Sentinel set or Cluster (`distlimit_test::server`) and
//! kills one of its nodes by PID; the shared servers of `cargo xtask test` are never faulted.
//! They need only `redis-server` (`DISTLIMIT_REDIS_SERVER_BIN` or the `PATH`): without it they
//! skip with a note, or fail under `DISTLIMIT_REQUIRE_REDIS=1` (`cargo xtask test`). The tests
//! run one at a time ([`SERIAL`]): each setup is 5 or 6 servers on a shared machine. The Cluster
//! test's name contains `cluster`, so it runs in the `test-cluster` step of `cargo xtask test`
//! (it needs nothing that step lacks). Timings:
//! `cargo test -p distlimit-redis --test integration crash:: -- --nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use support::blocking;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use distlimit_core::{BreakerState, Error, Key, Limit, Quota, Source, Store, StoreExt};
use distlimit_hybrid::Hybrid;
use distlimit_memory::MemoryStore;
use distlimit_redis::{RedisStore, RedisStoreBuilder, hash_slot};
use distlimit_test::server::{Cluster, RedisServer, SERVICE, Sentinel, server_bin_or_skip};

/// One private setup at a time in this binary.
static SERIAL: LazyLock<tokio::sync::Mutex<()>> = LazyLock::new(Default::default);

/// The stores' response timeout.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(250);
/// What a loaded 2-core machine may add to a call's time on top of the response timeout (the
/// tokio workers share the cores with 5 or 6 servers and the other load).
const SCHEDULING_SLACK: Duration = Duration::from_millis(500);
/// From the promotion to the first decision on the new primary: the Sentinel backend asks the
/// sentinels again after any failure (and polls them every second); the Cluster connection
/// refreshes its slot map when the dead node's connection fails.
const RECOVERY_BOUND: Duration = Duration::from_secs(5);
/// The longest the replica may take to be promoted after the kill (1 s or 2 s of detection, an
/// election, then gossip), on a loaded machine.
const PROMOTION_BOUND: Duration = Duration::from_secs(15);
/// The hybrid store's time budget for its primary.
const HYBRID_BUDGET: Duration = Duration::from_millis(200);
/// Tasks deciding through the plain store: at most this many decisions are in flight at the kill.
const TASKS: usize = 8;
/// Tasks deciding through the hybrid store.
const HYBRID_TASKS: usize = 4;
/// Pause between two decisions of a task.
const PACE: Duration = Duration::from_millis(5);
/// The most decisions one task makes, whatever happens.
const PER_TASK: usize = 5_000;
/// Identities under load.
const IDS: usize = 8;
/// Each identity's budget: a token bucket of `L` a day (nothing refills during a test), large
/// enough that every identity still admits when the primary dies.
const L: u64 = 600;

/// A token bucket of `limit` a day.
fn daily(limit: u64) -> Limit {
    Limit::token_bucket(Quota::per_day(limit).unwrap())
}

/// Polls `check` every 50 ms until it holds or `bound` has passed; how long it took.
async fn wait_for(bound: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < bound {
        if blocking(&mut check) {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Whether `server` is a replica whose link to its primary is up.
fn synced_replica(server: &RedisServer) -> bool {
    server
        .info("replication")
        .is_ok_and(|info| info.contains("role:slave") && info.contains("master_link_status:up"))
}

/// Connects `builder` with the test's timeouts.
async fn connect(builder: RedisStoreBuilder, tag: &str) -> RedisStore {
    support::connect(
        builder
            .prefix(support::unique_prefix(tag))
            .response_timeout(RESPONSE_TIMEOUT),
        tag,
    )
    .await
}

/// A hybrid over `redis`, with a memory fallback.
fn hybrid(redis: RedisStore) -> Arc<Hybrid<RedisStore, MemoryStore>> {
    Arc::new(
        Hybrid::builder(redis, MemoryStore::new())
            .name("redis")
            .budget(HYBRID_BUDGET)
            .cool_off(Duration::from_millis(300))
            .instances(2)
            .build()
            .unwrap(),
    )
}

// ---------------------------------------------------------------------------------------------
// Load

/// One decision: when it started, how long it took, and what came of it.
struct Sample {
    task: usize,
    id: usize,
    started: Instant,
    latency: Duration,
    outcome: Outcome,
}

#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    Allowed(Source),
    Denied(Source),
    /// A transient error that leaves unknown whether the script ran (a timeout, a lost
    /// connection): it may have spent a unit nobody saw.
    Ambiguous,
    /// Another transient error (the script did not run).
    Transient,
    /// A permanent error: wrong during a crash.
    Permanent(String),
}

impl Outcome {
    fn of(result: Result<distlimit_core::Decision, Error>) -> Self {
        match result {
            Ok(d) if d.is_allowed() => Self::Allowed(d.source()),
            Ok(d) => Self::Denied(d.source()),
            Err(e @ (Error::Timeout { .. } | Error::Unavailable { .. })) if e.is_transient() => {
                Self::Ambiguous
            }
            Err(e) if e.is_transient() => Self::Transient,
            Err(e) => Self::Permanent(format!("{e} ({e:?})")),
        }
    }

    fn ok(&self) -> bool {
        matches!(self, Self::Allowed(_) | Self::Denied(_))
    }
}

/// `tasks` tasks deciding `limit` on the identities `ids` (round robin) through `store` until
/// stopped, each bounded by [`PER_TASK`].
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Sample>>>,
}

impl Load {
    fn start<S: Store + 'static>(
        store: Arc<S>,
        ids: Arc<Vec<String>>,
        limit: Limit,
        tasks: usize,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..tasks)
            .map(|task| {
                let (store, ids, stop) = (store.clone(), ids.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut samples = Vec::new();
                    for n in 0..PER_TASK {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let id = (n + task) % ids.len();
                        let started = Instant::now();
                        let result = store.check(&ids[id], limit).await;
                        samples.push(Sample {
                            task,
                            id,
                            started,
                            latency: started.elapsed(),
                            outcome: Outcome::of(result),
                        });
                        tokio::time::sleep(PACE).await;
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
        for task in self.tasks {
            let samples = tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("a load task did not stop (a call hung)")
                .unwrap();
            all.extend(samples);
        }
        all
    }
}

/// The first sample started at or after `from` that succeeded (answered by `source`, if given).
fn first_ok_after(samples: &[Sample], from: Instant, source: Option<Source>) -> Option<Instant> {
    samples
        .iter()
        .filter(|s| s.started >= from)
        .filter(|s| match (&s.outcome, source) {
            (Outcome::Allowed(got) | Outcome::Denied(got), Some(want)) => *got == want,
            (outcome, None) => outcome.ok(),
            _ => false,
        })
        .map(|s| s.started + s.latency)
        .min()
}

/// Count, p99 and max latency of `samples`, and a count per outcome kind.
fn summary(samples: &[&Sample]) -> String {
    let mut latencies: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    latencies.sort_unstable();
    let n = latencies.len();
    let (p99, max) = if n == 0 {
        (Duration::ZERO, Duration::ZERO)
    } else {
        (latencies[(n * 99).div_ceil(100) - 1], latencies[n - 1])
    };
    let count = |f: fn(&Outcome) -> bool| samples.iter().filter(|s| f(&s.outcome)).count();
    format!(
        "{n} decisions ({} ok, {} fallback, {} ambiguous, {} other transient errors), p99 \
         {p99:.1?}, max {max:.1?}",
        count(Outcome::ok),
        count(|o| matches!(
            o,
            Outcome::Allowed(Source::Fallback) | Outcome::Denied(Source::Fallback)
        )),
        count(|o| matches!(o, Outcome::Ambiguous)),
        count(|o| matches!(o, Outcome::Transient)),
    )
}

// ---------------------------------------------------------------------------------------------
// The checks every crash ends with

/// When the crash happened, as the test saw it.
#[derive(Clone, Copy)]
struct Crash {
    /// Just before the SIGKILL.
    killing: Instant,
    /// The process is reaped: nothing starting later runs on it.
    killed: Instant,
    /// When the last check that found the replica not yet promoted began: it was promoted
    /// later, so nothing ending earlier ran on it as a primary.
    not_promoted: Instant,
    /// When a check first found it promoted.
    promoted: Instant,
}

/// Waits (bounded by [`PROMOTION_BOUND`]) until `promoted` holds, polling every 50 ms; the
/// [`Crash`] instants, or `None` if it never did.
async fn wait_for_promotion(
    killing: Instant,
    killed: Instant,
    mut promoted: impl FnMut() -> bool,
) -> Option<Crash> {
    let mut not_promoted = killed;
    while killed.elapsed() < PROMOTION_BOUND {
        let checking = Instant::now();
        if blocking(&mut promoted) {
            return Some(Crash {
                killing,
                killed,
                not_promoted,
                promoted: Instant::now(),
            });
        }
        not_promoted = checking;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Per identity: units the load admitted, and the decisions whose answer was lost that may
/// have spent a unit: those that started before the kill (on the old primary) or ended after
/// the promotion (on the new one). A call in between reached no primary: the old one was dead
/// and the replica, not yet promoted, refuses writes (`READONLY`).
fn tally(samples: &[Sample], crash: Crash) -> (Vec<u64>, Vec<u64>) {
    let (mut allowed, mut ambiguous) = (vec![0; IDS], vec![0; IDS]);
    for s in samples {
        match s.outcome {
            Outcome::Allowed(_) => allowed[s.id] += 1,
            Outcome::Ambiguous
                if s.started < crash.killed || s.started + s.latency > crash.not_promoted =>
            {
                ambiguous[s.id] += 1;
            }
            _ => {}
        }
    }
    (allowed, ambiguous)
}

/// Spends what is left of every identity (concurrently, one task per identity); the units
/// admitted per identity.
async fn drain(store: &RedisStore, ids: &[String]) -> Vec<u64> {
    let tasks: Vec<_> = ids
        .iter()
        .map(|id| {
            let (store, id) = (store.clone(), id.clone());
            tokio::spawn(async move {
                let mut allowed = 0;
                for _ in 0..=L {
                    match store.check(&id, daily(L)).await {
                        Ok(d) if d.is_allowed() => allowed += 1,
                        Ok(_) => break,
                        Err(e) => panic!("{id}: a decision after the recovery failed: {e:?}"),
                    }
                }
                allowed
            })
        })
        .collect();
    let mut drained = Vec::new();
    for task in tasks {
        drained.push(task.await.unwrap());
    }
    drained
}

/// No wrong decision: per identity, admitted (load + drain) plus the decisions whose answer was
/// lost reach the budget `L` (nothing spent that nobody saw, beyond those), and the admitted
/// exceed `L` only by writes the replica never received.
///
/// Replication is asynchronous: the primary answers a client and sends the write to its replica
/// in the same turn of its event loop, so a SIGKILL can only lose writes of the turn it lands
/// in, each a decision in flight at that moment. The plain store has [`TASKS`] tasks with one
/// decision in flight each, so the units admitted twice, summed over every identity, are at most
/// [`TASKS`]. More would mean the replica lost state it had acknowledged, or that the store
/// wrote to a server that was not the primary (the restarted process before it became a
/// replica, say).
fn check_budget(what: &str, during: &[u64], ambiguous: &[u64], drained: &[u64]) -> u64 {
    let mut twice = 0;
    for id in 0..IDS {
        let total = during[id] + drained[id];
        assert!(
            total + ambiguous[id] >= L,
            "{what}: identity {id}: {total} admitted, {} unknown, for {L}: units lost",
            ambiguous[id]
        );
        twice += total.saturating_sub(L);
    }
    assert!(
        twice <= TASKS as u64,
        "{what}: {twice} units admitted beyond the budgets ({during:?} during the load, \
         {drained:?} after); at most {TASKS} decisions were in flight at the kill"
    );
    twice
}

/// No call hung, none failed permanently, and some decided before the kill.
fn check_errors(what: &str, samples: &[Sample], killing: Instant) {
    let permanent: Vec<&String> = samples
        .iter()
        .filter_map(|s| match &s.outcome {
            Outcome::Permanent(e) => Some(e),
            _ => None,
        })
        .collect();
    assert!(
        permanent.is_empty(),
        "{what}: permanent errors: {permanent:?}"
    );
    let max = samples.iter().map(|s| s.latency).max().unwrap_or_default();
    assert!(
        max <= RESPONSE_TIMEOUT + SCHEDULING_SLACK,
        "{what}: a call took {max:?}, response timeout {RESPONSE_TIMEOUT:?}"
    );
    assert!(
        samples
            .iter()
            .any(|s| s.started < killing && s.outcome.ok()),
        "{what}: nothing decided before the kill"
    );
}

/// The hybrid over the crash: no error reached a caller, the fallback answered while the primary
/// was dead, the primary answered again after the promotion, and the breaker is closed.
fn check_hybrid(
    samples: &[Sample],
    store: &Hybrid<RedisStore, MemoryStore>,
    killed: Instant,
    promoted: Instant,
) -> Duration {
    let errors: Vec<&Outcome> = samples
        .iter()
        .map(|s| &s.outcome)
        .filter(|o| !o.ok())
        .collect();
    assert!(
        errors.is_empty(),
        "hybrid: errors reached callers: {errors:?}"
    );
    let max = samples.iter().map(|s| s.latency).max().unwrap_or_default();
    assert!(
        max <= HYBRID_BUDGET + SCHEDULING_SLACK,
        "hybrid: a call took {max:?}, budget {HYBRID_BUDGET:?}"
    );
    assert!(
        samples.iter().any(|s| s.started >= killed
            && s.started < promoted
            && matches!(s.outcome, Outcome::Allowed(Source::Fallback))),
        "hybrid: the fallback never answered while the primary was dead: {:?}",
        store.stats()
    );
    let back = first_ok_after(samples, promoted, Some(Source::Primary))
        .expect("hybrid: the primary never answered again after the promotion");
    assert_eq!(store.breaker_state(), BreakerState::Closed);
    back.saturating_duration_since(promoted)
}

/// Decisions go on after the restart: the fresh identity `id` admits exactly its budget, and
/// the hybrid decides on its primary.
async fn check_after_restart(
    store: &RedisStore,
    hybrid: &Hybrid<RedisStore, MemoryStore>,
    id: &str,
) {
    let mut allowed = 0;
    for _ in 0..25 {
        match store.check(id, daily(20)).await {
            Ok(d) => allowed += u64::from(d.is_allowed()),
            Err(e) => panic!("{id}: a decision failed: {e:?}"),
        }
    }
    assert_eq!(allowed, 20, "{id}");
    let d = hybrid.check(id, daily(20)).await.unwrap();
    assert_eq!(d.source(), Source::Primary, "{id}: the hybrid");
}

/// The load's part after the kill, once the promotion is known: waits until both stores answer
/// from the new primary (bounded), keeps the loads on for a second, stops them, and checks
/// them; per identity, the units admitted and the ambiguous decisions ([`tally`]).
async fn after_promotion(
    what: &str,
    store: &RedisStore,
    hybrid_store: &Hybrid<RedisStore, MemoryStore>,
    ids: &[String],
    (load, hybrid_load): (Load, Load),
    crash: Crash,
) -> (Vec<u64>, Vec<u64>) {
    let Crash {
        killing,
        killed,
        promoted,
        ..
    } = crash;
    // Both loads run on; look at what they saw so far every 100 ms, through a probe of our own.
    let deadline = promoted + RECOVERY_BOUND + Duration::from_secs(2);
    let mut probe_ok = None;
    while Instant::now() < deadline {
        if store.peek(&ids[0], daily(L)).await.is_ok()
            && hybrid_store
                .check("probe", daily(1_000_000))
                .await
                .is_ok_and(|d| d.source() == Source::Primary)
        {
            probe_ok = Some(promoted.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let samples = load.stop().await;
    let hybrid_samples = hybrid_load.stop().await;

    let phase = |s: &[Sample], from: Option<Instant>, to: Option<Instant>| {
        let picked: Vec<&Sample> = s
            .iter()
            .filter(|x| from.is_none_or(|f| x.started >= f) && to.is_none_or(|t| x.started < t))
            .collect();
        summary(&picked)
    };
    eprintln!(
        "{what}: killed in {:.1?}, promoted {:.1?} after the kill",
        killed - killing,
        promoted - killed
    );
    eprintln!(
        "{what}: store, before: {}",
        phase(&samples, None, Some(killing))
    );
    eprintln!(
        "{what}: store, primary dead: {}",
        phase(&samples, Some(killing), Some(promoted))
    );
    eprintln!(
        "{what}: store, after: {}",
        phase(&samples, Some(promoted), None)
    );
    eprintln!(
        "{what}: hybrid, primary dead: {}",
        phase(&hybrid_samples, Some(killing), Some(promoted))
    );
    let recovery =
        first_ok_after(&samples, promoted, None).map(|t| t.saturating_duration_since(promoted));
    eprintln!(
        "{what}: store answered again {recovery:?} after the promotion (probe: {probe_ok:?})"
    );

    check_errors(what, &samples, killing);
    let recovery = recovery.unwrap_or_else(|| panic!("{what}: the store never answered again"));
    assert!(
        recovery <= RECOVERY_BOUND,
        "{what}: the store answered again only {recovery:?} after the promotion"
    );
    assert!(
        samples
            .iter()
            .any(|s| s.task == 0 && s.started > promoted && s.outcome.ok()),
        "{what}: task 0 never decided after the promotion"
    );
    let hybrid_back = check_hybrid(&hybrid_samples, hybrid_store, killed, promoted);
    eprintln!(
        "{what}: hybrid back on the primary {hybrid_back:.1?} after the promotion; {:?}",
        hybrid_store.stats()
    );

    tally(&samples, crash)
}

/// After the restart of the killed process: spends what is left of every identity and checks
/// the budgets ([`check_budget`]), then checks that decisions go on ([`check_after_restart`]).
async fn after_restart(
    what: &str,
    store: &RedisStore,
    hybrid_store: &Hybrid<RedisStore, MemoryStore>,
    ids: &[String],
    (during, ambiguous): (Vec<u64>, Vec<u64>),
) {
    let drained = drain(store, ids).await;
    let twice = check_budget(what, &during, &ambiguous, &drained);
    eprintln!(
        "{what}: {twice} units admitted beyond the budgets of {IDS} identities ({} admitted \
         under load, {} after, {} decisions of unknown outcome that may have run)",
        during.iter().sum::<u64>(),
        drained.iter().sum::<u64>(),
        ambiguous.iter().sum::<u64>()
    );
    check_after_restart(store, hybrid_store, "after-restart").await;
}

// ---------------------------------------------------------------------------------------------
// The tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_primary_sigkill_under_load_is_followed() {
    let _serial = SERIAL.lock().await;
    let Some(bin) = server_bin_or_skip() else {
        return;
    };
    let begun = Instant::now();
    let mut set = blocking(|| Sentinel::start(&bin)).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("sentinel: {} up in {:.1?}", set.describe(), begun.elapsed());
    let sentinels: Vec<String> = set.sentinels().iter().map(RedisServer::url).collect();
    let old = set.primary().addr();
    let new = set.replica().addr();

    let store = connect(
        RedisStore::sentinel(sentinels.clone(), SERVICE),
        "crash-sentinel",
    )
    .await;
    let hybrid_store = hybrid(
        connect(
            RedisStore::sentinel(sentinels, SERVICE),
            "crash-sentinel-hybrid",
        )
        .await,
    );
    let ids: Arc<Vec<String>> = Arc::new((0..IDS).map(|i| format!("crash-{i}")).collect());
    let load = Load::start(Arc::new(store.clone()), ids.clone(), daily(L), TASKS);
    let hybrid_load = Load::start(hybrid_store.clone(), ids.clone(), daily(L), HYBRID_TASKS);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let killing = Instant::now();
    blocking(|| set.primary_mut().kill());
    let killed = Instant::now();
    // Promoted: the sentinels name the replica, and it says it is a primary.
    let sentinel = &set.sentinels()[0];
    let replica = set.replica();
    let crash = wait_for_promotion(killing, killed, || {
        let named: Result<Vec<String>, String> = sentinel.query(
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(SERVICE),
        );
        named.is_ok_and(|n| n.join(":") == new) && replica.role().is_ok_and(|r| r == "master")
    })
    .await;
    let Some(crash) = crash else {
        let samples = load.stop().await;
        let _ = hybrid_load.stop().await;
        let picked: Vec<&Sample> = samples.iter().collect();
        panic!(
            "the sentinels did not promote {new} within {PROMOTION_BOUND:?} of killing {old}; \
             the load saw {}",
            summary(&picked)
        );
    };
    let loads = (load, hybrid_load);
    let tallies = after_promotion("sentinel", &store, &hybrid_store, &ids, loads, crash).await;

    // The killed process comes back on its port, a primary with no data until the sentinels
    // make it a replica: Sentinel waits 8 s for that (`SENTINEL_PUBLISH_PERIOD * 4`, fixed),
    // so the rest of the test runs in that window, when a store writing there would over-admit.
    blocking(|| set.primary_mut().restart()).unwrap_or_else(|e| panic!("restart: {e}"));
    let restarted = Instant::now();
    after_restart("sentinel", &store, &hybrid_store, &ids, tallies).await;
    // Still an empty primary (the sentinels wait 8 s): nothing was written there.
    let (role, keys) = blocking(|| {
        let server = set.primary();
        (server.role(), server.command(&["DBSIZE"]))
    });
    eprintln!(
        "sentinel: the checks after the restart took {:.1?}; the restarted process was then a \
         {role:?} holding {keys:?} keys",
        restarted.elapsed()
    );
    if role.as_deref() == Ok("master") {
        assert_eq!(
            keys.as_deref(),
            Ok("0"),
            "the store wrote to the restarted {old}"
        );
    }
    let server = set.primary();
    let rejoined = wait_for(Duration::from_secs(15), || synced_replica(server)).await;
    eprintln!(
        "sentinel: {old} restarted, a synced replica {:.1?} after the restart",
        restarted.elapsed()
    );
    assert!(rejoined.is_some(), "{old} did not come back as a replica");
    check_after_restart(&store, &hybrid_store, "after-rejoin").await;
    eprintln!("sentinel: the whole test took {:.1?}", begun.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_primary_sigkill_under_load_is_followed() {
    let _serial = SERIAL.lock().await;
    let Some(bin) = server_bin_or_skip() else {
        return;
    };
    let begun = Instant::now();
    let mut cluster = blocking(|| Cluster::start(&bin)).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "cluster: {} up in {:.1?}",
        cluster.describe(),
        begun.elapsed()
    );
    let urls: Vec<String> = cluster.nodes().iter().map(RedisServer::url).collect();

    let store = connect(RedisStore::cluster(urls.clone()), "crash-cluster").await;
    let hybrid_store = hybrid(connect(RedisStore::cluster(urls), "crash-cluster-hybrid").await);
    // Identities whose slot the same primary serves (the slot follows the identity alone, so
    // both stores' keys land there).
    let slot_of = |id: &str| hash_slot(&store.redis_key("", Key::new(id).unwrap()));
    let mut shard = None;
    let shard_known = wait_for(Duration::from_secs(5), || {
        shard = Some(cluster.shard_of(slot_of("crash-0")));
        matches!(&shard, Some(Ok((_, replicas))) if replicas.len() == 1)
    })
    .await;
    let Some(Ok((victim, replicas))) = shard else {
        panic!("no view of the Cluster: {shard:?}")
    };
    let [replica] = replicas[..] else {
        let nodes = blocking(|| cluster.nodes()[0].command(&["CLUSTER", "NODES"]));
        panic!(
            "the primary serving the test keys has replicas {replicas:?} ({shard_known:?}):\n{nodes:?}"
        )
    };
    let mut ids = Vec::new();
    for i in 0..100_000 {
        let id = format!("crash-{i}");
        if ids.len() < IDS && blocking(|| cluster.shard_of(slot_of(&id))).unwrap().0 == victim {
            ids.push(id);
        }
        if ids.len() == IDS {
            break;
        }
    }
    assert_eq!(ids.len(), IDS);
    let ids = Arc::new(ids);
    let old = cluster.nodes()[victim].addr();
    let new = cluster.nodes()[replica].addr();

    let load = Load::start(Arc::new(store.clone()), ids.clone(), daily(L), TASKS);
    let hybrid_load = Load::start(hybrid_store.clone(), ids.clone(), daily(L), HYBRID_TASKS);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let killing = Instant::now();
    blocking(|| cluster.nodes_mut()[victim].kill());
    let killed = Instant::now();
    // Promoted: the replica says it is a primary and serves the slot.
    let slot = slot_of(&ids[0]);
    let crash = wait_for_promotion(killing, killed, || {
        cluster.nodes()[replica].role().is_ok_and(|r| r == "master")
            && cluster.shard_of(slot).is_ok_and(|(p, _)| p == replica)
    })
    .await;
    let Some(crash) = crash else {
        let samples = load.stop().await;
        let _ = hybrid_load.stop().await;
        let picked: Vec<&Sample> = samples.iter().collect();
        panic!(
            "{new} was not promoted within {PROMOTION_BOUND:?} of killing {old}; the load saw {}",
            summary(&picked)
        );
    };
    let loads = (load, hybrid_load);
    let tallies = after_promotion("cluster", &store, &hybrid_store, &ids, loads, crash).await;

    // The killed node comes back with its node id, as a replica of the node that replaced it.
    blocking(|| cluster.nodes_mut()[victim].restart()).unwrap_or_else(|e| panic!("restart: {e}"));
    let restarted = Instant::now();
    after_restart("cluster", &store, &hybrid_store, &ids, tallies).await;
    let server = &cluster.nodes()[victim];
    let rejoined = wait_for(Duration::from_secs(15), || synced_replica(server)).await;
    eprintln!(
        "cluster: {old} restarted, a synced replica {:.1?} after the restart",
        restarted.elapsed()
    );
    assert!(rejoined.is_some(), "{old} did not come back as a replica");
    check_after_restart(&store, &hybrid_store, "after-rejoin").await;
    eprintln!("cluster: the whole test took {:.1?}", begun.elapsed());
}
