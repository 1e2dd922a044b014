//! Hot reload: the configuration path is read again every interval (and at once on SIGHUP) by
//! the binaries' one file poller ([`distlimit_serve::poll_files`]), and a changed set of files
//! replaces the running configuration when it is valid.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
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
    // What was read last: the sources, or the message of the error reading them.
    let seen: Mutex<Result<Vec<Source>, String>> = Mutex::new(Ok(loaded));
    distlimit_serve::poll_files("configuration", interval, Some(hangup), move || {
        let read = read_sources(&path);
        let mut seen = seen
            .lock()
            .map_err(|_| "reload state poisoned".to_owned())?;
        let unchanged = match (&read, &*seen) {
            (Ok(now), Ok(before)) => now == before,
            (Err(now), Err(before)) => now.to_string() == *before,
            _ => false,
        };
        if unchanged {
            return Ok(false);
        }
        let parsed = match read {
            Ok(sources) => {
                let config = Config::from_sources(&sources);
                *seen = Ok(sources);
                config
            }
            Err(error) => {
                *seen = Err(error.to_string());
                Err(error)
            }
        };
        drop(seen);
        let metrics = checker.request_metrics();
        match parsed {
            Ok(config) => {
                tracing::info!(
                    path = %path.display(),
                    domains = config.domains().count(),
                    "configuration read"
                );
                checker.set_config(config);
                metrics.on_config_load(LoadResult::success);
                Ok(true)
            }
            Err(error) => {
                metrics.on_config_load(LoadResult::error);
                Err(error.to_string())
            }
        }
    })
}
