//! Concurrency limits: at most N requests in flight per key ([`PermitStore`]), with the
//! reference model ([`Permits`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{Error, Key, KeyError, StateName, StateRef};

/// The most permits one key may hold at once: 2^16 (65 536).
///
/// A store keeps one entry per live permit, so this bounds a key's memory.
pub const MAX_IN_FLIGHT: u32 = 1 << 16;

/// The longest lease a permit may have: one day.
///
/// A lease is how long the permits of a crashed holder stay taken; anything longer is a
/// mistake, and a day keeps every expiry instant far below 2^53 µs.
pub const MAX_PERMIT_LEASE: Duration = Duration::from_secs(86_400);

/// The shortest lease a permit may have: one millisecond (Redis expires keys in milliseconds).
pub const MIN_PERMIT_LEASE: Duration = Duration::from_millis(1);

/// The largest permit id: 2^53 − 1, so an id is exact in a Lua number (a double).
pub const MAX_PERMIT_ID: u64 = (1 << 53) - 1;

/// Why a [`PermitLimit`] or a [`PermitId`] was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PermitError {
    /// `max_in_flight` was zero: nothing could ever be admitted.
    #[error("invalid concurrency limit: max_in_flight must be at least 1")]
    ZeroInFlight,
    /// `max_in_flight` was above [`MAX_IN_FLIGHT`].
    #[error("invalid concurrency limit: max_in_flight {value}, the maximum is {max}")]
    TooManyInFlight {
        /// The value given.
        value: u32,
        /// [`MAX_IN_FLIGHT`].
        max: u32,
    },
    /// The lease was shorter than [`MIN_PERMIT_LEASE`].
    #[error("invalid concurrency limit: the lease must be at least 1 ms, not {0:?}")]
    LeaseTooShort(Duration),
    /// The lease was longer than [`MAX_PERMIT_LEASE`].
    #[error("invalid concurrency limit: the lease {value:?} is longer than {max:?}")]
    LeaseTooLong {
        /// The lease given.
        value: Duration,
        /// [`MAX_PERMIT_LEASE`].
        max: Duration,
    },
    /// A permit id above [`MAX_PERMIT_ID`].
    #[error("invalid permit id {0}: the maximum is 2^53 - 1")]
    BadId(u64),
}

/// A concurrency limit: at most `max_in_flight` permits per key at once, each expiring `lease`
/// after it was taken or renewed.
///
/// ```
/// use std::time::Duration;
/// use distlimit_core::{PermitError, PermitLimit};
///
/// let limit = PermitLimit::new(4, Duration::from_secs(30))?;
/// assert_eq!((limit.max_in_flight(), limit.lease()), (4, Duration::from_secs(30)));
/// assert_eq!(PermitLimit::new(0, Duration::from_secs(30)), Err(PermitError::ZeroInFlight));
/// assert!(PermitLimit::new(4, Duration::ZERO).is_err());
/// assert!(PermitLimit::new(4, Duration::from_secs(365 * 86_400)).is_err());
/// # Ok::<(), PermitError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PermitLimit {
    max_in_flight: u32,
    lease_us: u64,
}

impl PermitLimit {
    /// At most `max_in_flight` (1 to [`MAX_IN_FLIGHT`]) permits per key, each leased for
    /// `lease` ([`MIN_PERMIT_LEASE`] to [`MAX_PERMIT_LEASE`], whole microseconds).
    pub fn new(max_in_flight: u32, lease: Duration) -> Result<Self, PermitError> {
        if max_in_flight == 0 {
            return Err(PermitError::ZeroInFlight);
        }
        if max_in_flight > MAX_IN_FLIGHT {
            return Err(PermitError::TooManyInFlight {
                value: max_in_flight,
                max: MAX_IN_FLIGHT,
            });
        }
        if lease < MIN_PERMIT_LEASE {
            return Err(PermitError::LeaseTooShort(lease));
        }
        if lease > MAX_PERMIT_LEASE {
            return Err(PermitError::LeaseTooLong {
                value: lease,
                max: MAX_PERMIT_LEASE,
            });
        }
        Ok(Self {
            max_in_flight,
            // At most a day: fits.
            lease_us: u64::try_from(lease.as_micros()).unwrap_or(u64::MAX),
        })
    }

    /// The most permits a key holds at once.
    #[inline]
    pub fn max_in_flight(&self) -> u32 {
        self.max_in_flight
    }

    /// How long a permit lives after it is taken or renewed.
    #[inline]
    pub fn lease(&self) -> Duration {
        Duration::from_micros(self.lease_us)
    }

    /// [`lease`](Self::lease) in microseconds.
    #[inline]
    pub fn lease_us(&self) -> u64 {
        self.lease_us
    }
}

/// The name of one permit, unique among a key's live permits: what
/// [`release`](PermitStore::release) and [`renew`](PermitStore::renew) name. At most
/// [`MAX_PERMIT_ID`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PermitId(u64);

impl PermitId {
    /// The id `id`; above [`MAX_PERMIT_ID`] it is a [`PermitError::BadId`].
    pub fn new(id: u64) -> Result<Self, PermitError> {
        if id > MAX_PERMIT_ID {
            return Err(PermitError::BadId(id));
        }
        Ok(Self(id))
    }

    /// The low 53 bits of `id`: always a valid id (for stores that count ids up).
    #[inline]
    pub const fn wrapping(id: u64) -> Self {
        Self(id & MAX_PERMIT_ID)
    }

    /// The id as a number.
    #[inline]
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for PermitId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One concurrency-limited key: `key` held to `limit` in the state `state` (a policy, or a
/// tier of one), as a [`Request`](crate::Request) names a rate-limited key.
///
/// Permits and rate states are apart: a store keeps a key's permits apart from any rate state
/// of the same name, so one policy may limit both the rate and the requests in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PermitRequest<'a> {
    state: StateRef<'a>,
    key: Key<'a>,
    limit: PermitLimit,
}

impl<'a> PermitRequest<'a> {
    /// `key` under `limit`, in the unnamed state (`""`).
    #[inline]
    pub fn new(key: Key<'a>, limit: PermitLimit) -> Self {
        Self {
            state: StateRef::untyped(""),
            key,
            limit,
        }
    }

    crate::store::state_accessors!(PermitLimit);
}

/// The answer to an [`acquire`](PermitStore::acquire): a permit, or a denial (a value, like a
/// denied [`Decision`](crate::Decision)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PermitDecision {
    permit: Option<PermitId>,
    in_flight: u32,
    max: u32,
    retry_after_us: u64,
    expired: u32,
}

impl PermitDecision {
    /// An admitted acquire, holding `permit`. Store drivers build their answers with this.
    pub fn acquired(permit: PermitId, in_flight: u32, max: u32, expired: u32) -> Self {
        Self {
            permit: Some(permit),
            in_flight,
            max,
            retry_after_us: 0,
            expired,
        }
    }

    /// A denied acquire: `retry_after` is at least one microsecond.
    pub fn denied(in_flight: u32, max: u32, retry_after: Duration, expired: u32) -> Self {
        Self {
            permit: None,
            in_flight,
            max,
            retry_after_us: u64::try_from(retry_after.as_micros())
                .unwrap_or(u64::MAX)
                .max(1),
            expired,
        }
    }

    /// Whether a permit was taken.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.permit.is_some()
    }

    /// Whether the key held `max` permits already.
    #[inline]
    pub fn is_denied(&self) -> bool {
        self.permit.is_none()
    }

    /// The permit taken.
    #[inline]
    pub fn permit(&self) -> Option<PermitId> {
        self.permit
    }

    /// The key's live permits after this call (this one included), at most the limit.
    #[inline]
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// The limit: the most permits the key may hold.
    #[inline]
    pub fn max_in_flight(&self) -> u32 {
        self.max
    }

    /// Permits that could still be taken now.
    #[inline]
    pub fn remaining(&self) -> u32 {
        self.max.saturating_sub(self.in_flight)
    }

    /// For a denial, the time until the key's earliest live permit expires (the latest a permit
    /// comes back if nobody releases one; a release frees one sooner); zero when admitted.
    #[inline]
    pub fn retry_after(&self) -> Duration {
        Duration::from_micros(self.retry_after_us)
    }

    /// Permits this call found expired and dropped (their holder neither released nor renewed
    /// them in time: a crash, or a request that outlived its lease). A lower bound, for
    /// metrics: a store forgets a key once all its permits expired, so those that expired
    /// together with its last one are never found.
    #[inline]
    pub fn expired(&self) -> u32 {
        self.expired
    }
}

/// The reference model of one key's permits: what every [`PermitStore`] must do, with time
/// passed in (integer microseconds since the epoch).
///
/// A permit is live while `now < expires_at`; at `expires_at` it is gone. Calls drop the
/// expired permits first. The memory store runs this under a lock; the Redis script is its
/// translation (a sorted set of ids scored by `expires_at`).
///
/// ```
/// use std::time::Duration;
/// use distlimit_core::{PermitId, PermitLimit, Permits};
///
/// let limit = PermitLimit::new(2, Duration::from_secs(10))?;
/// let mut permits = Permits::default();
/// let id = |n| PermitId::new(n).unwrap();
/// assert!(permits.acquire(0, &limit, id(1)).is_allowed());
/// assert!(permits.acquire(1, &limit, id(2)).is_allowed());
/// let denied = permits.acquire(2, &limit, id(3));
/// assert_eq!(denied.retry_after(), Duration::from_micros(10_000_000 - 2));
/// assert!(permits.release(3, id(1)));
/// assert!(permits.acquire(4, &limit, id(3)).is_allowed());
/// // Nobody releases: the permits expire.
/// let later = permits.acquire(20_000_000, &limit, id(4));
/// assert_eq!((later.in_flight(), later.expired()), (1, 2));
/// # Ok::<(), distlimit_core::PermitError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Permits {
    /// (id, expires_at) of each permit, in no order.
    held: Vec<(PermitId, u64)>,
}

impl Permits {
    /// Drops the permits expired at `now`, returning how many.
    fn sweep(&mut self, now: u64) -> u32 {
        let before = self.held.len();
        self.held.retain(|&(_, at)| at > now);
        u32::try_from(before - self.held.len()).unwrap_or(u32::MAX)
    }

    /// Takes permit `id` if the key holds fewer than `limit.max_in_flight()` live permits at
    /// `now`, expiring at `now + lease`. An `id` already live is answered as admitted again and
    /// renewed (a store never hands out a live id twice).
    pub fn acquire(&mut self, now: u64, limit: &PermitLimit, id: PermitId) -> PermitDecision {
        let expired = self.sweep(now);
        let max = limit.max_in_flight();
        let expires_at = now.saturating_add(limit.lease_us());
        if let Some(held) = self.held.iter_mut().find(|(h, _)| *h == id) {
            held.1 = expires_at;
            return PermitDecision::acquired(id, self.in_flight_now(), max, expired);
        }
        if self.held.len() >= max as usize {
            let earliest = self.held.iter().map(|&(_, at)| at).min().unwrap_or(now);
            return PermitDecision::denied(
                self.in_flight_now(),
                max,
                Duration::from_micros(earliest.saturating_sub(now)),
                expired,
            );
        }
        self.held.push((id, expires_at));
        PermitDecision::acquired(id, self.in_flight_now(), max, expired)
    }

    /// Gives permit `id` back: `true` if it was live at `now`, `false` if it had expired or
    /// was never taken (nothing changes then, but expired permits are dropped).
    pub fn release(&mut self, now: u64, id: PermitId) -> bool {
        self.sweep(now);
        let before = self.held.len();
        self.held.retain(|&(h, _)| h != id);
        self.held.len() < before
    }

    /// Extends live permit `id` to expire at `now + limit.lease()`: `true` if it was live;
    /// `false` if it had expired (its holder lost it: another request may hold its place).
    pub fn renew(&mut self, now: u64, limit: &PermitLimit, id: PermitId) -> bool {
        self.sweep(now);
        let Some(held) = self.held.iter_mut().find(|(h, _)| *h == id) else {
            return false;
        };
        held.1 = now.saturating_add(limit.lease_us());
        true
    }

    /// The live permits at `now`.
    pub fn in_flight(&self, now: u64) -> u32 {
        let live = self.held.iter().filter(|&&(_, at)| at > now).count();
        u32::try_from(live).unwrap_or(u32::MAX)
    }

    fn in_flight_now(&self) -> u32 {
        u32::try_from(self.held.len()).unwrap_or(u32::MAX)
    }

    /// When the last permit expires (the key may be forgotten then); `None` without permits.
    pub fn expires_at(&self) -> Option<u64> {
        self.held.iter().map(|&(_, at)| at).max()
    }

    /// Whether no permit is held (live or not yet swept).
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// A store of concurrency permits: at most N requests in flight per key, across every
/// instance that shares the store. A permit is taken when a request starts and released when it
/// ends; a request longer than the lease [renews](Self::renew) its permit before it runs out.
///
/// # Contract
///
/// A permit store MUST:
/// * keep one permit set per (state, key) pair, apart from any rate state of that name;
/// * decide every call exactly as [`Permits`] would on that set at the store's current time,
///   atomically: concurrent calls on one key (from any instance) behave as if run one after
///   another, so a key never holds more than `max_in_flight` live permits;
/// * hand out ids unique among the key's live permits;
/// * let a permit expire [`PermitLimit::lease`] after it was taken or last renewed, without
///   anyone calling (so the permits of a crashed holder come back), and forget a key whose
///   permits all expired;
/// * answer `Err` only when it failed; never panic on any input or backend reply.
///
/// A release or renew of a permit that is not live (expired, released already, never taken) is
/// not an error: it answers `false` and changes nothing.
///
/// The `distlimit-test` crate's `permit_conformance_tests!` checks this.
#[async_trait]
pub trait PermitStore: Send + Sync {
    /// Takes a permit for `request`'s key if it holds fewer than its limit.
    async fn acquire(&self, request: &PermitRequest<'_>) -> Result<PermitDecision, Error>;

    /// Gives `permit` back: `Ok(true)` if it was live.
    async fn release(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error>;

    /// Extends `permit` by the request's lease from now: `Ok(true)` if it was live,
    /// `Ok(false)` if it had expired (the caller no longer holds it).
    async fn renew(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error>;
}

#[async_trait]
impl<S: PermitStore + ?Sized> PermitStore for Arc<S> {
    async fn acquire(&self, request: &PermitRequest<'_>) -> Result<PermitDecision, Error> {
        (**self).acquire(request).await
    }

    async fn release(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        (**self).release(request, permit).await
    }

    async fn renew(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        (**self).renew(request, permit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Acquire(u64),
        Release(u64),
        Renew(u64),
        Wait(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..12).prop_map(Op::Acquire),
            (0u64..12).prop_map(Op::Release),
            (0u64..12).prop_map(Op::Renew),
            (0u64..3_000).prop_map(Op::Wait),
        ]
    }

    proptest! {
        /// Never more than max live permits; a denial only when max are live; a release frees
        /// a place; retry_after is the earliest expiry.
        #[test]
        fn never_more_than_max_live(
            max in 1u32..5,
            lease in 1_000u64..5_000,
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let limit = PermitLimit::new(max, Duration::from_micros(lease)).unwrap();
            let mut permits = Permits::default();
            let mut now = 1_000_000u64;
            for op in ops {
                match op {
                    Op::Acquire(id) => {
                        let before = permits.in_flight(now);
                        let d = permits.acquire(now, &limit, PermitId::new(id).unwrap());
                        prop_assert!(d.in_flight() <= max);
                        prop_assert_eq!(d.in_flight(), permits.in_flight(now));
                        if d.is_denied() {
                            prop_assert_eq!(before, max);
                            prop_assert!(d.retry_after() > Duration::ZERO);
                            prop_assert!(d.retry_after().as_micros() as u64 <= lease);
                        }
                    }
                    Op::Release(id) => {
                        let before = permits.in_flight(now);
                        let was = permits.release(now, PermitId::new(id).unwrap());
                        prop_assert_eq!(permits.in_flight(now), before - u32::from(was));
                    }
                    Op::Renew(id) => {
                        let before = permits.in_flight(now);
                        permits.renew(now, &limit, PermitId::new(id).unwrap());
                        prop_assert_eq!(permits.in_flight(now), before);
                    }
                    Op::Wait(us) => now += us,
                }
                prop_assert!(permits.in_flight(now) <= max);
            }
            // Everything expires one lease after the last call.
            prop_assert_eq!(permits.in_flight(now + lease), 0);
        }
    }

    #[test]
    fn bad_ids_and_limits_are_typed_errors() {
        assert_eq!(
            PermitId::new(MAX_PERMIT_ID + 1),
            Err(PermitError::BadId(MAX_PERMIT_ID + 1))
        );
        assert!(matches!(
            PermitLimit::new(MAX_IN_FLIGHT + 1, Duration::from_secs(1)),
            Err(PermitError::TooManyInFlight { .. })
        ));
        assert!(matches!(
            PermitLimit::new(1, Duration::from_micros(999)),
            Err(PermitError::LeaseTooShort(_))
        ));
    }

    #[test]
    fn a_renewed_permit_outlives_its_first_lease() {
        let limit = PermitLimit::new(1, Duration::from_millis(10)).unwrap();
        let mut permits = Permits::default();
        let id = PermitId::new(7).unwrap();
        assert!(permits.acquire(0, &limit, id).is_allowed());
        assert!(permits.renew(9_000, &limit, id));
        assert_eq!(permits.in_flight(15_000), 1);
        assert!(!permits.renew(19_000, &limit, id));
        assert_eq!(permits.expires_at(), None);
    }
}
