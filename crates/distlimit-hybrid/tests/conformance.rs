//! The conformance suite against the hybrid store closed (a memory primary), permanently open
//! (a primary that always fails, a memory fallback, which answers through `Store::decide_now`),
//! and permanently open with a fallback that must be awaited (the memory store behind a
//! `FaultyStore` that yields once per call, so it does not answer `decide_now`).
//!
//! The blocked-key cache is off in the closed run: its answers carry `Source::BlockedCache` and
//! repeat the store's `remaining` as it was, which the suite's exact comparison rejects by design
//! (its own tests are in `state_machine.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use async_trait::async_trait;
use distlimit_core::{Decision, Error, ManualClock, Request, Settle, Source, Store};
use distlimit_hybrid::{Hybrid, OpenRule};
use distlimit_memory::MemoryStore;
use distlimit_test::{Fault, FaultKind, FaultyStore};

type Memory = MemoryStore<ManualClock>;

fn closed(clock: ManualClock) -> Hybrid<Memory, Memory, ManualClock> {
    Hybrid::builder(
        MemoryStore::with_clock(clock.clone()),
        MemoryStore::with_clock(clock.clone()),
    )
    .clock(clock)
    .blocked_cache(None)
    .build()
    .unwrap()
}

/// The hybrid store with a primary that always fails. The suite compares whole decisions with
/// the model's, whose source is `Primary`: this adapter checks that every decision came from the
/// fallback, then attributes it to `Primary` for the comparison.
struct Open<F>(Hybrid<FaultyStore<Memory>, F, ManualClock>);

fn open<F: Store>(clock: ManualClock, fallback: F) -> Open<F> {
    let failing = FaultyStore::new(MemoryStore::with_clock(clock.clone()))
        .with_default(Fault::Fail(FaultKind::Unavailable));
    Open(
        Hybrid::builder(failing, fallback)
            .clock(clock)
            .open_after(OpenRule::ConsecutiveFailures(1))
            .build()
            .unwrap(),
    )
}

fn from_fallback(decision: Decision) -> Decision {
    assert_eq!(decision.source(), Source::Fallback, "{decision:?}");
    decision.with_source(Source::Primary)
}

#[async_trait]
#[warn(clippy::missing_trait_methods)]
impl<F: Store> Store for Open<F> {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        self.0.decide(request).await.map(from_fallback)
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        let decisions = self.0.decide_all(requests).await?;
        Ok(decisions.into_iter().map(from_fallback).collect())
    }

    fn decide_now(&self, request: &Request<'_>) -> Option<Result<Decision, Error>> {
        Some(self.0.decide_now(request)?.map(from_fallback))
    }

    // Batches are always awaited (`decide_all`): `None` is always a correct answer.
    fn decide_all_now(&self, _: &[Request<'_>], _: &mut [Decision]) -> Option<Result<(), Error>> {
        None
    }

    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        let decisions = self.0.settle_all(settles).await?;
        Ok(decisions.into_iter().map(from_fallback).collect())
    }
}

distlimit_test::conformance_tests!(closed, |clock| async move { closed(clock) });
distlimit_test::conformance_tests!(open, |clock| async move {
    open(clock.clone(), MemoryStore::with_clock(clock))
});
distlimit_test::conformance_tests!(open_awaited, |clock| async move {
    open(
        clock.clone(),
        FaultyStore::new(MemoryStore::with_clock(clock)).with_default(Fault::Delay(Duration::ZERO)),
    )
});
