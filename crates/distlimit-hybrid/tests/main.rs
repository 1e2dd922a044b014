//! The integration tests of `distlimit-hybrid` in one binary: each `tests/<file>.rs` is a module.
//!
//! `Cargo.toml` names this file the crate's one test target (`autotests = false`): a new test
//! file is one more `mod` line here.

// Test code panics on a failed setup or check; this also covers `support`, which each file's
// own `#![allow]` covered when the file was a crate root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod conformance;
mod conformance_redis;
mod lease;
mod opening_rule;
mod permits;
mod redis_faults;
mod state_machine;
