//! The decision, independent of the protocol: [`Checker::check`] answers a [`CheckRequest`]
//! with one [`DescriptorStatus`] per descriptor.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use distlimit_core::observe::{Observer, Outcome};
use distlimit_core::{
    Decision, Error, Key, Limit, MAX_BATCH, MAX_KEY_LEN, MAX_POLICY_LEN, Quota, Request, Store,
};
use distlimit_metrics::Metrics;
use distlimit_policy::{Limiter, Listed, PolicySet, Prepared, Verdict};
use sha2::{Digest, Sha256};

use crate::config::{Config, Rule, RuleLimit, Unit};
use crate::metrics::{Protocol, RequestMetrics, RequestResult};

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 64;

/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 32;

/// The longest key or value of an entry, in bytes.
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
}

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

/// The answer for one descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
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
}

/// The answer to a [`CheckRequest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckResponse {
    /// Any descriptor is over its limit: deny the request.
    pub over_limit: bool,
    /// One status per descriptor, in the request's order.
    pub statuses: Vec<DescriptorStatus>,
}

impl CheckResponse {
    /// The rate-limit headers of the most restrictive limited descriptor (the one with the least
    /// remaining): `RateLimit-Policy`, `RateLimit` (the IETF draft's structured fields) and
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (what envoyproxy/ratelimit
    /// adds). Empty when no descriptor was limited by a number.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let tightest = self
            .statuses
            .iter()
            .filter(|s| s.current_limit.is_some() && s.limit_remaining != u32::MAX)
            .min_by_key(|s| s.limit_remaining);
        let Some(status) = tightest else {
            return Vec::new();
        };
        let Some(limit) = &status.current_limit else {
            return Vec::new();
        };
        let name = sf_string(&limit.name);
        let reset = status
            .duration_until_reset
            .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0));
        let (q, r) = (limit.requests_per_unit, status.limit_remaining);
        vec![
            (
                "ratelimit-policy",
                format!("{name};q={q};w={}", limit.window.as_secs().max(1)),
            ),
            ("ratelimit", format!("{name};r={r};t={reset}")),
            ("ratelimit-limit", q.to_string()),
            ("ratelimit-remaining", r.to_string()),
            ("ratelimit-reset", reset.to_string()),
        ]
    }
}

/// A structured-field string: quoted, with `"` and `\` escaped and anything but printable
/// ASCII replaced by `_`.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    out
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
    running: ArcSwap<Running>,
    metrics: Metrics,
    requests: RequestMetrics,
}

/// A configuration and the limiter of its TOML policies, published together.
struct Running {
    config: Arc<Config>,
    limiter: Option<Limiter>,
}

impl std::fmt::Debug for Checker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checker").finish_non_exhaustive()
    }
}

/// A descriptor's rule, resolved.
struct Applied<'c> {
    /// `<domain>/<path>`: the metrics label and, within length, the store's policy name.
    label: String,
    name: String,
    limit: RuleLimit,
    shadow: bool,
    rule: Option<&'c Rule>,
}

/// One store request of a check, before it is borrowed into a [`Request`].
struct Pending {
    policy: String,
    key: Vec<u8>,
    limit: Limit,
    cost: u64,
    /// The descriptors it answers.
    descriptors: Vec<usize>,
}

impl Checker {
    /// A checker on `store` with `config`, reporting decisions to `metrics`.
    pub fn new(store: Arc<dyn Store>, config: Config, metrics: Metrics) -> Self {
        let running = Self::running(&store, &metrics, config);
        Self {
            store,
            running: ArcSwap::from_pointee(running),
            requests: RequestMetrics::new(&metrics),
            metrics,
        }
    }

    fn running(store: &Arc<dyn Store>, metrics: &Metrics, config: Config) -> Running {
        // The policies' states live in the store, so a new limiter keeps counting where the
        // last one was.
        let limiter = config.policies().map(|set| {
            Limiter::new(store.clone(), PolicySet::clone(set))
                .with_observer(Arc::new(metrics.clone()))
        });
        Running {
            config: Arc::new(config),
            limiter,
        }
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
        let configured = self.running.load().config.has_domain(domain);
        self.requests
            .on_request(protocol, configured.then_some(domain), result, elapsed);
    }

    /// Decides `request`: every limited descriptor outside shadow mode, YAML rule and TOML
    /// policy alike, is charged together or not at all (one `decide_all` batch up to
    /// [`MAX_BATCH`] store requests; past it, batches of [`MAX_BATCH`], each all or nothing).
    ///
    /// # Errors
    ///
    /// [`CheckError::InvalidArgument`] for an empty domain, no descriptors, or more than
    /// [`MAX_DESCRIPTORS`], [`MAX_ENTRIES`] or [`MAX_ENTRY_LEN`]; [`CheckError::Unavailable`]
    /// when the store failed.
    pub async fn check(&self, request: &CheckRequest<'_>) -> Result<CheckResponse, CheckError> {
        validate(request)?;
        let started = Instant::now();
        let running = self.running.load();
        let config = &*running.config;
        let default_hits = request.hits.max(1);
        let domain = request.domain;

        // The descriptors a TOML policy decides (without a limit override).
        let by_policy: Vec<Option<&str>> = request
            .descriptors
            .iter()
            .map(|d| {
                if d.limit.is_some() {
                    return None;
                }
                config.policy_for(domain, d.entries.iter().map(|(k, _)| *k))
            })
            .collect();
        // Resolve every other descriptor's rule.
        let mut applied: Vec<Option<Applied<'_>>> = request
            .descriptors
            .iter()
            .zip(&by_policy)
            .map(|(d, policy)| match policy {
                Some(_) => None,
                None => resolve(config, domain, d),
            })
            .collect();
        // `replaces`: a rule named by another matched rule's `replaces` is dropped.
        let replaced: Vec<&str> = applied
            .iter()
            .flatten()
            .filter_map(|a| a.rule)
            .flat_map(|r| r.replaces.iter().map(String::as_str))
            .collect();
        if !replaced.is_empty() {
            for slot in &mut applied {
                let is_replaced = slot
                    .as_ref()
                    .and_then(|a| a.rule)
                    .and_then(|r| r.name.as_deref())
                    .is_some_and(|name| replaced.contains(&name));
                if is_replaced {
                    *slot = None;
                }
            }
        }

        let mut statuses: Vec<DescriptorStatus> =
            applied.iter().map(|a| initial_status(a.as_ref())).collect();

        // Store requests: enforced rules decided together, shadow rules apart (a shadow
        // denial must not stop the enforced ones from being charged).
        let mut enforced: Vec<Pending> = Vec::new();
        let mut shadow: Vec<Pending> = Vec::new();
        let mut zero_limit = false;
        for (i, (slot, descriptor)) in applied.iter().zip(&request.descriptors).enumerate() {
            let Some(a) = slot else { continue };
            let RuleLimit::PerUnit {
                requests_per_unit,
                unit,
            } = a.limit
            else {
                continue;
            };
            let cost = descriptor.hits.unwrap_or(default_hits);
            if requests_per_unit == 0 {
                // Nothing is ever admitted: denied without asking the store.
                statuses[i].duration_until_reset = Some(window_left(unit));
                if a.shadow {
                    statuses[i].shadow_denied = true;
                } else {
                    statuses[i].over_limit = true;
                    zero_limit = true;
                }
                continue;
            }
            let limit = fixed_window(requests_per_unit, unit)?;
            let policy = state_policy(&a.label);
            let key = state_key(&descriptor.entries);
            let group = if a.shadow { &mut shadow } else { &mut enforced };
            match group
                .iter_mut()
                .find(|p| p.policy == policy && p.key == key)
            {
                Some(same) => {
                    same.cost = same.cost.saturating_add(cost);
                    same.descriptors.push(i);
                }
                None => group.push(Pending {
                    policy,
                    key,
                    limit,
                    cost,
                    descriptors: vec![i],
                }),
            }
        }
        // TOML policies: prepared (nothing charged yet), then decided in the same batch as the
        // enforced rules; a policy in shadow mode apart, as the shadow rules.
        let keys: Vec<Option<Vec<u8>>> = by_policy
            .iter()
            .zip(&request.descriptors)
            .map(|(policy, d)| policy.map(|_| policy_key(&d.entries)))
            .collect();
        let mut prepared: Vec<(usize, Prepared<'_>)> = Vec::new();
        if let Some(limiter) = &running.limiter {
            for (i, ((policy, key), descriptor)) in by_policy
                .iter()
                .zip(&keys)
                .zip(&request.descriptors)
                .enumerate()
            {
                let (Some(policy), Some(key)) = (policy, key) else {
                    continue;
                };
                let cost = descriptor.hits.unwrap_or(default_hits);
                let check = limiter
                    .prepare(policy, key, cost)
                    .map_err(|error| self.policy_error(error))?;
                prepared.push((i, check));
            }
        }
        let deny_listed = prepared
            .iter()
            .any(|(_, p)| !p.is_shadow() && p.listed() == Some(Listed::Deny));
        if zero_limit || deny_listed {
            // The request is denied anyway: charge nothing, report what is left.
            for p in &mut enforced {
                p.cost = 0;
            }
            for (_, p) in &mut prepared {
                p.set_cost(0);
            }
        }

        // One batch: the enforced rules, then the tiers of the enforced policies (a policy's
        // tiers are one group, never split between two batches past MAX_BATCH).
        let mut batch = pending_requests(&enforced)?;
        let mut groups = vec![1; batch.len()];
        for (_, p) in prepared
            .iter()
            .filter(|(_, p)| !p.is_shadow() && !p.is_empty())
        {
            batch.extend(p.requests());
            groups.push(p.len());
        }
        let batch_decisions = self.decide_batch(&batch, &groups).await?;
        let denied = zero_limit || deny_listed || batch_decisions.iter().any(Decision::is_denied);
        let (enforced_decisions, mut policy_decisions) =
            batch_decisions.split_at(enforced.len().min(batch_decisions.len()));
        let shadow_decisions = self
            .decide_batch(&pending_requests(&shadow)?, &vec![1; shadow.len()])
            .await?;
        for (i, p) in &mut prepared {
            let decisions = if p.is_shadow() {
                // Decided apart; charged nothing when the request is denied.
                if denied {
                    p.set_cost(0);
                }
                let requests: Vec<Request<'_>> = p.requests().collect();
                self.decide_batch(&requests, &[requests.len()]).await?
            } else {
                let (own, rest) = policy_decisions.split_at(p.len().min(policy_decisions.len()));
                policy_decisions = rest;
                own.to_vec()
            };
            let verdict = p
                .verdict(&decisions)
                .map_err(|error| self.policy_error(error))?;
            statuses[*i] = policy_status(&verdict);
        }
        let latency = started.elapsed();
        let mut decided: Vec<Option<Decision>> = vec![None; statuses.len()];
        for (pending, decision) in enforced
            .iter()
            .zip(enforced_decisions)
            .chain(shadow.iter().zip(&shadow_decisions))
        {
            for &i in &pending.descriptors {
                decided[i] = Some(*decision);
                let status = &mut statuses[i];
                status.limit_remaining = u32::try_from(decision.remaining()).unwrap_or(u32::MAX);
                status.duration_until_reset = Some(reset_of(decision, pending.limit));
                if decision.is_denied() {
                    if applied[i].as_ref().is_some_and(|a| a.shadow) {
                        status.shadow_denied = true;
                    } else {
                        status.over_limit = true;
                    }
                }
            }
        }
        // One metric per limited descriptor.
        for ((status, slot), decision) in statuses.iter().zip(&applied).zip(&decided) {
            let Some(a) = slot else { continue };
            let outcome = if status.shadow_denied {
                tracing::debug!(target: TARGET, policy = %a.label, "shadow mode: would deny");
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
            // Unlimited and zero limits are decided here, without the store.
            let decision = if let Some(decision) = decision {
                *decision
            } else if status.over_limit || status.shadow_denied {
                Decision::denied(u64::from(limit), remaining, Duration::ZERO, Duration::ZERO)
            } else {
                Decision::allowed(u64::from(limit).max(remaining), remaining, Duration::ZERO)
            };
            self.metrics
                .on_decision(&a.label, outcome, &decision, latency);
        }
        let over_limit = statuses.iter().any(|s| s.over_limit);
        Ok(CheckResponse {
            over_limit,
            statuses,
        })
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

    /// Decides `requests` all-or-nothing, one decision per request in order; `groups` are the
    /// lengths of consecutive runs of requests that must share a batch (a policy's tiers). The
    /// same (policy, key) twice in a batch is one store request costing the sum. Past
    /// [`MAX_BATCH`] store requests, in batches of whole groups, each all-or-nothing; once one
    /// is denied, the rest are only peeked at (charged nothing), but the batches admitted
    /// before stay charged.
    async fn decide_batch(
        &self,
        requests: &[Request<'_>],
        groups: &[usize],
    ) -> Result<Vec<Decision>, CheckError> {
        let mut decisions = Vec::with_capacity(requests.len());
        let mut denied = false;
        let mut rest = requests;
        for len in batch_lengths(groups) {
            if rest.is_empty() {
                break;
            }
            let (chunk, next) = rest.split_at(len.min(rest.len()));
            rest = next;
            // A YAML rule and a TOML tier share a state only when a rule's `<domain>/<path>`
            // is a policy's `<policy>/<tier>`.
            let (mut merged, slots) = distlimit_core::merge_batch(chunk);
            if denied {
                merged.iter_mut().for_each(|r| *r = r.with_cost(0));
            }
            let answered = match self.store.decide_all(&merged).await {
                Ok(answered) => answered,
                Err(error) if error.is_invalid_input() => {
                    return Err(CheckError::InvalidArgument(error.to_string()));
                }
                Err(error) => {
                    tracing::warn!(target: TARGET, %error, "store failed to decide");
                    self.metrics.on_store_error("server", "", &error);
                    return Err(CheckError::Unavailable(error));
                }
            };
            denied |= answered.iter().any(Decision::is_denied);
            for slot in slots {
                let decision = answered.get(slot).copied().ok_or_else(|| {
                    CheckError::Unavailable(Error::InvalidRequest(
                        "the store answered fewer decisions than requests",
                    ))
                })?;
                decisions.push(decision);
            }
        }
        Ok(decisions)
    }
}

/// The lengths of the batches that decide runs of requests of `groups` lengths: whole groups,
/// as many as fit in [`MAX_BATCH`] (a group longer than that alone), then, should requests be
/// left beyond the groups, batches of [`MAX_BATCH`].
fn batch_lengths(groups: &[usize]) -> impl Iterator<Item = usize> + '_ {
    let mut groups = groups.iter().copied().filter(|&g| g > 0).peekable();
    std::iter::from_fn(move || {
        let mut len = groups.next()?;
        while let Some(&next) = groups.peek()
            && len + next <= MAX_BATCH
        {
            len += next;
            groups.next();
        }
        Some(len)
    })
    .chain(std::iter::repeat(MAX_BATCH))
}

/// The store requests of `pending`, in order.
fn pending_requests(pending: &[Pending]) -> Result<Vec<Request<'_>>, CheckError> {
    pending
        .iter()
        .map(|p| {
            let key = Key::new(&p.key).map_err(|e| CheckError::InvalidArgument(e.to_string()))?;
            Request::new(key, p.limit)
                .with_cost(p.cost)
                .with_policy(&p.policy)
                .map_err(|e| CheckError::InvalidArgument(e.to_string()))
        })
        .collect()
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
        for (j, (key, value)) in d.entries.iter().enumerate() {
            let longest = key.len().max(value.len());
            if longest > MAX_ENTRY_LEN {
                return invalid(format!(
                    "descriptor {i}, entry {j}: {longest} bytes, the maximum is {MAX_ENTRY_LEN}"
                ));
            }
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
        let label = format!("{domain}/{path}");
        return Some(Applied {
            name: path,
            label,
            limit: RuleLimit::PerUnit {
                requests_per_unit: o.requests_per_unit,
                unit: o.unit,
            },
            shadow: false,
            rule: None,
        });
    }
    let m = config.lookup(domain, descriptor.entries.iter().copied())?;
    let label = if m.detailed_metric {
        let path = descriptor
            .entries
            .iter()
            .map(|(k, v)| format!("{k}_{v}"))
            .collect::<Vec<_>>()
            .join(".");
        format!("{domain}/{path}")
    } else {
        format!("{domain}/{}", m.path)
    };
    Some(Applied {
        label,
        name: m.rule.name.clone().unwrap_or_else(|| m.path.to_owned()),
        limit: m.rule.limit,
        shadow: m.rule.shadow_mode,
        rule: Some(m.rule),
    })
}

fn initial_status(applied: Option<&Applied<'_>>) -> DescriptorStatus {
    let unmatched = DescriptorStatus {
        over_limit: false,
        current_limit: None,
        limit_remaining: 0,
        duration_until_reset: None,
        shadow_denied: false,
    };
    match applied.map(|a| (a, a.limit)) {
        None => unmatched,
        Some((_, RuleLimit::Unlimited)) => DescriptorStatus {
            limit_remaining: u32::MAX,
            ..unmatched
        },
        Some((
            a,
            RuleLimit::PerUnit {
                requests_per_unit,
                unit,
            },
        )) => DescriptorStatus {
            current_limit: Some(CurrentLimit {
                name: a.name.clone(),
                requests_per_unit,
                unit: Some(unit),
                window: Duration::from_secs(unit.seconds()),
            }),
            ..unmatched
        },
    }
}

/// The limiter key of a descriptor decided by a TOML policy: its value (several: the values
/// joined by `|`), or a digest of that past [`MAX_KEY_LEN`].
fn policy_key(entries: &[(&str, &str)]) -> Vec<u8> {
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
        format!("sha256:{}", hex(&Sha256::digest(&key))).into_bytes()
    }
}

/// A TOML policy's verdict as a descriptor status: the limit shown is the tier that decided
/// (the first denying tier, else the one with the least remaining).
fn policy_status(verdict: &Verdict) -> DescriptorStatus {
    let decision = verdict.decision();
    let shadow_denied = verdict.outcome() == Outcome::ShadowDenied;
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
            current_limit: None,
            limit_remaining: if over_limit { 0 } else { u32::MAX },
            duration_until_reset: None,
            shadow_denied,
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
        }),
        limit_remaining: u32::try_from(decision.remaining()).unwrap_or(u32::MAX),
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
fn reset_of(decision: &Decision, limit: Limit) -> Duration {
    if decision.reset_after_us() > 0 {
        decision.reset_after()
    } else if decision.is_denied() && !decision.is_never() {
        decision.retry_after()
    } else {
        let period = limit.quota().period();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let period_us = period.as_micros().max(1);
        let left = period_us - now.as_micros() % period_us;
        Duration::from_micros(u64::try_from(left).unwrap_or(u64::MAX))
    }
}

fn window_left(unit: Unit) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let period_us = u128::from(unit.seconds()) * 1_000_000;
    Duration::from_micros(u64::try_from(period_us - now.as_micros() % period_us).unwrap_or(0))
}

/// The store's policy name of a rule: its label, or a digest of it past [`MAX_POLICY_LEN`].
fn state_policy(label: &str) -> String {
    if label.len() <= MAX_POLICY_LEN {
        label.to_owned()
    } else {
        format!("sha256:{}", hex(&Sha256::digest(label.as_bytes())))
    }
}

/// The store key of a descriptor: its values, each prefixed by its length (so no two lists of
/// values share a key), or a digest of that past [`MAX_KEY_LEN`].
fn state_key(entries: &[(&str, &str)]) -> Vec<u8> {
    let mut key = String::new();
    for (_, value) in entries {
        let _ = write!(key, "{}:{value};", value.len());
    }
    if key.is_empty() {
        // A descriptor without entries only ever gets a limit through an override.
        key.push('-');
    }
    if key.len() <= MAX_KEY_LEN {
        key.into_bytes()
    } else {
        format!("sha256:{}", hex(&Sha256::digest(key.as_bytes()))).into_bytes()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
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
        let policy = state_policy(&"p".repeat(500));
        assert!(policy.len() <= MAX_POLICY_LEN);
        assert_eq!(state_policy("d/k_v"), "d/k_v");
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
    fn batches_hold_whole_groups() {
        let lengths =
            |groups: &[usize], n: usize| batch_lengths(groups).take(n).collect::<Vec<_>>();
        // 15 rules and a policy of two tiers: the tiers are not split 1 + 1.
        let mut groups = vec![1; 15];
        groups.push(2);
        assert_eq!(lengths(&groups, 3), [15, 2, MAX_BATCH]);
        assert_eq!(lengths(&[8, 8, 8, 0, 3], 3), [16, 11, MAX_BATCH]);
        assert_eq!(lengths(&[1; 40], 4), [16, 16, 8, MAX_BATCH]);
        assert_eq!(lengths(&[], 2), [MAX_BATCH, MAX_BATCH]);
    }

    #[test]
    fn structured_field_names_are_quoted() {
        assert_eq!(sf_string(r#"a"b\c é"#), r#""a\"b\\c _""#);
    }
}
