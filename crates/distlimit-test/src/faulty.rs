//! [`FaultyStore`]: a [`Store`] wrapper that injects scripted faults, for circuit-breaker tests.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use distlimit_core::{Decision, Error, Request, Settle, Store};
use parking_lot::Mutex;

/// An error a [`Fault`] makes the store return, one per [`Error`] variant a backend can fail with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultKind {
    /// [`Error::Unavailable`]: connection refused or lost. Transient.
    Unavailable,
    /// [`Error::Timeout`] after the given budget. Transient.
    Timeout(Duration),
    /// [`Error::Protocol`]: an invalid reply. Permanent.
    Protocol,
    /// [`Error::Config`]: a misconfigured store. Permanent.
    Config,
    /// [`Error::BadState`]: the value stored at the request's key is not a valid state. An error
    /// of that request, not of the store. Permanent.
    BadState,
    /// [`Error::Backend`] with the given classification.
    Backend {
        /// Whether the error is transient.
        transient: bool,
    },
}

impl FaultKind {
    /// The error this kind stands for, naming the store [`FaultyStore::NAME`].
    pub fn error(self) -> Error {
        let store = FaultyStore::<()>::NAME;
        match self {
            FaultKind::Unavailable => Error::Unavailable {
                store,
                source: Box::new(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "injected fault: unavailable",
                )),
            },
            FaultKind::Timeout(after) => Error::Timeout { store, after },
            FaultKind::Protocol => Error::Protocol {
                store,
                message: "injected fault: invalid reply".to_owned(),
            },
            FaultKind::Config => Error::Config {
                store,
                message: "injected fault: misconfigured".to_owned(),
            },
            FaultKind::BadState => Error::BadState {
                store,
                message: "injected fault: not a valid state".to_owned(),
            },
            FaultKind::Backend { transient } => Error::Backend {
                store,
                transient,
                source: Box::new(std::io::Error::other("injected fault: backend failure")),
            },
        }
    }
}

/// What one call to a [`FaultyStore`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// Passes the call through to the inner store.
    Pass,
    /// Sleeps (with `tokio::time::sleep`, so a paused test clock skips it) then passes through.
    /// `Delay(Duration::ZERO)` only yields to the scheduler once.
    Delay(Duration),
    /// Fails at once without reaching the inner store.
    Fail(FaultKind),
    /// Sleeps, then fails without reaching the inner store: a slow failure such as a real timeout.
    FailAfter(Duration, FaultKind),
    /// Passes through (the inner store decides and charges) but returns the error instead of its
    /// answer: a reply lost after the request was applied.
    LoseReply(FaultKind),
    /// Never completes: the caller's own timeout must fire.
    Hang,
}

#[derive(Debug)]
struct Script {
    queue: VecDeque<Fault>,
    default: Fault,
}

/// A [`Store`] that wraps another and injects faults from a script, for testing what sits on top
/// of stores (circuit breakers, fallbacks, retries).
///
/// Each call to [`decide`](Store::decide) or [`decide_all`](Store::decide_all), and each
/// [`decide_now`](Store::decide_now) that answers, takes the next [`Fault`] from the script, or
/// the default one (initially [`Fault::Pass`]) once the script is empty. [`calls`](Self::calls) counts every call, [`inner_calls`](Self::inner_calls) those that
/// reached the inner store. Delays use `tokio::time::sleep`: call it within a Tokio runtime with
/// time enabled, and pause time (`tokio::time::pause`, feature `test-util`) to make them instant.
///
/// ```
/// use distlimit_core::{Error, Limit, Quota, StoreExt};
/// use distlimit_test::{Fault, FaultKind, FaultyStore};
/// # use distlimit_core::{Decision, Request, Store};
/// # struct AlwaysAllow;
/// # #[async_trait::async_trait]
/// # impl Store for AlwaysAllow {
/// #     async fn decide(&self, r: &Request<'_>) -> Result<Decision, Error> {
/// #         Ok(Decision::allowed(1, 1, std::time::Duration::ZERO))
/// #     }
/// #     async fn decide_all(&self, rs: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
/// #         Ok(rs.iter().map(|_| Decision::allowed(1, 1, std::time::Duration::ZERO)).collect())
/// #     }
/// # }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = FaultyStore::new(AlwaysAllow);
/// store.push(Fault::Fail(FaultKind::Unavailable));
/// store.push(Fault::Fail(FaultKind::Protocol));
/// let limit = Limit::token_bucket(Quota::per_second(5)?);
///
/// let first = store.check("k", limit).await.unwrap_err();
/// assert!(matches!(first, Error::Unavailable { .. }) && first.is_transient());
/// let second = store.check("k", limit).await.unwrap_err();
/// assert!(!second.is_transient());
/// assert!(store.check("k", limit).await?.is_allowed()); // the script is empty: Pass
/// assert_eq!((store.calls(), store.inner_calls()), (3, 1));
/// # Ok(()) }
/// ```
pub struct FaultyStore<S> {
    inner: S,
    script: Mutex<Script>,
    calls: AtomicU64,
    inner_calls: AtomicU64,
}

impl<S> FaultyStore<S> {
    /// The store name in the errors it injects.
    pub const NAME: &'static str = "faulty";

    /// Wraps `inner`, passing every call through until told otherwise.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            script: Mutex::new(Script {
                queue: VecDeque::new(),
                default: Fault::Pass,
            }),
            calls: AtomicU64::new(0),
            inner_calls: AtomicU64::new(0),
        }
    }

    /// The same store with another default fault (used once the script is empty).
    pub fn with_default(self, fault: Fault) -> Self {
        self.set_default(fault);
        self
    }

    /// Sets the fault used once the script is empty.
    pub fn set_default(&self, fault: Fault) {
        self.script.lock().default = fault;
    }

    /// Appends one fault to the script.
    pub fn push(&self, fault: Fault) {
        self.script.lock().queue.push_back(fault);
    }

    /// Appends `fault` `n` times to the script.
    pub fn push_n(&self, fault: Fault, n: usize) {
        self.script
            .lock()
            .queue
            .extend(std::iter::repeat_n(fault, n));
    }

    /// Appends faults to the script, in order.
    pub fn extend<I: IntoIterator<Item = Fault>>(&self, faults: I) {
        self.script.lock().queue.extend(faults);
    }

    /// Empties the script (the default fault stays).
    pub fn clear(&self) {
        self.script.lock().queue.clear();
    }

    /// Faults left in the script.
    pub fn pending(&self) -> usize {
        self.script.lock().queue.len()
    }

    /// Calls made to this store (`decide` and `decide_all`), including failed and cancelled ones.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Calls that reached the inner store.
    pub fn inner_calls(&self) -> u64 {
        self.inner_calls.load(Ordering::SeqCst)
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Unwraps the store.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Runs one call under the next fault.
    async fn run<T, F, Fut>(&self, call: F) -> Result<T, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let fault = {
            let mut script = self.script.lock();
            let default = script.default;
            script.queue.pop_front().unwrap_or(default)
        };
        match fault {
            Fault::Pass | Fault::LoseReply(_) => {}
            // A zero delay only yields: the timer would round it up to a millisecond.
            Fault::Delay(d) if d.is_zero() => tokio::task::yield_now().await,
            Fault::Delay(d) => tokio::time::sleep(d).await,
            Fault::Fail(kind) => return Err(kind.error()),
            Fault::FailAfter(d, kind) => {
                tokio::time::sleep(d).await;
                return Err(kind.error());
            }
            Fault::Hang => std::future::pending::<()>().await,
        }
        self.inner_calls.fetch_add(1, Ordering::SeqCst);
        let answer = call().await;
        match fault {
            // The inner store applied the request; its answer is lost.
            Fault::LoseReply(kind) => Err(kind.error()),
            _ => answer,
        }
    }
}

impl<S> fmt::Debug for FaultyStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let script = self.script.lock();
        f.debug_struct("FaultyStore")
            .field("pending", &script.queue)
            .field("default", &script.default)
            .field("calls", &self.calls())
            .field("inner_calls", &self.inner_calls())
            .finish_non_exhaustive()
    }
}

#[async_trait]
#[warn(clippy::missing_trait_methods)]
impl<S: Store> Store for FaultyStore<S> {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        self.run(|| self.inner.decide(request)).await
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        self.run(|| self.inner.decide_all(requests)).await
    }

    /// Answers at once when the next fault needs no waiting: [`Fault::Fail`], or
    /// [`Fault::Pass`] and [`Fault::LoseReply`] when the inner store answers
    /// [`decide_now`](Store::decide_now). The fault is taken only then; otherwise it stays for
    /// the awaited [`decide`](Store::decide).
    fn decide_now(&self, request: &Request<'_>) -> Option<Result<Decision, Error>> {
        let mut script = self.script.lock();
        let fault = script.queue.front().copied().unwrap_or(script.default);
        let answer = match fault {
            Fault::Fail(kind) => Err(kind.error()),
            Fault::Pass | Fault::LoseReply(_) => {
                let answer = self.inner.decide_now(request)?;
                self.inner_calls.fetch_add(1, Ordering::SeqCst);
                match fault {
                    // The inner store applied the request; its answer is lost.
                    Fault::LoseReply(kind) => Err(kind.error()),
                    _ => answer,
                }
            }
            Fault::Delay(_) | Fault::FailAfter(..) | Fault::Hang => return None,
        };
        script.queue.pop_front();
        self.calls.fetch_add(1, Ordering::SeqCst);
        Some(answer)
    }

    // Batches are always awaited (`decide_all`): `None` is always a correct answer.
    fn decide_all_now(&self, _: &[Request<'_>], _: &mut [Decision]) -> Option<Result<(), Error>> {
        None
    }

    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        self.run(|| self.inner.settle_all(settles)).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use distlimit_core::{Key, Limit, Quota, StoreExt};

    use super::*;

    /// Admits everything and counts what it saw.
    #[derive(Default)]
    struct Counting {
        decided: AtomicU64,
    }

    #[async_trait]
    impl Store for Counting {
        async fn decide(&self, _: &Request<'_>) -> Result<Decision, Error> {
            let n = self.decided.fetch_add(1, Ordering::SeqCst);
            Ok(Decision::allowed(100, 99 - n, Duration::ZERO))
        }

        async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
            let mut out = Vec::new();
            for r in requests {
                out.push(self.decide(r).await?);
            }
            Ok(out)
        }

        fn decide_now(&self, request: &Request<'_>) -> Option<Result<Decision, Error>> {
            let _ = request;
            let n = self.decided.fetch_add(1, Ordering::SeqCst);
            Some(Ok(Decision::allowed(100, 99 - n, Duration::ZERO)))
        }
    }

    fn limit() -> Limit {
        Limit::token_bucket(Quota::per_second(100).unwrap())
    }

    #[tokio::test]
    async fn passes_through_by_default() {
        let store = FaultyStore::new(Counting::default());
        assert_eq!(store.check("k", limit()).await.unwrap().remaining(), 99);
        let request = Request::new(Key::new("k").unwrap(), limit());
        let batch = [request, Request::new(Key::new("j").unwrap(), limit())];
        assert_eq!(store.decide_all(&batch).await.unwrap().len(), 2);
        assert_eq!(store.calls(), 2);
        assert_eq!(store.inner_calls(), 2);
        assert_eq!(store.inner().decided.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn follows_the_script_then_the_default() {
        let store =
            FaultyStore::new(Counting::default()).with_default(Fault::Fail(FaultKind::Config));
        store.push(Fault::Fail(FaultKind::Unavailable));
        store.push_n(Fault::Pass, 2);
        store.extend([
            Fault::Fail(FaultKind::Timeout(Duration::from_millis(5))),
            Fault::Fail(FaultKind::Protocol),
            Fault::Fail(FaultKind::Backend { transient: true }),
        ]);
        assert_eq!(store.pending(), 6);

        let e = store.check("k", limit()).await.unwrap_err();
        assert!(
            matches!(
                e,
                Error::Unavailable {
                    store: "faulty",
                    ..
                }
            ) && e.is_transient()
        );
        assert!(store.check("k", limit()).await.unwrap().is_allowed());
        assert!(store.check("k", limit()).await.unwrap().is_allowed());
        let e = store.check("k", limit()).await.unwrap_err();
        assert!(
            matches!(e, Error::Timeout { after, .. } if after == Duration::from_millis(5))
                && e.is_transient()
        );
        let e = store.check("k", limit()).await.unwrap_err();
        assert!(matches!(e, Error::Protocol { .. }) && !e.is_transient());
        let e = store.check("k", limit()).await.unwrap_err();
        assert!(
            matches!(
                e,
                Error::Backend {
                    transient: true,
                    ..
                }
            ) && e.is_transient()
        );
        assert_eq!(store.pending(), 0);
        for _ in 0..3 {
            let e = store.check("k", limit()).await.unwrap_err();
            assert!(matches!(e, Error::Config { .. }) && !e.is_transient());
        }
        assert_eq!(store.calls(), 9);
        assert_eq!(store.inner_calls(), 2);

        store.push(Fault::Fail(FaultKind::Protocol));
        store.clear();
        store.set_default(Fault::Pass);
        assert!(store.check("k", limit()).await.unwrap().is_allowed());
        assert_eq!(store.inner_calls(), 3);
    }

    #[test]
    fn kinds_classify_like_errors() {
        assert!(FaultKind::Unavailable.error().is_transient());
        assert!(FaultKind::Timeout(Duration::ZERO).error().is_transient());
        assert!(
            FaultKind::Backend { transient: true }
                .error()
                .is_transient()
        );
        assert!(
            !FaultKind::Backend { transient: false }
                .error()
                .is_transient()
        );
        assert!(!FaultKind::Protocol.error().is_transient());
        assert!(!FaultKind::Config.error().is_transient());
        assert!(!FaultKind::BadState.error().is_transient());
    }

    #[test]
    fn answers_now_only_what_needs_no_waiting() {
        let store = FaultyStore::new(Counting::default());
        let r = Request::new(Key::new("k").unwrap(), limit());
        store.push(Fault::Fail(FaultKind::BadState));
        store.push(Fault::Delay(Duration::from_secs(1)));
        let e = store.decide_now(&r).unwrap().unwrap_err();
        assert!(matches!(e, Error::BadState { .. }) && !e.is_transient());
        assert!(store.decide_now(&r).is_none(), "a delay must be awaited");
        assert_eq!(store.pending(), 1, "the delay stays for the awaited call");
        store.clear();
        assert_eq!(store.decide_now(&r).unwrap().unwrap().remaining(), 99);
        store.push(Fault::LoseReply(FaultKind::Unavailable));
        assert!(store.decide_now(&r).unwrap().is_err());
        assert_eq!(store.decide_now(&r).unwrap().unwrap().remaining(), 97);
        assert_eq!((store.calls(), store.inner_calls()), (4, 3));

        // An inner store that must be awaited: nothing is answered, nothing taken.
        let awaited = FaultyStore::new(
            FaultyStore::new(Counting::default()).with_default(Fault::Delay(Duration::ZERO)),
        );
        awaited.push(Fault::Pass);
        assert!(awaited.decide_now(&r).is_none());
        assert_eq!((awaited.calls(), awaited.pending()), (0, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn delays_then_passes_through_or_fails_without_reaching_the_inner_store() {
        let store = FaultyStore::new(Counting::default());
        store.push(Fault::Delay(Duration::from_secs(3)));
        let two = Duration::from_secs(2);
        store.push(Fault::FailAfter(two, FaultKind::Timeout(two)));
        let start = tokio::time::Instant::now();
        assert!(store.check("k", limit()).await.unwrap().is_allowed());
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        assert_eq!(store.inner_calls(), 1);
        let e = store.check("k", limit()).await.unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }));
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        assert_eq!((store.calls(), store.inner_calls()), (2, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_delay_or_a_hang_never_reaches_the_inner_store() {
        let store = FaultyStore::new(Counting::default()).with_default(Fault::Hang);
        store.push(Fault::Delay(Duration::from_secs(10)));
        let r = tokio::time::timeout(Duration::from_secs(1), store.check("k", limit())).await;
        assert!(r.is_err(), "the caller's timeout must fire first");
        assert_eq!((store.calls(), store.inner_calls()), (1, 0));
        let r = tokio::time::timeout(Duration::from_secs(3600), store.check("k", limit())).await;
        assert!(r.is_err());
        assert_eq!((store.calls(), store.inner_calls()), (2, 0));
        assert_eq!(store.inner().decided.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_lost_reply_was_still_applied() {
        let store = FaultyStore::new(Counting::default());
        store.push(Fault::LoseReply(FaultKind::Timeout(Duration::from_millis(
            50,
        ))));
        let e = store.check("k", limit()).await.unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }));
        assert_eq!(store.inner_calls(), 1);
        assert_eq!(store.inner().decided.load(Ordering::SeqCst), 1);
        // The next answer shows the lost request was charged.
        assert_eq!(store.check("k", limit()).await.unwrap().remaining(), 98);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn each_concurrent_call_takes_one_fault() {
        let store = Arc::new(FaultyStore::new(Counting::default()));
        store.push_n(Fault::Fail(FaultKind::Unavailable), 10);
        let handles: Vec<_> = (0..40)
            .map(|_| {
                let store = Arc::clone(&store);
                tokio::spawn(async move { store.check("k", limit()).await.is_ok() })
            })
            .collect();
        let mut ok = 0;
        for h in handles {
            ok += usize::from(h.await.unwrap());
        }
        assert_eq!(ok, 30);
        assert_eq!((store.calls(), store.inner_calls()), (40, 30));
    }

    #[test]
    fn is_a_store_behind_dyn_and_debug() {
        let store: Arc<dyn Store> = Arc::new(FaultyStore::new(Counting::default()));
        drop(store);
        let store = FaultyStore::new(Counting::default());
        store.push(Fault::Hang);
        let shown = format!("{store:?}");
        assert!(
            shown.contains("Hang") && shown.contains("calls: 0"),
            "{shown}"
        );
        assert_eq!(store.into_inner().decided.load(Ordering::SeqCst), 0);
    }
}
