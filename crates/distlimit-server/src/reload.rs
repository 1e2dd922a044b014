//! Hot reload: the configuration path is read again every interval (and at once on SIGHUP) by
//! the one file poller ([`distlimit_serve::poll_files`]), and a changed set of files replaces
//! the running configuration when it is valid.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use crate::check::Checker;
use crate::config::{Config, Source, read_sources};
use crate::metrics::LoadResult;

/// The last thing a reload did: the poller's event, its `Rejected` error naming the file, the
/// line and the field.
pub type Reload = distlimit_serve::Reload<String>;

/// A running reload task; dropping it stops the task.
pub type Watcher = distlimit_serve::FileWatcher<String>;

/// Starts reloading `path` into `checker` every `interval`, and at once when `hangup`'s value
/// changes (SIGHUP); `loaded` is what the running configuration was read from. Every load
/// counts in `distlimit_server_config_loads_total`. Needs a Tokio runtime.
pub(crate) fn watch(
    checker: Arc<Checker>,
    path: PathBuf,
    interval: Duration,
    loaded: Vec<Source>,
    hangup: watch::Receiver<u64>,
) -> Watcher {
    let files = ConfigFiles {
        checker,
        path,
        loaded: Mutex::new(Some(loaded)),
    };
    distlimit_serve::poll_files(
        &tokio::runtime::Handle::current(),
        "configuration",
        files,
        interval,
        Some(hangup),
    )
}

/// The configuration path as the poller sees it.
struct ConfigFiles {
    checker: Arc<Checker>,
    path: PathBuf,
    /// What the running configuration was read from, until the poller takes it.
    loaded: Mutex<Option<Vec<Source>>>,
}

impl distlimit_serve::Reloadable for ConfigFiles {
    /// The sources, or the message of the error reading them: an error read again is no change,
    /// so each distinct one counts once in the metrics.
    type Contents = Result<Vec<Source>, String>;
    type Error = String;

    fn read(&self) -> Result<Self::Contents, String> {
        Ok(read_sources(&self.path).map_err(|error| error.to_string()))
    }

    fn apply(&self, read: &Self::Contents) -> Result<bool, String> {
        let metrics = self.checker.request_metrics();
        let config = match read {
            Ok(sources) => Config::from_sources(sources).map_err(|error| error.to_string()),
            Err(error) => Err(error.clone()),
        };
        match config {
            Ok(config) => {
                tracing::info!(
                    path = %self.path.display(),
                    domains = config.domains().count(),
                    "configuration read"
                );
                self.checker.set_config(config);
                metrics.on_config_load(LoadResult::success);
                Ok(true)
            }
            Err(error) => {
                metrics.on_config_load(LoadResult::error);
                Err(error)
            }
        }
    }

    fn running(&self) -> Option<Self::Contents> {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        loaded.take().map(Ok)
    }
}
