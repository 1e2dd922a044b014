//! The integration tests of `distlimit-policy` in one binary: each `tests/<file>.rs` is a module.
//!
//! `Cargo.toml` names this file a test target (`autotests = false`): a new test file is one more
//! `mod` line here. Binaries of their own, as their tests must not run beside others':
//! - `alloc.rs` counts allocations with a global allocator.

// Test code panics on a failed setup or check; this also covers `support`, which each file's
// own `#![allow]` covered when the file was a crate root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

mod bad_input;
mod cidr;
mod declare;
mod limiter;
mod policy_change;
mod proptest;
mod reload;
mod reload_log;
mod stress;
