//! The Lua scripts against the Rust reference model, on a real `redis-server`.
//!
//! The server is `DISTLIMIT_REDIS_URL` when set (the xtask sets it), else a `redis-server`
//! started here on a free loopback port (binary from `DISTLIMIT_REDIS_SERVER_BIN`, else `PATH`)
//! and killed when the test ends. Without a server the tests are skipped, unless
//! `DISTLIMIT_REQUIRE_REDIS=1`, where they fail. Every test case uses its own key prefix, so
//! tests may share one server.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlimit_core::algorithm::{FixedWindow, Gcra, SlidingLog, SlidingWindow, TokenBucket};
use distlimit_core::{Algorithm, Decision, Error, Limit, Quota, State};
use distlimit_redis::test_hook::{
    self as script, CLIENT_TTL_SLACK, ScriptRequest, TimeSource, decide, decide_all,
};
use distlimit_test::server::{self, RedisServer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, RedisFuture, Value};

// ---------------------------------------------------------------------------------------------
// The server.

/// A Redis server for one test: the shared one from `DISTLIMIT_REDIS_URL`, or one started here.
struct Server {
    url: String,
    /// The server started by this test, killed (by its PID) on drop.
    _own: Option<RedisServer>,
}

/// The server for a test, or `None` (skip) when there is none and none is required.
fn server() -> Option<Server> {
    if let Ok(url) = std::env::var(server::ENV_URL) {
        return Some(Server { url, _own: None });
    }
    let own = RedisServer::start()?;
    Some(Server {
        url: own.url(),
        _own: Some(own),
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn connect(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A key prefix no other test (nor another run on a shared server) uses.
fn prefix(test: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "distlimit-test:{test}:{}:{nanos}:{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn limit_of(algorithm: Algorithm, quota: Quota) -> Limit {
    Limit::new(algorithm, quota)
}

async fn query<T: redis::FromRedisValue>(conn: &mut MultiplexedConnection, cmd: &mut Cmd) -> T {
    cmd.query_async(conn).await.unwrap()
}

async fn get(conn: &mut MultiplexedConnection, key: &[u8]) -> Option<Vec<u8>> {
    query(conn, redis::cmd("GET").arg(key)).await
}

async fn pttl(conn: &mut MultiplexedConnection, key: &[u8]) -> i64 {
    query(conn, redis::cmd("PTTL").arg(key)).await
}

async fn exists(conn: &mut MultiplexedConnection, key: &[u8]) -> bool {
    query::<i64>(conn, redis::cmd("EXISTS").arg(key)).await == 1
}

// ---------------------------------------------------------------------------------------------
// 1. The differential property test.

/// How the shared clock moves before a step.
#[derive(Clone, Debug)]
enum Advance {
    /// Not at all (equal-time requests).
    Zero,
    /// A few microseconds.
    Micros(u64),
    /// `k / 16` of the period.
    Sixteenths(u64),
    /// To the last denial of one algorithm's key: its `retry_after` plus `delta` µs.
    ToRetry { which: usize, delta: i64 },
    /// Back by `k / 16` of the period (an NTP step, a skewed client).
    Back(u64),
    /// Back by a few microseconds.
    BackMicros(u64),
    /// Several periods forward (an idle key).
    Periods(u64),
}

/// A request's cost, relative to its limit's capacity.
#[derive(Clone, Debug)]
enum Cost {
    Peek,
    One,
    /// `max(1, capacity × k / 16)`.
    Sixteenths(u64),
    Capacity,
    /// `capacity + k`: can never pass.
    Above(u64),
    /// `u64::MAX`: can never pass, and must never reach Lua.
    Max,
}

impl Cost {
    fn units(&self, capacity: u64) -> u64 {
        match *self {
            Cost::Peek => 0,
            Cost::One => 1,
            Cost::Sixteenths(k) => (capacity * k / 16).max(1),
            Cost::Capacity => capacity,
            Cost::Above(k) => capacity + k,
            Cost::Max => u64::MAX,
        }
    }
}

#[derive(Clone, Debug)]
struct Step {
    advance: Advance,
    /// One cost per algorithm's own key.
    costs: Vec<Cost>,
    /// The algorithm used on the shared key this step.
    mixed: (usize, Cost),
    /// A batch over some of the batch keys (indices into the five), each with its cost.
    batch: Vec<(usize, Cost)>,
    /// Which of the two quotas the single and mixed keys use this step (the batch keys swap
    /// theirs with it): the quota changes between requests, and states carry over.
    quota: usize,
}

#[derive(Clone, Debug)]
struct Case {
    /// `quotas[step.quota]` for the single keys; the batch keys alternate between both.
    quotas: [Quota; 2],
    start: u64,
    steps: Vec<Step>,
}

fn quota_strategy() -> impl Strategy<Value = Quota> {
    let limit = prop_oneof![8 => 1..=50u64, 1 => 51..=5_000u64];
    let period = prop_oneof![
        2 => 1..=20u64,
        2 => 1..=2_000u64,
        4 => 1..=10_000_000u64,
        1 => Just(60_000_000u64),
        1 => Just(3_600_000_000u64),
        1 => Just(86_400_000_000u64),
        1 => 10_000_000..=400_000_000_000u64,
    ];
    let burst = prop_oneof![1..=10u64, 1..=100u64];
    (limit, period, burst, any::<bool>()).prop_filter_map(
        "a valid quota",
        |(limit, period, burst, default_burst)| {
            let burst = if default_burst { limit } else { burst };
            Quota::from_parts(limit, period, burst).ok()
        },
    )
}

fn advance_strategy() -> impl Strategy<Value = Advance> {
    prop_oneof![
        3 => Just(Advance::Zero),
        2 => (1..=3u64).prop_map(Advance::Micros),
        5 => (1..=40u64).prop_map(Advance::Sixteenths),
        4 => (0..5usize, -1..=1i64).prop_map(|(which, delta)| Advance::ToRetry { which, delta }),
        1 => (1..=20u64).prop_map(Advance::Back),
        1 => (1..=3u64).prop_map(Advance::BackMicros),
        1 => (2..=5u64).prop_map(Advance::Periods),
    ]
}

fn cost_strategy() -> impl Strategy<Value = Cost> {
    prop_oneof![
        2 => Just(Cost::Peek),
        6 => Just(Cost::One),
        3 => (1..=16u64).prop_map(Cost::Sixteenths),
        1 => Just(Cost::Capacity),
        1 => (1..=5u64).prop_map(Cost::Above),
        1 => Just(Cost::Max),
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    let batch = proptest::sample::subsequence((0..5usize).collect::<Vec<_>>(), 2..=4)
        .prop_flat_map(|which| {
            let n = which.len();
            (
                Just(which),
                proptest::collection::vec(cost_strategy(), n..=n),
            )
        })
        .prop_map(|(which, costs)| which.into_iter().zip(costs).collect());
    (
        advance_strategy(),
        proptest::collection::vec(cost_strategy(), 5..=5),
        (0..5usize, cost_strategy()),
        batch,
        prop_oneof![4 => Just(0usize), 1 => Just(1usize)],
    )
        .prop_map(|(advance, costs, mixed, batch, quota)| Step {
            advance,
            costs,
            mixed,
            batch,
            quota,
        })
}

fn case_strategy() -> impl Strategy<Value = Case> {
    let start = prop_oneof![
        1 => 0..1_000u64,
        4 => 1_600_000_000_000_000..1_900_000_000_000_000u64,
        // Close to 2^52 µs, the end of the exact range (leaving room for 60 steps forward).
        1 => (1u64 << 52) - 200_000_000_000_000..(1u64 << 52) - 150_000_000_000_000,
    ];
    (
        quota_strategy(),
        quota_strategy(),
        start,
        proptest::collection::vec(step_strategy(), 60..=60),
    )
        .prop_map(|(q0, q1, start, steps)| Case {
            quotas: [q0, q1],
            start,
            steps,
        })
}

/// The fields of a stored state value (see the encodings in `script`'s docs): the tag byte and
/// the doubles after it, each checked to be an integer.
fn fields(value: &[u8]) -> (u8, Vec<u64>) {
    assert!(
        !value.is_empty() && (value.len() - 1).is_multiple_of(8),
        "state {value:?}"
    );
    let numbers = value[1..]
        .chunks_exact(8)
        .map(|c| {
            let x = f64::from_be_bytes(c.try_into().unwrap());
            assert!(
                x >= 0.0 && x.fract() == 0.0 && x < 9_007_199_254_740_992.0,
                "{x}"
            );
            x as u64
        })
        .collect();
    (value[0], numbers)
}

/// The stamp a script writes after a state of `algorithm` written under `quota`: the
/// parameters it converts from (see the prelude).
fn stamp(algorithm: Algorithm, quota: &Quota) -> Vec<u64> {
    match algorithm {
        Algorithm::TokenBucket => {
            let (rate, unit) = quota.refill_units();
            vec![quota.burst(), rate, unit]
        }
        Algorithm::Gcra => vec![quota.burst(), quota.emission_interval_us()],
        Algorithm::FixedWindow | Algorithm::SlidingWindow => vec![quota.period_us()],
        _ => vec![],
    }
}

/// Checks that the value stored at `key` is exactly the model's `state` and the quota it was
/// `written` under: the same fields (the log's entries in the same order) and stamp, or no key
/// for a state never written.
async fn check_stored(
    conn: &mut MultiplexedConnection,
    key: &[u8],
    state: &State,
    written: Option<&Quota>,
) -> Result<(), TestCaseError> {
    let value: Option<Vec<u8>> = redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let Some(value) = value else {
        prop_assert_eq!(
            state,
            &State::fresh(state.algorithm()),
            "no key, but the model has a state"
        );
        return Ok(());
    };
    let (tag, mut f) = fields(&value);
    if tag != 4 {
        let want = stamp(
            state.algorithm(),
            written.expect("a stored state was written"),
        );
        prop_assert!(f.len() > want.len(), "state {:?}", value);
        let got = f.split_off(f.len() - want.len());
        prop_assert_eq!(got, want, "the stamp of {:?}", value);
    }
    let stored = match (tag, f.as_slice()) {
        (1, &[deficit, last_us]) => State::TokenBucket(TokenBucket { deficit, last_us }),
        (2, &[tat_us]) => State::Gcra(Gcra { tat_us }),
        (3, &[start_us, count]) => State::FixedWindow(FixedWindow { start_us, count }),
        (4, entries) if entries.len().is_multiple_of(2) => {
            let pairs: Vec<(u64, u64)> = entries.chunks_exact(2).map(|p| (p[0], p[1])).collect();
            if let State::SlidingLog(log) = state {
                prop_assert_eq!(
                    &pairs,
                    &log.entries().collect::<Vec<_>>(),
                    "sliding log entries"
                );
            }
            State::SlidingLog(SlidingLog::from_entries(pairs))
        }
        (5, &[start_us, previous, current]) => State::SlidingWindow(SlidingWindow {
            start_us,
            previous,
            current,
        }),
        _ => {
            return Err(TestCaseError::fail(format!(
                "unreadable stored state {value:?}"
            )));
        }
    };
    prop_assert_eq!(&stored, state, "stored state");
    Ok(())
}

/// Runs one case: every decision from Redis must equal the model's, field by field, and every
/// stored state the model's state.
async fn run_case(conn: &mut MultiplexedConnection, case: &Case) -> Result<(), TestCaseError> {
    let p = prefix("differential");
    let single_keys: Vec<Vec<u8>> = Algorithm::ALL
        .iter()
        .map(|a| format!("{p}:single:{a}").into_bytes())
        .collect();
    let batch_keys: Vec<Vec<u8>> = (0..5)
        .map(|j| format!("{p}:batch:{j}").into_bytes())
        .collect();
    let mixed_key = format!("{p}:mixed").into_bytes();

    let mut single_states: Vec<State> = Algorithm::ALL.iter().map(|&a| State::fresh(a)).collect();
    let mut batch_states: Vec<State> = Algorithm::ALL.iter().map(|&a| State::fresh(a)).collect();
    let mut mixed_state = State::fresh(Algorithm::TokenBucket);
    let mut single_written: Vec<Option<Quota>> = vec![None; 5];
    let mut batch_written: Vec<Option<Quota>> = vec![None; 5];
    let mut mixed_written: Option<Quota> = None;
    let mut last_retry: Vec<Option<u64>> = vec![None; 5];

    let mut now = case.start;
    for (n, step) in case.steps.iter().enumerate() {
        let period = case.quotas[0].period_us();
        now = match step.advance {
            Advance::Zero => now,
            Advance::Micros(us) => now + us,
            Advance::Sixteenths(k) => now + period * k / 16,
            Advance::ToRetry { which, delta } => match last_retry[which] {
                Some(retry) => now.saturating_add_signed(retry as i64 + delta),
                None => now,
            },
            Advance::Back(k) => now.saturating_sub(period * k / 16),
            Advance::BackMicros(us) => now.saturating_sub(us),
            Advance::Periods(k) => now + period * k,
        };
        let time = TimeSource::Client(now);
        let single_limits: Vec<Limit> = Algorithm::ALL
            .iter()
            .map(|&a| limit_of(a, case.quotas[step.quota]))
            .collect();
        let batch_limits: Vec<Limit> = Algorithm::ALL
            .iter()
            .enumerate()
            .map(|(j, &a)| limit_of(a, case.quotas[(j + step.quota) % 2]))
            .collect();

        for (j, cost) in step.costs.iter().enumerate() {
            let limit = single_limits[j];
            let cost = cost.units(limit.capacity());
            let expected =
                limit.decide_from(&mut single_states[j], &mut single_written[j], now, cost);
            let got = decide(conn, &single_keys[j], &limit, cost, time).await;
            let got = got.map_err(|e| TestCaseError::fail(format!("step {n}: {e}")))?;
            prop_assert_eq!(
                got,
                expected,
                "step {}: {:?} at {} cost {}, model state after: {:?}",
                n,
                limit,
                now,
                cost,
                single_states[j]
            );
            last_retry[j] =
                (got.is_denied() && !got.is_never()).then(|| got.retry_after().as_micros() as u64);
            check_stored(
                conn,
                &single_keys[j],
                &single_states[j],
                single_written[j].as_ref(),
            )
            .await?;
        }

        // One key, the algorithm changing from step to step.
        let (which, cost) = &step.mixed;
        let limit = single_limits[*which];
        let cost = cost.units(limit.capacity());
        let expected = limit.decide_from(&mut mixed_state, &mut mixed_written, now, cost);
        let got = decide(conn, &mixed_key, &limit, cost, time)
            .await
            .map_err(|e| TestCaseError::fail(format!("step {n} (mixed): {e}")))?;
        prop_assert_eq!(
            got,
            expected,
            "step {} (mixed): {:?} at {} cost {}",
            n,
            limit,
            now,
            cost
        );
        check_stored(conn, &mixed_key, &mixed_state, mixed_written.as_ref()).await?;

        // A batch, all-or-nothing.
        let requests: Vec<ScriptRequest<'_>> = step
            .batch
            .iter()
            .map(|(j, cost)| {
                let limit = batch_limits[*j];
                ScriptRequest::new(&batch_keys[*j], limit, cost.units(limit.capacity()))
            })
            .collect();
        let mut expected: Vec<Decision> = requests
            .iter()
            .zip(&step.batch)
            .map(|(r, (j, _))| {
                let written = batch_written[*j].as_ref();
                r.limit
                    .evaluate_from(Some(&batch_states[*j]), written, now, r.cost)
            })
            .collect();
        if expected.iter().all(Decision::is_allowed) {
            for (r, (j, _)) in requests.iter().zip(&step.batch) {
                r.limit
                    .decide_from(&mut batch_states[*j], &mut batch_written[*j], now, r.cost);
            }
        } else {
            // Nothing charged (nor carried over): those that alone would pass are answered as
            // peeks.
            for ((d, r), (j, _)) in expected.iter_mut().zip(&requests).zip(&step.batch) {
                if d.is_allowed() {
                    let written = batch_written[*j].as_ref();
                    *d = r
                        .limit
                        .evaluate_from(Some(&batch_states[*j]), written, now, 0);
                }
            }
        }
        let got = decide_all(conn, &requests, time)
            .await
            .map_err(|e| TestCaseError::fail(format!("step {n} (batch): {e}")))?;
        prop_assert_eq!(
            got,
            expected,
            "step {} (batch) at {}: {:?}",
            n,
            now,
            requests
        );
        for (j, _) in &step.batch {
            check_stored(
                conn,
                &batch_keys[*j],
                &batch_states[*j],
                batch_written[*j].as_ref(),
            )
            .await?;
        }
    }

    let mut del = redis::cmd("DEL");
    del.arg(&single_keys).arg(&batch_keys).arg(&mixed_key);
    let _: i64 = del
        .query_async(conn)
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    Ok(())
}

#[test]
fn scripts_decide_exactly_like_the_model() {
    let Some(server) = server() else { return };
    let rt = runtime();
    let conn = rt.block_on(connect(&server.url));
    let cases = std::env::var("DISTLIMIT_DIFFERENTIAL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&case_strategy(), |case| {
        let mut conn = conn.clone();
        rt.block_on(run_case(&mut conn, &case))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// 2. NOSCRIPT: the scripts survive an emptied script cache.

/// A connection that records the name of every command sent through it.
struct Recorder {
    inner: MultiplexedConnection,
    sent: Vec<String>,
}

impl ConnectionLike for Recorder {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        if let Some(redis::Arg::Simple(name)) = cmd.args_iter().next() {
            self.sent.push(String::from_utf8_lossy(name).into_owned());
        }
        self.inner.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.inner.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

#[test]
fn noscript_falls_back_to_eval() {
    let Some(server) = server() else { return };
    let rt = runtime();
    rt.block_on(async {
        let conn = connect(&server.url).await;
        let mut admin = conn.clone();
        let mut rec = Recorder {
            inner: conn,
            sent: Vec::new(),
        };
        let p = prefix("noscript");
        let quota = Quota::per_second(5).unwrap();
        for algorithm in Algorithm::ALL {
            let limit = limit_of(algorithm, quota);
            let key = format!("{p}:{algorithm}").into_bytes();
            let other = format!("{p}:{algorithm}:other").into_bytes();
            let mut state = State::fresh(algorithm);
            let mut other_state = State::fresh(algorithm);
            let now = 1_700_000_000_000_000;
            let sha = script::ENTRY_SHA.as_str();

            // Another test sharing the server may load the script again right after the flush:
            // try until the fallback is seen.
            let mut fell_back = false;
            for attempt in 0..20 {
                let _: () = query(&mut admin, redis::cmd("SCRIPT").arg("FLUSH")).await;
                rec.sent.clear();
                let d = decide(&mut rec, &key, &limit, 1, TimeSource::Client(now))
                    .await
                    .unwrap();
                assert_eq!(
                    d,
                    limit.decide(&mut state, now, 1),
                    "{algorithm}, attempt {attempt}"
                );
                if rec.sent == ["EVALSHA", "EVAL"] {
                    fell_back = true;
                    break;
                }
                assert_eq!(rec.sent, ["EVALSHA"], "{algorithm}");
            }
            assert!(
                fell_back,
                "{algorithm}: never saw EVALSHA answered NOSCRIPT, then EVAL"
            );
            // EVAL cached the script again: the next call needs no fallback.
            let cached: Vec<i64> =
                query(&mut admin, redis::cmd("SCRIPT").arg("EXISTS").arg(sha)).await;
            assert_eq!(cached, [1], "{algorithm}");

            // The batch script too.
            let mut fell_back = false;
            for _ in 0..20 {
                let _: () = query(&mut admin, redis::cmd("SCRIPT").arg("FLUSH")).await;
                rec.sent.clear();
                let requests = [
                    ScriptRequest::new(&key, limit, 1),
                    ScriptRequest::new(&other, limit, 2),
                ];
                let ds = decide_all(&mut rec, &requests, TimeSource::Client(now))
                    .await
                    .unwrap();
                let mut expected: Vec<Decision> = vec![
                    limit.evaluate(Some(&state), now, 1),
                    limit.evaluate(Some(&other_state), now, 2),
                ];
                if expected.iter().all(Decision::is_allowed) {
                    limit.decide(&mut state, now, 1);
                    limit.decide(&mut other_state, now, 2);
                } else {
                    // Nothing charged: those that alone would pass are answered as peeks.
                    for (d, s) in expected.iter_mut().zip([&state, &other_state]) {
                        if d.is_allowed() {
                            *d = limit.evaluate(Some(s), now, 0);
                        }
                    }
                }
                assert_eq!(ds, expected, "{algorithm} batch");
                if rec.sent == ["EVALSHA", "EVAL"] {
                    fell_back = true;
                    break;
                }
            }
            assert!(fell_back, "{algorithm}: the batch never fell back to EVAL");
        }
    });
}

// ---------------------------------------------------------------------------------------------
// 3. A wrong Redis type or an unreadable value at a key.

fn state_bytes(tag: u8, fields: &[f64]) -> Vec<u8> {
    let mut v = vec![tag];
    for f in fields {
        v.extend_from_slice(&f.to_be_bytes());
    }
    v
}

fn tag_of(algorithm: Algorithm) -> u8 {
    match algorithm {
        Algorithm::TokenBucket => 1,
        Algorithm::Gcra => 2,
        Algorithm::FixedWindow => 3,
        Algorithm::SlidingLog => 4,
        Algorithm::SlidingWindow => 5,
        other => panic!("unknown algorithm {other}"),
    }
}

/// Values that are not a readable state of `algorithm`, nor a valid state of another one.
fn corrupt_values(algorithm: Algorithm) -> Vec<Vec<u8>> {
    let tag = tag_of(algorithm);
    // The fields of an unstamped value, and of the stamp (see the prelude).
    let (fields, stamp) = match algorithm {
        Algorithm::Gcra => (1, 2),
        Algorithm::TokenBucket => (2, 3),
        Algorithm::FixedWindow => (2, 1),
        Algorithm::SlidingLog => (2, 0),
        _ => (3, 1),
    };
    // A length neither with nor without the stamp.
    let wrong = if stamp == 1 { fields + 2 } else { fields + 1 };
    let mut values = vec![
        b"garbage".to_vec(),
        Vec::new(),
        b"12345".to_vec(),
        vec![9; 17],
        state_bytes(tag, &vec![1.0; wrong]),
    ];
    if algorithm != Algorithm::SlidingLog {
        values.push(vec![tag]);
        // A stamp that is no parameter: zero, or not an integer.
        for bad in [0.0, 1.5] {
            let mut f = vec![7.0; fields + stamp];
            f[fields + stamp - 1] = bad;
            values.push(state_bytes(tag, &f));
        }
    }
    for bad in [f64::NAN, f64::INFINITY, -1.0, 1.5, 9_007_199_254_740_992.0] {
        let mut f = vec![7.0; fields];
        f[fields - 1] = bad;
        values.push(state_bytes(tag, &f));
    }
    if algorithm == Algorithm::SlidingLog {
        // Instants out of order, a repeated instant, a zero cost.
        values.push(state_bytes(4, &[10.0, 1.0, 5.0, 1.0]));
        values.push(state_bytes(4, &[10.0, 1.0, 10.0, 1.0]));
        values.push(state_bytes(4, &[10.0, 0.0]));
    }
    values
}

#[test]
fn wrong_types_and_unreadable_values_are_protocol_errors() {
    let Some(server) = server() else { return };
    let rt = runtime();
    rt.block_on(async {
        let mut conn = connect(&server.url).await;
        let p = prefix("bad-values");
        let quota = Quota::per_second(10).unwrap();
        let now = 1_700_000_000_000_000;
        for algorithm in Algorithm::ALL {
            let limit = limit_of(algorithm, quota);
            let key = format!("{p}:{algorithm}:list").into_bytes();
            let _: i64 = query(&mut conn, redis::cmd("RPUSH").arg(&key).arg("a").arg("b")).await;
            for (cost, time) in [(1, TimeSource::Client(now)), (0, TimeSource::Server)] {
                match decide(&mut conn, &key, &limit, cost, time).await {
                    Err(Error::BadState { message, .. }) => {
                        assert!(message.contains("WRONGTYPE"), "{algorithm}: {message}");
                        assert!(message.contains(&p), "{algorithm}: {message}");
                    }
                    other => panic!("{algorithm}: a list at the key must be a protocol error, got {other:?}"),
                }
            }
            let list: Vec<String> = query(&mut conn, redis::cmd("LRANGE").arg(&key).arg(0).arg(-1)).await;
            assert_eq!(list, ["a", "b"], "{algorithm}");
            assert_eq!(pttl(&mut conn, &key).await, -1, "{algorithm}");

            for (i, value) in corrupt_values(algorithm).into_iter().enumerate() {
                let key = format!("{p}:{algorithm}:corrupt:{i}").into_bytes();
                let _: () = query(&mut conn, redis::cmd("SET").arg(&key).arg(&value)).await;
                for cost in [0, 1, limit.capacity() + 1] {
                    match decide(&mut conn, &key, &limit, cost, TimeSource::Client(now)).await {
                        Err(e @ Error::BadState { .. }) => {
                            let message = e.to_string();
                            assert!(message.contains("corrupt"), "{algorithm}: {message}");
                            assert!(message.contains(&p), "{algorithm}: {message}");
                            assert!(!e.is_transient());
                        }
                        other => panic!(
                            "{algorithm}: the value {value:?} must be a protocol error, got {other:?}"
                        ),
                    }
                }
                // Through the batch, next to a good key: nothing is written.
                let good = format!("{p}:{algorithm}:good:{i}").into_bytes();
                let requests = [
                    ScriptRequest::new(&good, limit, 1),
                    ScriptRequest::new(&key, limit, 1),
                ];
                let result = decide_all(&mut conn, &requests, TimeSource::Client(now)).await;
                assert!(matches!(result, Err(Error::BadState { .. })), "{algorithm}: {result:?}");
                assert!(!exists(&mut conn, &good).await, "{algorithm}");
                assert_eq!(get(&mut conn, &key).await, Some(value), "{algorithm}");
                assert_eq!(pttl(&mut conn, &key).await, -1, "{algorithm}");
            }
        }
    });
}

#[test]
fn a_state_of_another_algorithm_counts_as_fresh() {
    let Some(server) = server() else { return };
    let rt = runtime();
    rt.block_on(async {
        let mut conn = connect(&server.url).await;
        let p = prefix("foreign");
        let quota = Quota::per_second(4).unwrap();
        let mut now = 1_700_000_000_000_000;
        for a in Algorithm::ALL {
            for b in Algorithm::ALL {
                let key = format!("{p}:{a}:{b}").into_bytes();
                let mut state = State::fresh(a);
                for (limit, cost) in [
                    (limit_of(a, quota), 4),
                    (limit_of(b, quota), 0),
                    (limit_of(b, quota), 1),
                    (limit_of(a, quota), 2),
                    (limit_of(b, quota), 5),
                ] {
                    now += 1_000;
                    let expected = limit.decide(&mut state, now, cost);
                    let got = decide(&mut conn, &key, &limit, cost, TimeSource::Client(now))
                        .await
                        .unwrap();
                    assert_eq!(got, expected, "{a} then {b}: {limit:?} cost {cost}");
                }
            }
        }
    });
}

/// The case through the scripts: 1 per hour spent and denied, then 60 per minute with a
/// burst of 100: the one unit spent carries over and the key passes at once; lowered back, the
/// 99 spent are capped at the one unit and the key is denied (no fresh bucket), also while it
/// keeps asking (the carried state is written by the first denial).
#[test]
fn a_raised_limit_frees_a_denied_key_and_a_lowered_one_never_refreshes() {
    let Some(server) = server() else { return };
    let rt = runtime();
    rt.block_on(async {
        let mut conn = connect(&server.url).await;
        let p = prefix("carry");
        let hourly = Quota::per_hour(1).unwrap();
        let raised = Quota::per_minute(60).unwrap().with_burst(100).unwrap();
        for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
            let key = format!("{p}:{algorithm}").into_bytes();
            let (old, new) = (limit_of(algorithm, hourly), limit_of(algorithm, raised));
            let t0 = 1_700_000_000_000_000;
            let at = |us: u64| TimeSource::Client(t0 + us);
            assert!(
                decide(&mut conn, &key, &old, 1, at(0))
                    .await
                    .unwrap()
                    .is_allowed()
            );
            assert!(
                decide(&mut conn, &key, &old, 1, at(1))
                    .await
                    .unwrap()
                    .is_denied()
            );
            let d = decide(&mut conn, &key, &new, 1, at(2)).await.unwrap();
            assert!(d.is_allowed(), "{algorithm}: {d:?}");
            assert_eq!(d.remaining(), 98, "{algorithm}");
            let d = decide(&mut conn, &key, &new, 97, at(3)).await.unwrap();
            assert!(d.is_allowed(), "{algorithm}: {d:?}");
            // Lowered again: the 99 spent are capped at the one unit, not a fresh bucket.
            for s in 1..5u64 {
                let d = decide(&mut conn, &key, &old, 1, at(s * 30_000_000))
                    .await
                    .unwrap();
                assert!(d.is_denied(), "{algorithm} after {s} × 30 s: {d:?}");
            }
        }
    });
}

/// A value written before stamps (no parameters after the fields) reads as written under the
/// quota it is read with, and the next write stamps it.
#[test]
fn unstamped_values_read_under_the_current_quota() {
    let Some(server) = server() else { return };
    let rt = runtime();
    rt.block_on(async {
        let mut conn = connect(&server.url).await;
        let p = prefix("unstamped");
        let quota = Quota::per_second(4).unwrap();
        let now: u64 = 1_700_000_000_000_000;
        for algorithm in Algorithm::ALL {
            let limit = limit_of(algorithm, quota);
            // 3 of 4 units spent, at `now`.
            let fields = match algorithm {
                Algorithm::TokenBucket => {
                    let unit = quota.refill_units().1 as f64;
                    vec![3.0 * unit, now as f64]
                }
                Algorithm::Gcra => vec![(now + 750_000) as f64],
                Algorithm::FixedWindow => vec![(now - now % 1_000_000) as f64, 3.0],
                Algorithm::SlidingWindow => vec![(now - now % 1_000_000) as f64, 0.0, 3.0],
                _ => vec![now as f64, 3.0],
            };
            let key = format!("{p}:{algorithm}").into_bytes();
            let value = state_bytes(tag_of(algorithm), &fields);
            let _: () = query(&mut conn, redis::cmd("SET").arg(&key).arg(&value)).await;
            let d = decide(&mut conn, &key, &limit, 1, TimeSource::Client(now))
                .await
                .unwrap();
            assert!(d.is_allowed(), "{algorithm}: {d:?}");
            assert_eq!(d.remaining(), 0, "{algorithm}: 3 of 4 spent, then 1");
            let stored = get(&mut conn, &key).await.unwrap();
            let stamped = match algorithm {
                Algorithm::TokenBucket => 41,
                Algorithm::Gcra | Algorithm::FixedWindow => 25,
                Algorithm::SlidingWindow => 33,
                // One entry: the request merged into the logged instant.
                _ => 1 + 16,
            };
            assert_eq!(stored.len(), stamped, "{algorithm}");
        }
    });
}

// ---------------------------------------------------------------------------------------------
// 4. TTLs.

#[test]
fn every_write_sets_the_ttl_of_its_reset() {
    let Some(server) = server() else { return };
    let rt = runtime();
    rt.block_on(async {
        let mut conn = connect(&server.url).await;
        let p = prefix("ttl");
        let quotas = [
            Quota::per_second(3).unwrap(),
            Quota::per_minute(2).unwrap(),
            Quota::per_hour(5).unwrap().with_burst(2).unwrap(),
            Quota::from_parts(7, 1_500, 3).unwrap(),
        ];
        for (qi, quota) in quotas.into_iter().enumerate() {
            for algorithm in Algorithm::ALL {
                let limit = limit_of(algorithm, quota);
                let ctx = format!("{algorithm} {quota:?}");
                let key = format!("{p}:{qi}:{algorithm}").into_bytes();

                // A peek on a fresh key writes nothing.
                let d = decide(&mut conn, &key, &limit, 0, TimeSource::Server)
                    .await
                    .unwrap();
                assert!(d.is_allowed(), "{ctx}: {d:?}");
                assert!(
                    !exists(&mut conn, &key).await,
                    "{ctx}: a peek created the key"
                );

                // Neither does a request above the capacity.
                let d = decide(&mut conn, &key, &limit, u64::MAX, TimeSource::Server)
                    .await
                    .unwrap();
                assert!(d.is_never(), "{ctx}: {d:?}");
                assert!(
                    !exists(&mut conn, &key).await,
                    "{ctx}: a NEVER request created the key"
                );

                // An admitted request: TTL = ⌈reset_after / 1000⌉ ms.
                let d = decide(&mut conn, &key, &limit, 1, TimeSource::Server)
                    .await
                    .unwrap();
                assert!(d.is_allowed(), "{ctx}: {d:?}");
                let ceil_ms = i64::try_from(d.reset_after().as_micros().div_ceil(1000)).unwrap();
                let ttl = pttl(&mut conn, &key).await;
                if ceil_ms <= 50 {
                    // A TTL of a few ms may run out before PTTL is read (0, or -2: no key).
                    assert!(
                        ttl == -2 || (0..=ceil_ms + 1).contains(&ttl),
                        "{ctx}: PTTL {ttl} for {d:?}"
                    );
                } else {
                    assert!(ttl > 0 && ttl <= ceil_ms + 1, "{ctx}: PTTL {ttl} for {d:?}");
                    assert!(
                        ttl >= ceil_ms - 1_000,
                        "{ctx}: PTTL {ttl} far below {ceil_ms} ms"
                    );
                }

                // Spend it out; then a denial and a peek change neither the value nor the TTL.
                // (Enough time for a fresh window would make them allowed again: a long quota
                // is needed for the short ones to stay denied, so skip those.)
                let mut last = d;
                for _ in 0..limit.capacity() {
                    last = decide(&mut conn, &key, &limit, 1, TimeSource::Server)
                        .await
                        .unwrap();
                    if last.is_denied() {
                        break;
                    }
                }
                if quota.period_us() < 60_000_000 {
                    continue;
                }
                let denied = if last.is_denied() {
                    last
                } else {
                    decide(&mut conn, &key, &limit, 1, TimeSource::Server)
                        .await
                        .unwrap()
                };
                assert!(denied.is_denied(), "{ctx}: {denied:?}");
                let before = (get(&mut conn, &key).await, pttl(&mut conn, &key).await);
                let again = decide(&mut conn, &key, &limit, 1, TimeSource::Server)
                    .await
                    .unwrap();
                assert!(again.is_denied(), "{ctx}: {again:?}");
                let peek = decide(&mut conn, &key, &limit, 0, TimeSource::Server)
                    .await
                    .unwrap();
                assert!(peek.is_denied(), "{ctx}: {peek:?}");
                let after = (get(&mut conn, &key).await, pttl(&mut conn, &key).await);
                assert_eq!(
                    after.0, before.0,
                    "{ctx}: a denial or a peek changed the state"
                );
                assert!(
                    after.1 <= before.1 && after.1 > before.1 - 1_000,
                    "{ctx}: a denial or a peek changed the TTL: {before:?} then {after:?}"
                );
            }
        }

        // Client time: the same TTL plus the slack, whatever the client's clock says.
        let slack = i64::try_from(CLIENT_TTL_SLACK.as_millis()).unwrap();
        for algorithm in Algorithm::ALL {
            let limit = limit_of(algorithm, Quota::per_second(2).unwrap());
            let key = format!("{p}:client:{algorithm}").into_bytes();
            let d = decide(&mut conn, &key, &limit, 1, TimeSource::Client(12_345))
                .await
                .unwrap();
            let ceil_ms = i64::try_from(d.reset_after().as_micros().div_ceil(1000)).unwrap();
            let ttl = pttl(&mut conn, &key).await;
            assert!(
                ttl > slack - 1_000 && ttl <= ceil_ms + slack + 1,
                "{algorithm}: PTTL {ttl} for {d:?} in client-time mode"
            );
        }
    });
}

// ---------------------------------------------------------------------------------------------
// 5. Server time.

async fn server_time(conn: &mut MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = query(conn, &mut redis::cmd("TIME")).await;
    secs * 1_000_000 + micros
}

#[test]
fn server_time_is_read_inside_the_script() {
    let Some(server) = server() else { return };
    let rt = runtime();
    rt.block_on(async {
        let mut conn = connect(&server.url).await;
        let p = prefix("server-time");
        let t = 1_800_000_000u64; // µs per unit: 2 per hour
        let limit = Limit::gcra(Quota::per_hour(2).unwrap());
        let key = format!("{p}:gcra").into_bytes();

        let before = server_time(&mut conn).await;
        let first = decide(&mut conn, &key, &limit, 1, TimeSource::Server)
            .await
            .unwrap();
        let after = server_time(&mut conn).await;
        assert_eq!(first, Decision::allowed(2, 1, Duration::from_micros(t)));
        // The stored theoretical arrival time is the server's TIME plus T.
        let value = get(&mut conn, &key).await.unwrap();
        // The tag, the arrival time, then the stamp: the burst and T.
        assert_eq!((value.len(), value[0]), (25, 2));
        let tat = f64::from_be_bytes(value[1..9].try_into().unwrap()) as u64;
        assert!(
            (before + t..=after + t).contains(&tat),
            "tat {tat} outside [{before}, {after}] + T"
        );

        // Each later answer is short of the full interval by the server time passed since the
        // first decision, which the server's TIME before the first and after this one brackets.
        let second = decide(&mut conn, &key, &limit, 1, TimeSource::Server)
            .await
            .unwrap();
        let passed = server_time(&mut conn).await - before;
        assert!(second.is_allowed() && second.remaining() == 0, "{second:?}");
        let reset = second.reset_after().as_micros() as u64;
        assert!(
            (2 * t - passed..=2 * t).contains(&reset),
            "{second:?}, {passed} µs after the first"
        );

        let third = decide(&mut conn, &key, &limit, 1, TimeSource::Server)
            .await
            .unwrap();
        let passed = server_time(&mut conn).await - before;
        assert!(third.is_denied(), "{third:?}");
        let retry = third.retry_after().as_micros() as u64;
        assert!(
            (t - passed..=t).contains(&retry),
            "{third:?}, {passed} µs after the first"
        );
        // Consistent with each other: the later answer waits no longer than the earlier reset.
        assert!(
            third.reset_after() <= second.reset_after(),
            "{second:?} then {third:?}"
        );

        // The token bucket and a batch, in server time.
        let tb = Limit::token_bucket(Quota::per_hour(1).unwrap());
        let fw = Limit::fixed_window(Quota::per_hour(1).unwrap());
        let (k1, k2) = (
            format!("{p}:tb").into_bytes(),
            format!("{p}:fw").into_bytes(),
        );
        let requests = [
            ScriptRequest::new(&k1, tb, 1),
            ScriptRequest::new(&k2, fw, 1),
        ];
        let before = server_time(&mut conn).await;
        let ds = decide_all(&mut conn, &requests, TimeSource::Server)
            .await
            .unwrap();
        assert!(ds.iter().all(Decision::is_allowed), "{ds:?}");
        let ds = decide_all(&mut conn, &requests, TimeSource::Server)
            .await
            .unwrap();
        let passed = server_time(&mut conn).await - before;
        assert!(ds.iter().all(Decision::is_denied), "{ds:?}");
        let retry = ds[0].retry_after().as_micros() as u64;
        assert!(
            (3_600_000_000 - passed..=3_600_000_000).contains(&retry),
            "{ds:?}, {passed} µs after the first"
        );
        assert!(ds[1].retry_after() <= Duration::from_secs(3_600), "{ds:?}");
    });
}

// ---------------------------------------------------------------------------------------------
// Settling: reports (forced charges, debt) and give-backs against the model.

/// One step on a key: a decision, a report (forced charge) or a give-back of its units.
#[derive(Clone, Copy, Debug)]
enum Settle {
    Decide(u64),
    Report(u64),
    GiveBack(u64),
}

fn settle_step() -> impl Strategy<Value = Settle> {
    prop_oneof![
        (0u64..12).prop_map(Settle::Decide),
        prop_oneof![0u64..40, 0u64..(1 << 53)].prop_map(Settle::Report),
        (0u64..15).prop_map(Settle::GiveBack),
    ]
}

fn settle_quotas() -> [Quota; 4] {
    [
        Quota::per_second(10).unwrap(),
        Quota::per_second(10).unwrap().with_burst(4).unwrap(),
        Quota::from_parts(7, 1_000_000, 9).unwrap(),
        Quota::per_day(1).unwrap(),
    ]
}

/// Steps on two keys: (advance µs, key 0 or 1, quota index, step), and whether the keys are
/// GCRA; every third step of a run of a key's neighbours is sent as a batch of both keys.
type SettleCase = (bool, Vec<(u64, usize, usize, Settle, bool)>);

fn settle_case() -> impl Strategy<Value = SettleCase> {
    (
        prop::bool::ANY,
        prop::collection::vec(
            (
                prop_oneof![0u64..10, 0u64..2_000_000],
                0usize..2,
                prop_oneof![3 => Just(0usize), 1 => 0usize..4],
                settle_step(),
                prop::bool::weighted(0.2),
            ),
            1..50,
        ),
    )
}

/// Applies `step` to the model state of one key at `now`: what the store must answer.
fn settle_model(
    limit: &Limit,
    state: &mut State,
    written: &mut Option<Quota>,
    now: u64,
    step: Settle,
) -> Decision {
    match step {
        Settle::Decide(cost) => limit.decide_from(state, written, now, cost),
        Settle::Report(cost) => limit
            .force_from(state, written, now, cost.min(distlimit_core::MAX_REPORT))
            .unwrap(),
        Settle::GiveBack(units) => {
            limit.give_back_from(state, written, now, units).unwrap();
            limit.evaluate_from(Some(state), written.as_ref(), now, 0)
        }
    }
}

async fn run_settle_case(
    conn: &mut MultiplexedConnection,
    (gcra, steps): &SettleCase,
) -> Result<(), TestCaseError> {
    let algorithm = if *gcra {
        Algorithm::Gcra
    } else {
        Algorithm::TokenBucket
    };
    let base = prefix("settle");
    let keys = [
        format!("{base}:a").into_bytes(),
        format!("{base}:b").into_bytes(),
    ];
    let mut states = [State::fresh(algorithm), State::fresh(algorithm)];
    let mut written = [None, None];
    let mut now = 1_700_000_000_000_000u64;
    for &(advance, k, q, step, both) in steps {
        now += advance;
        let time = TimeSource::Client(now);
        let limit = limit_of(algorithm, settle_quotas()[q]);
        let settling = |s: Settle| match s {
            Settle::Report(c) => Some((c.min(distlimit_core::MAX_REPORT), true)),
            Settle::GiveBack(u) => Some((u, false)),
            Settle::Decide(_) => None,
        };
        match settling(step) {
            Some((cost, kind)) if both => {
                // A batch: this step on key k, a report of 1 on the other key.
                let other = 1 - k;
                let requests = [
                    ScriptRequest::new(&keys[k], limit, cost),
                    ScriptRequest::new(&keys[other], limit, 1),
                ];
                let got = script::settle(conn, &requests, &[kind, true], time)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let want_k = settle_model(&limit, &mut states[k], &mut written[k], now, step);
                let want_o = settle_model(
                    &limit,
                    &mut states[other],
                    &mut written[other],
                    now,
                    Settle::Report(1),
                );
                prop_assert_eq!(&got, &vec![want_k, want_o], "batch {:?} at {}", step, now);
            }
            Some((cost, kind)) => {
                let got = script::settle(
                    conn,
                    &[ScriptRequest::new(&keys[k], limit, cost)],
                    &[kind],
                    time,
                )
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let want = settle_model(&limit, &mut states[k], &mut written[k], now, step);
                prop_assert_eq!(&got, &vec![want], "{:?} at {}", step, now);
            }
            None => {
                let Settle::Decide(cost) = step else {
                    unreachable!()
                };
                let got = decide(conn, &keys[k], &limit, cost, time)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let want = settle_model(&limit, &mut states[k], &mut written[k], now, step);
                prop_assert_eq!(got, want, "{:?} at {}", step, now);
            }
        }
        // Both keys peek alike afterwards.
        for j in 0..2 {
            let got = decide(conn, &keys[j], &limit, 0, time)
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let want = limit.evaluate_from(Some(&states[j]), written[j].as_ref(), now, 0);
            prop_assert_eq!(got, want, "peek of key {} at {}", j, now);
        }
    }
    let _: i64 = redis::cmd("DEL")
        .arg(&keys[0])
        .arg(&keys[1])
        .query_async(conn)
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    Ok(())
}

/// Reports, give-backs and decisions in random sequences (time advancing, quotas changing, debt
/// up to the saturation bounds, batches of two keys) decide exactly like the model.
#[test]
fn settling_scripts_match_the_model() {
    let Some(server) = server() else { return };
    let rt = runtime();
    let conn = rt.block_on(connect(&server.url));
    let cases = std::env::var("DISTLIMIT_DIFFERENTIAL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&settle_case(), |case| {
        let mut conn = conn.clone();
        rt.block_on(run_settle_case(&mut conn, &case))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The window algorithms refuse reports and give-backs, writing nothing.
#[test]
fn settling_refuses_the_windows() {
    let Some(server) = server() else { return };
    let rt = runtime();
    rt.block_on(async {
        let mut conn = connect(&server.url).await;
        let key = prefix("settle-window").into_bytes();
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingLog,
            Algorithm::SlidingWindow,
        ] {
            let limit = limit_of(algorithm, Quota::per_second(5).unwrap());
            for kind in [true, false] {
                let err = script::settle(
                    &mut conn,
                    &[ScriptRequest::new(&key, limit, 3)],
                    &[kind],
                    TimeSource::Server,
                )
                .await
                .unwrap_err();
                assert!(matches!(err, Error::InvalidRequest(_)), "{err:?}");
            }
        }
        assert!(!exists(&mut conn, &key).await);
    });
}
