//! The lease accounting of `Leased` over the memory store, on a manual clock:
//!
//! * no unit spent twice, none lost: with a quota that does not refill during a case, at every
//!   step the units the store still has, the units held in leases and the units admitted add up
//!   to the capacity of each key, whatever the order of requests, lease ends and sweeps;
//! * never more than the limit: with a refilling quota, what was admitted from a fresh key is
//!   within the algorithm's bound over the run;
//! * concurrent callers on one key (threads) neither spend a unit twice nor lose one, and the
//!   sweep gives back everything once leases end.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use distlimit_core::{
    Algorithm, Clock, Error, Key, LeaseStore, Limit, ManualClock, Quota, Request, Store, StoreExt,
};
use distlimit_lease::Leased;
use distlimit_memory::MemoryStore;
use proptest::prelude::*;

const START: u64 = 1_700_000_000_000_000;

type Inner = MemoryStore<Arc<ManualClock>>;

fn leased(clock: &Arc<ManualClock>, horizon_ms: u64) -> Leased<Inner> {
    let inner = MemoryStore::builder().clock(clock.clone()).build();
    Leased::for_policies(["hot"])
        .horizon(Duration::from_millis(horizon_ms))
        .clock(clock.clone())
        .build(inner)
}

fn request(key: &str, limit: Limit) -> Request<'_> {
    Request::new(Key::new(key).unwrap(), limit)
        .with_policy("hot")
        .unwrap()
}

#[derive(Clone, Debug)]
enum Step {
    Decide {
        key: usize,
        cost: u64,
        advance_ms: u64,
    },
    Sweep {
        advance_ms: u64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0usize..2, 1u64..4, 0u64..40).prop_map(|(key, cost, advance_ms)| Step::Decide { key, cost, advance_ms }),
        1 => (0u64..300).prop_map(|advance_ms| Step::Sweep { advance_ms }),
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn no_unit_is_spent_twice_or_lost(
        gcra in prop::bool::ANY,
        burst in 1u64..200,
        horizon_ms in prop::sample::select(vec![1u64, 20, 100]),
        steps in prop::collection::vec(step(), 1..150),
    ) {
        let rt = runtime();
        let clock = Arc::new(ManualClock::new(START));
        let store = leased(&clock, horizon_ms);
        // One unit a day: nothing refills during a case (at most 45 s).
        let quota = Quota::from_parts(1, 86_400_000_000, burst).unwrap();
        let algorithm = if gcra { Algorithm::Gcra } else { Algorithm::TokenBucket };
        let limit = Limit::new(algorithm, quota);
        let keys = ["a", "b"];
        let mut admitted = [0u64; 2];
        for step in steps {
            match step {
                Step::Decide { key, cost, advance_ms } => {
                    clock.advance(Duration::from_millis(advance_ms));
                    let decision = rt
                        .block_on(store.decide(&request(keys[key], limit).with_cost(cost)))
                        .unwrap();
                    if decision.is_allowed() {
                        admitted[key] += cost;
                    }
                }
                Step::Sweep { advance_ms } => {
                    clock.advance(Duration::from_millis(advance_ms));
                    rt.block_on(store.sweep());
                }
            }
            let stats = store.stats();
            prop_assert_eq!(stats.lost, 0);
            let in_store: u64 = keys
                .iter()
                .map(|k| store.inner().decide_sync(&request(k, limit).with_cost(0)).remaining())
                .sum();
            prop_assert_eq!(
                in_store + stats.held + admitted[0] + admitted[1],
                2 * burst,
                "store {} held {} admitted {:?} ({:?})",
                in_store,
                stats.held,
                admitted,
                stats
            );
            prop_assert_eq!(stats.taken, stats.returned + stats.held + admitted[0] + admitted[1]);
        }
        // Once every lease ended, a sweep gives everything back.
        clock.advance(Duration::from_millis(horizon_ms + 1));
        rt.block_on(store.sweep());
        prop_assert_eq!(store.stats().held, 0);
    }

    #[test]
    fn never_more_than_the_limit(
        gcra in prop::bool::ANY,
        limit_per_s in 1u64..500,
        burst in 1u64..100,
        horizon_ms in prop::sample::select(vec![1u64, 20, 100]),
        steps in prop::collection::vec((1u64..4, 0u64..30), 1..300),
    ) {
        let rt = runtime();
        let clock = Arc::new(ManualClock::new(START));
        let store = leased(&clock, horizon_ms);
        let quota = Quota::per_second(limit_per_s).unwrap().with_burst(burst).unwrap();
        let limit = if gcra { Limit::gcra(quota) } else { Limit::token_bucket(quota) };
        let mut admitted = 0;
        for (cost, advance_ms) in steps {
            clock.advance(Duration::from_millis(advance_ms));
            let d = rt.block_on(store.decide(&request("k", limit).with_cost(cost))).unwrap();
            if d.is_allowed() {
                admitted += cost;
            }
            let elapsed = clock.now_us() - START;
            let bound = match gcra {
                true => burst + elapsed / quota.emission_interval_us(),
                false => burst + elapsed * limit_per_s / 1_000_000,
            };
            prop_assert!(admitted <= bound, "admitted {} > bound {} at +{} µs", admitted, bound, elapsed);
        }
    }
}

#[test]
fn concurrent_callers_on_one_key_share_its_lease_exactly() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let clock = Arc::new(ManualClock::new(START));
    let store = Arc::new(leased(&clock, 100));
    let capacity = 5_000;
    let quota = Quota::from_parts(1, 86_400_000_000, capacity).unwrap();
    let limit = Limit::gcra(quota);
    let admitted = Arc::new(AtomicU64::new(0));
    rt.block_on(async {
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (store, admitted) = (store.clone(), admitted.clone());
                tokio::spawn(async move {
                    for _ in 0..1_000 {
                        if store
                            .decide(&request("k", limit))
                            .await
                            .unwrap()
                            .is_allowed()
                        {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
    let admitted = admitted.load(Ordering::Relaxed);
    let stats = store.stats();
    let in_store = store
        .inner()
        .decide_sync(&request("k", limit).with_cost(0))
        .remaining();
    assert_eq!(
        admitted, capacity,
        "8 000 requests on 5 000 units: {stats:?}"
    );
    assert_eq!(in_store + stats.held + admitted, capacity, "{stats:?}");
    assert!(stats.store_calls < 200, "{stats:?}");
    clock.advance(Duration::from_millis(101));
    rt.block_on(store.sweep());
    assert_eq!(store.stats().held, 0);
}

#[tokio::test]
async fn other_policies_peeks_and_windows_go_to_the_store() {
    let clock = Arc::new(ManualClock::new(START));
    let store = leased(&clock, 100);
    let gcra = Limit::gcra(Quota::per_second(10).unwrap());
    // Another policy: every decision is the store's, nothing is held.
    for _ in 0..10 {
        assert!(store.check("k", gcra).await.unwrap().is_allowed());
    }
    assert!(store.check("k", gcra).await.unwrap().is_denied());
    // A window algorithm under a leased policy.
    let window = Limit::fixed_window(Quota::per_second(3).unwrap());
    for _ in 0..3 {
        assert!(
            store
                .decide(&request("w", window))
                .await
                .unwrap()
                .is_allowed()
        );
    }
    assert!(
        store
            .decide(&request("w", window))
            .await
            .unwrap()
            .is_denied()
    );
    // A peek reads the store.
    assert_eq!(
        store
            .decide(&request("p", gcra).with_cost(0))
            .await
            .unwrap()
            .remaining(),
        10
    );
    assert_eq!(store.stats().store_calls, 0);
    assert_eq!(store.stats().held, 0);
}

#[tokio::test]
async fn a_quiet_key_takes_single_units_and_a_hot_key_larger_leases() {
    let clock = Arc::new(ManualClock::new(START));
    let store = leased(&clock, 100);
    let limit = Limit::gcra(Quota::per_second(100_000).unwrap());
    // Quiet: one request per second; each lease ended before the next request.
    for _ in 0..5 {
        assert!(
            store
                .decide(&request("quiet", limit))
                .await
                .unwrap()
                .is_allowed()
        );
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(store.stats().taken, 5);
    // Hot: 10 000 requests in 100 ms (one per 10 µs): a handful of store calls.
    let before = store.stats().store_calls;
    for _ in 0..10_000 {
        assert!(
            store
                .decide(&request("hot", limit))
                .await
                .unwrap()
                .is_allowed()
        );
        clock.advance(Duration::from_micros(10));
    }
    let calls = store.stats().store_calls - before;
    assert!(calls < 40, "{calls} store calls for 10 000 decisions");
}

/// Records the lease events an observer receives.
#[derive(Default)]
struct Recorder {
    taken: AtomicU64,
    returned: AtomicU64,
    held: AtomicU64,
}

impl distlimit_lease::LeaseObserver for Recorder {
    fn on_lease_taken(&self, _store: &'static str, _policy: &str, units: u64) {
        self.taken.fetch_add(units, Ordering::Relaxed);
    }
    fn on_lease_returned(&self, _store: &'static str, _policy: &str, units: u64) {
        self.returned.fetch_add(units, Ordering::Relaxed);
    }
    fn on_lease_units(&self, _store: &'static str, held: u64) {
        self.held.store(held, Ordering::Relaxed);
    }
}

#[tokio::test]
async fn the_observer_sees_what_the_stats_count() {
    let clock = Arc::new(ManualClock::new(START));
    let recorder = Arc::new(Recorder::default());
    let store = Leased::for_policies(["hot"])
        .clock(clock.clone())
        .observer(recorder.clone())
        .build(MemoryStore::builder().clock(clock.clone()).build());
    let limit = Limit::token_bucket(Quota::per_second(1_000).unwrap());
    // Half the limit: leases hold more than they spend, and the sweep returns the rest.
    for i in 0..3_000u64 {
        store.decide(&request("k", limit)).await.unwrap();
        clock.advance(Duration::from_micros(2_000 + i % 7));
    }
    clock.advance(Duration::from_secs(1));
    store.sweep().await;
    let stats = store.stats();
    assert!(stats.taken > 0 && stats.returned > 0, "{stats:?}");
    assert_eq!(recorder.taken.load(Ordering::Relaxed), stats.taken);
    assert_eq!(recorder.returned.load(Ordering::Relaxed), stats.returned);
    assert_eq!(recorder.held.load(Ordering::Relaxed), 0);
}

/// The memory store, failing every call while `down`.
struct Switch {
    store: Inner,
    down: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Store for Switch {
    async fn decide(&self, request: &Request<'_>) -> Result<distlimit_core::Decision, Error> {
        self.check()?;
        self.store.decide(request).await
    }

    async fn decide_all(
        &self,
        requests: &[Request<'_>],
    ) -> Result<Vec<distlimit_core::Decision>, Error> {
        self.check()?;
        self.store.decide_all(requests).await
    }
}

#[async_trait::async_trait]
impl LeaseStore for Switch {
    async fn exchange(
        &self,
        request: &Request<'_>,
        give_back: u64,
        want: u64,
    ) -> Result<distlimit_core::Grant, Error> {
        self.check()?;
        self.store.exchange(request, give_back, want).await
    }
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

#[tokio::test]
async fn a_failing_store_leaves_what_is_held_to_spend_then_its_error() {
    let clock = Arc::new(ManualClock::new(START));
    let store = Leased::for_policies(["hot"])
        .clock(clock.clone())
        .build(Switch {
            store: MemoryStore::builder().clock(clock.clone()).build(),
            down: Default::default(),
        });
    let limit = Limit::gcra(Quota::per_hour(1_000).unwrap());
    // Grow the lease: 1, 2, 4, 8 units per store call; 12 spent, 3 held.
    for _ in 0..12 {
        assert!(
            store
                .decide(&request("k", limit))
                .await
                .unwrap()
                .is_allowed()
        );
    }
    let held = store.stats().held;
    assert!(held > 0, "{:?}", store.stats());
    store.inner().down.store(true, Ordering::Relaxed);
    for _ in 0..held {
        assert!(
            store
                .decide(&request("k", limit))
                .await
                .unwrap()
                .is_allowed()
        );
    }
    let err = store.decide(&request("k", limit)).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    // An ended lease whose give-back fails: its units are counted lost, never spent.
    store.inner().down.store(false, Ordering::Relaxed);
    for _ in 0..3 {
        store.decide(&request("k", limit)).await.unwrap();
    }
    let held = store.stats().held;
    store.inner().down.store(true, Ordering::Relaxed);
    clock.advance(Duration::from_millis(101));
    assert!(store.decide(&request("k", limit)).await.is_err());
    assert_eq!(store.stats().lost, held);
    assert_eq!(store.stats().held, 0);
}

/// A batch of a leased request and a request the store decides (another policy): the leased
/// one is served by its lease, and a batch denied by either charges neither.
#[tokio::test]
async fn a_mixed_batch_spends_the_lease_all_or_nothing() {
    let clock = Arc::new(ManualClock::new(START));
    let store = leased(&clock, 60_000);
    // Neither refills during the test: 5 for the leased key, 1 for the store's.
    let hot = Limit::token_bucket(Quota::per_hour(5).unwrap());
    let cold = Limit::token_bucket(Quota::per_hour(1).unwrap());
    let batch = [
        request("alice", hot),
        Request::new(Key::new("10.0.0.1").unwrap(), cold)
            .with_policy("cold")
            .unwrap(),
    ];
    let first = store.decide_all(&batch).await.unwrap();
    assert!(first.iter().all(|d| d.is_allowed()), "{first:?}");
    // The store's limit is spent: every later batch is denied and charges "alice" nothing.
    for _ in 0..10 {
        let denied = store.decide_all(&batch).await.unwrap();
        assert!(denied[1].is_denied(), "{denied:?}");
    }
    let mut admitted = 0;
    for _ in 0..10 {
        if store.decide(&batch[0]).await.unwrap().is_allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 4, "alice spent 1 of 5 in the one admitted batch");
    // The leased request was decided from its lease, not by the store.
    assert!(store.stats().local > 0, "{:?}", store.stats());
    // Nothing held is lost: the store, the lease and what was admitted add up to 5.
    let stats = store.stats();
    let left = store
        .inner()
        .decide(&batch[0].with_cost(0))
        .await
        .unwrap()
        .remaining();
    assert_eq!(left + stats.held + 5, 5, "{stats:?}");
}
