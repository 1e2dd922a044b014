//! [`LeaseObserver`]: what the lease client reports, for metrics and logs.

use std::sync::Arc;

use distlimit_core::NoopObserver;

/// Receives the lease client's events (the events every store shares are
/// [`distlimit_core::Observer`]'s). Every method defaults to doing nothing; `distlimit-metrics`'
/// `Metrics` implements it with its feature `lease`. Called on the decision path: cheap, never
/// blocking.
pub trait LeaseObserver: Send + Sync {
    /// The lease client named `store` withdrew `units` units for `policy` in one store call (0
    /// when the store had none available).
    fn on_lease_taken(&self, store: &'static str, policy: &str, units: u64) {
        let _ = (store, policy, units);
    }

    /// The lease client named `store` gave back `units` unspent units of ended leases for
    /// `policy`.
    fn on_lease_returned(&self, store: &'static str, policy: &str, units: u64) {
        let _ = (store, policy, units);
    }

    /// The lease client named `store` holds `held` units in leases now, all keys together.
    fn on_lease_units(&self, store: &'static str, held: u64) {
        let _ = (store, held);
    }
}

/// Ignores every lease event: the default.
impl LeaseObserver for NoopObserver {}

impl<O: LeaseObserver + ?Sized> LeaseObserver for Arc<O> {
    fn on_lease_taken(&self, store: &'static str, policy: &str, units: u64) {
        (**self).on_lease_taken(store, policy, units);
    }

    fn on_lease_returned(&self, store: &'static str, policy: &str, units: u64) {
        (**self).on_lease_returned(store, policy, units);
    }

    fn on_lease_units(&self, store: &'static str, held: u64) {
        (**self).on_lease_units(store, held);
    }
}
