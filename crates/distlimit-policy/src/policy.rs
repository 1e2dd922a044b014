//! The policy model: [`PolicySet`], [`Policy`], [`Tier`], built in code or from TOML and
//! validated once, when built.

use std::collections::HashMap;
use std::time::Duration;

use distlimit_core::{Algorithm, Key, Limit, MAX_POLICY_LEN, Quota, QuotaError};

use crate::ConfigError;
use crate::intern::{Name, intern};

/// The most tiers one request is checked against (global tiers plus per-key tiers, or global
/// tiers plus an override's tiers): all of them go to the store in one all-or-nothing batch.
pub const MAX_TIERS: usize = 8;

/// The longest policy or tier name, in bytes. A tier keeps its state in the store under
/// `"<policy>/<tier>"`, which therefore stays within
/// [`MAX_POLICY_LEN`](distlimit_core::MAX_POLICY_LEN).
pub const MAX_NAME_LEN: usize = 63;

const _: () = assert!(2 * MAX_NAME_LEN < MAX_POLICY_LEN);

/// Up to this many policies, [`PolicySet::position`] scans the names instead of hashing.
const SCAN_MAX: usize = 8;

/// Which key a tier counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Scope {
    /// One state per client key (`10/s per user`).
    #[default]
    Key,
    /// One state for the whole policy, shared by every client (`1000/s for the endpoint`).
    Global,
}

impl Scope {
    /// The name used in configuration: `key` or `global`.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Key => "key",
            Scope::Global => "global",
        }
    }
}

/// The store key every global tier counts under (its store policy name is what separates it
/// from per-key state).
pub(crate) const GLOBAL_KEY: &[u8] = b"*";

/// One limit of a policy: a name, an algorithm with its quota, and a [`Scope`].
///
/// The tier's state lives in the store under the policy name `"<policy>/<tier>"`, which does not
/// depend on the limit: changing the quota keeps the state (see the crate documentation for what
/// each kind of change does to it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tier {
    name: Box<str>,
    limit: Limit,
    scope: Scope,
    /// `"<policy>/<tier>"` once validated, empty before.
    store_policy: Box<str>,
    /// The interned name, once validated.
    static_name: Name,
    /// The algorithm's index in [`Algorithm::ALL`], once validated.
    algorithm_index: u64,
}

impl Tier {
    /// A per-key tier named `name` enforcing `limit`.
    pub fn new(name: impl Into<Box<str>>, limit: Limit) -> Self {
        Self {
            name: name.into(),
            limit,
            scope: Scope::Key,
            store_policy: Box::default(),
            static_name: Name::EMPTY,
            algorithm_index: 0,
        }
    }

    /// The same tier with one state shared by every key.
    #[must_use]
    pub fn global(self) -> Self {
        self.with_scope(Scope::Global)
    }

    /// The same tier with scope `scope`.
    #[must_use]
    pub fn with_scope(self, scope: Scope) -> Self {
        Self { scope, ..self }
    }

    /// The tier's name, unique within its policy (or override).
    #[inline]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The algorithm and quota.
    #[inline]
    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    /// The quota: `limit` per `period`, and the burst.
    #[inline]
    pub fn quota(&self) -> &Quota {
        self.limit.quota()
    }

    /// The algorithm.
    #[inline]
    pub fn algorithm(&self) -> Algorithm {
        self.limit.algorithm()
    }

    /// Per key or global.
    #[inline]
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// The policy name the tier's state has in the store: `"<policy>/<tier>"` once the tier is
    /// part of a built [`PolicySet`], empty before.
    #[inline]
    pub fn store_policy(&self) -> &str {
        &self.store_policy
    }

    /// What a verdict reports of this tier: copied, with the name interned.
    #[inline]
    pub(crate) fn info(&self) -> TierInfo {
        let quota = self.limit.quota();
        let global = match self.scope {
            Scope::Key => 0,
            Scope::Global => TierInfo::GLOBAL,
        };
        TierInfo {
            kind: self.algorithm_index | global,
            name: self.static_name,
            limit: quota.limit(),
            period_us: quota.period_us(),
            burst: quota.burst(),
        }
    }

    fn validate(&mut self, policy: &str) -> Result<(), ConfigError> {
        let located = |e: ConfigError| e.in_tier(&self.name);
        check_name(&self.name).map_err(located)?;
        let window = matches!(
            self.limit.algorithm(),
            Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow
        );
        let quota = self.limit.quota();
        if window && quota.burst() != quota.limit() {
            return Err(located(ConfigError::new(
                "burst",
                format!(
                    "{} has no burst (its capacity is the limit); remove the burst or use \
                     token_bucket or gcra",
                    self.limit.algorithm()
                ),
            )));
        }
        self.store_policy = format!("{policy}/{}", self.name).into();
        self.static_name = intern(&self.name);
        let algorithm = self.limit.algorithm();
        self.algorithm_index = Algorithm::ALL
            .iter()
            .position(|a| *a == algorithm)
            .unwrap_or_default() as u64;
        Ok(())
    }
}

/// A tier as a [`Verdict`](crate::Verdict) reports it: a copy of what it reports (40 bytes,
/// with the name interned), so that the verdict holds no reference to the policy set.
///
/// Only whole words, with the algorithm and the scope packed into one, like
/// [`Decision`](distlimit_core::Decision)'s flags: moves of a verdict then read back what
/// whole-word stores wrote (see there).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TierInfo {
    /// Bits 0 to 7: the algorithm's index in [`Algorithm::ALL`]; bit 8: global scope.
    kind: u64,
    pub(crate) name: Name,
    pub(crate) limit: u64,
    pub(crate) period_us: u64,
    pub(crate) burst: u64,
}

impl TierInfo {
    const GLOBAL: u64 = 1 << 8;

    pub(crate) fn algorithm(&self) -> Algorithm {
        Algorithm::ALL
            .get((self.kind & 0xff) as usize)
            .copied()
            .unwrap_or_default()
    }

    pub(crate) fn scope(&self) -> Scope {
        if self.kind & Self::GLOBAL != 0 {
            Scope::Global
        } else {
            Scope::Key
        }
    }
}

/// Maps a quota error to the configuration field it is about.
pub(crate) fn quota_error(e: QuotaError) -> ConfigError {
    let field = match e {
        QuotaError::ZeroLimit => return ConfigError::new("limit", "must be at least 1"),
        QuotaError::ZeroPeriod => return ConfigError::new("per", "must be at least 1µs"),
        QuotaError::ZeroBurst => return ConfigError::new("burst", "must be at least 1"),
        QuotaError::TooLarge { what: "limit", .. } => "limit",
        QuotaError::TooLarge { what: "burst", .. } => "burst",
        _ => "per",
    };
    let message = e.to_string();
    let message = message.strip_prefix("invalid quota: ").unwrap_or(&message);
    ConfigError::new(field, message)
}

fn check_name(name: &str) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::new("name", "must not be empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(ConfigError::new(
            "name",
            format!("{} bytes, at most {MAX_NAME_LEN}", name.len()),
        ));
    }
    if name.contains('/') {
        return Err(ConfigError::new("name", "must not contain '/'"));
    }
    Ok(())
}

/// A per-key override: the tiers one key (a tenant on another plan) is held to instead of the
/// policy's per-key tiers. The policy's global tiers still apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    key: Box<[u8]>,
    tiers: Vec<Tier>,
}

impl Override {
    /// The key overridden.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// Its per-key tiers.
    pub fn tiers(&self) -> &[Tier] {
        &self.tiers
    }
}

/// What the lists and overrides of a policy say about one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    Allow,
    Deny,
    /// Index into [`Policy::overrides`] and into the compiled tier lists (a `u32`, so that an
    /// `Option<Rule>` is one word in every verdict).
    Override(u32),
}

/// A named set of tiers a request is checked against all-or-nothing, with allow and deny lists,
/// per-key overrides and shadow mode.
///
/// ```
/// use distlimit_core::{Limit, Quota};
/// use distlimit_policy::{Policy, Tier};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let policy = Policy::new("api")
///     .tier(Tier::new("second", Limit::token_bucket(Quota::per_second(10)?)))
///     .tier(Tier::new("day", Limit::fixed_window(Quota::per_day(1000)?)))
///     .tier(Tier::new("endpoint", Limit::gcra(Quota::per_second(1000)?)).global())
///     .allow("health-checker")
///     .deny("abuser")
///     .override_key("tenant-42", [Tier::new("second", Limit::token_bucket(Quota::per_second(100)?))]);
/// assert_eq!(policy.tiers().len(), 3);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    name: Box<str>,
    /// The interned name, once the policy is part of a built set; empty before.
    static_name: Name,
    shadow: bool,
    tiers: Vec<Tier>,
    allow: Vec<Box<[u8]>>,
    deny: Vec<Box<[u8]>>,
    overrides: Vec<Override>,
    /// Built by [`PolicySet`]: allow, deny and override keys.
    rules: HashMap<Box<[u8]>, Rule, foldhash::fast::RandomState>,
    /// Built by [`PolicySet`]: per override, the global tiers followed by the override's tiers.
    override_tiers: Vec<Box<[Tier]>>,
}

impl Policy {
    /// An empty policy named `name`; add at least one tier.
    pub fn new(name: impl Into<Box<str>>) -> Self {
        Self {
            name: name.into(),
            static_name: Name::EMPTY,
            shadow: false,
            tiers: Vec::new(),
            allow: Vec::new(),
            deny: Vec::new(),
            overrides: Vec::new(),
            rules: HashMap::default(),
            override_tiers: Vec::new(),
        }
    }

    /// Adds a tier.
    #[must_use]
    pub fn tier(mut self, tier: Tier) -> Self {
        self.tiers.push(tier);
        self
    }

    /// Shadow mode: requests are decided and charged as usual, and reported, but a denial is
    /// [`Outcome::ShadowDenied`](distlimit_core::Outcome::ShadowDenied) and lets the request
    /// through.
    #[must_use]
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// Admits `key` without asking the store.
    #[must_use]
    pub fn allow(mut self, key: impl AsRef<[u8]>) -> Self {
        self.allow.push(key.as_ref().into());
        self
    }

    /// Denies `key` without asking the store, with `retry_after` =
    /// [`NEVER`](distlimit_core::NEVER) (in shadow mode: reported as a shadow denial and let
    /// through, like any denial).
    #[must_use]
    pub fn deny(mut self, key: impl AsRef<[u8]>) -> Self {
        self.deny.push(key.as_ref().into());
        self
    }

    /// Holds `key` to `tiers` instead of the policy's per-key tiers (global tiers still apply).
    /// A tier named like one of the policy's shares its state, so moving a key to another plan
    /// keeps what it has consumed.
    #[must_use]
    pub fn override_key(
        mut self,
        key: impl AsRef<[u8]>,
        tiers: impl IntoIterator<Item = Tier>,
    ) -> Self {
        self.overrides.push(Override {
            key: key.as_ref().into(),
            tiers: tiers.into_iter().collect(),
        });
        self
    }

    /// The policy's name.
    #[inline]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The interned name (empty before the policy is part of a built set).
    #[inline]
    pub(crate) fn static_name(&self) -> Name {
        self.static_name
    }

    /// Whether the policy is in shadow mode.
    #[inline]
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// The tiers every key is checked against, unless overridden, in declaration order.
    #[inline]
    pub fn tiers(&self) -> &[Tier] {
        &self.tiers
    }

    /// Keys admitted without asking the store.
    pub fn allowed_keys(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        self.allow.iter().map(|k| &**k)
    }

    /// Keys denied without asking the store.
    pub fn denied_keys(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        self.deny.iter().map(|k| &**k)
    }

    /// The per-key overrides.
    pub fn overrides(&self) -> &[Override] {
        &self.overrides
    }

    /// What applies to `key`: a list, an override, or (`None`) the policy's tiers.
    #[inline]
    pub(crate) fn rule(&self, key: &[u8]) -> Option<Rule> {
        if self.rules.is_empty() {
            return None;
        }
        self.rules.get(key).copied()
    }

    /// The tiers a key under `rule` is checked against.
    #[inline]
    pub(crate) fn tiers_for(&self, rule: Option<Rule>) -> &[Tier] {
        match rule {
            Some(Rule::Override(i)) => self.override_tiers.get(i as usize).map_or(&[], |t| t),
            _ => &self.tiers,
        }
    }

    /// Sets the limit and window of tier `tier` (of the policy's own tiers, not the overrides).
    /// A burst equal to the old limit follows the limit; another burst is kept.
    pub(crate) fn set_quota(
        &mut self,
        tier: Option<&str>,
        limit: u64,
        window: Duration,
    ) -> Result<(), ConfigError> {
        let index = match tier {
            Some(name) => self
                .tiers
                .iter()
                .position(|t| &*t.name == name)
                .ok_or_else(|| {
                    ConfigError::new("tiers", format!("no tier named {name:?}"))
                        .in_policy(&self.name)
                })?,
            None if self.tiers.len() == 1 => 0,
            None => {
                return Err(ConfigError::new(
                    "tiers",
                    format!(
                        "{} tiers: name one as \"{}/<tier>\"",
                        self.tiers.len(),
                        self.name
                    ),
                )
                .in_policy(&self.name));
            }
        };
        let policy = &self.name;
        let Some(t) = self.tiers.get_mut(index) else {
            return Ok(());
        };
        let old = t.limit.quota();
        let burst = if old.burst() == old.limit() {
            limit
        } else {
            old.burst()
        };
        let period_us = u64::try_from(window.as_micros()).unwrap_or(u64::MAX);
        let quota = Quota::from_parts(limit, period_us, burst)
            .map_err(|e| quota_error(e).in_tier(&t.name).in_policy(policy))?;
        t.limit = Limit::new(t.limit.algorithm(), quota);
        Ok(())
    }

    /// Validates the policy and builds its lookup tables.
    fn compile(&mut self) -> Result<(), ConfigError> {
        let name = self.name.clone();
        let located = |e: ConfigError| e.in_policy(&name);
        check_name(&self.name).map_err(located)?;
        self.static_name = intern(&self.name);
        if self.tiers.is_empty() {
            return Err(located(ConfigError::new(
                "tiers",
                "at least one tier is needed",
            )));
        }
        validate_tiers(&mut self.tiers, &name).map_err(located)?;

        let globals: Vec<Tier> = self
            .tiers
            .iter()
            .filter(|t| t.scope == Scope::Global)
            .cloned()
            .collect();
        self.rules.clear();
        self.override_tiers.clear();
        for key in &self.allow {
            insert_rule(&mut self.rules, key, Rule::Allow, "allow").map_err(located)?;
        }
        for key in &self.deny {
            insert_rule(&mut self.rules, key, Rule::Deny, "deny").map_err(located)?;
        }
        for (i, o) in self.overrides.iter_mut().enumerate() {
            let in_override = |e: ConfigError| e.in_override(&o.key).in_policy(&name);
            if o.tiers.is_empty() {
                return Err(in_override(ConfigError::new(
                    "tiers",
                    "at least one tier is needed",
                )));
            }
            if let Some(t) = o.tiers.iter().find(|t| t.scope == Scope::Global) {
                return Err(in_override(
                    ConfigError::new(
                        "scope",
                        "an override holds per-key tiers; global tiers belong to the policy",
                    )
                    .in_tier(&t.name),
                ));
            }
            let mut tiers = globals.clone();
            tiers.extend(o.tiers.iter().cloned());
            validate_tiers(&mut tiers, &name).map_err(in_override)?;
            o.tiers = tiers.get(globals.len()..).unwrap_or_default().to_vec();
            self.override_tiers.push(tiers.into());
            let index = u32::try_from(i).map_err(|_| {
                located(ConfigError::new(
                    "overrides",
                    format!("more than {} overrides", u32::MAX),
                ))
            })?;
            insert_rule(&mut self.rules, &o.key, Rule::Override(index), "override")
                .map_err(located)?;
        }
        Ok(())
    }
}

fn validate_tiers(tiers: &mut [Tier], policy: &str) -> Result<(), ConfigError> {
    if tiers.len() > MAX_TIERS {
        return Err(ConfigError::new(
            "tiers",
            format!(
                "{} tiers apply to one request, at most {MAX_TIERS}",
                tiers.len()
            ),
        ));
    }
    for i in 0..tiers.len() {
        let (before, rest) = tiers.split_at_mut(i);
        let Some(tier) = rest.first_mut() else { break };
        tier.validate(policy)?;
        if before.iter().any(|t| t.name == tier.name) {
            return Err(ConfigError::new("name", "two tiers have this name").in_tier(&tier.name));
        }
    }
    Ok(())
}

fn insert_rule(
    rules: &mut HashMap<Box<[u8]>, Rule, foldhash::fast::RandomState>,
    key: &[u8],
    rule: Rule,
    field: &'static str,
) -> Result<(), ConfigError> {
    let shown = String::from_utf8_lossy(key);
    Key::new(key).map_err(|e| {
        let e = e.to_string();
        let why = e.strip_prefix("invalid key: ").unwrap_or(&e);
        ConfigError::new(field, format!("invalid key {shown:?}: {why}"))
    })?;
    if let Some(previous) = rules.insert(key.into(), rule) {
        let previous = match previous {
            Rule::Allow => "allow",
            Rule::Deny => "deny",
            Rule::Override(_) => "override",
        };
        return Err(ConfigError::new(
            field,
            format!("key {shown:?} is already listed in {previous}"),
        ));
    }
    Ok(())
}

/// The policies a [`Limiter`](crate::Limiter) enforces, by name: an immutable, validated
/// snapshot. The limiter swaps whole sets atomically; a decision sees one set from start to end.
///
/// ```
/// use distlimit_core::{Limit, Quota};
/// use distlimit_policy::{Policy, PolicySet, Tier};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let set = PolicySet::builder()
///     .policy(Policy::new("api").tier(Tier::new("minute", Limit::gcra(Quota::per_minute(60)?))))
///     .build()?;
/// assert_eq!(set.get("api").map(|p| p.tiers().len()), Some(1));
/// let again = PolicySet::from_toml_str(&set.to_toml_string())?;
/// assert_eq!(again, set);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicySet {
    policies: Vec<Policy>,
    index: HashMap<Box<str>, usize, foldhash::fast::RandomState>,
}

impl PolicySet {
    /// A builder: add policies, then [`build`](PolicySetBuilder::build) validates them.
    pub fn builder() -> PolicySetBuilder {
        PolicySetBuilder::default()
    }

    /// Validates `policies` and builds the set.
    pub fn new(policies: impl IntoIterator<Item = Policy>) -> Result<Self, ConfigError> {
        let mut policies: Vec<Policy> = policies.into_iter().collect();
        let mut index = HashMap::default();
        for (i, policy) in policies.iter_mut().enumerate() {
            policy.compile()?;
            if index.insert(policy.name.clone(), i).is_some() {
                return Err(
                    ConfigError::new("name", "two policies have this name").in_policy(&policy.name)
                );
            }
        }
        Ok(Self { policies, index })
    }

    /// The policy named `name`.
    #[inline]
    pub fn get(&self, name: &str) -> Option<&Policy> {
        self.policies.get(*self.index.get(name)?)
    }

    /// The index of policy `name`, for [`policy_at`](Self::policy_at). A set of at most
    /// `SCAN_MAX` policies is scanned (comparing lengths first, then a few words, without a
    /// call to `memcmp`), which is cheaper than hashing the name; a larger one is looked up in
    /// the hash index.
    #[inline]
    pub(crate) fn position(&self, name: &str) -> Option<usize> {
        if self.policies.len() <= SCAN_MAX {
            return self
                .policies
                .iter()
                .position(|p| p.name.as_bytes() == name.as_bytes());
        }
        self.index.get(name).copied()
    }

    #[inline]
    pub(crate) fn policy_at(&self, index: usize) -> Option<&Policy> {
        self.policies.get(index)
    }

    /// Every policy, in declaration order.
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// The number of policies.
    pub fn len(&self) -> usize {
        self.policies.len()
    }

    /// Whether the set has no policy.
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    /// The same set with the limit and window of one tier replaced (its algorithm and name
    /// unchanged). `name` is `"<policy>"` for a policy of one tier, or `"<policy>/<tier>"`.
    pub(crate) fn with_quota(
        &self,
        name: &str,
        limit: u64,
        window: Duration,
    ) -> Result<Self, ConfigError> {
        let (policy, tier) = match name.split_once('/') {
            Some((policy, tier)) => (policy, Some(tier)),
            None => (name, None),
        };
        let mut policies = self.policies.clone();
        let target = policies
            .iter_mut()
            .find(|p| &*p.name == policy)
            .ok_or_else(|| ConfigError::new("name", "no such policy").in_policy(policy))?;
        target.set_quota(tier, limit, window)?;
        Self::new(policies)
    }
}

/// Builds a [`PolicySet`]; see [`PolicySet::builder`].
#[derive(Clone, Debug, Default)]
pub struct PolicySetBuilder {
    policies: Vec<Policy>,
}

impl PolicySetBuilder {
    /// Adds a policy.
    #[must_use]
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }

    /// Validates the policies and builds the set.
    pub fn build(self) -> Result<PolicySet, ConfigError> {
        PolicySet::new(self.policies)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn tb(limit: u64) -> Limit {
        Limit::token_bucket(Quota::per_second(limit).unwrap())
    }

    #[test]
    fn overrides_keep_the_global_tiers_and_name_state_by_policy_and_tier() {
        let set = PolicySet::builder()
            .policy(
                Policy::new("api")
                    .tier(Tier::new("all", tb(1000)).global())
                    .tier(Tier::new("user", tb(10)))
                    .override_key("t", [Tier::new("user", tb(100))]),
            )
            .build()
            .unwrap();
        let policy = set.get("api").unwrap();
        let rule = policy.rule(b"t");
        assert_eq!(rule, Some(Rule::Override(0)));
        let tiers = policy.tiers_for(rule);
        assert_eq!(tiers.len(), 2);
        assert_eq!(tiers[0].store_policy(), "api/all");
        assert_eq!(tiers[1].store_policy(), "api/user");
        assert_eq!(tiers[1].quota().limit(), 100);
        assert_eq!(policy.rule(b"other"), None);
    }

    #[test]
    fn update_names_the_tier_of_a_multi_tier_policy() {
        let set = PolicySet::builder()
            .policy(
                Policy::new("api")
                    .tier(Tier::new("a", tb(1)))
                    .tier(Tier::new("b", tb(2))),
            )
            .build()
            .unwrap();
        let s = Duration::from_secs(1);
        let e = set.with_quota("api", 5, s).unwrap_err();
        assert_eq!((e.policy(), e.field()), (Some("api"), "tiers"));
        let e = set.with_quota("api/c", 5, s).unwrap_err();
        assert_eq!(e.field(), "tiers");
        let e = set.with_quota("api/b", 0, s).unwrap_err();
        assert_eq!((e.tier(), e.field()), (Some("b"), "limit"));
        let updated = set.with_quota("api/b", 5, s).unwrap();
        assert_eq!(updated.get("api").unwrap().tiers()[1].quota().limit(), 5);
        assert_eq!(set.get("api").unwrap().tiers()[1].quota().limit(), 2);
    }
}
