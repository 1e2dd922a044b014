//! The distlimit contract: quotas, keys, decisions, the [`Store`] trait every storage driver
//! implements, and the pure reference algorithms every driver must agree with.
//!
//! distlimit enforces one rate limit across many instances of a service. This crate does no I/O
//! and depends on no runtime: it defines *what* a correct decision is. The drivers decide *where*
//! the state lives: `distlimit-memory` (in process, 64 shards), `distlimit-redis` (one atomic Lua
//! script per decision) or your own, checked with the `distlimit-test` conformance suite.
//!
//! * [`Quota`]: `limit` per `period`, `burst` at once; invalid quotas are [`QuotaError`]s.
//! * [`Algorithm`] and [`Limit`]: token bucket, GCRA, fixed window, sliding log, sliding window
//!   counter, each a pure function over a [`State`], exact in integer microseconds.
//! * [`Decision`]: allowed or denied, `remaining`, `reset_after`, an exact `retry_after`. A denial
//!   is a value; [`Error`] means the store failed.
//! * [`Store`] and [`StoreExt`]: the object-safe contract and its conveniences.
//! * [`Clock`]: [`SystemClock`] and a [`ManualClock`] for tests.
//! * [`Observer`]: the events the limiter and stores report ([`Outcome`], [`BreakerState`],
//!   [`Source`]), which `distlimit-metrics` exports.
//!
//! # Example
//!
//! The reference model on its own, with explicit time:
//!
//! ```
//! use distlimit_core::{Limit, Quota, State};
//!
//! # fn main() -> Result<(), distlimit_core::QuotaError> {
//! // 60 per minute, 10 at once.
//! let limit = Limit::token_bucket(Quota::per_minute(60)?.with_burst(10)?);
//! let mut state = State::fresh(limit.algorithm());
//!
//! let mut now = 1_700_000_000_000_000; // µs since the epoch
//! for _ in 0..10 {
//!     assert!(limit.decide(&mut state, now, 1).is_allowed());
//! }
//! let denied = limit.decide(&mut state, now, 1);
//! assert!(denied.is_denied());
//! assert_eq!(denied.retry_after().as_secs(), 1); // one token per second
//!
//! now += 1_000_000;
//! assert!(limit.decide(&mut state, now, 1).is_allowed());
//! # Ok(()) }
//! ```
//!
//! # Feature flags
//!
//! None: the crate is always the whole contract.

pub mod algorithm;
mod clock;
mod decision;
mod error;
mod key;
pub mod observe;
mod quota;
mod store;

pub use algorithm::{Algorithm, Limit, State, UnknownAlgorithm};
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Decision, NEVER, Source};
pub use error::{BoxError, Error};
pub use key::{Key, KeyError, MAX_KEY_LEN, MAX_POLICY_LEN};
pub use observe::{BreakerState, NoopObserver, Observer, Outcome};
pub use quota::{MAX_LIMIT, MAX_PERIOD_US, MAX_SCALED, Quota, QuotaError, WINDOW_STEPS};
pub use store::{MAX_BATCH, Request, Store, StoreExt, validate_batch};
