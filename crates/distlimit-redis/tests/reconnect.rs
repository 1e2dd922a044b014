//! A Redis killed (SIGKILL) and restarted on the same port: the first call after it accepts
//! connections again runs on a fresh connection and succeeds, in the multiplexed and the pool
//! modes; behind a hybrid store's circuit breaker, the first half-open probe after the restart
//! closes the breaker.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlimit_core::{BreakerState, Limit, Observer, Quota, Source, StoreExt};
use distlimit_hybrid::Hybrid;
use distlimit_memory::MemoryStore;
use distlimit_redis::RedisStore;
use support::{RedisServer, blocking};

fn limit() -> Limit {
    Limit::gcra(Quota::per_second(1_000_000).unwrap())
}

/// A store in one of the two standalone modes: one multiplexed connection, or a pool of eight.
async fn store(url: &str, pool: bool) -> RedisStore {
    let builder = RedisStore::builder(url);
    let builder = if pool { builder.pool(8) } else { builder };
    builder.connect().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_call_after_a_restart_succeeds() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let mut failures = Vec::new();
    for (mode, pool) in [("multiplexed", false), ("pool", true)] {
        let store = store(&server.url(), pool).await;
        // Several calls at once, so the pool holds several connections.
        let calls: Vec<_> = (0..16)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move { store.check(format!("k{i}").as_str(), limit()).await })
            })
            .collect();
        for call in calls {
            assert!(call.await.unwrap().unwrap().is_allowed(), "{mode}");
        }
        blocking(|| server.kill());
        for _ in 0..3 {
            let result = store.check("k", limit()).await;
            assert!(
                matches!(&result, Err(e) if e.is_transient()),
                "{mode}: {result:?}"
            );
        }
        blocking(|| server.restart()).unwrap();
        for i in 0..8 {
            let result = store.check("k", limit()).await;
            if !result.as_ref().is_ok_and(|d| d.is_allowed()) {
                failures.push(format!("{mode}: call {i} after the restart: {result:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Records the breaker's transitions with their instants.
#[derive(Default)]
struct Transitions(Mutex<Vec<(Instant, BreakerState, BreakerState)>>);

impl Observer for Transitions {
    fn on_breaker(&self, _store: &'static str, from: BreakerState, to: BreakerState) {
        self.0.lock().unwrap().push((Instant::now(), from, to));
    }
}

const COOL_OFF: Duration = Duration::from_millis(200);

/// A steady trickle of requests (one every 5 ms) through a hybrid store over `store`; Redis is
/// killed, stays down for several cool-offs (probes fail meanwhile), and is restarted: the
/// first probe sent after it accepts connections closes the breaker.
async fn breaker_closes_at_the_first_probe(
    mode: &str,
    server: &mut RedisServer,
    store: RedisStore,
) {
    let transitions = Arc::new(Transitions::default());
    let hybrid = Arc::new(
        Hybrid::builder(store, MemoryStore::new())
            .cool_off(COOL_OFF)
            .budget(Duration::from_millis(500))
            .observer(transitions.clone())
            .build()
            .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let decisions: Arc<Mutex<Vec<(Instant, Source)>>> = Arc::default();
    let trickle = {
        let (hybrid, stop, decisions) = (hybrid.clone(), stop.clone(), decisions.clone());
        tokio::spawn(async move {
            // Bounded: at most 2 000 requests, 20 s.
            let start = Instant::now();
            for i in 0..2_000u32 {
                if stop.load(Ordering::Relaxed) || start.elapsed() > Duration::from_secs(20) {
                    break;
                }
                let key = format!("user-{}", i % 16);
                if let Ok(d) = hybrid.check(key.as_str(), limit()).await {
                    decisions.lock().unwrap().push((Instant::now(), d.source()));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    // Several calls at once, so that a pool holds several connections.
    let burst: Vec<_> = (0..16)
        .map(|i| {
            let hybrid = hybrid.clone();
            tokio::spawn(async move { hybrid.check(format!("burst-{i}").as_str(), limit()).await })
        })
        .collect();
    for call in burst {
        assert_eq!(
            call.await.unwrap().unwrap().source(),
            Source::Primary,
            "{mode}"
        );
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        decisions
            .lock()
            .unwrap()
            .iter()
            .any(|(_, s)| *s == Source::Primary),
        "{mode}: Redis decided before the kill"
    );
    blocking(|| server.kill());
    tokio::time::sleep(COOL_OFF * 3).await;
    let failed_probes_while_down = transitions
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, from, to)| *from == BreakerState::HalfOpen && *to == BreakerState::Open)
        .count();
    assert!(
        failed_probes_while_down >= 2,
        "{mode}: probes failed while Redis was down: {failed_probes_while_down}"
    );
    blocking(|| server.restart()).unwrap();
    let up = Instant::now();
    let closed = loop {
        let closed = transitions
            .0
            .lock()
            .unwrap()
            .iter()
            .find(|(at, _, to)| *at > up && *to == BreakerState::Closed)
            .map(|(at, _, _)| *at);
        if let Some(at) = closed {
            break at;
        }
        assert!(
            up.elapsed() < Duration::from_secs(5),
            "{mode}: the breaker did not close within 5 s of the restart"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    stop.store(true, Ordering::Relaxed);
    trickle.await.unwrap();
    let failed_after_up: Vec<_> = transitions
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, from, to)| {
            *at > up && *from == BreakerState::HalfOpen && *to == BreakerState::Open
        })
        .map(|(at, _, _)| at.duration_since(up))
        .collect();
    assert!(
        failed_after_up.is_empty(),
        "{mode}: probes failed after Redis accepted connections again (at {failed_after_up:?} \
         after the restart); closed {:?} after it",
        closed.duration_since(up)
    );
    // One cool-off at most, plus the probe itself (scheduling slack for a loaded machine).
    assert!(
        closed.duration_since(up) < COOL_OFF + Duration::from_millis(300),
        "{mode}: closed {:?} after the restart",
        closed.duration_since(up)
    );
    assert!(
        decisions
            .lock()
            .unwrap()
            .iter()
            .any(|(at, s)| *at >= closed && *s == Source::Primary),
        "{mode}: Redis decides again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiplexed_breaker_closes_at_the_first_probe_after_a_restart() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let store = store(&server.url(), false).await;
    breaker_closes_at_the_first_probe("multiplexed", &mut server, store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_breaker_closes_at_the_first_probe_after_a_restart() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let store = store(&server.url(), true).await;
    breaker_closes_at_the_first_probe("pool", &mut server, store).await;
}
