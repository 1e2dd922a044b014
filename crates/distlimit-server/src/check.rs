//! The decision, independent of the protocol: [`Checker::check`] answers a [`CheckRequest`]
//! with one [`DescriptorStatus`] per descriptor.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use distlimit_core::observe::{Observer, Outcome};
use distlimit_core::{
    Decision, Error, Key, Limit, MAX_KEY_LEN, MAX_POLICY_LEN, Quota, Request, SettleKind,
    StateName, Store,
};
use distlimit_metrics::Metrics;
use distlimit_policy::{Answer, Item, Limiter, PolicySet, Verdict};
use distlimit_tower::headers::{push_ratelimit_item, push_ratelimit_policy_item};
use sha2::{Digest, Sha256};

use crate::config::{Config, Metadata, Rule, RuleLimit, Unit};
use crate::metrics::{DomainRequests, Protocol, RequestMetrics, RequestResult};

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 64;

/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 32;

/// The longest domain, in bytes. Entry keys and values have no limit: a client's value of any
/// length is decided, its state keyed by a SHA-256 digest once the values of a descriptor pass
/// [`MAX_KEY_LEN`] bytes (the rule's name, its keys, past 128).
pub const MAX_ENTRY_LEN: usize = 4096;

/// One descriptor of a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor<'a> {
    /// Its entries: (key, value) in order.
    pub entries: Vec<(&'a str, &'a str)>,
    /// A limit that replaces the configured one (Envoy's `limit` override).
    pub limit: Option<LimitOverride>,
    /// Units this descriptor spends; `None`: the request's. Zero checks without spending.
    pub hits: Option<u64>,
    /// Whether the descriptor reports usage after the response (charged even past the limit)
    /// or gives units back, instead of being decided (`None`; see [`Checker::check`],
    /// "Reports").
    pub settle: Option<SettleKind>,
}

/// The descriptor entry key that marks a descriptor as a report (usage after the response):
/// the entry is removed before matching. Envoy sends it from a `generic_key` action on the
/// rate limit with `apply_on_stream_done` (see the crate documentation).
pub const REPORT_ENTRY: &str = "distlimit.report";

/// Envoy's per-descriptor limit override.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitOverride {
    /// Requests per window.
    pub requests_per_unit: u32,
    /// The window.
    pub unit: Unit,
}

/// A request: descriptors of a domain, each decided against the configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckRequest<'a> {
    /// The configuration's domain.
    pub domain: &'a str,
    /// The descriptors.
    pub descriptors: Vec<Descriptor<'a>>,
    /// Units each descriptor spends unless it says otherwise (0 is read as 1, as Envoy means it).
    pub hits: u64,
}

/// The answer for one descriptor (the default: unmatched).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DescriptorStatus {
    /// Over its limit (never for a rule in shadow mode).
    pub over_limit: bool,
    /// The rule applied; `None` when the descriptor matched no limit (or its rule was replaced).
    pub current_limit: Option<CurrentLimit>,
    /// Requests left in the current window (`u32::MAX` when unlimited, 0 when unmatched).
    pub limit_remaining: u32,
    /// Time until the current window ends (`None` when not limited).
    pub duration_until_reset: Option<Duration>,
    /// A rule in shadow mode would have denied this descriptor.
    pub shadow_denied: bool,
}

/// The limit a descriptor was held to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurrentLimit {
    /// The rule's `name`, or its path below the domain; `<policy>/<tier>` for a TOML policy.
    pub name: String,
    /// Requests per window.
    pub requests_per_unit: u32,
    /// The window as an RLS unit; `None` for a policy tier whose period is no whole unit
    /// (`10s`), answered as `UNKNOWN` over gRPC.
    pub unit: Option<Unit>,
    /// The window.
    pub window: Duration,
    /// The YAML rule's `metadata` (none for an override or a TOML policy), for the response's
    /// dynamic metadata (see [`crate::answer`]).
    pub metadata: Option<Arc<Metadata>>,
}

/// The answer to a [`CheckRequest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckResponse {
    /// Deny the request: a descriptor outside quota mode is over its limit, or every one in
    /// quota mode is (never with the global shadow mode; see [`Checker::check`]).
    pub over_limit: bool,
    /// One status per descriptor, in the request's order.
    pub statuses: Vec<DescriptorStatus>,
}

impl CheckResponse {
    /// The rate-limit headers of the most restrictive limited descriptor (the first one over its
    /// limit, else the one with the least remaining): `RateLimit-Policy`, `RateLimit` (the IETF draft's structured fields) and
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (what envoyproxy/ratelimit
    /// adds). Empty when no descriptor was limited by a number.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let tightest = self
            .statuses
            .iter()
            .filter(|s| s.limit_remaining != u32::MAX)
            .filter_map(|s| Some((s, s.current_limit.as_ref()?)))
            .min_by_key(|(s, _)| (!s.over_limit, s.limit_remaining));
        let Some((status, limit)) = tightest else {
            return Vec::new();
        };
        let reset = status.duration_until_reset.unwrap_or_default();
        let (q, r) = (limit.requests_per_unit, status.limit_remaining);
        let name = [limit.name.as_str()];
        let mut policy = String::new();
        push_ratelimit_policy_item(&mut policy, &name, q.into(), limit.window);
        let mut ratelimit = String::new();
        push_ratelimit_item(&mut ratelimit, &name, r.into(), Some(reset));
        // RateLimit-Reset in whole seconds, rounded up as the structured field's `t`.
        let reset = reset.as_secs() + u64::from(reset.subsec_nanos() > 0);
        vec![
            ("ratelimit-policy", policy),
            ("ratelimit", ratelimit),
            ("ratelimit-limit", q.to_string()),
            ("ratelimit-remaining", r.to_string()),
            ("ratelimit-reset", reset.to_string()),
        ]
    }
}

/// Why a request was not decided.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// The request is malformed (gRPC `INVALID_ARGUMENT`, HTTP 400).
    #[error("{0}")]
    InvalidArgument(String),
    /// The store failed to decide and its failure mode did not answer (gRPC `UNAVAILABLE`,
    /// HTTP 503).
    #[error("store: {0}")]
    Unavailable(#[source] Error),
}

/// The target of the decision log lines.
const TARGET: &str = "distlimit_server";

/// Decides requests against the running configuration on one store.
pub struct Checker {
    store: Arc<dyn Store>,
    /// envoyproxy/ratelimit's global `SHADOW_MODE`: the request is never over the limit.
    shadow_mode: bool,
    /// envoyproxy/ratelimit's global `QUOTA_MODE`: every YAML descriptor is in quota mode.
    quota_mode: bool,
    running: ArcSwap<Running>,
    metrics: Metrics,
    requests: RequestMetrics,
}

/// A configuration and the limiter of its TOML policies, published together.
struct Running {
    config: Arc<Config>,
    /// The batch every request is decided in (with the TOML policies, if any).
    limiter: Limiter,
    /// The request counters of each configured domain.
    requests: HashMap<Box<str>, DomainRequests>,
}

impl std::fmt::Debug for Checker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checker").finish_non_exhaustive()
    }
}

/// A descriptor's rule, resolved.
struct Applied<'c> {
    /// `<domain>/<path>`: the metrics label (never the state's name: a label changes with
    /// `detailed_metric`, the state must not).
    label: String,
    name: String,
    limit: RuleLimit,
    shadow: bool,
    /// `quota_mode`: over its limit, it denies the request only if every quota rule is over.
    quota: bool,
    rule: Option<&'c Rule>,
    /// The state's key: the entries' values, a `share_threshold` wildcard's pattern for the
    /// entry that landed on it (see [`state_key`]).
    key: Vec<u8>,
}

impl Checker {
    /// A checker on `store` with `config`, reporting decisions to `metrics`.
    pub fn new(store: Arc<dyn Store>, config: Config, metrics: Metrics) -> Self {
        let running = Self::running(&store, &metrics, config);
        Self {
            store,
            running: ArcSwap::from_pointee(running),
            shadow_mode: false,
            quota_mode: false,
            requests: RequestMetrics::new(&metrics),
            metrics,
        }
    }

    fn running(store: &Arc<dyn Store>, metrics: &Metrics, config: Config) -> Running {
        // The policies' states live in the store, so a new limiter keeps counting where the
        // last one was.
        let policies = config
            .policies()
            .map(|set| PolicySet::clone(set))
            .unwrap_or_default();
        let limiter =
            Limiter::new(store.clone(), policies).with_observer(Arc::new(metrics.clone()));
        Running {
            requests: DomainRequests::of(config.domains()),
            config: Arc::new(config),
            limiter,
        }
    }

    /// With envoyproxy/ratelimit's global shadow mode (its `SHADOW_MODE`): every descriptor is
    /// decided and counted as usual, and its status says so, but the request is never
    /// [`over_limit`](CheckResponse::over_limit).
    #[must_use]
    pub fn with_shadow_mode(self, shadow_mode: bool) -> Self {
        Self {
            shadow_mode,
            ..self
        }
    }

    /// With envoyproxy/ratelimit's global quota mode (its `QUOTA_MODE`): every descriptor of a
    /// YAML rule, or of no rule, is in quota mode (see [`Rule::quota_mode`]): the request is
    /// over the limit only when every such descriptor is (or a TOML policy denies it).
    #[must_use]
    pub fn with_quota_mode(self, quota_mode: bool) -> Self {
        Self { quota_mode, ..self }
    }

    /// The running configuration.
    pub fn config(&self) -> Arc<Config> {
        self.running.load().config.clone()
    }

    /// Replaces the running configuration; requests already being decided finish on the old one.
    pub fn set_config(&self, config: Config) {
        let running = Self::running(&self.store, &self.metrics, config);
        self.running.store(Arc::new(running));
    }

    /// The metrics decisions are reported to.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Adds the failed handshakes of `tls` to the metrics `/metrics` serves.
    pub fn register_tls(&mut self, tls: &distlimit_serve::Tls) {
        self.requests.register_tls(tls);
    }

    /// The request metrics, and the registry `/metrics` serves.
    pub fn request_metrics(&self) -> &RequestMetrics {
        &self.requests
    }

    /// Counts a request of `domain` that ended with `result` after `elapsed`; the domain is
    /// a label value only when configured.
    pub fn observe_request(
        &self,
        protocol: Protocol,
        domain: &str,
        result: RequestResult,
        elapsed: Duration,
    ) {
        let running = self.running.load();
        self.requests
            .on_request_in(protocol, running.requests.get(domain), result, elapsed);
    }

    /// Decides `request`: every limited descriptor outside shadow and quota mode, YAML rule and
    /// TOML policy alike, is charged together or not at all, in one batch of
    /// [`Limiter::decide_batch`] (YAML rules as request items, TOML policies as policy items,
    /// zero limits as deny items; its docs say where all or nothing ends). A descriptor with
    /// `hits_addend` 0 spends nothing and is never over its limit (Envoy's count does not
    /// exceed it).
    ///
    /// As envoyproxy/ratelimit: the request is over the limit when a descriptor outside quota
    /// mode is, or when every descriptor in quota mode ([`Rule::quota_mode`], or every YAML
    /// descriptor with [`with_quota_mode`](Self::with_quota_mode)) is. Unlike envoyproxy (which
    /// charges every descriptor of every request), a request denied is charged nothing, also
    /// when every quota descriptor denied it; an admitted one charges its quota descriptors
    /// that passed. The crate documentation ("Decisions") says how states and metrics are named.
    ///
    /// # Reports
    ///
    /// Reports ([`SettleKind::Report`]: marked with [`REPORT_ENTRY`], or `POST /v1/report`) and
    /// give-backs (`is_negative_hits`) are each applied even past the limit (the crate
    /// documentation's "Reports"), each status saying whether its key is over the limit now;
    /// an unmatched descriptor charges nothing. A report or give-back matching a YAML rule, a
    /// limit override or a window policy (no debt), or a request mixing them with decided
    /// descriptors, is [`CheckError::InvalidArgument`], charging nothing.
    ///
    /// # Errors
    ///
    /// [`CheckError::InvalidArgument`] for an empty domain, no descriptors, or more than
    /// [`MAX_DESCRIPTORS`] or [`MAX_ENTRIES`]; [`CheckError::Unavailable`] when the store failed.
    pub async fn check(&self, request: &CheckRequest<'_>) -> Result<CheckResponse, CheckError> {
        validate(request)?;
        let started = Instant::now();
        let running = self.running.load();
        let config = &*running.config;
        let default_hits = request.hits.max(1);
        let domain = request.domain;
        let settle = request.descriptors.first().and_then(|d| d.settle);
        if request.descriptors.iter().any(|d| d.settle != settle) {
            return Err(CheckError::InvalidArgument(
                "a request mixes decided descriptors with reports or give-backs".into(),
            ));
        }

        // Each descriptor's plan: a TOML policy (without a limit override), else its rule.
        let mut plans: Vec<Plan<'_>> = request
            .descriptors
            .iter()
            .map(|d| -> Result<Plan<'_>, CheckError> {
                let cost = d.hits.unwrap_or(default_hits);
                if d.limit.is_none()
                    && let Some(policy) =
                        config.policy_for(domain, d.entries.iter().map(|(k, _)| *k))
                {
                    return Ok(Plan::Policy {
                        policy,
                        key: policy_key(&d.entries),
                        cost,
                    });
                }
                Ok(match resolve(config, domain, d) {
                    Some(applied) => Plan::Rule(Box::new(RulePlan::new(applied, domain, d, cost)?)),
                    None => Plan::Unmatched,
                })
            })
            .collect::<Result<_, _>>()?;
        // `replaces`: a rule named by another matched rule's `replaces` is dropped.
        let replaced: Vec<&str> = plans
            .iter()
            .filter_map(Plan::rule)
            .filter_map(|r| r.applied.rule)
            .flat_map(|r| r.replaces.iter().map(String::as_str))
            .collect();
        for plan in &mut plans {
            let is_replaced = plan
                .rule()
                .and_then(|r| r.applied.rule)
                .and_then(|r| r.name.as_deref())
                .is_some_and(|name| replaced.contains(&name));
            if is_replaced {
                *plan = Plan::Unmatched;
            }
        }

        // One item per limited descriptor; quota items deny together when they can.
        let vetoing = self.quotas_can_deny(&plans);
        let mut items: Vec<Item<'_>> = Vec::with_capacity(plans.len());
        // Which items are such quota items (filled only when they can deny: no allocation).
        let mut quota: Vec<bool> = Vec::new();
        let mut item_of: Vec<Option<usize>> = Vec::with_capacity(plans.len());
        for (i, plan) in plans.iter().enumerate() {
            let (item, is_quota) = match plan {
                Plan::Policy { policy, key, cost } if let Some(kind) = settle => (
                    (*cost > 0).then(|| Item::policy(policy, key, *cost).settling(kind)),
                    false,
                ),
                Plan::Policy { policy, key, cost } => (
                    Some(Item::policy(policy, key, *cost).shadow(*cost == 0)),
                    false,
                ),
                Plan::Rule(_) if settle.is_some() => {
                    return Err(CheckError::InvalidArgument(format!(
                        "descriptor {i}: a report or give-back needs a TOML policy of the token \
                         bucket or GCRA; YAML rules and limit overrides count fixed windows, \
                         which cannot carry debt"
                    )));
                }
                Plan::Rule(rule) => {
                    let is_quota = rule.is_quota(self.quota_mode);
                    (rule.item(is_quota && !vetoing), is_quota && vetoing)
                }
                Plan::Unmatched => (None, false),
            };
            item_of.push(item.map(|item| {
                items.push(item);
                if vetoing {
                    quota.push(is_quota);
                }
                items.len() - 1
            }));
        }
        let answers = if items.is_empty() {
            Vec::new()
        } else if vetoing {
            decide_with_quotas(&running.limiter, &mut items, &quota)
                .await
                .map_err(|error| self.policy_error(error))?
        } else {
            running
                .limiter
                .decide_batch(&items)
                .await
                .map_err(|error| self.policy_error(error))?
        };
        let latency = started.elapsed();
        let statuses: Vec<DescriptorStatus> = plans
            .iter()
            .zip(&item_of)
            .map(|(plan, item)| {
                let answer = item.and_then(|i| answers.get(i));
                match (plan, answer) {
                    (Plan::Policy { cost, .. }, Some(answer)) => answer
                        .verdict()
                        .map(|verdict| policy_status(verdict, *cost == 0))
                        .unwrap_or_default(),
                    (Plan::Rule(rule), answer) => {
                        let status = rule.status(answer);
                        self.report_rule(rule, &status, answer, latency);
                        status
                    }
                    _ => DescriptorStatus::default(),
                }
            })
            .collect();
        let over_limit = self.overall(&plans, &statuses);
        Ok(CheckResponse {
            over_limit,
            statuses,
        })
    }

    /// Whether the quota descriptors of `plans` can deny the request: there is one, and each
    /// can be over its limit (not in shadow mode, spending something; with the global quota
    /// mode no descriptor unmatched, as that one always passes).
    fn quotas_can_deny(&self, plans: &[Plan<'_>]) -> bool {
        let mut any = false;
        for plan in plans {
            match plan {
                Plan::Rule(rule) if rule.is_quota(self.quota_mode) => {
                    if rule.applied.shadow || rule.cost == 0 {
                        return false;
                    }
                    any = true;
                }
                Plan::Unmatched if self.quota_mode => return false,
                _ => {}
            }
        }
        any
    }

    /// The request's verdict from its descriptors', as [`Checker::check`] says; never in the
    /// global shadow mode.
    fn overall(&self, plans: &[Plan<'_>], statuses: &[DescriptorStatus]) -> bool {
        if self.shadow_mode {
            return false;
        }
        let (mut quotas, mut quotas_over) = (0_usize, 0_usize);
        for (plan, status) in plans.iter().zip(statuses) {
            let quota = match plan {
                Plan::Rule(rule) => rule.is_quota(self.quota_mode),
                Plan::Unmatched => self.quota_mode,
                Plan::Policy { .. } => false,
            };
            if !quota && status.over_limit {
                return true;
            }
            if quota {
                quotas += 1;
                quotas_over += usize::from(status.over_limit);
            }
        }
        quotas > 0 && quotas == quotas_over
    }

    /// Reports a YAML rule's decision to the metrics, labelled by the rule.
    fn report_rule(
        &self,
        rule: &RulePlan<'_>,
        status: &DescriptorStatus,
        answer: Option<&Answer>,
        latency: Duration,
    ) {
        let outcome = if status.shadow_denied {
            tracing::debug!(target: TARGET, policy = %rule.applied.label, "shadow mode: would deny");
            Outcome::ShadowDenied
        } else if status.over_limit {
            Outcome::Denied
        } else {
            Outcome::Allowed
        };
        let limit = status
            .current_limit
            .as_ref()
            .map_or(0, |l| l.requests_per_unit);
        let remaining = u64::from(status.limit_remaining);
        // Unlimited and zero limits are decided without the store.
        let decision = match (answer, &rule.request) {
            (Some(answer), Some(_)) => *answer.decision(),
            _ if status.over_limit || status.shadow_denied => {
                Decision::denied(u64::from(limit), remaining, Duration::ZERO, Duration::ZERO)
            }
            _ => Decision::allowed(u64::from(limit).max(remaining), remaining, Duration::ZERO),
        };
        self.metrics
            .on_decision(&rule.applied.label, outcome, &decision, latency);
    }

    /// The answer to a limiter's error: a store failure is [`CheckError::Unavailable`].
    fn policy_error(&self, error: distlimit_policy::CheckError) -> CheckError {
        match error {
            distlimit_policy::CheckError::Store(error) if !error.is_invalid_input() => {
                tracing::warn!(target: TARGET, %error, "store failed to decide");
                self.metrics.on_store_error("server", "", &error);
                CheckError::Unavailable(error)
            }
            other => CheckError::InvalidArgument(other.to_string()),
        }
    }
}

/// What decides one descriptor.
enum Plan<'c> {
    /// A TOML policy, for the descriptor's values.
    Policy {
        policy: &'c str,
        key: Vec<u8>,
        cost: u64,
    },
    /// A YAML rule or a limit override.
    Rule(Box<RulePlan<'c>>),
    /// No limit applies.
    Unmatched,
}

impl<'c> Plan<'c> {
    fn rule(&self) -> Option<&RulePlan<'c>> {
        match self {
            Plan::Rule(rule) => Some(rule),
            _ => None,
        }
    }
}

/// A YAML rule (or override) applied to a descriptor: its state and request.
struct RulePlan<'c> {
    applied: Applied<'c>,
    /// The state name, key and limit of a rule with a non-zero limit.
    request: Option<(StateName, Vec<u8>, Limit)>,
    cost: u64,
}

impl<'c> RulePlan<'c> {
    fn new(
        mut applied: Applied<'c>,
        domain: &str,
        descriptor: &Descriptor<'_>,
        cost: u64,
    ) -> Result<Self, CheckError> {
        let request = match applied.limit {
            RuleLimit::PerUnit {
                requests_per_unit,
                unit,
            } if requests_per_unit > 0 => {
                let state = rule_state(domain, &descriptor.entries, unit)?;
                let limit = fixed_window(requests_per_unit, unit)?;
                Some((state, std::mem::take(&mut applied.key), limit))
            }
            _ => None,
        };
        Ok(Self {
            applied,
            request,
            cost,
        })
    }

    /// Whether this descriptor is a quota descriptor (envoyproxy/ratelimit's `quota_mode`, of
    /// its rule or of the whole server): any counted limit, unlimited excluded.
    fn is_quota(&self, global: bool) -> bool {
        (global || self.applied.quota) && self.applied.limit != RuleLimit::Unlimited
    }

    /// The batch item: a store request, a deny item for a zero limit, none when unlimited.
    /// `quota_apart`: a quota descriptor whose denial alone must not veto the others.
    fn item(&self, quota_apart: bool) -> Option<Item<'_>> {
        // A descriptor spending nothing is decided apart, never denying the batch.
        let apart = self.applied.shadow || self.cost == 0 || quota_apart;
        match (&self.request, self.applied.limit) {
            (Some((state, key, limit)), _) => {
                let key = Key::new(key).ok()?;
                let request = Request::new(key, *limit)
                    .with_state(state)
                    .with_cost(self.cost);
                Some(Item::request(request).shadow(apart))
            }
            (None, RuleLimit::PerUnit { .. }) => Some(Item::deny().shadow(apart)),
            (None, RuleLimit::Unlimited) => None,
        }
    }

    fn status(&self, answer: Option<&Answer>) -> DescriptorStatus {
        let a = &self.applied;
        let RuleLimit::PerUnit {
            requests_per_unit,
            unit,
        } = a.limit
        else {
            return DescriptorStatus {
                limit_remaining: u32::MAX,
                ..DescriptorStatus::default()
            };
        };
        // The store's decision (none for a zero limit, decided without the store).
        let decision = answer
            .map(Answer::decision)
            .filter(|_| self.request.is_some());
        let mut status = DescriptorStatus {
            current_limit: Some(CurrentLimit {
                name: a.name.clone(),
                requests_per_unit,
                unit: Some(unit),
                window: Duration::from_secs(unit.seconds()),
                metadata: a.rule.and_then(|r| r.metadata.clone()),
            }),
            limit_remaining: decision
                .map_or(0, |d| u32::try_from(d.remaining()).unwrap_or(u32::MAX)),
            duration_until_reset: Some(
                decision.map_or_else(|| window_left(unit), |d| reset_of(d, unit)),
            ),
            ..DescriptorStatus::default()
        };
        let denied = answer.is_none_or(|a| a.decision().is_denied());
        // Spending nothing never exceeds the limit (Envoy: over only when the count would).
        if denied && self.cost > 0 {
            if self.applied.shadow {
                status.shadow_denied = true;
            } else {
                status.over_limit = true;
                status.limit_remaining = 0;
            }
        }
        status
    }
}

/// Decides `items` in one all-or-nothing batch, where the items marked in `quota` (quota
/// descriptors, none in shadow mode) deny the request only all together: while some quota item
/// passes and every other item does, the quota items over their limit are decided again in
/// shadow mode (charged nothing while over), so that the request is charged only when it is
/// admitted, and then its quota items that passed. At most one batch per quota item more than
/// the first, and only when one is over its limit (TOML policy items are then decided, and
/// observed in the metrics, once per batch).
async fn decide_with_quotas(
    limiter: &Limiter,
    items: &mut [Item<'_>],
    quota: &[bool],
) -> Result<Vec<Answer>, distlimit_policy::CheckError> {
    loop {
        let answers = limiter.decide_batch(items).await?;
        let denied = |i: usize| answers.get(i).is_some_and(|a| !a.is_allowed());
        let vetoing = |i: usize| quota.get(i).copied().unwrap_or(false) && !items[i].is_shadow();
        let quota_denied: Vec<usize> = (0..items.len())
            .filter(|&i| vetoing(i) && denied(i))
            .collect();
        let other_denied = (0..items.len()).any(|i| !vetoing(i) && denied(i));
        let quota_passed = (0..items.len()).any(|i| vetoing(i) && !denied(i));
        // Admitted, denied by a descriptor outside quota mode, or by every quota descriptor.
        if quota_denied.is_empty() || other_denied || !quota_passed {
            return Ok(answers);
        }
        for i in quota_denied {
            items[i] = items[i].shadow(true);
        }
    }
}

fn validate(request: &CheckRequest<'_>) -> Result<(), CheckError> {
    let invalid = |m: String| Err(CheckError::InvalidArgument(m));
    if request.domain.is_empty() {
        return invalid("the domain must not be empty".into());
    }
    if request.domain.len() > MAX_ENTRY_LEN {
        return invalid(format!(
            "the domain is {} bytes long, the maximum is {MAX_ENTRY_LEN}",
            request.domain.len()
        ));
    }
    if request.descriptors.is_empty() {
        return invalid("the request has no descriptors".into());
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return invalid(format!(
            "the request has {} descriptors, the maximum is {MAX_DESCRIPTORS}",
            request.descriptors.len()
        ));
    }
    for (i, d) in request.descriptors.iter().enumerate() {
        if d.entries.len() > MAX_ENTRIES {
            return invalid(format!(
                "descriptor {i} has {} entries, the maximum is {MAX_ENTRIES}",
                d.entries.len()
            ));
        }
    }
    Ok(())
}

/// The rule `descriptor` is held to: its override, else the configuration's match.
fn resolve<'c>(
    config: &'c Config,
    domain: &str,
    descriptor: &Descriptor<'_>,
) -> Option<Applied<'c>> {
    if let Some(o) = descriptor.limit {
        // As envoyproxy/ratelimit: an override applies in a configured domain, whatever matched.
        if !config.has_domain(domain) {
            return None;
        }
        // Named by its keys: the values are in the state's key, not in its name.
        let path = descriptor
            .entries
            .iter()
            .map(|(k, _)| *k)
            .collect::<Vec<_>>()
            .join(".");
        return Some(Applied {
            label: [domain, &path].join("/"),
            name: path,
            limit: RuleLimit::PerUnit {
                requests_per_unit: o.requests_per_unit,
                unit: o.unit,
            },
            shadow: false,
            quota: false,
            rule: None,
            key: state_key(&descriptor.entries),
        });
    }
    let m = config.lookup(domain, descriptor.entries.iter().copied())?;
    Some(Applied {
        label: [domain, &m.metric_path(&descriptor.entries)].join("/"),
        name: m.rule.name.clone().unwrap_or_else(|| m.path.to_owned()),
        limit: m.rule.limit,
        shadow: m.rule.shadow_mode,
        quota: m.rule.quota_mode,
        rule: Some(m.rule),
        key: state_key(&m.counter_entries(&descriptor.entries)),
    })
}

/// The limiter key of a descriptor decided by a TOML policy: its value (several: the values
/// joined by `|`), or a digest of that past [`MAX_KEY_LEN`].
pub(crate) fn policy_key(entries: &[(&str, &str)]) -> Vec<u8> {
    let mut key = Vec::new();
    for (i, (_, value)) in entries.iter().enumerate() {
        if i > 0 {
            key.push(b'|');
        }
        key.extend_from_slice(value.as_bytes());
    }
    if key.len() <= MAX_KEY_LEN {
        key
    } else {
        format!("sha256:{:x}", Sha256::digest(&key)).into_bytes()
    }
}

/// A TOML policy's verdict as a descriptor status: the limit shown is the tier that decided
/// (the first denying tier, else the one with the least remaining).
fn policy_status(verdict: &Verdict, spends_nothing: bool) -> DescriptorStatus {
    let decision = verdict.decision();
    // Spending nothing never exceeds a limit (decided as a shadow item, never denying).
    let shadow_denied = verdict.outcome() == Outcome::ShadowDenied && !spends_nothing;
    let over_limit = !verdict.is_allowed();
    let tiers = verdict.tiers();
    let tier = tiers
        .iter()
        .find(|t| t.decision().is_denied())
        .or_else(|| tiers.iter().min_by_key(|t| t.decision().remaining()));
    let Some(tier) = tier else {
        // An allow- or deny-listed key: decided without a tier.
        return DescriptorStatus {
            over_limit,
            limit_remaining: if over_limit { 0 } else { u32::MAX },
            shadow_denied,
            ..DescriptorStatus::default()
        };
    };
    let window = tier.period();
    let unit = Unit::ALL
        .into_iter()
        .find(|u| Duration::from_secs(u.seconds()) == window);
    let decision = if tier.decision().is_denied() || !decision.is_denied() {
        *tier.decision()
    } else {
        *decision
    };
    let reset = if decision.is_denied() && !decision.is_never() {
        Some(decision.retry_after())
    } else if decision.reset_after_us() > 0 {
        Some(decision.reset_after())
    } else {
        None
    };
    DescriptorStatus {
        over_limit,
        current_limit: Some(CurrentLimit {
            name: format!("{}/{}", verdict.policy(), tier.name()),
            requests_per_unit: u32::try_from(tier.limit()).unwrap_or(u32::MAX),
            unit,
            window,
            metadata: None,
        }),
        // Over the limit: nothing remains, whatever a smaller request would have found.
        limit_remaining: match over_limit {
            true => 0,
            false => u32::try_from(decision.remaining()).unwrap_or(u32::MAX),
        },
        duration_until_reset: reset,
        shadow_denied,
    }
}

/// distlimit's fixed window aligned on `unit`, as envoyproxy/ratelimit counts.
fn fixed_window(requests_per_unit: u32, unit: Unit) -> Result<Limit, CheckError> {
    // The window algorithm ignores the burst; 1 keeps every unit within the quota's bounds.
    Quota::from_parts(u64::from(requests_per_unit), unit.seconds() * 1_000_000, 1)
        .map(Limit::fixed_window)
        .map_err(|e| CheckError::InvalidArgument(e.to_string()))
}

/// Time until the window of `limit` ends, from the decision (the store's clock) when it says.
fn reset_of(decision: &Decision, unit: Unit) -> Duration {
    if decision.reset_after_us() > 0 {
        decision.reset_after()
    } else if decision.is_denied() && !decision.is_never() {
        decision.retry_after()
    } else {
        window_left(unit)
    }
}

fn window_left(unit: Unit) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let period_us = u128::from(unit.seconds()) * 1_000_000;
    Duration::from_micros(u64::try_from(period_us - now.as_micros() % period_us).unwrap_or(0))
}

/// The state of a YAML rule, keyed as envoyproxy/ratelimit keys its counters: by the domain,
/// the descriptor's entry keys and the window unit (the values are in [`state_key`]). Never
/// from the metrics label: `detailed_metric` changes the label, not the state; an override of
/// the same unit keeps the state of the rule it overrides. The name starts `rls/<unit>/` and
/// holds two `/` at least, so it is never a TOML policy's `<policy>/<tier>`; the domain and
/// keys are length-prefixed (no two lists share a name), or a digest past
/// [`MAX_POLICY_LEN`].
fn rule_state(domain: &str, entries: &[(&str, &str)], unit: Unit) -> Result<StateName, CheckError> {
    // `<unit>/<len>:<domain>/<len>:<key>...`, built without the formatting machinery (this
    // runs for every descriptor of every request).
    let unit = unit.name();
    let mut tier = String::with_capacity(
        unit.len() + domain.len() + 8 + entries.iter().map(|(k, _)| k.len() + 6).sum::<usize>(),
    );
    tier.push_str(unit);
    tier.push('/');
    let rest = tier.len();
    push_len_prefixed(&mut tier, domain);
    for (key, _) in entries {
        tier.push('/');
        push_len_prefixed(&mut tier, key);
    }
    if 4 + tier.len() <= MAX_POLICY_LEN {
        return StateName::of_tier("rls", &tier)
            .map_err(|e| CheckError::InvalidArgument(e.to_string()));
    }
    // 4 + 6 + 8 + 64 bytes at most: within MAX_POLICY_LEN.
    let digest = format!(
        "{unit}/sha256:{:x}",
        Sha256::digest(&tier.as_bytes()[rest..])
    );
    StateName::of_tier("rls", &digest).map_err(|e| CheckError::InvalidArgument(e.to_string()))
}

/// Appends `<len>:<text>`.
fn push_len_prefixed(out: &mut String, text: &str) {
    out.push_str(itoa::Buffer::new().format(text.len()));
    out.push(':');
    out.push_str(text);
}

/// The store key of a descriptor: its values, each prefixed by its length (so no two lists of
/// values share a key), or a digest of that past [`MAX_KEY_LEN`].
pub(crate) fn state_key(entries: &[(&str, &str)]) -> Vec<u8> {
    let mut key = String::with_capacity(entries.iter().map(|(_, v)| v.len() + 6).sum::<usize>());
    for (_, value) in entries {
        push_len_prefixed(&mut key, value);
        key.push(';');
    }
    if key.is_empty() {
        // A descriptor without entries only ever gets a limit through an override.
        key.push('-');
    }
    if key.len() <= MAX_KEY_LEN {
        key.into_bytes()
    } else {
        format!("sha256:{:x}", Sha256::digest(key.as_bytes())).into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_policies_stay_within_core_limits() {
        assert_eq!(state_key(&[("a", "x"), ("b", "yz")]), b"1:x;2:yz;");
        assert_ne!(
            state_key(&[("a", "1:x;")]),
            state_key(&[("a", "1"), ("b", "x")])
        );
        let long = "v".repeat(MAX_ENTRY_LEN);
        let key = state_key(&[("a", &long)]);
        assert!(key.len() <= MAX_KEY_LEN && key.starts_with(b"sha256:"));
        let long = rule_state("d", &[("k".repeat(500).as_str(), "v")], Unit::Hour).unwrap();
        assert!(long.as_str().len() <= MAX_POLICY_LEN);
        assert!(long.as_str().starts_with("rls/hour/sha256:"));
        let minute = |domain, entries: &[_]| rule_state(domain, entries, Unit::Minute).unwrap();
        let named = minute("d", &[("a", "1"), ("b", "2")]);
        assert_eq!(named.as_str(), "rls/minute/1:d/1:a/1:b");
        assert_eq!(named.policy(), "rls");
        assert_ne!(minute("d/1:a", &[]), minute("d", &[("a", "")]));
    }

    #[test]
    fn every_unit_is_a_valid_fixed_window() {
        for unit in Unit::ALL {
            for rpu in [1, 7, 1_234_567, u32::MAX] {
                assert!(fixed_window(rpu, unit).is_ok(), "{rpu}/{unit}");
            }
        }
    }

    #[test]
    fn structured_field_names_are_quoted() {
        let status = DescriptorStatus {
            current_limit: Some(CurrentLimit {
                name: r#"a"b\c é"#.to_owned(),
                requests_per_unit: 10,
                unit: None,
                window: Duration::from_millis(1500),
                metadata: None,
            }),
            limit_remaining: 3,
            duration_until_reset: Some(Duration::from_millis(200)),
            ..DescriptorStatus::default()
        };
        let response = CheckResponse {
            over_limit: false,
            statuses: vec![status],
        };
        let headers = response.headers();
        let get = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("ratelimit-policy"), Some(r#""a\"b\\c ?";q=10;w=2"#));
        assert_eq!(get("ratelimit"), Some(r#""a\"b\\c ?";r=3;t=1"#));
        assert_eq!(get("ratelimit-reset"), Some("1"));
    }
}
