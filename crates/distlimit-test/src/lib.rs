#![doc = include_str!("../README.md")]

mod checks;
mod faulty;
mod macros;
mod permit_checks;
mod proxy;
#[cfg(feature = "redis")]
pub mod server;
mod support;

use std::ffi::OsString;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use distlimit_core::{ManualClock, Store};

pub use checks::*;
pub use faulty::{Fault, FaultKind, FaultyStore};
pub use permit_checks::*;
pub use proxy::Proxy;

/// Where every check's clock starts: 2023-11-19T00:00:00Z in microseconds since the Unix epoch,
/// a multiple of ten days (so of every whole second, minute, hour and day period), so that
/// windows start where the clock does.
pub const EPOCH_US: u64 = 1_700_352_000_000_000;

/// A fresh clock reading [`EPOCH_US`], for one check.
pub fn new_clock() -> ManualClock {
    ManualClock::new(EPOCH_US)
}

/// A key prefix no other check, test or process uses: the process id, the wall-clock time in
/// nanoseconds and a per-process counter, then `tag`. Every check builds its keys under one, so
/// stores that share a backend never see two checks touch one key.
///
/// ```
/// let a = distlimit_test::unique_prefix("mine");
/// let b = distlimit_test::unique_prefix("mine");
/// assert_ne!(a, b);
/// assert!(a.ends_with(b":mine:"));
/// ```
pub fn unique_prefix(tag: &str) -> Vec<u8> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("dlt:{}:{nanos:x}:{n}:{tag}:", std::process::id()).into_bytes()
}

/// Replaces the file at `path` with `contents` through a rename in its directory, as editors
/// and Kubernetes ConfigMaps do, so that a reloader polling it never reads it empty or half
/// written. The new contents are first written to `.<name>.tmp` beside it: a dot file, which
/// directory watchers skip.
///
/// # Errors
///
/// Writing or renaming the temporary file; a `path` without a file name is
/// [`InvalidInput`](std::io::ErrorKind::InvalidInput).
pub fn replace_file(path: &Path, contents: impl AsRef<[u8]>) -> std::io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a path without a file name",
        )
    })?;
    let mut temporary = OsString::from(".");
    temporary.push(name);
    temporary.push(".tmp");
    let temporary = path.with_file_name(temporary);
    std::fs::write(&temporary, contents)?;
    std::fs::rename(&temporary, path)
}

/// The name of every check, in the order [`run_all`] runs them: also the test names
/// [`conformance_tests!`] generates, and each check's function name without `check_`.
pub const CHECKS: &[&str] = &crate::__for_each_check!(__check_names {});

/// The name of every permit check (the tests [`permit_conformance_tests!`] generates).
pub const PERMIT_CHECKS: &[&str] = &crate::__for_each_permit_check!(__check_names {});

/// Runs every check in turn, each with a fresh [`ManualClock`] (see [`new_clock`]) and a store
/// `factory` built from it; panics at the first contract violation.
///
/// Call it within a Tokio runtime with time enabled, preferably multi-threaded (the concurrency
/// checks spawn tasks). [`conformance_tests!`] is usually better: one test per check.
pub async fn run_all<F, Fut, S>(factory: F)
where
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = S>,
    S: Store + 'static,
{
    crate::__for_each_check!(__run_all_body { factory });
}

/// Support for the macros; not part of the API.
#[doc(hidden)]
pub mod __private {
    use std::future::Future;
    use std::sync::Arc;

    use distlimit_core::ManualClock;

    /// Constrains a factory's type, so a closure's parameter is known to be a `ManualClock`.
    pub fn factory<F, Fut, S>(factory: F) -> F
    where
        F: Fn(ManualClock) -> Fut,
        Fut: Future<Output = S>,
    {
        factory
    }

    /// Builds one check's clock (see [`new_clock`](crate::new_clock)) and the factory's store
    /// for it, behind an `Arc` (the concurrency checks share it with spawned tasks).
    pub async fn setup<F, Fut, S>(factory: &F) -> (Arc<S>, ManualClock)
    where
        F: Fn(ManualClock) -> Fut,
        Fut: Future<Output = S>,
    {
        let clock = crate::new_clock();
        let store = Arc::new(factory(clock.clone()).await);
        (store, clock)
    }

    /// Runs `future` to completion on a fresh multi-threaded Tokio runtime.
    #[allow(clippy::panic)] // test support: a runtime that cannot start fails the test
    pub fn block_on<F: Future>(future: F) -> F::Output {
        match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime.block_on(future),
            Err(e) => panic!("distlimit-test: cannot start a Tokio runtime: {e}"),
        }
    }
}
