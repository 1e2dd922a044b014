//! [`Limiter`]: checks requests against the active [`PolicySet`] on any [`Store`].

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use distlimit_core::{Algorithm, Decision, Key, NEVER, Observer, Outcome, Request, Store};

use crate::intern::Name;
use crate::policy::{GLOBAL_KEY, Policy, Rule, Tier, TierInfo};
use crate::snapshot::{Published, UseSet, with_current};
use crate::{CheckError, ConfigError, PolicySet, Scope};

/// Checks requests against named policies on a store; the policies change at runtime without
/// locks.
///
/// The active [`PolicySet`] is published through an [`ArcSwap`](arc_swap::ArcSwap):
/// [`replace`](Self::replace) and [`update_policy`](Self::update_policy) publish a new one
/// atomically, and a check decides with one set from start to end, the old one or the new one,
/// never a mix. Each thread keeps the set it last used while no new one is published, so a check
/// costs one atomic load and no write for it (see the crate documentation, "Consistency").
///
/// Every tier of a policy is one [`Request`] under the store policy `"<policy>/<tier>"`; all
/// tiers of a check go to [`Store::decide_all`] together (all-or-nothing), a single tier to
/// [`Store::decide_now`] (a store that never waits answers there, without a future) or else
/// [`Store::decide`]. A single-tier check allocates nothing beyond what the store itself
/// allocates (on the memory store: nothing); a multi-tier check adds two `Vec`s (its batch of
/// requests and the verdict's tiers).
pub struct Limiter<S: ?Sized = dyn Store> {
    policies: Arc<Published>,
    observer: Option<Arc<dyn Observer>>,
    store: Arc<S>,
}

impl<S: Store + ?Sized> Limiter<S> {
    /// A limiter enforcing `policies` on `store`.
    pub fn new(store: Arc<S>, policies: PolicySet) -> Self {
        Self {
            policies: Published::new(policies),
            observer: None,
            store,
        }
    }

    /// The same limiter reporting every check to `observer`
    /// ([`Observer::on_decision`] with the policy name, the outcome, the combined decision and
    /// the time the check took), and every check that failed because its store did
    /// ([`Observer::on_store_error`], see [`STORE_LABEL`](Self::STORE_LABEL)).
    #[must_use]
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// Charges one unit to `key` under `policy`.
    #[inline]
    pub fn check<'a>(
        &'a self,
        policy: &'a str,
        key: &'a [u8],
    ) -> impl Future<Output = Result<Verdict, CheckError>> + Send + 'a {
        self.check_cost(policy, key, 1)
    }

    /// Reports whether one unit would pass for `key` under `policy` now, charging nothing.
    #[inline]
    pub fn peek<'a>(
        &'a self,
        policy: &'a str,
        key: &'a [u8],
    ) -> impl Future<Output = Result<Verdict, CheckError>> + Send + 'a {
        self.check_cost(policy, key, 0)
    }

    /// Charges `cost` units to `key` under every tier of `policy`, all-or-nothing.
    ///
    /// ([`check`](Self::check) and [`peek`](Self::peek) return this very future.) The first
    /// poll tries [`check_now`](Self::check_now), with the thread's cached policy set: a
    /// single-tier check on a store that answers [`Store::decide_now`] (the memory store, a
    /// hybrid store on its fallback) is decided there. A check that must await the store (a
    /// multi-tier batch, a Redis round trip) then loads the current set and holds it until the
    /// store answers.
    ///
    /// The future is fused: polled again after it returned its verdict, it stays pending and
    /// charges nothing.
    #[inline]
    pub fn check_cost<'a>(
        &'a self,
        policy: &'a str,
        key: &'a [u8],
        cost: u64,
    ) -> impl Future<Output = Result<Verdict, CheckError>> + Send + 'a {
        Check {
            limiter: self,
            policy,
            key,
            cost,
            later: Some(Self::check_later),
            waiting: None,
        }
    }

    /// Decides a check without waiting, if the store can: charges `cost` units to `key` under
    /// every tier of `policy` and returns the verdict, or returns `None`, having charged nothing,
    /// when the store would have to be awaited (then use [`check_cost`](Self::check_cost)).
    ///
    /// On the memory store, and on a hybrid store while it answers from its fallback, a
    /// single-tier policy is always decided here; a multi-tier policy, and a store that talks
    /// to a server, return `None`. A listed key, an unknown policy and an invalid key are
    /// answered on any store. The observer sees the check like one made with
    /// [`check_cost`](Self::check_cost).
    ///
    /// For synchronous code, and for callers that want to skip creating a future when the
    /// answer is at hand (the tower layer does).
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use distlimit_memory::MemoryStore;
    /// use distlimit_policy::{Limiter, PolicySet};
    ///
    /// let policies = PolicySet::from_toml_str(
    ///     r#"
    ///     [[policy]]
    ///     name = "login"
    ///     tiers = [ { name = "minute", limit = 2, per = "1m" } ]
    ///     "#,
    /// )?;
    /// let limiter = Limiter::new(Arc::new(MemoryStore::new()), policies);
    /// let mut served = 0;
    /// for _ in 0..3 {
    ///     match limiter.check_now("login", b"alice", 1) {
    ///         Some(Ok(verdict)) if verdict.is_allowed() => served += 1,
    ///         Some(Ok(denied)) => assert!(!denied.decision().retry_after().is_zero()),
    ///         Some(Err(e)) => return Err(e.into()),
    ///         None => unreachable!("the memory store answers single-tier checks at once"),
    ///     }
    /// }
    /// assert_eq!(served, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check_now(
        &self,
        policy: &str,
        key: &[u8],
        cost: u64,
    ) -> Option<Result<Verdict, CheckError>> {
        self.poll_now(policy, key, cost)
    }

    /// [`check_now`](Self::check_now), and the first poll of the check's future, answering
    /// in the type each returns (`A`: `Option` or `Poll`).
    ///
    /// Written so that the verdict (about 100 bytes) is built where the caller receives it:
    /// nothing unwraps and wraps it again, and the observer's path is a function of its own (a
    /// result that can also come from a call returns through memory). A move through memory of
    /// a value just written field by field stalls the CPU (see [`Flags`]): each such move cost
    /// a check 4 to 15 ns.
    #[inline(always)]
    fn poll_now<A: Answer>(&self, policy: &str, key: &[u8], cost: u64) -> A {
        if self.observer.is_some() {
            return self.poll_now_observed(policy, key, cost);
        }
        self.decide_cached(policy, key, cost)
    }

    /// [`poll_now`](Self::poll_now) reporting to the observer.
    #[inline(never)]
    fn poll_now_observed<A: Answer>(&self, policy: &str, key: &[u8], cost: u64) -> A {
        let started = Instant::now();
        match self.decide_cached::<Option<_>>(policy, key, cost) {
            Some(result) => {
                self.observe(policy, &result, started);
                A::ready(result)
            }
            None => A::pending(),
        }
    }

    /// [`decide_now`](Self::decide_now) with the thread's current set.
    #[inline(always)]
    fn decide_cached<A: Answer>(&self, policy: &str, key: &[u8], cost: u64) -> A {
        with_current(
            &self.policies,
            CheckNow {
                limiter: self,
                policy,
                key,
                cost,
                answer: PhantomData,
            },
        )
    }

    /// A check that must await the store, from the start: with the current set (the thread's
    /// cached one, shared), held until the store answers.
    async fn check_later(
        &self,
        policy: &str,
        key: &[u8],
        cost: u64,
    ) -> Result<Verdict, CheckError> {
        let started = self.observer.as_ref().map(|_| Instant::now());
        let set = with_current(&self.policies, |set: &Arc<PolicySet>| Arc::clone(set));
        let result = self.decide_later(&set, policy, key, cost).await;
        if let Some(started) = started {
            self.observe(policy, &result, started);
        }
        result
    }

    /// Reports a finished check to the observer: its decision, or the store's failure (see
    /// [`report_error`](Self::report_error)).
    fn observe(&self, policy: &str, result: &Result<Verdict, CheckError>, started: Instant) {
        match result {
            Ok(verdict) => {
                if let Some(observer) = &self.observer {
                    observer.on_decision(
                        policy,
                        verdict.outcome(),
                        verdict.decision(),
                        started.elapsed(),
                    );
                }
            }
            Err(e) => self.report_error(policy, e),
        }
    }

    /// The check, as far as it goes without waiting: a listed key, or a single tier the store
    /// answers through [`Store::decide_now`].
    #[inline(always)]
    fn decide_now<A: Answer>(
        &self,
        set: &PolicySet,
        hint: &mut usize,
        policy: &str,
        key: &[u8],
        cost: u64,
    ) -> A {
        let found = match lookup(set, hint, policy, key) {
            Ok(found) => found,
            Err(e) => return A::ready(Err(e)),
        };
        let decided = match (found.rule, found.tiers) {
            (Some(Rule::Allow), _) => Decided::Listed(allow_listed()),
            (Some(Rule::Deny), _) => Decided::Listed(deny_listed()),
            (_, [tier]) => {
                let request = match tier_request(tier, found.key, cost) {
                    Ok(request) => request,
                    Err(e) => return A::ready(Err(e)),
                };
                // `*self.store`: the store itself (`Arc<S>` implements `Store` too, forwarding
                // with a future box of its own).
                match (*self.store).decide_now(&request) {
                    Some(Ok(decision)) => Decided::One(TierDecision {
                        tier: tier.info(),
                        decision: rebuilt(&decision),
                    }),
                    Some(Err(e)) => return A::ready(Err(e.into())),
                    None => return A::pending(),
                }
            }
            _ => return A::pending(),
        };
        A::ready(Ok(found.verdict(decided)))
    }

    /// The decision of a check that must await the store, with `set`.
    async fn decide_later(
        &self,
        set: &PolicySet,
        policy: &str,
        key: &[u8],
        cost: u64,
    ) -> Result<Verdict, CheckError> {
        let found = lookup(set, &mut 0, policy, key)?;
        let decided = match (found.rule, found.tiers) {
            (Some(Rule::Allow), _) => Decided::Listed(allow_listed()),
            (Some(Rule::Deny), _) => Decided::Listed(deny_listed()),
            (_, [tier]) => {
                let request = tier_request(tier, found.key, cost)?;
                let decision = (*self.store).decide(&request).await?;
                Decided::One(TierDecision {
                    tier: tier.info(),
                    decision,
                })
            }
            (_, tiers) => {
                let requests = tiers
                    .iter()
                    .map(|tier| tier_request(tier, found.key, cost))
                    .collect::<Result<Vec<_>, _>>()?;
                let all = (*self.store).decide_all(&requests).await?;
                let decision = Decision::most_restrictive(&all).unwrap_or_else(deny_listed);
                let tiers = tiers
                    .iter()
                    .zip(all)
                    .map(|(tier, decision)| TierDecision {
                        tier: tier.info(),
                        decision,
                    })
                    .collect();
                Decided::Many(decision, tiers)
            }
        };
        Ok(found.verdict(decided))
    }

    /// Reports a store failure that ends a check to the observer, as
    /// [`Observer::on_store_error`] with the store named [`Limiter::STORE_LABEL`]. Unknown
    /// policies and invalid keys are the caller's errors, not the store's: not reported.
    #[cold]
    fn report_error(&self, policy: &str, e: &CheckError) {
        if let (Some(observer), CheckError::Store(error)) = (&self.observer, e)
            && !error.is_invalid_input()
        {
            observer.on_store_error(Self::STORE_LABEL, policy, error);
        }
    }

    /// The store name a limiter reports failed checks under ([`Observer::on_store_error`]):
    /// `"limiter"`. Each report is a check that returned the store's error to its caller; a
    /// store that absorbs failures itself (the hybrid store's fallback) reports those under its
    /// own name, and a failure it passes on is then reported by both.
    pub const STORE_LABEL: &'static str = "limiter";

    /// The active policy set.
    pub fn policies(&self) -> Arc<PolicySet> {
        self.policies.load_full()
    }

    /// Makes `set` the active policy set, atomically. Checks already running finish with the
    /// set they started with.
    pub fn replace(&self, set: PolicySet) {
        self.replace_shared(Arc::new(set));
    }

    /// [`replace`](Self::replace) with a set already shared (for example one kept to switch
    /// back to, or the same set given to several limiters).
    pub fn replace_shared(&self, set: Arc<PolicySet>) {
        self.policies.store(set);
    }

    /// Sets the limit and window of one tier, keeping its algorithm, name and state (see the
    /// crate documentation for what the state means under the new quota). `name` is
    /// `"<policy>"` for a policy of one tier, or `"<policy>/<tier>"`.
    ///
    /// Concurrent updates all take effect (each is applied to the set the previous one
    /// published). An invalid change is an error and changes nothing.
    pub fn update_policy(
        &self,
        name: &str,
        limit: u64,
        window: Duration,
    ) -> Result<(), ConfigError> {
        let mut result = Ok(());
        self.policies
            .rcu(|current| match current.with_quota(name, limit, window) {
                Ok(set) => {
                    result = Ok(());
                    Arc::new(set)
                }
                Err(e) => {
                    result = Err(e);
                    Arc::clone(current)
                }
            });
        result
    }
}

pin_project_lite::pin_project! {
    /// The future of [`Limiter::check_cost`]: [`Limiter::poll_now`] in the first poll, and
    /// when the store must be awaited, the future `later` makes.
    struct Check<'a, S: ?Sized, L, F> {
        limiter: &'a Limiter<S>,
        policy: &'a str,
        key: &'a [u8],
        cost: u64,
        // Makes the future of a check that must wait (`Limiter::check_later`); taken by the
        // first poll.
        later: Option<L>,
        #[pin]
        waiting: Option<F>,
    }
}

impl<'a, S, L, F> Future for Check<'a, S, L, F>
where
    S: Store + ?Sized,
    L: FnOnce(&'a Limiter<S>, &'a str, &'a [u8], u64) -> F,
    F: Future<Output = Result<Verdict, CheckError>>,
{
    type Output = Result<Verdict, CheckError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Some(later) = this.later.take() {
            match this.limiter.poll_now(this.policy, this.key, *this.cost) {
                Poll::Pending => {
                    let waiting = later(this.limiter, this.policy, this.key, *this.cost);
                    this.waiting.set(Some(waiting));
                }
                ready => return ready,
            }
        }
        let Some(waiting) = this.waiting.as_mut().as_pin_mut() else {
            return Poll::Pending;
        };
        let result = std::task::ready!(waiting.poll(cx));
        this.waiting.set(None);
        Poll::Ready(result)
    }
}

/// The answer of a check that may have to wait: `Option` for [`Limiter::check_now`], `Poll`
/// for the check's future, each built in place (see [`Limiter::poll_now`]).
trait Answer {
    /// Decided.
    fn ready(result: Result<Verdict, CheckError>) -> Self;
    /// The store must be awaited.
    fn pending() -> Self;
}

impl Answer for Option<Result<Verdict, CheckError>> {
    #[inline(always)]
    fn ready(result: Result<Verdict, CheckError>) -> Self {
        Some(result)
    }

    #[inline(always)]
    fn pending() -> Self {
        None
    }
}

impl Answer for Poll<Result<Verdict, CheckError>> {
    #[inline(always)]
    fn ready(result: Result<Verdict, CheckError>) -> Self {
        Poll::Ready(result)
    }

    #[inline(always)]
    fn pending() -> Self {
        Poll::Pending
    }
}

/// The synchronous part of a check, run with the thread's cached set.
struct CheckNow<'a, S: ?Sized, A> {
    limiter: &'a Limiter<S>,
    policy: &'a str,
    key: &'a [u8],
    cost: u64,
    answer: PhantomData<fn() -> A>,
}

impl<S: Store + ?Sized, A: Answer> UseSet for CheckNow<'_, S, A> {
    type Output = A;

    #[inline(always)]
    fn call(&mut self, set: &Arc<PolicySet>, hint: &mut usize) -> Self::Output {
        self.limiter
            .decide_now(set, hint, self.policy, self.key, self.cost)
    }
}

/// What a check found in its policy set for a key.
struct Found<'s, 'k> {
    policy: &'s Policy,
    key: Key<'k>,
    rule: Option<Rule>,
    tiers: &'s [Tier],
}

impl Found<'_, '_> {
    /// The verdict of `decided` under this policy.
    #[inline(always)]
    fn verdict(&self, decided: Decided) -> Verdict {
        let shadow = self.policy.is_shadow();
        let outcome = match (decided.decision().is_allowed(), shadow) {
            (true, _) => Outcome::Allowed,
            (false, false) => Outcome::Denied,
            (false, true) => Outcome::ShadowDenied,
        };
        Verdict {
            decided,
            policy: self.policy.static_name(),
            flags: Flags::new(
                outcome,
                shadow,
                matches!(self.rule, Some(Rule::Override(_))),
            ),
        }
    }
}

/// Looks up `policy` in `set`, validates `key` and finds what applies to it.
#[inline(always)]
fn lookup<'s, 'k>(
    set: &'s PolicySet,
    hint: &mut usize,
    policy: &str,
    key: &'k [u8],
) -> Result<Found<'s, 'k>, CheckError> {
    let found = match set.policy_at(*hint) {
        Some(p) if p.name() == policy => p,
        _ => {
            let Some((i, p)) = set
                .position(policy)
                .and_then(|i| Some((i, set.policy_at(i)?)))
            else {
                return Err(CheckError::UnknownPolicy(policy.to_owned()));
            };
            *hint = i;
            p
        }
    };
    let key = Key::new(key).map_err(distlimit_core::Error::from)?;
    let rule = found.rule(key.as_bytes());
    Ok(Found {
        policy: found,
        key,
        rule,
        tiers: found.tiers_for(rule),
    })
}

impl<S: ?Sized> std::fmt::Debug for Limiter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("policies", &self.policies.load_full().len())
            .field("observer", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

/// `decision`, rebuilt from its fields.
///
/// The store has just written its decision, field by field; copied as it is, the compiler
/// moves two adjacent fields with one 16-byte load, which the CPU cannot forward from those two
/// pending 8-byte stores: the load waits until the store's writes (the key's entry among them,
/// often a cache miss) reach the cache. Rebuilt (the caps of [`Decision::from_micros`], the
/// source), each field is read on its own and forwarded at once. Measured in the limiter bench
/// (paired rounds): about 5 ns less per check through the future (`check`), within noise
/// through `check_now`.
#[inline(always)]
fn rebuilt(decision: &Decision) -> Decision {
    Decision::from_micros(
        decision.is_allowed(),
        decision.limit(),
        decision.remaining(),
        decision.reset_after_us(),
        decision.retry_after_us(),
    )
    .with_source(decision.source())
}

/// The answer of a key on the allow list: nothing counted, nothing limited.
#[inline]
fn allow_listed() -> Decision {
    Decision::allowed(u64::MAX, u64::MAX, Duration::ZERO)
}

/// The answer of a key on the deny list: never admitted.
#[inline]
fn deny_listed() -> Decision {
    Decision::denied(0, 0, Duration::ZERO, NEVER)
}

/// The store request of `tier` for `key`.
#[inline]
fn tier_request<'a>(tier: &'a Tier, key: Key<'a>, cost: u64) -> Result<Request<'a>, CheckError> {
    let key = match tier.scope() {
        Scope::Key => key,
        Scope::Global => Key::new(GLOBAL_KEY).map_err(distlimit_core::Error::from)?,
    };
    Ok(Request::new(key, *tier.limit())
        .with_cost(cost)
        .with_policy(tier.store_policy())
        .map_err(distlimit_core::Error::from)?)
}

/// Whether a key was on a list of its policy: decided without the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Listed {
    /// On the allow list: admitted, nothing charged.
    Allow,
    /// On the deny list: denied with `retry_after` = [`NEVER`](distlimit_core::NEVER).
    Deny,
}

/// The answer to one check: the outcome, the combined decision, and one decision per tier.
///
/// It is plain data: it copies what it reports of the policy (the tiers' names, quotas and
/// algorithms as the check used them), so it holds no reference to the policy set and can be
/// kept, cloned and sent anywhere.
#[derive(Clone)]
pub struct Verdict {
    decided: Decided,
    policy: Name,
    flags: Flags,
}

/// A verdict's outcome, shadow mode and override flag in one word.
///
/// One word rather than three bytes, so that the verdict has no tail of loose bytes: the
/// verdict is moved a few times on its way out of a check (into the check's result, the
/// future's output, the caller's variable), and a tail of bytes written one by one but moved as
/// one 16-byte block stalls each move (store-to-load forwarding fails); that cost the check
/// about 10 ns.
#[derive(Clone, Copy)]
struct Flags(u64);

impl Flags {
    const DENIED: u64 = 1;
    const SHADOW_DENIED: u64 = 2;
    const SHADOW: u64 = 4;
    const OVERRIDE: u64 = 8;

    #[inline(always)]
    fn new(outcome: Outcome, shadow: bool, is_override: bool) -> Self {
        let outcome = match outcome {
            Outcome::Denied => Self::DENIED,
            Outcome::ShadowDenied => Self::SHADOW_DENIED,
            _ => 0,
        };
        Self(
            outcome
                | if shadow { Self::SHADOW } else { 0 }
                | if is_override { Self::OVERRIDE } else { 0 },
        )
    }

    #[inline(always)]
    fn outcome(self) -> Outcome {
        if self.0 & Self::DENIED != 0 {
            Outcome::Denied
        } else if self.0 & Self::SHADOW_DENIED != 0 {
            Outcome::ShadowDenied
        } else {
            Outcome::Allowed
        }
    }

    #[inline(always)]
    fn shadow(self) -> bool {
        self.0 & Self::SHADOW != 0
    }

    #[inline(always)]
    fn is_override(self) -> bool {
        self.0 & Self::OVERRIDE != 0
    }
}

/// What the store answered, per tier.
#[derive(Clone)]
enum Decided {
    /// A listed key: no tier was asked. Allowed for the allow list, denied for the deny list
    /// (no separate byte for which: every variant's payload is whole words, see [`Flags`]).
    Listed(Decision),
    /// A policy of one tier.
    One(TierDecision),
    /// The most restrictive decision, and one per tier as the store answered them.
    Many(Decision, Vec<TierDecision>),
}

impl Decided {
    #[inline]
    fn decision(&self) -> &Decision {
        match self {
            Decided::Listed(d) | Decided::Many(d, _) => d,
            Decided::One(one) => &one.decision,
        }
    }
}

/// One tier's decision, with the tier as the check used it.
#[derive(Clone, Debug)]
struct TierDecision {
    tier: TierInfo,
    decision: Decision,
}

impl Verdict {
    /// Allowed, denied, or denied in shadow mode (let through and reported).
    #[inline]
    pub fn outcome(&self) -> Outcome {
        self.flags.outcome()
    }

    /// Whether the request may proceed: `false` only for [`Outcome::Denied`]; a shadow denial
    /// passes.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.outcome() != Outcome::Denied
    }

    /// The most restrictive decision over the tiers (see [`Decision::most_restrictive`]); its
    /// [`source`](Decision::source) says which store answered. A listed key's decision is
    /// synthetic: allowed with `limit` = `remaining` = `u64::MAX`, or denied with
    /// `retry_after` = [`NEVER`](distlimit_core::NEVER).
    #[inline]
    pub fn decision(&self) -> &Decision {
        self.decided.decision()
    }

    /// The policy's name.
    #[inline]
    pub fn policy(&self) -> &str {
        self.policy.as_str()
    }

    /// Whether the key was on the allow or deny list (then [`tiers`](Self::tiers) is empty).
    #[inline]
    pub fn listed(&self) -> Option<Listed> {
        match &self.decided {
            Decided::Listed(d) if d.is_allowed() => Some(Listed::Allow),
            Decided::Listed(_) => Some(Listed::Deny),
            _ => None,
        }
    }

    /// Whether the key was held to a per-key override instead of the policy's tiers.
    #[inline]
    pub fn is_override(&self) -> bool {
        self.flags.is_override()
    }

    /// One verdict per tier the key was checked against, in order (global tiers first for an
    /// override). Empty for a listed key.
    pub fn tiers(&self) -> TierVerdicts<'_> {
        let tiers = match &self.decided {
            Decided::Listed(..) => &[][..],
            Decided::One(one) => std::slice::from_ref(one),
            Decided::Many(_, all) => all,
        };
        TierVerdicts {
            tiers,
            shadow: self.flags.shadow(),
        }
    }
}

impl std::fmt::Debug for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verdict")
            .field("policy", &self.policy())
            .field("outcome", &self.outcome())
            .field("decision", self.decision())
            .field("tiers", &self.tiers().collect::<Vec<_>>())
            .finish()
    }
}

/// The tiers of a [`Verdict`]: an iterator that also answers `len`, `is_empty`, `get`, `first`
/// and `iter` like a slice.
#[derive(Clone, Debug)]
pub struct TierVerdicts<'a> {
    tiers: &'a [TierDecision],
    shadow: bool,
}

impl<'a> TierVerdicts<'a> {
    /// The number of tiers left.
    #[inline]
    pub fn len(&self) -> usize {
        self.tiers.len()
    }

    /// Whether no tier is left.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.tiers.is_empty()
    }

    /// The `index`-th tier left.
    pub fn get(&self, index: usize) -> Option<TierVerdict<'a>> {
        Some(TierVerdict {
            tier: self.tiers.get(index)?,
            shadow: self.shadow,
        })
    }

    /// The first tier left.
    pub fn first(&self) -> Option<TierVerdict<'a>> {
        self.get(0)
    }

    /// The tiers, as an iterator (this value itself).
    pub fn iter(&self) -> Self {
        self.clone()
    }
}

impl<'a> Iterator for TierVerdicts<'a> {
    type Item = TierVerdict<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.first()?;
        self.tiers = self.tiers.get(1..).unwrap_or_default();
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.len(), Some(self.len()))
    }
}

impl ExactSizeIterator for TierVerdicts<'_> {}

/// The decision of one tier, with the tier's name and quota ([`limit`](Self::limit),
/// [`period`](Self::period), [`burst`](Self::burst)) as the check used them (for
/// `RateLimit-Policy` and `RateLimit` headers).
#[derive(Clone, Copy, Debug)]
pub struct TierVerdict<'a> {
    tier: &'a TierDecision,
    shadow: bool,
}

impl<'a> TierVerdict<'a> {
    /// The tier's name.
    #[inline]
    pub fn name(&self) -> &'a str {
        self.tier.tier.name.as_str()
    }

    /// The tier's limit: units admitted per [`period`](Self::period) (see [`Quota::limit`](distlimit_core::Quota::limit)).
    #[inline]
    pub fn limit(&self) -> u64 {
        self.tier.tier.limit
    }

    /// The tier's period (see [`Quota::period`](distlimit_core::Quota::period)).
    #[inline]
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.tier.tier.period_us)
    }

    /// The tier's burst: its capacity (see [`Quota::burst`](distlimit_core::Quota::burst)).
    #[inline]
    pub fn burst(&self) -> u64 {
        self.tier.tier.burst
    }

    /// The tier's algorithm.
    #[inline]
    pub fn algorithm(&self) -> Algorithm {
        self.tier.tier.algorithm()
    }

    /// Per key or global.
    #[inline]
    pub fn scope(&self) -> Scope {
        self.tier.tier.scope()
    }

    /// What this tier alone answered. All tiers were charged if and only if every one allowed.
    #[inline]
    pub fn decision(&self) -> &'a Decision {
        &self.tier.decision
    }

    /// Whether the policy is in shadow mode (a denial here did not block the request).
    #[inline]
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }
}
