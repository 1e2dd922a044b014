//! [`RedisObserver`]: what the Redis store reports about its calls, for metrics and logs.

use std::sync::Arc;

/// Receives the Redis store's own events (the events every store shares are
/// [`distlimit_core::Observer`]'s). Every method defaults to doing nothing; `distlimit-metrics`'
/// `Metrics` implements it with its feature `redis`. Called on the decision path: cheap, never
/// blocking.
pub trait RedisObserver: Send + Sync {
    /// The store named `store` sent one coalesced call carrying `decisions` decisions (several
    /// callers' requests decided in one round trip; 1 when a caller's call carried only its own).
    fn on_coalesced(&self, store: &'static str, decisions: usize) {
        let _ = (store, decisions);
    }

    /// The store named `store` has `in_use` calls in flight on its connections (at most its pool
    /// size or call limit) and `waiting` callers queued for one.
    fn on_connections(&self, store: &'static str, in_use: usize, waiting: usize) {
        let _ = (store, in_use, waiting);
    }
}

impl<O: RedisObserver + ?Sized> RedisObserver for Arc<O> {
    fn on_coalesced(&self, store: &'static str, decisions: usize) {
        (**self).on_coalesced(store, decisions);
    }

    fn on_connections(&self, store: &'static str, in_use: usize, waiting: usize) {
        (**self).on_connections(store, in_use, waiting);
    }
}

/// Ignores every Redis event.
impl RedisObserver for distlimit_core::NoopObserver {}
