//! Concurrency permits through a hybrid of a real `redis-server` and the memory store: the
//! primary's permits while Redis answers; when Redis is killed (SIGKILL, by PID), this
//! instance's share of `max_in_flight` on the fallback, given back there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use distlimit_core::{Key, PermitLimit, PermitRequest, PermitStore};
use distlimit_hybrid::{FAIL_OPEN_PERMIT, FailureMode, Hybrid};
use distlimit_memory::MemoryStore;
use distlimit_redis::RedisStore;
use distlimit_test::server::RedisServer;

async fn hybrid(server: &RedisServer, mode: FailureMode) -> Hybrid<RedisStore, MemoryStore> {
    let redis = RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    Hybrid::builder(redis, MemoryStore::new())
        .name("redis")
        .budget(Duration::from_millis(200))
        .instances(2)
        .default_failure_mode(mode)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_primary_leaves_this_instances_share_on_the_fallback() {
    let mut server = RedisServer::start().expect("a redis-server binary");
    let store = hybrid(&server, FailureMode::Fallback).await;
    let limit = PermitLimit::new(5, Duration::from_secs(60)).unwrap();
    let request = PermitRequest::new(Key::new("alice").unwrap(), limit);

    let mut primary = Vec::new();
    for _ in 0..5 {
        primary.push(store.acquire(&request).await.unwrap().permit().unwrap());
    }
    assert!(store.acquire(&request).await.unwrap().is_denied());
    assert!(store.release(&request, primary[0]).await.unwrap());
    assert!(store.acquire(&request).await.unwrap().is_allowed());

    server.kill();
    // Half of 5, rounded down: 2 on this instance while Redis is away.
    let a = store.acquire(&request).await.unwrap();
    let b = store.acquire(&request).await.unwrap();
    let c = store.acquire(&request).await.unwrap();
    assert!(a.is_allowed() && b.is_allowed(), "{a:?} {b:?}");
    assert!(c.is_denied() && c.max_in_flight() == 2, "{c:?}");
    // A fallback permit goes back to the fallback; a primary one cannot be given back now.
    assert!(store.release(&request, a.permit().unwrap()).await.unwrap());
    assert!(!store.release(&request, primary[1]).await.unwrap());
    assert!(store.acquire(&request).await.unwrap().is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_and_fail_closed_answer_without_the_primary() {
    let mut server = RedisServer::start().expect("a redis-server binary");
    let open = hybrid(&server, FailureMode::FailOpen).await;
    let closed = hybrid(&server, FailureMode::FailClosed).await;
    server.kill();
    let limit = PermitLimit::new(1, Duration::from_secs(60)).unwrap();
    let request = PermitRequest::new(Key::new("bob").unwrap(), limit);
    for _ in 0..3 {
        let d = open.acquire(&request).await.unwrap();
        assert_eq!(d.permit(), Some(FAIL_OPEN_PERMIT));
    }
    assert!(!open.release(&request, FAIL_OPEN_PERMIT).await.unwrap());
    assert!(closed.acquire(&request).await.is_err());
}
