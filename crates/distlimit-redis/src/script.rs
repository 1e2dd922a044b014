//! The Lua: one entry script, one call shape, one invoke helper, bit-identical to
//! [`Limit::decide`].
//!
//! Every store call is one round trip running the entry script inside Redis, so concurrent
//! requests on a key (from any number of connections, processes or hosts) are serialized by Redis
//! itself. The script translates the reference model of `distlimit-core` line by line, on the
//! same integer microseconds and units: for a valid [`Quota`](distlimit_core::Quota) and times
//! below 2^52 µs every intermediate value stays below 2^53, where Lua's doubles are exact, so
//! Redis answers exactly what [`Limit::decide`] answers (the `differential` test compares them
//! step by step).
//!
//! # The call
//!
//! A call ([`Call`]) carries one or more [`Group`]s, each decided alone, in order, each one
//! [`Op`]: one request (`GET`, at most one `SET`), an all-or-nothing batch of up to
//! [`MAX_BATCH`] (evaluated first without writing, written only if all are admitted; in a
//! Cluster one slot's keys, see the crate documentation, "Batches across Cluster slots"), a
//! refund, a lease exchange, a pool step, a permit's action or a settling.
//!
//! A store call is a call with one group; the coalescer (`coalesce.rs`) packs the groups of
//! several waiting callers into the same shape. So Redis receives one encoding whatever the
//! load, and a group is decided the same way alone or packed with others.
//!
//! `Call::run` is the one place a call is sent: `EVALSHA` and, on `NOSCRIPT` (a restart, a
//! failover, `SCRIPT FLUSH`: the script did not run, so this cannot charge twice), the same call
//! once more as `EVAL`, which also caches it again; nothing else is retried. (Why not
//! `redis::Script`: ARCHITECTURE.md, "Decisions and their reasons"; its keyless `SCRIPT LOAD`
//! would also need wrapping in the `ASK` path here.)
//!
//! A request whose cost exceeds the capacity never reaches Lua with that cost: it is sent as a
//! peek (cost 0, which reads the state and writes nothing) and answered as a denial with
//! `retry_after` = [`NEVER`], with the `remaining` and `reset_after` the model gives it. In a batch
//! such a request makes the batch fail, so the batch is sent without charging.
//!
//! # Time
//!
//! Each group carries its [`TimeSource`]. Redis 7 replicates a script's effects, not the script,
//! so reading `TIME` inside it before writing is safe.
//!
//! # Arguments
//!
//! `KEYS` are every group's keys in turn; `ARGV[1]` is one string of big-endian IEEE-754 doubles
//! holding integers below 2^53, laid out field by field in `entry.lua`. A limit is its
//! algorithm's id and four parameter slots, computed in Rust, so the script does no gcd:
//!
//! | algorithm | id | parameters |
//! |---|---|---|
//! | token bucket | 1 | `burst`, `L'`, `P'` ([`Quota::refill_units`](distlimit_core::Quota::refill_units)) |
//! | GCRA | 2 | `burst`, `T = ⌈period / limit⌉` µs ([`Quota::emission_interval_us`](distlimit_core::Quota::emission_interval_us)) |
//! | fixed window | 3 | `limit`, `period` µs |
//! | sliding log | 4 | `limit`, `period` µs |
//! | sliding window | 5 | `limit`, `period` µs, `gr`, `steps` ([`Quota::window_granule`](distlimit_core::Quota::window_granule)) |
//!
//! The encoding has no bound of its own: no Lua `unpack` of a list, one `struct.unpack` per
//! record, so a batch of any length (and a coalesced call of any number of groups) decodes alike.
//!
//! # Reply
//!
//! One string: per group a status byte and its payload (`entry.lua`); a decision is five doubles,
//! `allowed` (1 or 0), `limit`, `remaining`, `reset_after` µs, `retry_after` µs. A string rather
//! than an array of integers because Redis 7.0 converts a Lua array into a reply for about
//! 0.45 µs, a tenth of a decision's cost inside Redis, and a string for next to nothing. It is
//! parsed strictly: a reply of another type or length, a value that is not an integer in
//! `[0, 2^53)`, or fields that contradict each other are an [`Error::Protocol`].
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
//! is read with. A refund gives back only to a state stamped with the charge's parameters, and
//! keeps the stamp.
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
//! Every write is `SET key value PXAT t` with `t` the call's `TIME` in ms, rounded up, plus
//! `⌈reset_after / 1000⌉` ms, where `reset_after` is that of the admitted decision,
//! `State::expires_at − now`: a key disappears once it would decide like a fresh one, never
//! earlier. Peeks and denials write nothing and leave the TTL as it was. Expiry instants are the
//! server's, so they hold whatever the client's clock says. In [`TimeSource::Client`] mode keys
//! live [`CLIENT_TTL_SLACK`] longer.
//!
//! # Sources
//!
//! The Lua lives in `src/scripts/`, each piece written once: `prelude.lua` (shared constants
//! and the one helper, for unreadable values), one file per algorithm defining
//! `decide_<algorithm>`, `algorithms.lua` (their table and the general path's helpers),
//! `refund.lua`, `lease.lua`, `pool.lua`, `permit.lua` and `settle.lua` (one function each), and
//! the main in two parts, `entry.lua` (the call of one request alone, the common one) and
//! `entry_groups.lua` (the general path), put together at compile time (`concat!(include_str!(…))`;
//! each algorithm's file a second time inside `one_algorithm`: see `entry.lua` for why).

use std::sync::LazyLock;
use std::time::Duration;

use distlimit_core::{
    Algorithm, Decision, Error, Grant, Limit, MAX_BATCH, MAX_REPORT, NEVER, PermitDecision,
    PermitId, PermitLimit,
};
use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, ServerErrorKind, Value};

use crate::config::{STORE, config_error};
use crate::durable::Durable;

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

/// A limit as the scripts take it: its algorithm's id (its state's tag byte), then its quota
/// parameters, padded with zeros to four. An algorithm the scripts do not implement (core's
/// [`Algorithm`] is non-exhaustive) is an [`Error::Config`].
fn row(limit: &Limit) -> Result<[u64; 5], Error> {
    let q = limit.quota();
    Ok(match limit.algorithm() {
        Algorithm::TokenBucket => {
            let (rate, unit) = q.refill_units();
            [1, q.burst(), rate, unit, 0]
        }
        Algorithm::Gcra => [2, q.burst(), q.emission_interval_us(), 0, 0],
        Algorithm::FixedWindow => [3, q.limit(), q.period_us(), 0, 0],
        Algorithm::SlidingLog => [4, q.limit(), q.period_us(), 0, 0],
        Algorithm::SlidingWindow => {
            let (gr, steps) = q.window_granule();
            [5, q.limit(), q.period_us(), gr, steps]
        }
        other => {
            return Err(config_error(format!(
                "the Redis scripts do not implement the algorithm {other}"
            )));
        }
    })
}

/// What one request's decision must look like.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expect {
    /// The limit's capacity: the reply's `limit` field.
    capacity: u64,
    /// The cost exceeded the capacity: sent as a peek, answered as a denial with `NEVER`.
    pub(crate) never: bool,
}

/// The text of the entry script, as sent with `EVAL`, put together as the module documentation's
/// "Sources" says.
pub const ENTRY_SCRIPT: &str = concat!(
    include_str!("scripts/prelude.lua"),
    "-- One algorithm's decision function, built alone: for the call of one request.\n",
    "local function one_algorithm(a)\nif a == 1 then\n",
    include_str!("scripts/token_bucket.lua"),
    "return decide_token_bucket\nelseif a == 2 then\n",
    include_str!("scripts/gcra.lua"),
    "return decide_gcra\nelseif a == 3 then\n",
    include_str!("scripts/fixed_window.lua"),
    "return decide_fixed_window\nelseif a == 4 then\n",
    include_str!("scripts/sliding_log.lua"),
    "return decide_sliding_log\nelseif a == 5 then\n",
    include_str!("scripts/sliding_window.lua"),
    "return decide_sliding_window\nend\nend\n",
    include_str!("scripts/entry.lua"),
    include_str!("scripts/token_bucket.lua"),
    include_str!("scripts/gcra.lua"),
    include_str!("scripts/fixed_window.lua"),
    include_str!("scripts/sliding_log.lua"),
    include_str!("scripts/sliding_window.lua"),
    include_str!("scripts/algorithms.lua"),
    include_str!("scripts/refund.lua"),
    include_str!("scripts/lease.lua"),
    include_str!("scripts/pool.lua"),
    include_str!("scripts/permit.lua"),
    include_str!("scripts/settle.lua"),
    include_str!("scripts/entry_groups.lua"),
);

/// The entry script's SHA-1, as `EVALSHA` names it.
pub static ENTRY_SHA: LazyLock<String> =
    LazyLock::new(|| redis::Script::new(ENTRY_SCRIPT).get_hash().to_owned());

/// `ARGV[1]` of a call of one request of `cost` units under `limit` (for tools that send the
/// script themselves, such as `redis-benchmark`).
pub fn single_argument(limit: &Limit, cost: u64, time: TimeSource) -> Result<Vec<u8>, Error> {
    let group = Group::single(b"", limit, cost, time)?;
    Ok(Call::new(vec![&group]).arguments())
}

/// The most units one lease exchange gives back (exact as a Lua number); the script caps them
/// at the burst of the key's state.
const MAX_GIVE_BACK: u64 = 1 << 52;

/// Loads the entry script into the server's script cache (`SCRIPT LOAD`) unless it is there:
/// optional, a call loads a missing script itself (when and why: `Backend::preload`).
pub async fn load_scripts(conn: &mut (impl ConnectionLike + Send)) -> Result<(), Error> {
    // Asked first, in a small command: a server that wants authentication answers it with
    // `NOAUTH`, while it refuses a command as large as the script from an unauthenticated client
    // with a protocol error.
    let exists: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(ENTRY_SHA.as_str())
        .query_async(conn)
        .await
        .map_err(|e| map_error(e, &[]))?;
    if exists == [1] {
        return Ok(());
    }
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(ENTRY_SCRIPT)
        .query_async(conn)
        .await
        .map_err(|e| map_error(e, &[]))?;
    if sha != *ENTRY_SHA {
        return Err(protocol(format!(
            "SCRIPT LOAD answered the SHA-1 {sha:?}, expected {}",
            *ENTRY_SHA
        )));
    }
    Ok(())
}

/// What a batch does with its requests (op codes 1 to 3 in `entry.lua`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Batch {
    /// Evaluated without charging.
    Evaluate = 1,
    /// Charged if every request is admitted.
    Commit = 2,
    /// As [`Batch::Commit`], answering the time decided at too (for a later refund).
    CommitTimed = 3,
}

/// What a group does: its op, with the data of the op that is not per request. Each concern of
/// an op (its code and values in `ARGV[1]`, its reply's length and decoding, whether it writes
/// and whether its answer must be durable) is one `match` in one function of [`Group`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// One request, charged when admitted (a state carried over is written even when denied).
    One,
    /// An all-or-nothing batch.
    Batch(Batch),
    /// Gives back what a [`Batch::CommitTimed`] group charged at `at` (µs).
    Refund { at: u64 },
    /// A lease exchange: give back unspent units, then take up to the units wanted.
    Lease { give_back: u64, want: u64 },
    /// A step of a regional pool (`pool.lua`, `region.rs`), values capped below 2^53.
    Pool(PoolParams, PoolAction),
    /// A concurrency permit's action on a permit under a limit (see `permit.lua`).
    Permit(PermitAction, PermitId, PermitLimit),
    /// Reports and give-backs, every one applied (`settle.lua`): per request, whether it is a
    /// report, and its units.
    Settle(Vec<(bool, u64)>),
}

/// A regional pool's parameters (see `pool.lua`): how long deposited units stay before they
/// are due home, the most units it aims at, how long a refill may take before another instance
/// may claim one, the pool key's time to live after each write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolParams {
    pub(crate) horizon_us: u64,
    pub(crate) capacity: u64,
    pub(crate) claim_us: u64,
    pub(crate) keep_ms: u64,
}

/// A pool step's action (see `pool.lua`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PoolAction {
    /// Give back `back` units, then take `want` if at least `min` of them are there.
    Spend { back: u64, want: u64, min: u64 },
    /// A refill's answer: home granted `units` (`ok`; none: nothing there for `wait_us`), or
    /// failed (no claim for `wait_us`).
    Deposit { units: u64, wait_us: u64, ok: bool },
}

/// A pool step's reply (see `pool.lua`): the units taken, the units left, the claimed refill's
/// units to give back home and to ask for (both 0: no claim), until when (µs) home had nothing,
/// whether the last refill failed, the step's time (µs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PoolReply {
    pub(crate) granted: u64,
    pub(crate) units: u64,
    pub(crate) back: u64,
    pub(crate) want: u64,
    pub(crate) denied_until: u64,
    pub(crate) failing: bool,
    pub(crate) now: u64,
}

/// A group's answer, typed by its op.
#[derive(Debug)]
pub(crate) enum Answer {
    /// One decision per request (none for a refund), and for [`Batch::CommitTimed`] the time
    /// (µs) the group was decided at, when it was charged.
    Decisions(Vec<Decision>, Option<u64>),
    /// A lease exchange's grant.
    Lease(Grant),
    /// A pool step's reply.
    Pool(PoolReply),
    /// A permit's reply: allowed when an acquire was admitted or the permit was live.
    Permit(PermitDecision),
}

/// What a permit group does (its action in `permit.lua`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PermitAction {
    Acquire = 0,
    Release = 1,
    Renew = 2,
}

impl Answer {
    fn mismatch(self) -> Error {
        protocol(format!("a group answered a reply of another op: {self:?}"))
    }

    /// The decisions, and a timed commit's time.
    pub(crate) fn charged(self) -> Result<(Vec<Decision>, Option<u64>), Error> {
        match self {
            Answer::Decisions(decisions, at) => Ok((decisions, at)),
            other => Err(other.mismatch()),
        }
    }

    /// The decisions.
    pub(crate) fn decisions(self) -> Result<Vec<Decision>, Error> {
        Ok(self.charged()?.0)
    }

    /// The one decision of a single request.
    pub(crate) fn decision(self) -> Result<Decision, Error> {
        match self.decisions()?.as_slice() {
            [decision] => Ok(*decision),
            _ => Err(protocol("expected exactly one decision".to_owned())),
        }
    }

    /// A lease exchange's grant.
    pub(crate) fn lease(self) -> Result<Grant, Error> {
        match self {
            Answer::Lease(grant) => Ok(grant),
            other => Err(other.mismatch()),
        }
    }

    /// A pool step's reply.
    pub(crate) fn pool(self) -> Result<PoolReply, Error> {
        match self {
            Answer::Pool(reply) => Ok(reply),
            other => Err(other.mismatch()),
        }
    }

    /// A permit's reply.
    pub(crate) fn permit(self) -> Result<PermitDecision, Error> {
        match self {
            Answer::Permit(reply) => Ok(reply),
            other => Err(other.mismatch()),
        }
    }
}

/// The doubles of a pool step's reply.
pub const POOL_REPLY: usize = 7;

/// A rate-limit request as sent (limit: algorithm id, four parameters), and its expectation.
#[derive(Clone, Copy, Debug)]
struct Entry {
    row: [u64; 5],
    cost: u64,
    expect: Expect,
}

/// One group of a call, owned (it may wait in the coalescer's queue).
#[derive(Debug)]
pub(crate) struct Group {
    /// The Redis keys, one after the other; `ends[j]` is where key `j` ends.
    keys: Vec<u8>,
    ends: Vec<usize>,
    time: TimeSource,
    op: Op,
    /// Per key of a rate-limit op: its request (none for a pool step or a permit).
    entries: Vec<Entry>,
}

impl Group {
    fn with_capacity(time: TimeSource, op: Op, keys: usize, n: usize) -> Result<Self, Error> {
        if let TimeSource::Client(now) = time
            && now > MAX_CLIENT_TIME_US
        {
            return Err(Error::InvalidRequest(
                "client time beyond 2^52 µs (the year 2112), where the scripts are no longer exact",
            ));
        }
        Ok(Group {
            keys: Vec::with_capacity(keys),
            ends: Vec::with_capacity(n),
            time,
            op,
            entries: Vec::with_capacity(n),
        })
    }

    /// One request of `cost` units on `redis_key` under `limit`, charged when admitted.
    pub(crate) fn single(
        redis_key: &[u8],
        limit: &Limit,
        cost: u64,
        time: TimeSource,
    ) -> Result<Self, Error> {
        let request = ScriptRequest::new(redis_key, *limit, cost);
        Group::of(&[request], time, Op::One)
    }

    /// Not empty, at most [`MAX_BATCH`], no Redis key twice; else an [`Error::InvalidRequest`].
    fn check_batch(requests: &[ScriptRequest<'_>]) -> Result<(), Error> {
        if requests.is_empty() {
            return Err(Error::InvalidRequest("empty batch"));
        }
        if requests.len() > MAX_BATCH {
            return Err(Error::InvalidRequest("batch larger than MAX_BATCH"));
        }
        for (i, r) in requests.iter().enumerate() {
            if requests[..i].iter().any(|o| o.redis_key == r.redis_key) {
                return Err(Error::InvalidRequest("the same key twice in one batch"));
            }
        }
        Ok(())
    }

    /// A group of `op` over `requests`.
    fn of(requests: &[ScriptRequest<'_>], time: TimeSource, op: Op) -> Result<Self, Error> {
        let bytes = requests.iter().map(|r| r.redis_key.len()).sum();
        let mut group = Group::with_capacity(time, op, bytes, requests.len())?;
        for r in requests {
            let (row, capacity) = (row(&r.limit)?, r.limit.capacity());
            let never = r.cost > capacity;
            let cost = if never { 0 } else { r.cost };
            let expect = Expect { capacity, never };
            group.keys.extend_from_slice(r.redis_key);
            group.ends.push(group.keys.len());
            group.entries.push(Entry { row, cost, expect });
        }
        Ok(group)
    }

    /// An all-or-nothing batch (a batch holding a cost above its capacity is only evaluated).
    /// An empty batch, one above [`MAX_BATCH`] or a Redis key twice is an
    /// [`Error::InvalidRequest`].
    pub(crate) fn batch(
        requests: &[ScriptRequest<'_>],
        time: TimeSource,
        batch: Batch,
    ) -> Result<Self, Error> {
        Group::check_batch(requests)?;
        let mut group = Group::of(requests, time, Op::Batch(batch))?;
        if group.entries.iter().any(|e| e.expect.never) {
            group.op = Op::Batch(Batch::Evaluate);
        }
        Ok(group)
    }

    /// Gives back what a [`Batch::CommitTimed`] group of `requests` charged at `at` (see
    /// `refund.lua`): never more than the states still owe the charge, so the refunded states
    /// never admit more than they would have without it.
    pub(crate) fn refund(
        requests: &[ScriptRequest<'_>],
        at: u64,
        time: TimeSource,
    ) -> Result<Self, Error> {
        let at = at.min(MAX_CLIENT_TIME_US);
        Group::of(requests, time, Op::Refund { at })
    }

    /// A lease exchange on `redis_key`: give back `give_back` units, then take up to `want`
    /// (see `lease.lua`). A limit other than the token bucket and GCRA is an error.
    pub(crate) fn lease(
        redis_key: &[u8],
        limit: &Limit,
        give_back: u64,
        want: u64,
        time: TimeSource,
    ) -> Result<Self, Error> {
        limit.check_lease()?;
        // `want` at most the capacity, and the units given back at most 2^52 (the script caps
        // them at the burst of the quota their state was written under, which may differ from
        // this one after a limit change), so every product in the script stays below 2^53.
        let op = Op::Lease {
            give_back: give_back.min(MAX_GIVE_BACK),
            want: want.min(limit.capacity()),
        };
        Group::of(&[ScriptRequest::new(redis_key, *limit, 0)], time, op)
    }

    /// A group of `op` on the one key `redis_key ‖ suffix`: a pool step or a permit's action.
    pub(crate) fn keyed(
        redis_key: &[u8],
        suffix: &[u8],
        op: Op,
        time: TimeSource,
    ) -> Result<Self, Error> {
        let mut group = Group::with_capacity(time, op, redis_key.len() + suffix.len(), 1)?;
        group.keys.extend_from_slice(redis_key);
        group.keys.extend_from_slice(suffix);
        group.ends.push(group.keys.len());
        Ok(group)
    }

    /// Reports and give-backs (`reports[j]`: whether `requests[j]` is a report), every one
    /// applied in order, each answered by the peek after it (see `settle.lua`). The token bucket
    /// and GCRA only, costs of at most [`MAX_REPORT`]; an empty batch, one above [`MAX_BATCH`]
    /// or a Redis key twice is an [`Error::InvalidRequest`].
    pub(crate) fn settle(
        requests: &[ScriptRequest<'_>],
        reports: &[bool],
        time: TimeSource,
    ) -> Result<Self, Error> {
        if requests.len() != reports.len() {
            return Err(Error::InvalidRequest("one report flag per settled request"));
        }
        Group::check_batch(requests)?;
        // The units go among the op's values; each request is sent as a peek would be.
        let (mut units, mut peeks) = (Vec::with_capacity(reports.len()), Vec::new());
        for (r, &report) in requests.iter().zip(reports) {
            r.limit.check_debt()?;
            if r.cost > MAX_REPORT {
                return Err(Error::InvalidRequest(
                    "a report or give-back above MAX_REPORT units",
                ));
            }
            units.push((report, r.cost));
            peeks.push(ScriptRequest { cost: 0, ..*r });
        }
        Group::of(&peeks, time, Op::Settle(units))
    }

    /// The op's code in `entry.lua`; `put` is given per request its limit and its values.
    fn encode(&self, mut put: impl FnMut([u64; 5], &[u64])) -> u64 {
        let entries = self.entries.iter();
        match &self.op {
            Op::One => {
                entries.for_each(|e| put(e.row, &[e.cost]));
                0
            }
            Op::Batch(batch) => {
                entries.for_each(|e| put(e.row, &[e.cost]));
                *batch as u64
            }
            Op::Refund { at } => {
                entries.for_each(|e| put(e.row, &[e.cost, *at]));
                4
            }
            Op::Lease { give_back, want } => {
                entries.for_each(|e| put(e.row, &[*give_back, *want]));
                5
            }
            Op::Pool(p, action) => {
                // Algorithm 0: no rate algorithm; the limit's slots hold the pool's parameters.
                let limit = [0, p.horizon_us, p.capacity, p.claim_us, p.keep_ms];
                let values = match *action {
                    PoolAction::Spend { back, want, min } => [1, back, want, min],
                    PoolAction::Deposit { units, wait_us, ok } => {
                        [2, units, wait_us, u64::from(ok)]
                    }
                };
                let capped = |v: u64| v.min(MAX_CLIENT_TIME_US);
                put(limit.map(capped), &values.map(capped));
                6
            }
            Op::Permit(action, id, limit) => {
                // Algorithm 0: the limit's slots hold max in flight and the lease.
                let max = u64::from(limit.max_in_flight());
                put(
                    [0, max, limit.lease_us(), 0, 0],
                    &[id.get(), *action as u64],
                );
                7
            }
            Op::Settle(reports) => {
                // 1 a report, 2 a give-back.
                for (e, &(report, units)) in entries.zip(reports) {
                    put(e.row, &[units, 2 - u64::from(report)]);
                }
                8
            }
        }
    }

    /// Whether `answer` (this group's) admitted units: a charged request, or a lease granted.
    /// Only such an answer needs its write on replicas; losing any other write (a denial's carried
    /// state, a refund, units given back) can only under-admit.
    pub(crate) fn admitted(&self, answer: &Answer) -> bool {
        match (&self.op, answer) {
            (Op::Lease { .. }, Answer::Lease(grant)) => grant.granted > 0,
            // A pool step may spend units of the region's pool: held to `WAIT` like an admission.
            (Op::Pool(..), _) => true,
            // An acquired or renewed permit holds a place until its expiry: held to `WAIT` like
            // an admission (lost, the place would be handed out again while its request runs).
            // A lost release only makes the place wait for its expiry.
            (Op::Permit(action, ..), Answer::Permit(d)) => {
                d.is_allowed() && *action != PermitAction::Release
            }
            // A report is usage charged: lost to a failover, the key would admit it again.
            (Op::Settle(reports), _) => reports.iter().any(|&(report, _)| report),
            (Op::One | Op::Batch(Batch::Commit | Batch::CommitTimed), Answer::Decisions(d, _)) => d
                .iter()
                .zip(&self.entries)
                .any(|(d, e)| d.is_allowed() && e.cost > 0),
            _ => false,
        }
    }

    /// Whether the group may write: every op but a batch only evaluated, or only peeks.
    fn writes(&self) -> bool {
        match self.op {
            Op::Batch(Batch::Evaluate) => false,
            Op::One | Op::Batch(_) => self.entries.iter().any(|e| e.cost > 0),
            _ => true,
        }
    }

    /// The number of requests (decisions, or keys of a refund).
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// About what the group adds to a call, in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.keys.len() + 24 * (self.len() + 1)
    }

    /// The first key (for the hash slot of the group).
    pub(crate) fn first_key(&self) -> &[u8] {
        &self.keys[..self.ends.first().copied().unwrap_or(0)]
    }

    fn key_slices(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let key = &self.keys[start..end];
            start = end;
            key
        })
    }

    /// The bytes of the group's answer in a reply.
    fn reply_len(&self) -> usize {
        match self.op {
            Op::Refund { .. } => 0,
            Op::Lease { .. } => 8 + DECISION_BYTES,
            Op::Pool(..) => 8 * POOL_REPLY,
            Op::Permit(..) => DECISION_BYTES,
            Op::Batch(Batch::CommitTimed) => DECISION_BYTES * self.len() + 8,
            Op::One | Op::Batch(_) | Op::Settle(_) => DECISION_BYTES * self.len(),
        }
    }

    /// Reads the group's answer from its part of the reply (`reply_len` bytes).
    fn answer(&self, part: &[u8]) -> Result<Answer, Error> {
        match &self.op {
            Op::Refund { .. } => Ok(Answer::Decisions(Vec::new(), None)),
            Op::Pool(..) => {
                let [granted, units, back, want, denied_until, failing, now] = integers(part)?;
                let failing = failing != 0;
                Ok(Answer::Pool(PoolReply {
                    granted,
                    units,
                    back,
                    want,
                    denied_until,
                    failing,
                    now,
                }))
            }
            Op::Permit(action, sent_id, limit) => {
                let [ok, id, in_flight, retry_after_us, expired] = integers(part)?;
                let (sent, max_u32) = (sent_id.get(), limit.max_in_flight());
                let max = u64::from(max_u32);
                let acquire = *action == PermitAction::Acquire;
                let consistent = ok <= 1
                    && id == sent
                    && (ok == 1 || !acquire || in_flight >= max)
                    && ((ok == 0 && acquire) == (retry_after_us > 0));
                if !consistent {
                    return Err(protocol(format!(
                        "inconsistent permit reply: ok {ok}, id {id} (sent {sent}), in flight \
                         {in_flight} of {max}, retry_after {retry_after_us} µs, {action:?}"
                    )));
                }
                let count = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
                let (max, in_flight, expired) = (max_u32, count(in_flight), count(expired));
                Ok(Answer::Permit(if ok == 1 {
                    PermitDecision::acquired(*sent_id, in_flight, max, expired)
                } else {
                    let retry = Duration::from_micros(retry_after_us);
                    PermitDecision::denied(in_flight, max, retry, expired)
                }))
            }
            &Op::Lease { want, .. } => {
                let [granted] = integers(part)?;
                let decision = self
                    .entries
                    .first()
                    .ok_or_else(|| protocol("a lease without its request".to_owned()))
                    .and_then(|e| parse_decision(&part[8..], e.expect))?;
                if granted > want || (decision.is_denied() && granted > 0) {
                    return Err(protocol(format!(
                        "inconsistent lease reply: granted {granted} of {want}, {decision:?}"
                    )));
                }
                Ok(Answer::Lease(Grant { granted, decision }))
            }
            Op::One | Op::Batch(_) | Op::Settle(_) => {
                let split = DECISION_BYTES * self.len();
                let decisions = part[..split]
                    .chunks_exact(DECISION_BYTES)
                    .zip(&self.entries)
                    .map(|(chunk, e)| parse_decision(chunk, e.expect))
                    .collect::<Result<Vec<_>, _>>()?;
                let at = if matches!(self.op, Op::Batch(Batch::CommitTimed)) {
                    let at = integer(&part[split..])?;
                    decisions.iter().all(Decision::is_allowed).then_some(at)
                } else {
                    None
                };
                Ok(Answer::Decisions(decisions, at))
            }
        }
    }
}

/// One call of the entry script over `groups`, in order.
#[derive(Debug)]
pub(crate) struct Call<'a> {
    groups: Vec<&'a Group>,
}

impl<'a> Call<'a> {
    /// A call of `groups` (at least one).
    pub(crate) fn new(groups: Vec<&'a Group>) -> Self {
        Self { groups }
    }

    /// Sends the call (`EVALSHA`, then `EVAL` on `NOSCRIPT`) and reads every group's answer.
    /// The call fails as a whole on a failure of the call itself; a group fails alone on a bad
    /// value at its keys, except in a call of one group, where its error is the call's (as if
    /// the script had failed: what the connections classify, retry and fail over on).
    ///
    /// With `durable`, and unless every group only reads, the script is followed by `WAIT` in
    /// one pipeline on the same connection; a group that admitted something is answered with a
    /// [`NotDurable`](crate::NotDurable) error when fewer replicas acknowledged.
    pub(crate) async fn run<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        durable: Option<Durable>,
    ) -> Result<Vec<Result<Answer, Error>>, Error> {
        let durable = durable.filter(|_| self.groups.iter().any(|g| g.writes()));
        let reply = match self.send(conn, durable, false).await {
            // The script did not run: sending it with its text cannot decide twice.
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.send(conn, durable, true).await
            }
            other => other,
        };
        let (reply, acknowledged) = reply.map_err(|e| {
            let keys: Vec<&[u8]> = self.groups.iter().flat_map(|g| g.key_slices()).collect();
            map_error(e, &keys)
        })?;
        let mut answers = self.parse(reply)?;
        if let (Some(durable), Some(acknowledged)) = (durable, acknowledged)
            && acknowledged < i64::from(durable.replicas)
        {
            for (answer, group) in answers.iter_mut().zip(&self.groups) {
                if matches!(answer, Ok(a) if group.admitted(a)) {
                    *answer = Err(durable.shortfall(acknowledged));
                }
            }
        }
        if let [Err(_)] = answers.as_slice()
            && let Some(Err(e)) = answers.pop()
        {
            return Err(e);
        }
        Ok(answers)
    }

    /// Sends the script, and with `durable` `WAIT` right after it in one pipeline (so on the
    /// same connection, and `WAIT` counts the replicas holding this connection's writes up to
    /// the script's): the script's reply, and how many replicas `WAIT` answered.
    async fn send<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        durable: Option<Durable>,
        eval: bool,
    ) -> Result<(Value, Option<i64>), RedisError> {
        let Some(durable) = durable else {
            return Ok((self.cmd(eval).query_async::<Value>(conn).await?, None));
        };
        let mut pipeline = Pipeline::with_capacity(2);
        pipeline
            .add_command(self.cmd(eval))
            .cmd("WAIT")
            .arg(durable.replicas)
            .arg(durable.timeout_ms());
        let mut replies = conn.req_packed_commands(&pipeline, 0, 2).await?;
        let (Some(wait), Some(script), true) = (replies.pop(), replies.pop(), replies.is_empty())
        else {
            return Err(RedisError::from((
                ErrorKind::Parse,
                "expected two replies to the script and WAIT",
            )));
        };
        // The script's own error first (`NOSCRIPT`, `READONLY`, …): it is what the call failed on.
        let script = script.extract_error()?;
        match wait.extract_error()? {
            Value::Int(acknowledged) => Ok((script, Some(acknowledged))),
            other => Err(RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "WAIT answered something else than an integer",
                describe(&other),
            ))),
        }
    }

    fn cmd(&self, eval: bool) -> Cmd {
        let (command, script) = match eval {
            true => ("EVAL", ENTRY_SCRIPT),
            false => ("EVALSHA", ENTRY_SHA.as_str()),
        };
        let mut cmd = redis::cmd(command);
        cmd.arg(script);
        cmd.arg(self.groups.iter().map(|g| g.len()).sum::<usize>());
        for group in &self.groups {
            for key in group.key_slices() {
                cmd.arg(key);
            }
        }
        cmd.arg(self.arguments());
        cmd
    }

    /// `ARGV[1]`: big-endian doubles (see `entry.lua`). Every value is an integer below 2^53
    /// (quota bounds, [`MAX_CLIENT_TIME_US`], costs at most the capacity), exact in a double.
    fn arguments(&self) -> Vec<u8> {
        let mut limits: Vec<[u64; 5]> = Vec::new();
        let mut body: Vec<f64> = Vec::new();
        for group in &self.groups {
            body.push(match group.time {
                TimeSource::Server => -1.0,
                TimeSource::Client(now) => exact(now),
            });
            let code = body.len();
            body.push(0.0);
            body.push(exact(group.len() as u64));
            let op = group.encode(|limit, values| {
                let index = match limits.iter().position(|l| *l == limit) {
                    Some(i) => i,
                    None => {
                        limits.push(limit);
                        limits.len() - 1
                    }
                };
                body.push(exact(index as u64 + 1));
                body.extend(values.iter().map(|&v| exact(v)));
            });
            body[code] = exact(op);
        }
        let mut out = Vec::with_capacity(8 * (2 + 5 * limits.len() + body.len()));
        // The format's version, 0: eight zero bytes. A server without scripting answers an
        // `unknown command` error quoting the arguments up to their first zero byte; without
        // them first it would quote bytes that are not UTF-8, and the error would be unreadable.
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&exact(limits.len() as u64).to_be_bytes());
        for value in limits.iter().flatten() {
            out.extend_from_slice(&exact(*value).to_be_bytes());
        }
        for value in body {
            out.extend_from_slice(&value.to_be_bytes());
        }
        out
    }

    /// The reply's parts: per group its answer, or its own error.
    fn parse(&self, reply: Value) -> Result<Vec<Result<Answer, Error>>, Error> {
        let Value::BulkString(bytes) = reply else {
            return Err(protocol(format!(
                "the script answered {}, expected a string",
                describe(&reply)
            )));
        };
        let cut = || protocol("the script's reply is cut short".into());
        let mut body = bytes.as_slice();
        let mut out = Vec::with_capacity(self.groups.len());
        for group in &self.groups {
            let (&status, rest) = body.split_first().ok_or_else(cut)?;
            match status {
                b'o' => {
                    let (part, rest) = rest.split_at_checked(group.reply_len()).ok_or_else(cut)?;
                    body = rest;
                    out.push(group.answer(part));
                }
                b'e' => {
                    let (len, rest) = rest.split_first_chunk::<4>().ok_or_else(cut)?;
                    let len = u32::from_be_bytes(*len) as usize;
                    let (message, rest) = rest.split_at_checked(len).ok_or_else(cut)?;
                    body = rest;
                    out.push(Err(group_error(message, group)));
                }
                other => {
                    return Err(protocol(format!(
                        "the script answered the status {other:#04x}"
                    )));
                }
            }
        }
        if !body.is_empty() {
            return Err(protocol(
                "the script answered more bytes than its groups".into(),
            ));
        }
        Ok(out)
    }
}

/// `x` as a double: exact for the integers below 2^53 the script is sent.
#[allow(clippy::cast_precision_loss)]
fn exact(x: u64) -> f64 {
    x as f64
}

/// A group's error message from the script (`DISTLIMIT_CORRUPT …`, `WRONGTYPE …`), classified
/// exactly as the same error reply of a whole call would be.
fn group_error(message: &[u8], group: &Group) -> Error {
    // Redis turns line breaks in error replies into spaces; so does this, and the message then
    // parses as the error reply the script would have sent.
    let mut wire = Vec::with_capacity(message.len() + 3);
    wire.push(b'-');
    wire.extend(message.iter().map(|&b| match b {
        b'\r' | b'\n' => b' ',
        b => b,
    }));
    wire.extend_from_slice(b"\r\n");
    let keys: Vec<&[u8]> = group.key_slices().collect();
    match redis::parse_redis_value(&wire).and_then(|v| v.extract_error()) {
        Err(e) => map_error(e, &keys),
        Ok(_) => protocol("the script failed a group without an error".into()),
    }
}

/// Decides one request of `cost` units on the Redis key `redis_key` under `limit`, charging it
/// when admitted, as the store does: one call of one group.
pub async fn decide(
    conn: &mut (impl ConnectionLike + Send),
    redis_key: &[u8],
    limit: &Limit,
    cost: u64,
    time: TimeSource,
) -> Result<Decision, Error> {
    let group = Group::single(redis_key, limit, cost, time)?;
    only(Call::new(vec![&group]).run(conn, None).await?)?.decision()
}

/// One step of the regional pool at `redis_key` (see `pool.lua`), as the region store sends it:
/// one call of one group, in `pool.lua`'s own terms: its parameters (horizon µs, capacity, claim
/// µs, time to live ms), its action (1 a spend, else a deposit) with three values; answers the
/// pool's seven reply values.
pub async fn pool_step(
    conn: &mut (impl ConnectionLike + Send),
    redis_key: &[u8],
    [horizon_us, capacity, claim_us, keep_ms]: [u64; 4],
    [action, a, b, c]: [u64; 4],
    time: TimeSource,
) -> Result<[u64; POOL_REPLY], Error> {
    let params = PoolParams {
        horizon_us,
        capacity,
        claim_us,
        keep_ms,
    };
    let (back, want, min, units, wait_us, ok) = (a, b, c, a, b, c != 0);
    let action = match action {
        1 => PoolAction::Spend { back, want, min },
        _ => PoolAction::Deposit { units, wait_us, ok },
    };
    let group = Group::keyed(redis_key, &[], Op::Pool(params, action), time)?;
    let r = only(Call::new(vec![&group]).run(conn, None).await?)?.pool()?;
    let (failing, until) = (u64::from(r.failing), r.denied_until);
    Ok([r.granted, r.units, r.back, r.want, until, failing, r.now])
}

/// Settles a batch of reports and give-backs (`reports[j]`: whether `requests[j]` is a report),
/// as the store does: one call of one group, every request applied, each answered by the peek
/// after it.
pub async fn settle(
    conn: &mut (impl ConnectionLike + Send),
    requests: &[ScriptRequest<'_>],
    reports: &[bool],
    time: TimeSource,
) -> Result<Vec<Decision>, Error> {
    let group = Group::settle(requests, reports, time)?;
    only(Call::new(vec![&group]).run(conn, None).await?)?.decisions()
}

/// Decides a batch all-or-nothing, as the store does: one call of one group.
pub async fn decide_all(
    conn: &mut (impl ConnectionLike + Send),
    requests: &[ScriptRequest<'_>],
    time: TimeSource,
) -> Result<Vec<Decision>, Error> {
    let group = Group::batch(requests, time, Batch::Commit)?;
    only(Call::new(vec![&group]).run(conn, None).await?)?.decisions()
}

/// The answer of a call of one group.
pub(crate) fn only(mut answers: Vec<Result<Answer, Error>>) -> Result<Answer, Error> {
    match (answers.pop(), answers.is_empty()) {
        (Some(answer), true) => answer,
        _ => Err(protocol(
            "expected the answer of exactly one group".to_owned(),
        )),
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

/// The first `N` doubles of `part` (at least `8 N` bytes), each an integer in `[0, 2^53)`.
fn integers<const N: usize>(part: &[u8]) -> Result<[u64; N], Error> {
    let mut n = [0; N];
    for (slot, bytes) in n.iter_mut().zip(part.chunks_exact(8)) {
        *slot = integer(bytes)?;
    }
    Ok(n)
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
    let [allowed, limit, remaining, reset_us, retry_us] = integers(chunk)?;
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

/// Maps a Redis error to distlimit's [`Error`], classified for circuit breakers as the crate
/// documentation's "Failures" table says (`connection::refine` completes it with what connecting
/// can say). `keys` are the keys of the call, named in the `WRONGTYPE` message.
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
            return config_error(format!(
                "the Redis user may not run the distlimit scripts on these keys (NOPERM): {detail}"
            ));
        }
        _ => {}
    }
    if err.code() == Some("BUSY") || err.is_timeout() {
        return Error::Backend {
            store: STORE,
            transient: true,
            source: Box::new(err),
        };
    }
    // A failover's or the Cluster's passing states.
    let passing = matches!(
        err.kind(),
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask
        )
    );
    if passing
        || err.is_io_error()
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
        ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig => {
            config_error(err.to_string())
        }
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

    /// Parses a script's reply to `n` requests of capacity 10 as the reply of one group would be.
    fn parse_reply(reply: Value, n: usize) -> Result<Vec<Decision>, Error> {
        let limit = Limit::gcra(Quota::per_second(10).unwrap());
        let group = Group::of(
            &vec![ScriptRequest::new(b"", limit, 1); n],
            TimeSource::Server,
            Op::One,
        )?;
        let reply = match reply {
            Value::BulkString(bytes) => Value::BulkString([b"o", bytes.as_slice()].concat()),
            other => other,
        };
        only(Call::new(vec![&group]).parse(reply)?)?.decisions()
    }

    #[test]
    fn the_script_is_built_from_its_parts() {
        let source = ENTRY_SCRIPT;
        assert!(source.starts_with(include_str!("scripts/prelude.lua")));
        assert!(source.ends_with(include_str!("scripts/entry_groups.lua")));
        for name in [
            "token_bucket",
            "gcra",
            "fixed_window",
            "sliding_log",
            "sliding_window",
        ] {
            assert!(source.contains(&format!("local function decide_{name}(")));
        }
        assert!(!source.contains("replicate_commands"));
        assert_eq!(ENTRY_SHA.len(), 40);
    }

    #[test]
    fn parses_allowed_and_denied() {
        let d = parse_reply(ints(&[1, 10, 7, 300, 0]), 1).unwrap();
        assert_eq!(
            d,
            vec![Decision::allowed(10, 7, Duration::from_micros(300))]
        );
        let top = (1i64 << 53) - 1;
        let d = parse_reply(ints(&[1, 10, 7, top, 0]), 1).unwrap();
        assert_eq!(d[0].reset_after(), Duration::from_micros(top as u64));
        let d = parse_reply(ints(&[0, 10, 0, 300, 25, 1, 10, 3, 0, 0]), 2).unwrap();
        assert_eq!(
            d,
            vec![
                Decision::denied(10, 0, Duration::from_micros(300), Duration::from_micros(25)),
                Decision::allowed(10, 3, Duration::ZERO),
            ]
        );
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
            match parse_reply(reply, 1) {
                Err(Error::Protocol { .. }) => {}
                other => panic!("{shown}: expected a protocol error, got {other:?}"),
            }
        }
        assert!(matches!(
            parse_reply(ints(&[1, 10, 7, 300, 0]), 2),
            Err(Error::Protocol { .. })
        ));
    }

    /// The doubles of a call's `ARGV[1]`, as integers (-1 for the server's time).
    fn argv(groups: &[&Group]) -> Vec<i64> {
        let bytes = Call::new(groups.to_vec()).arguments();
        assert_eq!(bytes[..8], [0; 8], "the version");
        bytes[8..]
            .chunks_exact(8)
            .map(|c| f64::from_be_bytes(c.try_into().unwrap()) as i64)
            .collect()
    }

    #[test]
    fn arguments_are_the_quota_parameters() {
        let q = Quota::from_parts(3, 1_000_000, 5).unwrap();
        let key = b"k".as_slice();
        let g = Group::single(key, &Limit::token_bucket(q), 2, TimeSource::Client(7)).unwrap();
        // One limit (token bucket: burst, L', P', 0); one group at time 7, op 0, one request
        // (limit 1, cost 2).
        assert_eq!(argv(&[&g]), [1, 1, 5, 3, 1_000_000, 0, 7, 0, 1, 1, 2]);
        let g = Group::single(key, &Limit::gcra(q), 6, TimeSource::Server).unwrap();
        // Cost 6 > burst 5: sent as a peek.
        assert_eq!(argv(&[&g]), [1, 2, 5, 333_334, 0, 0, -1, 0, 1, 1, 0]);
        assert!(g.entries[0].expect.never);
        let (q, hour) = (Quota::per_hour(10).unwrap(), 3_600_000_000);
        let g = Group::single(key, &Limit::sliding_window(q), 1, TimeSource::Server).unwrap();
        assert_eq!(
            argv(&[&g]),
            [1, 5, 10, hour, 3_434, 1_048_341, -1, 0, 1, 1, 1]
        );
        let batch = Group::batch(
            &[
                ScriptRequest::new(b"a", Limit::fixed_window(q), 1),
                ScriptRequest::new(b"b", Limit::sliding_log(q), 11),
                ScriptRequest::new(b"c", Limit::fixed_window(q), 2),
            ],
            TimeSource::Server,
            Batch::Commit,
        )
        .unwrap();
        // A cost above the capacity: evaluated only (op 1); the shared limit sent once.
        assert_eq!(
            argv(&[&batch]),
            [
                2, 3, 10, hour, 0, 0, 4, 10, hour, 0, 0, -1, 1, 3, 1, 1, 2, 0, 1, 2
            ]
        );
        // Groups of one call share the limits.
        let refund = Group::refund(
            &[ScriptRequest::new(b"d", Limit::sliding_log(q), 4)],
            99,
            TimeSource::Client(100),
        )
        .unwrap();
        let lease = Group::lease(b"e", &Limit::gcra(q), 1 << 60, 50, TimeSource::Server).unwrap();
        let all = argv(&[&batch, &refund, &lease]);
        assert_eq!(all[0], 3);
        assert_eq!(&all[11..16], [2, 10, 360_000_000, 0, 0]);
        assert_eq!(&all[25..], [100, 4, 1, 2, 4, 99, -1, 5, 1, 3, 1 << 52, 10]);
        // A pool step, a permit's renewal and a report, as the positional arrays sent them.
        let (horizon_us, capacity, claim_us, keep_ms) = (1, 2, 3, 1 << 60);
        let params = PoolParams {
            horizon_us,
            capacity,
            claim_us,
            keep_ms,
        };
        let (back, want, min) = (4, 5, 6);
        let op = Op::Pool(params, PoolAction::Spend { back, want, min });
        let pool = Group::keyed(b"p", b"", op, TimeSource::Client(9)).unwrap();
        let limit = PermitLimit::new(3, Duration::from_millis(5)).unwrap();
        let op = Op::Permit(PermitAction::Renew, PermitId::new(7).unwrap(), limit);
        let permit = Group::keyed(b"q", b"%", op, TimeSource::Server).unwrap();
        let report = [ScriptRequest::new(b"r", Limit::gcra(q), 4)];
        let settle = Group::settle(&report, &[true], TimeSource::Server).unwrap();
        let (max, t) = (MAX_CLIENT_TIME_US as i64, 360_000_000);
        assert_eq!(
            argv(&[&pool, &permit, &settle]),
            [
                3, 0, 1, 2, 3, max, 0, 3, 5000, 0, 0, 2, 10, t, 0, 0, 9, 6, 1, 1, 1, 4, 5, 6, -1,
                7, 1, 2, 7, 2, -1, 8, 1, 3, 4, 1
            ]
        );
    }

    #[test]
    fn rejects_invalid_calls() {
        let limit = Limit::gcra(Quota::per_second(1).unwrap());
        assert!(matches!(
            Group::single(b"k", &limit, 1, TimeSource::Client(1 << 52)),
            Err(Error::InvalidRequest(_))
        ));
        assert!(Group::single(b"k", &limit, 1, TimeSource::Client(MAX_CLIENT_TIME_US)).is_ok());
        let batch = |r: &[ScriptRequest<'_>]| Group::batch(r, TimeSource::Server, Batch::Commit);
        assert!(matches!(batch(&[]), Err(Error::InvalidRequest(_))));
        let twice = [
            ScriptRequest::new(b"k", limit, 1),
            ScriptRequest::new(b"k", limit, 1),
        ];
        assert!(matches!(batch(&twice), Err(Error::InvalidRequest(_))));
        // Any length up to MAX_BATCH, whatever its value: the encoding has no bound of its own.
        let keys: Vec<Vec<u8>> = (0..=MAX_BATCH).map(|i| i.to_be_bytes().to_vec()).collect();
        let many: Vec<ScriptRequest<'_>> = keys
            .iter()
            .map(|k| ScriptRequest::new(k, limit, 1))
            .collect();
        assert!(matches!(batch(&many), Err(Error::InvalidRequest(_))));
        let full = batch(&many[..MAX_BATCH]).unwrap();
        assert_eq!(argv(&[&full]).len(), 1 + 5 + 3 + 2 * MAX_BATCH);
        let window = Limit::fixed_window(Quota::per_second(1).unwrap());
        assert!(Group::lease(b"k", &window, 0, 1, TimeSource::Server).is_err());
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
    }
}
