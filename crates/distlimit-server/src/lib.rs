#![doc = include_str!("../README.md")]

pub mod answer;
mod args;
pub mod check;
pub mod config;
pub mod grpc;
pub mod http;
mod metrics;
mod net;
mod permits;
mod reload;
pub mod rlqs;

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use distlimit_metrics::Metrics;
use distlimit_serve::TlsWatcher;
use distlimit_serve::store::{BuiltStore, StoreError};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::server::NamedService;
use tonic_health::ServingStatus::{NotServing, Serving};

pub use crate::args::{Args, DEFAULT_GRPC_IDLE_TIMEOUT_MS, EnvError};
pub use crate::check::{CheckError, CheckRequest, CheckResponse, Checker};
pub use crate::config::{Config, RateLimitConfigError};
pub use crate::grpc::RateLimitGrpc;
pub use crate::metrics::{
    LoadResult, Protocol, RequestMetrics, RequestResult, UNCONFIGURED_DOMAIN,
};
pub use crate::permits::{JsonAcquired, JsonHeld, JsonPermit};
pub use crate::reload::{Reload, Watcher};
pub use crate::rlqs::{QuotaArgs, QuotaService};
/// Completes at Ctrl-C or SIGTERM; installed when called, so an early signal is not lost.
pub use distlimit_serve::shutdown_signal;
/// The TLS of both ports (`--tls-cert`), its errors and its reload events.
pub use distlimit_serve::{Tls, TlsError, TlsFiles, TlsReload};

/// The gRPC health service name that reports Redis: `SERVING` while Redis decides,
/// `NOT_SERVING` while it is unreachable (not connected yet, or the circuit breaker open) and
/// the failure mode answers. Only with `--redis`; the overall service (`""`) and the RLS
/// service stay `SERVING` meanwhile, since the failure mode answers.
pub const REDIS_HEALTH_SERVICE: &str = "distlimit.redis";

/// How often the state of Redis is read for the health service, `/ready` and the metrics.
const STATUS_INTERVAL: Duration = Duration::from_millis(100);

/// How many requests one gRPC connection runs at once.
pub const GRPC_CONCURRENCY_PER_CONNECTION: u32 = 1024;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration is invalid.
    #[error("config: {0}")]
    Config(#[from] RateLimitConfigError),
    /// The store's configuration was refused: Redis refused it (an invalid URL, rejected
    /// credentials; the error names Redis itself) or the hybrid store did (an unreachable Redis
    /// is no error, see [`Server::build`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A TLS file (`--tls-cert`, `--tls-key`, `--tls-client-ca`) is missing or unusable; the
    /// error names it.
    #[error("tls: {0}")]
    Tls(#[from] distlimit_serve::TlsError),
}

/// The service, built from [`Args`] and ready to [`serve`](Server::serve).
#[derive(Debug)]
pub struct Server {
    checker: Arc<Checker>,
    watcher: Option<Watcher>,
    tls: Option<(Tls, TlsWatcher)>,
    /// Its Redis status, permits and leases (its store is the checker's).
    store: BuiltStore,
    args: Args,
}

impl Server {
    /// Reads the configuration (starting its hot reload) and the TLS files (starting theirs),
    /// builds the store (memory, or Redis behind a circuit breaker with a memory fallback) and
    /// the metrics. Needs a Tokio runtime.
    ///
    /// # Errors
    ///
    /// An invalid configuration, a missing or unusable TLS file, or a Redis configuration
    /// Redis refuses. A Redis that does not answer is connected in the background while the
    /// failure mode (`--failure-mode`) answers.
    pub async fn build(args: &Args) -> Result<Self, StartError> {
        let tls = args.tls_files().map(Tls::load).transpose()?;
        if let Some(tls) = &tls {
            tracing::info!(
                cert = %tls.files().cert_chain.display(),
                mutual = tls.files().client_ca.is_some(),
                "TLS on both ports"
            );
        }
        let (config, sources) = match &args.config {
            Some(path) => {
                let sources = config::read_sources(path)?;
                (Config::from_sources(&sources)?, sources)
            }
            None => (Config::default(), Vec::new()),
        };
        tracing::info!(domains = config.domains().count(), "configuration loaded");
        for name in &args.store.lease {
            if config.policies().is_none_or(|set| set.get(name).is_none()) {
                tracing::warn!(
                    policy = %name,
                    "--lease names no TOML policy of the configuration (yet): nothing leases under it"
                );
            }
        }
        let metrics = Metrics::new();
        let built = distlimit_serve::store::build(&args.store, &metrics).await?;
        let mut checker = Checker::new(built.store.clone(), config, metrics)
            .with_shadow_mode(args.shadow_mode)
            .with_quota_mode(args.quota_mode);
        if let Some(tls) = &tls {
            checker.register_tls(tls);
        }
        if args.config.is_some() {
            checker
                .request_metrics()
                .on_config_load(metrics::LoadResult::success);
        }
        let checker = Arc::new(checker);
        // SIGHUP reads the configuration at once (what envoyproxy/ratelimit's users expect)
        // instead of ending the process.
        let what = match (&args.config, &tls) {
            (Some(_), _) => "reading the configuration now",
            (None, Some(_)) => "reading the TLS files now",
            (None, None) => "ignored (no --config to reload)",
        };
        let hangup = distlimit_serve::hangup_signal(what);
        let hangup_tls = hangup.clone();
        let watcher = args.config.as_ref().map(|path| {
            reload::watch(
                checker.clone(),
                path.clone(),
                args.reload_interval(),
                sources,
                hangup,
            )
        });
        let tls = tls.map(|tls| {
            let watcher = tls.watch(args.reload_interval(), Some(hangup_tls));
            (tls, watcher)
        });
        Ok(Self {
            checker,
            watcher,
            tls,
            store: built,
            args: args.clone(),
        })
    }

    /// The decisions.
    pub fn checker(&self) -> &Arc<Checker> {
        &self.checker
    }

    /// Configuration reload events (`None` without `--config`).
    pub fn reloads(&self) -> Option<watch::Receiver<Reload>> {
        self.watcher.as_ref().map(Watcher::subscribe)
    }

    /// TLS reload events (`None` without `--tls-cert`).
    pub fn tls_reloads(&self) -> Option<watch::Receiver<TlsReload>> {
        self.tls.as_ref().map(|(_, watcher)| watcher.subscribe())
    }

    /// The TLS certificate of both ports (`None` without `--tls-cert`).
    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref().map(|(tls, _)| tls)
    }

    /// Serves gRPC (Envoy's RLS v3, its rate limit quota service and `grpc.health.v1`) on `grpc` and HTTP on `http` until
    /// `shutdown` completes; then both stop accepting, `/ready` and the health service report
    /// not serving, and the requests in flight get `--shutdown-timeout-ms` to finish.
    ///
    /// # Errors
    ///
    /// Those of the listeners.
    pub async fn serve(
        self,
        grpc: TcpListener,
        http: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        let args = &self.args;
        let ready = Arc::new(AtomicBool::new(true));
        let (health, health_service) = tonic_health::server::health_reporter();
        let services = [grpc::RlsServer::NAME, QuotaServer::NAME];
        for service in services {
            health.set_service_status(service, Serving).await;
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        {
            let ready = ready.clone();
            let health = health.clone();
            tokio::spawn(async move {
                shutdown.await;
                tracing::info!("shutting down");
                ready.store(false, Ordering::Release);
                // The overall service too: a probe of `""` must see the shutdown as well.
                for service in services.into_iter().chain([""]) {
                    health.set_service_status(service, NotServing).await;
                }
                let _ = stop_tx.send(true);
            });
        }
        // Redis' state on the health service and the metrics while serving; `/ready` reads it
        // itself.
        let redis_status = async {
            let Some(redis) = &self.store.redis else {
                return std::future::pending().await;
            };
            let mut last = None;
            let mut tick = tokio::time::interval(STATUS_INTERVAL);
            loop {
                tick.tick().await;
                let deciding = redis.is_deciding();
                if last != Some(deciding) {
                    let status = if deciding { Serving } else { NotServing };
                    health
                        .set_service_status(REDIS_HEALTH_SERVICE, status)
                        .await;
                    self.checker.request_metrics().set_redis_up(deciding);
                    last = Some(deciding);
                }
            }
        };
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };

        // Both ports: the same connection cap, first request deadline and shutdown deadline;
        // each its own idle timeout.
        let serve_config = args.serve.serve_config();
        let tls = self.tls().cloned();
        let grpc_connections = net::incoming(
            distlimit_serve::Acceptor::new(grpc, &args.grpc_serve_config()),
            tls.clone(),
            serve_config.header_read_timeout,
        );
        let rls = RateLimitGrpc::new(self.checker.clone(), args.response_settings()).into_server();
        let quota = QuotaService::new(
            self.checker.clone(),
            self.store.leases.clone(),
            &args.quota,
            stop_rx.clone(),
        );
        // `ShouldRateLimit` on its exact path, beside the services' `/<service>/{*method}`
        // routes: the router then extracts no path parameter per request.
        let routes = tonic::service::Routes::new(health_service)
            .add_service(rls.clone())
            .add_service(quota.into_server())
            .into_axum_router()
            .route_service(grpc::SHOULD_RATE_LIMIT, rls);
        let grpc_server = tonic::transport::Server::builder()
            .timeout(args.request_timeout())
            .max_concurrent_streams(GRPC_CONCURRENCY_PER_CONNECTION)
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .layer(distlimit_serve::TrackRequestsLayer)
            .add_routes(routes.into())
            .serve_with_incoming_shutdown(grpc_connections, stopped(stop_rx.clone()));
        let router = http::router(http::HttpState {
            checker: self.checker.clone(),
            headers: args.response_settings().headers,
            ready,
            redis: self.store.redis.clone(),
            timeout: args.request_timeout(),
            permits: self.store.permits.clone(),
        });
        let http_stopped = stopped(stop_rx.clone());
        let http_server = async move {
            match tls {
                Some(tls) => {
                    distlimit_serve::serve_tls(http, router, serve_config, tls, http_stopped).await
                }
                None => distlimit_serve::serve(http, router, serve_config, http_stopped).await,
            }
        };
        let both = async {
            let (grpc, http) = tokio::join!(grpc_server, http_server);
            grpc.map_err(io::Error::other)?;
            http
        };
        let deadline = args.serve.shutdown_timeout();
        let expired = async {
            stopped(stop_rx).await;
            tokio::time::sleep(deadline).await;
        };
        tokio::select! {
            served = both => served,
            () = redis_status => Ok(()),
            () = expired => {
                tracing::warn!(?deadline, "requests still in flight at the shutdown deadline were dropped");
                Ok(())
            }
        }
    }
}

type QuotaServer = envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer<QuotaService>;
