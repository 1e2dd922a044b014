//! The synchronisation primitives the store uses: `parking_lot` normally, loom's under
//! `--cfg distlimit_loom` so the loom models explore every interleaving of the shard locks.

#[cfg(not(distlimit_loom))]
pub(crate) use parking_lot::RwLock;

#[cfg(distlimit_loom)]
pub(crate) use self::loom_shim::RwLock;

#[cfg(distlimit_loom)]
mod loom_shim {
    /// A stand-in for `parking_lot::RwLock` with its signatures (no poisoning).
    ///
    /// It is a loom `Mutex`: loom 0.7's `RwLock` model panics when one thread holds write locks
    /// on several locks while another waits (tokio-rs/loom#300 and #423 are of the same family).
    /// Excluding readers too is stricter than the real lock, so every interleaving that
    /// matters for writers is still explored.
    #[derive(Debug)]
    pub(crate) struct RwLock<T>(loom::sync::Mutex<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn read(&self) -> loom::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }

        pub(crate) fn write(&self) -> loom::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }
}
