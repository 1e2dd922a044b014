#![doc = include_str!("../README.md")]

mod coalesce;
mod config;
mod connection;
mod durable;
mod layout;
mod lease;
mod permits;
pub mod region;
mod script;
mod store;

pub use config::{
    DEFAULT_COALESCE_IN_FLIGHT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT,
    RedisStoreBuilder,
};
pub use distlimit_core::{NotDurable, RedisObserver};
pub use layout::{CLUSTER_SLOTS, DEFAULT_PREFIX, KeyLayout, MAX_PREFIX_LEN, hash_slot};
pub use permits::PERMIT_SUFFIX;
pub use region::{HomeUnreachable, RegionBuilder, RegionStats, RegionStore};
pub use store::{Mode, RedisStore};

/// What the crate's own tests and bench need of the script driver; not an API (no stability
/// promise, may change in any release).
#[doc(hidden)]
pub mod test_hook {
    pub use crate::script::{
        CLIENT_TTL_SLACK, ENTRY_SCRIPT, ENTRY_SHA, MAX_CLIENT_TIME_US, POOL_REPLY, ScriptRequest,
        TimeSource, decide, decide_all, load_scripts, pool_step, settle, single_argument,
    };
}
