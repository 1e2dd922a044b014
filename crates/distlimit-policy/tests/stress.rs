//! Two threads decide while a third publishes thousands of policy sets: every verdict must
//! match exactly one published set (never a mix of two), and concurrent updates are all kept.
//! Bounded in count and in time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use distlimit_core::{Limit, Quota};
use distlimit_memory::MemoryStore;
use distlimit_policy::{Limiter, Policy, PolicySet, Tier};

/// Sets published by the swapping thread.
const GENERATIONS: u64 = 5_000;
/// Decisions per deciding thread, at most.
const MAX_DECISIONS: u64 = 2_000_000;
/// Wall-time bound of each phase.
const TIME_BOUND: Duration = Duration::from_secs(20);

const BASE: u64 = 1_000_000;

/// Generation `g`: three tiers whose limits and periods all encode `g`.
fn generation(g: u64) -> PolicySet {
    let q =
        |limit: u64, period_ms: u64| Quota::new(limit, Duration::from_millis(period_ms)).unwrap();
    PolicySet::builder()
        .policy(
            Policy::new("p")
                .tier(Tier::new("a", Limit::token_bucket(q(BASE + g, 1_000 + g))))
                .tier(Tier::new("b", Limit::gcra(q(2 * BASE + g, 2_000 + g))))
                .tier(Tier::new("c", Limit::fixed_window(q(3 * BASE + g, 3_000 + g))).global()),
        )
        .policy(Policy::new("single").tier(Tier::new(
            "only",
            Limit::token_bucket(q(BASE + g, 1_000 + g)),
        )))
        .build()
        .unwrap()
}

/// The generation a verdict was decided with; panics if its tiers belong to different ones or
/// if the store was asked with other limits than the verdict reports.
fn generation_of(verdict: &distlimit_policy::Verdict) -> u64 {
    let mut seen = None;
    for (i, tier) in verdict.tiers().enumerate() {
        let i = i as u64 + 1;
        let g = tier.limit() - i * BASE;
        assert_eq!(
            tier.period(),
            Duration::from_millis(i * 1_000 + g),
            "tier {i}"
        );
        // The store decided with this very quota: its capacity is the one reported.
        assert_eq!(tier.decision().limit(), tier.limit(), "tier {i}");
        match seen {
            None => seen = Some(g),
            Some(first) => assert_eq!(first, g, "a verdict mixes generations"),
        }
    }
    seen.expect("no tiers")
}

#[test]
fn every_verdict_matches_exactly_one_published_set() {
    let limiter = Arc::new(Limiter::new(Arc::new(MemoryStore::new()), generation(0)));
    let done = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicU64::new(0));
    let started = Instant::now();

    let deciders: Vec<_> = (0..2)
        .map(|t| {
            let limiter = limiter.clone();
            let done = done.clone();
            let progress = progress.clone();
            thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    let mut last = 0;
                    let mut decisions = 0u64;
                    let mut generations_seen = 0u64;
                    while !done.load(Ordering::Relaxed)
                        && decisions < MAX_DECISIONS
                        && started.elapsed() < TIME_BOUND
                    {
                        let policy = if decisions % 4 == 3 { "single" } else { "p" };
                        let key = format!("k{t}-{}", decisions % 64);
                        let verdict = limiter.check(policy, key.as_bytes()).await.unwrap();
                        let g = generation_of(&verdict);
                        assert!(g >= last, "generation went back from {last} to {g}");
                        assert!(g <= GENERATIONS);
                        if g != last {
                            generations_seen += 1;
                        }
                        last = g;
                        decisions += 1;
                        progress.fetch_add(1, Ordering::Relaxed);
                    }
                    (decisions, generations_seen)
                })
            })
        })
        .collect();

    let swapper = {
        let limiter = limiter.clone();
        let progress = progress.clone();
        thread::spawn(move || {
            let mut published = 0;
            for g in 1..=GENERATIONS {
                if started.elapsed() >= TIME_BOUND {
                    break;
                }
                // Let the deciders see this set: wait for a few decisions (or the time bound).
                let seen = progress.load(Ordering::Relaxed);
                while progress.load(Ordering::Relaxed) < seen + 4 && started.elapsed() < TIME_BOUND
                {
                    thread::yield_now();
                }
                limiter.replace(generation(g)).unwrap();
                published = g;
            }
            published
        })
    };
    let published = swapper.join().unwrap();
    done.store(true, Ordering::Relaxed);
    let results: Vec<_> = deciders.into_iter().map(|d| d.join().unwrap()).collect();
    eprintln!("published {published} sets; decisions and generations seen per thread: {results:?}");
    assert!(
        published >= 1_000,
        "only {published} sets published in time"
    );
    let generations_seen: u64 = results.iter().map(|r| r.1).sum();
    assert!(
        generations_seen >= 100,
        "the deciders saw only {generations_seen} sets change"
    );
    assert_eq!(generation_of_policy(&limiter.policies()), published);
}

fn generation_of_policy(set: &PolicySet) -> u64 {
    set.get("p").unwrap().tiers()[0].quota().limit() - BASE
}

#[test]
fn concurrent_updates_are_all_kept() {
    const UPDATES: u64 = 2_000;
    let set = PolicySet::builder()
        .policy(Policy::new("x").tier(Tier::new("t", Limit::gcra(Quota::per_second(1).unwrap()))))
        .policy(Policy::new("y").tier(Tier::new("t", Limit::gcra(Quota::per_second(1).unwrap()))))
        .build()
        .unwrap();
    let limiter = Arc::new(Limiter::new(Arc::new(MemoryStore::new()), set));
    let started = Instant::now();
    let updaters: Vec<_> = ["x", "y"]
        .into_iter()
        .map(|name| {
            let limiter = limiter.clone();
            thread::spawn(move || {
                let mut last = 0;
                for limit in 2..=UPDATES {
                    if started.elapsed() >= TIME_BOUND {
                        break;
                    }
                    limiter
                        .update_policy(name, limit, Duration::from_secs(1))
                        .unwrap();
                    last = limit;
                }
                last
            })
        })
        .collect();
    let lasts: Vec<u64> = updaters.into_iter().map(|u| u.join().unwrap()).collect();
    let set = limiter.policies();
    for (name, last) in ["x", "y"].into_iter().zip(lasts) {
        assert_eq!(
            set.get(name).unwrap().tiers()[0].quota().limit(),
            last,
            "{name}"
        );
    }
}
