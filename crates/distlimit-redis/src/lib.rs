#![doc = include_str!("../README.md")]

mod coalesce;
mod config;
mod connection;
mod layout;
mod lease;
mod script;
mod store;

pub use config::{
    DEFAULT_COALESCE_IN_FLIGHT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT,
    RedisStoreBuilder,
};
pub use layout::{CLUSTER_SLOTS, DEFAULT_PREFIX, KeyLayout, MAX_PREFIX_LEN, hash_slot};
pub use store::{Mode, RedisStore};

/// What the crate's own tests and bench need of the script driver; not an API (no stability
/// promise, may change in any release).
#[doc(hidden)]
pub mod test_hook {
    pub use crate::script::{
        CLIENT_TTL_SLACK, MAX_CLIENT_TIME_US, ScriptRequest, TimeSource, decide, decide_all,
        load_scripts, script_sha1, script_source, settle, single_argument,
    };
}
