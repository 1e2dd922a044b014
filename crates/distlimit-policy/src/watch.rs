//! Hot reload of a policy file: [`watch`], a [`PolicyFile`] run through [`poll_files`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use distlimit_core::Store;

use crate::config::read_error;
use crate::error::Field;
use crate::reload::{FileWatcher, Reloadable, poll_files};
use crate::{Limiter, PolicyConfigError, PolicySet};

/// A TOML policy file that replaces a [`Limiter`]'s set when its content changes: the
/// [`Reloadable`] behind [`watch`], for callers that run it through [`poll_files`] themselves
/// (with a hangup signal, or a look at each new set).
///
/// Its contents are the file's bytes. A changed version is parsed and
/// [`replace`](Limiter::replace)s the set; one that does not parse or validate, defines no
/// policy (an empty or half-written file) or lacks a [declared](Limiter::declare) policy, or a
/// file that cannot be read, is a [`PolicyConfigError`] (a [`Field::File`] one for the read).
/// It is gone (the poller ends) when the limiter is dropped.
pub struct PolicyFile<S: Store + ?Sized + 'static> {
    limiter: Weak<Limiter<S>>,
    path: PathBuf,
    inspect: Option<Inspect>,
}

/// A look at each valid new set, before it applies.
type Inspect = Box<dyn Fn(&PolicySet) + Send + Sync>;

impl<S: Store + ?Sized + 'static> PolicyFile<S> {
    /// The file at `path`, applied to `limiter` (which it does not keep alive).
    pub fn new(limiter: &Arc<Limiter<S>>, path: impl Into<PathBuf>) -> Self {
        Self {
            limiter: Arc::downgrade(limiter),
            path: path.into(),
            inspect: None,
        }
    }

    /// Calls `inspect` with each valid new set just before it replaces the running one (to
    /// warn about a part of it the caller cannot change while running, for example).
    #[must_use]
    pub fn inspect(mut self, inspect: impl Fn(&PolicySet) + Send + Sync + 'static) -> Self {
        self.inspect = Some(Box::new(inspect));
        self
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl<S: Store + ?Sized + 'static> fmt::Debug for PolicyFile<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl<S: Store + ?Sized + 'static> Reloadable for PolicyFile<S> {
    type Contents = Vec<u8>;
    type Error = PolicyConfigError;

    fn read(&self) -> Result<Vec<u8>, PolicyConfigError> {
        std::fs::read(&self.path).map_err(|e| read_error(&self.path, e))
    }

    fn apply(&self, bytes: &Vec<u8>) -> Result<bool, PolicyConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            PolicyConfigError::new(Field::File, format!("{} is not UTF-8", self.path.display()))
                .with_source(e)
        })?;
        let set = PolicySet::from_toml_str(text)?;
        let Some(limiter) = self.limiter.upgrade() else {
            // Dropped meanwhile: the poller ends at its next look.
            return Ok(false);
        };
        if let Some(inspect) = &self.inspect {
            inspect(&set);
        }
        limiter.replace(set).map(|()| true)
    }

    fn is_gone(&self) -> bool {
        self.limiter.strong_count() == 0
    }

    fn describe(error: &PolicyConfigError) -> String {
        let cause = std::error::Error::source(error);
        cause.map_or_else(|| error.to_string(), |cause| format!("{error}: {cause}"))
    }
}

/// Watches the TOML file at `path`: reads it now and then every `interval`, and applies each
/// changed version to `limiter` (a [`PolicyFile`] run through [`poll_files`], which says what
/// is logged and reported). A refused version changes nothing: the limiter keeps its set, and
/// [`Reload::Rejected`](crate::Reload::Rejected) says why until the file is fixed. Polling stops
/// when the watcher or the limiter is dropped.
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
) -> Result<FileWatcher, PolicyConfigError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
        PolicyConfigError::new(Field::Runtime, "watch needs a Tokio runtime").with_source(e)
    })?;
    let file = PolicyFile::new(limiter, path);
    let what = format!("policy file {}", file.path().display());
    Ok(poll_files(&runtime, what, file, interval, None))
}
