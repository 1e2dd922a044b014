//! Envoy's Rate Limit Quota Service (`StreamRateLimitQuotas`): each proxy reports its usage per
//! bucket on one stream and is answered per bucket with `ALLOW_ALL`, `DENY_ALL` or a token bucket
//! it enforces itself. A bucket's limit is what an RLS descriptor of its entries, in key order,
//! lands on; each proxy's token bucket is its share of it, every unit of which is withdrawn from
//! the store's budget ([`LeaseStore::exchange`]) before it is sent, so proxies sharing one Redis
//! admit together at most the limit plus one burst (the crate documentation states the terms).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use distlimit_policy::{Listed, Scope, Tier};
use distlimit_core::{Key, LeaseStore, Limit, Quota, Request, StateName};
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request as GrpcRequest, Response, Status, Streaming};

use crate::check::{Checker, MAX_ENTRIES, MAX_ENTRY_LEN, policy_key, state_key};
use crate::config::{Config, RuleLimit};

/// The most bytes of one bucket id's keys and values together.
pub const MAX_BUCKET_ID_BYTES: usize = 1024;

/// The largest `num_requests_allowed` or `num_requests_denied` of one report (2^40).
pub const MAX_REPORTED_REQUESTS: u64 = 1 << 40;

/// The longest `time_elapsed` of one report: one hour.
pub const MAX_TIME_ELAPSED_SECS: i64 = 3600;

/// How long an assignment may take to reach its proxy: each assignment is paid for this long
/// past its TTL, and the one it replaces this long past its replacement.
pub const DELIVERY_SLACK: Duration = Duration::from_millis(250);

/// A bucket reporting no request this many reports in a row is abandoned (`AbandonAction`).
pub const ABANDON_AFTER_IDLE_REPORTS: u32 = 5;

/// The budget's reserve for buckets without a token bucket is this part of its capacity.
const RESERVE_PART_OF_CAPACITY: u64 = 4;

/// The most store calls of one report's buckets in flight at once.
const MAX_CONCURRENT_EXCHANGES: usize = 128;

/// A share is sized at this multiple of the demand its proxy reports.
const HEADROOM: f64 = 1.25;

/// A token bucket holds this many seconds of its rate (at least one token).
const BURST_SECS: f64 = 0.5;

/// The part of a rule's rate the shares add up to: the rest keeps the budget from running dry
/// of the units each new token bucket starts with (`max_tokens`) and of rounding.
const ASSIGNED_PART: f64 = 0.95;

/// The quota service's flags.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct QuotaArgs {
    /// The `reporting_interval` of the proxies' `rate_limit_quota` buckets, in milliseconds
    /// (1000 to 600000): assignments live two of it (whole seconds), and a stream silent for
    /// three of it (plus 2 s) is ended.
    #[arg(long, value_name = "MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1000..=600_000))]
    pub rlqs_report_interval_ms: u64,
    /// The most quota streams open at once; one more is refused (`RESOURCE_EXHAUSTED`).
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub rlqs_max_streams: u64,
    /// The most buckets one quota stream reports; a report past it ends the stream
    /// (`RESOURCE_EXHAUSTED`).
    #[arg(long, value_name = "N", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub rlqs_max_buckets: u64,
}

impl QuotaArgs {
    /// An assignment's time to live: two report intervals, in whole seconds (at least 2).
    pub fn ttl(&self) -> Duration {
        Duration::from_secs((2 * self.rlqs_report_interval_ms).div_ceil(1000).max(2))
    }

    /// How long a stream may stay silent.
    fn silence(&self) -> Duration {
        3 * Duration::from_millis(self.rlqs_report_interval_ms) + Duration::from_secs(2)
    }
}

/// The quota service's series in the server's registry.
#[derive(Debug, Default)]
pub(crate) struct QuotaMetrics {
    streams: Gauge,
    buckets: Gauge,
    assigned: Family<RuleLabels, Gauge<f64, AtomicU64>>,
    reported: Family<UsageLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    rule: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UsageLabels {
    rule: Arc<str>,
    result: &'static str,
}

impl QuotaMetrics {
    /// Registers the series under `registry` (the `distlimit_server` prefix).
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "rlqs_streams",
            "Rate limit quota streams open",
            metrics.streams.clone(),
        );
        registry.register(
            "rlqs_buckets",
            "Buckets of the open rate limit quota streams",
            metrics.buckets.clone(),
        );
        registry.register(
            "rlqs_assigned_rate",
            "Units per second assigned to the proxies of this instance, by rule",
            metrics.assigned.clone(),
        );
        registry.register(
            "rlqs_reported_requests",
            "Requests the proxies reported, by rule and result (allowed, denied)",
            metrics.reported.clone(),
        );
        metrics
    }
}

/// The service: `StreamRateLimitQuotas` on a [`Checker`]'s configuration and a lease store.
#[derive(Clone)]
pub struct QuotaService(Arc<Shared>);

impl std::fmt::Debug for QuotaService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaService").finish_non_exhaustive()
    }
}

struct Shared {
    checker: Arc<Checker>,
    leases: Arc<dyn LeaseStore>,
    args: QuotaArgs,
    /// This instance's members of each budget, to size their shares.
    budgets: Mutex<HashMap<Arc<str>, Budget>>,
    open: AtomicU64,
    next_member: AtomicU64,
    stop: watch::Receiver<bool>,
}

/// This instance's members of one budget, and their shares.
#[derive(Debug, Default)]
struct Budget {
    members: HashMap<u64, Member>,
    /// When the shares were sized, and of what rate (`None`: a member came or went since).
    sized: Option<(Instant, f64)>,
}

/// One bucket of one stream in a budget.
#[derive(Clone, Copy, Debug, Default)]
struct Member {
    /// Requests per second reported (`None` before two reports).
    demand: Option<f64>,
    /// Its share, in units per second.
    share: f64,
}

/// Shares are sized again at most this often (and at once when a member comes or goes).
const RESIZE: Duration = Duration::from_millis(100);

impl QuotaService {
    /// The service deciding buckets by `checker`'s running configuration, withdrawing from
    /// `leases` (the server's store); when `stop` turns true every stream's assignments are
    /// expired (TTL 0) and the stream ends.
    pub fn new(
        checker: Arc<Checker>,
        leases: Arc<dyn LeaseStore>,
        args: &QuotaArgs,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self(Arc::new(Shared {
            checker,
            leases,
            args: args.clone(),
            budgets: Mutex::default(),
            open: AtomicU64::new(0),
            next_member: AtomicU64::new(0),
            stop,
        }))
    }

    /// The tonic server of this service.
    pub fn into_server(self) -> RateLimitQuotaServiceServer<Self> {
        RateLimitQuotaServiceServer::new(self)
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaService {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: GrpcRequest<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let shared = self.0.clone();
        let max = shared.args.rlqs_max_streams;
        if shared.open.fetch_add(1, Ordering::AcqRel) >= max {
            shared.open.fetch_sub(1, Ordering::AcqRel);
            return Err(Status::resource_exhausted(format!(
                "{max} quota streams are open, the most --rlqs-max-streams allows"
            )));
        }
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(run_stream(shared, request.into_inner(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

type Outbox = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

async fn run_stream(
    shared: Arc<Shared>,
    mut reports: Streaming<RateLimitQuotaUsageReports>,
    tx: Outbox,
) {
    let metrics = &shared.checker.request_metrics().quota;
    metrics.streams.inc();
    let mut stream = Stream {
        shared: &shared,
        domain: None,
        config: None,
        buckets: HashMap::new(),
    };
    let mut stop = shared.stop.clone();
    loop {
        let stopping = async {
            if stop.wait_for(|stop| *stop).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let next = tokio::time::timeout(shared.args.silence(), reports.message());
        tokio::select! {
            () = stopping => {
                let expired = stream.expire_all().await;
                if !expired.bucket_action.is_empty() {
                    let _ = tx.send(Ok(expired)).await;
                }
                break;
            }
            next = next => match next {
                Err(_) => {
                    let _ = tx.send(Err(Status::deadline_exceeded(format!(
                        "no usage report for {:?}", shared.args.silence()
                    )))).await;
                    break;
                }
                Ok(Ok(Some(report))) => match stream.on_report(report).await {
                    Ok(answer) => {
                        if !answer.bucket_action.is_empty() && tx.send(Ok(answer)).await.is_err() {
                            break;
                        }
                    }
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                },
                Ok(Ok(None) | Err(_)) => break,
            }
        }
    }
    stream.leave();
    metrics.streams.dec();
    shared.open.fetch_sub(1, Ordering::AcqRel);
}

/// What a bucket was last told.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Sent {
    #[default]
    Nothing,
    Blanket(BlanketRule),
    Bucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_secs: u64,
    },
}

/// Units withdrawn from a budget for one bucket of one stream.
struct Lease {
    /// What the units are withdrawn for.
    target: Limited,
    /// Withdrawn and not given back.
    held: u64,
    /// What the proxy may have admitted (or may admit) by `t0`, at most: every fresh bucket's
    /// `max_tokens` and every rate over the time it was in force.
    base: f64,
    /// Units per second from `t0`: the rate assigned (in the metrics).
    rate: f64,
    t0: Instant,
    /// Until when the current assignment can be in force: its TTL plus the delivery slack.
    cover_end: Instant,
    /// Credit the proxy can no longer admit (it overflowed its bucket), given back.
    known_lost: f64,
    /// The `max_tokens` of the current and of the previous token bucket.
    max_tokens: f64,
    prev_max_tokens: f64,
}

impl Lease {
    /// What the proxy may have admitted by `t` at most.
    fn entitled(&self, t: Instant) -> f64 {
        let until = t.min(self.cover_end);
        self.base + self.rate * until.saturating_duration_since(self.t0).as_secs_f64()
    }
}

fn need(units: f64) -> u64 {
    // Non-negative and far below 2^53: the float is an exact integer after `ceil`.
    units.max(0.0).ceil() as u64
}

#[derive(Default)]
struct BucketState {
    id: BucketId,
    member: u64,
    /// The budget the member is in.
    budget: Option<Arc<str>>,
    /// What the bucket lands on in [`Stream::config`] (`None`: not resolved since a reload).
    target: Option<Target>,
    last_report: Option<Instant>,
    /// Requests reported since `last_report` (a report right after another is folded in).
    pending: u64,
    idle_reports: u32,
    /// Requests the proxy reported allowed, in all.
    admitted: u64,
    lease: Option<Lease>,
    sent: Sent,
}

struct Stream<'s> {
    shared: &'s Shared,
    domain: Option<String>,
    /// The configuration the buckets' targets were resolved on.
    config: Option<Arc<Config>>,
    buckets: HashMap<String, BucketState>,
}

/// A reported bucket's store work: what it lands on, its usage and demand; `None`: idle too
/// long, its units given back and `AbandonAction` sent.
type Work = Option<(Target, BucketQuotaUsage, Option<f64>)>;

/// A job's bucket to keep (`None`: abandoned) and its answer.
type Done = (Option<(String, BucketState)>, Option<BucketAction>);

/// What a bucket lands on.
#[derive(Clone)]
enum Target {
    Blanket(BlanketRule),
    Limited(Limited),
}

#[derive(Clone)]
struct Limited {
    budget: Arc<str>,
    label: Arc<str>,
    state: StateName,
    key: Vec<u8>,
    limit: Limit,
    /// Units of the budget the token buckets already assigned leave to new ones.
    reserve: u64,
    /// Units per `unit_secs`.
    per_unit: u64,
    unit_secs: u64,
}

impl Limited {
    fn request(&self) -> Option<Request<'_>> {
        let key = Key::new(&self.key).ok()?;
        Some(Request::new(key, self.limit).with_state(&self.state))
    }
}

impl Stream<'_> {
    async fn on_report(
        &mut self,
        report: RateLimitQuotaUsageReports,
    ) -> Result<RateLimitQuotaResponse, Status> {
        let now = Instant::now();
        let usages = self.validate(&report)?;
        let config = self.shared.checker.config();
        if !self
            .config
            .as_ref()
            .is_some_and(|seen| Arc::ptr_eq(seen, &config))
        {
            // A reload: every bucket's rule is resolved again at its next report.
            for state in self.buckets.values_mut() {
                state.target = None;
            }
            self.config = Some(config.clone());
        }
        let domain = self.domain.as_deref().unwrap_or_default();
        let metrics = &self.shared.checker.request_metrics().quota;
        // What each bucket's report changes here, in the report's order; the store calls after.
        let mut jobs = Vec::with_capacity(usages.len());
        for (name, usage) in usages {
            let mut state = self.buckets.remove(&name).unwrap_or_else(|| {
                metrics.buckets.inc();
                BucketState {
                    id: usage.bucket_id.clone().unwrap_or_default(),
                    member: self.shared.next_member.fetch_add(1, Ordering::Relaxed),
                    ..BucketState::default()
                }
            });
            let requests = usage.num_requests_allowed + usage.num_requests_denied;
            state.admitted = state.admitted.saturating_add(usage.num_requests_allowed);
            state.pending = state.pending.saturating_add(requests);
            state.idle_reports = if requests == 0 && state.last_report.is_some() {
                state.idle_reports + 1
            } else {
                0
            };
            // Over at least 0.1 s since the report it was last measured at (none at the first).
            let elapsed = state
                .last_report
                .map(|last| now.saturating_duration_since(last).as_secs_f64());
            let demand = elapsed
                .filter(|&elapsed| elapsed >= 0.1)
                .map(|elapsed| std::mem::take(&mut state.pending) as f64 / elapsed);
            if elapsed.is_none() || demand.is_some() {
                state.last_report = Some(now);
            }
            let work: Work = if state.idle_reports >= ABANDON_AFTER_IDLE_REPORTS {
                metrics.buckets.dec();
                None
            } else {
                let target = state
                    .target
                    .take()
                    .unwrap_or_else(|| resolve(&config, domain, &usage));
                Some((target, usage, demand))
            };
            jobs.push((name, state, work));
        }
        // The buckets' store calls run concurrently (a store that coalesces, as Redis does,
        // packs them into a few calls), their answers in the report's order.
        let shared = self.shared;
        let done: Vec<Done> = futures_util::stream::iter(jobs)
            .map(|(name, mut state, work)| async move {
                match work {
                    None => {
                        close_lease(shared, &mut state, now + DELIVERY_SLACK).await;
                        shared.leave(&state);
                        let action = BucketAction {
                            bucket_id: Some(state.id),
                            bucket_action: Some(Action::AbandonAction(AbandonAction {})),
                        };
                        (None, Some(action))
                    }
                    Some((target, usage, demand)) => {
                        let action = assign(shared, &mut state, &target, &usage, demand, now).await;
                        state.target = Some(target);
                        (Some((name, state)), action)
                    }
                }
            })
            .buffered(MAX_CONCURRENT_EXCHANGES)
            .collect()
            .await;
        let mut actions = Vec::with_capacity(done.len());
        for (kept, action) in done {
            if let Some((name, state)) = kept {
                self.buckets.insert(name, state);
            }
            actions.extend(action);
        }
        Ok(RateLimitQuotaResponse {
            bucket_action: actions,
        })
    }

    /// Checks a report whole before anything changes: its usages by bucket name (a bucket
    /// reported twice is summed).
    fn validate(
        &mut self,
        report: &RateLimitQuotaUsageReports,
    ) -> Result<Vec<(String, BucketQuotaUsage)>, Status> {
        let invalid = |m: String| Err(Status::invalid_argument(m));
        if report.domain.is_empty() {
            return invalid("the report has no domain".into());
        }
        if report.domain.len() > MAX_ENTRY_LEN {
            return invalid(format!(
                "the domain is {} bytes long, the maximum is {MAX_ENTRY_LEN}",
                report.domain.len()
            ));
        }
        match &self.domain {
            Some(domain) if *domain != report.domain => {
                return invalid(format!(
                    "the stream's domain is {domain:?}, a report says {:?}",
                    report.domain
                ));
            }
            Some(_) => {}
            None => self.domain = Some(report.domain.clone()),
        }
        let max = usize::try_from(self.shared.args.rlqs_max_buckets).unwrap_or(usize::MAX);
        if report.bucket_quota_usages.len() > max {
            return Err(Status::resource_exhausted(format!(
                "the report has {} buckets, the most --rlqs-max-buckets allows is {max}",
                report.bucket_quota_usages.len()
            )));
        }
        let mut usages: Vec<(String, BucketQuotaUsage)> =
            Vec::with_capacity(report.bucket_quota_usages.len());
        let mut index: HashMap<String, usize> = HashMap::new();
        for (i, usage) in report.bucket_quota_usages.iter().enumerate() {
            let Some(id) = &usage.bucket_id else {
                return invalid(format!("bucket {i} has no bucket_id"));
            };
            if id.bucket.is_empty() {
                return invalid(format!("bucket {i}: the bucket_id has no entries"));
            }
            if id.bucket.len() > MAX_ENTRIES {
                return invalid(format!(
                    "bucket {i}: the bucket_id has {} entries, the maximum is {MAX_ENTRIES}",
                    id.bucket.len()
                ));
            }
            let bytes: usize = id.bucket.iter().map(|(k, v)| k.len() + v.len()).sum();
            if bytes > MAX_BUCKET_ID_BYTES {
                return invalid(format!(
                    "bucket {i}: the bucket_id is {bytes} bytes long, the maximum is \
                     {MAX_BUCKET_ID_BYTES}"
                ));
            }
            if usage.num_requests_allowed > MAX_REPORTED_REQUESTS
                || usage.num_requests_denied > MAX_REPORTED_REQUESTS
            {
                return invalid(format!(
                    "bucket {i}: more than {MAX_REPORTED_REQUESTS} requests in one report"
                ));
            }
            if let Some(elapsed) = &usage.time_elapsed
                && !(0..=MAX_TIME_ELAPSED_SECS).contains(&elapsed.seconds)
            {
                return invalid(format!(
                    "bucket {i}: time_elapsed of {} s is outside 0 to {MAX_TIME_ELAPSED_SECS} s",
                    elapsed.seconds
                ));
            }
            let name = bucket_name(id);
            match index.entry(name) {
                Entry::Occupied(seen) => {
                    if let Some((_, sum)) = usages.get_mut(*seen.get()) {
                        sum.num_requests_allowed += usage.num_requests_allowed;
                        sum.num_requests_denied += usage.num_requests_denied;
                    }
                }
                Entry::Vacant(slot) => {
                    usages.push((slot.key().clone(), usage.clone()));
                    slot.insert(usages.len() - 1);
                }
            }
        }
        let new = usages
            .iter()
            .filter(|(name, _)| !self.buckets.contains_key(name))
            .count();
        if self.buckets.len() + new > max {
            return Err(Status::resource_exhausted(format!(
                "the stream would hold {} buckets, the most --rlqs-max-buckets allows is {max}",
                self.buckets.len() + new
            )));
        }
        Ok(usages)
    }

    /// Expires every assignment (TTL 0) and gives back what the proxies can no longer admit.
    async fn expire_all(&mut self) -> RateLimitQuotaResponse {
        let now = Instant::now();
        let shared = self.shared;
        let actions = self
            .buckets
            .values()
            .filter_map(|state| {
                strategy_of(state.sent).map(|s| assignment(&state.id, s, Duration::ZERO))
            })
            .collect();
        futures_util::stream::iter(self.buckets.values_mut())
            .for_each_concurrent(MAX_CONCURRENT_EXCHANGES, |state| {
                close_lease(shared, state, now + DELIVERY_SLACK)
            })
            .await;
        RateLimitQuotaResponse {
            bucket_action: actions,
        }
    }

    /// Leaves every budget (the proxies keep their assignments until they expire: the units
    /// withdrawn for them stay spent).
    fn leave(&mut self) {
        let metrics = &self.shared.checker.request_metrics().quota;
        for (_, state) in self.buckets.drain() {
            metrics.buckets.dec();
            self.shared.leave(&state);
        }
    }
}

impl Shared {
    /// Removes `state`'s member from its budget and its rate from the metrics.
    fn leave(&self, state: &BucketState) {
        if let Some(budget) = &state.budget {
            let mut budgets = self.budgets.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(shares) = budgets.get_mut(budget) {
                shares.members.remove(&state.member);
                shares.sized = None;
                if shares.members.is_empty() {
                    budgets.remove(budget);
                }
            }
        }
        if let Some(lease) = &state.lease {
            self.set_assigned(lease, 0.0);
        }
    }

    /// Moves `lease`'s rate in the metrics to `rate`.
    fn set_assigned(&self, lease: &Lease, rate: f64) {
        let metrics = &self.checker.request_metrics().quota;
        metrics
            .assigned
            .get_or_create(&RuleLabels {
                rule: lease.target.label.clone(),
            })
            .inc_by(rate - lease.rate);
    }

    /// `member`'s share of `total` units per second among this instance's members of
    /// `budget` (see [`size_shares`]), its `demand` folded in (sized again every [`RESIZE`]).
    fn share(&self, budget: &Arc<str>, member: u64, demand: Option<f64>, total: f64) -> f64 {
        let now = Instant::now();
        let mut budgets = self.budgets.lock().unwrap_or_else(PoisonError::into_inner);
        let shares = budgets.entry(budget.clone()).or_default();
        let entry = shares.members.entry(member).or_insert_with(|| {
            shares.sized = None;
            Member::default()
        });
        if let Some(demand) = demand {
            entry.demand = Some(entry.demand.map_or(demand, |old| 0.5 * old + 0.5 * demand));
        }
        let fresh = shares
            .sized
            .is_some_and(|(at, of)| of == total && now.saturating_duration_since(at) < RESIZE);
        if !fresh {
            size_shares(&mut shares.members, total);
            shares.sized = Some((now, total));
        }
        shares.members.get(&member).map_or(0.0, |m| m.share)
    }
}

/// Sizes the shares of `total` units per second among `members`: max-min fair on the demands
/// (each sized at [`HEADROOM`] times its demand, at least a quarter of an equal share; an
/// equal share before its demand is known), where what a member is expected to use (its
/// demand) is what the ones after it cannot have.
fn size_shares(members: &mut HashMap<u64, Member>, total: f64) {
    let n = members.len().max(1) as f64;
    let equal = total / n;
    let floor = equal / 4.0;
    let mut wants: Vec<(f64, f64, u64)> = members
        .iter()
        .map(|(&id, m)| match m.demand {
            Some(d) => ((d * HEADROOM).max(floor), d, id),
            None => (equal, equal, id),
        })
        .collect();
    wants.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut remaining = total;
    let len = wants.len();
    for (i, (want, used, id)) in wants.into_iter().enumerate() {
        let share = want.min(remaining / (len - i) as f64).max(0.0);
        if let Some(member) = members.get_mut(&id) {
            member.share = share;
        }
        remaining -= share.min(used);
    }
}

/// A bucket id's entries in key order.
fn sorted_entries(id: &BucketId) -> Vec<(&str, &str)> {
    let mut entries: Vec<_> = id.bucket.iter().map(|(k, v)| (&**k, &**v)).collect();
    entries.sort_unstable();
    entries
}

/// The stable name of a bucket id: its entries in key order, each length-prefixed.
fn bucket_name(id: &BucketId) -> String {
    let mut name = String::new();
    for (k, v) in sorted_entries(id) {
        name.push_str(&format!("{}:{k}{}:{v};", k.len(), v.len()));
    }
    name
}

/// The rule or policy the bucket's entries (in key order) land on as one RLS descriptor of
/// `domain`: unmatched, unlimited or in shadow mode `ALLOW_ALL`, a zero limit `DENY_ALL`.
fn resolve(config: &Config, domain: &str, usage: &BucketQuotaUsage) -> Target {
    let Some(id) = &usage.bucket_id else {
        return Target::Blanket(BlanketRule::AllowAll);
    };
    let entries = sorted_entries(id);
    let limited = |label: String, tier: &str, key: Vec<u8>, per_unit: u64, unit_secs: u64| {
        let digest = Sha256::digest(format!("{}:{domain}{tier}", domain.len()));
        // The rate is in the name: a reload that changes the limit starts a new budget (full).
        let state =
            StateName::of_tier("rlqs", &format!("{unit_secs}s/{per_unit}/{digest:x}")).ok()?;
        let rate = per_unit as f64 / unit_secs as f64;
        // The store's burst: what the assignments of one TTL and slack ask for at once.
        let burst = need(rate * 4.0).max(1);
        let (quota, burst) = match Quota::from_parts(per_unit, unit_secs * 1_000_000, burst) {
            Ok(quota) => (quota, burst),
            Err(_) => (
                Quota::from_parts(per_unit, unit_secs * 1_000_000, 1).ok()?,
                1,
            ),
        };
        let budget: Arc<str> =
            format!("{}\u{0}{}", state.as_str(), String::from_utf8_lossy(&key)).into();
        Some(Target::Limited(Limited {
            budget,
            label: label.into(),
            state,
            key,
            limit: Limit::token_bucket(quota),
            reserve: burst / RESERVE_PART_OF_CAPACITY,
            per_unit,
            unit_secs,
        }))
    };
    if let Some(name) = config.policy_for(domain, entries.iter().map(|(k, _)| *k)) {
        return resolve_policy(config, name, &entries, limited)
            .unwrap_or(Target::Blanket(BlanketRule::DenyAll));
    }
    let Some(m) = config.lookup(domain, entries.iter().copied()) else {
        return Target::Blanket(BlanketRule::AllowAll);
    };
    if m.rule.shadow_mode {
        return Target::Blanket(BlanketRule::AllowAll);
    }
    match m.rule.limit {
        RuleLimit::Unlimited => Target::Blanket(BlanketRule::AllowAll),
        RuleLimit::PerUnit {
            requests_per_unit: 0,
            ..
        } => Target::Blanket(BlanketRule::DenyAll),
        RuleLimit::PerUnit {
            requests_per_unit,
            unit,
        } => limited(
            format!("{domain}/{}", m.path),
            &format!("rule/{}", m.path),
            state_key(&m.counter_entries(&entries)),
            u64::from(requests_per_unit),
            unit.seconds(),
        )
        .unwrap_or(Target::Blanket(BlanketRule::DenyAll)),
    }
}

/// What a bucket of the TOML policy `name` with `entries` lands on, as an RLS request's
/// descriptor would: shadow mode or the allow list `ALLOW_ALL`, the deny list `DENY_ALL`;
/// else the tightest of the tiers the key is checked against (an override's, with the
/// policy's global tiers), a global tier being one budget for every key. `None`: no budget
/// can be named for it.
fn resolve_policy(
    config: &Config,
    name: &str,
    entries: &[(&str, &str)],
    limited: impl FnOnce(String, &str, Vec<u8>, u64, u64) -> Option<Target>,
) -> Option<Target> {
    let Some(policy) = config.policies().and_then(|set| set.get(name)) else {
        return Some(Target::Blanket(BlanketRule::AllowAll));
    };
    if policy.is_shadow() {
        return Some(Target::Blanket(BlanketRule::AllowAll));
    }
    let key = policy_key(entries);
    let tiers = match policy.tiers_for(&key) {
        Ok(tiers) => tiers,
        Err(Listed::Allow) => return Some(Target::Blanket(BlanketRule::AllowAll)),
        Err(Listed::Deny) => return Some(Target::Blanket(BlanketRule::DenyAll)),
    };
    let rate = |t: &Tier| t.quota().limit() as f64 / t.quota().period_us().max(1) as f64;
    let Some(tier) = tiers.iter().min_by(|a, b| rate(a).total_cmp(&rate(b))) else {
        return Some(Target::Blanket(BlanketRule::AllowAll));
    };
    let secs = tier.quota().period().as_secs().max(1);
    let per_unit = tier.quota().limit() * secs * 1_000_000 / tier.quota().period_us().max(1);
    let (scope, key) = match tier.scope() {
        Scope::Global => ("global", b"*".to_vec()),
        Scope::Key => ("key", key),
    };
    limited(
        format!("{}/{}", policy.name(), tier.name()),
        &format!("policy/{}/{scope}", tier.store_policy()),
        key,
        per_unit.max(1),
        secs,
    )
}

/// Gives back what the proxy cannot admit past `end` and drops the lease.
async fn close_lease(shared: &Shared, state: &mut BucketState, end: Instant) {
    let Some(mut lease) = state.lease.take() else {
        return;
    };
    lease.cover_end = lease.cover_end.min(end);
    // Held on: what the proxy may admit by `end`, less what it lost.
    let keep = need(lease.entitled(end) - lease.known_lost);
    if lease.held > keep
        && let Some(request) = lease.target.request()
        && let Err(error) = shared.leases.exchange(&request, lease.held - keep, 0).await
    {
        tracing::warn!(%error, "rlqs: giving back units failed");
    }
    shared.set_assigned(&lease, 0.0);
}

/// The assignment of one reported bucket, with its units withdrawn; `None` when the store
/// failed (the proxy keeps its assignment until it expires).
async fn assign(
    shared: &Shared,
    state: &mut BucketState,
    target: &Target,
    usage: &BucketQuotaUsage,
    demand: Option<f64>,
    now: Instant,
) -> Option<BucketAction> {
    let ttl = shared.args.ttl();
    let target = match target {
        &Target::Blanket(rule) => {
            close_lease(shared, state, now + DELIVERY_SLACK).await;
            shared.leave(state);
            state.budget = None;
            state.sent = Sent::Blanket(rule);
            return Some(assignment(&state.id, strategy_of(state.sent)?, ttl));
        }
        Target::Limited(target) => target,
    };
    let reported = &shared.checker.request_metrics().quota.reported;
    let (allowed, denied) = (usage.num_requests_allowed, usage.num_requests_denied);
    for (result, n) in [("allowed", allowed), ("denied", denied)] {
        if n > 0 {
            let rule = target.label.clone();
            let labels = UsageLabels { rule, result };
            reported.get_or_create(&labels).inc_by(n);
        }
    }
    if state
        .lease
        .as_ref()
        .is_some_and(|l| l.target.budget != target.budget)
    {
        close_lease(shared, state, now + DELIVERY_SLACK).await;
    }
    if state.budget.as_ref() != Some(&target.budget) {
        shared.leave(state);
        state.budget = Some(target.budget.clone());
    }
    let lease = state.lease.get_or_insert_with(|| Lease {
        target: target.clone(),
        held: 0,
        base: 0.0,
        rate: 0.0,
        t0: now,
        cover_end: now,
        known_lost: 0.0,
        max_tokens: 0.0,
        prev_max_tokens: 0.0,
    });
    lease.target.limit = target.limit;
    // Credit past what the proxy admitted and could still hold was lost to its full bucket.
    let lost = lease.entitled(now.checked_sub(DELIVERY_SLACK).unwrap_or(now))
        - state.admitted as f64
        - lease.max_tokens.max(lease.prev_max_tokens);
    lease.known_lost = lease.known_lost.max(lost);

    let share = shared.share(
        &target.budget,
        state.member,
        demand,
        target.per_unit as f64 / target.unit_secs as f64 * ASSIGNED_PART,
    );
    let unit = target.unit_secs;
    let mut per_fill = (share * unit as f64).floor().min(f64::from(u32::MAX)) as u32;
    let in_force = now < lease.t0 + ttl;
    if let Sent::Bucket {
        tokens_per_fill,
        fill_secs,
        ..
    } = state.sent
        && in_force
        && fill_secs == unit
        && per_fill.abs_diff(tokens_per_fill) <= (tokens_per_fill / 10).max(1)
        && u64::from(tokens_per_fill) <= target.per_unit
    {
        per_fill = tokens_per_fill;
    }
    // A new token bucket starts full beside the old one, which may admit until the new one
    // arrives; the same one carries on.
    let replaced = lease.entitled(now + DELIVERY_SLACK);
    let carried = lease.entitled(now);
    let cover = (ttl + DELIVERY_SLACK).as_secs_f64();
    let plan = |per_fill: u32| {
        let rate = f64::from(per_fill) / unit as f64;
        let max_tokens = ((rate * BURST_SECS).ceil() as u32).max(1);
        let sent = Sent::Bucket {
            max_tokens,
            tokens_per_fill: per_fill,
            fill_secs: unit,
        };
        let fresh = !(in_force && state.sent == sent);
        let base = if fresh {
            replaced + f64::from(max_tokens)
        } else {
            carried
        };
        let needed = need(base + rate * cover - lease.known_lost);
        (sent, rate, base, needed, fresh)
    };
    // Nothing to assign: deny, holding what the last assignment may still admit.
    let deny = (
        Sent::Blanket(BlanketRule::DenyAll),
        0.0,
        replaced,
        need(replaced - lease.known_lost),
        true,
    );
    let (mut sent, mut rate, mut base, mut needed, mut fresh) = match per_fill {
        0 => deny,
        _ => plan(per_fill),
    };
    let request = lease.target.request()?;
    let (give, want) = (
        lease.held.saturating_sub(needed),
        needed.saturating_sub(lease.held),
    );
    let grant = match shared.leases.exchange(&request, give, want).await {
        Ok(grant) => grant,
        Err(error) => {
            tracing::warn!(%error, "rlqs: withdrawing units failed");
            return None;
        }
    };
    lease.held = lease.held - give + grant.granted;
    // A token bucket already assigned leaves the budget's reserve to the buckets that have
    // none (a proxy that joins is served by its first report); they may spend it.
    let into_reserve = match state.sent {
        Sent::Bucket { .. } => target
            .reserve
            .saturating_sub(grant.decision.remaining())
            .min(grant.granted),
        _ => 0,
    };
    let usable = lease.held - into_reserve;
    if usable < needed {
        // The budget is short: the largest token bucket the units held pay for, else deny.
        let mut fit = per_fill;
        (sent, rate, base, needed, fresh) = loop {
            fit = fit.saturating_sub((fit / 16).max(1));
            if fit == 0 {
                break deny;
            }
            let planned = plan(fit);
            if planned.3 <= usable {
                break planned;
            }
        };
        if lease.held > needed {
            match shared
                .leases
                .exchange(&request, lease.held - needed, 0)
                .await
            {
                Ok(_) => lease.held = needed,
                Err(error) => tracing::warn!(%error, "rlqs: giving back units failed"),
            }
        }
    }
    shared.set_assigned(lease, rate);
    lease.base = base;
    lease.rate = rate;
    lease.t0 = now;
    lease.cover_end = now + ttl + DELIVERY_SLACK;
    if fresh {
        lease.prev_max_tokens = lease.max_tokens;
        lease.max_tokens = match sent {
            Sent::Bucket { max_tokens, .. } => f64::from(max_tokens),
            _ => 0.0,
        };
    }
    state.sent = sent;
    Some(assignment(&state.id, strategy_of(sent)?, ttl))
}

fn strategy_of(sent: Sent) -> Option<RateLimitStrategy> {
    let strategy = match sent {
        Sent::Nothing => return None,
        Sent::Blanket(rule) => Strategy::BlanketRule(rule as i32),
        Sent::Bucket {
            max_tokens,
            tokens_per_fill,
            fill_secs,
        } => Strategy::TokenBucket(TokenBucket {
            max_tokens,
            tokens_per_fill: Some(UInt32Value {
                value: tokens_per_fill,
            }),
            fill_interval: Some(PbDuration {
                seconds: i64::try_from(fill_secs).unwrap_or(i64::MAX),
                nanos: 0,
            }),
        }),
    };
    Some(RateLimitStrategy {
        strategy: Some(strategy),
    })
}

fn assignment(id: &BucketId, strategy: RateLimitStrategy, ttl: Duration) -> BucketAction {
    BucketAction {
        bucket_id: Some(id.clone()),
        bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(PbDuration {
                seconds: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
                nanos: 0,
            }),
            rate_limit_strategy: Some(strategy),
        })),
    }
}
