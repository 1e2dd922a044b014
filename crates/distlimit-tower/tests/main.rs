//! The integration tests of `distlimit-tower` in one binary: each `tests/<file>.rs` is a module.
//!
//! `Cargo.toml` names this file a test target (`autotests = false`): a new test file is one more
//! `mod` line here. Binaries of their own, as their tests must not run beside others':
//! - `alloc.rs` counts allocations with a global allocator.

// Test code panics on a failed setup or check; this also covers `support`, which each file's
// own `#![allow]` covered when the file was a crate root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

mod declare;
mod failure;
mod grpc;
mod http;
mod hybrid;
mod in_flight;
mod limits;
mod quickstart;
mod settle;
mod spoofing;
mod stream;
