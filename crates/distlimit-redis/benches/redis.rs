//! `RedisStore` throughput and latency, a raw `EVALSHA` round trip and the script's own cost
//! inside Redis, in one run against one private `redis-server`.
//!
//! Run with `cargo bench -p distlimit-redis --bench redis` (or `cargo xtask bench`). It starts
//! `redis-server` (from `DISTLIMIT_REDIS_SERVER_BIN`, else `PATH`) with the workspace's harness
//! (`distlimit_test::server`: a free loopback port, no persistence, killed by its PID at the end,
//! also when the bench panics). Everything runs on one current-thread tokio runtime, so the
//! client uses one core and the server another.
//!
//! * Quota: 100 per second on random keys out of [`KEY_SPACE`] (12-digit identities), so nearly
//!   every decision is admitted and writes its state (`SET … PXAT`): the expensive path.
//! * `ours`: `RedisStore::decide` (default key layout, server time) from 1, 64 and 256 tokio tasks
//!   each looping decisions, over the default multiplexed connection (`ConnectionManager`) with
//!   coalescing off and on (the default), side by side, and over the pool mode with as many
//!   connections as there are tasks (its rows show the `PING`s the pool sent per decision, from
//!   `INFO commandstats`: 0 since the pool's manager does not ping). Each run stops after a fixed
//!   number of decisions or [`RUN_LIMIT`], whichever comes first.
//! * No `redis-benchmark` ceiling: the script's one argument is a string of doubles holding zero
//!   bytes, and `redis-benchmark` cuts every argument at its first zero byte. `Redis main thread
//!   CPU` near 100% shows where Redis itself is the bottleneck.
//! * `raw`: the redis crate's `ConnectionManager` (configured as the store's) sending `EVALSHA`
//!   of `return 1` with the same key and arguments at 1 in flight; and the same with the real
//!   GCRA script, which separates the driver's own overhead from the script's; and `return 1`
//!   on a plain `MultiplexedConnection`, the transport without the manager. These and the
//!   store's 1-in-flight runs on the multiplexed connection are measured in interleaved rounds,
//!   so that the load of a shared machine drifts over all of them alike.
//! * `Redis main thread CPU`: `INFO cpu` (`used_cpu_*_main_thread`) over each run: near 100% means
//!   Redis itself is the bottleneck, the true ceiling.
//! * `inside Redis`: `CONFIG RESETSTAT`, [`STAT_DECISIONS`] decisions per algorithm, then
//!   `INFO commandstats`' `cmdstat_evalsha`: `usec_per_call` with one script per decision
//!   (coalescing off, 64 in flight), and `usec` over decisions in coalesced calls as full as
//!   they get (one call in flight, 256 tasks); next to them the floor, a Lua loop doing only a
//!   `GET` and a `SET … PXAT` per key.
//! * `Cluster`: a 6-node Cluster of the same harness, GCRA at 256 in flight, coalescing per hash
//!   slot off and on: on random identities (nearly every decision in a slot of its own) and on
//!   one hot identity (one slot).
//! * `durable`: durable decisions (`RedisStoreBuilder::durable(1, …)`, a `WAIT 1` after each
//!   script call) off and on, GCRA at 1 and 256 in flight on the default coalesced connection,
//!   with a replica (a second harness server) attached for both, in interleaved rounds. Only
//!   this part: `cargo bench -p distlimit-redis --bench redis -- durable`.

// A benchmark binary: it prints its table, and setup that cannot fail in practice aborts loudly.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::cell::Cell;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::rc::Rc;
use std::time::{Duration, Instant};

use distlimit_core::{Algorithm, Key, Limit, Quota, Request, Store};
use distlimit_redis::RedisStore;
use distlimit_redis::test_hook as script;
use distlimit_test::server::{self, RedisServer};
use redis::aio::{ConnectionLike, ConnectionManager};

/// Distinct identities the decisions pick from at random.
const KEY_SPACE: u64 = 100_000;
/// Decisions per measured run with 1 in flight.
const DECISIONS_SERIAL: usize = 20_000;
/// Decisions per measured run with 16 or more in flight.
const DECISIONS_PARALLEL: usize = 100_000;
/// Decisions per algorithm for `INFO commandstats`.
const STAT_DECISIONS: usize = 100_000;
/// Decisions sent before each measured run (connections warm, pool filled).
const WARMUP: usize = 2_000;
/// The most one measured run may take.
const RUN_LIMIT: Duration = Duration::from_secs(8);
/// Requests in flight.
const IN_FLIGHT: [usize; 3] = [1, 64, 256];
/// The `conn` of the store rows on one multiplexed connection, without and with coalescing.
const UNCOALESCED: &str = "multiplexed, uncoalesced";
const COALESCED: &str = "multiplexed, coalesced";
/// The algorithms measured for throughput and latency.
const MAIN: [Algorithm; 2] = [Algorithm::TokenBucket, Algorithm::Gcra];

fn main() {
    // `cargo bench` passes `--bench`; any other argument is a filter-free no-op here.
    let server = RedisServer::start()
        .expect("no redis-server: set DISTLIMIT_REDIS_SERVER_BIN or put it on PATH");
    let url = server.url();
    let quota = Quota::per_second(100).unwrap();
    println!(
        "redis-server {} on {}",
        server_version(server.bin()),
        server.name()
    );
    println!("load before: {}", uptime());

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // `-- durable`: only the durable decisions' comparison.
    if std::env::args().skip(1).any(|a| a == "durable") {
        print_durable(&rt.block_on(durable_comparison(&server)));
        return;
    }
    let mut rows: Vec<Row> = Vec::new();

    rt.block_on(async {
        let multiplexed = RedisStore::builder(&url)
            .response_timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let uncoalesced = RedisStore::builder(&url)
            .coalesce(false)
            .response_timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut admin = client.get_multiplexed_async_connection().await.unwrap();
        rows.extend(serial_comparison(&url, &multiplexed, &uncoalesced, quota).await);
        for algorithm in MAIN {
            let limit = Limit::new(algorithm, quota);
            for &n in &IN_FLIGHT {
                let count = if n == 1 {
                    DECISIONS_SERIAL
                } else {
                    DECISIONS_PARALLEL
                };
                if n > 1 {
                    // Side by side: one multiplexed connection without and with coalescing.
                    let pair = [(&uncoalesced, UNCOALESCED), (&multiplexed, COALESCED)];
                    rows.extend(interleaved(&pair, &mut admin, limit, n, count).await);
                }
                let pooled = RedisStore::builder(&url)
                    .pool(n)
                    .response_timeout(Duration::from_secs(2))
                    .connect()
                    .await
                    .unwrap();
                let pings_before = command_calls(&mut admin, "cmdstat_ping").await;
                let cpu = Cpu::sample(&mut admin).await;
                let mut row = run_store(&pooled, &format!("pool({n})"), limit, n, count).await;
                row.redis_cpu = cpu.busy(&mut admin).await;
                let pings = command_calls(&mut admin, "cmdstat_ping").await - pings_before;
                row.conn = format!(
                    "{}, {:.2} PING/decision",
                    row.conn,
                    pings / (row.decisions + row.errors + WARMUP) as f64
                );
                rows.push(row);
                drop(pooled);
            }
        }
    });

    // The scripts' cost inside Redis, every algorithm: one script per decision (uncoalesced,
    // 64 in flight), and coalesced calls as full as they get (one call in flight, 256 callers).
    let stats: (Vec<Stat>, f64) = rt.block_on(async {
        let uncoalesced = RedisStore::builder(&url)
            .coalesce(false)
            .response_timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let full = RedisStore::builder(&url)
            .coalesce_in_flight(1)
            .response_timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut admin = client.get_multiplexed_async_connection().await.unwrap();
        let mut out = Vec::new();
        for algorithm in Algorithm::ALL {
            let limit = Limit::new(algorithm, quota);
            let mut stat = Stat {
                algorithm,
                single_usec: f64::INFINITY,
                coalesced_usec: f64::INFINITY,
                per_call: f64::NAN,
            };
            // Interleaved rounds; the least disturbed round of each counts (Redis' time per
            // call is wall time, which a loaded machine stretches by preempting Redis).
            for _ in 0..ROUNDS {
                for (store, in_flight) in [(&uncoalesced, 64), (&full, 256)] {
                    let _: () = redis::cmd("CONFIG")
                        .arg("RESETSTAT")
                        .query_async(&mut admin)
                        .await
                        .unwrap();
                    let (l, e, _) =
                        measure_store(store, limit, in_flight, STAT_DECISIONS / ROUNDS, 3).await;
                    let info: String = redis::cmd("INFO")
                        .arg("commandstats")
                        .query_async(&mut admin)
                        .await
                        .unwrap();
                    let (calls, usec) = usec_per_call(&info, "cmdstat_evalsha");
                    let decisions = (l.len() + e) as f64;
                    if in_flight == 64 {
                        stat.single_usec = stat.single_usec.min(usec);
                    } else if usec * calls / decisions < stat.coalesced_usec {
                        stat.coalesced_usec = usec * calls / decisions;
                        stat.per_call = decisions / calls;
                    }
                }
            }
            out.push(stat);
        }
        let floor = floor_usec(&mut admin).await;
        (out, floor)
    });
    let (stats, floor) = stats;
    // A Cluster: coalescing per hash slot against none, on random identities (distinct slots:
    // nothing to coalesce) and on one hot identity (one slot).
    let cluster = server::Cluster::start(server.bin()).expect("no Redis Cluster");
    let cluster_rows: Vec<Row> = rt.block_on(async {
        let urls: Vec<String> = cluster.urls().split(',').map(str::to_owned).collect();
        let connect = |coalesce: bool| {
            RedisStore::cluster(urls.clone())
                .coalesce(coalesce)
                .response_timeout(Duration::from_secs(2))
                .connect()
        };
        let on = connect(true).await.unwrap();
        let off = connect(false).await.unwrap();
        let mut rows = Vec::new();
        for (keys, what) in [
            (KEY_SPACE, "cluster, random identities"),
            (1, "cluster, one identity"),
        ] {
            // One identity: a quota it never exhausts, so every decision writes as elsewhere.
            let limit = if keys == 1 {
                Limit::gcra(Quota::per_second(1_000_000_000).unwrap())
            } else {
                Limit::gcra(quota)
            };
            let mut pair = Vec::new();
            for (store, conn) in [(&off, "uncoalesced"), (&on, "coalesced")] {
                let (l, e, d) = measure_keys(store, limit, 256, DECISIONS_PARALLEL, keys).await;
                pair.push(summarize("ours", what, conn, 256, l, e, d));
            }
            rows.extend(pair);
        }
        rows
    });
    drop(cluster);
    println!("load after: {}", uptime());
    print_tables(&rows, &stats, &raw_row(&rows));
    println!();
    println!("| Cluster, GCRA, 256 in flight | client | decisions/s | p50 µs | p99 µs |");
    println!("|---|---|---:|---:|---:|");
    for r in &cluster_rows {
        println!(
            "| {} | {}{} | {:.0} | {:.1} | {:.1} |",
            r.algorithm,
            r.conn,
            if r.errors > 0 {
                format!(" ({} errors)", r.errors)
            } else {
                String::new()
            },
            r.per_sec,
            r.p50_us,
            r.p99_us
        );
    }
    println!(
        "- the floor of a decision inside Redis: {floor:.2} µs for a bare GET and SET … PXAT of one key \
         from Lua, {FLOOR_KEYS} keys per call (what any script that reads and writes a key pays)"
    );
    println!();
    print_durable(&rt.block_on(durable_comparison(&server)));
}

/// `WAIT`'s timeout in the durable rows (never reached on loopback).
const DURABLE_WAIT: Duration = Duration::from_millis(100);

/// Durable decisions off and on, side by side (interleaved rounds), GCRA on the default
/// coalesced multiplexed connection at 1 and 256 in flight, with one replica (a second
/// `redis-server` of the harness) attached to `server` for both.
async fn durable_comparison(server: &RedisServer) -> Vec<Row> {
    let replica = RedisServer::start().expect("a second redis-server for the replica");
    let port = server.port().to_string();
    replica.command(&["REPLICAOF", "127.0.0.1", &port]).unwrap();
    let synced = Instant::now();
    // Online on the primary: after a diskless sync only at the replica's first ACK.
    while !server.info("replication").unwrap().contains("state=online") {
        assert!(
            synced.elapsed() < Duration::from_secs(10),
            "the replica did not sync"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let url = server.url();
    let off = RedisStore::builder(&url)
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let on = RedisStore::builder(&url)
        .response_timeout(Duration::from_secs(2))
        .durable(1, DURABLE_WAIT)
        .connect()
        .await
        .unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    let limit = Limit::gcra(Quota::per_second(100).unwrap());
    let pair = [(&off, "durable off"), (&on, "durable on (WAIT 1)")];
    let mut rows = interleaved(&pair, &mut admin, limit, 1, DECISIONS_SERIAL).await;
    rows.extend(interleaved(&pair, &mut admin, limit, 256, DECISIONS_PARALLEL).await);
    drop(replica);
    rows
}

/// The durable comparison's table: per in-flight count, off and on and their ratio.
fn print_durable(rows: &[Row]) {
    println!(
        "| GCRA, one replica, coalesced | in flight | decisions/s | p50 µs | p99 µs | Redis CPU % |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {}{} | {} | {:.0} | {:.1} | {:.1} | {:.0} |",
            r.conn,
            if r.errors > 0 {
                format!(" ({} errors)", r.errors)
            } else {
                String::new()
            },
            r.in_flight,
            r.per_sec,
            r.p50_us,
            r.p99_us,
            r.redis_cpu
        );
    }
    for n in [1, 256] {
        let pick = |on: bool| {
            rows.iter()
                .find(|r| r.in_flight == n && r.conn.starts_with("durable on") == on)
        };
        if let (Some(off), Some(on)) = (pick(false), pick(true)) {
            println!(
                "- {n} in flight, durable on / off: p50 {:.2}x, decisions/s {:.2}x",
                on.p50_us / off.p50_us,
                on.per_sec / off.per_sec
            );
        }
    }
}

/// Keys per call of the floor measurement (about a full coalesced call).
const FLOOR_KEYS: usize = 128;

/// µs inside Redis per key of a Lua loop that only reads and writes each of [`FLOOR_KEYS`] random
/// keys (`GET`, `SET … PXAT` of a 25-byte value 10 ms ahead), passed as `KEYS` like the decisions':
/// the cost of Redis' own commands, which no script can go below.
async fn floor_usec(admin: &mut redis::aio::MultiplexedConnection) -> f64 {
    const CALLS: usize = 800;
    let script = "local t = redis.call('TIME') \
        local at = string.format('%d', t[1] * 1000 + math.ceil(t[2] / 1000) + 10) \
        for j = 1, #KEYS do redis.call('GET', KEYS[j]) \
        redis.call('SET', KEYS[j], 'abcdefghijklmnopqrstuvwxy', 'PXAT', at) end return 1";
    let sha = load(admin, script).await;
    let rng = Cell::new(0x0123_4567_89AB_CDEF);
    let mut least = f64::INFINITY;
    for _ in 0..ROUNDS {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(admin)
            .await
            .unwrap();
        for _ in 0..CALLS / ROUNDS {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&sha).arg(FLOOR_KEYS);
            for _ in 0..FLOOR_KEYS {
                cmd.arg(format!("floor:{{{:012}}}:", next(&rng) % KEY_SPACE));
            }
            let _: redis::Value = cmd.query_async(admin).await.unwrap();
        }
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(admin)
            .await
            .unwrap();
        least = least.min(usec_per_call(&info, "cmdstat_evalsha").1 / FLOOR_KEYS as f64);
    }
    least
}

/// Time inside Redis per decision, from `INFO commandstats`.
struct Stat {
    algorithm: Algorithm,
    /// `usec_per_call` of one script per decision (the least of [`ROUNDS`] interleaved runs).
    single_usec: f64,
    /// µs inside Redis per decision in coalesced calls (`usec` of all calls / decisions).
    coalesced_usec: f64,
    /// Decisions per coalesced call.
    per_call: f64,
}

/// One measured configuration.
#[derive(Clone, Debug)]
struct Row {
    /// `ours`, `ceiling` or `raw`.
    what: &'static str,
    /// The script or algorithm.
    algorithm: String,
    /// Connection type.
    conn: String,
    in_flight: usize,
    decisions: usize,
    errors: usize,
    per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    /// How busy Redis' main thread was during the run, in % of one core (NaN: not measured).
    redis_cpu: f64,
}

/// Redis' main-thread CPU time at an instant.
struct Cpu {
    seconds: f64,
    at: Instant,
}

impl Cpu {
    async fn sample(admin: &mut redis::aio::MultiplexedConnection) -> Cpu {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(admin)
            .await
            .unwrap();
        let field = |name: &str| -> f64 {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .map_or(f64::NAN, |v| v.trim().parse().unwrap_or(f64::NAN))
        };
        Cpu {
            seconds: field("used_cpu_user_main_thread") + field("used_cpu_sys_main_thread"),
            at: Instant::now(),
        }
    }

    /// The main thread's CPU use since `self`, in % of one core.
    async fn busy(self, admin: &mut redis::aio::MultiplexedConnection) -> f64 {
        let now = Cpu::sample(admin).await;
        100.0 * (now.seconds - self.seconds) / (now.at - self.at).as_secs_f64()
    }
}

fn raw_row(rows: &[Row]) -> Row {
    rows.iter()
        .find(|r| r.what == "raw" && r.algorithm == "return 1" && r.conn == "ConnectionManager")
        .cloned()
        .unwrap()
}

/// A tiny xorshift, one per task: no locking, no dependency.
fn next(state: &Cell<u64>) -> u64 {
    let mut x = state.get();
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    state.set(x);
    x
}

/// Runs `count` decisions (after [`WARMUP`]) from `in_flight` tasks on random keys.
async fn run_store(
    store: &RedisStore,
    conn: &str,
    limit: Limit,
    in_flight: usize,
    count: usize,
) -> Row {
    measure_store(store, limit, in_flight, WARMUP, 0).await;
    let (latencies, errors, elapsed) = measure_store(store, limit, in_flight, count, 1).await;
    summarize(
        "ours",
        limit.algorithm().name(),
        conn,
        in_flight,
        latencies,
        errors,
        elapsed,
    )
}

/// Rounds for [`interleaved`] and the inside-Redis measurements.
const ROUNDS: usize = 5;

/// `count` decisions from `in_flight` tasks on each store, measured in [`ROUNDS`] interleaved
/// rounds (each round starting with another store), so that the load of a shared machine drifts
/// over all of them alike; Redis' main-thread CPU over each store's runs.
async fn interleaved(
    stores: &[(&RedisStore, &str)],
    admin: &mut redis::aio::MultiplexedConnection,
    limit: Limit,
    in_flight: usize,
    count: usize,
) -> Vec<Row> {
    let mut results: Vec<(Vec<u64>, usize, Duration, f64)> = stores
        .iter()
        .map(|_| (Vec::new(), 0, Duration::ZERO, 0.0))
        .collect();
    for (store, _) in stores {
        measure_store(store, limit, in_flight, WARMUP, 0).await;
    }
    for round in 0..ROUNDS {
        for i in 0..stores.len() {
            let i = (i + round) % stores.len();
            let cpu = Cpu::sample(admin).await;
            let (l, e, d) = measure_store(
                stores[i].0,
                limit,
                in_flight,
                count / ROUNDS,
                round as u64 + 1,
            )
            .await;
            let busy = cpu.busy(admin).await;
            let r = &mut results[i];
            r.0.extend(l);
            r.1 += e;
            r.2 += d;
            r.3 += busy * d.as_secs_f64();
        }
    }
    stores
        .iter()
        .zip(results)
        .map(|((_, conn), (l, e, d, busy))| {
            let mut row = summarize("ours", limit.algorithm().name(), conn, in_flight, l, e, d);
            row.redis_cpu = busy / d.as_secs_f64();
            row
        })
        .collect()
}

/// `count` decisions from `in_flight` tasks on random keys (seeded by `seed`): the latencies of
/// the successful ones in ns, the number of errors, and the wall time.
async fn measure_store(
    store: &RedisStore,
    limit: Limit,
    in_flight: usize,
    count: usize,
    seed: u64,
) -> (Vec<u64>, usize, Duration) {
    let local = tokio::task::LocalSet::new();
    let remaining = Rc::new(Cell::new(count));
    let deadline = Instant::now() + RUN_LIMIT;
    let start = Instant::now();
    let mut handles = Vec::new();
    for task in 0..in_flight {
        let store = store.clone();
        let remaining = Rc::clone(&remaining);
        handles.push(local.spawn_local(async move {
            let rng =
                Cell::new(0x9E37_79B9_7F4A_7C15 ^ ((task as u64 + 1) * 0x1234_5678_9ABC) ^ seed);
            let mut latencies = Vec::with_capacity(count / in_flight + 1);
            let mut errors = 0;
            let mut id = String::with_capacity(12);
            while remaining.get() > 0 && Instant::now() < deadline {
                remaining.set(remaining.get() - 1);
                id.clear();
                write!(id, "{:012}", next(&rng) % KEY_SPACE).unwrap();
                let t = Instant::now();
                let request = Request::new(Key::new(&id).unwrap(), limit);
                match store.decide(&request).await {
                    Ok(_) => latencies.push(t.elapsed().as_nanos() as u64),
                    Err(_) => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    let mut latencies = Vec::with_capacity(count);
    let mut errors = 0;
    local
        .run_until(async {
            for h in handles {
                let (l, e) = h.await.unwrap();
                latencies.extend(l);
                errors += e;
            }
        })
        .await;
    (latencies, errors, start.elapsed())
}

/// `count` decisions from `in_flight` tasks on random identities out of `keys` (one: a hot
/// key), after [`WARMUP`].
async fn measure_keys(
    store: &RedisStore,
    limit: Limit,
    in_flight: usize,
    count: usize,
    keys: u64,
) -> (Vec<u64>, usize, Duration) {
    let local = tokio::task::LocalSet::new();
    let remaining = Rc::new(Cell::new(count + WARMUP));
    let deadline = Instant::now() + RUN_LIMIT;
    let start = Rc::new(Cell::new(Instant::now()));
    let mut handles = Vec::new();
    for task in 0..in_flight {
        let (store, remaining, start) = (store.clone(), Rc::clone(&remaining), Rc::clone(&start));
        handles.push(local.spawn_local(async move {
            let rng = Cell::new(0x9E37_79B9_7F4A_7C15 ^ ((task as u64 + 1) * 0x1234_5678_9ABC));
            let (mut latencies, mut errors) = (Vec::new(), 0);
            let mut id = String::with_capacity(12);
            while remaining.get() > 0 && Instant::now() < deadline {
                remaining.set(remaining.get() - 1);
                if remaining.get() == count {
                    start.set(Instant::now());
                }
                let measured = remaining.get() < count;
                id.clear();
                write!(id, "{:012}", next(&rng) % keys).unwrap();
                let t = Instant::now();
                let request = Request::new(Key::new(&id).unwrap(), limit);
                match store.decide(&request).await {
                    Ok(_) if measured => latencies.push(t.elapsed().as_nanos() as u64),
                    Ok(_) => {}
                    Err(_) => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    let (mut latencies, mut errors) = (Vec::new(), 0);
    local
        .run_until(async {
            for h in handles {
                let (l, e) = h.await.unwrap();
                latencies.extend(l);
                errors += e;
            }
        })
        .await;
    (latencies, errors, start.get().elapsed())
}

/// One series of the 1-in-flight comparison.
enum Serial {
    /// The store, coalescing or not.
    Ours(Algorithm, bool),
    Raw(Option<Algorithm>, String),
    /// `return 1` on a plain `MultiplexedConnection` (no `ConnectionManager` around it).
    RawPlain(String),
}

/// The 1-in-flight rows: distlimit on the multiplexed connection (token bucket, GCRA) and raw
/// `EVALSHA` (`return 1`, the GCRA script), measured in interleaved rounds so that the load of
/// a shared machine drifts over all of them alike.
async fn serial_comparison(
    url: &str,
    store: &RedisStore,
    uncoalesced: &RedisStore,
    quota: Quota,
) -> Vec<Row> {
    const ROUNDS: usize = 10;
    let client = redis::Client::open(url).unwrap();
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(None)
        .set_number_of_retries(0);
    let mut conn = ConnectionManager::new_with_config(client, config)
        .await
        .unwrap();
    let mut plain = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let series = [
        Serial::Raw(None, load(&mut conn, "return 1").await),
        Serial::RawPlain(load(&mut conn, "return 1").await),
        Serial::Ours(Algorithm::TokenBucket, true),
        Serial::Ours(Algorithm::TokenBucket, false),
        Serial::Ours(Algorithm::Gcra, true),
        Serial::Ours(Algorithm::Gcra, false),
        Serial::Raw(
            Some(Algorithm::Gcra),
            load(&mut conn, script::ENTRY_SCRIPT).await,
        ),
    ];
    let mut results: Vec<(Vec<u64>, usize, Duration)> = series
        .iter()
        .map(|_| (Vec::new(), 0, Duration::ZERO))
        .collect();
    let per_round = DECISIONS_SERIAL / ROUNDS;
    for round in 0..=ROUNDS {
        // Round 0 is the warm-up.
        let n = if round == 0 { WARMUP } else { per_round };
        // Each round starts with another series, so no series always runs first or last.
        for i in 0..series.len() {
            let i = (i + round) % series.len();
            let (s, result) = (&series[i], &mut results[i]);
            let (l, e, d) = match s {
                Serial::Ours(a, coalesced) => {
                    let store = if *coalesced { store } else { uncoalesced };
                    measure_store(store, Limit::new(*a, quota), 1, n, round as u64 + 7).await
                }
                Serial::Raw(a, sha) => {
                    let limit = Limit::new(a.unwrap_or(Algorithm::Gcra), quota);
                    measure_raw(&mut conn, sha, &limit, n, round as u64).await
                }
                Serial::RawPlain(sha) => {
                    let limit = Limit::new(Algorithm::Gcra, quota);
                    measure_raw(&mut plain, sha, &limit, n, round as u64).await
                }
            };
            if round > 0 {
                result.0.extend(l);
                result.1 += e;
                result.2 += d;
            }
        }
    }
    series
        .iter()
        .zip(results)
        .map(|(s, (l, e, d))| match s {
            Serial::Ours(a, coalesced) => summarize(
                "ours",
                a.name(),
                if *coalesced { COALESCED } else { UNCOALESCED },
                1,
                l,
                e,
                d,
            ),
            Serial::Raw(a, _) => summarize(
                "raw",
                a.map_or("return 1", |a| a.name()),
                "ConnectionManager",
                1,
                l,
                e,
                d,
            ),
            Serial::RawPlain(_) => {
                summarize("raw", "return 1", "plain MultiplexedConnection", 1, l, e, d)
            }
        })
        .collect()
}

fn summarize(
    what: &'static str,
    algorithm: &str,
    conn: &str,
    in_flight: usize,
    mut latencies: Vec<u64>,
    errors: usize,
    elapsed: Duration,
) -> Row {
    latencies.sort_unstable();
    let pct = |p: f64| {
        if latencies.is_empty() {
            f64::NAN
        } else {
            let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
            latencies[i] as f64 / 1000.0
        }
    };
    Row {
        what,
        algorithm: algorithm.to_owned(),
        conn: conn.to_owned(),
        in_flight,
        decisions: latencies.len(),
        errors,
        per_sec: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        redis_cpu: f64::NAN,
    }
}

/// The `ARGV[1]` the driver sends for one request of cost 1 under `limit` with server time
/// (`script.rs`, "Arguments"): one string of doubles.
fn driver_argv(limit: &Limit) -> Vec<u8> {
    script::single_argument(limit, 1, script::TimeSource::Server).unwrap()
}

/// `SCRIPT LOAD`s `source`, returning its SHA-1.
async fn load<C: ConnectionLike + Send>(conn: &mut C, source: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query_async(conn)
        .await
        .unwrap()
}

/// `count` `EVALSHA`s of `sha` at 1 in flight with the driver's key layout and `limit`'s
/// arguments, on random keys: the latencies in ns, no errors (any is a panic), the wall time.
async fn measure_raw<C: ConnectionLike + Send>(
    conn: &mut C,
    sha: &str,
    limit: &Limit,
    count: usize,
    seed: u64,
) -> (Vec<u64>, usize, Duration) {
    let argv = driver_argv(limit);
    let mut latencies = Vec::with_capacity(count);
    let start = Instant::now();
    let rng = Cell::new(0xDEAD_BEEF_CAFE_F00D ^ seed);
    let mut key = String::with_capacity(32);
    for _ in 0..count {
        if start.elapsed() > RUN_LIMIT {
            break;
        }
        key.clear();
        write!(key, "distlimit:{{{:012}}}:", next(&rng) % KEY_SPACE).unwrap();
        let t = Instant::now();
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(sha).arg(1).arg(key.as_bytes());
        cmd.arg(argv.as_slice());
        let _: redis::Value = cmd.query_async(conn).await.unwrap();
        latencies.push(t.elapsed().as_nanos() as u64);
    }
    (latencies, 0, start.elapsed())
}

/// The `calls` of `stat` in `INFO commandstats` (0 if it never ran).
async fn command_calls(admin: &mut redis::aio::MultiplexedConnection, stat: &str) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .unwrap();
    if info.lines().any(|l| l.starts_with(&format!("{stat}:"))) {
        usec_per_call(&info, stat).0
    } else {
        0.0
    }
}

/// `(calls, usec_per_call)` of `stat` in an `INFO commandstats` reply.
fn usec_per_call(info: &str, stat: &str) -> (f64, f64) {
    let line = info
        .lines()
        .find(|l| l.starts_with(&format!("{stat}:")))
        .unwrap_or_else(|| panic!("no {stat} in INFO commandstats:\n{info}"));
    let field = |name: &str| -> f64 {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .unwrap()
            .parse()
            .unwrap()
    };
    (field("calls"), field("usec_per_call"))
}

fn print_tables(rows: &[Row], stats: &[Stat], raw: &Row) {
    println!();
    println!(
        "| algorithm | in flight | client | decisions/s | p50 µs | p99 µs | Redis main thread CPU | p50 vs raw `return 1` |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    for r in rows {
        let vs_raw = if r.in_flight == 1 {
            format!("{:.3}", r.p50_us / raw.p50_us)
        } else {
            "—".to_owned()
        };
        let errors = if r.errors > 0 {
            format!(" ({} errors)", r.errors)
        } else {
            String::new()
        };
        let who = match r.what {
            "ours" => format!("distlimit, {}", r.conn),
            "raw" => format!("raw EVALSHA `{}`, {}", r.algorithm, r.conn),
            _ => r.conn.clone(),
        };
        println!(
            "| {} | {} | {}{} | {:.0} | {:.1} | {:.1} | {} | {} |",
            r.algorithm,
            r.in_flight,
            who,
            errors,
            r.per_sec,
            r.p50_us,
            r.p99_us,
            if r.redis_cpu.is_nan() {
                "—".to_owned()
            } else {
                format!("{:.0}%", r.redis_cpu)
            },
            vs_raw
        );
    }
    println!();
    println!(
        "| algorithm | µs inside Redis per decision, one script each | coalesced (1 call in flight, 256 callers) | decisions per coalesced call | single-core cap, one script each | coalesced |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for st in stats {
        println!(
            "| {} | {:.2} | {:.2} | {:.1} | {:.0}/s | {:.0}/s |",
            st.algorithm.name(),
            st.single_usec,
            st.coalesced_usec,
            st.per_call,
            1e6 / st.single_usec,
            1e6 / st.coalesced_usec
        );
    }
    println!();
    println!("Targets:");
    for algorithm in MAIN {
        let store = |conn: &str, in_flight: usize| {
            rows.iter()
                .find(|r| {
                    r.what == "ours"
                        && r.algorithm == algorithm.name()
                        && r.in_flight == in_flight
                        && r.conn == conn
                })
                .unwrap()
        };
        for n in [64, 256] {
            let ratio = store(COALESCED, n).per_sec / store(UNCOALESCED, n).per_sec;
            println!(
                "- {} {n} in flight: coalesced {:.0}/s = {ratio:.2} × uncoalesced {:.0}/s{}",
                algorithm.name(),
                store(COALESCED, n).per_sec,
                store(UNCOALESCED, n).per_sec,
                if n == 256 {
                    if ratio >= 2.0 {
                        ", target ≥ 2: met"
                    } else {
                        ", target ≥ 2: MISSED"
                    }
                } else {
                    ""
                }
            );
        }
        let ratio = store(COALESCED, 1).p50_us / store(UNCOALESCED, 1).p50_us;
        println!(
            "- {} 1 in flight: p50 coalesced {:.1} µs = {ratio:.3} × uncoalesced {:.1} µs, target ≤ 1.05: {}",
            algorithm.name(),
            store(COALESCED, 1).p50_us,
            store(UNCOALESCED, 1).p50_us,
            if ratio <= 1.05 { "met" } else { "MISSED" }
        );
        let stat = stats.iter().find(|s| s.algorithm == algorithm).unwrap();
        println!(
            "- {} inside Redis: {:.2} µs per decision in coalesced calls of {:.1} decisions, target ≤ 2: {}",
            algorithm.name(),
            stat.coalesced_usec,
            stat.per_call,
            if stat.coalesced_usec <= 2.0 {
                "met"
            } else {
                "MISSED"
            }
        );
        let ours = store(UNCOALESCED, 1);
        let ratio = ours.p50_us / raw.p50_us;
        println!(
            "- {} 1 in flight, uncoalesced: p50 {:.1} µs = {ratio:.3} × raw `return 1` EVALSHA ({:.1} µs), target ≤ 1.10: {}",
            algorithm.name(),
            ours.p50_us,
            raw.p50_us,
            if ratio <= 1.10 { "met" } else { "MISSED" }
        );
    }
    let same = |what: &str, conn: &str| {
        rows.iter()
            .find(|r| r.what == what && r.algorithm == "gcra" && r.in_flight == 1 && r.conn == conn)
            .map_or(f64::NAN, |r| r.p50_us)
    };
    println!(
        "- the driver's own overhead at 1 in flight: distlimit gcra p50 / raw EVALSHA of the same \
         script p50 = {:.3}",
        same("ours", UNCOALESCED) / same("raw", "ConnectionManager")
    );
}

fn server_version(bin: &Path) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn uptime() -> String {
    Command::new("uptime")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|_| "(uptime unavailable)".to_owned())
}
