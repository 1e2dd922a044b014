//! The storage contract ([`Store`]) drivers implement, and the conveniences users call ([`StoreExt`]).

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use crate::{Decision, Error, Key, KeyError, Limit, MAX_REPORT, StateName, StateRef};

/// The most requests one [`Store::decide_all`] batch may hold.
///
/// 128: a request of 64 descriptors (Envoy's rate limit service) each charging a state and
/// a shared one fits in one batch. Stores must handle batches of this size (the memory store
/// takes any size; the Redis script keys each request once).
pub const MAX_BATCH: usize = 128;

/// The accessors a [`Request`] and a [`PermitRequest`](crate::PermitRequest) share, over their
/// `state`, `key` and `limit` fields (the limit's type given): naming the state, and reading
/// the three back. The types are named as the caller imports them.
macro_rules! state_accessors {
    ($limit:ty) => {
        /// The same request in the state of policy `policy` (at most
        /// [`MAX_POLICY_LEN`](crate::MAX_POLICY_LEN) bytes), without a tier: the whole string is
        /// the policy's name (see [`with_state`](Self::with_state) for a tier of a policy).
        #[inline]
        pub fn with_policy(self, policy: &'a str) -> Result<Self, KeyError> {
            Ok(Self {
                state: StateRef::checked(policy)?,
                ..self
            })
        }

        /// The same request in the state `state` (a policy, or one tier of it).
        #[inline]
        pub fn with_state(self, state: &'a StateName) -> Self {
            Self {
                state: state.to_ref(),
                ..self
            }
        }

        /// The storage name of the state charged (`""` unless named): [`StateName::as_str`](crate::StateName::as_str),
        /// the name stores key states by.
        #[inline]
        pub fn policy(&self) -> &'a str {
            self.state.as_str()
        }

        /// The state charged, typed: its policy and tier.
        #[inline]
        pub fn state(&self) -> StateRef<'a> {
            self.state
        }

        /// The key charged.
        #[inline]
        pub fn key(&self) -> Key<'a> {
            self.key
        }

        /// The limit the key is held to.
        #[inline]
        pub fn limit(&self) -> &$limit {
            &self.limit
        }
    };
}
pub(crate) use state_accessors;

/// One request: charge `cost` units to `key` under `limit`, in the state of `policy`.
///
/// A store keeps one state per *(policy, key)* pair: the same client limited per second and per
/// day is one key under two policies (`"per-second"`, `"per-day"`), which a batch checks
/// together. The policy name defaults to `""`. Naming policies also lets a policy's quota
/// change at runtime while its state carries over, and lets the Redis driver place all of one
/// key's policies in one Cluster slot.
///
/// ```
/// use distlimit_core::{Key, Limit, Quota, Request};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limit = Limit::token_bucket(Quota::per_second(10)?);
/// let request = Request::new(Key::new("user:42")?, limit).with_cost(3);
/// assert_eq!(request.cost(), 3);
/// assert_eq!(Request::peek(Key::new("user:42")?, limit).cost(), 0);
/// let daily = Request::new(Key::new("user:42")?, limit).with_policy("per-day")?;
/// assert_eq!(daily.policy(), "per-day");
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Request<'a> {
    state: StateRef<'a>,
    key: Key<'a>,
    limit: Limit,
    cost: u64,
}

/// Usage settled after the response, applied whatever is left ([`Store::settle_all`]; see
/// [`Store`], "Settling"): the request's cost is the units reported or given back.
///
/// ```
/// use distlimit_core::{Key, Limit, Quota, Request, Settle};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limit = Limit::token_bucket(Quota::per_minute(10_000)?);
/// let report = Settle::Report(Request::new(Key::new("user:42")?, limit).with_cost(1_200));
/// assert!(report.is_report());
/// assert_eq!(report.request().cost(), 1_200);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Settle<'a> {
    /// A forced charge: always applied, past the limit as debt ([`Limit::force`]).
    Report(Request<'a>),
    /// Unspent units given back ([`Limit::give_back`]): never above the capacity.
    GiveBack(Request<'a>),
}

/// Which of the two a [`Settle`] is, without its request: for APIs that build the requests
/// later (the policy limiter's items, a server's descriptors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SettleKind {
    /// A [`Settle::Report`].
    Report,
    /// A [`Settle::GiveBack`].
    GiveBack,
}

impl SettleKind {
    /// The settle of this kind of `request`.
    #[inline]
    pub fn of(self, request: Request<'_>) -> Settle<'_> {
        match self {
            SettleKind::Report => Settle::Report(request),
            SettleKind::GiveBack => Settle::GiveBack(request),
        }
    }
}

impl<'a> Settle<'a> {
    /// The request settled: its state, key, limit, and the units as its cost.
    #[inline]
    pub fn request(&self) -> &Request<'a> {
        match self {
            Settle::Report(r) | Settle::GiveBack(r) => r,
        }
    }

    /// Whether this is a report (else a give-back).
    #[inline]
    pub fn is_report(&self) -> bool {
        matches!(self, Settle::Report(_))
    }

    /// The same settle of another request.
    #[inline]
    pub fn with_request(self, request: Request<'a>) -> Self {
        match self {
            Settle::Report(_) => Settle::Report(request),
            Settle::GiveBack(_) => Settle::GiveBack(request),
        }
    }
}

impl<'a> Request<'a> {
    /// A request of cost 1.
    #[inline]
    pub fn new(key: Key<'a>, limit: Limit) -> Self {
        Self {
            state: StateRef::untyped(""),
            key,
            limit,
            cost: 1,
        }
    }

    /// A request of cost 0: it reports whether one unit would pass now and changes nothing.
    pub fn peek(key: Key<'a>, limit: Limit) -> Self {
        Self::new(key, limit).with_cost(0)
    }

    /// The same request with another cost (a weighted request).
    #[inline]
    pub fn with_cost(self, cost: u64) -> Self {
        Self { cost, ..self }
    }

    state_accessors!(Limit);

    /// The units charged if admitted (reported, or given back, when settled).
    #[inline]
    pub fn cost(&self) -> u64 {
        self.cost
    }
}

/// Checks that a batch for [`Store::decide_all`] is valid: 1 to [`MAX_BATCH`] requests, no
/// (policy, key) pair twice. Drivers call it first so every store rejects the same batches.
pub fn validate_batch(requests: &[Request<'_>]) -> Result<(), Error> {
    validate_pairs(requests.iter())
}

/// Checks that a batch for [`Store::settle_all`] is valid: as [`validate_batch`], each settle on
/// the token bucket or GCRA with at most [`MAX_REPORT`] units.
pub fn validate_settles(settles: &[Settle<'_>]) -> Result<(), Error> {
    for s in settles {
        s.request().limit.check_debt()?;
        if s.request().cost > MAX_REPORT {
            return Err(Error::InvalidRequest(
                "a report or give-back above MAX_REPORT units",
            ));
        }
    }
    validate_pairs(settles.iter().map(Settle::request))
}

/// 1 to [`MAX_BATCH`] requests, no (policy, key) pair twice.
fn validate_pairs<'r, 'a: 'r>(
    requests: impl ExactSizeIterator<Item = &'r Request<'a>> + Clone,
) -> Result<(), Error> {
    match requests.len() {
        0 => return Err(Error::InvalidRequest("empty batch")),
        n if n > MAX_BATCH => return Err(Error::InvalidRequest("batch larger than MAX_BATCH")),
        _ => {}
    }
    for (i, a) in requests.clone().enumerate() {
        if requests
            .clone()
            .take(i)
            .any(|b| b.key == a.key && b.policy() == a.policy())
        {
            return Err(Error::InvalidRequest(
                "the same key and policy twice in one batch",
            ));
        }
    }
    Ok(())
}

/// `requests` with each (policy, key) pair once, as [`validate_batch`] wants a batch: requests on
/// one pair become one, costing the sum of their costs, with the first one's limit. Also returns,
/// for each request, the index of the merged request whose decision answers it.
///
/// ```
/// use distlimit_core::{Key, Limit, Quota, Request, merge_batch};
///
/// let limit = Limit::gcra(Quota::per_second(10)?);
/// let a = Key::new("a")?;
/// let b = Key::new("b")?;
/// let requests = [
///     Request::new(a, limit),
///     Request::new(b, limit),
///     Request::new(a, limit).with_cost(2),
/// ];
/// let (merged, answered_by) = merge_batch(&requests);
/// assert_eq!(merged.len(), 2);
/// assert_eq!(merged[0].cost(), 3);
/// assert_eq!(answered_by, [0, 1, 0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn merge_batch<'a>(requests: &[Request<'a>]) -> (Vec<Request<'a>>, Vec<usize>) {
    let mut merged: Vec<Request<'a>> = Vec::with_capacity(requests.len());
    let mut answered_by = Vec::with_capacity(requests.len());
    for request in requests {
        let same = merged
            .iter_mut()
            .enumerate()
            .find(|(_, m)| m.policy() == request.policy() && m.key == request.key);
        match same {
            Some((slot, m)) => {
                m.cost = m.cost.saturating_add(request.cost);
                answered_by.push(slot);
            }
            None => {
                answered_by.push(merged.len());
                merged.push(*request);
            }
        }
    }
    (merged, answered_by)
}

/// Where rate-limit state lives: the contract a storage driver implements.
///
/// Object safe: `Arc<dyn Store>` works. Users call it through [`StoreExt`] or a limiter built on
/// top; drivers implement the two methods below.
///
/// # Contract
///
/// A store MUST:
/// * keep one state per (policy, key) pair: states of different policies, or of different keys,
///   never affect each other;
/// * decide every request exactly as [`Limit::decide`] would on that state at the store's
///   current time, atomically: concurrent requests on one key behave as if run one after another;
/// * treat a key without state (never seen, or forgotten after its state's
///   [`expires_at`](crate::State::expires_at)) as [`State::fresh`](crate::State::fresh);
/// * never charge a denied request, and never change anything for a request of cost 0;
/// * in [`decide_all`](Store::decide_all), charge either every request of the batch or none,
///   atomically, after [`validate_batch`];
/// * return `Err` only when it failed to decide, classified by [`Error::is_transient`]; never panic
///   on any key, quota or reply from its backend.
///
/// # Settling
///
/// [`settle_all`](Store::settle_all) applies a batch of [`Settle`]s (on the token bucket or GCRA;
/// the window algorithms answer [`Error::InvalidRequest`]): usage known only after the response.
/// A store that settles MUST:
/// * apply it always, atomically, exactly as [`Limit::force_from`] (a report: the cost charged
///   whatever is left, past the limit as debt) or [`Limit::give_back_from`] (a give-back: the
///   units returned, never above a full state) would on the request's state;
/// * answer what a peek (cost 0) answers right after it: allowed while a unit is available,
///   else denied with the exact `retry_after` until one is (the debt paid and a unit refilled);
/// * apply every settle of a batch (after [`validate_settles`]), each answered in order.
///
/// A store that cannot settle (the default method) answers [`Error::Unsupported`], never a
/// decision: a wrapper forwards `settle_all` explicitly, or it refuses to settle.
///
/// Reserve, then settle: a normal request reserves an estimate; the settle gives back
/// `reserved − actual` or reports `actual − reserved` (a request served without a reservation
/// reports its whole cost). What a key is charged is then exactly the sum of the actual costs,
/// and a key in debt is denied until the debt has refilled.
///
/// A store SHOULD forget state after it expires, so memory stays bounded, and document how it
/// reads time (its own clock, or a server's).
///
/// The `distlimit-test` crate checks all of this: run its conformance suite against your store.
///
/// # Example: a minimal driver
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::Mutex;
/// use async_trait::async_trait;
/// use distlimit_core::{
///     validate_batch, Clock, Decision, Error, Key, Limit, Quota, Request, State, Store, StoreExt,
///     SystemClock,
/// };
///
/// /// A state per (policy, key).
/// fn id(r: &Request<'_>) -> (String, Vec<u8>) {
///     (r.policy().to_owned(), r.key().as_bytes().to_vec())
/// }
///
/// #[derive(Default)]
/// struct MapStore(Mutex<HashMap<(String, Vec<u8>), State>>);
///
/// #[async_trait]
/// impl Store for MapStore {
///     async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
///         Ok(self.decide_all(std::slice::from_ref(request)).await?[0])
///     }
///
///     async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
///         validate_batch(requests)?;
///         let now = SystemClock.now_us();
///         let mut map = self.0.lock().map_err(|_| Error::InvalidRequest("poisoned"))?;
///         let decisions: Vec<Decision> = requests
///             .iter()
///             .map(|r| r.limit().evaluate(map.get(&id(r)), now, r.cost()))
///             .collect();
///         if !decisions.iter().all(Decision::is_allowed) {
///             // Nothing is charged: those that alone would pass are answered as peeks.
///             let peek = |(d, r): (Decision, &Request<'_>)| match d.is_allowed() {
///                 true => r.limit().evaluate(map.get(&id(r)), now, 0),
///                 false => d,
///             };
///             return Ok(decisions.into_iter().zip(requests).map(peek).collect());
///         }
///         for r in requests {
///             let state = map
///                 .entry(id(r))
///                 .or_insert_with(|| State::fresh(r.limit().algorithm()));
///             r.limit().decide(state, now, r.cost());
///         }
///         Ok(decisions)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MapStore::default();
/// let limit = Limit::token_bucket(Quota::per_minute(2)?);
/// assert!(store.check("alice", limit).await?.is_allowed());
/// assert!(store.check("alice", limit).await?.is_allowed());
/// assert!(store.check("alice", limit).await?.is_denied());
/// assert!(store.check("bob", limit).await?.is_allowed());
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Store: Send + Sync {
    /// Decides one request, charging it when admitted.
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error>;

    /// Decides a batch all-or-nothing: every request is charged, or none is.
    ///
    /// The answer has one decision per request, in order: what that request alone would have
    /// been answered. The batch was admitted (and charged) if and only if every decision is
    /// allowed; [`Decision::most_restrictive`] folds them into one. In a denied batch nothing
    /// is charged, so a request that alone would pass is answered as its peek (cost 0) would
    /// be: `remaining` and `reset_after` describe its state as it is.
    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error>;

    /// Decides one request without waiting, when the store can: `Some` holds exactly what
    /// [`decide`](Self::decide) would answer (and has charged it); `None`, the default, means
    /// "await `decide`". Stores that never do I/O (the memory store) answer here, so wrappers
    /// (the hybrid store's fallback path, the policy limiter) skip a boxed future. A store that
    /// answers `Some` once may still answer `None` later; callers must handle both.
    fn decide_now(&self, request: &Request<'_>) -> Option<Result<Decision, Error>> {
        let _ = request;
        None
    }

    /// Decides a batch without waiting, when the store can: `Some(Ok(()))` means `decisions`
    /// (one slot per request, in order) holds exactly what [`decide_all`](Self::decide_all)
    /// would answer, all-or-nothing, and the batch was charged if every one is allowed;
    /// `None`, the default, means "await `decide_all`", nothing charged. `decisions` must be as
    /// long as `requests` (else an [`Error::InvalidRequest`]). The caller gives the buffer, so
    /// a store that never waits (the memory store) decides a small batch without allocating.
    fn decide_all_now(
        &self,
        requests: &[Request<'_>],
        decisions: &mut [Decision],
    ) -> Option<Result<(), Error>> {
        let _ = (requests, decisions);
        None
    }

    /// Settles a batch (see "Settling"): every report and give-back applied, each answered by
    /// the peek after it. The default answers [`Error::Unsupported`]: a store that settles, and
    /// every wrapper, implements it.
    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        let _ = settles;
        Err(Error::Unsupported("settling"))
    }
}

/// `Arc<S>` and `Box<S>` are stores: every method forwarded, so none falls back to a default.
macro_rules! forward_store {
    ($($ptr:ident),*) => {$(
        #[async_trait]
        impl<S: Store + ?Sized> Store for $ptr<S> {
            async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
                (**self).decide(request).await
            }

            async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
                (**self).decide_all(requests).await
            }

            fn decide_now(&self, request: &Request<'_>) -> Option<Result<Decision, Error>> {
                (**self).decide_now(request)
            }

            fn decide_all_now(
                &self,
                requests: &[Request<'_>],
                decisions: &mut [Decision],
            ) -> Option<Result<(), Error>> {
                (**self).decide_all_now(requests, decisions)
            }

            async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
                (**self).settle_all(settles).await
            }
        }
    )*};
}
forward_store!(Arc, Box);

/// Conveniences for calling any [`Store`] with a plain key.
pub trait StoreExt: Store {
    /// Charges one unit to `key` under `limit`. An empty or oversized key is an
    /// [`Error::InvalidKey`].
    fn check<'a, K>(
        &'a self,
        key: &'a K,
        limit: Limit,
    ) -> impl Future<Output = Result<Decision, Error>> + Send + 'a
    where
        K: AsRef<[u8]> + Sync + ?Sized,
    {
        self.check_cost(key, limit, 1)
    }

    /// Charges `cost` units to `key` under `limit`.
    fn check_cost<'a, K>(
        &'a self,
        key: &'a K,
        limit: Limit,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send + 'a
    where
        K: AsRef<[u8]> + Sync + ?Sized,
    {
        async move {
            let request = Request::new(Key::new(key)?, limit).with_cost(cost);
            self.decide(&request).await
        }
    }

    /// Reports whether one unit would pass for `key` now, changing nothing.
    fn peek<'a, K>(
        &'a self,
        key: &'a K,
        limit: Limit,
    ) -> impl Future<Output = Result<Decision, Error>> + Send + 'a
    where
        K: AsRef<[u8]> + Sync + ?Sized,
    {
        self.check_cost(key, limit, 0)
    }

    /// Settles one report or give-back: [`Store::settle_all`] of one.
    fn settle<'a>(
        &'a self,
        settle: Settle<'a>,
    ) -> impl Future<Output = Result<Decision, Error>> + Send + 'a {
        async move {
            let mut decisions = self.settle_all(std::slice::from_ref(&settle)).await?;
            decisions
                .pop()
                .ok_or(Error::InvalidRequest("the store answered no decision"))
        }
    }
}

impl<S: Store + ?Sized> StoreExt for S {}
