//! Concurrency permits in process ([`PermitStore`] for [`MemoryStore`]): core's model
//! ([`Permits`]) per (state, key) under one of 16 mutex-guarded maps.
//!
//! Memory is bounded twice: a key holds at most its `max_in_flight` permits (at most
//! [`MAX_IN_FLIGHT`](distlimit_core::MAX_IN_FLIGHT)), and the table holds at most the store's
//! [`max_keys`](crate::Builder::max_keys) keys. A key whose permits all expired is dropped when
//! its shard is full (and by [`MemoryStore::purge_expired`](crate::MemoryStore::purge_expired)).
//! Live permits are never evicted (that would admit more than N): a new key arriving at a shard
//! full of live permits is denied until one expires or is released.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use distlimit_core::{Clock, Error, PermitDecision, PermitId, PermitRequest, PermitStore, Permits};
use hashbrown::HashMap;
use parking_lot::Mutex;

use crate::MemoryStore;

/// The number of permit shards.
const SHARDS: usize = 16;

type Shard = HashMap<(Box<[u8]>, Box<[u8]>), Permits, foldhash::quality::RandomState>;

/// Every key's permits.
pub(crate) struct PermitTable {
    shards: Box<[Mutex<Shard>]>,
    max_keys_per_shard: usize,
    next_id: AtomicU64,
    /// Places keys in shards; seeded at random, so clients cannot crowd one shard.
    hasher: foldhash::quality::RandomState,
}

impl PermitTable {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            max_keys_per_shard: max_keys.div_ceil(SHARDS).max(1),
            next_id: AtomicU64::new(1),
            hasher: foldhash::quality::RandomState::default(),
        }
    }

    /// Runs `f` on the permits of `request`'s key, creating them when `create`; `None` when the
    /// key has none (and `create` is false) or its shard is full of live permits.
    fn with<T>(
        &self,
        request: &PermitRequest<'_>,
        now: u64,
        create: bool,
        f: impl FnOnce(&mut Permits) -> T,
    ) -> Option<T> {
        let id = (
            Box::<[u8]>::from(request.policy().as_bytes()),
            Box::<[u8]>::from(request.key().as_bytes()),
        );
        let shard_index = {
            let hash = self.hasher.hash_one(&id);
            (hash >> 32) as usize % SHARDS
        };
        let mut shard = self.shards[shard_index].lock();
        if let Some(permits) = shard.get_mut(&id) {
            let answer = f(permits);
            if permits.is_empty() {
                shard.remove(&id);
            }
            return Some(answer);
        }
        if !create {
            return None;
        }
        if shard.len() >= self.max_keys_per_shard {
            shard.retain(|_, p| p.in_flight(now) > 0);
            if shard.len() >= self.max_keys_per_shard {
                return None;
            }
        }
        let mut permits = Permits::default();
        let answer = f(&mut permits);
        if !permits.is_empty() {
            shard.insert(id, permits);
        }
        Some(answer)
    }

    fn next_id(&self) -> PermitId {
        PermitId::wrapping(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Drops every key whose permits all expired at `now`.
    pub(crate) fn purge(&self, now: u64) {
        for shard in self.shards.iter() {
            shard.lock().retain(|_, p| p.in_flight(now) > 0);
        }
    }
}

impl<C: Clock, S: BuildHasher + Send + Sync> MemoryStore<C, S> {
    /// [`PermitStore::acquire`] now, synchronously.
    pub fn acquire_sync(&self, request: &PermitRequest<'_>) -> PermitDecision {
        let now = self.clock.now_us();
        let limit = *request.limit();
        let id = self.permits.next_id();
        self.permits
            .with(request, now, true, |p| p.acquire(now, &limit, id))
            .unwrap_or_else(|| {
                PermitDecision::denied(0, limit.max_in_flight(), Duration::from_secs(1), 0)
            })
    }

    /// [`PermitStore::release`] now, synchronously.
    pub fn release_sync(&self, request: &PermitRequest<'_>, permit: PermitId) -> bool {
        let now = self.clock.now_us();
        self.permits
            .with(request, now, false, |p| p.release(now, permit))
            .unwrap_or(false)
    }

    /// [`PermitStore::renew`] now, synchronously.
    pub fn renew_sync(&self, request: &PermitRequest<'_>, permit: PermitId) -> bool {
        let now = self.clock.now_us();
        let limit = *request.limit();
        self.permits
            .with(request, now, false, |p| p.renew(now, &limit, permit))
            .unwrap_or(false)
    }
}

/// Never fails and never waits (the `_sync` methods, in a future).
#[async_trait]
impl<C: Clock, S: BuildHasher + Send + Sync> PermitStore for MemoryStore<C, S> {
    async fn acquire(&self, request: &PermitRequest<'_>) -> Result<PermitDecision, Error> {
        Ok(self.acquire_sync(request))
    }

    async fn release(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        Ok(self.release_sync(request, permit))
    }

    async fn renew(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        Ok(self.renew_sync(request, permit))
    }
}
