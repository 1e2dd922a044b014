//! Hot reload: the configuration path is read again every interval, and a changed set of files
//! replaces the running configuration when it is valid.
//!
//! Polling the contents (not file-system events) sees every way a configuration changes: a file
//! edited in place, a file added or removed, and a directory swapped by symbolic link the way
//! Kubernetes updates a mounted ConfigMap (`..data` pointing at a new timestamped directory).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::check::Checker;
use crate::config::{Config, RateLimitConfigError, Source, read_sources};
use crate::metrics::LoadResult;

/// The last thing a reload did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reload {
    /// Nothing changed since the start.
    Waiting,
    /// Changed files were applied; `generation` counts the applied versions (the start is 0).
    Applied {
        /// 1 for the first reload applied, then 2, …
        generation: u64,
    },
    /// Changed files were refused and the running configuration kept.
    Rejected {
        /// Why, naming the file, the line and the field.
        error: String,
    },
}

/// A running reload task; dropping it stops the task.
#[derive(Debug)]
pub struct Watcher {
    task: JoinHandle<()>,
    events: watch::Receiver<Reload>,
}

impl Watcher {
    /// Reload events: await `changed()` to learn that a version was applied or refused.
    pub fn subscribe(&self) -> watch::Receiver<Reload> {
        self.events.clone()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts reloading `path` into `checker` every `interval`, and at once when `hangup`'s value
/// changes (SIGHUP); `loaded` is what the running configuration was read from. Needs a Tokio
/// runtime.
pub(crate) fn watch(
    checker: Arc<Checker>,
    path: PathBuf,
    interval: Duration,
    loaded: Vec<Source>,
    mut hangup: watch::Receiver<u64>,
) -> Watcher {
    let (tx, events) = watch::channel(Reload::Waiting);
    let task = tokio::spawn(async move {
        let mut seen = Ok(loaded);
        let mut generation = 0;
        loop {
            let signalled = tokio::select! {
                () = tokio::time::sleep(interval) => false,
                changed = hangup.changed() => {
                    if changed.is_err() {
                        // No signal can come any more: poll on the interval alone.
                        tokio::time::sleep(interval).await;
                    }
                    changed.is_ok()
                }
            };
            let read_path = path.clone();
            let read = tokio::task::spawn_blocking(move || read_sources(&read_path))
                .await
                .unwrap_or_else(|join| {
                    Err(RateLimitConfigError::Io {
                        path: path.clone(),
                        source: std::io::Error::other(join.to_string()),
                    })
                });
            let unchanged = match (&read, &seen) {
                (Ok(now), Ok(before)) => now == before,
                (Err(now), Err(before)) => now.to_string() == *before,
                _ => false,
            };
            if unchanged {
                if signalled {
                    tracing::info!(path = %path.display(), "configuration unchanged");
                }
                continue;
            }
            let parsed = read.and_then(|sources| {
                let config = Config::from_sources(&sources);
                seen = Ok(sources);
                config
            });
            match parsed {
                Ok(config) => {
                    generation += 1;
                    let domains = config.domains().count();
                    checker.set_config(config);
                    checker
                        .request_metrics()
                        .on_config_load(LoadResult::success);
                    tracing::info!(
                        path = %path.display(),
                        generation,
                        domains,
                        "configuration reloaded"
                    );
                    tx.send_replace(Reload::Applied { generation });
                }
                Err(error) => {
                    checker.request_metrics().on_config_load(LoadResult::error);
                    let message = error.to_string();
                    tracing::error!(
                        file = %error.file().map(|f| f.display().to_string()).unwrap_or_default(),
                        line = error.line(),
                        "configuration refused, the running one is kept: {message}"
                    );
                    if matches!(error, RateLimitConfigError::Io { .. }) {
                        seen = Err(message.clone());
                    }
                    tx.send_replace(Reload::Rejected { error: message });
                }
            }
        }
    });
    Watcher { task, events }
}
