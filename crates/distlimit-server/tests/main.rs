//! The integration tests of `distlimit-server` in one binary: each `tests/<file>.rs` is a module.
//!
//! `Cargo.toml` names this file the crate's one test target (`autotests = false`): a new test
//! file is one more `mod` line here.

// Test code panics on a failed setup or check; this also covers `support`, which each file's
// own `#![allow]` covered when the file was a crate root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

mod compat;
mod config_reload;
mod decisions;
mod envoyproxy;
mod framing;
mod http;
mod operations;
mod policies;
mod quota_model;
mod redis;
mod reload;
mod report;
mod rlqs;
mod rls;
mod serving;
mod tls;
mod writes;
mod yaml_flags;
