#![doc = include_str!("../README.md")]

mod blocked;
mod breaker;
mod config;
mod lease;
mod permits;
mod share;
mod sync;

#[cfg(all(test, distlimit_loom))]
mod tests {
    mod loom_breaker;
}

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use distlimit_core::{
    BreakerState, Clock, Decision, Error, Observer, Request, Settle, Source, StateRef, Store,
    SystemClock, validate_batch, validate_settles,
};

use crate::blocked::BlockedCache;
use crate::breaker::{Breaker, Route, Transition};
use crate::share::Share;

pub use crate::config::{
    Builder, ConfigError, DEFAULT_BLOCKED_ENTRIES, DEFAULT_BUDGET, DEFAULT_COOL_OFF,
    DEFAULT_FIRST_COOL_OFF, DEFAULT_OPEN_RULE, FailureMode, MAX_WINDOW_FAILURES, OpenRule,
};
pub use crate::permits::FAIL_OPEN_PERMIT;

/// A store that asks a primary store behind a circuit breaker and falls back to another. See the
/// [crate documentation](crate).
pub struct Hybrid<P, F, C = SystemClock> {
    primary: P,
    fallback: F,
    clock: C,
    name: &'static str,
    budget: Duration,
    breaker: Breaker,
    modes: HashMap<Box<str>, FailureMode>,
    default_mode: FailureMode,
    share: Share,
    blocked: Option<BlockedCache>,
    observer: Arc<dyn Observer>,
    counters: Counters,
}

/// Counts of what a [`Hybrid`] did since it was built, from [`Hybrid::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Calls sent to the primary (`decide` and `decide_all`), probes included.
    pub primary_calls: u64,
    /// Primary calls that failed or ran out of budget.
    pub primary_errors: u64,
    /// Primary calls that ran out of budget.
    pub timeouts: u64,
    /// Half-open probes sent.
    pub probes: u64,
    /// Times the breaker opened from closed.
    pub opened: u64,
    /// Calls the fallback store answered.
    pub fallback: u64,
    /// Decisions the blocked-key cache answered.
    pub blocked: u64,
    /// Calls admitted unchecked by [`FailureMode::FailOpen`].
    pub failed_open: u64,
    /// Calls answered with an error by [`FailureMode::FailClosed`].
    pub failed_closed: u64,
}

/// On cache lines of their own: every decision bumps one, and the breaker's word next to them is
/// read by every decision on every thread.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Counters {
    primary_calls: AtomicU64,
    primary_errors: AtomicU64,
    timeouts: AtomicU64,
    probes: AtomicU64,
    opened: AtomicU64,
    fallback: AtomicU64,
    blocked: AtomicU64,
    failed_open: AtomicU64,
    failed_closed: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The error of a [`FailureMode::FailClosed`] decision while the breaker is open.
#[derive(Debug, thiserror::Error)]
#[error("circuit breaker open")]
struct BreakerOpen;

impl<P, F> Hybrid<P, F> {
    /// Configures a store over `primary` and `fallback`; see [`Builder`] for the defaults.
    pub fn builder(primary: P, fallback: F) -> Builder<P, F> {
        Builder::new(primary, fallback)
    }
}

impl<P, F, C> Hybrid<P, F, C> {
    /// The breaker's state now.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// What this store did since it was built.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            primary_calls: get(&c.primary_calls),
            primary_errors: get(&c.primary_errors),
            timeouts: get(&c.timeouts),
            probes: get(&c.probes),
            opened: get(&c.opened),
            fallback: get(&c.fallback),
            blocked: get(&c.blocked),
            failed_open: get(&c.failed_open),
            failed_closed: get(&c.failed_closed),
        }
    }

    /// Entries in the blocked-key cache (0 when it is off).
    pub fn blocked_entries(&self) -> usize {
        self.blocked.as_ref().map_or(0, BlockedCache::len)
    }

    /// The primary store.
    pub fn primary(&self) -> &P {
        &self.primary
    }

    /// The fallback store.
    pub fn fallback(&self) -> &F {
        &self.fallback
    }

    /// The failure mode set for the policy named `policy` (exactly that name), else the default.
    pub fn failure_mode(&self, policy: &str) -> FailureMode {
        self.modes.get(policy).copied().unwrap_or(self.default_mode)
    }

    /// The failure mode of a request's state: the mode set for its storage name, else the one
    /// set for its policy (so a mode set for `api` covers the limiter's `api/<tier>` states),
    /// else the default.
    pub fn failure_mode_of(&self, state: StateRef<'_>) -> FailureMode {
        if self.modes.is_empty() {
            return self.default_mode;
        }
        self.modes
            .get(state.as_str())
            .or_else(|| self.modes.get(state.policy()))
            .copied()
            .unwrap_or(self.default_mode)
    }

    fn report(&self, transition: Option<Transition>) {
        if let Some(t) = transition {
            if t.from == BreakerState::Closed {
                bump(&self.counters.opened);
            }
            self.observer.on_breaker(self.name, t.from, t.to);
        }
    }

    fn open_error(&self) -> Error {
        Error::Unavailable {
            store: self.name,
            source: Box::new(BreakerOpen),
        }
    }

    fn fail_open(request: &Request<'_>) -> Decision {
        let capacity = request.limit().capacity();
        Decision::allowed(
            capacity,
            capacity.saturating_sub(request.cost()),
            Duration::ZERO,
        )
        .with_source(Source::FailOpen)
    }

    /// `request` with this instance's share of its limit.
    fn share_of<'a>(&self, request: &Request<'a>) -> Result<Request<'a>, Error> {
        if self.share.is_whole() {
            return Ok(*request);
        }
        let limit = self.share.scale(request.limit());
        Ok(Request::new(request.key(), limit)
            .with_cost(request.cost())
            .with_policy(request.policy())?)
    }
}

impl<P: Store, F: Store, C: Clock> Hybrid<P, F, C> {
    /// Where a decision goes: one atomic load while closed; the clock is read only while open.
    #[inline]
    fn route(&self) -> Route {
        let (route, transition) = self.breaker.route_with(|| self.clock.now_us());
        if transition.is_some() {
            if matches!(route, Route::Probe { .. }) {
                bump(&self.counters.probes);
            }
            self.report(transition);
        }
        route
    }

    /// The time a primary call is sent, for the blocked-key cache's deadlines (0 without the
    /// cache, which is the only reader).
    #[inline]
    fn sent_at(&self) -> u64 {
        if self.blocked.is_some() {
            self.clock.now_us()
        } else {
            0
        }
    }

    /// One primary call within the time budget.
    async fn call<T>(&self, call: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
        bump(&self.counters.primary_calls);
        match tokio::time::timeout(self.budget, call).await {
            Ok(result) => result,
            Err(_) => {
                bump(&self.counters.timeouts);
                Err(Error::Timeout {
                    store: self.name,
                    after: self.budget,
                })
            }
        }
    }

    /// A batch (of requests, or of settles) answered by each policy's failure mode.
    async fn degraded_all<'k, T: Item<'k>>(
        &self,
        items: &[T],
        error: Option<Error>,
    ) -> Result<Vec<Decision>, Error> {
        let mut to_fallback = Vec::with_capacity(items.len());
        for item in items {
            match self.failure_mode_of(item.request().state()) {
                FailureMode::FailClosed => {
                    bump(&self.counters.failed_closed);
                    return Err(error.unwrap_or_else(|| self.open_error()));
                }
                FailureMode::Fallback => {
                    to_fallback.push(item.with_request(self.share_of(item.request())?));
                }
                FailureMode::FailOpen => {}
            }
        }
        let mut decided = if to_fallback.is_empty() {
            Vec::new()
        } else {
            bump(&self.counters.fallback);
            T::apply(&self.fallback, &to_fallback).await?
        }
        .into_iter();
        if to_fallback.len() < items.len() {
            bump(&self.counters.failed_open);
        }
        items
            .iter()
            .map(|item| match self.failure_mode_of(item.request().state()) {
                FailureMode::FailOpen => Ok(Self::fail_open(item.request())),
                _ => decided
                    .next()
                    .map(|d| d.with_source(Source::Fallback))
                    .ok_or_else(|| Error::Protocol {
                        store: "fallback",
                        message: "fewer decisions than requests".to_owned(),
                    }),
            })
            .collect()
    }

    /// `mode` (a request's failure mode) counted in the stats; fail closed answers its error:
    /// `error`, the primary's, or the open breaker's.
    fn degrade_by(&self, mode: FailureMode, error: Option<Error>) -> Result<FailureMode, Error> {
        bump(match mode {
            FailureMode::Fallback => &self.counters.fallback,
            FailureMode::FailOpen => &self.counters.failed_open,
            FailureMode::FailClosed => &self.counters.failed_closed,
        });
        match mode {
            FailureMode::FailClosed => Err(error.unwrap_or_else(|| self.open_error())),
            mode => Ok(mode),
        }
    }

    /// A primary call (of `policy`) on `route` within the budget; `degraded` answers when the
    /// breaker is open (`None`) or the call failed (`Some`). Every error is reported; it counts
    /// toward opening unless it is an error of the request ([`is_request_error`]), and invalid
    /// input is returned as it is.
    async fn guarded<T, Call, D>(
        &self,
        route: Route,
        policy: &str,
        primary: impl FnOnce() -> Call,
        degraded: impl FnOnce(Option<Error>) -> D,
    ) -> Result<T, Error>
    where
        Call: Future<Output = Result<T, Error>>,
        D: Future<Output = Result<T, Error>>,
    {
        if route == Route::Fallback {
            return degraded(None).await;
        }
        let mut probe = ProbeGuard {
            breaker: &self.breaker,
            observer: &*self.observer,
            name: self.name,
            route,
            done: false,
        };
        let result = self.call(primary()).await;
        probe.done = true;
        let error = match result {
            Ok(answer) => {
                self.report(self.breaker.succeeded(route));
                return Ok(answer);
            }
            Err(error) => error,
        };
        bump(&self.counters.primary_errors);
        self.observer.on_store_error(self.name, policy, &error);
        if !is_request_error(&error) {
            let now = self.clock.now_us();
            self.report(self.breaker.failed(route, now));
        } else {
            // Says nothing of the primary's health: a probe that met it is inconclusive.
            self.report(self.breaker.inconclusive(route));
            // Invalid input, the caller's fault, which every route rejects alike: as it is.
            if error.is_invalid_input() || matches!(error, Error::Unsupported(_)) {
                return Err(error);
            }
        }
        degraded(Some(error)).await
    }
}

/// What a batch holds: requests to decide, or settles; either goes to a store alike.
trait Item<'k>: Copy + Send + Sync + 'k {
    /// Whether the items are settles.
    const SETTLES: bool;
    /// The request decided, or settled.
    fn request(&self) -> &Request<'k>;
    /// The same item of another request.
    fn with_request(self, request: Request<'k>) -> Self;
    /// `store.decide_all`, or `store.settle_all`.
    fn apply<'a, S: Store>(store: &'a S, items: &'a [Self]) -> BoxFuture<'a, Vec<Decision>>;
}

impl<'k> Item<'k> for Request<'k> {
    const SETTLES: bool = false;
    fn request(&self) -> &Request<'k> {
        self
    }
    fn with_request(self, request: Request<'k>) -> Self {
        request
    }
    fn apply<'a, S: Store>(store: &'a S, items: &'a [Self]) -> BoxFuture<'a, Vec<Decision>> {
        store.decide_all(items)
    }
}

impl<'k> Item<'k> for Settle<'k> {
    const SETTLES: bool = true;
    fn request(&self) -> &Request<'k> {
        Settle::request(self)
    }
    fn with_request(self, request: Request<'k>) -> Self {
        Settle::with_request(self, request)
    }
    fn apply<'a, S: Store>(store: &'a S, items: &'a [Self]) -> BoxFuture<'a, Vec<Decision>> {
        store.settle_all(items)
    }
}

/// Whether `error` is an error of the request rather than of the store: invalid input (a bad
/// key, quota or batch) or a bad state stored at the request's key ([`Error::BadState`]). The
/// store answered, so it does not count toward opening the breaker.
fn is_request_error(error: &Error) -> bool {
    error.is_invalid_input() || matches!(error, Error::BadState { .. } | Error::Unsupported(_))
}

/// Settles a probe that never got an outcome (the caller dropped the future): the next caller
/// probes.
struct ProbeGuard<'a> {
    breaker: &'a Breaker,
    observer: &'a dyn Observer,
    name: &'static str,
    route: Route,
    done: bool,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if !self.done
            && let Some(t) = self.breaker.inconclusive(self.route)
        {
            self.observer.on_breaker(self.name, t.from, t.to);
        }
    }
}

/// What an open breaker answers without waiting, or the request the fallback must be awaited on.
enum OpenAnswer<'k> {
    /// The failure mode's answer, or the fallback's [`Store::decide_now`] answer, re-tagged.
    Ready(Result<Decision, Error>),
    /// The fallback must be awaited on this request (this instance's share of the limit).
    Await(Request<'k>),
}

impl<P: Store, F: Store, C: Clock> Hybrid<P, F, C> {
    /// What the open path (or a failed primary call, `error`) answers at once: the failure
    /// mode's answer, or the fallback's synchronous answer ([`Store::decide_now`]) with the
    /// instance share applied; else the scaled request to await the fallback on.
    fn open_now<'k>(&self, request: &Request<'k>, error: Option<Error>) -> OpenAnswer<'k> {
        let mode = self.failure_mode_of(request.state());
        if mode != FailureMode::Fallback {
            let answer = self.degrade_by(mode, error);
            return OpenAnswer::Ready(answer.map(|_| Self::fail_open(request)));
        }
        let share = match self.share_of(request) {
            Ok(share) => share,
            Err(e) => return OpenAnswer::Ready(Err(e)),
        };
        match self.fallback.decide_now(&share) {
            Some(answer) => {
                bump(&self.counters.fallback);
                OpenAnswer::Ready(answer.map(|d| d.with_source(Source::Fallback)))
            }
            None => OpenAnswer::Await(share),
        }
    }

    /// A decision while the breaker is open, or after the primary failed with `error`, in one
    /// boxed future of ours: a ready one when [`open_now`](Self::open_now) answers; else the
    /// fallback's own future re-tagged when the limit is whole (one instance), or a small one
    /// holding the scaled request the fallback's future borrows.
    fn decide_open<'s, 'r, 'k, 'f>(
        &'s self,
        request: &'r Request<'k>,
        error: Option<Error>,
    ) -> BoxFuture<'f, Decision>
    where
        's: 'f,
        'r: 'f,
        'k: 'f,
        Self: 'f,
    {
        let share = match self.open_now(request, error) {
            OpenAnswer::Ready(answer) => return Box::pin(std::future::ready(answer)),
            OpenAnswer::Await(share) => share,
        };
        bump(&self.counters.fallback);
        if self.share.is_whole() {
            return Box::pin(FromFallback(self.fallback.decide(request)));
        }
        Box::pin(async move {
            let decision = self.fallback.decide(&share).await?;
            Ok(decision.with_source(Source::Fallback))
        })
    }
}

impl<P: Store, F: Store, C: Clock> Hybrid<P, F, C> {
    /// A batch of requests or settles, once `valid`: on the primary while the breaker lets it,
    /// else by each policy's failure mode.
    fn batch<'k: 'f, 'f, T: Item<'k>>(
        &'f self,
        items: &'f [T],
        valid: Result<(), Error>,
    ) -> BoxFuture<'f, Vec<Decision>> {
        if let Err(e) = valid {
            return Box::pin(std::future::ready(Err(e)));
        }
        let route = self.route();
        if route == Route::Fallback {
            return Box::pin(self.degraded_all(items, None));
        }
        let now = if T::SETTLES { 0 } else { self.sent_at() };
        // The blocked-key cache remembers denied requests, never settles.
        let primary = move || async move {
            let decisions = T::apply(&self.primary, items).await?;
            if let Some(cache) = &self.blocked
                && !T::SETTLES
            {
                for (item, decision) in items.iter().zip(&decisions) {
                    cache.remember(item.request(), decision, now);
                }
            }
            Ok(decisions)
        };
        let policy = items.first().map_or("", |r| r.request().policy());
        let degraded = |error| self.degraded_all(items, error);
        Box::pin(self.guarded(route, policy, primary, degraded))
    }
}

/// The fallback's future, its decisions tagged [`Source::Fallback`].
struct FromFallback<'f>(BoxFuture<'f, Decision>);

impl Future for FromFallback<'_> {
    type Output = Result<Decision, Error>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0
            .as_mut()
            .poll(cx)
            .map_ok(|decision| decision.with_source(Source::Fallback))
    }
}

/// The future [`Store`]'s methods return (what `#[async_trait]` generates).
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

// Written out instead of `#[async_trait]`: the route is chosen before any future exists, so an
// open breaker boxes only the small fallback future, not the primary path's (timer included).
#[warn(clippy::missing_trait_methods)]
impl<P: Store, F: Store, C: Clock> Store for Hybrid<P, F, C> {
    fn decide<'s, 'r, 'k, 'f>(&'s self, request: &'r Request<'k>) -> BoxFuture<'f, Decision>
    where
        's: 'f,
        'r: 'f,
        'k: 'f,
        Self: 'f,
    {
        let route = self.route();
        if route == Route::Fallback {
            return self.decide_open(request, None);
        }
        let now = self.sent_at();
        if route == Route::Primary
            && let Some(cache) = &self.blocked
            && let Some(decision) = cache.lookup(request, now)
        {
            bump(&self.counters.blocked);
            return Box::pin(std::future::ready(Ok(decision)));
        }
        let primary = move || async move {
            let decision = self.primary.decide(request).await?;
            if let Some(cache) = &self.blocked {
                cache.remember(request, &decision, now);
            }
            Ok(decision)
        };
        let degraded = |error| self.decide_open(request, error);
        Box::pin(self.guarded(route, request.policy(), primary, degraded))
    }

    fn decide_all<'s, 'r, 'k, 'f>(
        &'s self,
        requests: &'r [Request<'k>],
    ) -> BoxFuture<'f, Vec<Decision>>
    where
        's: 'f,
        'r: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.batch(requests, validate_batch(requests))
    }

    /// Answers at once when no primary call is needed (see the crate documentation, "Answering
    /// at once"); `None` for a closed breaker's call, a due probe, or a fallback to await.
    fn decide_now(&self, request: &Request<'_>) -> Option<Result<Decision, Error>> {
        match self.breaker.route_now(|| self.clock.now_us())? {
            Route::Fallback => match self.open_now(request, None) {
                OpenAnswer::Ready(answer) => Some(answer),
                OpenAnswer::Await(_) => None,
            },
            Route::Primary => {
                let decision = self
                    .blocked
                    .as_ref()?
                    .lookup(request, self.clock.now_us())?;
                bump(&self.counters.blocked);
                Some(Ok(decision))
            }
            Route::Probe { .. } => None,
        }
    }

    // Batches are always awaited (`decide_all`): `None` is always a correct answer.
    fn decide_all_now(&self, _: &[Request<'_>], _: &mut [Decision]) -> Option<Result<(), Error>> {
        None
    }

    /// Settles as `decide_all` decides, never from the blocked-key cache (see the crate
    /// documentation, "Reports and give-backs").
    fn settle_all<'s, 'r, 'k, 'f>(
        &'s self,
        settles: &'r [Settle<'k>],
    ) -> BoxFuture<'f, Vec<Decision>>
    where
        's: 'f,
        'r: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.batch(settles, validate_settles(settles))
    }
}

impl<P, F, C> fmt::Debug for Hybrid<P, F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hybrid")
            .field("name", &self.name)
            .field("breaker", &self.breaker_state())
            .field("budget", &self.budget)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
