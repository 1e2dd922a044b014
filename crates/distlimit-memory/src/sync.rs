//! The shard lock: a spin lock that yields to the scheduler while it waits (`spin`'s
//! `SpinMutex` with `relax::Yield`), or loom's mutex under `--cfg distlimit_loom` so the loom
//! models explore every interleaving of the shard locks.
//!
//! Not `parking_lot`'s `RwLock`: taking and releasing it are two locked instructions, and a
//! decision on a hot key is bound by their latency rather than by its own instructions. The spin
//! lock releases with a plain store, one locked instruction per decision: 15 % less time on a hot
//! key, and less under contention too, where parking_lot parks the waiters of a lock held for tens
//! of nanoseconds (ARCHITECTURE.md, "Decisions and their reasons"). Readers are rare (peeks,
//! `len`), so they take the lock like writers.

#[cfg(not(distlimit_loom))]
pub(crate) use self::spin_lock::Lock;

#[cfg(not(distlimit_loom))]
mod spin_lock {
    /// A shard's lock.
    #[derive(Debug)]
    pub(crate) struct Lock<T>(spin::mutex::SpinMutex<T, spin::relax::Yield>);

    impl<T> Lock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(spin::mutex::SpinMutex::new(value))
        }

        pub(crate) fn lock(&self) -> spin::mutex::SpinMutexGuard<'_, T> {
            self.0.lock()
        }
    }
}

#[cfg(distlimit_loom)]
pub(crate) use self::loom_shim::Lock;

#[cfg(distlimit_loom)]
mod loom_shim {
    /// The shard lock as a loom `Mutex` (no poisoning).
    #[derive(Debug)]
    pub(crate) struct Lock<T>(loom::sync::Mutex<T>);

    impl<T> Lock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }
}
