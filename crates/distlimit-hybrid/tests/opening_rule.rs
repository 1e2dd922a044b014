//! The measurement behind the default opening rule, and the test that keeps it: 64 paced tasks
//! (one per connection of a flood) deciding for 4 s of Tokio's paused time against a simulated
//! primary, under two overloads of a healthy primary and two real outages.
//!
//! * `stalls`: healthy (0.5 ms a call), but every second the instance stalls for 80 ms: every
//!   answer due in it arrives at its end, so every call sent in its first 30 ms runs out of the
//!   50 ms budget, together, and the calls after it succeed.
//! * `slow calls`: healthy, but one call in 500 takes 80 ms (isolated timeouts).
//! * `hung`: from 1 s on, no call ever answers (SIGSTOP): every call sent waits the budget.
//! * `refused`: from 1 s on, every call fails at once (SIGKILL: connection refused).
//!
//! For each rule: the decisions the fallback answered while the primary was healthy, and, in an
//! outage, the time from its start to the opening and the decisions that waited the whole
//! budget (the tasks' calls sent before the opening). Printed with
//! `cargo test -p distlimit-hybrid --test integration opening_rule:: -- --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use distlimit_core::{
    BreakerState, Clock, Decision, Error, Limit, Observer, Quota, Request, Settle, Store, StoreExt,
};
use distlimit_hybrid::{
    DEFAULT_BUDGET, DEFAULT_COOL_OFF, DEFAULT_FIRST_COOL_OFF, DEFAULT_OPEN_RULE, Hybrid, OpenRule,
};
use distlimit_memory::MemoryStore;
use distlimit_test::EPOCH_US;
use tokio::time::Instant;

const TASKS: usize = 64;
const PACE: Duration = Duration::from_millis(5);
const RUN: Duration = Duration::from_secs(4);
const OUTAGE_AT: Duration = Duration::from_secs(1);
const LATENCY: Duration = Duration::from_micros(500);
const STALL: Duration = Duration::from_millis(80);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    Stalls,
    SlowCalls,
    Hung,
    Refused,
}

/// Tokio's (paused) clock as wall-clock microseconds, so the cool-off follows the paused time.
#[derive(Clone, Copy)]
struct TokioClock(Instant);

impl Clock for TokioClock {
    fn now_us(&self) -> u64 {
        EPOCH_US + self.0.elapsed().as_micros() as u64
    }
}

/// The simulated primary.
struct Sim {
    start: Instant,
    scenario: Scenario,
    calls: AtomicU64,
}

#[async_trait]
#[warn(clippy::missing_trait_methods)]
impl Store for Sim {
    async fn decide(&self, _: &Request<'_>) -> Result<Decision, Error> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let at = self.start.elapsed();
        let ok = Ok(Decision::allowed(1000, 999, Duration::ZERO));
        match self.scenario {
            Scenario::Stalls => {
                // A stall in the middle of every second.
                let second = Duration::from_secs(at.as_secs());
                let stall = second + Duration::from_millis(500);
                if at >= stall && at < stall + STALL {
                    tokio::time::sleep_until(self.start + stall + STALL + LATENCY).await;
                } else {
                    tokio::time::sleep(LATENCY).await;
                }
                ok
            }
            Scenario::SlowCalls => {
                let slow = if n % 500 == 499 { STALL } else { LATENCY };
                tokio::time::sleep(slow).await;
                ok
            }
            Scenario::Hung if at >= OUTAGE_AT => std::future::pending().await,
            Scenario::Refused if at >= OUTAGE_AT => Err(Error::Unavailable {
                store: "sim",
                source: "connection refused".into(),
            }),
            Scenario::Hung | Scenario::Refused => {
                tokio::time::sleep(LATENCY).await;
                ok
            }
        }
    }

    async fn decide_all(&self, _: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        Err(Error::InvalidRequest("not simulated"))
    }

    fn decide_now(&self, _: &Request<'_>) -> Option<Result<Decision, Error>> {
        None
    }

    // Batches are always awaited (`decide_all`): `None` is always a correct answer.
    fn decide_all_now(&self, _: &[Request<'_>], _: &mut [Decision]) -> Option<Result<(), Error>> {
        None
    }

    async fn settle_all(&self, _: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        Err(Error::Unsupported("settling (not simulated)"))
    }
}

/// When the breaker first opened.
struct Opened {
    start: Instant,
    at_us: AtomicU64,
}

impl Observer for Opened {
    fn on_breaker(&self, _: &'static str, from: BreakerState, to: BreakerState) {
        if from == BreakerState::Closed && to == BreakerState::Open {
            let at = self.start.elapsed().as_micros() as u64;
            let _ = self
                .at_us
                .compare_exchange(u64::MAX, at, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
}

#[derive(Debug)]
struct Outcome {
    decisions: u64,
    fallback: u64,
    opened: u64,
    timeouts: u64,
    /// From the outage's start to the first opening.
    to_open: Option<Duration>,
}

async fn run(rule: OpenRule, scenario: Scenario) -> Outcome {
    let start = Instant::now();
    let opened = Arc::new(Opened {
        start,
        at_us: AtomicU64::new(u64::MAX),
    });
    let sim = Sim {
        start,
        scenario,
        calls: AtomicU64::new(0),
    };
    let store = Arc::new(
        Hybrid::builder(sim, MemoryStore::new())
            .clock(TokioClock(start))
            .open_after(rule)
            .observer(opened.clone() as Arc<dyn Observer>)
            .build()
            .unwrap(),
    );
    let limit = Limit::gcra(Quota::per_second(1_000_000).unwrap());
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let store = store.clone();
            tokio::spawn(async move {
                // Spread the tasks over one pace.
                tokio::time::sleep(PACE * task as u32 / TASKS as u32).await;
                let key = format!("user{task}");
                let mut decisions = 0;
                while start.elapsed() < RUN {
                    store.check(key.as_str(), limit).await.unwrap();
                    decisions += 1;
                    tokio::time::sleep(PACE).await;
                }
                decisions
            })
        })
        .collect();
    let mut decisions = 0;
    for task in tasks {
        decisions += task.await.unwrap();
    }
    let stats = store.stats();
    let at = opened.at_us.load(Ordering::Relaxed);
    let to_open = (at != u64::MAX)
        .then(|| Duration::from_micros(at).saturating_sub(OUTAGE_AT))
        .filter(|_| matches!(scenario, Scenario::Hung | Scenario::Refused));
    Outcome {
        decisions,
        fallback: stats.fallback,
        opened: stats.opened,
        timeouts: stats.timeouts,
        to_open,
    }
}

/// How many probes an open breaker makes within `open` while they all fail: one per cool-off,
/// each a budget long, the cool-off doubling from the first up to the full one.
fn probes_within(open: Duration) -> u64 {
    let (mut at, mut cool_off, mut probes) = (Duration::ZERO, DEFAULT_FIRST_COOL_OFF, 0);
    while at + cool_off <= open {
        at += cool_off + DEFAULT_BUDGET;
        cool_off = (cool_off * 2).min(DEFAULT_COOL_OFF);
        probes += 1;
    }
    probes
}

fn rules() -> Vec<(&'static str, OpenRule)> {
    vec![
        ("ConsecutiveFailures(1)", OpenRule::ConsecutiveFailures(1)),
        ("ConsecutiveFailures(5)", OpenRule::ConsecutiveFailures(5)),
        ("ConsecutiveFailures(64)", OpenRule::ConsecutiveFailures(64)),
        (
            "FailuresInWindow(10, 1 s)",
            OpenRule::FailuresInWindow {
                failures: 10,
                window: Duration::from_secs(1),
            },
        ),
        (
            "Failing(3, 25 ms)",
            OpenRule::Failing {
                failures: 3,
                for_at_least: Duration::from_millis(25),
            },
        ),
        ("Failing(3, 50 ms) default", DEFAULT_OPEN_RULE),
        (
            "Failing(3, 100 ms)",
            OpenRule::Failing {
                failures: 3,
                for_at_least: Duration::from_millis(100),
            },
        ),
    ]
}

#[tokio::test(start_paused = true)]
async fn the_default_rule_rides_out_overload_and_opens_on_an_outage() {
    eprintln!(
        "{TASKS} tasks, one decision per {PACE:?} each, {RUN:?}, budget {DEFAULT_BUDGET:?}, \
         stall {STALL:?}"
    );
    eprintln!(
        "| rule | stalls: fallback / decisions (opened) | slow calls: fallback (opened) | \
         hung: to open, calls that waited the budget | refused: to open |"
    );
    eprintln!("|---|---|---|---|---|");
    for (name, rule) in rules() {
        let stalls = run(rule, Scenario::Stalls).await;
        let slow = run(rule, Scenario::SlowCalls).await;
        let hung = run(rule, Scenario::Hung).await;
        let refused = run(rule, Scenario::Refused).await;
        let ms = |d: Option<Duration>| d.map_or("never".to_owned(), |d| format!("{d:?}"));
        eprintln!(
            "| {name} | {} / {} ({}) | {} ({}) | {}, {} | {} |",
            stalls.fallback,
            stalls.decisions,
            stalls.opened,
            slow.fallback,
            slow.opened,
            ms(hung.to_open),
            hung.timeouts,
            ms(refused.to_open),
        );
        if rule == DEFAULT_OPEN_RULE {
            // Overload of a healthy primary: only the calls that ran out of budget are answered
            // by the fallback, and the breaker never opens.
            assert_eq!(stalls.opened, 0, "{stalls:?}");
            assert_eq!(stalls.fallback, stalls.timeouts, "{stalls:?}");
            assert_eq!(slow.opened, 0, "{slow:?}");
            // A hung primary: open within two budgets, each task having waited at most two,
            // then one probe per cool-off (doubling from the first).
            let hung_open = hung.to_open.expect("a hung primary opens the breaker");
            assert!(hung_open <= 2 * DEFAULT_BUDGET + PACE, "{hung:?}");
            let open_for = RUN - OUTAGE_AT - hung_open;
            assert!(
                hung.timeouts <= 2 * TASKS as u64 + probes_within(open_for),
                "{hung:?}"
            );
            let refused_open = refused
                .to_open
                .expect("a refused primary opens the breaker");
            assert!(
                refused_open <= Duration::from_millis(50) + PACE,
                "{refused:?}"
            );
        }
    }
}
