//! [`Limiter`]: checks requests against the active [`PolicySet`] on any [`Store`].

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, Guard};
use distlimit_core::{Algorithm, Decision, Key, NEVER, Observer, Outcome, Quota, Request, Store};

use crate::policy::{GLOBAL_KEY, Policy, Rule, Tier};
use crate::{CheckError, ConfigError, PolicySet, Scope};

/// Checks requests against named policies on a store; the policies change at runtime without
/// locks.
///
/// The active [`PolicySet`] sits behind an [`ArcSwap`]: a check loads it once (no lock, no
/// reference count), decides with that snapshot only, and [`replace`](Self::replace) or
/// [`update_policy`](Self::update_policy) publish a new one atomically. A check therefore sees
/// either the old set or the new one, never a mix.
///
/// Every tier of a policy is one [`Request`] under the store policy `"<policy>/<tier>"`; all
/// tiers of a check go to [`Store::decide_all`] together (all-or-nothing), a single tier to
/// [`Store::decide_now`] (a store that never waits answers there, without a future) or else
/// [`Store::decide`]. A single-tier check allocates nothing beyond what the store itself
/// allocates (on the memory store: nothing); a multi-tier check adds one `Vec` (its batch of
/// requests).
pub struct Limiter<S: ?Sized = dyn Store> {
    policies: ArcSwap<PolicySet>,
    observer: Option<Arc<dyn Observer>>,
    store: Arc<S>,
}

impl<S: Store + ?Sized> Limiter<S> {
    /// A limiter enforcing `policies` on `store`.
    pub fn new(store: Arc<S>, policies: PolicySet) -> Self {
        Self {
            policies: ArcSwap::from_pointee(policies),
            observer: None,
            store,
        }
    }

    /// The same limiter reporting every check to `observer`
    /// ([`Observer::on_decision`] with the policy name, the outcome, the combined decision and
    /// the time the check took).
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
    /// ([`check`](Self::check) and [`peek`](Self::peek) return this very future.) The future
    /// is small (under 350 bytes, cheap to move) because it holds only what a single-tier check
    /// needs inline: the requests of a multi-tier batch, which must live until the store
    /// answers, are collected in a `Vec`, allocated only for a multi-tier check.
    pub async fn check_cost(
        &self,
        policy: &str,
        key: &[u8],
        cost: u64,
    ) -> Result<Verdict, CheckError> {
        let started = self.observer.as_ref().map(|_| Instant::now());
        // The store itself: `Arc<S>` implements `Store` too, with a future box of its own.
        let store: &S = &self.store;
        let snapshot = self.policies.load();
        let Some((index, found)) = snapshot
            .position(policy)
            .and_then(|i| Some((i, snapshot.policy_at(i)?)))
        else {
            return Err(CheckError::UnknownPolicy(policy.to_owned()));
        };
        let key = Key::new(key).map_err(distlimit_core::Error::from)?;
        let rule = found.rule(key.as_bytes());
        let shadow = found.is_shadow();
        let decisions = match rule {
            Some(Rule::Allow) => Decisions::Listed(allow_listed()),
            Some(Rule::Deny) => Decisions::Listed(deny_listed()),
            _ => match found.tiers_for(rule) {
                [tier] => {
                    let request = tier_request(tier, key, cost)?;
                    // A store that never waits (the memory store) answers without a future.
                    let answer = match store.decide_now(&request) {
                        Some(answer) => answer,
                        None => store.decide(&request).await,
                    };
                    Decisions::One(answer?)
                }
                tiers => {
                    let requests = tiers
                        .iter()
                        .map(|tier| tier_request(tier, key, cost))
                        .collect::<Result<Vec<_>, _>>()?;
                    Decisions::Many(store.decide_all(&requests).await?)
                }
            },
        };
        let decision = match &decisions {
            Decisions::Listed(d) | Decisions::One(d) => *d,
            Decisions::Many(all) => Decision::most_restrictive(all).unwrap_or_else(deny_listed),
        };
        let outcome = match (decision.is_allowed(), shadow) {
            (true, _) => Outcome::Allowed,
            (false, false) => Outcome::Denied,
            (false, true) => Outcome::ShadowDenied,
        };
        if let (Some(observer), Some(started)) = (&self.observer, started) {
            observer.on_decision(policy, outcome, &decision, started.elapsed());
        }
        Ok(Verdict {
            snapshot,
            policy: index,
            rule,
            decisions,
            decision,
            outcome,
        })
    }

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
    /// `"<policy>"` for a policy of one tier, or `"<policy>/<tier>"`. A burst equal to the old
    /// limit follows the new limit; any other burst is kept.
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

impl<S: ?Sized> std::fmt::Debug for Limiter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("policies", &self.policies.load().len())
            .field("observer", &self.observer.is_some())
            .finish_non_exhaustive()
    }
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

/// The per-tier decisions of a verdict.
enum Decisions {
    /// A listed key: no tier was asked.
    Listed(Decision),
    /// A policy of one tier.
    One(Decision),
    /// One per tier, as the store answered them.
    Many(Vec<Decision>),
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
/// It holds the policy snapshot it was decided with, so tier names and quotas are those the
/// decision used even if the policies changed since. Keep it for the request, not longer: it
/// holds a (cheap, lock-free) reference that delays freeing an old policy set.
pub struct Verdict {
    snapshot: Guard<Arc<PolicySet>>,
    policy: usize,
    rule: Option<Rule>,
    decisions: Decisions,
    decision: Decision,
    outcome: Outcome,
}

impl Verdict {
    /// Allowed, denied, or denied in shadow mode (let through and reported).
    #[inline]
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// Whether the request may proceed: `false` only for [`Outcome::Denied`]; a shadow denial
    /// passes.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.outcome != Outcome::Denied
    }

    /// The most restrictive decision over the tiers (see [`Decision::most_restrictive`]); its
    /// [`source`](Decision::source) says which store answered. A listed key's decision is
    /// synthetic: allowed with `limit` = `remaining` = `u64::MAX`, or denied with
    /// `retry_after` = [`NEVER`](distlimit_core::NEVER).
    #[inline]
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The policy's name.
    pub fn policy(&self) -> &str {
        self.policy_ref().map_or("", Policy::name)
    }

    /// Whether the key was on the allow or deny list (then [`tiers`](Self::tiers) is empty).
    pub fn listed(&self) -> Option<Listed> {
        match self.rule {
            Some(Rule::Allow) => Some(Listed::Allow),
            Some(Rule::Deny) => Some(Listed::Deny),
            _ => None,
        }
    }

    /// Whether the key was held to a per-key override instead of the policy's tiers.
    pub fn is_override(&self) -> bool {
        matches!(self.rule, Some(Rule::Override(_)))
    }

    /// One verdict per tier the key was checked against, in order (global tiers first for an
    /// override). Empty for a listed key.
    pub fn tiers(&self) -> TierVerdicts<'_> {
        let tiers = self
            .policy_ref()
            .map_or(&[][..], |p| p.tiers_for(self.rule));
        let decisions = match &self.decisions {
            Decisions::Listed(_) => &[][..],
            Decisions::One(d) => std::slice::from_ref(d),
            Decisions::Many(all) => all,
        };
        let n = decisions.len().min(tiers.len());
        TierVerdicts {
            tiers: tiers.get(..n).unwrap_or_default(),
            decisions: decisions.get(..n).unwrap_or_default(),
            shadow: self.policy_ref().is_some_and(Policy::is_shadow),
        }
    }

    fn policy_ref(&self) -> Option<&Policy> {
        self.snapshot.policy_at(self.policy)
    }
}

impl std::fmt::Debug for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verdict")
            .field("policy", &self.policy())
            .field("outcome", &self.outcome)
            .field("decision", &self.decision)
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
            decision: *self.decisions.get(index)?,
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

/// The decision of one tier, with the tier's name and quota (for `RateLimit-Policy` and
/// `RateLimit` headers).
#[derive(Clone, Copy, Debug)]
pub struct TierVerdict<'a> {
    tier: &'a Tier,
    decision: Decision,
    shadow: bool,
}

impl<'a> TierVerdict<'a> {
    /// The tier's name.
    #[inline]
    pub fn name(&self) -> &'a str {
        self.tier.name()
    }

    /// The tier's quota (limit, period, burst).
    #[inline]
    pub fn quota(&self) -> &'a Quota {
        self.tier.quota()
    }

    /// The tier's algorithm.
    #[inline]
    pub fn algorithm(&self) -> Algorithm {
        self.tier.algorithm()
    }

    /// The tier (scope, store policy name).
    #[inline]
    pub fn tier(&self) -> &'a Tier {
        self.tier
    }

    /// What this tier alone answered. All tiers were charged if and only if every one allowed.
    #[inline]
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Whether the policy is in shadow mode (a denial here did not block the request).
    #[inline]
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }
}
