#![doc = include_str!("../README.md")]

mod app;
mod args;
mod generate;
mod tokens;
/// Serving with the hardened defaults of every server this project ships ([`distlimit_serve`]).
pub use distlimit_serve as serve;

use std::future::Future;
use std::io;
use std::sync::Arc;

use axum::Router;
use axum::http::HeaderName;
use distlimit_core::Store;
use distlimit_metrics::Metrics;
use distlimit_policy::{Limiter, PolicyConfigError, PolicyFile, PolicySet};
use distlimit_serve::FileWatcher;
use distlimit_serve::store::StoreError;
use distlimit_tower::TrustedProxies;
use tokio::net::TcpListener;

pub use crate::app::{
    ApiLimits, DATA_BODY, MAX_DELAY_MS, MAX_STREAM_TOKENS, MAX_TOKENS, api_limits, api_limits_with,
    router,
};
pub use crate::args::Args;
pub use crate::generate::{GENERATE_POLICY, generate_in_flight, generate_limit};
pub use distlimit_serve::{ServeConfig, serve, shutdown_signal};

/// The policy limiting each user of `/api/data`; a `--policy` file must define it.
pub const POLICY: &str = "api";

/// The policy limiting each client IP on `/api/data`, whatever users it names; a `--policy`
/// file must define it.
pub const IP_POLICY: &str = "api-ip";

/// The header naming the user; requests without it are limited by client IP.
pub const USER_HEADER: HeaderName = HeaderName::from_static("x-user-id");

/// The policy limiting the tokens each user of `/api/generate` uses, charged from the response
/// ([`USAGE_HEADER`]); without it in a `--policy` file the route is not served. Its tiers must
/// be token buckets or GCRA (the window algorithms cannot carry debt).
pub const TOKENS_POLICY: &str = "tokens";

/// The response header of `/api/generate` saying how many tokens the answer used.
pub const USAGE_HEADER: HeaderName = HeaderName::from_static("x-usage-tokens");

/// The policies without `--policy`: [`POLICY`], [`IP_POLICY`] and [`TOKENS_POLICY`] as token
/// buckets.
pub const DEFAULT_POLICIES: &str = r#"
[[policy]]
name = "api"
tiers = [{ name = "burst", algorithm = "token_bucket", limit = 60, per = "1m", burst = 100 }]

[[policy]]
name = "api-ip"
tiers = [{ name = "client", algorithm = "token_bucket", limit = 600, per = "1m", burst = 1000 }]

[[policy]]
name = "tokens"
tiers = [{ name = "minute", algorithm = "token_bucket", limit = 10000, per = "1m" }]
"#;

/// What a reload of the `--policy` file did: the binaries' one reload event, its `Rejected`
/// error the policy file's.
pub type PolicyReload = distlimit_serve::Reload<PolicyConfigError>;

/// How often a `--policy` file is checked for changes.
pub const RELOAD_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The policy file is invalid.
    #[error("policy: {0}")]
    Policy(#[from] PolicyConfigError),
    /// The policy file does not define [`POLICY`] or [`IP_POLICY`].
    #[error("policy: the file must define the policy \"{0}\" that /api/data uses")]
    MissingPolicy(&'static str),
    /// The store's configuration was refused: Redis refused it (an invalid URL, rejected
    /// credentials; the error names Redis itself) or the hybrid store did. An unreachable Redis
    /// is no error: the binary starts, the failure mode answers, and Redis is connected in the
    /// background.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The concurrency limit of `/api/generate` (`--max-in-flight`, `--in-flight-lease-ms`)
    /// was refused. (A policy [`GENERATE_POLICY`] without `max_in_flight` is a
    /// [`Policy`](Self::Policy) error.)
    #[error("the concurrency limit of /api/generate: {0}")]
    ConcurrencyLimit(distlimit_core::Error),
    /// The listening address could not be bound (in use, or not this host's).
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address of `--listen`.
        addr: std::net::SocketAddr,
        /// Why binding failed.
        source: io::Error,
    },
}

/// The service, built from [`Args`] and ready to [`serve`](Demo::serve).
#[derive(Debug)]
pub struct Demo {
    router: Router,
    metrics: Metrics,
    limiter: Arc<Limiter>,
    watcher: Option<FileWatcher<PolicyConfigError>>,
    serve_config: ServeConfig,
}

impl Demo {
    /// Builds the store (memory, or Redis behind a circuit breaker with a memory fallback), the
    /// limiter with its policies (starting the hot reload of `--policy`), the metrics and the
    /// routes. Needs a Tokio runtime.
    ///
    /// # Errors
    ///
    /// An invalid policy file, or a Redis configuration Redis refuses.
    pub async fn build(args: &Args) -> Result<Self, StartError> {
        let policies = match &args.policy {
            Some(path) => PolicySet::from_toml_file(path)?,
            None => PolicySet::from_toml_str(DEFAULT_POLICIES)?,
        };
        for name in [POLICY, IP_POLICY] {
            if policies.get(name).is_none() {
                return Err(StartError::MissingPolicy(name));
            }
        }
        let metrics = Metrics::new();
        let built = distlimit_serve::store::build(&args.store, &metrics).await?;
        let limiter = limiter(built.store, policies, &metrics);
        // A reload that drops a policy the routes use is refused, the running set kept.
        for name in [POLICY, IP_POLICY] {
            limiter.declare(name)?;
        }
        if limiter.policies().get(TOKENS_POLICY).is_some() {
            limiter.declare(TOKENS_POLICY)?;
        }
        // SIGHUP rereads the policy file at once instead of ending the process.
        let flags = distlimit_core::PermitLimit::new(
            args.max_in_flight,
            std::time::Duration::from_millis(args.in_flight_lease_ms),
        )
        .map_err(|e| StartError::ConcurrencyLimit(e.into()))?;
        let generate = generate_in_flight(&limiter.policies(), flags)?;
        let what = match &args.policy {
            Some(_) => "reading the policy file now",
            None => "ignored (no --policy to reload)",
        };
        let hangup = distlimit_serve::hangup_signal(what);
        let watcher = args
            .policy
            .as_ref()
            .map(|path| watch_policy(limiter.clone(), path.clone(), hangup, (generate, flags)));
        let trusted = TrustedProxies::new(args.trusted_proxies.iter().copied());
        let mut limits = api_limits_with(limiter.clone(), trusted.clone(), args.stream_block);
        let in_flight = generate_limit(built.permits, generate, trusted, Arc::new(metrics.clone()))
            .map_err(StartError::ConcurrencyLimit)?;
        limits.in_flight = Some(in_flight);
        Ok(Self {
            router: router(Some(limits), metrics.clone()),
            metrics,
            limiter,
            watcher,
            serve_config: args.serve.serve_config(),
        })
    }

    /// The routes.
    pub fn router(&self) -> Router {
        self.router.clone()
    }

    /// The metrics `/metrics` serves.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The policy file's reload events (`None` without `--policy`): await `changed()` on the
    /// receiver to learn that a version was applied or rejected.
    pub fn policy_reloads(&self) -> Option<tokio::sync::watch::Receiver<PolicyReload>> {
        self.watcher.as_ref().map(FileWatcher::subscribe)
    }

    /// The limiter behind `/api/data`.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// Binds `addr` for [`serve`](Self::serve).
    ///
    /// # Errors
    ///
    /// [`StartError::Listen`], naming `addr`.
    pub async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, StartError> {
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Listen { addr, source })
    }

    /// Serves on `listener` with the limits of the flags until `shutdown` completes (see
    /// [`serve()`]). Policy reloads are logged by the watcher.
    ///
    /// # Errors
    ///
    /// Those of the listener.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        let _watcher = self.watcher;
        serve(listener, self.router, self.serve_config, shutdown).await
    }
}

/// Polls the policy file at `path` (every [`RELOAD_INTERVAL`], and at once when `hangup`
/// changes) through the one file poller, as the policy crate's [`PolicyFile`]: a changed file
/// that parses and keeps the declared policies replaces the running set; any other is refused
/// and the set kept.
///
/// `generate` is the concurrency limit `/api/generate` runs with and the flags' limit: a set
/// that would give the route another one ([`generate_in_flight`]) is applied all the same (its
/// rate limits take effect), with a warning that the concurrency limit stays until a restart.
fn watch_policy(
    limiter: Arc<Limiter>,
    path: std::path::PathBuf,
    hangup: tokio::sync::watch::Receiver<u64>,
    (generate, flags): (distlimit_core::PermitLimit, distlimit_core::PermitLimit),
) -> FileWatcher<PolicyConfigError> {
    let file = PolicyFile::new(&limiter, path).inspect(move |set| {
        let next = generate_in_flight(set, flags);
        if next.as_ref() != Ok(&generate) {
            tracing::warn!(
                running = ?generate,
                file = ?next,
                "the concurrency limit of /api/generate ({GENERATE_POLICY}) is fixed at start: \
                 the reloaded file's is not applied until a restart"
            );
        }
    });
    let runtime = tokio::runtime::Handle::current();
    distlimit_serve::poll_files(&runtime, "policy file", file, RELOAD_INTERVAL, Some(hangup))
}

/// A limiter on `store` reporting to `metrics`.
pub fn limiter(store: Arc<dyn Store>, policies: PolicySet, metrics: &Metrics) -> Arc<Limiter> {
    Arc::new(Limiter::new(store, policies).with_observer(Arc::new(metrics.clone())))
}

/// The workspace README's Rust examples, compiled (and run where they are not `no_run`) as
/// this crate's doctests, so the README's code stays code that builds.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct WorkspaceReadme;
