//! Token leases ([`LeaseStore`]): several units of a key's budget handed out at once.

use std::sync::Arc;

use async_trait::async_trait;

use crate::{Algorithm, Decision, Error, Request, Store};

/// What a [`take`](crate::Limit::take) granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The units withdrawn, from 0 to the `want` asked for; they are spent in the store
    /// already, and belong to the taker until it gives them back.
    pub granted: u64,
    /// When units were granted, what [`Limit::decide`](crate::Limit::decide) answered for a
    /// request of `granted` units (allowed; `remaining` and `reset_after` after the
    /// withdrawal); when nothing was granted, the answer to a peek (cost 0): denied with the
    /// exact `retry_after` until one unit is available when the key is empty.
    pub decision: Decision,
}

/// Leases need an algorithm whose units can be withdrawn and returned one by one: the token
/// bucket and GCRA. The window algorithms answer this error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("leases need the token bucket or GCRA, not {0}")]
pub struct LeaseUnsupported(pub Algorithm);

impl From<LeaseUnsupported> for Error {
    fn from(_: LeaseUnsupported) -> Self {
        Error::InvalidRequest("leases need the token bucket or GCRA")
    }
}

/// A [`Store`] that can hand out several units of a key's budget in one call and take back
/// unspent ones: what a lease client (`distlimit-lease`) needs.
///
/// # Contract
///
/// A lease store MUST:
/// * decide [`exchange`](LeaseStore::exchange) atomically, on the same (policy, key) state as
///   [`Store::decide`], exactly as [`Limit::give_back`](crate::Limit::give_back) of `give_back`
///   units followed by [`Limit::take`](crate::Limit::take) of `want` units at one instant would
///   (a state written under another quota is carried over first, as for `decide`);
/// * answer [`Error::InvalidRequest`] (from [`LeaseUnsupported`]) for an algorithm other than the
///   token bucket and GCRA, changing nothing;
/// * ignore the request's `cost` (the units are `give_back` and `want`).
///
/// Units given back must be units the caller took and did not spend: giving back more makes the
/// key admit more than its limit.
#[async_trait]
pub trait LeaseStore: Store {
    /// Gives back `give_back` unspent units of `request`'s key, then withdraws up to `want`
    /// units available now, atomically, in one call to the backend.
    async fn exchange(
        &self,
        request: &Request<'_>,
        give_back: u64,
        want: u64,
    ) -> Result<Grant, Error>;

    /// Withdraws up to `want` units available now: [`exchange`](Self::exchange) giving back
    /// nothing.
    async fn take(&self, request: &Request<'_>, want: u64) -> Result<Grant, Error> {
        self.exchange(request, 0, want).await
    }

    /// Returns `units` unspent units: [`exchange`](Self::exchange) taking nothing.
    async fn give_back(&self, request: &Request<'_>, units: u64) -> Result<(), Error> {
        self.exchange(request, units, 0).await.map(|_| ())
    }
}

#[async_trait]
impl<S: LeaseStore + ?Sized> LeaseStore for Arc<S> {
    async fn exchange(
        &self,
        request: &Request<'_>,
        give_back: u64,
        want: u64,
    ) -> Result<Grant, Error> {
        (**self).exchange(request, give_back, want).await
    }
}
