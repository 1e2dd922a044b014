//! The store of a shipped binary (feature `store`): [`build`] assembles it (memory, or Redis
//! behind a circuit breaker, in leases) from one set of flags for every binary ([`StoreArgs`], a
//! `clap::Args` that binaries flatten). A Redis that does not answer at start does not stop the
//! process (an outage is when pods restart): the failure mode answers (the fallback's share of
//! each limit, fail open or fail closed) while a task connects in the background with a
//! backoff, and [`RedisStatus`] tells readiness probes and metrics where it stands.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlimit_core::{
    BreakerState, Decision, Error, Grant, LeaseStore, NotDurable, NotSent, Observer, Outcome,
    PermitDecision, PermitId, PermitRequest, PermitStore, Request, Settle, Store,
};
use distlimit_hybrid::{FailureMode, Hybrid};
use distlimit_lease::Leased;
use distlimit_memory::MemoryStore;
use distlimit_metrics::Metrics;
use distlimit_redis::region::spawn_region_sweeper;
use distlimit_redis::{HomeUnreachable, RedisStore, RedisStoreBuilder, RegionBuilder, RegionStore};

/// The name of the Redis store in metrics and logs.
pub const REDIS_STORE: &str = "redis";

/// The most instances `--instances` accepts: beyond it each one's share of a limit rounds to
/// nothing useful.
pub const MAX_INSTANCES: u64 = 10_000;

/// The longest Redis budget `--redis-budget-ms` accepts: one minute.
pub const MAX_REDIS_BUDGET_MS: u64 = 60_000;

/// `--redis-durable-timeout-ms` unless given: 40 ms, below the default `--redis-budget-ms`
/// (50).
pub const DEFAULT_DURABLE_TIMEOUT_MS: u64 = 40;

/// The first wait between connection attempts to a Redis that did not answer at start; it
/// doubles up to [`MAX_RECONNECT_BACKOFF`].
pub const MIN_RECONNECT_BACKOFF: Duration = Duration::from_millis(100);

/// The longest wait between connection attempts to a Redis that did not answer at start.
pub const MAX_RECONNECT_BACKOFF: Duration = Duration::from_secs(2);

/// The store flags every binary shares (flatten them with `#[command(flatten)]`).
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct StoreArgs {
    /// Share the limits through this Redis: redis://host:port, rediss://…, unix:///path,
    /// redis+sentinel://host:port[,host:port…]/service or redis+cluster://host:port[,host:port…].
    /// Without it, the embedded memory store limits this process alone. A Redis that does not
    /// answer at start is connected in the background while the failure mode answers.
    #[arg(long, value_name = "URL")]
    pub redis: Option<String>,

    /// How many instances share the Redis limits (1 to 10000): while Redis is unreachable each
    /// instance enforces 1/N of each limit on its own.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=MAX_INSTANCES))]
    pub instances: u64,

    /// Time budget of one Redis decision, in milliseconds (1 to 60000); past it the failure
    /// mode answers and the circuit breaker opens.
    #[arg(long, value_name = "MS", default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=MAX_REDIS_BUDGET_MS))]
    pub redis_budget_ms: u64,

    /// Time limit of one Redis reply, in milliseconds (the store's own; the budget above bounds
    /// the whole decision).
    #[arg(long, value_name = "MS", default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=MAX_REDIS_BUDGET_MS))]
    pub redis_timeout_ms: u64,

    /// Durable decisions: answer an admission only once this many replicas hold its write
    /// (Redis `WAIT`, one per script call, on the same connection), so that a failover to a
    /// replica cannot admit again what was admitted; when fewer acknowledge within
    /// `--redis-durable-timeout-ms` the failure mode answers (pair it with `fail-closed` for a
    /// hard quota). Standalone with replicas, Sentinel, or Cluster (N replicas of each
    /// shard). Off when absent.
    #[arg(long, value_name = "N", requires = "redis", value_parser = clap::value_parser!(u32).range(1..))]
    pub redis_durable_replicas: Option<u32>,

    /// With `--redis-durable-replicas`: how long `WAIT` waits for the replicas, in milliseconds
    /// (1 to 60000); below `--redis-timeout-ms` and `--redis-budget-ms`, which bound the whole
    /// decision.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_DURABLE_TIMEOUT_MS, requires = "redis_durable_replicas", value_parser = clap::value_parser!(u64).range(1..=MAX_REDIS_BUDGET_MS))]
    pub redis_durable_timeout_ms: u64,

    /// What decisions do while Redis cannot decide: `fallback` (this instance enforces its
    /// share of each limit; the default), `fail-open` (admit) or `fail-closed` (answer an
    /// error). With `--redis-durable-replicas`, state it: the default is refused there.
    #[arg(long, value_enum, value_name = "MODE")]
    pub failure_mode: Option<FailureModeArg>,

    /// Spend this policy's limit from token leases (repeat for several): each instance
    /// withdraws units from Redis ahead of use and spends them in memory, so a hot key costs
    /// about one Redis call per lease instead of one per request, and the instances together
    /// never admit more than the limit. Token bucket and GCRA tiers lease; other tiers decide
    /// in Redis as usual. Only with `--redis`.
    #[arg(long = "lease", value_name = "POLICY", requires = "redis")]
    pub lease: Vec<String>,

    /// One limit across regions: the flags of [`RegionArgs`].
    #[command(flatten)]
    pub region: RegionArgs,
}

/// One limit across regions ([`RegionStore`]): `--redis-home`, `--region-horizon-ms`,
/// `--home-unreachable`. With `--redis-home`, `--redis` is this region's Redis.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct RegionArgs {
    /// One limit across regions: this Redis (the home region's) holds each limit's global
    /// budget, and `--redis` is this region's own Redis. Decisions spend units from pools in
    /// this region's Redis, at its latency; the pools are refilled from home ahead of need, so
    /// all regions together never admit more than the limit. May be the same server as
    /// `--redis` (in the home region). Only with `--redis`.
    #[arg(long, value_name = "URL", requires = "redis")]
    pub redis_home: Option<String>,

    /// How long units leased from home stay in this region's pool before they go back home,
    /// and how long a refill aims to last, in milliseconds (1 to 60000). Keep it several times
    /// the round trip to home. Only with `--redis-home`.
    #[arg(long, value_name = "MS", default_value_t = crate::args::millis(distlimit_redis::region::DEFAULT_REGION_HORIZON), value_parser = clap::value_parser!(u64).range(1..=MAX_REDIS_BUDGET_MS), requires = "redis_home")]
    pub region_horizon_ms: u64,

    /// What a request this region's pool cannot pay gets while home is unreachable: `deny`
    /// (the limit holds) or `allow` (fail open for that key in this region until home answers).
    /// Only with `--redis-home`.
    #[arg(long, value_enum, value_name = "ANSWER", default_value_t = HomeUnreachableArg::Deny, requires = "redis_home")]
    pub home_unreachable: HomeUnreachableArg,
}

/// `--home-unreachable`: the region store's [`HomeUnreachable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HomeUnreachableArg {
    /// Denied: the limit holds.
    Deny,
    /// Admitted: the key is not limited in this region until home answers.
    Allow,
}

impl From<HomeUnreachableArg> for HomeUnreachable {
    fn from(answer: HomeUnreachableArg) -> Self {
        match answer {
            HomeUnreachableArg::Deny => HomeUnreachable::Deny,
            HomeUnreachableArg::Allow => HomeUnreachable::Allow,
        }
    }
}

/// `--failure-mode`: the hybrid store's [`FailureMode`] for every policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FailureModeArg {
    /// The local fallback store decides, with `1/--instances` of each limit.
    Fallback,
    /// Admit unchecked.
    FailOpen,
    /// Answer an error.
    FailClosed,
}

impl From<FailureModeArg> for FailureMode {
    fn from(mode: FailureModeArg) -> Self {
        match mode {
            FailureModeArg::Fallback => FailureMode::Fallback,
            FailureModeArg::FailOpen => FailureMode::FailOpen,
            FailureModeArg::FailClosed => FailureMode::FailClosed,
        }
    }
}

impl StoreArgs {
    /// The Redis time budget.
    pub fn redis_budget(&self) -> Duration {
        Duration::from_millis(self.redis_budget_ms)
    }

    /// Durable decisions: the replicas required and `WAIT`'s timeout, if asked for.
    pub fn redis_durable(&self) -> Option<(u32, Duration)> {
        self.redis_durable_replicas
            .map(|n| (n, Duration::from_millis(self.redis_durable_timeout_ms)))
    }
}

/// Why the store could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis refused the configuration: an invalid URL, rejected credentials, an unknown
    /// Sentinel service (the error names Redis itself). An unreachable Redis is no error.
    #[error(transparent)]
    Redis(#[from] distlimit_core::Error),
    /// The hybrid store's configuration was refused.
    #[error("hybrid store: {0}")]
    Hybrid(#[from] distlimit_hybrid::ConfigError),
}

/// Where a binary's Redis stands, for readiness and metrics. Cheap to clone.
#[derive(Clone)]
pub struct RedisStatus {
    hybrid: Arc<Hybrid<RedisPrimary, MemoryStore>>,
}

impl std::fmt::Debug for RedisStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStatus")
            .field("connected", &self.is_connected())
            .field("breaker", &self.breaker_state())
            .finish()
    }
}

impl RedisStatus {
    /// Whether a connection to Redis has been made (at start, or later in the background).
    pub fn is_connected(&self) -> bool {
        self.hybrid.primary().shared.store.get().is_some()
    }

    /// The circuit breaker's state: `Open` while the failure mode answers.
    pub fn breaker_state(&self) -> BreakerState {
        self.hybrid.breaker_state()
    }

    /// Whether Redis decides now: connected and the breaker not open.
    pub fn is_deciding(&self) -> bool {
        self.is_connected() && self.breaker_state() != BreakerState::Open
    }
}

/// A store assembled by [`build`].
#[derive(Clone)]
pub struct BuiltStore {
    /// The store.
    pub store: Arc<dyn Store>,
    /// The concurrency permits (requests in flight) on the same backend: the memory store, or
    /// the hybrid store of Redis and memory (never leased).
    pub permits: Arc<dyn PermitStore>,
    /// Token leases on the same backend (the memory store, or the hybrid store; never
    /// `--lease`'s wrapper): units withdrawn ahead of use and given back unspent.
    pub leases: Arc<dyn LeaseStore>,
    /// Where Redis stands (`None` on the memory store).
    pub redis: Option<RedisStatus>,
}

impl std::fmt::Debug for BuiltStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltStore")
            .field("redis", &self.redis)
            .finish_non_exhaustive()
    }
}

/// Builds the store of `args`, reporting to `metrics`: memory without `--redis`, else Redis
/// behind a circuit breaker with a memory fallback holding `1/--instances` of each limit, in
/// token leases for the `--lease` policies. A Redis that does not answer is connected in the
/// background (every 100 ms to 2 s) while the failure mode answers. Needs a Tokio runtime.
///
/// # Errors
///
/// A Redis configuration Redis refuses (a bad URL, rejected credentials), or a refused hybrid
/// configuration.
pub async fn build(args: &StoreArgs, metrics: &Metrics) -> Result<BuiltStore, StoreError> {
    let Some(url) = &args.redis else {
        tracing::info!("store: memory (this process only)");
        let memory = Arc::new(MemoryStore::new());
        return Ok(BuiltStore {
            store: memory.clone(),
            permits: memory.clone(),
            leases: memory,
            redis: None,
        });
    };
    let reply_timeout = Duration::from_millis(args.redis_timeout_ms);
    let mut builder = RedisStore::builder(url.as_str())
        .response_timeout(reply_timeout)
        // Calls in flight, decisions queued and decisions per coalesced call, on `/metrics`.
        .observer(Arc::new(metrics.clone()));
    if let Some((replicas, timeout)) = args.redis_durable() {
        // The default fallback would answer every admission not made durable from memory.
        if args.failure_mode.is_none() {
            return Err(StoreError::Redis(Error::Config {
                store: REDIS_STORE,
                message: "--redis-durable-replicas needs a failure mode stated: \
                          --failure-mode fail-closed for a hard quota, or --failure-mode \
                          fallback to let each instance admit its share of a limit from memory \
                          when the replicas do not acknowledge (not durable)"
                    .to_owned(),
            }));
        }
        // The budget bounds the whole decision: a WAIT that may outlast it would never answer.
        if timeout >= args.redis_budget() {
            return Err(StoreError::Redis(Error::Config {
                store: REDIS_STORE,
                message: format!(
                    "--redis-durable-timeout-ms ({} ms) must be below --redis-budget-ms ({} ms)",
                    args.redis_durable_timeout_ms, args.redis_budget_ms
                ),
            }));
        }
        tracing::info!(
            "durable decisions: each admission waits for {replicas} replica(s), at most {timeout:?}"
        );
        // Redis ends a WAIT at its next tick (every 100 ms at its default `hz` of 10).
        if timeout + Duration::from_millis(100) >= args.redis_budget() {
            tracing::warn!(
                "durable decisions: a WAIT lasts up to {timeout:?} plus a Redis tick (100 ms at \
                 hz 10), past --redis-budget-ms ({} ms): too few replicas then show as timeouts; \
                 raise --redis-budget-ms or Redis's hz",
                args.redis_budget_ms
            );
        }
        builder = builder.durable(replicas, timeout);
    }
    let mode = FailureMode::from(args.failure_mode.unwrap_or(FailureModeArg::Fallback));
    let meanwhile = format!("failure mode {mode:?}");
    let home = match &args.region.redis_home {
        None => None,
        Some(home) => {
            let horizon = Duration::from_millis(args.region.region_horizon_ms);
            let answer = HomeUnreachable::from(args.region.home_unreachable);
            tracing::info!(
                "one limit across regions: units leased from the home Redis, horizon {horizon:?}, \
                 home unreachable: {answer:?}"
            );
            let home = RedisStore::builder(home.as_str()).response_timeout(reply_timeout);
            let pools = format!("the region's pools, then {answer:?},");
            Some(Home {
                store: RedisPrimary::start(home, None, "redis home", &pools).await?,
                region: RegionStore::builder()
                    .horizon(horizon)
                    .home_unreachable(answer),
                sweep_every: horizon,
            })
        }
    };
    let redis = RedisPrimary::start(builder, home, REDIS_STORE, &meanwhile).await?;
    tracing::info!(
        "store: redis, failure mode {mode:?}, memory fallback with 1/{} of each limit",
        args.instances
    );
    let hybrid = Arc::new(
        Hybrid::builder(redis, MemoryStore::new())
            .name(REDIS_STORE)
            .budget(args.redis_budget())
            .instances(args.instances)
            .default_failure_mode(mode)
            .observer(Arc::new(LogTransitions {
                metrics: metrics.clone(),
                mode,
                not_durable: std::sync::Mutex::new(None),
            }))
            .build()?,
    );
    metrics.set_breaker_state(REDIS_STORE, hybrid.breaker_state());
    let status = Some(RedisStatus {
        hybrid: hybrid.clone(),
    });
    let permits: Arc<dyn PermitStore> = hybrid.clone();
    let leases: Arc<dyn LeaseStore> = hybrid.clone();
    let store: Arc<dyn Store> = if args.lease.is_empty() {
        hybrid
    } else {
        tracing::info!("token leases for the policies {:?}", args.lease);
        let leased = Arc::new(
            Leased::for_limiter_policies(args.lease.iter().map(String::as_str))
                .observer(Arc::new(metrics.clone()))
                .build(hybrid),
        );
        distlimit_lease::spawn_sweeper(&leased, distlimit_lease::DEFAULT_HORIZON);
        leased
    };
    Ok(BuiltStore {
        store,
        permits,
        leases,
        redis: status,
    })
}

/// The hybrid store's observer: the metrics, and one log line per breaker transition (the
/// switch to the failure mode at WARN, naming too few replicas when the last error was
/// [`NotDurable`]; the return to Redis at INFO), never one per request.
struct LogTransitions {
    metrics: Metrics,
    mode: FailureMode,
    /// Whether the last store error was too few replicas, and how few.
    not_durable: std::sync::Mutex<Option<NotDurable>>,
}

impl Observer for LogTransitions {
    fn on_decision(&self, policy: &str, outcome: Outcome, decision: &Decision, latency: Duration) {
        self.metrics.on_decision(policy, outcome, decision, latency);
    }

    fn on_store_error(&self, store: &'static str, policy: &str, error: &Error) {
        self.metrics.on_store_error(store, policy, error);
        if let Ok(mut last) = self.not_durable.lock() {
            *last = NotDurable::of(error).cloned();
        }
    }

    fn on_breaker(&self, store: &'static str, from: BreakerState, to: BreakerState) {
        self.metrics.on_breaker(store, from, to);
        match to {
            BreakerState::Open if from == BreakerState::Closed => {
                let mode = self.mode;
                let why = match self.not_durable.lock().ok().and_then(|last| last.clone()) {
                    Some(short) => format!(
                        "durability: {store} answers but its writes are {short}; failure mode \
                         {mode:?} answers until they are acknowledged"
                    ),
                    None => format!(
                        "circuit breaker open, failure mode {mode:?} answers until {store} \
                         answers again"
                    ),
                };
                tracing::warn!("{store}: {why}");
            }
            BreakerState::Closed => {
                tracing::info!("{store}: circuit breaker closed, {store} decides again")
            }
            _ => tracing::debug!("{store}: circuit breaker {from:?} -> {to:?}"),
        }
    }

    fn on_evict(&self, store: &'static str, evicted: u64) {
        self.metrics.on_evict(store, evicted);
    }
}

/// Redis, connected now or later: until a connection is made every call fails with an
/// [`Error::Unavailable`] that was [`NotSent`], which the hybrid store answers with its failure
/// mode. With a [`Home`], this Redis is a region's: once connected, decisions go through a
/// [`RegionStore`] spending from its pools.
#[derive(Clone, Debug)]
struct RedisPrimary {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    store: OnceLock<Connected>,
    home: Option<Home>,
    /// `redis`, or `redis home`: in logs.
    name: &'static str,
}

/// What a region's Redis needs for its [`RegionStore`] (`--redis-home`): the home Redis, whose
/// unreachability is the region store's to answer ([`HomeUnreachable`]), the region store's
/// settings, and how often pools gone quiet are swept ([`RegionStore::sweep`]: their due units
/// go home).
#[derive(Debug)]
struct Home {
    store: RedisPrimary,
    region: RegionBuilder,
    sweep_every: Duration,
}

/// The store decisions go to once connected.
#[derive(Debug)]
enum Connected {
    Redis(RedisStore),
    Region(RegionStore<RedisPrimary>),
}

/// `$call` on the store decisions go to, whichever it is.
macro_rules! on_connected {
    ($connected:expr, |$store:ident| $call:expr) => {
        match $connected {
            Connected::Redis($store) => $call,
            Connected::Region($store) => $call,
        }
    };
}

impl RedisPrimary {
    /// Connects with `builder`; when Redis does not answer (a refused connection, a timeout),
    /// returns at once and keeps connecting in the background, logging the first failure at
    /// WARN (naming `meanwhile`, what answers until then) and the connection at INFO. `name`
    /// names it in logs.
    ///
    /// Errors: those of [`RedisStoreBuilder::connect`] that retrying cannot fix (not
    /// [transient](Error::is_transient)): a bad URL, rejected credentials.
    async fn start(
        builder: RedisStoreBuilder,
        home: Option<Home>,
        name: &'static str,
        meanwhile: &str,
    ) -> Result<Self, Error> {
        let shared = Arc::new(Shared {
            home,
            name,
            ..Shared::default()
        });
        match builder.clone().connect().await {
            Ok(store) => {
                tracing::info!("{name}: connected ({:?})", store.mode());
                shared.set(store);
            }
            Err(error) if error.is_transient() => {
                tracing::warn!(
                    "{name}: {error}; starting without it, {meanwhile} answers until it does \
                     (retrying every {MIN_RECONNECT_BACKOFF:?} to {MAX_RECONNECT_BACKOFF:?})"
                );
                tokio::spawn(reconnect(Arc::downgrade(&shared), builder));
            }
            Err(error) => return Err(error),
        }
        Ok(Self { shared })
    }

    fn store(&self) -> Result<&Connected, Error> {
        self.shared.store.get().ok_or_else(|| Error::Unavailable {
            store: REDIS_STORE,
            source: Box::new(NotSent("not connected yet".into())),
        })
    }

    /// Where permits live: the Redis store, or with `--redis-home` the region's own Redis
    /// (a concurrency limit holds per region: permits are not leased from home).
    fn permits(&self) -> Result<&RedisStore, Error> {
        Ok(match self.store()? {
            Connected::Redis(store) => store,
            Connected::Region(store) => store.region(),
        })
    }
}

impl Shared {
    /// Decisions go to `store` from now on (through a region store with a home).
    fn set(&self, store: RedisStore) {
        let connected = match &self.home {
            None => Connected::Redis(store),
            Some(home) => {
                let region = home.region.clone().build(home.store.clone(), store);
                spawn_region_sweeper(&region, home.sweep_every);
                Connected::Region(region)
            }
        };
        let _ = self.store.set(connected);
    }
}

/// Connects until it succeeds or the store is dropped; a non-transient error is logged at
/// ERROR each time its message changes and retried too (a password fixed in Redis).
async fn reconnect(shared: std::sync::Weak<Shared>, builder: RedisStoreBuilder) {
    let mut backoff = MIN_RECONNECT_BACKOFF;
    let mut last = String::new();
    loop {
        tokio::time::sleep(backoff).await;
        let Some(target) = shared.upgrade() else {
            return;
        };
        let name = target.name;
        match builder.clone().connect().await {
            Ok(store) => {
                tracing::info!("{name}: connected ({:?}); it decides again", store.mode());
                target.set(store);
                return;
            }
            Err(error) => {
                let message = error.to_string();
                if message != last {
                    if error.is_transient() {
                        tracing::debug!("{name}: still unreachable: {message}");
                    } else {
                        tracing::error!("{name}: {message}; retrying");
                    }
                    last = message;
                }
            }
        }
        backoff = (backoff * 2).min(MAX_RECONNECT_BACKOFF);
    }
}

#[async_trait]
impl Store for RedisPrimary {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        on_connected!(self.store()?, |store| store.decide(request).await)
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        on_connected!(self.store()?, |store| store.decide_all(requests).await)
    }

    fn decide_now(&self, request: &Request<'_>) -> Option<Result<Decision, Error>> {
        // Not connected: the asynchronous path fails, and the hybrid store answers.
        on_connected!(self.shared.store.get()?, |store| store.decide_now(request))
    }

    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        on_connected!(self.store()?, |store| store.settle_all(settles).await)
    }
}

#[async_trait]
impl LeaseStore for RedisPrimary {
    async fn exchange(
        &self,
        request: &Request<'_>,
        give_back: u64,
        want: u64,
    ) -> Result<Grant, Error> {
        on_connected!(self.store()?, |store| store
            .exchange(request, give_back, want)
            .await)
    }
}

#[async_trait]
impl PermitStore for RedisPrimary {
    async fn acquire(&self, request: &PermitRequest<'_>) -> Result<PermitDecision, Error> {
        self.permits()?.acquire(request).await
    }

    async fn release(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        self.permits()?.release(request, permit).await
    }

    async fn renew(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        self.permits()?.renew(request, permit).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        store: StoreArgs,
    }

    #[tokio::test]
    async fn a_durable_wait_that_may_outlast_the_budget_is_refused() {
        let args = |flags: &str| {
            let base = "test --redis redis://127.0.0.1:1 --failure-mode fail-closed";
            let line = format!("{base} --redis-durable-replicas 1 {flags}");
            Flags::try_parse_from(line.split_whitespace())
                .unwrap()
                .store
        };
        let metrics = Metrics::new();
        let refused = args("--redis-durable-timeout-ms 50");
        match build(&refused, &metrics).await {
            Err(StoreError::Redis(Error::Config { message, .. })) => {
                assert!(message.contains("--redis-budget-ms"), "{message}");
            }
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("a WAIT timeout of the budget's length was accepted"),
        }
        // Below the budget but not below the reply timeout: the store refuses it.
        let refused = args("--redis-durable-timeout-ms 300 --redis-budget-ms 1000");
        assert!(matches!(
            build(&refused, &metrics).await,
            Err(StoreError::Redis(Error::Config { .. }))
        ));
    }
}
