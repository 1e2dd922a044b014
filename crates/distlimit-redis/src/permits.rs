//! Concurrency permits on Redis ([`PermitStore`] for [`RedisStore`]): each call is one group of
//! the entry script (`permit.lua`), atomic inside Redis, exactly as the reference model
//! ([`Permits`](distlimit_core::Permits)) on the key's sorted set.
//!
//! A key's permits live at its permit key: the key of its (state, key) pair (see
//! [`KeyLayout`](crate::KeyLayout)) followed by [`PERMIT_SUFFIX`], `%permits`. An escaped state
//! name never holds a `%` that is not followed by `25`, `7B` or `7D`, so no rate state is ever
//! named so: a state's permits and its rate state live apart, in one Cluster slot (the same
//! hash tag). The set holds one member per permit, its id in decimal, scored by the instant it
//! expires (µs, the server's `TIME` unless the store runs on a client clock), and the key
//! expires with its last permit.
//!
//! Permit ids are 53 random bits (a per-store random seed hashed with a counter): two live
//! permits of one key share an id with a probability of about `n² / 2^54` for `n` in flight,
//! which would let two holders share one place.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use distlimit_core::{Error, PermitDecision, PermitId, PermitRequest, PermitStore};

use crate::RedisStore;
use crate::layout::{KeyBuf, Sink};
use crate::script::{Group, PermitAction, PermitReply, protocol};

/// What follows a state's Redis key in the name of its permit set.
pub const PERMIT_SUFFIX: &[u8] = b"%permits";

/// Permit ids: a random seed hashed with a counter.
#[derive(Debug)]
pub(crate) struct PermitIds {
    seed: std::collections::hash_map::RandomState,
    counter: AtomicU64,
}

impl PermitIds {
    pub(crate) fn new() -> Self {
        Self {
            seed: std::collections::hash_map::RandomState::new(),
            counter: AtomicU64::new(0),
        }
    }

    fn next(&self) -> PermitId {
        let mut hasher = self.seed.build_hasher();
        hasher.write_u64(self.counter.fetch_add(1, Ordering::Relaxed));
        PermitId::wrapping(hasher.finish())
    }
}

impl RedisStore {
    /// The Redis key of the permit set of `key` under `policy`.
    pub fn permit_key(&self, policy: &str, key: distlimit_core::Key<'_>) -> Vec<u8> {
        let mut out = self.redis_key(policy, key);
        out.extend_from_slice(PERMIT_SUFFIX);
        out
    }

    async fn permit_call(
        &self,
        request: &PermitRequest<'_>,
        id: PermitId,
        action: PermitAction,
    ) -> Result<PermitReply, Error> {
        let mut key = KeyBuf::new();
        self.layout().write_key(
            request.policy().as_bytes(),
            request.key().as_bytes(),
            &mut key,
        );
        key.put(PERMIT_SUFFIX);
        let group = Group::permit(key.as_bytes(), request.limit(), id, action, self.time())?;
        self.send(group)
            .await?
            .permit
            .ok_or_else(|| protocol("a permit call answered without its reply".to_owned()))
    }
}

/// One call per acquire, release or renew (alone, or packed with other groups by the
/// coalescer). A call whose fate is unknown (a timeout, a lost connection) is never resent: an
/// acquire may then hold a permit nobody knows of, which comes back after its lease.
#[async_trait]
impl PermitStore for RedisStore {
    async fn acquire(&self, request: &PermitRequest<'_>) -> Result<PermitDecision, Error> {
        let id = self.permit_ids().next();
        let reply = self.permit_call(request, id, PermitAction::Acquire).await?;
        let max = request.limit().max_in_flight();
        let in_flight = u32::try_from(reply.in_flight).unwrap_or(u32::MAX);
        let expired = u32::try_from(reply.expired).unwrap_or(u32::MAX);
        Ok(if reply.ok {
            PermitDecision::acquired(id, in_flight, max, expired)
        } else {
            PermitDecision::denied(
                in_flight,
                max,
                Duration::from_micros(reply.retry_after_us),
                expired,
            )
        })
    }

    async fn release(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        Ok(self
            .permit_call(request, permit, PermitAction::Release)
            .await?
            .ok)
    }

    async fn renew(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        Ok(self
            .permit_call(request, permit, PermitAction::Renew)
            .await?
            .ok)
    }
}
