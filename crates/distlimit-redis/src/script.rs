//! The Lua scripts: one atomic decision per `EVALSHA`, bit-identical to [`Limit::decide`].
//!
//! Every decision is one round trip running one script inside Redis, so concurrent requests on a
//! key (from any number of connections, processes or hosts) are serialized by Redis itself. The
//! scripts translate the reference model of `distlimit-core` line by line, on the same integer
//! microseconds and units: for a valid [`Quota`](distlimit_core::Quota) and times below 2^52 µs
//! every intermediate value stays below 2^53, where Lua's doubles are exact, so Redis answers
//! exactly what [`Limit::decide`] answers (the `differential` test compares them step by step).
//!
//! # Entry points
//!
//! * [`decide`]: one request on one key, through the algorithm's single-key script (`GET`,
//!   at most one `SET … PX`, and `TIME` in server-time mode).
//! * [`decide_all`]: up to [`MAX_BATCH`] requests on distinct keys, all-or-nothing, through the
//!   batch script: every request is evaluated first without writing; only if all are admitted are
//!   their states written. In a Cluster the keys must share one hash slot (one `{tag}`); the
//!   store decides a batch over several slots one slot group at a time, and gives back what
//!   earlier groups charged when a later one denies, with `refund.lua` (see the crate
//!   documentation, "Batches across Cluster slots").
//!
//! Both are generic over [`redis::aio::ConnectionLike`]: a `MultiplexedConnection`, a
//! `ConnectionManager`, a cluster connection or a pooled connection. They send `EVALSHA` and, when
//! the server answers `NOSCRIPT` (a restart, a failover, `SCRIPT FLUSH`), the same call once more
//! as `EVAL` with the script's text, which also caches it again. A `NOSCRIPT` reply means the
//! script did not run, so re-sending it cannot charge twice. Nothing else is ever retried.
//!
//! A request whose cost exceeds the capacity never reaches Lua with that cost: it is sent as a
//! peek (cost 0, which reads the state and writes nothing) and answered as a denial with
//! `retry_after` = [`NEVER`], with the `remaining` and `reset_after` the model gives it. In a batch
//! such a request makes the batch fail, so the batch is sent with its commit flag off.
//!
//! # Time
//!
//! [`TimeSource::Server`] (the default) reads Redis' `TIME` inside the script: every client is
//! judged by one clock, so clients with skewed clocks cannot over-admit. Redis 7 replicates a
//! script's effects, not the script, so reading the time before writing is safe.
//! [`TimeSource::Client`] passes the caller's time instead, for deterministic tests only.
//!
//! # Arguments
//!
//! Quota parameters are computed in Rust and passed as decimal integers, so the scripts do no gcd:
//!
//! | algorithm | id | parameters |
//! |---|---|---|
//! | token bucket | 1 | `burst`, `L'`, `P'` ([`Quota::refill_units`](distlimit_core::Quota::refill_units)) |
//! | GCRA | 2 | `burst`, `T = ⌈period / limit⌉` µs ([`Quota::emission_interval_us`](distlimit_core::Quota::emission_interval_us)) |
//! | fixed window | 3 | `limit`, `period` µs |
//! | sliding log | 4 | `limit`, `period` µs |
//! | sliding window | 5 | `limit`, `period` µs, `gr`, `steps` ([`Quota::window_granule`](distlimit_core::Quota::window_granule)) |
//!
//! * Single-key script: `KEYS = [key]`, `ARGV = [time, cost, parameters…]`.
//! * Batch script: `KEYS = [key₁ … keyₙ]`, `ARGV = [time, flags, (id, cost, p₁, p₂, p₃, p₄)ₙ]`,
//!   unused parameter slots `0`; `flags` bit 0: commit, bit 1: append the time decided at (one
//!   more double after the decisions, for a refund).
//! * Refund script: `KEYS = [key₁ … keyₙ]`, `ARGV = [time, (id, cost, p₁, p₂, p₃, p₄, at)ₙ]`
//!   with `at` the time the batch decided at; the reply is the number of states rewritten.
//!
//! `time` is the empty string for server time, else the client's time in µs.
//!
//! The reply is one string of big-endian IEEE-754 doubles holding integers: `allowed` (1 or 0),
//! `limit`, `remaining`, `reset_after` µs, `retry_after` µs, once per key for the batch (40 bytes
//! per decision). A string rather than an array of integers because Redis 7.0 converts a Lua
//! array into a reply for about 0.45 µs, a tenth of a decision's cost inside Redis, and a string
//! for next to nothing. It is parsed strictly: a reply of another type or length, a value that is
//! not an integer in `[0, 2^53)`, or fields that contradict each other are an [`Error::Protocol`].
//!
//! # State encoding (a storage format)
//!
//! One Redis string per key: a tag byte naming the algorithm (and the format's version), then
//! big-endian IEEE-754 doubles holding integers, exactly the fields of the model's
//! [`State`](distlimit_core::State). Binary doubles are the cheapest exact encoding in Redis' Lua
//! (`struct.pack`/`struct.unpack` cost about 50 ns, formatting and parsing decimal text 3 to 10
//! times that):
//!
//! | algorithm | value | bytes |
//! |---|---|---|
//! | token bucket | `0x01`, deficit (units of `1 / P'` token below full), last update (µs); burst, `L'`, `P'` | 41 |
//! | GCRA | `0x02`, theoretical arrival time (µs); burst, `T` | 25 |
//! | fixed window | `0x03`, window start (µs), count; period | 25 |
//! | sliding log | `0x04`, then per admitted instant: instant (µs), cost (≥ 1) | 1 + 16 n |
//! | sliding window | `0x05`, current window start (µs), previous count, current count; period | 33 |
//!
//! The values after the `;` are the *stamp*: the parameters the state was written under. A state
//! read under other parameters is carried over exactly as
//! [`State::carried`](distlimit_core::State::carried) (the units spent carry over, capped at the
//! new capacity), and the first request with a cost under the new parameters writes the
//! converted state, even when it is denied (it charges nothing; the key then refills at the new
//! rate), as [`Limit::decide_from`](distlimit_core::Limit::decide_from) does. A value without a
//! stamp (17, 9, 17 and 25 bytes, written before stamps) reads as written under the parameters it
//! is read with. The refund script gives back only to a state stamped with the charge's
//! parameters, and keeps the stamp.
//!
//! The sliding log is one string of `(instant, cost)` pairs, instants strictly increasing, rewritten
//! by each admitted request: the expired prefix is dropped and a request at an instant not newer
//! than the newest entry is merged into it, exactly as the model's `SlidingLog` does. A sorted set
//! would cost more calls (`ZRANGEBYSCORE`, `ZREMRANGEBYSCORE`, `ZADD`, `PEXPIRE`) and could not
//! merge equal instants; evaluating the log is linear in its length either way, and the log holds
//! at most `limit` entries (the algorithm is meant for small limits).
//!
//! * A missing key is a fresh state (all zeros).
//! * A valid state of *another* algorithm (right tag and length) also counts as fresh, and is
//!   replaced when a request with a cost is admitted: the model's rule for a key whose algorithm
//!   changed.
//! * Anything else (another tag, a wrong length, a number that is not an integer in `[0, 2^53)`,
//!   log instants out of order) is never taken for a fresh key: the script answers the error
//!   `DISTLIMIT_CORRUPT`, which becomes an [`Error::BadState`]. A key of another Redis type (a
//!   list, a hash) makes `GET` fail with `WRONGTYPE`, also an [`Error::BadState`]. Neither
//!   writes, and neither is ever replaced by a later request: see the crate documentation,
//!   "A bad value at a key".
//!
//! Every write is `SET key value PX ttl` with `ttl = ⌈reset_after / 1000⌉` ms, where `reset_after`
//! is that of the admitted decision, `State::expires_at − now`: a key disappears once it would
//! decide like a fresh one, never earlier. Peeks and denials write nothing and leave the TTL as it
//! was. TTLs are relative, so they hold whatever the client's clock says. In
//! [`TimeSource::Client`] mode keys live [`CLIENT_TTL_SLACK`] longer.
//!
//! # Sources
//!
//! The Lua lives in `src/scripts/`, each algorithm written once: `prelude.lua` (shared constants
//! and the one helper, for unreadable values), one file per algorithm defining
//! `decide_<algorithm>`, two mains, `single.lua` and `batch.lua`, and `refund.lua`, a script of
//! its own. The script texts are put together at compile time (`concat!(include_str!(…))`): per algorithm the prelude, that
//! algorithm and the single-key main (the lean hot path); for the batch the prelude, every
//! algorithm and the batch main. [`script_source`] and [`batch_source`] return them, for example
//! to run `redis-benchmark` on the very script the store sends.

use std::sync::LazyLock;
use std::time::Duration;

use distlimit_core::{Algorithm, Decision, Error, Limit, MAX_BATCH, NEVER};
use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};

/// The name this driver reports in its errors.
const STORE: &str = "redis";

/// How much longer than its state needs a key written in [`TimeSource::Client`] mode lives.
///
/// Redis expires keys on its own clock, while a test's client clock may crawl (or stand still,
/// or go back): a state that the client's clock still needs must not vanish because real time
/// went by. Keeping a state after its `expires_at` changes no decision (it then decides like a
/// fresh key), so this only delays the cleanup, in a mode meant for tests.
/// [`TimeSource::Server`] keys get no slack.
pub const CLIENT_TTL_SLACK: Duration = Duration::from_secs(60);

/// The largest client time accepted: 2^52 − 1 µs (the year 2112), the range in which every
/// algorithm stays exact.
pub const MAX_CLIENT_TIME_US: u64 = (1 << 52) - 1;

/// Where a script reads the current time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TimeSource {
    /// Redis' own clock (`TIME`), so that every client is judged by one clock. The default.
    #[default]
    Server,
    /// The given time in µs since the Unix epoch, for deterministic tests. Keys written in this
    /// mode live [`CLIENT_TTL_SLACK`] longer than their state needs. At most
    /// [`MAX_CLIENT_TIME_US`].
    Client(u64),
}

/// One request of a batch for [`decide_all`]: charge `cost` units to the Redis key `redis_key`
/// under `limit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScriptRequest<'a> {
    /// The full Redis key (prefix, hash tag and all) holding the state.
    pub redis_key: &'a [u8],
    /// The limit the key is held to.
    pub limit: Limit,
    /// The units charged if admitted; 0 is a peek.
    pub cost: u64,
}

impl<'a> ScriptRequest<'a> {
    /// A request of `cost` units on `redis_key` under `limit`.
    pub fn new(redis_key: &'a [u8], limit: Limit, cost: u64) -> Self {
        Self {
            redis_key,
            limit,
            cost,
        }
    }
}

/// The algorithms the scripts implement, exhaustively (core's [`Algorithm`] is non-exhaustive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    TokenBucket,
    Gcra,
    FixedWindow,
    SlidingLog,
    SlidingWindow,
}

impl Kind {
    pub(crate) fn of(algorithm: Algorithm) -> Result<Self, Error> {
        match algorithm {
            Algorithm::TokenBucket => Ok(Kind::TokenBucket),
            Algorithm::Gcra => Ok(Kind::Gcra),
            Algorithm::FixedWindow => Ok(Kind::FixedWindow),
            Algorithm::SlidingLog => Ok(Kind::SlidingLog),
            Algorithm::SlidingWindow => Ok(Kind::SlidingWindow),
            other => Err(Error::Config {
                store: STORE,
                message: format!("the Redis scripts do not implement the algorithm {other}"),
            }),
        }
    }

    /// The algorithm's id in the batch script's arguments (and its state's tag byte).
    pub(crate) fn id(self) -> u64 {
        match self {
            Kind::TokenBucket => 1,
            Kind::Gcra => 2,
            Kind::FixedWindow => 3,
            Kind::SlidingLog => 4,
            Kind::SlidingWindow => 5,
        }
    }

    fn index(self) -> usize {
        // Ids are 1..=5.
        (self.id() - 1) as usize
    }
}

/// The parameters the scripts take for `limit`, padded with zeros to four, and how many count.
pub(crate) fn parameters(kind: Kind, limit: &Limit) -> ([u64; 4], usize) {
    let q = limit.quota();
    match kind {
        Kind::TokenBucket => {
            let (rate, unit) = q.refill_units();
            ([q.burst(), rate, unit, 0], 3)
        }
        Kind::Gcra => ([q.burst(), q.emission_interval_us(), 0, 0], 2),
        Kind::FixedWindow | Kind::SlidingLog => ([q.limit(), q.period_us(), 0, 0], 2),
        Kind::SlidingWindow => {
            let (gr, steps) = q.window_granule();
            ([q.limit(), q.period_us(), gr, steps], 4)
        }
    }
}

macro_rules! lua {
    ($file:literal) => {
        include_str!(concat!("scripts/", $file))
    };
}

/// The single-key script of one algorithm: the prelude, the algorithm, and the single-key main
/// bound to it.
macro_rules! single_script {
    ($file:literal, $function:literal) => {
        concat!(
            lua!("prelude.lua"),
            lua!($file),
            "local decide = ",
            $function,
            "\n",
            lua!("single.lua"),
        )
    };
}

const TOKEN_BUCKET_SCRIPT: &str = single_script!("token_bucket.lua", "decide_token_bucket");
const GCRA_SCRIPT: &str = single_script!("gcra.lua", "decide_gcra");
const FIXED_WINDOW_SCRIPT: &str = single_script!("fixed_window.lua", "decide_fixed_window");
const SLIDING_LOG_SCRIPT: &str = single_script!("sliding_log.lua", "decide_sliding_log");
const SLIDING_WINDOW_SCRIPT: &str = single_script!("sliding_window.lua", "decide_sliding_window");
const BATCH_SCRIPT: &str = concat!(
    lua!("prelude.lua"),
    lua!("token_bucket.lua"),
    lua!("gcra.lua"),
    lua!("fixed_window.lua"),
    lua!("sliding_log.lua"),
    lua!("sliding_window.lua"),
    lua!("batch.lua"),
);
const REFUND_SCRIPT: &str = lua!("refund.lua");

/// A script's text and SHA-1.
pub(crate) struct Compiled {
    pub(crate) source: &'static str,
    pub(crate) sha: String,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("sha", &self.sha)
            .finish_non_exhaustive()
    }
}

impl Compiled {
    pub(crate) fn new(source: &'static str) -> Self {
        Self {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }
}

/// Every script, hashed once.
struct Scripts {
    /// Indexed by [`Kind::index`].
    single: [Compiled; 5],
    batch: Compiled,
    /// Gives back what a batch group charged (Cluster batches across slots).
    refund: Compiled,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    single: [
        Compiled::new(TOKEN_BUCKET_SCRIPT),
        Compiled::new(GCRA_SCRIPT),
        Compiled::new(FIXED_WINDOW_SCRIPT),
        Compiled::new(SLIDING_LOG_SCRIPT),
        Compiled::new(SLIDING_WINDOW_SCRIPT),
    ],
    batch: Compiled::new(BATCH_SCRIPT),
    refund: Compiled::new(REFUND_SCRIPT),
});

fn single(kind: Kind) -> &'static Compiled {
    &SCRIPTS.single[kind.index()]
}

/// The text of `algorithm`'s single-key script, as sent with `EVAL` (for inspection, and for
/// `redis-benchmark`). An algorithm the scripts do not implement is an [`Error::Config`].
pub fn script_source(algorithm: Algorithm) -> Result<&'static str, Error> {
    Ok(single(Kind::of(algorithm)?).source)
}

/// The SHA-1 of `algorithm`'s single-key script, as sent with `EVALSHA`.
pub fn script_sha1(algorithm: Algorithm) -> Result<&'static str, Error> {
    Ok(&single(Kind::of(algorithm)?).sha)
}

/// The text of the batch script.
pub fn batch_source() -> &'static str {
    SCRIPTS.batch.source
}

/// The SHA-1 of the batch script.
pub fn batch_sha1() -> &'static str {
    &SCRIPTS.batch.sha
}

/// Loads every script into the server's script cache (`SCRIPT LOAD`), so that the first
/// decisions need no `EVAL`. Optional: [`decide`] and [`decide_all`] load a missing script
/// themselves. It also tells early whether the connection may run scripts at all (an ACL
/// without `EVALSHA` is an [`Error::Config`]). In a Cluster it loads on the node the connection
/// routes `SCRIPT LOAD` to; the other nodes load on first use.
pub async fn load_scripts<C>(conn: &mut C) -> Result<(), Error>
where
    C: ConnectionLike + Send,
{
    for script in SCRIPTS
        .single
        .iter()
        .chain([&SCRIPTS.batch, &SCRIPTS.refund])
    {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script.source)
            .query_async(conn)
            .await
            .map_err(|e| map_error(e, &[]))?;
        if sha != script.sha {
            return Err(protocol(format!(
                "SCRIPT LOAD answered the SHA-1 {sha:?}, expected {}",
                script.sha
            )));
        }
    }
    Ok(())
}

/// Decides one request of `cost` units on the Redis key `redis_key` under `limit`, charging it
/// when admitted: exactly what [`Limit::decide`] answers on the key's state at the time `time`
/// gives. One round trip (two when the server lost the script).
///
/// Errors: a client time above [`MAX_CLIENT_TIME_US`] is an [`Error::InvalidRequest`]; a wrong
/// Redis type or an unreadable value at the key an [`Error::BadState`] (nothing written); a
/// malformed reply an [`Error::Protocol`];
/// connection failures as classified by the driver's error mapping.
pub async fn decide<C>(
    conn: &mut C,
    redis_key: &[u8],
    limit: &Limit,
    cost: u64,
    time: TimeSource,
) -> Result<Decision, Error>
where
    C: ConnectionLike + Send,
{
    let call = Call::single(redis_key, limit, cost, time)?;
    let mut decisions = call.run(conn).await?;
    match (decisions.pop(), decisions.is_empty()) {
        (Some(decision), true) => Ok(decision),
        _ => Err(protocol("expected exactly one decision".to_owned())),
    }
}

/// Decides a batch all-or-nothing: every request is evaluated at one instant, and all are charged
/// only if all are admitted. One decision per request, in order: what that request alone would
/// have been answered, as a peek in a denied batch (see
/// [`Store::decide_all`](distlimit_core::Store::decide_all)). One round
/// trip (two when the server lost the script).
///
/// An empty batch, one above [`MAX_BATCH`] or a Redis key twice is an [`Error::InvalidRequest`];
/// other errors as for [`decide`]. In a Cluster every key must hash to one slot.
pub async fn decide_all<C>(
    conn: &mut C,
    requests: &[ScriptRequest<'_>],
    time: TimeSource,
) -> Result<Vec<Decision>, Error>
where
    C: ConnectionLike + Send,
{
    let call = Call::batch(requests, time, Flags::Commit)?;
    call.run(conn).await
}

/// What a batch call does besides deciding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flags {
    /// Charge if every request is admitted.
    Commit,
    /// Charge if every request is admitted, and answer the time decided at.
    CommitAndTime,
    /// Charge nothing.
    Evaluate,
}

/// [`decide_all`] on one group of a batch that spans Cluster slots: the decisions, and the
/// time (µs, the node's clock or the client's) they were decided at when the group was charged
/// (every request admitted), for [`refund`].
pub(crate) async fn charge_group<C>(
    conn: &mut C,
    requests: &[ScriptRequest<'_>],
    time: TimeSource,
) -> Result<(Vec<Decision>, Option<u64>), Error>
where
    C: ConnectionLike + Send,
{
    let call = Call::batch(requests, time, Flags::CommitAndTime)?;
    let (decisions, at) = call.run_timed(conn).await?;
    let committed = call.args[0] & 1 == 1 && decisions.iter().all(Decision::is_allowed);
    Ok((decisions, at.filter(|_| committed)))
}

/// The decisions of a batch group without charging anything.
pub(crate) async fn evaluate_group<C>(
    conn: &mut C,
    requests: &[ScriptRequest<'_>],
    time: TimeSource,
) -> Result<Vec<Decision>, Error>
where
    C: ConnectionLike + Send,
{
    Call::batch(requests, time, Flags::Evaluate)?
        .run(conn)
        .await
}

/// Gives back what [`charge_group`] charged at `at` on `requests` (see `refund.lua`): never more
/// than the states still owe the charge, so the refunded states never admit more than they
/// would have without it.
pub(crate) async fn refund<C>(
    conn: &mut C,
    requests: &[ScriptRequest<'_>],
    at: u64,
    time: TimeSource,
) -> Result<(), Error>
where
    C: ConnectionLike + Send,
{
    check_time(time)?;
    let mut keys = Vec::with_capacity(requests.len());
    let mut args = Vec::with_capacity(7 * requests.len());
    for r in requests {
        let kind = Kind::of(r.limit.algorithm())?;
        let (params, _) = parameters(kind, &r.limit);
        keys.push(r.redis_key);
        args.extend_from_slice(&[kind.id(), r.cost]);
        args.extend_from_slice(&params);
        args.push(at);
    }
    let call = Call {
        script: &SCRIPTS.refund,
        keys,
        time,
        args,
        expect: Vec::new(),
        time_reply: false,
    };
    let reply = match call.cmd(false).query_async::<Value>(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            call.cmd(true).query_async::<Value>(conn).await
        }
        other => other,
    };
    match reply.map_err(|e| map_error(e, &call.keys))? {
        Value::Int(_) => Ok(()),
        other => Err(protocol(format!(
            "the refund script answered {}, expected an integer",
            describe(&other)
        ))),
    }
}

/// What one request's decision must look like.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expect {
    /// The limit's capacity: the reply's `limit` field.
    capacity: u64,
    /// The cost exceeded the capacity: sent as a peek, answered as a denial with `NEVER`.
    pub(crate) never: bool,
}

impl Expect {
    /// The expectation for `limit` and `cost`, and the cost to send.
    pub(crate) fn new(limit: &Limit, cost: u64) -> (Self, u64) {
        let capacity = limit.capacity();
        let never = cost > capacity;
        (Self { capacity, never }, if never { 0 } else { cost })
    }
}

/// One script call, built and ready to send as `EVALSHA` (or `EVAL`).
#[derive(Debug)]
struct Call<'a> {
    script: &'static Compiled,
    keys: Vec<&'a [u8]>,
    time: TimeSource,
    /// `ARGV[2..]`.
    args: Vec<u64>,
    expect: Vec<Expect>,
    /// The reply ends with the time decided at (a ninth double).
    time_reply: bool,
}

impl<'a> Call<'a> {
    fn single(
        redis_key: &'a [u8],
        limit: &Limit,
        cost: u64,
        time: TimeSource,
    ) -> Result<Self, Error> {
        check_time(time)?;
        let kind = Kind::of(limit.algorithm())?;
        let (expect, cost) = Expect::new(limit, cost);
        let (params, count) = parameters(kind, limit);
        let mut args = Vec::with_capacity(1 + count);
        args.push(cost);
        args.extend_from_slice(&params[..count]);
        Ok(Self {
            script: single(kind),
            keys: vec![redis_key],
            time,
            args,
            expect: vec![expect],
            time_reply: false,
        })
    }

    fn batch(
        requests: &[ScriptRequest<'a>],
        time: TimeSource,
        flags: Flags,
    ) -> Result<Self, Error> {
        check_time(time)?;
        if requests.is_empty() {
            return Err(Error::InvalidRequest("empty batch"));
        }
        if requests.len() > MAX_BATCH {
            return Err(Error::InvalidRequest("batch larger than MAX_BATCH"));
        }
        let mut keys = Vec::with_capacity(requests.len());
        let mut args = Vec::with_capacity(1 + 6 * requests.len());
        let mut expect = Vec::with_capacity(requests.len());
        // Bit 0 commit (cleared below when a request can never pass), bit 1 answer the time.
        args.push(match flags {
            Flags::Commit => 1,
            Flags::CommitAndTime => 3,
            Flags::Evaluate => 0,
        });
        for r in requests {
            if keys.contains(&r.redis_key) {
                return Err(Error::InvalidRequest("the same key twice in one batch"));
            }
            let kind = Kind::of(r.limit.algorithm())?;
            let (e, cost) = Expect::new(&r.limit, r.cost);
            let (params, _) = parameters(kind, &r.limit);
            if e.never {
                args[0] &= !1;
            }
            keys.push(r.redis_key);
            args.extend_from_slice(&[kind.id(), cost]);
            args.extend_from_slice(&params);
            expect.push(e);
        }
        Ok(Self {
            script: &SCRIPTS.batch,
            keys,
            time,
            args,
            expect,
            time_reply: flags == Flags::CommitAndTime,
        })
    }

    /// The command: `EVALSHA sha …`, or with `eval` the fallback `EVAL source …`.
    fn cmd(&self, eval: bool) -> Cmd {
        let mut cmd = if eval {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(self.script.source);
            cmd
        } else {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&self.script.sha);
            cmd
        };
        cmd.arg(self.keys.len());
        for key in &self.keys {
            cmd.arg(*key);
        }
        match self.time {
            TimeSource::Server => cmd.arg(""),
            TimeSource::Client(now) => cmd.arg(now),
        };
        for arg in &self.args {
            cmd.arg(*arg);
        }
        cmd
    }

    async fn run<C>(&self, conn: &mut C) -> Result<Vec<Decision>, Error>
    where
        C: ConnectionLike + Send,
    {
        Ok(self.run_timed(conn).await?.0)
    }

    /// The decisions, and the time decided at when the call asks for it.
    async fn run_timed<C>(&self, conn: &mut C) -> Result<(Vec<Decision>, Option<u64>), Error>
    where
        C: ConnectionLike + Send,
    {
        let reply = match self.cmd(false).query_async::<Value>(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // The script did not run: sending it with its text cannot charge twice.
                self.cmd(true).query_async::<Value>(conn).await
            }
            other => other,
        };
        let reply = reply.map_err(|e| map_error(e, &self.keys))?;
        if !self.time_reply {
            return Ok((parse_reply(reply, &self.expect)?, None));
        }
        // The time decided at, a ninth double after the decisions.
        let Value::BulkString(mut bytes) = reply else {
            return Err(protocol(format!(
                "the script answered {}, expected a string",
                describe(&reply)
            )));
        };
        let Some(split) = bytes.len().checked_sub(8) else {
            return Err(protocol("the script answered no time".to_owned()));
        };
        let at = integer(&bytes[split..])?;
        bytes.truncate(split);
        Ok((
            parse_reply(Value::BulkString(bytes), &self.expect)?,
            Some(at),
        ))
    }
}

pub(crate) fn check_time(time: TimeSource) -> Result<(), Error> {
    match time {
        TimeSource::Client(now) if now > MAX_CLIENT_TIME_US => Err(Error::InvalidRequest(
            "client time beyond 2^52 µs (the year 2112), where the scripts are no longer exact",
        )),
        _ => Ok(()),
    }
}

/// A value at a key of the request that is not a valid state: an error of that request only.
fn bad_state(message: String) -> Error {
    Error::BadState {
        store: STORE,
        message,
    }
}

pub(crate) fn protocol(message: String) -> Error {
    Error::Protocol {
        store: STORE,
        message,
    }
}

/// The bytes of one decision in a reply: five big-endian doubles.
pub(crate) const DECISION_BYTES: usize = 40;

/// Parses a script's reply: `expect.len()` decisions of five doubles each, every one an integer
/// in `[0, 2^53)`, consistent with each other.
fn parse_reply(reply: Value, expect: &[Expect]) -> Result<Vec<Decision>, Error> {
    let want = DECISION_BYTES * expect.len();
    let Value::BulkString(bytes) = reply else {
        return Err(protocol(format!(
            "the script answered {}, expected a string of {want} bytes",
            describe(&reply)
        )));
    };
    if bytes.len() != want {
        return Err(protocol(format!(
            "the script answered {} bytes, expected {want}",
            bytes.len()
        )));
    }
    bytes
        .chunks_exact(DECISION_BYTES)
        .zip(expect)
        .map(|(chunk, e)| parse_decision(chunk, *e))
        .collect()
}

/// An integer in `[0, 2^53)` encoded as a big-endian double.
fn integer(bytes: &[u8]) -> Result<u64, Error> {
    let mut be = [0u8; 8];
    be.copy_from_slice(bytes);
    let x = f64::from_be_bytes(be);
    // 2^53 as a double; every integer below it is exact.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if (0.0..EXACT).contains(&x) && x.fract() == 0.0 {
        // Exact: a non-negative integer below 2^53.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Ok(x as u64)
    } else {
        Err(protocol(format!(
            "the script answered {x}, not an integer in [0, 2^53)"
        )))
    }
}

pub(crate) fn parse_decision(chunk: &[u8], expect: Expect) -> Result<Decision, Error> {
    let mut n = [0u64; 5];
    for (slot, bytes) in n.iter_mut().zip(chunk.chunks_exact(8)) {
        *slot = integer(bytes)?;
    }
    let [allowed, limit, remaining, reset_us, retry_us] = n;
    let bad = |what: &str| {
        Err(protocol(format!(
            "inconsistent decision from the script ({what}): allowed {allowed}, limit {limit}, \
             remaining {remaining}, reset_after {reset_us} µs, retry_after {retry_us} µs"
        )))
    };
    if limit != expect.capacity {
        return bad("limit is not the capacity");
    }
    if remaining > limit {
        return bad("remaining above limit");
    }
    let reset = Duration::from_micros(reset_us);
    match (allowed, retry_us) {
        (1, 0) | (0, 1..) if expect.never => Ok(Decision::denied(limit, remaining, reset, NEVER)),
        (1, 0) => Ok(Decision::allowed(limit, remaining, reset)),
        (0, 1..) => Ok(Decision::denied(
            limit,
            remaining,
            reset,
            Duration::from_micros(retry_us),
        )),
        (0 | 1, _) => bad("retry_after must be 0 exactly when allowed"),
        _ => bad("allowed is neither 0 nor 1"),
    }
}

/// A short description of a reply value for error messages (never the whole value).
pub(crate) fn describe(value: &Value) -> String {
    match value {
        Value::Nil => "nil".to_owned(),
        Value::Int(i) => format!("the integer {i}"),
        Value::BulkString(b) => format!("a string of {} bytes", b.len()),
        Value::Array(a) => format!("an array of {} values", a.len()),
        Value::SimpleString(s) => {
            format!("the status {:?}", s.chars().take(64).collect::<String>())
        }
        Value::Okay => "OK".to_owned(),
        Value::Double(d) => format!("the double {d}"),
        Value::Map(_) | Value::Set(_) | Value::Attribute { .. } | Value::Push { .. } => {
            "an aggregate of another type".to_owned()
        }
        _ => "a value of another type".to_owned(),
    }
}

/// Maps a Redis error to distlimit's [`Error`], classified for circuit breakers:
///
/// * `DISTLIMIT_CORRUPT` (an unreadable state) and `WRONGTYPE` (a key of another Redis type):
///   [`Error::BadState`], an error of this request only, permanent;
/// * replies the client could not parse: [`Error::Protocol`], permanent;
/// * `NOPERM` (an ACL forbids scripts or keys), authentication and client configuration errors:
///   [`Error::Config`], permanent;
/// * I/O errors, dropped or refused connections, and the cluster's and a failover's passing states
///   (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`, `READONLY`):
///   [`Error::Unavailable`], transient;
/// * a response timeout and a busy server (`BUSY`): [`Error::Backend`], transient (a timed-out
///   script may still have run: never retry it blindly);
/// * anything else: [`Error::Backend`], permanent.
///
/// `keys` are the keys of the call, named in the `WRONGTYPE` message.
pub(crate) fn map_error(err: RedisError, keys: &[&[u8]]) -> Error {
    let detail = err.detail().unwrap_or_default().to_owned();
    match err.code() {
        Some("DISTLIMIT_CORRUPT") => {
            return bad_state(format!(
                "corrupt rate-limit state, not decided and left as it is: {detail}"
            ));
        }
        Some("WRONGTYPE") => {
            let names: Vec<String> = keys
                .iter()
                .map(|k| format!("\"{}\"", k.escape_ascii()))
                .collect();
            return bad_state(format!(
                "WRONGTYPE: a key of this request ({}) holds a Redis value of another type, \
                 not a distlimit state; not decided and left as it is",
                names.join(", ")
            ));
        }
        Some("NOPERM") => {
            return Error::Config {
                store: STORE,
                message: format!(
                    "the Redis user may not run the distlimit scripts on these keys (NOPERM): \
                     {detail}"
                ),
            };
        }
        Some("BUSY") => {
            return Error::Backend {
                store: STORE,
                transient: true,
                source: Box::new(err),
            };
        }
        _ => {}
    }
    if err.is_timeout() {
        return Error::Backend {
            store: STORE,
            transient: true,
            source: Box::new(err),
        };
    }
    if err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_cluster_error()
    {
        return Error::Unavailable {
            store: STORE,
            source: Box::new(err),
        };
    }
    match err.kind() {
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask,
        ) => Error::Unavailable {
            store: STORE,
            source: Box::new(err),
        },
        ErrorKind::Server(ServerErrorKind::NoPerm)
        | ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig => Error::Config {
            store: STORE,
            message: err.to_string(),
        },
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
            protocol(format!("unreadable reply: {err}"))
        }
        _ => Error::Backend {
            store: STORE,
            transient: false,
            source: Box::new(err),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlimit_core::Quota;

    /// A reply of doubles, as the scripts send it.
    fn doubles(values: &[f64]) -> Value {
        Value::BulkString(values.iter().flat_map(|v| v.to_be_bytes()).collect())
    }

    fn ints(values: &[i64]) -> Value {
        doubles(&values.iter().map(|&i| i as f64).collect::<Vec<_>>())
    }

    const E: Expect = Expect {
        capacity: 10,
        never: false,
    };

    #[test]
    fn every_script_is_built_from_its_parts() {
        for algorithm in Algorithm::ALL {
            let source = script_source(algorithm).unwrap();
            assert!(source.starts_with(lua!("prelude.lua")));
            assert!(source.ends_with(lua!("single.lua")));
            assert!(source.contains(&format!("local decide = decide_{}\n", algorithm.name())));
            assert_eq!(script_sha1(algorithm).unwrap().len(), 40);
        }
        for name in [
            "token_bucket",
            "gcra",
            "fixed_window",
            "sliding_log",
            "sliding_window",
        ] {
            assert!(batch_source().contains(&format!("local function decide_{name}(")));
        }
        assert!(!batch_source().contains("replicate_commands"));
    }

    #[test]
    fn parses_allowed_and_denied() {
        let d = parse_reply(ints(&[1, 10, 7, 300, 0]), &[E]).unwrap();
        assert_eq!(
            d,
            vec![Decision::allowed(10, 7, Duration::from_micros(300))]
        );
        let top = (1i64 << 53) - 1;
        let d = parse_reply(ints(&[1, 10, 7, top, 0]), &[E]).unwrap();
        assert_eq!(d[0].reset_after(), Duration::from_micros(top as u64));
        let d = parse_reply(ints(&[0, 10, 0, 300, 25, 1, 10, 3, 0, 0]), &[E, E]).unwrap();
        assert_eq!(
            d,
            vec![
                Decision::denied(10, 0, Duration::from_micros(300), Duration::from_micros(25)),
                Decision::allowed(10, 3, Duration::ZERO),
            ]
        );
    }

    #[test]
    fn a_cost_above_capacity_is_never() {
        let never = Expect {
            capacity: 10,
            never: true,
        };
        for reply in [[1, 10, 4, 50, 0], [0, 10, 0, 50, 7]] {
            let d = parse_reply(ints(&reply), &[never]).unwrap();
            assert!(d[0].is_never() && d[0].is_denied(), "{d:?}");
            assert_eq!(d[0].remaining(), reply[2] as u64);
            assert_eq!(d[0].reset_after(), Duration::from_micros(50));
        }
    }

    #[test]
    fn rejects_malformed_replies() {
        let bad = [
            Value::Nil,
            Value::Okay,
            Value::Int(1),
            Value::Array(vec![Value::Int(1); 5]),
            Value::BulkString(b"1 10 7 300 0".to_vec()),
            Value::BulkString(Vec::new()),
            ints(&[1, 10, 7, 300]),
            ints(&[1, 10, 7, 300, 0, 0]),
            Value::BulkString([[0u8; 40].as_slice(), &[0]].concat()),
            ints(&[1, 10, -7, 300, 0]),
            ints(&[-1, 10, 7, 300, 0]),
            ints(&[2, 10, 7, 300, 0]),
            ints(&[1, 11, 7, 300, 0]),
            ints(&[1, 10, 11, 300, 0]),
            ints(&[1, 10, 7, 300, 5]),
            ints(&[0, 10, 7, 300, 0]),
            doubles(&[1.0, 10.0, 7.5, 300.0, 0.0]),
            doubles(&[1.0, 10.0, 7.0, f64::NAN, 0.0]),
            doubles(&[1.0, 10.0, 7.0, f64::INFINITY, 0.0]),
            doubles(&[1.0, 10.0, 7.0, 9_007_199_254_740_992.0, 0.0]),
            doubles(&[1.0, 10.0, -0.5, 300.0, 0.0]),
        ];
        for reply in bad {
            let shown = format!("{reply:?}");
            match parse_reply(reply, &[E]) {
                Err(Error::Protocol { .. }) => {}
                other => panic!("{shown}: expected a protocol error, got {other:?}"),
            }
        }
        assert!(matches!(
            parse_reply(ints(&[1, 10, 7, 300, 0]), &[E, E]),
            Err(Error::Protocol { .. })
        ));
    }

    #[test]
    fn arguments_are_the_quota_parameters() {
        let q = Quota::from_parts(3, 1_000_000, 5).unwrap();
        let key = b"k".as_slice();
        let call = Call::single(key, &Limit::token_bucket(q), 2, TimeSource::Client(7)).unwrap();
        assert_eq!(call.args, [2, 5, 3, 1_000_000]);
        let call = Call::single(key, &Limit::gcra(q), 6, TimeSource::Server).unwrap();
        // Cost 6 > burst 5: sent as a peek.
        assert_eq!(call.args, [0, 5, 333_334]);
        assert!(call.expect[0].never);
        let q = Quota::per_hour(10).unwrap();
        let call = Call::single(key, &Limit::sliding_window(q), 1, TimeSource::Server).unwrap();
        assert_eq!(call.args, [1, 10, 3_600_000_000, 3_434, 1_048_341]);
        let call = Call::batch(
            &[
                ScriptRequest::new(b"a", Limit::fixed_window(q), 1),
                ScriptRequest::new(b"b", Limit::sliding_log(q), 11),
            ],
            TimeSource::Server,
            Flags::Commit,
        )
        .unwrap();
        assert_eq!(
            call.args,
            [
                0,
                3,
                1,
                10,
                3_600_000_000,
                0,
                0,
                4,
                0,
                10,
                3_600_000_000,
                0,
                0
            ]
        );
    }

    #[test]
    fn rejects_invalid_calls() {
        let limit = Limit::gcra(Quota::per_second(1).unwrap());
        assert!(matches!(
            Call::single(b"k", &limit, 1, TimeSource::Client(1 << 52)),
            Err(Error::InvalidRequest(_))
        ));
        assert!(Call::single(b"k", &limit, 1, TimeSource::Client(MAX_CLIENT_TIME_US)).is_ok());
        assert!(matches!(
            Call::batch(&[], TimeSource::Server, Flags::Commit),
            Err(Error::InvalidRequest(_))
        ));
        let twice = [
            ScriptRequest::new(b"k", limit, 1),
            ScriptRequest::new(b"k", limit, 1),
        ];
        assert!(matches!(
            Call::batch(&twice, TimeSource::Server, Flags::Commit),
            Err(Error::InvalidRequest(_))
        ));
        let keys: Vec<Vec<u8>> = (0..=MAX_BATCH).map(|i| vec![i as u8 + 1]).collect();
        let many: Vec<ScriptRequest<'_>> = keys
            .iter()
            .map(|k| ScriptRequest::new(k, limit, 1))
            .collect();
        assert!(matches!(
            Call::batch(&many, TimeSource::Server, Flags::Commit),
            Err(Error::InvalidRequest(_))
        ));
        assert!(Call::batch(&many[..MAX_BATCH], TimeSource::Server, Flags::Commit).is_ok());
    }

    #[test]
    fn maps_errors() {
        let corrupt = redis::make_extension_error(
            "DISTLIMIT_CORRUPT".to_owned(),
            Some("unreadable gcra state at key k".to_owned()),
        );
        match map_error(corrupt, &[b"k"]) {
            Error::BadState { message, .. } => assert!(message.contains("corrupt"), "{message}"),
            other => panic!("{other:?}"),
        }
        let wrong = redis::make_extension_error("WRONGTYPE".to_owned(), None);
        match map_error(wrong, &[b"a\nb"]) {
            Error::BadState { message, .. } => {
                assert!(
                    message.contains("WRONGTYPE") && message.contains("a\\nb"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        let noperm = redis::make_extension_error("NOPERM".to_owned(), None);
        assert!(matches!(map_error(noperm, &[]), Error::Config { .. }));
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        let e = map_error(io, &[]);
        assert!(e.is_transient(), "{e:?}");
    }
}
