//! Concurrency permits on Redis ([`PermitStore`] for [`RedisStore`]): each call is one group of
//! the entry script (`permit.lua`) on the key's sorted set, as the crate documentation's
//! "Concurrency permits" says. Permit ids are 53 random bits (a per-store random seed hashed with
//! a counter): two live permits of one key share an id with a probability of about `n² / 2^54`
//! for `n` in flight, which would let two holders share one place.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use distlimit_core::{Error, PermitDecision, PermitId, PermitRequest, PermitStore};

use crate::RedisStore;
use crate::script::{Group, Op, PermitAction};

/// What follows a state's Redis key in the name of its permit set.
pub const PERMIT_SUFFIX: &[u8] = b"%permits";

/// Permit ids: a random seed (a new one per store) hashed with a counter.
#[derive(Debug, Default)]
pub(crate) struct PermitIds {
    seed: std::collections::hash_map::RandomState,
    counter: AtomicU64,
}

impl PermitIds {
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
    ) -> Result<PermitDecision, Error> {
        let key = self.state_key(request.policy(), request.key().as_bytes());
        let op = Op::Permit(action, id, *request.limit());
        let group = Group::keyed(&key, PERMIT_SUFFIX, op, self.time())?;
        self.send(group).await?.permit()
    }
}

/// One call per acquire, release or renew (alone, or packed with other groups by the
/// coalescer), never resent (see the crate documentation).
#[async_trait]
impl PermitStore for RedisStore {
    async fn acquire(&self, request: &PermitRequest<'_>) -> Result<PermitDecision, Error> {
        let id = self.permit_ids().next();
        self.permit_call(request, id, PermitAction::Acquire).await
    }

    async fn release(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        let call = self.permit_call(request, permit, PermitAction::Release);
        Ok(call.await?.is_allowed())
    }

    async fn renew(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        let call = self.permit_call(request, permit, PermitAction::Renew);
        Ok(call.await?.is_allowed())
    }
}
