//! Leases through the hybrid store: closed, the primary's exchange; with the primary down, the
//! policy's failure mode (the fallback's exchange on this instance's share, fail open, fail
//! closed), and give-backs while degraded never reach the fallback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use distlimit_core::{
    Decision, Error, Grant, Key, LeaseStore, Limit, ManualClock, Quota, Request, Settle, Source,
    Store,
};
use distlimit_hybrid::{FailureMode, Hybrid, OpenRule};
use distlimit_memory::MemoryStore;

type Memory = MemoryStore<ManualClock>;

/// A memory store that fails every call while `down`.
struct Switch {
    store: Memory,
    down: AtomicBool,
}

impl Switch {
    fn check(&self) -> Result<(), Error> {
        if self.down.load(Ordering::Relaxed) {
            return Err(Error::Unavailable {
                store: "switch",
                source: "down".into(),
            });
        }
        Ok(())
    }
}

#[async_trait]
#[warn(clippy::missing_trait_methods)]
impl Store for Switch {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        self.check()?;
        self.store.decide(request).await
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        self.check()?;
        self.store.decide_all(requests).await
    }

    fn decide_now(&self, _request: &Request<'_>) -> Option<Result<Decision, Error>> {
        None
    }

    // Batches are always awaited (`decide_all`): `None` is always a correct answer.
    fn decide_all_now(&self, _: &[Request<'_>], _: &mut [Decision]) -> Option<Result<(), Error>> {
        None
    }

    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        self.check()?;
        self.store.settle_all(settles).await
    }
}

#[async_trait]
impl LeaseStore for Switch {
    async fn exchange(
        &self,
        request: &Request<'_>,
        give_back: u64,
        want: u64,
    ) -> Result<Grant, Error> {
        self.check()?;
        self.store.exchange(request, give_back, want).await
    }
}

fn hybrid(clock: &ManualClock, mode: FailureMode) -> Hybrid<Switch, Memory, ManualClock> {
    let primary = Switch {
        store: MemoryStore::with_clock(clock.clone()),
        down: AtomicBool::new(false),
    };
    Hybrid::builder(primary, MemoryStore::with_clock(clock.clone()))
        .clock(clock.clone())
        .open_after(OpenRule::ConsecutiveFailures(1))
        .default_failure_mode(mode)
        .instances(2)
        .build()
        .unwrap()
}

fn request(limit: Limit) -> Request<'static> {
    Request::new(Key::new("k").unwrap(), limit)
}

#[tokio::test]
async fn leases_follow_the_breaker_and_the_failure_mode() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let limit = Limit::gcra(Quota::per_minute(10).unwrap());
    let store = hybrid(&clock, FailureMode::Fallback);
    // Closed: the primary's units.
    let grant = store.take(&request(limit), 4).await.unwrap();
    assert_eq!(
        (grant.granted, grant.decision.source()),
        (4, Source::Primary)
    );
    let peek = |s: &Memory| s.decide_sync(&request(limit).with_cost(0)).remaining();
    assert_eq!(peek(&store.primary().store), 6);

    // Down: the fallback's units, out of this instance's share (10 / 2 instances).
    store.primary().down.store(true, Ordering::Relaxed);
    let grant = store.take(&request(limit), 8).await.unwrap();
    assert_eq!(
        (grant.granted, grant.decision.source()),
        (5, Source::Fallback)
    );
    // Units given back while degraded go nowhere (they may be the primary's).
    let share = Limit::gcra(Quota::per_minute(5).unwrap());
    let fallback_before = store.fallback().decide_sync(&request(share).with_cost(0));
    store.give_back(&request(limit), 4).await.unwrap();
    assert_eq!(
        store.fallback().decide_sync(&request(share).with_cost(0)),
        fallback_before
    );
    assert_eq!(peek(&store.primary().store), 6);

    // The other failure modes.
    let open = hybrid(&clock, FailureMode::FailOpen);
    open.primary().down.store(true, Ordering::Relaxed);
    let grant = open.take(&request(limit), 7).await.unwrap();
    assert_eq!(
        (grant.granted, grant.decision.source()),
        (7, Source::FailOpen)
    );
    let closed = hybrid(&clock, FailureMode::FailClosed);
    closed.primary().down.store(true, Ordering::Relaxed);
    assert!(closed.take(&request(limit), 7).await.is_err());

    // Windows cannot lease, whatever the breaker says.
    let window = Limit::fixed_window(Quota::per_minute(10).unwrap());
    assert!(
        store
            .take(&request(window), 1)
            .await
            .unwrap_err()
            .is_invalid_input()
    );
}
