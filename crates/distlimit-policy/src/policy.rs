//! The policy model: [`PolicySet`], [`Policy`], [`Tier`], built in code or from TOML and
//! validated once, when built.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use distlimit_core::{
    Algorithm, Decision, Key, KeyError, Limit, MAX_POLICY_LEN, Observer, Outcome, PolicyObserver,
    Quota, QuotaError, StateName,
};
use ipnet::IpNet;

use crate::error::{Field, shown_key};
use crate::{Cidr, CidrError, PolicyConfigError};

/// The most tiers one request is checked against (global tiers plus per-key tiers, or global
/// tiers plus an override's tiers): all of them go to the store in one all-or-nothing batch.
pub const MAX_TIERS: usize = 8;

/// The longest policy or tier name, in bytes. A tier keeps its state in the store under
/// `"<policy>/<tier>"`, which therefore stays within
/// [`MAX_POLICY_LEN`](distlimit_core::MAX_POLICY_LEN).
pub const MAX_NAME_LEN: usize = 63;

const _: () = assert!(2 * MAX_NAME_LEN < MAX_POLICY_LEN);

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
    /// `"<policy>/<tier>"` once validated, `None` before.
    state: Option<StateName>,
}

impl Tier {
    /// A per-key tier named `name` enforcing `limit`.
    pub fn new(name: impl Into<Box<str>>, limit: Limit) -> Self {
        Self {
            name: name.into(),
            limit,
            scope: Scope::Key,
            state: None,
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
        self.state.as_ref().map_or("", StateName::as_str)
    }

    /// The tier's state name in the store (policy and tier, typed), once the tier is part of a
    /// built [`PolicySet`].
    #[inline]
    pub fn state(&self) -> Option<&StateName> {
        self.state.as_ref()
    }

    fn validate(&mut self, policy: &str) -> Result<(), PolicyConfigError> {
        let located = |e: PolicyConfigError| e.in_tier(&self.name);
        check_name(&self.name).map_err(located)?;
        let window = matches!(
            self.limit.algorithm(),
            Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow
        );
        let quota = self.limit.quota();
        if window && quota.burst() != quota.limit() {
            return Err(located(PolicyConfigError::new(
                Field::Burst,
                format!(
                    "{} has no burst (its capacity is the limit); remove the burst or use \
                     token_bucket or gcra",
                    self.limit.algorithm()
                ),
            )));
        }
        self.state = Some(
            StateName::of_tier(policy, &self.name)
                .map_err(|e| located(PolicyConfigError::new(Field::Name, e.to_string())))?,
        );
        Ok(())
    }
}

/// Maps a quota error to the configuration field it is about.
pub(crate) fn quota_error(e: QuotaError) -> PolicyConfigError {
    let (field, message) = match e {
        QuotaError::ZeroLimit => (Field::Limit, "must be at least 1".to_owned()),
        QuotaError::ZeroPeriod => (Field::Per, "must be at least 1µs".to_owned()),
        QuotaError::ZeroBurst => (Field::Burst, "must be at least 1".to_owned()),
        QuotaError::TooLarge {
            what: "limit",
            value,
            max,
        } => (
            Field::Limit,
            format!("{value} exceeds {max}, the largest limit computed exactly"),
        ),
        QuotaError::TooLarge {
            what: "burst",
            value,
            max,
        } => (
            Field::Burst,
            format!(
                "{value} exceeds {max}, the largest burst this limit and period allow; use a \
                 smaller burst, or a limit that shares more factors with the period"
            ),
        ),
        QuotaError::TooLarge { value, max, .. } => (
            Field::Per,
            format!("{value} µs exceeds {max} µs, the longest period computed exactly"),
        ),
        _ => (Field::Limit, "out of range".to_owned()),
    };
    PolicyConfigError::new(field, message)
}

fn check_name(name: &str) -> Result<(), PolicyConfigError> {
    if name.is_empty() {
        return Err(PolicyConfigError::new(Field::Name, "must not be empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(PolicyConfigError::new(
            Field::Name,
            format!("{} bytes, at most {MAX_NAME_LEN}", name.len()),
        ));
    }
    if name.contains('/') {
        return Err(PolicyConfigError::new(Field::Name, "must not contain '/'"));
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
    /// Index into [`Policy::overrides`].
    Override(usize),
}

/// The tiers a check applies to a key, with what its verdict reports of the policy: a policy's
/// own tiers, or an override's (the policy's global tiers first). Built with the set and shared
/// by every [`Verdict`](crate::Verdict) decided with it, so a verdict holds no copy of them.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Applied {
    pub(crate) policy: Box<str>,
    pub(crate) shadow: bool,
    pub(crate) is_override: bool,
    pub(crate) tiers: Box<[Tier]>,
    /// Where its decisions are reported, resolved on the first report.
    pub(crate) observed: Observed,
}

/// The observer a policy's decisions were first reported to, with its handle for the policy
/// ([`Observer::policy_observer`]), resolved once per policy set: later reports to the same
/// observer go straight to the handle, without looking the name up. Not part of a policy's
/// value (equal whatever it holds).
#[derive(Default)]
pub(crate) struct Observed(OnceLock<Resolved>);

/// An observer, and its handle for one policy (`None`: reported by name).
type Resolved = (Arc<dyn Observer>, Option<Arc<dyn PolicyObserver>>);

impl Observed {
    /// Reports a decision of `policy` to `observer`, through the handle resolved for it.
    #[inline]
    pub(crate) fn report(
        &self,
        observer: &Arc<dyn Observer>,
        policy: &str,
        outcome: Outcome,
        decision: &Decision,
        latency: Duration,
    ) {
        let (first, handle) = self
            .0
            .get_or_init(|| (observer.clone(), observer.policy_observer(policy)));
        match handle {
            Some(handle) if Arc::ptr_eq(first, observer) => {
                handle.on_decision(outcome, decision, latency);
            }
            // Another observer (a set shared by limiters), or one without handles.
            _ => observer.on_decision(policy, outcome, decision, latency),
        }
    }
}

impl PartialEq for Observed {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Observed {}

impl fmt::Debug for Observed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Observed")
    }
}

/// What a response metered under a policy as it streams does when the budget runs out
/// (`overrun = "stop" | "debt"` in the TOML form).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Overrun {
    /// The stream ends with a final frame; nothing past the budget is sent.
    Stop,
    /// The stream runs on; what it sends past the budget is charged as debt.
    Debt,
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
    shadow: bool,
    /// The concurrency limit, for layers that hold the policy's keys to requests in flight.
    in_flight: Option<distlimit_core::PermitLimit>,
    /// What a stream metered under the policy does at its budget, when the policy says.
    overrun: Option<Overrun>,
    tiers: Vec<Tier>,
    allow: Vec<Box<[u8]>>,
    deny: Vec<Box<[u8]>>,
    overrides: Vec<Override>,
    /// Built by [`PolicySet`]: allow, deny and override keys.
    rules: Rules,
    /// Built by [`PolicySet`]: the policy's tiers as checks apply them.
    applied: Arc<Applied>,
    /// Built by [`PolicySet`]: per override, the global tiers followed by the override's tiers.
    override_applied: Vec<Arc<Applied>>,
}

impl Policy {
    /// An empty policy named `name`; add at least one tier.
    pub fn new(name: impl Into<Box<str>>) -> Self {
        Self {
            name: name.into(),
            shadow: false,
            in_flight: None,
            overrun: None,
            tiers: Vec::new(),
            allow: Vec::new(),
            deny: Vec::new(),
            overrides: Vec::new(),
            rules: Rules::default(),
            applied: Arc::default(),
            override_applied: Vec::new(),
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

    /// Admits `key` without asking the store. An IP address or a CIDR network
    /// (`"10.0.0.0/8"`, `"2001:db8::/32"`) admits every key that is an address or network it
    /// contains (the keys the tower layer builds: `203.0.113.7`, `2001:db8:1:2::/64`);
    /// IPv4-mapped IPv6 counts as IPv4. An exact key (or override) comes first, then the most
    /// specific network on either list.
    #[must_use]
    pub fn allow(mut self, key: impl AsRef<[u8]>) -> Self {
        self.allow.push(key.as_ref().into());
        self
    }

    /// Denies `key` (an exact key, an IP address or a CIDR network, as for
    /// [`allow`](Self::allow)) without asking the store, with `retry_after` =
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

    /// Whether the policy is in shadow mode.
    #[inline]
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// The same policy with a concurrency limit: at most `limit.max_in_flight()` requests of
    /// one key in flight. The limiter does not enforce it (a rate decision has no end); a
    /// layer that holds permits (`distlimit-tower`'s `InFlightLayer`) reads it with
    /// [`max_in_flight`](Self::max_in_flight).
    pub fn with_max_in_flight(mut self, limit: distlimit_core::PermitLimit) -> Self {
        self.in_flight = Some(limit);
        self
    }

    /// The concurrency limit, if the policy has one.
    #[inline]
    pub fn max_in_flight(&self) -> Option<distlimit_core::PermitLimit> {
        self.in_flight
    }

    /// The same policy saying what a response metered under it as it streams does at the
    /// budget (`distlimit-tower`'s streaming settlement reads it with
    /// [`overrun`](Self::overrun)); the limiter itself does not use it.
    pub fn with_overrun(mut self, overrun: Overrun) -> Self {
        self.overrun = Some(overrun);
        self
    }

    /// What a stream at the budget does, if the policy says.
    #[inline]
    pub fn overrun(&self) -> Option<Overrun> {
        self.overrun
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

    /// The tiers a check of `key` applies (an override's: the policy's global tiers, then the
    /// override's), or the list `key` is on, as in a built [`PolicySet`].
    pub fn tiers_for(&self, key: &[u8]) -> Result<&[Tier], crate::Listed> {
        match self.rule(key) {
            Some(Rule::Allow) => Err(crate::Listed::Allow),
            Some(Rule::Deny) => Err(crate::Listed::Deny),
            rule => Ok(&self.applied(rule).tiers),
        }
    }

    /// What applies to `key`: a list, an override, or (`None`) the policy's tiers.
    pub(crate) fn rule(&self, key: &[u8]) -> Option<Rule> {
        self.rules.find(key)
    }

    /// The tiers a key under `rule` is checked against (a listed key: the policy's own).
    pub(crate) fn applied(&self, rule: Option<Rule>) -> &Arc<Applied> {
        match rule {
            Some(Rule::Override(i)) => self.override_applied.get(i).unwrap_or(&self.applied),
            _ => &self.applied,
        }
    }

    /// Sets the limit and window of tier `tier` (of the policy's own tiers, not the overrides).
    /// A burst equal to the old limit follows the limit; another burst is kept.
    pub(crate) fn set_quota(
        &mut self,
        tier: Option<&str>,
        limit: u64,
        window: Duration,
    ) -> Result<(), PolicyConfigError> {
        let count = self.tiers.len();
        let t = match tier {
            Some(name) => self
                .tiers
                .iter_mut()
                .find(|t| &*t.name == name)
                .ok_or_else(|| {
                    PolicyConfigError::new(Field::Tiers, format!("no tier named {name:?}"))
                        .in_policy(&self.name)
                })?,
            None => match self.tiers.first_mut() {
                Some(t) if count == 1 => t,
                _ => {
                    let message = format!("{count} tiers: name one as \"{}/<tier>\"", self.name);
                    return Err(PolicyConfigError::new(Field::Tiers, message).in_policy(&self.name));
                }
            },
        };
        let policy = &self.name;
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
    fn compile(&mut self) -> Result<(), PolicyConfigError> {
        let name = self.name.clone();
        let located = |e: PolicyConfigError| e.in_policy(&name);
        check_name(&self.name).map_err(located)?;
        if self.tiers.is_empty() {
            return Err(located(PolicyConfigError::new(
                Field::Tiers,
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
        self.rules = Rules::default();
        self.override_applied.clear();
        let applied = |is_override, tiers: Vec<Tier>| {
            Arc::new(Applied {
                policy: name.clone(),
                shadow: self.shadow,
                is_override,
                tiers: tiers.into(),
                observed: Observed::default(),
            })
        };
        self.applied = applied(false, self.tiers.clone());
        let allow = self
            .allow
            .iter()
            .map(|key| (key, Rule::Allow, Field::Allow));
        let deny = self.deny.iter().map(|key| (key, Rule::Deny, Field::Deny));
        for (key, rule, field) in allow.chain(deny) {
            self.rules.list(key, rule, field).map_err(located)?;
        }
        for (i, o) in self.overrides.iter_mut().enumerate() {
            let in_override = |e: PolicyConfigError| e.in_override(&o.key).in_policy(&name);
            if o.tiers.is_empty() {
                return Err(in_override(PolicyConfigError::new(
                    Field::Tiers,
                    "at least one tier is needed",
                )));
            }
            if let Some(t) = o.tiers.iter().find(|t| t.scope == Scope::Global) {
                return Err(in_override(
                    PolicyConfigError::new(
                        Field::Scope,
                        "an override holds per-key tiers; global tiers belong to the policy",
                    )
                    .in_tier(&t.name),
                ));
            }
            let mut tiers = globals.clone();
            tiers.extend(o.tiers.iter().cloned());
            validate_tiers(&mut tiers, &name).map_err(in_override)?;
            o.tiers = tiers.get(globals.len()..).unwrap_or_default().to_vec();
            self.override_applied.push(applied(true, tiers));
            self.rules
                .exact(&o.key, Rule::Override(i), Field::Override)
                .map_err(located)?;
        }
        Ok(())
    }
}

fn validate_tiers(tiers: &mut [Tier], policy: &str) -> Result<(), PolicyConfigError> {
    if tiers.len() > MAX_TIERS {
        return Err(PolicyConfigError::new(
            Field::Tiers,
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
            return Err(
                PolicyConfigError::new(Field::Name, "two tiers have this name").in_tier(&tier.name),
            );
        }
    }
    Ok(())
}

/// What the lists and overrides of a policy say about keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Rules {
    /// Exact keys: overrides, and list entries that are not IP addresses or networks.
    exact: HashMap<Box<[u8]>, Rule, foldhash::fast::RandomState>,
    /// List entries that are IP addresses or networks (IPv4-mapped IPv6 as IPv4), the longest
    /// prefix first: the most specific match wins.
    networks: Vec<(IpNet, Rule)>,
}

impl Rules {
    /// The rule for `key`: an exact entry first, then the most specific network holding the
    /// key, if the key is an IP address or network (`203.0.113.7`, `2001:db8:1:2::/64`).
    fn find(&self, key: &[u8]) -> Option<Rule> {
        if let Some(rule) = self.exact.get(key) {
            return Some(*rule);
        }
        if self.networks.is_empty() {
            return None;
        }
        let key = ip_network(key)?;
        let (_, rule) = self.networks.iter().find(|(net, _)| net.contains(&key))?;
        Some(*rule)
    }

    /// Adds a list entry: a network if it is an IP address or CIDR, else an exact key.
    fn list(&mut self, entry: &[u8], rule: Rule, field: Field) -> Result<(), PolicyConfigError> {
        let Some(net) = list_network(entry).map_err(|why| {
            PolicyConfigError::new(field, format!("invalid CIDR {:?}: {why}", shown_key(entry)))
        })?
        else {
            return self.exact(entry, rule, field);
        };
        if let Some((_, previous)) = self.networks.iter().find(|(n, _)| *n == net) {
            return Err(listed_twice(entry, *previous, field));
        }
        let at = self
            .networks
            .partition_point(|(n, _)| n.prefix_len() >= net.prefix_len());
        self.networks.insert(at, (net, rule));
        Ok(())
    }

    /// Adds an exact key.
    fn exact(&mut self, key: &[u8], rule: Rule, field: Field) -> Result<(), PolicyConfigError> {
        Key::new(key).map_err(|e| {
            let why = match e {
                KeyError::Empty => "empty".to_owned(),
                KeyError::TooLong { len, max } => format!("{len} bytes, at most {max}"),
                _ => "not a valid key".to_owned(),
            };
            PolicyConfigError::new(field, format!("invalid key {:?}: {why}", shown_key(key)))
        })?;
        if let Some(previous) = self.exact.insert(key.into(), rule) {
            return Err(listed_twice(key, previous, field));
        }
        Ok(())
    }
}

fn listed_twice(key: &[u8], previous: Rule, field: Field) -> PolicyConfigError {
    let previous = match previous {
        Rule::Allow => "allow",
        Rule::Deny => "deny",
        Rule::Override(_) => "override",
    };
    PolicyConfigError::new(
        field,
        format!("key {:?} is already listed in {previous}", shown_key(key)),
    )
}

/// A list entry as a network: `Ok(None)` for an exact key, an error for an entry written as a
/// CIDR (an address of hex digits, dots and colons, `/`, digits) that is not a valid one.
fn list_network(entry: &[u8]) -> Result<Option<IpNet>, &'static str> {
    let Ok(text) = std::str::from_utf8(entry) else {
        return Ok(None);
    };
    let looks_like_cidr = |(addr, prefix): (&str, &str)| {
        addr.contains(['.', ':'])
            && addr
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b'.' || b == b':')
            && !prefix.is_empty()
            && prefix.bytes().all(|b| b.is_ascii_digit())
    };
    match text.parse::<Cidr>() {
        Ok(net) => Ok(Some(net.into())),
        Err(_) if !text.rsplit_once('/').is_some_and(looks_like_cidr) => Ok(None),
        Err(CidrError::Address(_)) => Err("not an IP address"),
        Err(_) => Err("the prefix length is at most 32 for IPv4 and 128 for IPv6"),
    }
}

/// A key as a network, if it is an IP address (a network of one) or a CIDR network, parsed as
/// the tower layer writes client keys ([`Cidr`]).
fn ip_network(key: &[u8]) -> Option<IpNet> {
    let net: Cidr = std::str::from_utf8(key).ok()?.parse().ok()?;
    Some(net.into())
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
    pub fn new(policies: impl IntoIterator<Item = Policy>) -> Result<Self, PolicyConfigError> {
        let mut policies: Vec<Policy> = policies.into_iter().collect();
        let mut index = HashMap::default();
        for (i, policy) in policies.iter_mut().enumerate() {
            policy.compile()?;
            if index.insert(policy.name.clone(), i).is_some() {
                return Err(
                    PolicyConfigError::new(Field::Name, "two policies have this name")
                        .in_policy(&policy.name),
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

    /// The concurrency limit of policy `name` (its `max_in_flight` and `in_flight_lease`), for
    /// a layer or an endpoint that holds permits by policy name.
    ///
    /// ```
    /// use distlimit_policy::{Field, PolicySet};
    ///
    /// let set = PolicySet::from_toml_str(r#"
    /// [[policy]]
    /// name = "generate"
    /// max_in_flight = 2
    /// tiers = [{ name = "t", limit = 1, per = "1s" }]
    /// "#)?;
    /// assert_eq!(set.in_flight("generate")?.max_in_flight(), 2);
    /// assert_eq!(set.in_flight("other").unwrap_err().field(), Field::Name);
    /// # Ok::<(), distlimit_policy::PolicyConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// No policy `name` ([`Field::Name`](crate::Field::Name)), or a policy without
    /// `max_in_flight` ([`Field::MaxInFlight`](crate::Field::MaxInFlight)); both name the
    /// policy.
    pub fn in_flight(&self, name: &str) -> Result<distlimit_core::PermitLimit, PolicyConfigError> {
        let policy = self
            .get(name)
            .ok_or_else(|| PolicyConfigError::new(Field::Name, "no such policy").in_policy(name))?;
        policy.max_in_flight().ok_or_else(|| {
            PolicyConfigError::new(Field::MaxInFlight, "the policy has no max_in_flight")
                .in_policy(name)
        })
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
    ) -> Result<Self, PolicyConfigError> {
        let (policy, tier) = name
            .split_once('/')
            .map_or((name, None), |(p, t)| (p, Some(t)));
        let mut policies = self.policies.clone();
        let target = policies
            .iter_mut()
            .find(|p| &*p.name == policy)
            .ok_or_else(|| {
                PolicyConfigError::new(Field::Name, "no such policy").in_policy(policy)
            })?;
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
    pub fn build(self) -> Result<PolicySet, PolicyConfigError> {
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
        let tiers = &policy.applied(rule).tiers;
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
        assert_eq!((e.policy(), e.field()), (Some("api"), Field::Tiers));
        let e = set.with_quota("api/c", 5, s).unwrap_err();
        assert_eq!(e.field(), Field::Tiers);
        let e = set.with_quota("api/b", 0, s).unwrap_err();
        assert_eq!((e.tier(), e.field()), (Some("b"), Field::Limit));
        let updated = set.with_quota("api/b", 5, s).unwrap();
        assert_eq!(updated.get("api").unwrap().tiers()[1].quota().limit(), 5);
        assert_eq!(set.get("api").unwrap().tiers()[1].quota().limit(), 2);
    }
}
