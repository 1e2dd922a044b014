//! The integration tests of `distlimit-redis` in one binary: each `tests/<file>.rs` is a module.
//!
//! `Cargo.toml` names this file a test target (`autotests = false`): a new test file is one more
//! `mod` line here. Binaries of their own, as their tests must not run beside others':
//! - `bad_input.rs` pauses the shared Cluster's primaries.
//! - `failover.rs` fails the shared Cluster and Sentinel primaries over and flushes their scripts.

// Test code panics on a failed setup or check; this also covers `support`, which each file's
// own `#![allow]` covered when the file was a crate root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

mod bad_state;
mod cluster_conformance;
mod cluster_outage;
mod cluster_tiers;
mod coalesce;
mod concurrency;
mod conformance;
mod crash;
mod differential;
mod durable;
mod lease;
mod permits;
mod pool;
mod reconnect;
mod regions;
mod sentinel_outage;
