//! The breaker's state machine driven by a fault-injecting primary (scripted errors, delays and
//! hangs), a `ManualClock` for the cool-off and Tokio's paused clock for the time budget: every
//! test is deterministic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlimit_core::{
    BreakerState, Error, Key, Limit, ManualClock, Observer, Quota, Request, Source, Store, StoreExt,
};
use distlimit_hybrid::{ConfigError, FailureMode, Hybrid, OpenRule};
use distlimit_memory::MemoryStore;
use distlimit_test::{EPOCH_US, Fault, FaultKind, FaultyStore};

type Primary = FaultyStore<MemoryStore<ManualClock>>;
type HybridStore = Hybrid<Primary, MemoryStore<ManualClock>, ManualClock>;

const BUDGET: Duration = Duration::from_millis(50);
const COOL_OFF: Duration = Duration::from_secs(5);

/// Records every event as a line.
#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

impl Recorder {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl Observer for Recorder {
    fn on_store_error(&self, store: &'static str, policy: &str, error: &Error) {
        let line = format!("error {store} {policy:?} {}", error.kind());
        self.0.lock().unwrap().push(line);
    }

    fn on_breaker(&self, store: &'static str, from: BreakerState, to: BreakerState) {
        let line = format!("breaker {store} {}->{}", from.as_str(), to.as_str());
        self.0.lock().unwrap().push(line);
    }
}

struct Rig {
    store: Arc<HybridStore>,
    clock: ManualClock,
    events: Arc<Recorder>,
}

impl Rig {
    fn primary(&self) -> &Primary {
        self.store.primary()
    }
}

type RigBuilder = distlimit_hybrid::Builder<Primary, MemoryStore<ManualClock>, ManualClock>;

fn rig(configure: impl FnOnce(RigBuilder) -> RigBuilder) -> Rig {
    let clock = ManualClock::new(EPOCH_US);
    let events = Arc::new(Recorder::default());
    let builder = Hybrid::builder(
        FaultyStore::new(MemoryStore::with_clock(clock.clone())),
        MemoryStore::with_clock(clock.clone()),
    )
    .clock(clock.clone())
    .name("redis")
    .budget(BUDGET)
    // A fixed cool-off: the doubling one has its own test.
    .first_cool_off(COOL_OFF)
    .cool_off(COOL_OFF)
    // The state machine's tests open at the first failure; the default rule has its own tests.
    .open_after(OpenRule::ConsecutiveFailures(1))
    .observer(events.clone());
    Rig {
        store: Arc::new(configure(builder).build().unwrap()),
        clock,
        events,
    }
}

fn limit() -> Limit {
    Limit::token_bucket(Quota::per_minute(60).unwrap().with_burst(8).unwrap())
}

#[tokio::test(start_paused = true)]
async fn closed_decisions_come_from_the_primary() {
    let r = rig(|b| b);
    let d = r.store.check("k", limit()).await.unwrap();
    assert_eq!(d.source(), Source::Primary);
    assert_eq!(d.remaining(), 7);
    assert_eq!(r.store.breaker_state(), BreakerState::Closed);
    assert_eq!(r.primary().inner_calls(), 1);
    assert_eq!(r.store.stats().primary_calls, 1);
    assert!(r.events.take().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_transient_error_opens_and_the_fallback_answers_without_the_primary() {
    let r = rig(|b| b);
    r.primary().push(Fault::Fail(FaultKind::Unavailable));
    let d = r.store.check("k", limit()).await.unwrap();
    assert_eq!(d.source(), Source::Fallback);
    assert_eq!(r.store.breaker_state(), BreakerState::Open);
    assert_eq!(
        r.events.take(),
        ["error redis \"\" unavailable", "breaker redis closed->open"]
    );
    for _ in 0..100 {
        let d = r.store.check("k", limit()).await.unwrap();
        assert_eq!(d.source(), Source::Fallback);
        r.clock.advance(Duration::from_millis(10)); // 1 s in all, within the cool-off
    }
    assert_eq!(r.primary().calls(), 1, "open: the primary is not touched");
    let stats = r.store.stats();
    assert_eq!(
        (stats.opened, stats.fallback, stats.primary_errors),
        (1, 101, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn after_the_cool_off_one_probe_closes_the_breaker() {
    let r = rig(|b| b);
    r.primary().push(Fault::Fail(FaultKind::Timeout(BUDGET)));
    r.store.check("k", limit()).await.unwrap();
    r.clock.advance(COOL_OFF - Duration::from_micros(1));
    assert_eq!(
        r.store.check("k", limit()).await.unwrap().source(),
        Source::Fallback
    );
    assert_eq!(r.primary().calls(), 1);
    r.clock.advance(Duration::from_micros(1));
    let probe = r.store.check("k", limit()).await.unwrap();
    assert_eq!(probe.source(), Source::Primary);
    assert_eq!(r.store.breaker_state(), BreakerState::Closed);
    assert_eq!(
        r.events.take(),
        [
            "error redis \"\" timeout",
            "breaker redis closed->open",
            "breaker redis open->half_open",
            "breaker redis half_open->closed",
        ]
    );
    assert_eq!(r.primary().calls(), 2);
    assert_eq!(r.store.stats().probes, 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_restarts_the_cool_off() {
    let r = rig(|b| b);
    r.primary().push_n(Fault::Fail(FaultKind::Unavailable), 2);
    r.store.check("k", limit()).await.unwrap();
    r.clock.advance(COOL_OFF);
    assert_eq!(
        r.store.check("k", limit()).await.unwrap().source(),
        Source::Fallback
    );
    assert_eq!(r.store.breaker_state(), BreakerState::Open);
    assert_eq!(r.primary().calls(), 2);
    // A new cool-off from the failed probe.
    r.clock.advance(COOL_OFF - Duration::from_micros(1));
    r.store.check("k", limit()).await.unwrap();
    assert_eq!(r.primary().calls(), 2);
    r.clock.advance(Duration::from_micros(1));
    assert_eq!(
        r.store.check("k", limit()).await.unwrap().source(),
        Source::Primary
    );
    assert_eq!(
        r.events.take()[2..],
        [
            "breaker redis open->half_open",
            "error redis \"\" unavailable",
            "breaker redis half_open->open",
            "breaker redis open->half_open",
            "breaker redis half_open->closed",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_cool_off_doubles_from_the_first_while_probes_fail() {
    let first = COOL_OFF / 8;
    let r = rig(|b| b.first_cool_off(first));
    // The opening failure and three failed probes.
    r.primary().push_n(Fault::Fail(FaultKind::Unavailable), 4);
    r.store.check("k", limit()).await.unwrap();
    for (probe, wait) in [first, 2 * first, 4 * first].into_iter().enumerate() {
        r.clock.advance(wait - Duration::from_micros(1));
        r.store.check("k", limit()).await.unwrap();
        assert_eq!(
            r.primary().calls(),
            1 + probe as u64,
            "no probe before {wait:?}"
        );
        r.clock.advance(Duration::from_micros(1));
        r.store.check("k", limit()).await.unwrap();
        assert_eq!(
            r.primary().calls(),
            2 + probe as u64,
            "a probe after {wait:?}"
        );
    }
    // Then 8 x first, which is the whole cool-off here: it doubles no further.
    r.clock.advance(COOL_OFF - Duration::from_micros(1));
    r.store.check("k", limit()).await.unwrap();
    assert_eq!(r.primary().calls(), 4);
    r.clock.advance(Duration::from_micros(1));
    assert_eq!(
        r.store.check("k", limit()).await.unwrap().source(),
        Source::Primary
    );
    // Closed: the next outage starts again from the first cool-off.
    r.primary().push(Fault::Fail(FaultKind::Unavailable));
    r.store.check("k", limit()).await.unwrap();
    assert_eq!(r.store.breaker_state(), BreakerState::Open);
    r.clock.advance(first);
    assert_eq!(
        r.store.check("k", limit()).await.unwrap().source(),
        Source::Primary
    );
}

#[tokio::test(start_paused = true)]
async fn while_one_caller_probes_everyone_else_uses_the_fallback() {
    let r = rig(|b| b);
    r.primary().push(Fault::Fail(FaultKind::Unavailable));
    r.store.check("k", limit()).await.unwrap();
    r.clock.advance(COOL_OFF);
    // The probe takes a while (within the budget); 31 more callers arrive meanwhile.
    r.primary().push(Fault::Delay(BUDGET / 2));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let store = r.store.clone();
            tokio::spawn(async move {
                let key = format!("k{i}");
                store.check(&key, limit()).await.unwrap().source()
            })
        })
        .collect();
    let mut sources = Vec::new();
    for t in tasks {
        sources.push(t.await.unwrap());
    }
    let primary = sources.iter().filter(|&&s| s == Source::Primary).count();
    assert_eq!(
        r.primary().calls(),
        2,
        "exactly one probe reached the primary"
    );
    assert_eq!(primary, 1, "{sources:?}");
    assert_eq!(r.store.stats().probes, 1);
    assert_eq!(r.store.breaker_state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_hung_primary_costs_one_budget_per_cool_off() {
    let r = rig(|b| b);
    r.primary().set_default(Fault::Hang);
    let mut waited = Vec::new();
    // 60 s of traffic, one decision every 100 ms.
    for _ in 0..600 {
        let start = tokio::time::Instant::now();
        let d = r.store.check("k", limit()).await.unwrap();
        assert_eq!(d.source(), Source::Fallback);
        waited.push(start.elapsed());
        r.clock.advance(Duration::from_millis(100));
    }
    assert!(
        waited.iter().all(|&w| w <= BUDGET),
        "no decision waits longer than the budget"
    );
    let slow = waited.iter().filter(|&&w| w == BUDGET).count();
    // The first call at 0 s, then one probe per 5 s cool-off: 5 s, 10 s, ... 55 s.
    assert_eq!(slow, 12, "decisions that waited the budget");
    assert_eq!(r.primary().calls() as usize, slow);
    assert_eq!(r.store.stats().timeouts as usize, slow);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_probe_lets_the_next_caller_probe() {
    let r = rig(|b| b);
    r.primary().push(Fault::Fail(FaultKind::Unavailable));
    r.store.check("k", limit()).await.unwrap();
    r.clock.advance(COOL_OFF);
    r.primary().push(Fault::Hang);
    // The caller gives up on the probe before the budget runs out.
    let gave_up = tokio::time::timeout(BUDGET / 5, r.store.check("k", limit())).await;
    assert!(gave_up.is_err());
    assert_eq!(r.store.breaker_state(), BreakerState::Open);
    let d = r.store.check("k", limit()).await.unwrap();
    assert_eq!(
        d.source(),
        Source::Primary,
        "the next caller probed at once"
    );
    assert_eq!(r.store.breaker_state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn consecutive_failures_rule() {
    let r = rig(|b| b.open_after(OpenRule::ConsecutiveFailures(3)));
    r.primary().extend([
        Fault::Fail(FaultKind::Unavailable),
        Fault::Fail(FaultKind::Unavailable),
        Fault::Pass,
        Fault::Fail(FaultKind::Unavailable),
        Fault::Fail(FaultKind::Unavailable),
    ]);
    for _ in 0..5 {
        r.store.check("k", limit()).await.unwrap();
    }
    assert_eq!(r.store.breaker_state(), BreakerState::Closed);
    r.primary()
        .push(Fault::Fail(FaultKind::Backend { transient: true }));
    r.store.check("k", limit()).await.unwrap();
    assert_eq!(r.store.breaker_state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn the_default_rule_opens_on_failures_that_last_not_on_a_burst() {
    let r = rig(|b| b.open_after(OpenRule::default()));
    // A burst: ten failures at one instant, then a success.
    r.primary()
        .push_n(Fault::Fail(FaultKind::Timeout(BUDGET)), 10);
    for _ in 0..10 {
        let d = r.store.check("k", limit()).await.unwrap();
        assert_eq!(d.source(), Source::Fallback);
    }
    assert_eq!(r.store.breaker_state(), BreakerState::Closed);
    assert_eq!(
        r.store.check("k", limit()).await.unwrap().source(),
        Source::Primary
    );
    // Failures that go on for 50 ms: the third, 50 ms after the first, opens.
    r.primary().set_default(Fault::Fail(FaultKind::Unavailable));
    for _ in 0..2 {
        r.store.check("k", limit()).await.unwrap();
        r.clock.advance(Duration::from_millis(25));
        assert_eq!(r.store.breaker_state(), BreakerState::Closed);
    }
    r.store.check("k", limit()).await.unwrap();
    assert_eq!(r.store.breaker_state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn failures_in_window_rule() {
    let rule = OpenRule::FailuresInWindow {
        failures: 3,
        window: Duration::from_secs(10),
    };
    let r = rig(|b| b.open_after(rule));
    r.primary().set_default(Fault::Fail(FaultKind::Unavailable));
    for _ in 0..2 {
        r.store.check("k", limit()).await.unwrap();
        r.clock.advance(Duration::from_secs(6));
    }
    // Failures at 0 s, 6 s, 12 s: never three within 10 s.
    r.store.check("k", limit()).await.unwrap();
    assert_eq!(r.store.breaker_state(), BreakerState::Closed);
    r.clock.advance(Duration::from_secs(1));
    // 6 s, 12 s, 13 s.
    r.store.check("k", limit()).await.unwrap();
    assert_eq!(r.store.breaker_state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn non_transient_replies_fail_over_but_invalid_batches_do_not() {
    let r = rig(|b| b);
    r.primary().push(Fault::Fail(FaultKind::Protocol));
    let d = r.store.check("k", limit()).await.unwrap();
    assert_eq!(d.source(), Source::Fallback);
    assert_eq!(r.store.breaker_state(), BreakerState::Open);

    let r = rig(|b| b);
    let key = Key::new("k").unwrap();
    let twice = [Request::new(key, limit()), Request::new(key, limit())];
    let e = r.store.decide_all(&twice).await.unwrap_err();
    assert!(e.is_invalid_input());
    let e = r.store.decide_all(&[]).await.unwrap_err();
    assert!(e.is_invalid_input());
    assert_eq!(r.primary().calls(), 0);
    assert_eq!(r.store.breaker_state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn failure_modes_per_policy() {
    let r = rig(|b| {
        b.failure_mode("open", FailureMode::FailOpen)
            .failure_mode("closed", FailureMode::FailClosed)
    });
    assert_eq!(r.store.failure_mode("open"), FailureMode::FailOpen);
    assert_eq!(r.store.failure_mode("other"), FailureMode::Fallback);
    // The limiter's tier states `<policy>/<tier>` inherit their policy's mode (typed, not
    // parsed: a policy named "open/daily" is not "open").
    let tier = |p: &str, t: &str| distlimit_core::StateName::of_tier(p, t).unwrap();
    let mode = |p: &str, t: &str| r.store.failure_mode_of(tier(p, t).to_ref());
    assert_eq!(mode("open", "daily"), FailureMode::FailOpen);
    assert_eq!(mode("closed", "second"), FailureMode::FailClosed);
    assert_eq!(mode("other", "open"), FailureMode::Fallback);
    assert_eq!(r.store.failure_mode("open/daily"), FailureMode::Fallback);
    let key = Key::new("k").unwrap();
    let closed = Request::new(key, limit()).with_policy("closed").unwrap();
    let open = Request::new(key, limit()).with_policy("open").unwrap();

    // The primary's own error while closed.
    r.primary().push(Fault::Fail(FaultKind::Unavailable));
    let e = r.store.decide(&closed).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::Unavailable {
                store: "faulty",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(r.store.breaker_state(), BreakerState::Open);
    // An error naming this store while open.
    let e = r.store.decide(&closed).await.unwrap_err();
    assert!(
        matches!(e, Error::Unavailable { store: "redis", .. }),
        "{e}"
    );
    assert!(e.to_string().contains("circuit breaker open"), "{e}");

    for _ in 0..20 {
        let d = r.store.decide(&open).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.source(), Source::FailOpen);
        assert_eq!((d.limit(), d.remaining()), (8, 7));
    }
    let d = r.store.check("k", limit()).await.unwrap();
    assert_eq!(d.source(), Source::Fallback);

    // A batch: any fail-closed policy fails it; fail-open ones are admitted next to the
    // fallback's decisions, all-or-nothing over what the fallback decides.
    let plain = Request::new(Key::new("b").unwrap(), limit());
    assert!(r.store.decide_all(&[plain, closed]).await.is_err());
    let ds = r.store.decide_all(&[open, plain]).await.unwrap();
    assert_eq!(
        ds.iter().map(|d| d.source()).collect::<Vec<_>>(),
        [Source::FailOpen, Source::Fallback]
    );
    let s = r.store.stats();
    assert_eq!((s.failed_closed, s.failed_open), (3, 21));
}

#[tokio::test(start_paused = true)]
async fn the_fallback_enforces_this_instances_share() {
    enforces_the_share(rig(|b| b.instances(4))).await;
}

async fn enforces_the_share(r: Rig) {
    r.primary().set_default(Fault::Fail(FaultKind::Unavailable));
    // Burst 8 over 4 instances: 2 here.
    let mut allowed = 0;
    for _ in 0..5 {
        let d = r.store.check("k", limit()).await.unwrap();
        assert_eq!((d.source(), d.limit()), (Source::Fallback, 2));
        allowed += usize::from(d.is_allowed());
    }
    assert_eq!(allowed, 2);
    // The rate is shared too: 60 per minute is 15 per minute here, one per 4 s.
    r.clock.advance(Duration::from_secs(4));
    assert!(r.store.check("k", limit()).await.unwrap().is_allowed());
    assert!(r.store.check("k", limit()).await.unwrap().is_denied());
    // Batches too.
    let batch = [Request::new(Key::new("j").unwrap(), limit()).with_cost(3)];
    assert!(r.store.decide_all(&batch).await.unwrap()[0].is_never());
    assert_eq!(r.store.stats().fallback, 8);
    assert_eq!(r.primary().calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_blocked_cache_answers_repeat_denials_until_retry_after() {
    let r = rig(|b| b);
    let strict = Limit::gcra(Quota::per_second(1).unwrap());
    assert!(r.store.check("abuser", strict).await.unwrap().is_allowed());
    let denied = r.store.check("abuser", strict).await.unwrap();
    assert_eq!(denied.source(), Source::Primary);
    assert_eq!(denied.retry_after(), Duration::from_secs(1));
    assert_eq!(r.primary().calls(), 2);
    for _ in 0..1000 {
        let d = r.store.check("abuser", strict).await.unwrap();
        assert_eq!(d.source(), Source::BlockedCache);
        r.clock.advance(Duration::from_micros(999));
    }
    let cached = r.store.check("abuser", strict).await.unwrap();
    assert_eq!(
        cached.retry_after(),
        Duration::from_micros(1_000_000 - 999_000)
    );
    assert_eq!(
        r.primary().calls(),
        2,
        "the flood never reached the primary"
    );
    // Another cost, a peek, a batch: still asked.
    r.store.check_cost("abuser", strict, 2).await.unwrap();
    r.store.peek("abuser", strict).await.unwrap();
    assert_eq!(r.primary().calls(), 4);
    // At retry_after the store is asked again, and admits.
    r.clock.advance(Duration::from_micros(1000));
    let d = r.store.check("abuser", strict).await.unwrap();
    assert_eq!((d.source(), d.is_allowed()), (Source::Primary, true));
    assert_eq!(r.store.stats().blocked, 1001);
}

#[tokio::test(start_paused = true)]
async fn a_flood_reaches_the_primary_once_per_retry_period() {
    let r = rig(|b| b);
    let strict = Limit::token_bucket(Quota::per_second(10).unwrap().with_burst(10).unwrap());
    let mut allowed = 0;
    // 100 000 requests over 10 s.
    for _ in 0..100_000 {
        allowed += usize::from(r.store.check("abuser", strict).await.unwrap().is_allowed());
        r.clock.advance(Duration::from_micros(100));
    }
    assert_eq!(allowed, 10 + 100 - 1);
    let calls = r.primary().calls() as usize;
    // Every admission, and one denial per retry period (100 ms, one token).
    assert!(calls <= allowed + 100, "{calls} primary calls");
    eprintln!("flood of 100 000: {calls} primary calls, {allowed} admitted");
}

#[tokio::test(start_paused = true)]
async fn without_the_cache_every_request_reaches_the_primary() {
    let r = rig(|b| b.blocked_cache(None));
    let strict = Limit::gcra(Quota::per_second(1).unwrap());
    for _ in 0..100 {
        r.store.check("abuser", strict).await.unwrap();
    }
    assert_eq!(r.primary().calls(), 100);
    assert_eq!(r.store.blocked_entries(), 0);
}

#[test]
fn invalid_configuration_is_a_typed_error() {
    let build = |f: fn(
        distlimit_hybrid::Builder<MemoryStore, MemoryStore>,
    ) -> distlimit_hybrid::Builder<MemoryStore, MemoryStore>| {
        f(Hybrid::builder(MemoryStore::new(), MemoryStore::new()))
            .build()
            .map(|_| ())
    };
    assert_eq!(
        build(|b| b.budget(Duration::ZERO)),
        Err(ConfigError::ZeroBudget)
    );
    assert_eq!(
        build(|b| b.cool_off(Duration::ZERO)),
        Err(ConfigError::ZeroCoolOff)
    );
    assert_eq!(build(|b| b.instances(0)), Err(ConfigError::ZeroInstances));
    assert_eq!(
        build(|b| b.open_after(OpenRule::ConsecutiveFailures(0))),
        Err(ConfigError::Failures(0))
    );
    assert_eq!(
        build(|b| b.open_after(OpenRule::Failing {
            failures: 0,
            for_at_least: Duration::from_millis(50)
        })),
        Err(ConfigError::Failures(0))
    );
    assert_eq!(
        build(|b| b.open_after(OpenRule::FailuresInWindow {
            failures: 5000,
            window: Duration::from_secs(1)
        })),
        Err(ConfigError::Failures(5000))
    );
    assert_eq!(
        build(|b| b.open_after(OpenRule::FailuresInWindow {
            failures: 5,
            window: Duration::ZERO
        })),
        Err(ConfigError::ZeroWindow)
    );
    assert_eq!(
        build(|b| b.blocked_cache(Some(0))),
        Err(ConfigError::ZeroBlockedEntries)
    );
    assert_eq!(
        build(|b| b.failure_mode(&"p".repeat(200), FailureMode::FailOpen)),
        Err(ConfigError::PolicyTooLong(200))
    );
    assert_eq!(build(|b| b), Ok(()));
    let store = Hybrid::builder(MemoryStore::new(), MemoryStore::new())
        .build()
        .unwrap();
    let shown = format!("{store:?}");
    assert!(
        shown.contains("Closed") && shown.contains("primary"),
        "{shown}"
    );
}

#[tokio::test(start_paused = true)]
async fn decide_now_answers_when_open_on_a_memory_fallback_and_from_the_blocked_cache() {
    let r = rig(|b| b.instances(4));
    let request = |key| Request::new(Key::new(key).unwrap(), limit());
    // Closed: a decision needs the primary.
    assert!(r.store.decide_now(&request("a")).is_none());
    assert_eq!(r.primary().calls(), 0);

    r.primary().push(Fault::Fail(FaultKind::Unavailable));
    r.store.check("opener", limit()).await.unwrap();
    assert_eq!(r.store.breaker_state(), BreakerState::Open);
    // Open: answered at once, exactly as `decide` answers the same fresh state.
    let now = r.store.decide_now(&request("a")).unwrap().unwrap();
    let awaited = r.store.decide(&request("b")).await.unwrap();
    assert_eq!(now, awaited);
    assert_eq!(now.source(), Source::Fallback);
    assert_eq!(now.limit(), 2, "this instance's share of the burst of 8");
    // And it charged: the same key continues from there.
    let next = r.store.decide_now(&request("a")).unwrap().unwrap();
    assert_eq!(next.remaining(), now.remaining() - 1);
    assert_eq!(r.primary().calls(), 1);

    // After the cool-off a probe is due: only `decide` may take it.
    r.clock.advance(COOL_OFF);
    assert!(r.store.decide_now(&request("a")).is_none());
    assert_eq!(r.store.breaker_state(), BreakerState::Open);
    let probe = r.store.decide(&request("a")).await.unwrap();
    assert_eq!(probe.source(), Source::Primary);
    assert_eq!(r.store.breaker_state(), BreakerState::Closed);

    // Closed with a denial in the blocked-key cache: answered from it.
    let strict = Limit::gcra(Quota::per_second(1).unwrap());
    let abuser = Request::new(Key::new("abuser").unwrap(), strict);
    assert!(r.store.decide(&abuser).await.unwrap().is_allowed());
    assert!(r.store.decide(&abuser).await.unwrap().is_denied());
    let calls = r.primary().calls();
    let cached = r.store.decide_now(&abuser).unwrap().unwrap();
    assert!(cached.is_denied());
    assert_eq!(cached.source(), Source::BlockedCache);
    assert_eq!(r.primary().calls(), calls);
    assert_eq!(r.store.stats().blocked, 1);
}

#[tokio::test(start_paused = true)]
async fn decide_now_is_none_when_the_fallback_must_be_awaited() {
    let clock = ManualClock::new(EPOCH_US);
    let awaited = FaultyStore::new(MemoryStore::with_clock(clock.clone()))
        .with_default(Fault::Delay(Duration::ZERO));
    let store = Hybrid::builder(
        FaultyStore::new(MemoryStore::with_clock(clock.clone()))
            .with_default(Fault::Fail(FaultKind::Unavailable)),
        awaited,
    )
    .clock(clock)
    .open_after(OpenRule::ConsecutiveFailures(1))
    .build()
    .unwrap();
    store.check("opener", limit()).await.unwrap();
    assert_eq!(store.breaker_state(), BreakerState::Open);
    let request = Request::new(Key::new("a").unwrap(), limit());
    assert!(store.decide_now(&request).is_none());
    assert_eq!(store.fallback().calls(), 1, "only the opener's decision");
    let fail_open = Hybrid::builder(
        FaultyStore::new(MemoryStore::new()).with_default(Fault::Fail(FaultKind::Unavailable)),
        FaultyStore::new(MemoryStore::new()).with_default(Fault::Delay(Duration::ZERO)),
    )
    .open_after(OpenRule::ConsecutiveFailures(1))
    .default_failure_mode(FailureMode::FailOpen)
    .build()
    .unwrap();
    fail_open.check("opener", limit()).await.unwrap();
    let d = fail_open.decide_now(&request).unwrap().unwrap();
    assert_eq!(d.source(), Source::FailOpen);
}

#[tokio::test(start_paused = true)]
async fn a_bad_state_is_that_requests_error_and_never_opens_the_breaker() {
    let r = rig(|b| b.failure_mode("strict", FailureMode::FailClosed));
    // One key's value is garbage: every request for it meets a bad state, the others do not.
    r.primary().extend([
        Fault::Fail(FaultKind::BadState),
        Fault::Pass,
        Fault::Fail(FaultKind::BadState),
        Fault::Pass,
        Fault::Fail(FaultKind::BadState),
    ]);
    for _ in 0..2 {
        let bad = r.store.check("garbage", limit()).await.unwrap();
        assert_eq!(
            bad.source(),
            Source::Fallback,
            "the failure mode answers it"
        );
        let good = r.store.check("healthy", limit()).await.unwrap();
        assert_eq!(good.source(), Source::Primary);
        assert_eq!(r.store.breaker_state(), BreakerState::Closed);
    }
    let strict = Request::new(Key::new("garbage").unwrap(), limit())
        .with_policy("strict")
        .unwrap();
    let e = r.store.decide(&strict).await.unwrap_err();
    assert!(matches!(e, Error::BadState { .. }), "{e}");
    assert_eq!(r.store.breaker_state(), BreakerState::Closed);
    assert_eq!(r.store.stats().opened, 0);
    assert_eq!(
        r.store.check("healthy", limit()).await.unwrap().source(),
        Source::Primary
    );
    let events = r.events.take();
    assert_eq!(
        events.iter().filter(|e| e.ends_with("bad_state")).count(),
        3,
        "{events:?}"
    );
    assert!(
        !events.iter().any(|e| e.starts_with("breaker")),
        "{events:?}"
    );

    // A probe that meets a bad state tells nothing of the primary: the next caller probes.
    r.primary().push(Fault::Fail(FaultKind::Unavailable));
    r.store.check("k", limit()).await.unwrap();
    assert_eq!(r.store.breaker_state(), BreakerState::Open);
    r.clock.advance(COOL_OFF);
    r.primary().push(Fault::Fail(FaultKind::BadState));
    let d = r.store.check("garbage", limit()).await.unwrap();
    assert_eq!(d.source(), Source::Fallback);
    assert_eq!(r.store.breaker_state(), BreakerState::Open);
    let d = r.store.check("healthy", limit()).await.unwrap();
    assert_eq!(
        d.source(),
        Source::Primary,
        "the next caller probed at once"
    );
    assert_eq!(r.store.breaker_state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_bad_state_in_a_batch_answers_the_batch_by_its_failure_mode() {
    let r = rig(|b| b);
    r.primary().push(Fault::Fail(FaultKind::BadState));
    let batch = [
        Request::new(Key::new("garbage").unwrap(), limit()),
        Request::new(Key::new("other").unwrap(), limit()),
    ];
    let decisions = r.store.decide_all(&batch).await.unwrap();
    assert!(decisions.iter().all(|d| d.source() == Source::Fallback));
    assert_eq!(r.store.breaker_state(), BreakerState::Closed);
}
