//! What a policy change does to the state keys already have, per algorithm and kind of change
//! (raised, lowered, window changed, algorithm changed): the table in the crate documentation.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use distlimit_core::{Algorithm, ManualClock};
use distlimit_memory::MemoryStore;
use distlimit_policy::{Limiter, PolicySet};

/// An instant 30 minutes and 30 seconds into an hour (and 30 s into a minute).
const T0: u64 = 1_699_999_200_000_000 + 30 * 60_000_000 + 30_000_000;

type L = Limiter<MemoryStore<ManualClock>>;

fn limiter(algorithm: Algorithm, limit: u64, per: &str) -> (L, ManualClock) {
    assert_eq!(T0 % 3_600_000_000, 1_830_000_000);
    let clock = ManualClock::new(T0);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    (
        Limiter::new(Arc::new(store), set(algorithm, limit, per)),
        clock,
    )
}

fn set(algorithm: Algorithm, limit: u64, per: &str) -> PolicySet {
    PolicySet::from_toml_str(&format!(
        "[[policy]]\nname = \"p\"\ntiers = [ {{ name = \"t\", algorithm = \"{algorithm}\", \
         limit = {limit}, per = \"{per}\" }} ]"
    ))
    .unwrap()
}

async fn spend(l: &L, n: u64) {
    for _ in 0..n {
        assert!(l.check("p", b"k").await.unwrap().is_allowed());
    }
}

/// Units the key could spend now (a peek charges nothing).
async fn available(l: &L) -> u64 {
    l.peek("p", b"k").await.unwrap().decision().remaining()
}

const SECOND: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn token_bucket_and_gcra_carry_the_units_spent() {
    for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
        // Raised: the units spent carry over, the rest of the new burst passes at once.
        let (l, _) = limiter(algorithm, 2, "1s");
        spend(&l, 2).await;
        l.update_policy("p", 10, SECOND).unwrap();
        assert_eq!(available(&l).await, 8, "{algorithm}");

        // The issue's case: 1 per hour spent and denied, raised to 60 per minute: admitted at
        // once, then refilled at the new rate.
        let (l, clock) = limiter(algorithm, 1, "1h");
        spend(&l, 1).await;
        assert!(!l.check("p", b"k").await.unwrap().is_allowed());
        l.update_policy("p", 60, MINUTE).unwrap();
        spend(&l, 59).await;
        let v = l.check("p", b"k").await.unwrap();
        assert!(!v.is_allowed(), "{algorithm}");
        assert_eq!(v.decision().retry_after(), SECOND, "{algorithm}");
        clock.advance(SECOND);
        spend(&l, 1).await;

        // Lowered from half full: the units spent are capped at the new burst, never a fresh
        // bucket.
        let (l, _) = limiter(algorithm, 10, "1s");
        spend(&l, 5).await;
        l.update_policy("p", 2, SECOND).unwrap();
        assert_eq!(available(&l).await, 0, "{algorithm}");

        // Window lengthened (10/s to 10/min), all spent: still all spent, refilling at the new
        // rate (one every 6 s) from the first request under it.
        let (l, clock) = limiter(algorithm, 10, "1s");
        spend(&l, 10).await;
        l.update_policy("p", 10, MINUTE).unwrap();
        let v = l.check("p", b"k").await.unwrap();
        assert!(!v.is_allowed(), "{algorithm}");
        assert_eq!(
            v.decision().retry_after(),
            Duration::from_secs(6),
            "{algorithm}"
        );
        clock.advance(Duration::from_secs(6));
        assert_eq!(available(&l).await, 1, "{algorithm}");
    }
}

#[tokio::test]
async fn window_algorithms_keep_the_units_counted() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
    ] {
        // Raised: the units already used still count; the rest of the new limit is available.
        let (l, _) = limiter(algorithm, 5, "1m");
        spend(&l, 3).await;
        l.update_policy("p", 10, MINUTE).unwrap();
        assert_eq!(available(&l).await, 7, "{algorithm}");

        // Lowered below what was used: nothing is available until the window moves on.
        let (l, clock) = limiter(algorithm, 5, "1m");
        spend(&l, 3).await;
        l.update_policy("p", 2, MINUTE).unwrap();
        assert_eq!(available(&l).await, 0, "{algorithm}");
        let v = l.check("p", b"k").await.unwrap();
        assert!(!v.is_allowed(), "{algorithm}");
        clock.advance(v.decision().retry_after());
        assert!(
            l.check("p", b"k").await.unwrap().is_allowed(),
            "{algorithm}"
        );

        // Window lengthened (5/min to 5/h): the units used still count.
        let (l, _) = limiter(algorithm, 5, "1m");
        spend(&l, 3).await;
        l.update_policy("p", 5, HOUR).unwrap();
        assert_eq!(available(&l).await, 2, "{algorithm}");
    }
}

#[tokio::test]
async fn a_shortened_window_keeps_the_log_and_carries_the_count_into_the_new_window() {
    // 5/h to 5/min, 30 minutes into the hour. The log keeps entries of the last minute.
    let (l, clock) = limiter(Algorithm::SlidingLog, 5, "1h");
    spend(&l, 3).await;
    l.update_policy("p", 5, MINUTE).unwrap();
    assert_eq!(available(&l).await, 2);
    clock.advance(MINUTE);
    assert_eq!(available(&l).await, 5);

    // The aligned algorithms: the count of the hour carries into the current minute (a shorter
    // window is never a fresh one), and leaves with it.
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let (l, clock) = limiter(algorithm, 5, "1h");
        spend(&l, 3).await;
        l.update_policy("p", 5, MINUTE).unwrap();
        assert_eq!(available(&l).await, 2, "{algorithm}");
        spend(&l, 1).await;
        clock.advance(2 * MINUTE);
        assert_eq!(available(&l).await, 5, "{algorithm}");
    }
}

#[tokio::test]
async fn a_new_algorithm_starts_fresh_and_going_back_finds_the_old_state_replaced() {
    for (from, to) in [
        (Algorithm::TokenBucket, Algorithm::Gcra),
        (Algorithm::Gcra, Algorithm::FixedWindow),
        (Algorithm::FixedWindow, Algorithm::SlidingWindow),
    ] {
        let (l, _) = limiter(from, 3, "1h");
        spend(&l, 3).await;
        l.replace(set(to, 3, "1h")).unwrap();
        assert_eq!(available(&l).await, 3, "{from} -> {to}");
        spend(&l, 1).await;
        l.replace(set(from, 3, "1h")).unwrap();
        // The state is now the new algorithm's: the old one counts as fresh again.
        assert_eq!(available(&l).await, 3, "{to} -> {from}");
    }
}

#[tokio::test]
async fn a_burst_equal_to_the_limit_follows_it_and_another_burst_is_kept() {
    let (l, _) = limiter(Algorithm::TokenBucket, 10, "1s");
    l.update_policy("p", 20, SECOND).unwrap();
    assert_eq!(
        l.policies().get("p").unwrap().tiers()[0].quota().burst(),
        20
    );

    let l = Limiter::new(
        Arc::new(MemoryStore::new()),
        PolicySet::from_toml_str(
            "[[policy]]\nname = \"p\"\ntiers = [ { name = \"t\", limit = 10, per = \"1s\", burst = 50 } ]",
        )
        .unwrap(),
    );
    l.update_policy("p/t", 20, SECOND).unwrap();
    let quota = *l.policies().get("p").unwrap().tiers()[0].quota();
    assert_eq!((quota.limit(), quota.burst()), (20, 50));
    // An invalid change is rejected and changes nothing.
    let e = l.update_policy("p/t", 0, SECOND).unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"policy "p", tier "t": limit: must be at least 1"#
    );
    assert_eq!(*l.policies().get("p").unwrap().tiers()[0].quota(), quota);
    assert_eq!(
        l.update_policy("nope", 1, SECOND).unwrap_err().to_string(),
        r#"policy "nope": name: no such policy"#
    );
}
