//! The conformance suite against `Hybrid<RedisStore, MemoryStore>` with a real Redis, in each
//! failure mode, as `--failure-mode` builds it:
//!
//! * Redis up (`on_redis`, `on_redis_fail_open`, `on_redis_fail_closed`, and the permit suite
//!   `permits_on_redis`): the breaker closed, every decision made by the Lua scripts on a real
//!   `redis-server`, through the hybrid's budget, breaker and bookkeeping.
//! * Redis down, failure mode `fallback` (`redis_down_fallback`, `permits_redis_down_fallback`):
//!   the store connected to a private server that is then killed (SIGKILL, by PID), so every
//!   decision, batch, peek, settle and permit is the fallback's, which must pass the suite (each
//!   decision is checked to say `Source::Fallback`, then compared with the model).
//! * Redis down, `fail-closed` and `fail-open` (`redis_down_fail_closed_*`,
//!   `redis_down_fail_open_*`): no store can decide, so the checks' model does not apply; what
//!   must hold is that fail-closed answers a typed error to every operation (never an
//!   admission) and fail-open admits every decision marked `Source::FailOpen`, charging nothing.
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
use distlimit_core::{
    Decision, Error, Key, Limit, ManualClock, PermitDecision, PermitId, PermitLimit, PermitRequest,
    PermitStore, Quota, Request, Settle, Source, Store,
};
use distlimit_hybrid::{FAIL_OPEN_PERMIT, FailureMode, Hybrid, OpenRule};
use distlimit_memory::MemoryStore;
use distlimit_redis::RedisStore;
use distlimit_test::server::{self, RedisServer};

type OnRedisStore = Hybrid<RedisStore, MemoryStore<ManualClock>, ManualClock>;

/// The hybrid store, and the private server it runs on, if any (killed when the store drops).
/// With Redis down, every decision must come from the fallback (`Source::Fallback`); it is then
/// attributed to `Primary` for the suite's comparison with the model.
struct OnRedis {
    store: OnRedisStore,
    down: bool,
    _server: Option<RedisServer>,
}

impl OnRedis {
    fn source(&self, decision: Decision) -> Decision {
        if !self.down {
            return decision;
        }
        assert_eq!(decision.source(), Source::Fallback, "{decision:?}");
        decision.with_source(Source::Primary)
    }

    fn sources(&self, decisions: Vec<Decision>) -> Vec<Decision> {
        decisions.into_iter().map(|d| self.source(d)).collect()
    }
}

#[async_trait]
#[warn(clippy::missing_trait_methods)]
impl Store for OnRedis {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        self.store.decide(request).await.map(|d| self.source(d))
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        self.store
            .decide_all(requests)
            .await
            .map(|d| self.sources(d))
    }

    fn decide_now(&self, request: &Request<'_>) -> Option<Result<Decision, Error>> {
        Some(self.store.decide_now(request)?.map(|d| self.source(d)))
    }

    // Batches are always awaited here: `None` is always a correct answer.
    fn decide_all_now(&self, _: &[Request<'_>], _: &mut [Decision]) -> Option<Result<(), Error>> {
        None
    }

    // Forwarded, or the settling check would pass on the trait's `Unsupported` alone.
    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        self.store
            .settle_all(settles)
            .await
            .map(|d| self.sources(d))
    }
}

#[async_trait]
impl PermitStore for OnRedis {
    async fn acquire(&self, request: &PermitRequest<'_>) -> Result<PermitDecision, Error> {
        self.store.acquire(request).await
    }

    async fn release(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        self.store.release(request, permit).await
    }

    async fn renew(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        self.store.renew(request, permit).await
    }
}

/// The hybrid store on Redis (up) in failure mode `mode`.
async fn on_redis(clock: ManualClock, mode: FailureMode) -> OnRedis {
    let (url, own) = match std::env::var(server::ENV_URL) {
        Ok(url) if !url.trim().is_empty() => (url.trim().to_owned(), None),
        _ => {
            assert!(
                !server::required(),
                "{} is not set: run `cargo xtask test`",
                server::ENV_URL
            );
            let own = private_server();
            (own.url(), Some(own))
        }
    };
    build(clock, mode, url, own, false).await
}

fn private_server() -> RedisServer {
    RedisServer::start().unwrap_or_else(|| {
        panic!(
            "no Redis server for the conformance suite: set {} (run `cargo xtask test`), or \
             install redis-server",
            server::ENV_URL
        )
    })
}

/// The hybrid store on a private Redis killed (SIGKILL) once the store is connected.
async fn redis_down(clock: ManualClock, mode: FailureMode) -> OnRedis {
    let mut own = private_server();
    let url = own.url();
    let mut store = build(clock, mode, url, None, true).await;
    tokio::task::block_in_place(|| own.kill());
    store._server = Some(own);
    store
}

async fn build(
    clock: ManualClock,
    mode: FailureMode,
    url: String,
    own: Option<RedisServer>,
    down: bool,
) -> OnRedis {
    let mut prefix = distlimit_test::unique_prefix("hybrid");
    prefix.pop(); // the key layout adds its own separator
    let redis = RedisStore::builder(url)
        .prefix(prefix)
        .client_clock(clock.clone())
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let store = Hybrid::builder(redis, MemoryStore::with_clock(clock.clone()))
        .clock(clock)
        .budget(Duration::from_secs(10))
        .open_after(OpenRule::ConsecutiveFailures(1))
        .default_failure_mode(mode)
        .blocked_cache(None)
        .build()
        .unwrap();
    OnRedis {
        store,
        down,
        _server: own,
    }
}

distlimit_test::conformance_tests!(on_redis, |clock| on_redis(clock, FailureMode::Fallback));
distlimit_test::conformance_tests!(on_redis_fail_open, |clock| on_redis(
    clock,
    FailureMode::FailOpen
));
distlimit_test::conformance_tests!(on_redis_fail_closed, |clock| on_redis(
    clock,
    FailureMode::FailClosed
));
distlimit_test::permit_conformance_tests!(permits_on_redis, |clock| on_redis(
    clock,
    FailureMode::Fallback
));
distlimit_test::conformance_tests!(redis_down_fallback, |clock| redis_down(
    clock,
    FailureMode::Fallback
));
distlimit_test::permit_conformance_tests!(permits_redis_down_fallback, |clock| redis_down(
    clock,
    FailureMode::Fallback
));

/// One of each operation on a fresh key of `store`: a decision, a batch, a peek, a report, a
/// give-back and a permit, with what each answered.
async fn every_operation(store: &OnRedis) -> Vec<(&'static str, Result<Vec<Decision>, Error>)> {
    let limit = Limit::token_bucket(Quota::per_second(5).unwrap());
    let key = Key::new("k").unwrap();
    let other = Key::new("other").unwrap();
    let request = Request::new(key, limit);
    let batch = [request, Request::new(other, limit)];
    let permit = PermitRequest::new(key, PermitLimit::new(2, Duration::from_secs(10)).unwrap());
    let one = |r: Result<Decision, Error>| r.map(|d| vec![d]);
    let mut answers = vec![
        ("decide", one(store.store.decide(&request).await)),
        ("decide_all", store.store.decide_all(&batch).await),
        ("peek", one(store.store.decide(&request.with_cost(0)).await)),
        (
            "report",
            store.store.settle_all(&[Settle::Report(request)]).await,
        ),
        (
            "give_back",
            store.store.settle_all(&[Settle::GiveBack(request)]).await,
        ),
    ];
    let acquired = store.store.acquire(&permit).await;
    assert!(
        acquired
            .as_ref()
            .map_or(true, |p| p.permit().is_none_or(|id| id == FAIL_OPEN_PERMIT)),
        "a permit with Redis down and no fallback: {acquired:?}"
    );
    answers.push(("acquire", acquired.map(|_| Vec::new())));
    answers
}

/// Redis down, fail-closed: every operation answers a typed error, never a decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fail_closed_answers_typed_errors() {
    let store = redis_down(distlimit_test::new_clock(), FailureMode::FailClosed).await;
    for (what, answer) in every_operation(&store).await {
        match answer {
            // The primary's error, or `Unavailable` (breaker open): typed, transient.
            Err(e) => assert!(e.is_transient(), "{what}: {e:?}"),
            Ok(d) => panic!("{what} answered with Redis down and fail-closed: {d:?}"),
        }
    }
}

/// Redis down, fail-open: every decision admits, marked `Source::FailOpen` (never passed off as
/// checked), and a permit is the fail-open permit; nothing is charged anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fail_open_admits_marked_unchecked() {
    let store = redis_down(distlimit_test::new_clock(), FailureMode::FailOpen).await;
    for (what, answer) in every_operation(&store).await {
        for d in answer.unwrap_or_else(|e| panic!("{what}: {e:?}")) {
            assert!(
                d.is_allowed() && d.source() == Source::FailOpen,
                "{what}: {d:?}"
            );
        }
    }
}
