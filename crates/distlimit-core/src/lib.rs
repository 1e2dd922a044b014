#![doc = include_str!("../README.md")]

pub mod algorithm;
mod clock;
mod decision;
mod error;
mod key;
mod lease;
pub mod observe;
mod permit;
mod quota;
mod state_name;
mod store;

pub use algorithm::{
    Algorithm, DebtUnsupported, Limit, MAX_DEFICIT, MAX_REPORT, MAX_TAT, State, UnknownAlgorithm,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Decision, NEVER, Source};
pub use error::{BoxError, Error, NotDurable, NotSent};
pub use key::{Key, KeyError, MAX_KEY_LEN, MAX_POLICY_LEN};
pub use lease::{Grant, LeaseStore, LeaseUnsupported};
pub use observe::{
    BreakerState, LeaseObserver, NoopObserver, Observer, Outcome, PermitEvent, PolicyObserver,
    RedisObserver, StreamEvent,
};
pub use permit::{
    MAX_IN_FLIGHT, MAX_PERMIT_ID, MAX_PERMIT_LEASE, MIN_PERMIT_LEASE, PermitDecision, PermitError,
    PermitId, PermitLimit, PermitRequest, PermitStore, Permits,
};
pub use quota::{MAX_LIMIT, MAX_PERIOD_US, MAX_SCALED, Quota, QuotaError, WINDOW_STEPS};
pub use state_name::{StateName, StateRef};
pub use store::{
    MAX_BATCH, Request, Settle, SettleKind, Store, StoreExt, merge_batch, validate_batch,
    validate_settles,
};
