//! Hot reload: [`watch`] polls a TOML file and publishes each valid new version into a
//! [`Limiter`]; an invalid version keeps the running set and is reported.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use distlimit_core::Store;
use tokio::sync::watch as channel;
use tokio::task::JoinHandle;

use crate::config::read_error;
use crate::error::Field;
use crate::{Limiter, PolicyConfigError, PolicySet};

/// What the last look at the watched file found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reload {
    /// The file has not been read yet.
    Waiting,
    /// The file's current content is the active policy set; `generation` counts the sets this
    /// watcher published (1 for the first).
    Applied {
        /// Sets published so far.
        generation: u64,
    },
    /// The file's current content was rejected (or the file could not be read); the limiter
    /// keeps the set it had.
    Rejected {
        /// Why.
        error: PolicyConfigError,
    },
}

/// A running hot reload started by [`watch`]. Dropping it stops the polling.
#[derive(Debug)]
pub struct ConfigWatcher {
    status: channel::Receiver<Reload>,
    task: JoinHandle<()>,
}

impl ConfigWatcher {
    /// What the last look at the file found.
    pub fn status(&self) -> Reload {
        self.status.borrow().clone()
    }

    /// The error of the file's current content, if it was rejected; `None` once a valid version
    /// is applied.
    pub fn last_error(&self) -> Option<PolicyConfigError> {
        match &*self.status.borrow() {
            Reload::Rejected { error } => Some(error.clone()),
            Reload::Waiting | Reload::Applied { .. } => None,
        }
    }

    /// A receiver notified at every change of [`status`](Self::status): await `changed()` on
    /// it to log rejected versions or to learn that a new set is active.
    pub fn subscribe(&self) -> channel::Receiver<Reload> {
        self.status.clone()
    }

    /// Whether polling has ended (the limiter was dropped).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops polling.
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for ConfigWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Watches the TOML file at `path`: reads it now and then every `interval`, and whenever its
/// content changed, parses it and [`replace`](Limiter::replace)s the limiter's set with it.
///
/// A version that does not parse or validate, defines no policy (an empty or half-written
/// file), or lacks a policy [declared](Limiter::declare) in use, or a file that cannot be read,
/// changes nothing: the limiter keeps its set, the refusal is logged at ERROR level (`tracing`)
/// and the watcher reports [`Reload::Rejected`] until the file is fixed. An applied version is
/// logged at INFO level. The file is compared by content (config files are small), so an edit is picked up even
/// when it keeps the size and the modification time. Polling stops when the watcher is dropped,
/// or when the limiter is.
///
/// Must be called inside a Tokio runtime (it spawns a task there); outside one it returns a
/// [`Field::Runtime`] error.
///
/// ```no_run
/// # use std::{sync::Arc, time::Duration};
/// # use distlimit_policy::{Limiter, PolicySet, watch};
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let policies = PolicySet::from_toml_file("/etc/myservice/limits.toml")?;
/// let limiter = Arc::new(Limiter::new(Arc::new(distlimit_memory::MemoryStore::new()), policies));
/// let watcher = watch(&limiter, "/etc/myservice/limits.toml", Duration::from_secs(1))?;
/// let mut events = watcher.subscribe();
/// tokio::spawn(async move {
///     while events.changed().await.is_ok() {
///         eprintln!("rate limits: {:?}", *events.borrow_and_update());
///     }
/// });
/// # Ok(()) }
/// ```
pub fn watch<S: Store + ?Sized + 'static>(
    limiter: &Arc<Limiter<S>>,
    path: impl Into<PathBuf>,
    interval: Duration,
) -> Result<ConfigWatcher, PolicyConfigError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
        PolicyConfigError::new(Field::Runtime, "watch needs a Tokio runtime").with_source(e)
    })?;
    let (tx, status) = channel::channel(Reload::Waiting);
    let task = runtime.spawn(poll(Arc::downgrade(limiter), path.into(), interval, tx));
    Ok(ConfigWatcher { status, task })
}

async fn poll<S: Store + ?Sized>(
    limiter: Weak<Limiter<S>>,
    path: PathBuf,
    interval: Duration,
    status: channel::Sender<Reload>,
) {
    let mut seen: Option<Vec<u8>> = None;
    let mut generation = 0;
    loop {
        let Some(limiter) = limiter.upgrade() else {
            return;
        };
        match tokio::fs::read(&path).await {
            Ok(bytes) if seen.as_deref() != Some(&bytes) => {
                let report = match parse(&bytes).and_then(|set| limiter.replace(set)) {
                    Ok(()) => {
                        generation += 1;
                        tracing::info!(path = %path.display(), generation, "policy file applied");
                        Reload::Applied { generation }
                    }
                    Err(error) => {
                        log_rejected(&path, &error);
                        Reload::Rejected { error }
                    }
                };
                status.send_replace(report);
                seen = Some(bytes);
            }
            Ok(_) => {}
            Err(e) => {
                seen = None;
                let error = read_error(&path, e);
                status.send_if_modified(|current| {
                    let fresh =
                        !matches!(current, Reload::Rejected { error: old } if *old == error);
                    if fresh {
                        log_rejected(&path, &error);
                        *current = Reload::Rejected { error };
                    }
                    fresh
                });
            }
        }
        drop(limiter);
        tokio::time::sleep(interval).await;
    }
}

/// Logs a refused version at ERROR level, with its cause.
fn log_rejected(path: &Path, error: &PolicyConfigError) {
    match std::error::Error::source(error) {
        Some(cause) => tracing::error!(
            path = %path.display(),
            "policy file rejected, the running policies are kept: {error}: {cause}"
        ),
        None => tracing::error!(
            path = %path.display(),
            "policy file rejected, the running policies are kept: {error}"
        ),
    }
}

fn parse(bytes: &[u8]) -> Result<PolicySet, PolicyConfigError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| PolicyConfigError::new(Field::File, "not UTF-8").with_source(e))?;
    PolicySet::from_toml_str(text)
}
