//! One file poller for every file a binary reloads (its configuration, its TLS files): a task
//! that runs a reload step every interval, and at once on SIGHUP ([`hangup_signal`]), and
//! reports what it did as one event type, [`Reload`].
//!
//! Polling contents, not file-system events, sees every way a mounted file changes: edited in
//! place, replaced, or a directory swapped by symbolic link the way Kubernetes updates a
//! ConfigMap or Secret.
//!
//! [`hangup_signal`]: crate::hangup_signal

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The last thing a reload did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reload<E = String> {
    /// Nothing changed since the start.
    Waiting,
    /// Changed files were applied; `generation` counts the applied versions (the start is 0).
    Applied {
        /// 1 for the first reload applied, then 2, …
        generation: u64,
    },
    /// Changed files were refused and the running version kept.
    Rejected {
        /// Why, naming the file.
        error: E,
    },
}

/// A running poller (from [`poll_files`]); dropping it stops the task.
#[derive(Debug)]
pub struct FileWatcher<E = String> {
    task: JoinHandle<()>,
    events: watch::Receiver<Reload<E>>,
}

impl<E> FileWatcher<E> {
    /// Reload events: await `changed()` to learn that a version was applied or refused.
    pub fn subscribe(&self) -> watch::Receiver<Reload<E>> {
        self.events.clone()
    }
}

impl<E> Drop for FileWatcher<E> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a task that runs `step` on a blocking thread every `interval`, and at once when
/// `hangup`'s value changes (see [`hangup_signal`](crate::hangup_signal)). `step` reads the
/// files, compares them with what runs, and applies a changed version: `Ok(true)` applied,
/// `Ok(false)` unchanged, `Err` refused (the running version kept). The task logs, naming
/// `what` (`"configuration"`, `"TLS files"`): each version applied at INFO, each distinct
/// refusal once at ERROR (the same error again is neither logged nor sent until something
/// else happened), an unchanged read after a SIGHUP at INFO. Needs a Tokio runtime.
pub fn poll_files<E, S>(
    what: &'static str,
    interval: Duration,
    mut hangup: Option<watch::Receiver<u64>>,
    step: S,
) -> FileWatcher<E>
where
    E: Display + Clone + Send + Sync + 'static,
    S: Fn() -> Result<bool, E> + Send + Sync + 'static,
{
    let (tx, events) = watch::channel(Reload::Waiting);
    let step = Arc::new(step);
    let task = tokio::spawn(async move {
        let mut generation = 0;
        let mut refused: Option<String> = None;
        loop {
            let signalled = match &mut hangup {
                None => {
                    tokio::time::sleep(interval).await;
                    false
                }
                Some(signals) => tokio::select! {
                    () = tokio::time::sleep(interval) => false,
                    changed = signals.changed() => match changed {
                        Ok(()) => true,
                        Err(_) => {
                            // No signal can come any more: the interval alone.
                            hangup = None;
                            false
                        }
                    },
                },
            };
            let step = step.clone();
            let stepped = match tokio::task::spawn_blocking(move || step()).await {
                Ok(stepped) => stepped,
                Err(join) => {
                    tracing::warn!("{what} reload: {join}");
                    continue;
                }
            };
            match stepped {
                Ok(false) => {
                    if signalled {
                        tracing::info!("{what} unchanged");
                    }
                }
                Ok(true) => {
                    generation += 1;
                    refused = None;
                    tracing::info!(generation, "{what} reloaded");
                    tx.send_replace(Reload::Applied { generation });
                }
                Err(error) => {
                    let message = error.to_string();
                    if refused.as_deref() == Some(message.as_str()) {
                        continue;
                    }
                    tracing::error!("{what} refused, the running one is kept: {message}");
                    refused = Some(message);
                    tx.send_replace(Reload::Rejected { error });
                }
            }
        }
    });
    FileWatcher { task, events }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Mutex;

    use super::*;

    #[tokio::test]
    async fn applied_versions_count_and_a_refusal_is_sent_once() {
        // What each step returns, in turn; then unchanged.
        let script = Arc::new(Mutex::new(vec![
            Ok(true),
            Err("bad".to_owned()),
            Err("bad".to_owned()),
            Ok(false),
            Ok(true),
        ]));
        let steps = script.clone();
        let watcher = poll_files("test", Duration::from_millis(10), None, move || {
            let mut steps = steps.lock().unwrap();
            if steps.is_empty() {
                Ok(false)
            } else {
                steps.remove(0)
            }
        });
        let mut events = watcher.subscribe();
        let mut seen = Vec::new();
        for _ in 0..3 {
            events.changed().await.unwrap();
            seen.push(events.borrow_and_update().clone());
        }
        assert_eq!(
            seen,
            [
                Reload::Applied { generation: 1 },
                Reload::Rejected {
                    error: "bad".to_owned()
                },
                Reload::Applied { generation: 2 },
            ]
        );
    }

    #[tokio::test]
    async fn a_hangup_steps_at_once() {
        let (hangup, signals) = watch::channel(0u64);
        let watcher = poll_files("test", Duration::from_secs(3600), Some(signals), || {
            Ok::<_, String>(true)
        });
        let mut events = watcher.subscribe();
        hangup.send_replace(1);
        let started = std::time::Instant::now();
        events.changed().await.unwrap();
        assert_eq!(*events.borrow(), Reload::Applied { generation: 1 });
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
