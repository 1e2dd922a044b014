//! [`Limiter`]: checks requests against the active [`PolicySet`] on any [`Store`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use distlimit_core::{Algorithm, Decision, Observer, Outcome, SettleKind, Store};

use smallvec::SmallVec;

use crate::batch::{Answer, Engine, INLINE, Item, MISMATCH, Plan, Resolved, never, outcome};
use crate::error::Field;
use crate::policy::{Applied, Tier};
use crate::{CheckError, PolicyConfigError, PolicySet, Scope};

/// Checks requests against named policies on a store; the policies change at runtime without
/// locks.
///
/// The active [`PolicySet`] is published through an [`ArcSwap`]: [`replace`](Self::replace) and
/// [`update_policy`](Self::update_policy) publish a new one atomically, and a check decides
/// with the one set it loaded, the old one or the new one, never a mix. Every check is one
/// all-or-nothing batch ([`decide_batch`](Limiter::decide_batch)), each tier of a policy one
/// [`Request`](distlimit_core::Request) in the state [`Tier::state`] (`"<policy>/<tier>"`).
pub struct Limiter<S: ?Sized = dyn Store> {
    policies: ArcSwap<PolicySet>,
    /// The policies every published set must define ([`Limiter::declare`]); held while a set
    /// is checked and published, so that a declaration and a replacement never cross.
    declared: Mutex<Vec<Box<str>>>,
    observer: Option<Arc<dyn Observer>>,
    store: Arc<S>,
}

impl<S: Store + ?Sized> Limiter<S> {
    /// A limiter enforcing `policies` on `store`.
    pub fn new(store: Arc<S>, policies: PolicySet) -> Self {
        Self {
            policies: ArcSwap::from_pointee(policies),
            declared: Mutex::default(),
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

    /// The observer the limiter reports to ([`with_observer`](Self::with_observer)), for
    /// callers that report events of their own about its policies (the tower layer's streams).
    pub fn observer(&self) -> Option<&Arc<dyn Observer>> {
        self.observer.as_ref()
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// Charges one unit to `key` under `policy` ([`check_cost`](Self::check_cost) with 1).
    pub fn check<'a>(
        &'a self,
        policy: &'a str,
        key: &'a [u8],
    ) -> impl Future<Output = Result<Verdict, CheckError>> + 'a {
        self.check_cost(policy, key, 1)
    }

    /// Reports whether one unit would pass for `key` under `policy` now, charging nothing
    /// ([`check_cost`](Self::check_cost) with 0).
    pub fn peek<'a>(
        &'a self,
        policy: &'a str,
        key: &'a [u8],
    ) -> impl Future<Output = Result<Verdict, CheckError>> + 'a {
        self.check_cost(policy, key, 0)
    }

    /// Charges `cost` units to `key` under every tier of `policy`, all-or-nothing:
    /// [`check_all`](Self::check_all) of one check, decided without waiting when the store can,
    /// else its [`Plan`] (the policy looked up once) awaited.
    pub async fn check_cost(
        &self,
        policy: &str,
        key: &[u8],
        cost: u64,
    ) -> Result<Verdict, CheckError> {
        let verdicts: SmallVec<[Verdict; 1]> = match self.check_all_now(&[(policy, key, cost)]) {
            Checked::Decided(result) => result?,
            Checked::Pending(plan) => self.decide_plan(&plan).await?.into(),
        };
        verdicts.into_iter().next().ok_or_else(|| MISMATCH.into())
    }

    /// Settles usage known only after the response on every tier of `policy` for `key`, through
    /// [`Store::settle_all`]: a [`SettleKind::Report`] charges `cost` even past the limit (the
    /// excess is debt that later checks wait out), a [`SettleKind::GiveBack`] returns `cost`
    /// units reserved and not used. Reserve, then settle: [`check_cost`](Self::check_cost) an
    /// estimate, then report `actual − estimate` or give back `estimate − actual`.
    ///
    /// The verdict is what a peek answers after it (denied while the key is in debt, with the
    /// exact `retry_after`). Allow- and deny-listed keys charge nothing. The policy's tiers must
    /// be token buckets or GCRA ([`CheckError::Store`] with an `InvalidRequest` otherwise); a
    /// store that cannot settle answers [`CheckError::Store`] with an `Unsupported`.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use distlimit_core::SettleKind;
    /// use distlimit_memory::MemoryStore;
    /// use distlimit_policy::{Limiter, PolicySet};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let policies = PolicySet::from_toml_str(
    ///     r#"
    ///     [[policy]]
    ///     name = "tokens"
    ///     tiers = [ { name = "minute", limit = 100, per = "1m", algorithm = "token_bucket" } ]
    ///     "#,
    /// )?;
    /// let limiter = Limiter::new(Arc::new(MemoryStore::new()), policies);
    /// // Reserve 10, use 250: the 240 above the estimate are charged, 150 of them as debt.
    /// assert!(limiter.check_cost("tokens", b"alice", 10).await?.is_allowed());
    /// let after = limiter.settle("tokens", b"alice", SettleKind::Report, 240).await?;
    /// assert!(!after.is_allowed());
    /// assert!(after.decision().retry_after().as_secs() >= 90);
    /// # Ok(()) }
    /// ```
    pub async fn settle(
        &self,
        policy: &str,
        key: &[u8],
        kind: SettleKind,
        cost: u64,
    ) -> Result<Verdict, CheckError> {
        let item = Item::policy(policy, key, cost).settling(kind);
        let answers = self.decide_batch(std::slice::from_ref(&item)).await?;
        answers
            .into_iter()
            .next()
            .and_then(Answer::into_verdict)
            .ok_or_else(|| MISMATCH.into())
    }

    /// Decides a check without waiting, if the store can: charges `cost` units to `key` under
    /// every tier of `policy` and returns the verdict, or returns `None`, having charged nothing,
    /// when the store would have to be awaited (then use [`check_cost`](Self::check_cost)).
    ///
    /// On the memory store a single-tier policy is always decided here; a multi-tier policy,
    /// and a store that talks to a server, return `None`. A listed key, an unknown policy and
    /// an invalid key are answered on any store. The observer sees the check like one made
    /// with [`check_cost`](Self::check_cost). For synchronous code, and callers that skip a
    /// future when the answer is at hand (the tower layer's streams).
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
    pub fn check_now(
        &self,
        policy: &str,
        key: &[u8],
        cost: u64,
    ) -> Option<Result<Verdict, CheckError>> {
        let set = self.policies.load();
        let item = match Resolved::of_policy(&set, policy, key, cost, None, false) {
            Ok(item) => item,
            Err(e) => return Some(Err(e)),
        };
        let verdict = |answer: Answer| answer.into_verdict().ok_or_else(|| MISMATCH.into());
        Some(self.engine().decide_one_now(&item)?.and_then(verdict))
    }

    /// Decides `items` in one all-or-nothing batch: one [`Answer`] per item, in order (the
    /// crate documentation describes the items and the rules). Every check is a batch of it.
    ///
    /// The request is admitted, and was charged, if and only if every answer
    /// [`is_allowed`](Answer::is_allowed); a denied batch charges nothing, its other items
    /// answered what they alone would have been. The observer sees each policy item as a check
    /// made alone.
    ///
    /// # All or nothing, and its one limit
    ///
    /// The store requests of the items not in shadow mode go to the store in one
    /// [`Store::decide_all`] of at most [`MAX_BATCH`](distlimit_core::MAX_BATCH) requests (128):
    /// the tiers of every policy item (at most [`MAX_TIERS`](crate::MAX_TIERS) each, none for a
    /// listed key) plus one per request item, counted before requests on the same state and key
    /// are merged. A batch that needs more is decided in consecutive chunks of whole items,
    /// each all-or-nothing; once a chunk is denied, the later ones are only peeked at (charged
    /// nothing), but chunks admitted before it stay charged. Stores have no refund for every
    /// algorithm, so this is the one place the guarantee ends: the Envoy server's 64
    /// descriptors of one store request each (its YAML rules) always fit in one batch.
    ///
    /// # Errors
    ///
    /// An unknown policy or an invalid key (nothing charged); the store's failure.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use distlimit_core::{Key, Limit, Quota, Request, Store};
    /// use distlimit_memory::MemoryStore;
    /// use distlimit_policy::{Item, Limiter, PolicySet};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let policies = PolicySet::from_toml_str(
    ///     r#"
    ///     [[policy]]
    ///     name = "per_user"
    ///     tiers = [ { name = "minute", limit = 1, per = "1m" } ]
    ///     "#,
    /// )?;
    /// let store = Arc::new(MemoryStore::new());
    /// let limiter = Limiter::new(store.clone(), policies);
    /// // A limit of the caller's own, decided in the same batch as the policy.
    /// let per_ip = Limit::fixed_window(Quota::per_minute(5)?);
    /// let ip = Request::new(Key::new("10.0.0.1")?, per_ip).with_policy("per_ip")?;
    /// for expected in [true, false] {
    ///     let batch = [Item::policy("per_user", b"alice", 1), Item::request(ip)];
    ///     let answers = limiter.decide_batch(&batch).await?;
    ///     assert_eq!(answers.iter().all(|a| a.is_allowed()), expected);
    /// }
    /// // The second batch was denied by "per_user": the IP was charged once, not twice.
    /// assert_eq!(store.decide(&ip.with_cost(0)).await?.remaining(), 4);
    /// # Ok(()) }
    /// ```
    pub async fn decide_batch(&self, items: &[Item<'_>]) -> Result<Vec<Answer>, CheckError> {
        let set = self.policies.load_full();
        let resolved = items
            .iter()
            .map(|item| Resolved::new(&set, item))
            .collect::<Result<SmallVec<[_; INLINE]>, _>>()?;
        self.run(&resolved, Some).await
    }

    /// The executor: decides `items` without waiting if the store can, else awaits it; one
    /// answer per item, in order, each mapped by `map`.
    async fn run<T>(
        &self,
        items: &[Resolved<'_, '_>],
        map: fn(Answer) -> Option<T>,
    ) -> Result<Vec<T>, CheckError> {
        let engine = self.engine();
        let mut answers: SmallVec<[Option<T>; INLINE]> = SmallVec::new();
        answers.resize_with(items.len(), || None);
        let mut out = |i: usize, answer: Answer| {
            if let Some(slot) = answers.get_mut(i) {
                *slot = map(answer);
            }
        };
        match engine.decide_now(items, &mut out) {
            Some(result) => result?,
            None => engine.decide(items, &mut out).await?,
        }
        answers
            .iter_mut()
            .map(Option::take)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| MISMATCH.into())
    }

    /// Charges several checks all-or-nothing: every `(policy, key, cost)` is charged on every
    /// tier of its policy, or none is. One verdict per check, in order: a batch of
    /// [`Item::policy`]s ([`decide_batch`](Self::decide_batch), which says what is charged
    /// when).
    ///
    /// # Errors
    ///
    /// An unknown policy or an invalid key (nothing charged); the store's failure.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use distlimit_memory::MemoryStore;
    /// use distlimit_policy::{Limiter, PolicySet};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let policies = PolicySet::from_toml_str(
    ///     r#"
    ///     [[policy]]
    ///     name = "per_ip"
    ///     tiers = [ { name = "minute", limit = 10, per = "1m" } ]
    ///
    ///     [[policy]]
    ///     name = "per_user"
    ///     tiers = [ { name = "minute", limit = 1, per = "1m" } ]
    ///     "#,
    /// )?;
    /// let limiter = Limiter::new(Arc::new(MemoryStore::new()), policies);
    /// let request = [("per_ip", &b"10.0.0.1"[..], 1), ("per_user", &b"alice"[..], 1)];
    /// let first = limiter.check_all(&request).await?;
    /// assert!(first.iter().all(|v| v.is_allowed()));
    /// // alice is over her limit: the request is denied and the IP is not charged.
    /// let second = limiter.check_all(&request).await?;
    /// assert!(second[0].is_allowed() && !second[1].is_allowed());
    /// assert_eq!(limiter.peek("per_ip", b"10.0.0.1").await?.decision().remaining(), 9);
    /// # Ok(()) }
    /// ```
    pub async fn check_all(
        &self,
        checks: &[(&str, &[u8], u64)],
    ) -> Result<Vec<Verdict>, CheckError> {
        match self.check_all_now(checks) {
            Checked::Decided(result) => result,
            Checked::Pending(plan) => self.decide_plan(&plan).await,
        }
    }

    /// Decides several checks without waiting, if the store can: [`check_all`](Self::check_all)
    /// answered at once ([`Checked::Decided`], the verdicts collected into any `V`), or, having
    /// charged nothing, the checks' [`Plan`] ([`Checked::Pending`], their policies resolved
    /// once) for [`decide_plan`](Self::decide_plan) to await. `check_all` is this, then that.
    ///
    /// On the memory store every batch of at most [`MAX_BATCH`](distlimit_core::MAX_BATCH)
    /// store requests whose items in shadow mode do not ask the store beside others is decided
    /// here, up to 8 checks of up to 8 tiers in all without allocating beyond `V` (and a
    /// multi-tier verdict's tiers); a store that talks to a server returns a plan unless no
    /// check needs it (listed keys). The observer sees each check as with `check_all`.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use distlimit_memory::MemoryStore;
    /// use distlimit_policy::{Checked, Limiter, PolicySet, Verdict};
    ///
    /// let login = "[[policy]]\nname = \"login\"\ntiers = [{ name = \"m\", limit = 1, per = \"1m\" }]";
    /// let limiter = Limiter::new(Arc::new(MemoryStore::new()), PolicySet::from_toml_str(login)?);
    /// let request = [("login", &b"alice"[..], 1), ("login", &b"bob"[..], 1)];
    /// for admitted in [true, false] {
    ///     let verdicts: Vec<Verdict> = match limiter.check_all_now(&request) {
    ///         Checked::Decided(result) => result?,
    ///         Checked::Pending(_) => unreachable!("the memory store answers at once"),
    ///     };
    ///     assert_eq!(verdicts.iter().all(Verdict::is_allowed), admitted);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_all_now<V: FromIterator<Verdict>>(
        &self,
        checks: &[(&str, &[u8], u64)],
    ) -> Checked<V> {
        let set = self.policies.load();
        let mut resolved: SmallVec<[Resolved<'_, '_>; INLINE]> = SmallVec::new();
        for &(policy, key, cost) in checks {
            match Resolved::of_policy(&set, policy, key, cost, None, false) {
                Ok(item) => resolved.push(item),
                Err(e) => return Checked::Decided(Err(e)),
            }
        }
        // Filled in place and taken out one by one: the buffer itself is never moved.
        let mut verdicts: SmallVec<[Option<Verdict>; INLINE]> = SmallVec::new();
        verdicts.resize_with(checks.len(), || None);
        let out = |i: usize, answer: Answer| {
            if let Some(slot) = verdicts.get_mut(i) {
                *slot = answer.into_verdict();
            }
        };
        let Some(decided) = self.engine().decide_now(&resolved, out) else {
            return Checked::Pending(Plan::new(&resolved));
        };
        Checked::Decided(decided.and_then(|()| {
            let verdicts = verdicts.iter_mut().map(Option::take);
            verdicts
                .collect::<Option<V>>()
                .ok_or_else(|| MISMATCH.into())
        }))
    }

    /// Decides a [`Plan`] of [`check_all_now`](Self::check_all_now) like
    /// [`check_all`](Self::check_all), with the policies as the plan resolved them.
    ///
    /// # Errors
    ///
    /// The store's failure.
    pub async fn decide_plan(&self, plan: &Plan) -> Result<Vec<Verdict>, CheckError> {
        self.run(&plan.resolved()?, Answer::into_verdict).await
    }

    /// The batch engine on this limiter's store and observer, timed from now.
    fn engine(&self) -> Engine<'_, S> {
        Engine {
            store: &*self.store,
            observer: self.observer.as_ref(),
            started: self.observer.as_ref().map(|_| Instant::now()),
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

    /// Declares that `policy` is in use: from now on, a set without it is refused by
    /// [`replace`](Self::replace) and by the hot reload ([`watch`](crate::watch)), which keep
    /// the running set, so a reload can never leave a route checking a policy that is gone.
    ///
    /// Call it once for every policy name your code checks, when you wire the limiter into a
    /// route, a layer or a handler (the tower layer declares its policy when it is built).
    /// Declaring a name twice is the same as once; there is no way to undeclare.
    ///
    /// # Errors
    ///
    /// The active set does not define `policy` (a [`Field::Policy`] error naming it): the
    /// policy is not declared, and the code using it should not start.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use distlimit_memory::MemoryStore;
    /// use distlimit_policy::{Field, Limiter, PolicySet};
    ///
    /// let api = r#"
    ///     [[policy]]
    ///     name = "api"
    ///     tiers = [ { name = "minute", limit = 60, per = "1m" } ]
    /// "#;
    /// let limiter = Limiter::new(Arc::new(MemoryStore::new()), PolicySet::from_toml_str(api)?);
    /// limiter.declare("api")?;
    /// assert_eq!(limiter.declare("search").unwrap_err().field(), Field::Policy);
    ///
    /// // A new version of the file without "api" is refused; "api" keeps working.
    /// let other = PolicySet::from_toml_str(&api.replace("\"api\"", "\"other\""))?;
    /// let refused = limiter.replace(other).unwrap_err();
    /// assert_eq!((refused.field(), refused.policy()), (Field::Policy, Some("api")));
    /// assert!(limiter.policies().get("api").is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn declare(&self, policy: &str) -> Result<(), PolicyConfigError> {
        let mut declared = self.declared.lock().unwrap_or_else(PoisonError::into_inner);
        if self.policies.load().get(policy).is_none() {
            return Err(missing(policy, "not defined in the active set"));
        }
        if !declared.iter().any(|d| **d == *policy) {
            declared.push(policy.into());
        }
        Ok(())
    }

    /// The policies declared with [`declare`](Self::declare), in the order declared.
    pub fn declared(&self) -> Vec<String> {
        let declared = self.declared.lock().unwrap_or_else(PoisonError::into_inner);
        declared.iter().map(|d| d.to_string()).collect()
    }

    /// Makes `set` the active policy set, atomically. Checks already running finish with the
    /// set they started with.
    ///
    /// # Errors
    ///
    /// `set` lacks a policy [`declare`](Self::declare)d in use (a [`Field::Policy`] error
    /// naming the first one missing): nothing changes.
    pub fn replace(&self, set: PolicySet) -> Result<(), PolicyConfigError> {
        self.replace_shared(Arc::new(set))
    }

    /// [`replace`](Self::replace) with a set already shared (for example one kept to switch
    /// back to, or the same set given to several limiters).
    ///
    /// # Errors
    ///
    /// As [`replace`](Self::replace).
    pub fn replace_shared(&self, set: Arc<PolicySet>) -> Result<(), PolicyConfigError> {
        let declared = self.declared.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(name) = declared.iter().find(|d| set.get(d).is_none()) {
            return Err(missing(
                name,
                "declared in use (Limiter::declare) but not defined; the running set is kept",
            ));
        }
        self.policies.store(set);
        Ok(())
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
    ) -> Result<(), PolicyConfigError> {
        let mut result = Ok(());
        self.policies.rcu(|current| {
            let set = current.with_quota(name, limit, window);
            result = set.as_ref().map(|_| ()).map_err(Clone::clone);
            set.map_or_else(|_| Arc::clone(current), Arc::new)
        });
        result
    }
}

impl<S: ?Sized> std::fmt::Debug for Limiter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("policies", &self.policies.load().len())
            .field("observer", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

/// The error of a declared policy missing from a set.
fn missing(policy: &str, message: &str) -> PolicyConfigError {
    PolicyConfigError::new(Field::Policy, message).in_policy(policy)
}

/// What [`Limiter::check_all_now`] answered.
pub enum Checked<V> {
    /// Decided without waiting: the verdicts, or the error.
    Decided(Result<V, CheckError>),
    /// The store must be awaited (nothing was charged): the checks' plan, for
    /// [`Limiter::decide_plan`].
    Pending(Plan),
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
/// It owns what it reports: the tiers' names, quotas and algorithms as the check used them are
/// shared with the policy set it was decided with (one reference count), so a verdict can be
/// kept, cloned and sent anywhere, and outlives its limiter.
#[derive(Clone)]
pub struct Verdict {
    applied: Arc<Applied>,
    outcome: Outcome,
    listed: Option<Listed>,
    decision: Decision,
    /// One decision per tier when there are several; empty for one tier (its decision is
    /// `decision`) and for a listed key.
    decisions: Vec<Decision>,
    /// Decided in shadow mode (the policy's, or the batch item's).
    shadow: bool,
}

impl Verdict {
    /// The verdict of `applied`'s tiers: `decision` combined, `decisions` per tier when there
    /// are several.
    pub(crate) fn new(
        applied: &Arc<Applied>,
        decision: Decision,
        decisions: Vec<Decision>,
        shadow: bool,
    ) -> Self {
        Self {
            applied: Arc::clone(applied),
            outcome: outcome(decision.is_allowed(), shadow),
            listed: None,
            decision,
            decisions,
            shadow,
        }
    }

    /// The verdict of a listed key: no tier asked.
    pub(crate) fn of_listed(applied: &Arc<Applied>, listed: Listed, shadow: bool) -> Self {
        let decision = match listed {
            Listed::Allow => Decision::allowed(u64::MAX, u64::MAX, Duration::ZERO),
            Listed::Deny => never(),
        };
        Self {
            listed: Some(listed),
            ..Self::new(applied, decision, Vec::new(), shadow)
        }
    }

    /// Allowed, denied, or denied in shadow mode (let through and reported).
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// Whether the request may proceed: `false` only for [`Outcome::Denied`]; a shadow denial
    /// passes.
    pub fn is_allowed(&self) -> bool {
        self.outcome != Outcome::Denied
    }

    /// The most restrictive decision over the tiers (see [`Decision::most_restrictive`]); its
    /// [`source`](Decision::source) says which store answered. A listed key's decision is
    /// synthetic: allowed with `limit` = `remaining` = `u64::MAX`, or denied with
    /// `retry_after` = [`NEVER`](distlimit_core::NEVER).
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The policy's name.
    pub fn policy(&self) -> &str {
        &self.applied.policy
    }

    /// Whether the key was on the allow or deny list (then [`tiers`](Self::tiers) is empty).
    pub fn listed(&self) -> Option<Listed> {
        self.listed
    }

    /// Whether the key was held to a per-key override instead of the policy's tiers.
    pub fn is_override(&self) -> bool {
        self.applied.is_override
    }

    /// One verdict per tier the key was checked against, in order (global tiers first for an
    /// override). Empty for a listed key.
    pub fn tiers(&self) -> TierVerdicts<'_> {
        let (tiers, decisions) = match (self.listed, &*self.applied.tiers) {
            (Some(_), _) => (&[][..], &[][..]),
            (None, [one]) => (
                std::slice::from_ref(one),
                std::slice::from_ref(&self.decision),
            ),
            (None, tiers) => (tiers, &self.decisions[..]),
        };
        TierVerdicts {
            tiers,
            decisions,
            shadow: self.shadow,
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
    tiers: &'a [Tier],
    decisions: &'a [Decision],
    shadow: bool,
}

impl<'a> TierVerdicts<'a> {
    /// The number of tiers left.
    pub fn len(&self) -> usize {
        self.tiers.len().min(self.decisions.len())
    }

    /// Whether no tier is left.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `index`-th tier left.
    pub fn get(&self, index: usize) -> Option<TierVerdict<'a>> {
        Some(TierVerdict {
            tier: self.tiers.get(index)?,
            decision: self.decisions.get(index)?,
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
        self.decisions = self.decisions.get(1..).unwrap_or_default();
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
    tier: &'a Tier,
    decision: &'a Decision,
    shadow: bool,
}

impl<'a> TierVerdict<'a> {
    /// The tier's name.
    pub fn name(&self) -> &'a str {
        self.tier.name()
    }

    /// The tier's limit: units admitted per [`period`](Self::period) (see [`Quota::limit`](distlimit_core::Quota::limit)).
    pub fn limit(&self) -> u64 {
        self.tier.quota().limit()
    }

    /// The tier's period (see [`Quota::period`](distlimit_core::Quota::period)).
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.tier.quota().period_us())
    }

    /// The tier's burst: its capacity (see [`Quota::burst`](distlimit_core::Quota::burst)).
    pub fn burst(&self) -> u64 {
        self.tier.quota().burst()
    }

    /// The tier's algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.tier.algorithm()
    }

    /// Per key or global.
    pub fn scope(&self) -> Scope {
        self.tier.scope()
    }

    /// What this tier alone answered. All tiers were charged if and only if every one allowed.
    pub fn decision(&self) -> &'a Decision {
        self.decision
    }

    /// Whether the policy is in shadow mode (a denial here did not block the request).
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }
}
