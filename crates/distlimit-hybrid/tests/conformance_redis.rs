//! The conformance suite against `Hybrid<RedisStore, MemoryStore>` with a real Redis: the breaker
//! closed, every decision made by the Lua scripts on a real `redis-server`, through the hybrid's
//! budget, breaker and bookkeeping.
//!
//! The server is `DISTLIMIT_REDIS_URL` (set by `cargo xtask test`); without it (and without
//! `DISTLIMIT_REQUIRE_REDIS=1`) each check starts a private `redis-server` of its own with the
//! harness of `distlimit_test::server`. The Redis store runs in client-time mode on the check's
//! `ManualClock`, under a key prefix of its own. The budget is far above any healthy call, so the
//! breaker opens only on a real failure (which the suite then reports: the fallback's decisions
//! carry `Source::Fallback`). The blocked-key cache is off, as in `conformance.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use async_trait::async_trait;
use distlimit_core::{Decision, Error, ManualClock, Request, Settle, Store};
use distlimit_hybrid::Hybrid;
use distlimit_memory::MemoryStore;
use distlimit_redis::RedisStore;
use distlimit_test::server::{self, RedisServer};

/// The hybrid store, and the private server it runs on, if any (killed when the store drops).
struct OnRedis {
    store: Hybrid<RedisStore, MemoryStore<ManualClock>, ManualClock>,
    _server: Option<RedisServer>,
}

#[async_trait]
impl Store for OnRedis {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        self.store.decide(request).await
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        self.store.decide_all(requests).await
    }

    fn decide_now(&self, request: &Request<'_>) -> Option<Result<Decision, Error>> {
        self.store.decide_now(request)
    }

    // Forwarded, or the settling check would pass on the trait's `Unsupported` alone.
    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        self.store.settle_all(settles).await
    }
}

async fn on_redis(clock: ManualClock) -> OnRedis {
    let (url, own) = match std::env::var(server::ENV_URL) {
        Ok(url) if !url.trim().is_empty() => (url.trim().to_owned(), None),
        _ => {
            assert!(
                !server::required(),
                "{} is not set: run `cargo xtask test`",
                server::ENV_URL
            );
            let Some(own) = RedisServer::start() else {
                panic!(
                    "no Redis server for the conformance suite: set {} (run `cargo xtask \
                     test`), or install redis-server",
                    server::ENV_URL
                )
            };
            (own.url(), Some(own))
        }
    };
    let mut prefix = distlimit_test::unique_prefix("hybrid");
    prefix.pop(); // the key layout adds its own separator
    let redis = RedisStore::builder(url)
        .prefix(prefix)
        .client_clock(clock.clone())
        .connect()
        .await
        .unwrap();
    let store = Hybrid::builder(redis, MemoryStore::with_clock(clock.clone()))
        .clock(clock)
        .budget(Duration::from_secs(10))
        .blocked_cache(None)
        .build()
        .unwrap();
    OnRedis {
        store,
        _server: own,
    }
}

distlimit_test::conformance_tests!(on_redis);
