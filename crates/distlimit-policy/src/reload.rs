//! The one file poller, [`poll_files`]: [`Reloadable`] files looked at every interval, each
//! changed version applied, what happened reported as a [`Reload`] through a [`FileWatcher`].
//!
//! Polling contents, not file-system events, sees every way a mounted file changes: edited in
//! place (even keeping its size and modification time), replaced, or a directory swapped by
//! symbolic link the way Kubernetes updates a ConfigMap or Secret.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::PolicyConfigError;

/// What the last look at the files did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reload<E = PolicyConfigError> {
    /// Nothing applied or refused yet.
    Waiting,
    /// A changed version was applied; `generation` counts the versions this watcher applied
    /// (1 for the first).
    Applied {
        /// Versions applied so far.
        generation: u64,
    },
    /// The files' current version was refused, or the files could not be read: the running
    /// version is kept.
    Rejected {
        /// Why, naming the file.
        error: E,
    },
}

/// Files a [`poll_files`] task reloads: how to read them, and how to apply a version that
/// changed. Both run on a blocking thread.
pub trait Reloadable: Send + Sync + 'static {
    /// What the files hold; compared with the last read to see a change, so it should be their
    /// bytes (or derived from nothing else).
    type Contents: PartialEq + Send + 'static;
    /// Why the files could not be read or a version was refused.
    type Error: Display + Clone + Send + Sync + 'static;

    /// Reads the files. An error is reported as [`Reload::Rejected`], and the next successful
    /// read counts as a change.
    fn read(&self) -> Result<Self::Contents, Self::Error>;

    /// Applies a version that differs from the last one read: `Ok(true)` applied, `Ok(false)`
    /// nothing to do (it is the version running already), `Err` refused (the running version
    /// kept; the same contents are not applied again until they change).
    fn apply(&self, contents: &Self::Contents) -> Result<bool, Self::Error>;

    /// The contents of the running version, when it was read from these files before the poller
    /// started: the poller then waits an interval before its first look and applies only a
    /// change. `None` (the default): the first look is at once and applies what it reads.
    fn running(&self) -> Option<Self::Contents> {
        None
    }

    /// Whether what the files are applied to is gone: the poller then ends. `false` by default.
    fn is_gone(&self) -> bool {
        false
    }

    /// The log line of a refusal (the error's `Display` by default; add its causes here).
    /// Refusals with the same line are logged and reported once until something else happens.
    fn describe(error: &Self::Error) -> String {
        error.to_string()
    }
}

/// A running [`poll_files`] task. Dropping it (or [`stop`](Self::stop)) stops the polling.
#[derive(Debug)]
pub struct FileWatcher<E = PolicyConfigError> {
    task: JoinHandle<()>,
    events: watch::Receiver<Reload<E>>,
}

impl<E: Clone> FileWatcher<E> {
    /// What the last look at the files did.
    pub fn status(&self) -> Reload<E> {
        self.events.borrow().clone()
    }

    /// The error of the files' current version while it is refused; `None` once a version is
    /// applied.
    pub fn last_error(&self) -> Option<E> {
        match &*self.events.borrow() {
            Reload::Rejected { error } => Some(error.clone()),
            Reload::Waiting | Reload::Applied { .. } => None,
        }
    }

    /// A receiver notified at every change of [`status`](Self::status): await `changed()` on
    /// it to learn that a version was applied or refused.
    pub fn subscribe(&self) -> watch::Receiver<Reload<E>> {
        self.events.clone()
    }
}

impl<E> FileWatcher<E> {
    /// Whether polling has ended ([`Reloadable::is_gone`], or the runtime shut down).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops polling.
    pub fn stop(self) {
        self.task.abort();
    }
}

impl<E> Drop for FileWatcher<E> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a task on `runtime` that looks at `files` every `interval`, and at once when
/// `hangup`'s value changes (the binaries pass `distlimit_serve::hangup_signal`'s SIGHUP count).
/// A look [reads](Reloadable::read) the files and, when the contents differ from the last
/// read, [applies](Reloadable::apply) them. The first look is at once unless
/// [`Reloadable::running`] gives the running contents.
///
/// The task logs, naming `what` (`"policy file"`, `"configuration"`, `"TLS files"`): each
/// version applied at INFO (`"{what} reloaded"` with its generation), each distinct refusal
/// once at ERROR (the same refusal again is neither logged nor sent until a version is
/// applied), and an unchanged look after a hangup at INFO (`"{what} unchanged"`). It ends when
/// [`Reloadable::is_gone`] says so.
pub fn poll_files<F: Reloadable>(
    runtime: &Handle,
    what: impl Into<String>,
    files: F,
    interval: Duration,
    hangup: Option<watch::Receiver<u64>>,
) -> FileWatcher<F::Error> {
    let (tx, events) = watch::channel(Reload::Waiting);
    let task = runtime.spawn(poll(what.into(), Arc::new(files), interval, hangup, tx));
    FileWatcher { task, events }
}

/// What one look found.
enum Look<E> {
    Unchanged,
    Applied,
    Refused(E),
}

async fn poll<F: Reloadable>(
    what: String,
    files: Arc<F>,
    interval: Duration,
    mut hangup: Option<watch::Receiver<u64>>,
    tx: watch::Sender<Reload<F::Error>>,
) {
    let mut seen = files.running();
    let mut signalled = seen.is_some() && wait(interval, &mut hangup).await;
    let mut generation = 0;
    let mut refused: Option<String> = None;
    loop {
        if files.is_gone() {
            return;
        }
        let looking = files.clone();
        let last = seen.take();
        let looked = match tokio::task::spawn_blocking(move || look(&*looking, last)).await {
            Ok(looked) => looked,
            Err(join) => {
                // The files' code panicked: what was read is lost, so the next read is new.
                tracing::warn!("{what} reload: {join}");
                (None, Look::Unchanged)
            }
        };
        seen = looked.0;
        match looked.1 {
            Look::Unchanged if signalled => tracing::info!("{what} unchanged"),
            Look::Unchanged => {}
            Look::Applied => {
                generation += 1;
                refused = None;
                tracing::info!(generation, "{what} reloaded");
                tx.send_replace(Reload::Applied { generation });
            }
            Look::Refused(error) => {
                let message = F::describe(&error);
                if refused.as_deref() != Some(message.as_str()) {
                    tracing::error!("{what} refused, the running one is kept: {message}");
                    refused = Some(message);
                    tx.send_replace(Reload::Rejected { error });
                }
            }
        }
        signalled = wait(interval, &mut hangup).await;
    }
}

/// Reads `files` and applies them when they differ from `last`; returns what was read.
fn look<F: Reloadable>(
    files: &F,
    last: Option<F::Contents>,
) -> (Option<F::Contents>, Look<F::Error>) {
    let contents = match files.read() {
        Ok(contents) => contents,
        Err(error) => return (None, Look::Refused(error)),
    };
    if last.as_ref() == Some(&contents) {
        return (Some(contents), Look::Unchanged);
    }
    let looked = match files.apply(&contents) {
        Ok(true) => Look::Applied,
        Ok(false) => Look::Unchanged,
        Err(error) => Look::Refused(error),
    };
    (Some(contents), looked)
}

/// Sleeps `interval`, or less when `hangup` changes first: `true` then.
async fn wait(interval: Duration, hangup: &mut Option<watch::Receiver<u64>>) -> bool {
    let Some(signals) = hangup else {
        tokio::time::sleep(interval).await;
        return false;
    };
    match tokio::time::timeout(interval, signals.changed()).await {
        Ok(Ok(())) => true,
        Ok(Err(_)) => {
            // No signal can come any more: the interval alone, the rest of this one included.
            *hangup = None;
            tokio::time::sleep(interval).await;
            false
        }
        Err(_) => false,
    }
}

#[cfg(all(test, not(distlimit_loom)))]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Mutex;

    use super::*;

    /// Files whose reads return a script, in turn; the read contents are applied as they are.
    struct Script {
        reads: Mutex<Vec<Result<u32, String>>>,
        applied: Mutex<Vec<u32>>,
        running: Option<u32>,
        gone: bool,
    }

    impl Script {
        fn new(reads: Vec<Result<u32, String>>, running: Option<u32>) -> Self {
            Self {
                reads: Mutex::new(reads),
                applied: Mutex::new(Vec::new()),
                running,
                gone: false,
            }
        }
    }

    impl Reloadable for Arc<Script> {
        type Contents = u32;
        type Error = String;

        fn read(&self) -> Result<u32, String> {
            let mut reads = self.reads.lock().unwrap();
            match reads.len() {
                0 => Ok(0),
                1 => reads[0].clone(),
                _ => reads.remove(0),
            }
        }

        fn apply(&self, contents: &u32) -> Result<bool, String> {
            if *contents >= 100 {
                return Err(format!("{contents} is too large"));
            }
            self.applied.lock().unwrap().push(*contents);
            Ok(true)
        }

        fn running(&self) -> Option<u32> {
            self.running
        }

        fn is_gone(&self) -> bool {
            self.gone
        }
    }

    fn start(
        files: impl Reloadable<Error = String>,
        interval: Duration,
        hangup: Option<watch::Receiver<u64>>,
    ) -> FileWatcher<String> {
        poll_files(&Handle::current(), "test", files, interval, hangup)
    }

    async fn next(events: &mut watch::Receiver<Reload<String>>) -> Reload<String> {
        tokio::time::timeout(Duration::from_secs(20), events.changed())
            .await
            .unwrap()
            .unwrap();
        events.borrow_and_update().clone()
    }

    #[tokio::test]
    async fn changes_are_applied_and_each_distinct_refusal_sent_once() {
        let script = Arc::new(Script::new(
            vec![
                Ok(1),
                Ok(1),
                Err("unreadable".to_owned()),
                Err("unreadable".to_owned()),
                // Readable again with the same contents: applied again.
                Ok(1),
                Ok(200),
                Ok(200),
                Ok(300),
                Ok(2),
            ],
            None,
        ));
        let watcher = start(script.clone(), Duration::from_millis(5), None);
        let mut events = watcher.subscribe();
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(next(&mut events).await);
        }
        let rejected = |error: &str| Reload::Rejected {
            error: error.to_owned(),
        };
        assert_eq!(
            seen,
            [
                Reload::Applied { generation: 1 },
                rejected("unreadable"),
                Reload::Applied { generation: 2 },
                rejected("200 is too large"),
                rejected("300 is too large"),
                Reload::Applied { generation: 3 },
            ]
        );
        assert_eq!(*script.applied.lock().unwrap(), [1, 1, 2]);
        assert_eq!(watcher.status(), Reload::Applied { generation: 3 });
        assert_eq!(watcher.last_error(), None);
    }

    #[tokio::test]
    async fn running_contents_are_not_applied_again() {
        let script = Arc::new(Script::new(vec![Ok(7), Ok(7), Ok(8)], Some(7)));
        let watcher = start(script.clone(), Duration::from_millis(5), None);
        let mut events = watcher.subscribe();
        assert_eq!(next(&mut events).await, Reload::Applied { generation: 1 });
        assert_eq!(*script.applied.lock().unwrap(), [8]);
    }

    #[tokio::test]
    async fn a_hangup_looks_at_once() {
        let script = Arc::new(Script::new(vec![Ok(2)], Some(1)));
        let (hangup, signals) = watch::channel(0u64);
        let watcher = start(script, Duration::from_secs(3600), Some(signals));
        let mut events = watcher.subscribe();
        let started = std::time::Instant::now();
        hangup.send_replace(1);
        assert_eq!(next(&mut events).await, Reload::Applied { generation: 1 });
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn polling_ends_when_the_target_is_gone() {
        let gone = Script {
            gone: true,
            ..Script::new(Vec::new(), None)
        };
        let watcher = start(Arc::new(gone), Duration::from_millis(5), None);
        let started = std::time::Instant::now();
        while !watcher.is_finished() && started.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(watcher.is_finished());
        assert_eq!(watcher.status(), Reload::Waiting);
    }
}
