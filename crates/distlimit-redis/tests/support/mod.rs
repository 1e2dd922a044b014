//! What the integration tests share: where the Redis servers are, private servers, and stores
//! for the conformance suite.
//!
//! `cargo xtask test` starts a standalone server, a Sentinel set and a Cluster and exports where
//! they are (`DISTLIMIT_REDIS_URL`, `DISTLIMIT_REDIS_SENTINEL_URLS`,
//! `DISTLIMIT_REDIS_SENTINEL_SERVICE`, `DISTLIMIT_REDIS_CLUSTER_URLS`, the binaries in
//! `DISTLIMIT_REDIS_SERVER_BIN` and `DISTLIMIT_REDIS_CLI_BIN`) with `DISTLIMIT_REQUIRE_REDIS=1`.
//! A missing variable then fails the test; without `DISTLIMIT_REQUIRE_REDIS=1` the test prints a
//! note and returns early. For local runs: `cargo xtask redis-up` prints the `export` lines.

// Each test binary uses a part of this module; a failed setup fails the test.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlimit_core::{Decision, Error, ManualClock, Request, Settle, Store};
use distlimit_redis::{RedisStore, RedisStoreBuilder};

pub const ENV_URL: &str = "DISTLIMIT_REDIS_URL";
pub const ENV_CLUSTER_URLS: &str = "DISTLIMIT_REDIS_CLUSTER_URLS";
pub const ENV_SENTINEL_URLS: &str = "DISTLIMIT_REDIS_SENTINEL_URLS";
pub const ENV_SENTINEL_SERVICE: &str = "DISTLIMIT_REDIS_SENTINEL_SERVICE";

/// Whether a missing server is a failure, and the variables that say where the servers are:
/// a missing one panics under `DISTLIMIT_REQUIRE_REDIS=1`, else it is a skip.
pub use distlimit_test::server::{required, var};

fn list(value: String) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The standalone server's URL (`DISTLIMIT_REDIS_URL`).
pub fn standalone_url() -> Option<String> {
    var(ENV_URL)
}

/// The six Cluster nodes' URLs (`DISTLIMIT_REDIS_CLUSTER_URLS`).
pub fn cluster_urls() -> Option<Vec<String>> {
    var(ENV_CLUSTER_URLS).map(list)
}

/// The sentinels' URLs and the service they monitor.
pub fn sentinel() -> Option<(Vec<String>, String)> {
    let urls = var(ENV_SENTINEL_URLS).map(list)?;
    let service = var(ENV_SENTINEL_SERVICE)?;
    Some((urls, service))
}

/// The `distlimit_test` prefix for one store, as a Redis key prefix.
pub fn unique_prefix(tag: &str) -> Vec<u8> {
    let mut prefix = distlimit_test::unique_prefix(tag);
    // `dlt:<pid>:<nanos>:<n>:<tag>:` — the layout adds its own separator.
    prefix.pop();
    prefix
}

/// A test's own `redis-server` on a free loopback port, killed by its PID on drop.
pub use distlimit_test::server::RedisServer;

/// A store that keeps a private server alive as long as it lives.
pub struct Guarded {
    pub store: RedisStore,
    _server: Option<Arc<RedisServer>>,
}

#[async_trait]
impl Store for Guarded {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        self.store.decide(request).await
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        self.store.decide_all(requests).await
    }

    // Forwarded, or the settling check would pass on the trait's `Unsupported` alone.
    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        self.store.settle_all(settles).await
    }
}

#[async_trait]
impl distlimit_core::PermitStore for Guarded {
    async fn acquire(
        &self,
        request: &distlimit_core::PermitRequest<'_>,
    ) -> Result<distlimit_core::PermitDecision, Error> {
        self.store.acquire(request).await
    }

    async fn release(
        &self,
        request: &distlimit_core::PermitRequest<'_>,
        permit: distlimit_core::PermitId,
    ) -> Result<bool, Error> {
        self.store.release(request, permit).await
    }

    async fn renew(
        &self,
        request: &distlimit_core::PermitRequest<'_>,
        permit: distlimit_core::PermitId,
    ) -> Result<bool, Error> {
        self.store.renew(request, permit).await
    }
}

/// Connects `builder`, failing the test on an error.
pub async fn connect(builder: RedisStoreBuilder, what: &str) -> RedisStore {
    match builder.connect().await {
        Ok(store) => store,
        Err(e) => panic!("cannot connect to the {what}: {e} ({e:?})"),
    }
}

/// A store on the standalone server (`DISTLIMIT_REDIS_URL`) judged by `clock`, under a prefix of
/// its own, with `configure` applied. Without the variable (and without
/// `DISTLIMIT_REQUIRE_REDIS=1`), on a private server of its own instead, since the conformance
/// macro cannot skip; without a `redis-server` binary either, the test fails with instructions.
pub async fn standalone_store(
    clock: ManualClock,
    tag: &str,
    configure: impl FnOnce(RedisStoreBuilder) -> RedisStoreBuilder,
) -> Guarded {
    let (url, server) = match std::env::var(ENV_URL) {
        Ok(url) if !url.trim().is_empty() => (url.trim().to_owned(), None),
        _ => {
            assert!(
                !required(),
                "{ENV_URL} is not set: run `cargo xtask test` (it starts the Redis servers and \
                 sets the DISTLIMIT_REDIS_* variables)"
            );
            eprintln!("note: {ENV_URL} is not set: running on a private redis-server");
            let Some(server) = RedisServer::start() else {
                panic!(
                    "no Redis server for the conformance suite: set {ENV_URL} (run `cargo \
                     xtask test`), or install redis-server"
                )
            };
            (server.url(), Some(Arc::new(server)))
        }
    };
    let builder = RedisStore::builder(url)
        .prefix(unique_prefix(tag))
        .client_clock(clock);
    Guarded {
        store: connect(configure(builder), "standalone Redis server").await,
        _server: server,
    }
}

/// A private primary with one replica online for `WAIT`, started once per test process (the
/// harness's watchdog kills both when the process ends).
fn replicated_primary() -> &'static RedisServer {
    static PAIR: OnceLock<(RedisServer, RedisServer)> = OnceLock::new();
    &PAIR
        .get_or_init(|| {
            let primary = RedisServer::start().expect("a redis-server binary");
            let port = primary.port().to_string();
            let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port])
                .expect("a redis-server binary for the replica");
            // `WAIT` counts a replica once the primary has it `online` (after its first ACK).
            let start = Instant::now();
            while !primary
                .info("replication")
                .is_ok_and(|info| info.contains("state=online"))
            {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "the replica did not sync"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            (primary, replica)
        })
        .0
}

/// A durable store (`durable(1, …)`: each admission waits for one replica's `WAIT`) on a
/// private primary with one replica, judged by `clock`, under a prefix of its own.
pub async fn durable_store(clock: ManualClock, tag: &str) -> RedisStore {
    let url = blocking(replicated_primary).url();
    let builder = RedisStore::builder(url)
        .prefix(unique_prefix(tag))
        .client_clock(clock)
        .durable(1, Duration::from_secs(2))
        .response_timeout(Duration::from_secs(5));
    connect(builder, "durable primary").await
}

/// A store on the Sentinel set's primary judged by `clock`, or `None` (a skip).
pub async fn sentinel_store(clock: ManualClock, tag: &str) -> Option<RedisStore> {
    let (urls, service) = sentinel()?;
    let builder = RedisStore::sentinel(urls, service)
        .prefix(unique_prefix(tag))
        .client_clock(clock);
    Some(connect(builder, "Sentinel set").await)
}

/// A store on the Cluster judged by `clock`, or `None` (a skip).
pub async fn cluster_store(clock: ManualClock, tag: &str) -> Option<RedisStore> {
    let urls = cluster_urls()?;
    let builder = RedisStore::cluster(urls)
        .prefix(unique_prefix(tag))
        .client_clock(clock);
    Some(connect(builder, "Cluster").await)
}

/// Runs blocking harness work (starting, killing, querying servers) without stalling the
/// runtime's other tasks.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}
