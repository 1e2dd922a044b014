#![doc = include_str!("../README.md")]

mod coalesce;
mod config;
mod connection;
mod layout;
mod lease;
pub mod script;
mod store;

pub use config::{
    DEFAULT_COALESCE_IN_FLIGHT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT,
    RedisStoreBuilder,
};
pub use layout::{CLUSTER_SLOTS, DEFAULT_PREFIX, KeyLayout, MAX_PREFIX_LEN, hash_slot};
pub use lease::lease_source;
pub use store::{Mode, RedisStore};
