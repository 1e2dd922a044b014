//! Leases on Redis ([`LeaseStore`] for [`RedisStore`]): `lease.lua` gives back unspent units
//! and withdraws up to the units wanted in one atomic script, exactly as the reference model
//! ([`Limit::give_back`](distlimit_core::Limit::give_back) then
//! [`Limit::take`](distlimit_core::Limit::take)) does on the key's state, the one
//! [`Store::decide`](distlimit_core::Store::decide) uses.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use distlimit_core::{Algorithm, Decision, Error, Grant, LeaseStore, Limit, Request};
use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, ServerErrorKind, Value};

use crate::RedisStore;
use crate::connection::Op;
use crate::layout::KeyBuf;
use crate::script::{MAX_CLIENT_TIME_US, TimeSource, map_error};

/// The lease script: the prelude, the token bucket and GCRA, and `lease.lua`.
const LEASE_SCRIPT: &str = concat!(
    include_str!("scripts/prelude.lua"),
    include_str!("scripts/token_bucket.lua"),
    include_str!("scripts/gcra.lua"),
    include_str!("scripts/lease.lua"),
);

static LEASE_SHA: LazyLock<String> =
    LazyLock::new(|| redis::Script::new(LEASE_SCRIPT).get_hash().to_owned());

/// The most units one call gives back (exact as a Lua number); the script caps them at the
/// burst of the key's state.
const MAX_GIVE_BACK: u64 = 1 << 52;

/// The text of the lease script, for tools that load or inspect it.
pub fn lease_source() -> &'static str {
    LEASE_SCRIPT
}

/// One lease call: give back `give_back` units of `key`, then take up to `want`.
pub(crate) struct Exchange<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) limit: &'a Limit,
    pub(crate) give_back: u64,
    pub(crate) want: u64,
}

impl Exchange<'_> {
    /// `EVALSHA` (or with `eval`, `EVAL`) of the lease script.
    fn cmd(&self, eval: bool, time: TimeSource) -> Cmd {
        let mut cmd = if eval {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(LEASE_SCRIPT);
            cmd
        } else {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(LEASE_SHA.as_str());
            cmd
        };
        cmd.arg(1).arg(self.key);
        match time {
            TimeSource::Server => cmd.arg(""),
            TimeSource::Client(now) => cmd.arg(now),
        };
        // `want` at most the capacity, and the units given back at most the capacity of the
        // quota their state was written under (the script caps them at its burst; that quota
        // may differ from this one after a limit change), so every product in the script stays
        // below 2^53.
        let capacity = self.limit.capacity();
        let q = self.limit.quota();
        match self.limit.algorithm() {
            Algorithm::Gcra => cmd.arg(2),
            _ => cmd.arg(1),
        };
        cmd.arg(self.give_back.min(MAX_GIVE_BACK))
            .arg(self.want.min(capacity));
        match self.limit.algorithm() {
            Algorithm::Gcra => cmd.arg(q.burst()).arg(q.emission_interval_us()),
            _ => {
                let (rate, unit) = q.refill_units();
                cmd.arg(q.burst()).arg(rate).arg(unit)
            }
        };
        cmd
    }

    async fn call<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        time: TimeSource,
    ) -> Result<Grant, Error> {
        self.limit.check_lease()?;
        if matches!(time, TimeSource::Client(now) if now > MAX_CLIENT_TIME_US) {
            return Err(Error::InvalidRequest(
                "client time beyond 2^52 µs (the year 2112), where the scripts are no longer exact",
            ));
        }
        let reply = match self.cmd(false, time).query_async::<Value>(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // The script did not run: sending it with its text cannot take twice.
                self.cmd(true, time).query_async::<Value>(conn).await
            }
            other => other,
        };
        let reply = reply.map_err(|e| map_error(e, &[self.key]))?;
        parse(
            reply,
            self.limit.capacity(),
            self.want.min(self.limit.capacity()),
        )
    }
}

impl Op for Exchange<'_> {
    type Output = Grant;

    fn run<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        time: TimeSource,
    ) -> impl Future<Output = Result<Grant, Error>> + Send {
        self.call(conn, time)
    }
}

fn protocol(message: String) -> Error {
    Error::Protocol {
        store: "redis",
        message,
    }
}

/// An integer in `[0, 2^53)` from a big-endian double.
fn integer(bytes: &[u8]) -> Result<u64, Error> {
    let mut be = [0u8; 8];
    be.copy_from_slice(bytes);
    let x = f64::from_be_bytes(be);
    if (0.0..9_007_199_254_740_992.0).contains(&x) && x.fract() == 0.0 {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Ok(x as u64)
    } else {
        Err(protocol(format!(
            "the lease script answered {x}, not an integer in [0, 2^53)"
        )))
    }
}

/// Parses the lease script's reply: six doubles, consistent with each other and the call.
fn parse(reply: Value, capacity: u64, want: u64) -> Result<Grant, Error> {
    let Value::BulkString(bytes) = reply else {
        return Err(protocol(
            "the lease script answered something other than a string".to_owned(),
        ));
    };
    if bytes.len() != 48 {
        return Err(protocol(format!(
            "the lease script answered {} bytes, expected 48",
            bytes.len()
        )));
    }
    let mut n = [0u64; 6];
    for (slot, chunk) in n.iter_mut().zip(bytes.chunks_exact(8)) {
        *slot = integer(chunk)?;
    }
    let [granted, allowed, limit, remaining, reset_us, retry_us] = n;
    let consistent = granted <= want
        && limit == capacity
        && remaining <= limit
        && match allowed {
            1 => retry_us == 0,
            0 => retry_us > 0 && granted == 0,
            _ => false,
        };
    if !consistent {
        return Err(protocol(format!(
            "inconsistent lease reply: granted {granted} of {want}, allowed {allowed}, limit \
             {limit} (capacity {capacity}), remaining {remaining}, reset_after {reset_us} µs, \
             retry_after {retry_us} µs"
        )));
    }
    let reset = Duration::from_micros(reset_us);
    let decision = if allowed == 1 {
        Decision::allowed(limit, remaining, reset)
    } else {
        Decision::denied(limit, remaining, reset, Duration::from_micros(retry_us))
    };
    Ok(Grant { granted, decision })
}

/// One script call per exchange, atomic inside Redis; in a Cluster it runs on the key's node.
/// A call whose fate is unknown (a timeout, a lost connection) is never resent: the caller
/// gets the transient error, and units it tried to give back may or may not be back.
#[async_trait]
impl LeaseStore for RedisStore {
    async fn exchange(
        &self,
        request: &Request<'_>,
        give_back: u64,
        want: u64,
    ) -> Result<Grant, Error> {
        request.limit().check_lease()?;
        let mut key = KeyBuf::new();
        self.layout().write_key(
            request.policy().as_bytes(),
            request.key().as_bytes(),
            &mut key,
        );
        let op = Exchange {
            key: key.as_bytes(),
            limit: request.limit(),
            give_back,
            want,
        };
        self.run(&op).await
    }
}
