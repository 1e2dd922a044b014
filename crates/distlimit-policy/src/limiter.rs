//! [`Limiter`]: checks requests against the active [`PolicySet`] on any [`Store`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use distlimit_core::{
    Algorithm, Decision, Key, NEVER, Observer, Outcome, Request, Store, merge_batch,
};

use crate::error::Field;
use crate::policy::{Applied, GLOBAL_KEY, Rule, Tier};
use crate::{CheckError, PolicyConfigError, PolicySet, Scope};

/// Checks requests against named policies on a store; the policies change at runtime without
/// locks.
///
/// The active [`PolicySet`] is published through an [`ArcSwap`]: [`replace`](Self::replace) and
/// [`update_policy`](Self::update_policy) publish a new one atomically, and a check decides
/// with the one set it loaded, the old one or the new one, never a mix.
///
/// Every tier of a policy is one [`Request`] under the store policy `"<policy>/<tier>"`; all
/// tiers of a check go to [`Store::decide_all`] together (all-or-nothing), a single tier to
/// [`Store::decide_now`] (a store that never waits answers there, without a future) or else
/// [`Store::decide`]. A single-tier check allocates nothing beyond what the store itself
/// allocates (on the memory store: nothing); a multi-tier check adds one `Vec` (its batch of
/// requests). Several policies checked on one request are all-or-nothing together through
/// [`check_all`](Limiter::check_all), or [`prepare`](Limiter::prepare) for a batch that holds
/// other requests too.
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

    /// Charges `cost` units to `key` under every tier of `policy`, all-or-nothing.
    ///
    /// Decided without waiting when [`check_now`](Self::check_now) can; otherwise (a multi-tier
    /// batch, a Redis round trip) the check holds the set it loaded until the store answers.
    pub async fn check_cost(
        &self,
        policy: &str,
        key: &[u8],
        cost: u64,
    ) -> Result<Verdict, CheckError> {
        if let Some(result) = self.check_now(policy, key, cost) {
            return result;
        }
        let started = self.observer.as_ref().map(|_| Instant::now());
        let set = self.policies.load_full();
        let result = self.decide(&set, policy, key, cost).await;
        if let Some(started) = started {
            self.observe(policy, &result, started);
        }
        result
    }

    /// Decides a check without waiting, if the store can: charges `cost` units to `key` under
    /// every tier of `policy` and returns the verdict, or returns `None`, having charged nothing,
    /// when the store would have to be awaited (then use [`check_cost`](Self::check_cost)).
    ///
    /// On the memory store a single-tier policy is always decided here; a multi-tier policy,
    /// and a store that talks to a server, return `None`. A listed key, an unknown policy and
    /// an invalid key are answered on any store. The observer sees the check like one made
    /// with [`check_cost`](Self::check_cost).
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
    pub fn check_now(
        &self,
        policy: &str,
        key: &[u8],
        cost: u64,
    ) -> Option<Result<Verdict, CheckError>> {
        let started = self.observer.as_ref().map(|_| Instant::now());
        let result = self.decide_now(policy, key, cost)?;
        if let Some(started) = started {
            self.observe(policy, &result, started);
        }
        Some(result)
    }

    /// [`check_now`](Self::check_now) without the observer.
    fn decide_now(
        &self,
        policy: &str,
        key: &[u8],
        cost: u64,
    ) -> Option<Result<Verdict, CheckError>> {
        let set = self.policies.load();
        let (applied, listed) = match lookup(&set, policy, key) {
            Ok(found) => found,
            Err(e) => return Some(Err(e)),
        };
        if let Some(listed) = listed {
            return Some(Ok(Verdict::of_listed(applied, listed)));
        }
        let [tier] = &*applied.tiers else {
            return None;
        };
        let request = match tier_request(tier, key, cost) {
            Ok(request) => request,
            Err(e) => return Some(Err(e)),
        };
        // `*self.store`: the store itself (`Arc<S>` implements `Store` too, forwarding
        // with a future box of its own).
        Some(match (*self.store).decide_now(&request)? {
            Ok(decision) => Ok(Verdict::new(applied, decision, Vec::new())),
            Err(e) => Err(e.into()),
        })
    }

    /// The decision of a check that must await the store, with `set`.
    async fn decide(
        &self,
        set: &PolicySet,
        policy: &str,
        key: &[u8],
        cost: u64,
    ) -> Result<Verdict, CheckError> {
        let (applied, listed) = lookup(set, policy, key)?;
        if let Some(listed) = listed {
            return Ok(Verdict::of_listed(applied, listed));
        }
        if let [tier] = &*applied.tiers {
            let decision = (*self.store)
                .decide(&tier_request(tier, key, cost)?)
                .await?;
            return Ok(Verdict::new(applied, decision, Vec::new()));
        }
        let requests = applied
            .tiers
            .iter()
            .map(|tier| tier_request(tier, key, cost))
            .collect::<Result<Vec<_>, _>>()?;
        let all = (*self.store).decide_all(&requests).await?;
        let decision = Decision::most_restrictive(&all).unwrap_or_else(deny_listed);
        Ok(Verdict::new(applied, decision, all))
    }

    /// Prepares a check of `cost` units for `key` under `policy`, to be decided in one batch
    /// with other checks (of other policies, or any core [`Request`]s): the building block of
    /// [`check_all`](Self::check_all), for callers that add requests of their own to the batch.
    ///
    /// Charges nothing. Put [`Prepared::requests`] into one [`Store::decide_all`] batch with
    /// the rest, then turn the decisions of those requests (in the same order) into a
    /// [`Verdict`] with [`Prepared::verdict`]. A key on an allow or deny list has no request
    /// (its verdict is known at once: [`Prepared::listed`]). A policy in shadow mode
    /// ([`Prepared::is_shadow`]) belongs in a batch of its own: its denial lets the request
    /// through, so it must not stop the others from being charged.
    ///
    /// The check uses the policy set active now, whatever is published before the batch is
    /// decided; the observer sees it when its verdict is made, timed from here.
    ///
    /// # Errors
    ///
    /// An unknown policy ([`CheckError::UnknownPolicy`]), an invalid key.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use distlimit_core::{Key, Limit, Quota, Request, Store};
    /// use distlimit_memory::MemoryStore;
    /// use distlimit_policy::{Limiter, PolicySet};
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
    /// for expected in [true, false] {
    ///     let prepared = limiter.prepare("per_user", b"alice", 1)?;
    ///     let mut batch: Vec<Request<'_>> = prepared.requests().collect();
    ///     batch.push(Request::new(Key::new("10.0.0.1")?, per_ip).with_policy("per_ip")?);
    ///     let decisions = store.decide_all(&batch).await?;
    ///     let verdict = prepared.verdict(&decisions[..prepared.len()])?;
    ///     assert_eq!(verdict.is_allowed(), expected);
    /// }
    /// // The second batch was denied by "per_user": the IP was charged once, not twice.
    /// let ip = Request::peek(Key::new("10.0.0.1")?, per_ip).with_policy("per_ip")?;
    /// assert_eq!(store.decide(&ip).await?.remaining(), 4);
    /// # Ok(()) }
    /// ```
    pub fn prepare<'k>(
        &self,
        policy: &str,
        key: &'k [u8],
        cost: u64,
    ) -> Result<Prepared<'k>, CheckError> {
        let started = self.observer.as_ref().map(|_| Instant::now());
        let set = self.policies.load();
        let (applied, listed) = lookup(&set, policy, key)?;
        if listed.is_none() {
            // Every request is valid from here on ([`Prepared::requests`] relies on it).
            for tier in &applied.tiers {
                tier_request(tier, key, cost)?;
            }
        }
        Ok(Prepared {
            applied: Arc::clone(applied),
            listed,
            key,
            cost,
            observer: self.observer.clone(),
            started,
        })
    }

    /// Charges several checks all-or-nothing: every `(policy, key, cost)` is charged on every
    /// tier of its policy, or none is. One verdict per check, in order.
    ///
    /// The request is admitted, and was charged, if and only if every verdict
    /// [`is_allowed`](Verdict::is_allowed). A denied check denies them all: the others then
    /// answer what they alone would have been answered (their [`Verdict::is_allowed`] says
    /// `true`), charging nothing. Checks of policies not in shadow mode go to one
    /// [`Store::decide_all`]; the same tier and key named by two checks is one request costing
    /// the sum. A policy in shadow mode is decided afterwards on its own (its tiers all or
    /// nothing), charging nothing when the request was denied; its denial denies nothing. A
    /// key on a deny list denies the request without asking the store for it; on an allow list
    /// it is admitted and charged nothing. The observer sees each check as if made alone.
    ///
    /// # Errors
    ///
    /// An unknown policy or an invalid key (nothing charged); more than
    /// [`MAX_BATCH`](distlimit_core::MAX_BATCH) store requests across the policies not in
    /// shadow mode (a tier and key each); the store's failure.
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
        let mut prepared = checks
            .iter()
            .map(|&(policy, key, cost)| self.prepare(policy, key, cost))
            .collect::<Result<Vec<_>, _>>()?;
        let mut denied = prepared
            .iter()
            .any(|p| !p.is_shadow() && p.listed() == Some(Listed::Deny));
        if denied {
            prepared.iter_mut().for_each(|p| p.set_cost(0));
        }
        let mut verdicts: Vec<Option<Verdict>> = vec![None; prepared.len()];
        // The checks not in shadow mode: one batch.
        let batch: Vec<Request<'_>> = prepared
            .iter()
            .filter(|p| !p.is_shadow())
            .flat_map(Prepared::requests)
            .collect();
        let decisions = if batch.is_empty() {
            Vec::new()
        } else {
            let (merged, slots) = merge_batch(&batch);
            let answered = match (*self.store).decide_all(&merged).await {
                Ok(decisions) => decisions,
                Err(e) => return Err(self.failed(&prepared, e)),
            };
            slots
                .iter()
                .map(|&slot| answered.get(slot).copied())
                .collect::<Option<Vec<_>>>()
                .ok_or(MISMATCH)?
        };
        denied |= decisions.iter().any(Decision::is_denied);
        let mut rest = &decisions[..];
        for (p, verdict) in prepared.iter().zip(&mut verdicts) {
            if !p.is_shadow() {
                let (own, next) = rest.split_at(p.len().min(rest.len()));
                rest = next;
                *verdict = Some(p.verdict(own)?);
            }
        }
        // Shadow mode: each apart, after the rest, charging nothing once the request is denied.
        for (p, verdict) in prepared.iter_mut().zip(&mut verdicts) {
            if !p.is_shadow() {
                continue;
            }
            if denied {
                p.set_cost(0);
            }
            let requests: Vec<Request<'_>> = p.requests().collect();
            let decisions = if requests.is_empty() {
                Vec::new()
            } else {
                match (*self.store).decide_all(&requests).await {
                    Ok(decisions) => decisions,
                    Err(e) => return Err(self.failed(std::slice::from_ref(p), e)),
                }
            };
            *verdict = Some(p.verdict(&decisions)?);
        }
        Ok(verdicts
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or(MISMATCH)?)
    }

    /// Reports a failed batch for each of its checks and returns the error.
    fn failed(&self, prepared: &[Prepared<'_>], error: distlimit_core::Error) -> CheckError {
        let error = CheckError::from(error);
        for p in prepared {
            self.report_error(p.policy(), &error);
        }
        error
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

    /// Reports a store failure that ends a check to the observer, as
    /// [`Observer::on_store_error`] with the store named [`Limiter::STORE_LABEL`]. Unknown
    /// policies and invalid keys are the caller's errors, not the store's: not reported.
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

impl<S: ?Sized> std::fmt::Debug for Limiter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("policies", &self.policies.load().len())
            .field("observer", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

/// Finds `policy` in `set`, validates `key`, and returns the tiers that apply to it, or the
/// list it is on.
fn lookup<'s>(
    set: &'s PolicySet,
    policy: &str,
    key: &[u8],
) -> Result<(&'s Arc<Applied>, Option<Listed>), CheckError> {
    let Some(found) = set.get(policy) else {
        return Err(CheckError::UnknownPolicy(policy.to_owned()));
    };
    Key::new(key).map_err(distlimit_core::Error::from)?;
    let rule = found.rule(key);
    let listed = match rule {
        Some(Rule::Allow) => Some(Listed::Allow),
        Some(Rule::Deny) => Some(Listed::Deny),
        Some(Rule::Override(_)) | None => None,
    };
    Ok((found.applied(rule), listed))
}

/// The error of a declared policy missing from a set.
fn missing(policy: &str, message: &str) -> PolicyConfigError {
    PolicyConfigError::new(Field::Policy, message).in_policy(policy)
}

/// The answer of a key on the deny list: never admitted.
fn deny_listed() -> Decision {
    Decision::denied(0, 0, Duration::ZERO, NEVER)
}

/// The store request of `tier` for `key` (validated by [`lookup`]).
fn tier_request<'a>(tier: &'a Tier, key: &'a [u8], cost: u64) -> Result<Request<'a>, CheckError> {
    let key = match tier.scope() {
        Scope::Key => key,
        Scope::Global => GLOBAL_KEY,
    };
    let key = Key::new(key).map_err(distlimit_core::Error::from)?;
    Ok(Request::new(key, *tier.limit())
        .with_cost(cost)
        .with_policy(tier.store_policy())
        .map_err(distlimit_core::Error::from)?)
}

/// The error of decisions that do not match the requests they answer.
const MISMATCH: distlimit_core::Error =
    distlimit_core::Error::InvalidRequest("the decisions do not match the prepared requests");

/// A check prepared by [`Limiter::prepare`], to be decided in a batch with other requests.
///
/// It holds the tiers that apply to its key (from the policy set active when it was
/// prepared), the key and the cost; [`requests`](Self::requests) are its store requests and
/// [`verdict`](Self::verdict) reads their decisions.
#[derive(Clone)]
pub struct Prepared<'k> {
    applied: Arc<Applied>,
    listed: Option<Listed>,
    key: &'k [u8],
    cost: u64,
    observer: Option<Arc<dyn Observer>>,
    started: Option<Instant>,
}

impl Prepared<'_> {
    /// The store requests of the check, one per tier in order; none for a listed key.
    pub fn requests(&self) -> impl Iterator<Item = Request<'_>> + '_ {
        let tiers = match self.listed {
            Some(_) => &[][..],
            None => &self.applied.tiers[..],
        };
        // `Limiter::prepare` built each of them once: none fails here (and one that did would
        // leave `verdict` a decision short: an error, not a wrong verdict).
        tiers
            .iter()
            .filter_map(|tier| tier_request(tier, self.key, self.cost).ok())
    }

    /// The number of [`requests`](Self::requests): the tiers, or 0 for a listed key.
    pub fn len(&self) -> usize {
        match self.listed {
            Some(_) => 0,
            None => self.applied.tiers.len(),
        }
    }

    /// Whether the check has no store request (a listed key).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The policy's name.
    pub fn policy(&self) -> &str {
        &self.applied.policy
    }

    /// Whether the key is on the allow or deny list: decided without the store (a key on the
    /// deny list denies the whole batch it belongs to).
    pub fn listed(&self) -> Option<Listed> {
        self.listed
    }

    /// Whether the policy (or the key's override) is in shadow mode: its denial lets the
    /// request through, so decide it apart from the checks that enforce.
    pub fn is_shadow(&self) -> bool {
        self.applied.shadow
    }

    /// The units each tier is charged if the batch is admitted.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// Sets the units charged (0: a peek that charges nothing, for a batch known to be denied).
    pub fn set_cost(&mut self, cost: u64) {
        self.cost = cost;
    }

    /// The verdict of the check from the decisions of its [`requests`](Self::requests), in
    /// order (none for a listed key), reported to the limiter's observer as a check. Each
    /// decision is what that request alone was answered; in a denied batch nothing was
    /// charged, whatever this verdict says.
    ///
    /// # Errors
    ///
    /// `decisions` has not one decision per request (an invalid-request store error).
    pub fn verdict(&self, decisions: &[Decision]) -> Result<Verdict, CheckError> {
        if decisions.len() != self.len() {
            return Err(MISMATCH.into());
        }
        let verdict = match (self.listed, decisions) {
            (Some(listed), _) => Verdict::of_listed(&self.applied, listed),
            (None, [one]) => Verdict::new(&self.applied, *one, Vec::new()),
            (None, all) => {
                let decision = Decision::most_restrictive(all).unwrap_or_else(deny_listed);
                Verdict::new(&self.applied, decision, all.to_vec())
            }
        };
        if let (Some(observer), Some(started)) = (&self.observer, self.started) {
            observer.on_decision(
                self.policy(),
                verdict.outcome(),
                verdict.decision(),
                started.elapsed(),
            );
        }
        Ok(verdict)
    }
}

impl std::fmt::Debug for Prepared<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("policy", &self.policy())
            .field("listed", &self.listed)
            .field("shadow", &self.is_shadow())
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
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
}

impl Verdict {
    /// The verdict of `applied`'s tiers: `decision` combined, `decisions` per tier when there
    /// are several.
    fn new(applied: &Arc<Applied>, decision: Decision, decisions: Vec<Decision>) -> Self {
        let outcome = match (decision.is_allowed(), applied.shadow) {
            (true, _) => Outcome::Allowed,
            (false, false) => Outcome::Denied,
            (false, true) => Outcome::ShadowDenied,
        };
        Self {
            applied: Arc::clone(applied),
            outcome,
            listed: None,
            decision,
            decisions,
        }
    }

    /// The verdict of a listed key: no tier asked.
    fn of_listed(applied: &Arc<Applied>, listed: Listed) -> Self {
        let decision = match listed {
            Listed::Allow => Decision::allowed(u64::MAX, u64::MAX, Duration::ZERO),
            Listed::Deny => deny_listed(),
        };
        Self {
            listed: Some(listed),
            ..Self::new(applied, decision, Vec::new())
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
            shadow: self.applied.shadow,
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
