//! The synchronisation primitives of the circuit breaker: `std` atomics and `parking_lot`
//! normally, loom's under `--cfg distlimit_loom` so the loom models explore every interleaving.

#[cfg(not(distlimit_loom))]
pub(crate) use parking_lot::Mutex;
#[cfg(not(distlimit_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};

#[cfg(distlimit_loom)]
pub(crate) use self::loom_shim::Mutex;
#[cfg(distlimit_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};

#[cfg(distlimit_loom)]
mod loom_shim {
    /// A stand-in for `parking_lot::Mutex` with its signature (no poisoning).
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }
}
