//! The conformance suite every distlimit [`Store`] runs against itself, and a fault-injecting
//! [`FaultyStore`] for testing what sits on top of stores.
//!
//! The [`Store`] contract says a store decides every request exactly as the reference model
//! [`Limit::decide`](distlimit_core::Limit::decide) would, atomically, never charging a denied
//! request or a peek, all-or-nothing in batches. This crate checks all of it, the way
//! `object_store`'s integration suite checks its backends: our drivers (memory, Redis) and
//! third-party ones run the very same checks.
//!
//! # How a driver runs the suite
//!
//! The checks drive time, so the store under test must read a
//! [`ManualClock`]: it is built by a *factory*, an async function or closure from a
//! `ManualClock` to the store. Every check gets its own clock (from [`new_clock`], at
//! [`EPOCH_US`]) and its own store from the factory, and uses only fresh keys under a unique
//! prefix ([`unique_prefix`]), so stores sharing one backend (one Redis server) can run every
//! check concurrently, from several processes, without interfering.
//!
//! In the driver's integration tests, [`conformance_tests!`] expands to one `#[test]` per check
//! (so failures are reported per check, under the same names for every driver):
//!
//! ```
//! # use distlimit_core::{Decision, Error, Request, Store};
//! # use distlimit_core::ManualClock;
//! # struct MyStore(ManualClock);
//! # impl MyStore { fn with_clock(clock: ManualClock) -> Self { Self(clock) } }
//! # #[async_trait::async_trait]
//! # impl Store for MyStore {
//! #     async fn decide(&self, _: &Request<'_>) -> Result<Decision, Error> { todo!() }
//! #     async fn decide_all(&self, _: &[Request<'_>]) -> Result<Vec<Decision>, Error> { todo!() }
//! # }
//! // tests/conformance.rs
//! distlimit_test::conformance_tests!(|clock| async move { MyStore::with_clock(clock) });
//! // Test names: conformance::fresh_key_admits_capacity, conformance::retry_after_is_exact, ...
//!
//! // Several configurations in one file: name the module.
//! distlimit_test::conformance_tests!(boxed, |clock| async move {
//!     Box::new(MyStore::with_clock(clock)) as Box<dyn Store>
//! });
//! # fn main() {}
//! ```
//!
//! Or run every check in one test with [`run_all`]. Here against a minimal driver, a map of
//! [`State`](distlimit_core::State)s under a mutex that reads a `ManualClock`:
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::Mutex;
//!
//! use async_trait::async_trait;
//! use distlimit_core::{
//!     validate_batch, Clock, Decision, Error, ManualClock, Request, State, Store,
//! };
//!
//! struct MapStore {
//!     clock: ManualClock,
//!     // One state per (policy, key).
//!     states: Mutex<HashMap<(String, Vec<u8>), State>>,
//! }
//!
//! fn id(r: &Request<'_>) -> (String, Vec<u8>) {
//!     (r.policy().to_owned(), r.key().as_bytes().to_vec())
//! }
//!
//! #[async_trait]
//! impl Store for MapStore {
//!     async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
//!         Ok(self.decide_all(std::slice::from_ref(request)).await?[0])
//!     }
//!
//!     async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
//!         validate_batch(requests)?;
//!         let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
//!         let now = self.clock.now_us();
//!         let decisions: Vec<Decision> = requests
//!             .iter()
//!             .map(|r| r.limit().evaluate(states.get(&id(r)), now, r.cost()))
//!             .collect();
//!         if !decisions.iter().all(Decision::is_allowed) {
//!             // Nothing is charged: those that alone would pass are answered as peeks.
//!             let peek = |(d, r): (Decision, &Request<'_>)| match d.is_allowed() {
//!                 true => r.limit().evaluate(states.get(&id(r)), now, 0),
//!                 false => d,
//!             };
//!             return Ok(decisions.into_iter().zip(requests).map(peek).collect());
//!         }
//!         for r in requests {
//!             let state = states
//!                 .entry(id(r))
//!                 .or_insert_with(|| State::fresh(r.limit().algorithm()));
//!             r.limit().decide(state, now, r.cost());
//!         }
//!         Ok(decisions)
//!     }
//! }
//!
//! #[tokio::main] // multi-threaded, for the concurrency checks
//! async fn main() {
//!     distlimit_test::run_all(|clock| async move {
//!         MapStore { clock, states: Mutex::default() }
//!     })
//!     .await;
//! }
//! ```
//!
//! A store that reads time elsewhere (a Redis server's `TIME`) needs a mode that reads the given
//! clock instead to run the suite; it must then derive key expiries from that clock too (relative
//! TTLs), since the clock reads a fixed date in 2023.
//!
//! # The checks
//!
//! Each check is a `pub async fn check_*(store, clock)` that panics with a precise message on the
//! first contract violation, so they can also be called one by one. All take `&S` for any
//! `S: Store + ?Sized`, except the two concurrency checks, which spawn Tokio tasks and take
//! `&Arc<S>` with `S: 'static`. Every loop is bounded and no check sleeps: against an in-memory
//! store each takes well under a second. [`CHECKS`] lists their names.
//!
//! | check | what it asserts |
//! |---|---|
//! | [`check_fresh_key_admits_capacity`] | exactly `capacity()` at once, then a finite denial |
//! | [`check_retry_after_is_exact`] | denied 1 µs before `now + retry_after`, admitted at it |
//! | [`check_matches_reference_model`] | 200-step random walks equal `Limit::decide` at every step |
//! | [`check_peek_changes_nothing`] | cost 0 answers, never charges |
//! | [`check_cost_above_capacity_is_never`] | `is_never()`, nothing charged |
//! | [`check_denied_request_is_not_charged`] | denials leave the units and the retry time alone |
//! | [`check_keys_are_independent`] | one key's state never leaks to another |
//! | [`check_key_bytes_are_opaque`] | braces, NUL, invalid UTF-8, `MAX_KEY_LEN`: all distinct keys |
//! | [`check_decide_all_is_all_or_nothing`] | a batch charges every key or none |
//! | [`check_decide_all_rejects_invalid_batches`] | empty, oversized, duplicate: `InvalidRequest`, nothing charged |
//! | [`check_limit_change_follows_model`] | one key under several limits in turn |
//! | [`check_clock_going_backwards_follows_model`] | backward clock steps as the model handles them |
//! | [`check_idle_key_decides_as_fresh`] | from `State::expires_at` on, a key is fresh |
//! | [`check_concurrent_requests_admit_exactly_limit`] | 32 racing tasks, capacity 10: exactly 10 |
//! | [`check_concurrent_batches_are_atomic`] | racing batches over a shared key stay all-or-nothing |
//! | [`check_store_ext_validates_keys`] | `check`, `check_cost`, `peek` reject empty and long keys |
//! | [`check_policies_are_independent`] | one key under two policies: two states, one valid batch |
//!
//! # Fault injection
//!
//! [`FaultyStore`] wraps any store and answers each call from a script of [`Fault`]s: pass
//! through, delay, fail with a transient or permanent [`FaultKind`], lose the reply after the
//! inner store applied the request, or hang. It passes the whole suite when it passes through.
//!
//! [`server::RedisServer`] is a real `redis-server` process a test owns (free loopback port, no
//! persistence): kill it (SIGKILL), pause and resume it (SIGSTOP/SIGCONT), restart it on the same
//! port, send it raw commands (`CLIENT PAUSE`, `INFO commandstats`). Dropping it kills it.
//!
//! # Feature flags
//!
//! None. The suite needs Tokio (the concurrency checks spawn tasks; the macro runs each check on
//! a multi-threaded runtime of its own).

mod checks;
mod faulty;
mod macros;
pub mod server;
mod support;

use std::future::Future;

use distlimit_core::{ManualClock, Store};

pub use checks::{
    check_clock_going_backwards_follows_model, check_concurrent_batches_are_atomic,
    check_concurrent_requests_admit_exactly_limit, check_cost_above_capacity_is_never,
    check_decide_all_is_all_or_nothing, check_decide_all_rejects_invalid_batches,
    check_denied_request_is_not_charged, check_fresh_key_admits_capacity,
    check_idle_key_decides_as_fresh, check_key_bytes_are_opaque, check_keys_are_independent,
    check_limit_change_follows_model, check_matches_reference_model, check_peek_changes_nothing,
    check_policies_are_independent, check_retry_after_is_exact, check_store_ext_validates_keys,
};
pub use faulty::{Fault, FaultKind, FaultyStore};

/// Where every check's clock starts: 2023-11-19T00:00:00Z in microseconds since the Unix epoch,
/// a multiple of ten days (so of every whole second, minute, hour and day period), so that
/// windows start where the clock does.
pub const EPOCH_US: u64 = 1_700_352_000_000_000;

/// A fresh clock reading [`EPOCH_US`], for one check.
pub fn new_clock() -> ManualClock {
    ManualClock::new(EPOCH_US)
}

/// A key prefix no other check, test or process uses: the process id, the wall-clock time in
/// nanoseconds and a per-process counter, then `tag`. Every check builds its keys under one, so
/// stores that share a backend never see two checks touch one key.
///
/// ```
/// let a = distlimit_test::unique_prefix("mine");
/// let b = distlimit_test::unique_prefix("mine");
/// assert_ne!(a, b);
/// assert!(a.ends_with(b":mine:"));
/// ```
pub fn unique_prefix(tag: &str) -> Vec<u8> {
    support::unique_prefix(tag)
}

/// The name of every check, in the order [`run_all`] runs them: also the test names
/// [`conformance_tests!`] generates, and each check's function name without `check_`.
pub const CHECKS: &[&str] = &crate::__for_each_check!(__check_names {});

/// Runs every check in turn, each with a fresh [`ManualClock`] (see [`new_clock`]) and a store
/// `factory` built from it; panics at the first contract violation.
///
/// Call it within a Tokio runtime with time enabled, preferably multi-threaded (the concurrency
/// checks spawn tasks). [`conformance_tests!`] is usually better: one test per check.
///
/// ```
/// # use distlimit_core::{Decision, Error, ManualClock, Request, Store};
/// # struct MyStore;
/// # impl MyStore { async fn connect(_: ManualClock) -> Self { MyStore } }
/// # #[async_trait::async_trait]
/// # impl Store for MyStore {
/// #     async fn decide(&self, _: &Request<'_>) -> Result<Decision, Error> { todo!() }
/// #     async fn decide_all(&self, _: &[Request<'_>]) -> Result<Vec<Decision>, Error> { todo!() }
/// # }
/// #[tokio::test(flavor = "multi_thread")]
/// async fn conformance() {
///     distlimit_test::run_all(MyStore::connect).await;
/// }
/// # fn main() {}
/// ```
pub async fn run_all<F, Fut, S>(factory: F)
where
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = S>,
    S: Store + 'static,
{
    crate::__for_each_check!(__run_all_body { factory });
}

/// Support for the macros; not part of the API.
#[doc(hidden)]
pub mod __private {
    use std::future::Future;
    use std::sync::Arc;

    use distlimit_core::ManualClock;

    /// Constrains a factory's type, so a closure's parameter is known to be a `ManualClock`.
    pub fn factory<F, Fut, S>(factory: F) -> F
    where
        F: Fn(ManualClock) -> Fut,
        Fut: Future<Output = S>,
    {
        factory
    }

    /// Builds one check's clock (see [`new_clock`](crate::new_clock)) and the factory's store
    /// for it, behind an `Arc` (the concurrency checks share it with spawned tasks).
    pub async fn setup<F, Fut, S>(factory: &F) -> (Arc<S>, ManualClock)
    where
        F: Fn(ManualClock) -> Fut,
        Fut: Future<Output = S>,
    {
        let clock = crate::new_clock();
        let store = Arc::new(factory(clock.clone()).await);
        (store, clock)
    }

    /// Runs `future` to completion on a fresh multi-threaded Tokio runtime.
    #[allow(clippy::panic)] // test support: a runtime that cannot start fails the test
    pub fn block_on<F: Future>(future: F) -> F::Output {
        match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime.block_on(future),
            Err(e) => panic!("distlimit-test: cannot start a Tokio runtime: {e}"),
        }
    }
}
