//! The limiter on the memory store with a manual clock: tiers, global tiers, overrides, lists,
//! shadow mode, peeks, costs, errors and the observer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlimit_core::{Decision, Limit, ManualClock, NEVER, Observer, Outcome, Quota};
use distlimit_memory::MemoryStore;
use distlimit_policy::{CheckError, Checked, Limiter, Listed, Policy, PolicySet, Tier, Verdict};

const T0: u64 = 1_700_000_000_000_000;

fn limiter(set: PolicySet) -> (Limiter<MemoryStore<ManualClock>>, ManualClock) {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    (Limiter::new(Arc::new(store), set), clock)
}

fn toml(text: &str) -> PolicySet {
    PolicySet::from_toml_str(text).unwrap()
}

async fn allowed(l: &Limiter<MemoryStore<ManualClock>>, policy: &str, key: &str) -> bool {
    l.check(policy, key.as_bytes()).await.unwrap().is_allowed()
}

#[tokio::test]
async fn tiers_are_all_or_nothing_and_the_decision_is_the_most_restrictive() {
    let (l, clock) = limiter(toml(
        r#"
        [[policy]]
        name = "api"
        tiers = [
            { name = "second", limit = 3, per = "1s" },
            { name = "minute", algorithm = "fixed_window", limit = 5, per = "1m" },
        ]
        "#,
    ));
    clock.set_us(T0 - T0 % 60_000_000); // the start of a minute
    for _ in 0..3 {
        assert!(allowed(&l, "api", "u").await);
    }
    let v = l.check("api", b"u").await.unwrap();
    assert_eq!(v.outcome(), Outcome::Denied);
    assert!(!v.is_allowed());
    assert_eq!(v.policy(), "api");
    let tiers: Vec<_> = v
        .tiers()
        .map(|t| (t.name(), t.decision().is_allowed()))
        .collect();
    assert_eq!(tiers, [("second", false), ("minute", true)]);
    assert_eq!(v.tiers().get(1).unwrap().limit(), 5);
    // The batch was denied, so the minute tier was not charged: it reports its state as it
    // is, 2 left, as a peek does.
    assert_eq!(v.tiers().get(1).unwrap().decision().remaining(), 2);
    assert_eq!(v.decision().retry_after(), Duration::from_micros(333_334));
    let peek = l.peek("api", b"u").await.unwrap();
    assert_eq!(peek.tiers().get(1).unwrap().decision().remaining(), 2);

    // One second later: 2 more pass, then the minute tier (5) denies, for the rest of the minute.
    clock.advance(Duration::from_secs(1));
    assert!(allowed(&l, "api", "u").await);
    assert!(allowed(&l, "api", "u").await);
    let v = l.check("api", b"u").await.unwrap();
    let tiers: Vec<_> = v.tiers().map(|t| t.decision().is_allowed()).collect();
    assert_eq!(tiers, [true, false]);
    assert_eq!(v.decision().retry_after(), Duration::from_secs(59));
    // Other keys are independent.
    assert!(allowed(&l, "api", "other").await);
}

#[tokio::test]
async fn a_global_tier_is_shared_by_every_key_and_only_charged_with_the_others() {
    let (l, _clock) = limiter(toml(
        r#"
        [[policy]]
        name = "search"
        tiers = [
            { name = "endpoint", algorithm = "gcra", limit = 4, per = "1h", scope = "global" },
            { name = "user", limit = 2, per = "1h" },
        ]
        "#,
    ));
    assert!(allowed(&l, "search", "a").await);
    assert!(allowed(&l, "search", "a").await);
    // a's own tier denies: the global tier is not charged.
    assert!(!allowed(&l, "search", "a").await);
    assert!(allowed(&l, "search", "b").await);
    assert!(allowed(&l, "search", "b").await);
    // 4 admitted in all: the endpoint is full for everyone.
    let v = l.check("search", b"c").await.unwrap();
    assert!(!v.is_allowed());
    let first = v.tiers().first().unwrap();
    assert_eq!(
        (first.name(), first.decision().is_allowed()),
        ("endpoint", false)
    );
    assert!(v.tiers().get(1).unwrap().decision().is_allowed());
}

#[tokio::test]
async fn an_override_replaces_the_per_key_tiers_and_keeps_the_global_ones() {
    let set = PolicySet::builder()
        .policy(
            Policy::new("api")
                .tier(Tier::new("all", Limit::gcra(Quota::per_hour(100).unwrap())).global())
                .tier(Tier::new(
                    "user",
                    Limit::token_bucket(Quota::per_hour(1).unwrap()),
                ))
                .override_key(
                    "tenant-42",
                    [Tier::new(
                        "user",
                        Limit::token_bucket(Quota::per_hour(3).unwrap()),
                    )],
                ),
        )
        .build()
        .unwrap();
    let (l, _clock) = limiter(set);
    assert!(allowed(&l, "api", "free").await);
    assert!(!allowed(&l, "api", "free").await);
    for _ in 0..3 {
        let v = l.check("api", b"tenant-42").await.unwrap();
        assert!(v.is_allowed());
        assert!(v.is_override());
        let names: Vec<_> = v.tiers().map(|t| t.name()).collect();
        assert_eq!(names, ["all", "user"]);
    }
    assert!(!allowed(&l, "api", "tenant-42").await);
    // The global tier counted all 4 admissions.
    let v = l.peek("api", b"someone").await.unwrap();
    assert_eq!(v.tiers().first().unwrap().decision().remaining(), 96);
}

#[tokio::test]
async fn allow_and_deny_lists_skip_the_store() {
    let (l, _clock) = limiter(toml(
        r#"
        [[policy]]
        name = "api"
        allow = ["friend"]
        deny = ["foe"]
        tiers = [ { name = "t", limit = 1, per = "1h" } ]
        "#,
    ));
    for _ in 0..5 {
        let v = l.check("api", b"friend").await.unwrap();
        assert!(v.is_allowed());
        assert_eq!(v.listed(), Some(Listed::Allow));
        assert_eq!(v.tiers().len(), 0);
    }
    let v = l.check("api", b"foe").await.unwrap();
    assert_eq!(v.outcome(), Outcome::Denied);
    assert_eq!(v.listed(), Some(Listed::Deny));
    assert_eq!(v.decision().retry_after(), NEVER);
    assert!(v.tiers().is_empty());
    // Neither touched the tier's state of anyone: a fresh key still has its unit.
    assert!(allowed(&l, "api", "stranger").await);
    assert_eq!(l.check("api", b"stranger").await.unwrap().listed(), None);
}

#[tokio::test]
async fn shadow_mode_reports_denials_but_lets_requests_through() {
    let (l, _clock) = limiter(toml(
        r#"
        [[policy]]
        name = "new-limit"
        shadow = true
        deny = ["foe"]
        tiers = [ { name = "t", limit = 2, per = "1h" } ]
        "#,
    ));
    assert_eq!(
        l.check("new-limit", b"k").await.unwrap().outcome(),
        Outcome::Allowed
    );
    assert_eq!(
        l.check("new-limit", b"k").await.unwrap().outcome(),
        Outcome::Allowed
    );
    let v = l.check("new-limit", b"k").await.unwrap();
    assert_eq!(v.outcome(), Outcome::ShadowDenied);
    assert!(v.is_allowed());
    assert!(v.decision().is_denied());
    assert!(v.tiers().all(|t| t.is_shadow()));
    let v = l.check("new-limit", b"foe").await.unwrap();
    assert_eq!(v.outcome(), Outcome::ShadowDenied);
    assert!(v.is_allowed());
}

#[tokio::test]
async fn peek_charges_nothing_and_cost_charges_units() {
    let (l, _clock) = limiter(toml(
        r#"
        [[policy]]
        name = "api"
        tiers = [ { name = "t", algorithm = "sliding_log", limit = 10, per = "1m" } ]
        "#,
    ));
    for _ in 0..3 {
        let v = l.peek("api", b"k").await.unwrap();
        assert!(v.is_allowed());
        assert_eq!(v.decision().remaining(), 10);
    }
    let v = l.check_cost("api", b"k", 7).await.unwrap();
    assert_eq!(v.decision().remaining(), 3);
    assert!(!l.check_cost("api", b"k", 4).await.unwrap().is_allowed());
    assert!(l.check_cost("api", b"k", 3).await.unwrap().is_allowed());
    let v = l.check_cost("api", b"other", 11).await.unwrap();
    assert!(v.decision().is_never());
}

#[tokio::test]
async fn unknown_policies_and_bad_keys_are_errors() {
    let (l, _clock) = limiter(toml(
        "[[policy]]\nname = \"api\"\ntiers = [ { name = \"t\", limit = 1, per = \"1s\" } ]",
    ));
    let e = l.check("nope", b"k").await.unwrap_err();
    assert!(matches!(&e, CheckError::UnknownPolicy(p) if p == "nope"));
    assert_eq!(e.to_string(), "unknown policy \"nope\"");
    assert!(!e.is_transient());
    let e = l.check("api", b"").await.unwrap_err();
    assert!(
        matches!(&e, CheckError::Store(s) if s.kind() == "invalid_key"),
        "{e}"
    );
    let long = vec![b'x'; 2000];
    assert!(l.check("api", &long).await.is_err());
}

#[derive(Default)]
struct Recorder(Mutex<Vec<(String, Outcome, Decision)>>);

impl Observer for Recorder {
    fn on_decision(&self, policy: &str, outcome: Outcome, decision: &Decision, _: Duration) {
        self.0
            .lock()
            .unwrap()
            .push((policy.to_owned(), outcome, *decision));
    }
}

#[tokio::test]
async fn the_observer_sees_every_check() {
    let (l, _clock) = limiter(toml(
        "[[policy]]\nname = \"api\"\ntiers = [ { name = \"t\", limit = 1, per = \"1h\" } ]",
    ));
    let recorder = Arc::new(Recorder::default());
    let l = l.with_observer(recorder.clone());
    let a = *l.check("api", b"k").await.unwrap().decision();
    let d = *l.check("api", b"k").await.unwrap().decision();
    let _ = l.check("nope", b"k").await;
    let seen = recorder.0.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            ("api".to_owned(), Outcome::Allowed, a),
            ("api".to_owned(), Outcome::Denied, d),
        ]
    );
}

#[derive(Default)]
struct ErrorRecorder(Mutex<Vec<(&'static str, String, &'static str)>>);

impl Observer for ErrorRecorder {
    fn on_store_error(&self, store: &'static str, policy: &str, error: &distlimit_core::Error) {
        self.0
            .lock()
            .unwrap()
            .push((store, policy.to_owned(), error.kind()));
    }
}

#[tokio::test]
async fn the_observer_sees_checks_failed_by_the_store_and_not_bad_input() {
    use distlimit_test::{Fault, FaultKind, FaultyStore};

    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let recorder = Arc::new(ErrorRecorder::default());
    let l = Limiter::new(
        store.clone(),
        toml(
            r#"
            [[policy]]
            name = "one"
            tiers = [ { name = "t", limit = 5, per = "1s" } ]
            [[policy]]
            name = "two"
            tiers = [ { name = "t", limit = 5, per = "1s" }, { name = "u", limit = 9, per = "1m" } ]
            "#,
        ),
    )
    .with_observer(recorder.clone());
    assert!(l.check("one", b"k").await.unwrap().is_allowed());
    store.set_default(Fault::Fail(FaultKind::Unavailable));
    for policy in ["one", "two"] {
        let e = l.check(policy, b"k").await.unwrap_err();
        assert!(e.is_transient(), "{e}");
    }
    // The caller's mistakes are not the store's failures.
    assert!(l.check("nope", b"k").await.is_err());
    assert!(l.check("one", b"").await.is_err());
    let seen = recorder.0.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            ("limiter", "one".to_owned(), "unavailable"),
            ("limiter", "two".to_owned(), "unavailable"),
        ]
    );
}

#[tokio::test]
async fn a_verdict_keeps_the_snapshot_it_was_decided_with() {
    let (l, _clock) = limiter(toml(
        "[[policy]]\nname = \"api\"\ntiers = [ { name = \"t\", limit = 5, per = \"1h\" } ]",
    ));
    let v = l.check("api", b"k").await.unwrap();
    l.replace(toml(
        "[[policy]]\nname = \"api\"\ntiers = [ { name = \"u\", limit = 9, per = \"1m\" } ]",
    ))
    .unwrap();
    let t = v.tiers().first().unwrap();
    assert_eq!((t.name(), t.limit()), ("t", 5));
    assert_eq!(l.policies().get("api").unwrap().tiers()[0].name(), "u");
    let t = l.check("api", b"k").await.unwrap();
    assert_eq!(t.tiers().first().unwrap().name(), "u");
}

/// Switching policies and sets finds each policy by its name.
#[tokio::test]
async fn a_thread_switching_policies_and_sets_finds_each_by_name() {
    let (l, _clock) = limiter(toml(
        r#"
        [[policy]]
        name = "a"
        tiers = [ { name = "t", limit = 1, per = "1h" } ]
        [[policy]]
        name = "b"
        tiers = [ { name = "t", limit = 2, per = "1h" } ]
        "#,
    ));
    let limit = |v: &distlimit_policy::Verdict| v.tiers().first().unwrap().limit();
    for (policy, expected) in [("b", 2), ("a", 1), ("a", 1), ("b", 2), ("a", 1)] {
        let v = l.check(policy, b"k").await.unwrap();
        assert_eq!((v.policy(), limit(&v)), (policy, expected));
    }
    // Now "b" is at index 0 and "a" is gone.
    l.replace(toml(
        "[[policy]]\nname = \"b\"\ntiers = [ { name = \"t\", limit = 5, per = \"1h\" } ]",
    ))
    .unwrap();
    assert!(matches!(
        l.check("a", b"k").await,
        Err(CheckError::UnknownPolicy(name)) if name == "a"
    ));
    let v = l.check("b", b"k").await.unwrap();
    assert_eq!((v.policy(), limit(&v)), ("b", 5));
}

#[tokio::test]
async fn works_behind_dyn_store() {
    let store: Arc<dyn distlimit_core::Store> = Arc::new(MemoryStore::new());
    let l: Limiter = Limiter::new(
        store,
        toml("[[policy]]\nname = \"api\"\ntiers = [ { name = \"t\", limit = 1, per = \"1h\" } ]"),
    );
    assert!(l.check("api", b"k").await.unwrap().is_allowed());
    assert!(!l.check("api", b"k").await.unwrap().is_allowed());
}

/// The futures are `Send` (a tower service needs that), for a concrete store and `dyn Store`.
#[test]
fn check_futures_are_send() {
    fn send<T: Send>(_: T) {}
    let (l, _clock) = limiter(PolicySet::default());
    send(l.check("api", b"k"));
    send(l.check_cost("api", b"k", 2));
    send(l.peek("api", b"k"));
    let l: Limiter = Limiter::new(Arc::new(MemoryStore::new()), PolicySet::default());
    send(l.check("api", b"k"));
}

/// A verdict is plain data: it can be kept, cloned and sent anywhere, and outlives the set and
/// the limiter it came from.
#[tokio::test]
async fn a_verdict_outlives_its_limiter() {
    fn plain<T: Clone + Send + Sync + 'static>(t: T) -> T {
        t
    }
    let (l, _clock) = limiter(toml(
        "[[policy]]\nname = \"api\"\ntiers = [ { name = \"t\", limit = 5, per = \"1h\" } ]",
    ));
    let v = plain(l.check("api", b"k").await.unwrap());
    drop(l);
    let kept = std::thread::spawn(move || v.clone()).join().unwrap();
    let tier = kept.tiers().first().unwrap();
    assert_eq!((kept.policy(), tier.name(), tier.limit()), ("api", "t", 5));
    assert_eq!(tier.decision().remaining(), 4);
}

#[tokio::test]
async fn every_policy_is_found_by_name_in_small_and_large_sets() {
    // Small sets are scanned, large ones looked up in a hash index: both must find each name
    // (names of equal length and shared prefixes included) and nothing else.
    for count in [1, 2, 8, 9, 40] {
        let names: Vec<String> = (0..count).map(|i| format!("p{i:02}")).collect();
        let set = PolicySet::new(names.iter().enumerate().map(|(i, name)| {
            let quota = Quota::per_second(i as u64 + 1).unwrap();
            Policy::new(name.as_str()).tier(Tier::new("t", Limit::token_bucket(quota)))
        }))
        .unwrap();
        let (l, _) = limiter(set);
        for (i, name) in names.iter().enumerate() {
            let v = l.check(name, b"k").await.unwrap();
            assert_eq!(v.policy(), name);
            assert_eq!(v.tiers().first().unwrap().limit(), i as u64 + 1);
        }
        for unknown in ["p", "p0", "p000", "q00", ""] {
            let e = l.check(unknown, b"k").await.unwrap_err();
            assert!(
                matches!(e, CheckError::UnknownPolicy(ref n) if n == unknown),
                "{e}"
            );
        }
    }
}

const NOW_POLICIES: &str = r#"
    [[policy]]
    name = "one"
    tiers = [ { name = "t", limit = 2, per = "1h" } ]
    [[policy]]
    name = "two"
    allow = ["friend"]
    tiers = [ { name = "t", limit = 2, per = "1h" }, { name = "u", limit = 9, per = "1d" } ]
"#;

#[tokio::test]
async fn check_now_decides_single_tiers_on_the_memory_store_with_the_same_state_as_check() {
    let (l, _clock) = limiter(toml(NOW_POLICIES));
    let first = l.check_now("one", b"k", 1).unwrap().unwrap();
    assert!(first.is_allowed());
    assert_eq!(first.tiers().first().unwrap().decision().remaining(), 1);
    assert!(l.check("one", b"k").await.unwrap().is_allowed());
    let denied = l.check_now("one", b"k", 1).unwrap().unwrap();
    assert_eq!(denied.outcome(), Outcome::Denied);
    // A peek and a cost, as with `check_cost`.
    assert!(!l.check_now("one", b"k", 0).unwrap().unwrap().is_allowed());
    assert!(l.check_now("other", b"k", 3).is_some_and(|r| r.is_err()));
    assert!(!l.check_now("one", b"k2", 3).unwrap().unwrap().is_allowed());
    assert!(l.check_now("one", b"k2", 2).unwrap().unwrap().is_allowed());
}

#[tokio::test]
async fn check_now_leaves_multi_tier_checks_to_the_future_and_charges_nothing() {
    let (l, _clock) = limiter(toml(NOW_POLICIES));
    for _ in 0..5 {
        assert!(l.check_now("two", b"k", 1).is_none());
    }
    // Nothing was charged: both units are still there.
    assert!(allowed(&l, "two", "k").await);
    assert!(allowed(&l, "two", "k").await);
    assert!(!allowed(&l, "two", "k").await);
    // What needs no store is answered on any policy: lists, unknown policies, bad keys.
    let friend = l.check_now("two", b"friend", 1).unwrap().unwrap();
    assert_eq!(friend.listed(), Some(Listed::Allow));
    let unknown = l.check_now("nope", b"k", 1).unwrap().unwrap_err();
    assert!(matches!(unknown, CheckError::UnknownPolicy(ref p) if p == "nope"));
    assert!(l.check_now("two", b"", 1).unwrap().is_err());
    assert!(l.check_now("one", &[b'x'; 10_000], 1).unwrap().is_err());
}

#[tokio::test]
async fn check_now_is_none_on_a_store_that_must_be_awaited() {
    // A `FaultyStore` that yields once per call answers only through futures (no `decide_now`),
    // like a Redis store.
    let store = Arc::new(
        distlimit_test::FaultyStore::new(MemoryStore::new())
            .with_default(distlimit_test::Fault::Delay(std::time::Duration::ZERO)),
    );
    let l = Limiter::new(store, toml(NOW_POLICIES));
    assert!(l.check_now("one", b"k", 1).is_none());
    let v = l.check("one", b"k").await.unwrap();
    assert_eq!(v.tiers().first().unwrap().decision().remaining(), 1);
    assert_eq!(
        l.check_now("two", b"friend", 1).unwrap().unwrap().listed(),
        Some(Listed::Allow)
    );
}

#[tokio::test]
async fn the_observer_sees_checks_decided_by_check_now() {
    let (l, _clock) = limiter(toml(NOW_POLICIES));
    let recorder = Arc::new(Recorder::default());
    let l = l.with_observer(recorder.clone());
    let a = *l.check_now("one", b"k", 1).unwrap().unwrap().decision();
    assert!(
        l.check_now("two", b"k", 1).is_none(),
        "not decided, not seen"
    );
    let b = *l.check("two", b"k").await.unwrap().decision();
    let seen = recorder.0.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            ("one".to_owned(), Outcome::Allowed, a),
            ("two".to_owned(), Outcome::Allowed, b),
        ]
    );
}

const TWO_POLICIES: &str = r#"
    [[policy]]
    name = "per_ip"
    tiers = [
        { name = "minute", limit = 5, per = "1m" },
        { name = "all", limit = 100, per = "1h" , scope = "global" },
    ]
    deny = ["blocked"]
    allow = ["trusted"]

    [[policy]]
    name = "per_user"
    tiers = [ { name = "hour", algorithm = "fixed_window", limit = 2, per = "1h" } ]

    [[policy]]
    name = "watch"
    shadow = true
    tiers = [ { name = "hour", limit = 1, per = "1h" } ]
"#;

/// What is left on every tier of `policy` for `key`, read with a peek.
async fn left(l: &Limiter<MemoryStore<ManualClock>>, policy: &str, key: &str) -> Vec<u64> {
    let verdict = l.peek(policy, key.as_bytes()).await.unwrap();
    verdict.tiers().map(|t| t.decision().remaining()).collect()
}

#[tokio::test]
async fn check_all_charges_every_policy_or_none() {
    let (l, _clock) = limiter(toml(TWO_POLICIES));
    let request = [
        ("per_ip", &b"10.0.0.1"[..], 1),
        ("per_user", &b"alice"[..], 1),
    ];
    for _ in 0..2 {
        let verdicts = l.check_all(&request).await.unwrap();
        assert!(verdicts.iter().all(|v| v.is_allowed()));
    }
    assert_eq!(left(&l, "per_ip", "10.0.0.1").await, [3, 98]);
    assert_eq!(left(&l, "per_user", "alice").await, [0]);
    // alice is out: denied, and neither tier of per_ip is charged.
    let verdicts = l.check_all(&request).await.unwrap();
    assert_eq!(
        verdicts.iter().map(Verdict::outcome).collect::<Vec<_>>(),
        [Outcome::Allowed, Outcome::Denied]
    );
    assert_eq!(verdicts[0].tiers().len(), 2);
    assert_eq!(left(&l, "per_ip", "10.0.0.1").await, [3, 98]);
    // The reverse order, and another user: admitted, both charged.
    let other = [
        ("per_user", &b"bob"[..], 2),
        ("per_ip", &b"10.0.0.1"[..], 3),
    ];
    assert!(
        l.check_all(&other)
            .await
            .unwrap()
            .iter()
            .all(Verdict::is_allowed)
    );
    assert_eq!(left(&l, "per_ip", "10.0.0.1").await, [0, 95]);
    assert_eq!(left(&l, "per_user", "bob").await, [0]);
    // Now the IP denies: carol is not charged.
    let carol = [
        ("per_user", &b"carol"[..], 1),
        ("per_ip", &b"10.0.0.1"[..], 1),
    ];
    let verdicts = l.check_all(&carol).await.unwrap();
    assert!(verdicts[0].is_allowed() && !verdicts[1].is_allowed());
    assert_eq!(left(&l, "per_user", "carol").await, [2]);
}

#[tokio::test]
async fn check_all_merges_a_shared_global_tier_and_lists_decide_without_the_store() {
    let (l, _clock) = limiter(toml(TWO_POLICIES));
    // Two IPs of one policy share its global tier: one request costing 2 + 3.
    let two_ips = [("per_ip", &b"a"[..], 2), ("per_ip", &b"b"[..], 3)];
    assert!(
        l.check_all(&two_ips)
            .await
            .unwrap()
            .iter()
            .all(Verdict::is_allowed)
    );
    assert_eq!(left(&l, "per_ip", "a").await, [3, 95]);
    assert_eq!(left(&l, "per_ip", "b").await, [2, 95]);
    // A deny-listed key denies the request: nothing else is charged.
    let blocked = [
        ("per_user", &b"dave"[..], 1),
        ("per_ip", &b"blocked"[..], 1),
    ];
    let verdicts = l.check_all(&blocked).await.unwrap();
    assert_eq!(verdicts[1].listed(), Some(Listed::Deny));
    assert!(verdicts[0].is_allowed() && !verdicts[1].is_allowed());
    assert_eq!(left(&l, "per_user", "dave").await, [2]);
    // An allow-listed key is admitted uncharged; the rest is charged.
    let trusted = [
        ("per_user", &b"dave"[..], 1),
        ("per_ip", &b"trusted"[..], 1),
    ];
    let verdicts = l.check_all(&trusted).await.unwrap();
    assert!(verdicts.iter().all(Verdict::is_allowed));
    assert_eq!(verdicts[1].listed(), Some(Listed::Allow));
    assert_eq!(left(&l, "per_user", "dave").await, [1]);
    assert_eq!(left(&l, "per_ip", "a").await, [3, 95]);
    // Unknown policy: an error, nothing charged.
    let unknown = [("per_user", &b"dave"[..], 1), ("nope", &b"x"[..], 1)];
    assert!(matches!(
        l.check_all(&unknown).await,
        Err(CheckError::UnknownPolicy(_))
    ));
    assert_eq!(left(&l, "per_user", "dave").await, [1]);
}

#[tokio::test]
async fn check_all_decides_shadow_policies_apart() {
    let (l, _clock) = limiter(toml(TWO_POLICIES));
    let recorder = Arc::new(Recorder::default());
    let l = l.with_observer(recorder.clone());
    let request = [("watch", &b"erin"[..], 1), ("per_user", &b"erin"[..], 1)];
    assert!(
        l.check_all(&request)
            .await
            .unwrap()
            .iter()
            .all(Verdict::is_allowed)
    );
    // The shadow policy is out; its denial denies nothing: per_user is charged.
    let verdicts = l.check_all(&request).await.unwrap();
    assert_eq!(verdicts[0].outcome(), Outcome::ShadowDenied);
    assert!(verdicts.iter().all(Verdict::is_allowed));
    assert_eq!(left(&l, "per_user", "erin").await, [0]);
    // per_user denies: the shadow policy (of another key) is only peeked at.
    let frank = [("watch", &b"frank"[..], 1), ("per_user", &b"erin"[..], 1)];
    let verdicts = l.check_all(&frank).await.unwrap();
    assert!(verdicts[0].is_allowed() && !verdicts[1].is_allowed());
    assert_eq!(left(&l, "watch", "frank").await, [1]);
    // The observer saw each check once (and the peeks).
    let seen = recorder.0.lock().unwrap().clone();
    let outcomes: Vec<_> = seen
        .iter()
        .filter(|(policy, _, _)| policy == "watch")
        .map(|(_, o, _)| *o)
        .collect();
    assert_eq!(
        outcomes,
        [
            Outcome::Allowed,
            Outcome::ShadowDenied,
            Outcome::Allowed,
            Outcome::Allowed
        ]
    );
}

#[tokio::test]
async fn batch_items_of_the_callers_own_share_the_batch_and_deny_items_deny_it() {
    use distlimit_core::{Key, Request, Store};
    use distlimit_policy::Item;

    let clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::builder().clock(clock).build());
    let l = Limiter::new(store.clone(), toml(TWO_POLICIES));
    let own = Limit::fixed_window(Quota::per_hour(10).unwrap());
    let own_request = Request::new(Key::new("k").unwrap(), own)
        .with_policy("own")
        .unwrap();
    let own_left = |store: Arc<MemoryStore<ManualClock>>| async move {
        let peek = own_request.with_cost(0);
        store.decide(&peek).await.unwrap().remaining()
    };
    let batch = [
        Item::policy("per_user", b"gina", 2),
        Item::request(own_request),
    ];
    let answers = l.decide_batch(&batch).await.unwrap();
    assert!(answers.iter().all(|a| a.is_allowed()));
    assert!(answers[0].verdict().is_some() && answers[1].verdict().is_none());
    assert_eq!(own_left(store.clone()).await, 9);
    // gina is out: the batch is denied and "own" is not charged.
    let batch = [
        Item::policy("per_user", b"gina", 1),
        Item::request(own_request),
    ];
    let answers = l.decide_batch(&batch).await.unwrap();
    assert!(!answers[0].is_allowed() && answers[1].is_allowed());
    assert_eq!(own_left(store.clone()).await, 9);
    // A deny item denies the batch without the store; in shadow mode it denies nothing.
    let answers = l
        .decide_batch(&[Item::request(own_request), Item::deny()])
        .await
        .unwrap();
    assert!(answers[0].is_allowed() && !answers[1].is_allowed());
    assert_eq!(own_left(store.clone()).await, 9);
    let answers = l
        .decide_batch(&[Item::request(own_request), Item::deny().shadow(true)])
        .await
        .unwrap();
    assert_eq!(answers[1].outcome(), Outcome::ShadowDenied);
    assert!(answers.iter().all(|a| a.is_allowed()));
    assert_eq!(own_left(store.clone()).await, 8);
    // A listed key asks no store.
    let answers = l
        .decide_batch(&[Item::policy("per_ip", b"blocked", 1)])
        .await
        .unwrap();
    assert_eq!(answers[0].verdict().unwrap().listed(), Some(Listed::Deny));
}

#[tokio::test]
async fn a_batch_past_max_batch_is_decided_in_chunks_of_whole_items() {
    use distlimit_core::{Key, MAX_BATCH, Request, Store};
    use distlimit_policy::Item;

    let store = Arc::new(MemoryStore::builder().clock(ManualClock::new(T0)).build());
    let l = Limiter::new(store.clone(), toml(TWO_POLICIES));
    let limit = Limit::fixed_window(Quota::per_hour(1).unwrap());
    let keys: Vec<String> = (0..=MAX_BATCH).map(|i| format!("k{i}")).collect();
    let requests: Vec<Request<'_>> = keys
        .iter()
        .map(|k| {
            Request::new(Key::new(k).unwrap(), limit)
                .with_policy("own")
                .unwrap()
        })
        .collect();
    // MAX_BATCH requests: one batch, all or nothing; the last key spent first denies them all.
    store.decide(&requests[MAX_BATCH - 1]).await.unwrap();
    let items: Vec<Item<'_>> = requests[..MAX_BATCH]
        .iter()
        .map(|r| Item::request(*r))
        .collect();
    let answers = l.decide_batch(&items).await.unwrap();
    assert!(!answers[MAX_BATCH - 1].is_allowed());
    assert!(
        store
            .decide(&requests[0].with_cost(0))
            .await
            .unwrap()
            .is_allowed()
    );
    // One more: two chunks; the first is admitted and stays charged though the second is
    // denied (the documented limit of all or nothing).
    let more: Vec<Request<'_>> = keys
        .iter()
        .map(|k| {
            Request::new(Key::new(k).unwrap(), limit)
                .with_policy("more")
                .unwrap()
        })
        .collect();
    store.decide(&more[MAX_BATCH]).await.unwrap();
    let items: Vec<Item<'_>> = more.iter().map(|r| Item::request(*r)).collect();
    let answers = l.decide_batch(&items).await.unwrap();
    assert_eq!(answers.len(), MAX_BATCH + 1);
    assert!(!answers[MAX_BATCH].is_allowed());
    assert_eq!(
        store
            .decide(&more[0].with_cost(0))
            .await
            .unwrap()
            .remaining(),
        0
    );
}

#[tokio::test]
async fn check_all_now_decides_several_policies_at_once_as_check_all_would() {
    let set = || {
        toml(
            r#"
            [[policy]]
            name = "per_ip"
            tiers = [ { name = "t", limit = 10, per = "1h" } ]

            [[policy]]
            name = "per_user"
            deny = ["foe"]
            tiers = [ { name = "t", limit = 1, per = "1h" } ]

            [[policy]]
            name = "trial"
            shadow = true
            tiers = [ { name = "t", limit = 1, per = "1h" } ]
            "#,
        )
    };
    let (l, _clock) = limiter(set());
    let ip = &b"10.0.0.1"[..];
    let remaining = |l: &Limiter<MemoryStore<ManualClock>>| {
        let v = l.check_now("per_ip", ip, 0).unwrap().unwrap();
        v.decision().remaining()
    };
    let now = |checks: &[(&str, &[u8], u64)]| -> Option<Vec<Verdict>> {
        match l.check_all_now(checks) {
            Checked::Decided(result) => Some(result.unwrap()),
            Checked::Pending(_) => None,
        }
    };
    // Two policies on the memory store: answered at once, all or nothing.
    let both = [("per_ip", ip, 1), ("per_user", &b"alice"[..], 1)];
    let first = now(&both).expect("the memory store answers at once");
    assert!(first.iter().all(Verdict::is_allowed));
    assert_eq!(remaining(&l), 9);
    let second = now(&both).expect("the memory store answers at once");
    assert!(second[0].is_allowed() && !second[1].is_allowed());
    assert_eq!(remaining(&l), 9, "a denied batch charges nothing");
    // A deny-listed key denies the batch without charging the others.
    let foe = now(&[("per_ip", ip, 1), ("per_user", &b"foe"[..], 1)]).unwrap();
    assert_eq!(foe[1].listed(), Some(Listed::Deny));
    assert_eq!(remaining(&l), 9);
    // The same state and key twice: one request costing the sum.
    let twice = now(&[("per_ip", ip, 1), ("per_ip", ip, 2)]).unwrap();
    assert!(twice.iter().all(Verdict::is_allowed));
    assert_eq!(remaining(&l), 6);
    // Each answered after its own hit, as one after the other: 9 - 1, then 9 - 1 - 2.
    let left = |v: &[Verdict]| -> Vec<u64> { v.iter().map(|v| v.decision().remaining()).collect() };
    assert_eq!(left(&twice), [8, 6]);
    // A policy in shadow mode asking the store beside others is left to `check_all`: a plan,
    // nothing charged.
    assert!(now(&[("per_ip", ip, 1), ("trial", ip, 1)]).is_none());
    assert_eq!(remaining(&l), 6);
    let all = l.check_all(&[("per_ip", ip, 1), ("trial", ip, 1)]).await;
    assert!(all.unwrap().iter().all(Verdict::is_allowed));
    assert_eq!(remaining(&l), 5);
    // Errors are answered at once too.
    assert!(matches!(
        l.check_all_now::<Vec<_>>(&[("per_ip", ip, 1), ("nope", ip, 1)]),
        Checked::Decided(Err(CheckError::UnknownPolicy(_)))
    ));
    // A store without `decide_all_now` is awaited: a plan, nothing charged, decided once
    // awaited.
    let store = distlimit_test::FaultyStore::new(MemoryStore::new());
    let awaited = Limiter::new(Arc::new(store), set());
    let Checked::Pending(plan) = awaited.check_all_now::<Vec<_>>(&both) else {
        panic!("a store without decide_all_now must be awaited");
    };
    let v = awaited.decide_plan(&plan).await.unwrap();
    assert!(v.iter().all(Verdict::is_allowed));
    assert_eq!(v[0].decision().remaining(), 9);
    // Awaited too: 9 left, then 4 asked twice: 5, then 1; then 1 left and 1 + 2 asked: the
    // first fits (answered as its peek, 1), the second does not, and nothing is charged.
    let v = awaited
        .check_all(&[("per_ip", ip, 4), ("per_ip", ip, 4)])
        .await
        .unwrap();
    assert_eq!(left(&v), [5, 1]);
    let v = awaited
        .check_all(&[("per_ip", ip, 1), ("per_ip", ip, 2)])
        .await
        .unwrap();
    assert!(v[0].is_allowed() && !v[1].is_allowed());
    assert_eq!(left(&v), [1, 0]);
    assert_eq!(
        awaited.check_all(&[("per_ip", ip, 1)]).await.unwrap()[0]
            .decision()
            .remaining(),
        0
    );
}
