//! The integration tests of `distlimit-demo` in one binary: each `tests/<file>.rs` is a module.
//!
//! `Cargo.toml` names this file the crate's one test target (`autotests = false`): a new test
//! file is one more `mod` line here.

// Test code panics on a failed setup or check; this also covers `support`, which each file's
// own `#![allow]` covered when the file was a crate root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

mod debt;
mod durable;
mod e2e;
mod hardening;
mod in_flight;
mod limits;
mod operations;
mod regions;
mod service;
mod stream;
