//! The conformance checks of the [`PermitStore`] contract (concurrency limits): one
//! `pub async fn check_permit_*` per rule, run by [`permit_conformance_tests!`](crate::permit_conformance_tests).

// A check reports a contract violation by panicking: that is how a test fails.
#![allow(clippy::panic)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use distlimit_core::{
    Error, Key, Limit, ManualClock, PermitDecision, PermitId, PermitLimit, PermitRequest,
    PermitStore, Permits, Quota, Request, Store,
};

use crate::support::{Keys, Rng, TASKS, race, seed, show};

fn limit(max: u32, lease_ms: u64) -> PermitLimit {
    PermitLimit::new(max, Duration::from_millis(lease_ms))
        .unwrap_or_else(|e| panic!("distlimit-test bug: {e}"))
}

fn key(bytes: &[u8]) -> Key<'_> {
    Key::new(bytes).unwrap_or_else(|e| panic!("distlimit-test bug: {e}"))
}

/// The answer of a store call, failing the check (at the caller's line) on `Err`.
#[track_caller]
fn ok<T>(result: Result<T, Error>, ctx: &str) -> T {
    match result {
        Ok(answer) => answer,
        Err(e) => panic!("{ctx}: the store failed: {e} ({e:?})"),
    }
}

/// A fresh key admits exactly `max_in_flight` permits, with distinct ids; the next acquire is
/// denied with a `retry_after` of at most the lease and the key's live count.
pub async fn check_permit_fresh_key_admits_max<S: PermitStore + ?Sized>(
    store: &Arc<S>,
    _clock: &ManualClock,
) {
    const CHECK: &str = "permit_fresh_key_admits_max";
    let keys = Keys::new(CHECK);
    for max in [1, 3, 10] {
        let k = keys.key(max.to_string());
        let request = PermitRequest::new(key(&k), limit(max, 60_000));
        let ctx = format!("check `{CHECK}` (max {max}, key {})", show(&k));
        let mut ids = Vec::new();
        for i in 0..max {
            let d = ok(store.acquire(&request).await, &ctx);
            assert!(
                d.is_allowed() && d.in_flight() == i + 1 && d.max_in_flight() == max,
                "{ctx}: acquire {} of a fresh key must be admitted with {} in flight, got {d:?}",
                i + 1,
                i + 1
            );
            ids.extend(d.permit());
        }
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(
            ids.len(),
            max as usize,
            "{ctx}: permit ids must be distinct"
        );
        let d = ok(store.acquire(&request).await, &ctx);
        assert!(
            d.is_denied()
                && d.in_flight() == max
                && d.retry_after() > Duration::ZERO
                && d.retry_after() <= Duration::from_secs(60),
            "{ctx}: acquire {} must be denied, {max} in flight, retry_after within the lease, \
             got {d:?}",
            max + 1
        );
    }
}

/// A release gives the place back (once: a second release of the same permit is `false` and
/// frees nothing); releasing or renewing an id never taken is `false`.
pub async fn check_permit_release_frees_one_place<S: PermitStore + ?Sized>(
    store: &Arc<S>,
    _clock: &ManualClock,
) {
    const CHECK: &str = "permit_release_frees_one_place";
    let keys = Keys::new(CHECK);
    let k = keys.key("k");
    let request = PermitRequest::new(key(&k), limit(2, 60_000));
    let ctx = format!("check `{CHECK}` (key {})", show(&k));
    let a = ok(store.acquire(&request).await, &ctx).permit();
    let b = ok(store.acquire(&request).await, &ctx).permit();
    let (Some(a), Some(_b)) = (a, b) else {
        panic!("{ctx}: two acquires of a fresh key with max 2 must be admitted")
    };
    assert!(
        ok(store.acquire(&request).await, &ctx).is_denied(),
        "{ctx}: a third acquire must be denied"
    );
    assert!(
        ok(store.release(&request, a).await, &ctx),
        "{ctx}: releasing a live permit must answer true"
    );
    assert!(
        !ok(store.release(&request, a).await, &ctx),
        "{ctx}: releasing a permit twice must answer false the second time"
    );
    let c = ok(store.acquire(&request).await, &ctx);
    assert!(
        c.is_allowed() && c.in_flight() == 2,
        "{ctx}: after a release one acquire must be admitted, got {c:?}"
    );
    assert!(
        ok(store.acquire(&request).await, &ctx).is_denied(),
        "{ctx}: a double release must not free a second place"
    );
    let never = PermitId::wrapping(u64::MAX);
    assert!(
        !ok(store.release(&request, never).await, &ctx)
            && !ok(store.renew(&request, never).await, &ctx),
        "{ctx}: releasing or renewing an id never taken must answer false"
    );
}

/// Permits nobody releases expire after their lease: at `lease` after they were taken the key
/// admits `max` again, and the acquire reports them expired; a second before, still denied.
pub async fn check_permit_expires_after_lease<S: PermitStore + ?Sized>(
    store: &Arc<S>,
    clock: &ManualClock,
) {
    const CHECK: &str = "permit_expires_after_lease";
    let keys = Keys::new(CHECK);
    let k = keys.key("k");
    let request = PermitRequest::new(key(&k), limit(3, 10_000));
    let ctx = format!("check `{CHECK}` (key {})", show(&k));
    for _ in 0..3 {
        assert!(ok(store.acquire(&request).await, &ctx).is_allowed());
    }
    clock.advance(Duration::from_millis(9_000));
    let d = ok(store.acquire(&request).await, &ctx);
    assert!(
        d.is_denied() && d.retry_after() == Duration::from_millis(1_000),
        "{ctx}: 9 s into a 10 s lease the key must be full, retry_after exactly 1 s, got {d:?}"
    );
    clock.advance(Duration::from_millis(1_000));
    let d = ok(store.acquire(&request).await, &ctx);
    assert!(
        d.is_allowed() && d.in_flight() == 1 && d.expired() == 3,
        "{ctx}: at the end of the lease the 3 permits must be expired and dropped, got {d:?}"
    );
}

/// A renewed permit lives one lease from its renewal; a renew after it expired answers
/// `false` and does not bring it back.
pub async fn check_permit_renew_extends_lease<S: PermitStore + ?Sized>(
    store: &Arc<S>,
    clock: &ManualClock,
) {
    const CHECK: &str = "permit_renew_extends_lease";
    let keys = Keys::new(CHECK);
    let k = keys.key("k");
    let request = PermitRequest::new(key(&k), limit(1, 10_000));
    let ctx = format!("check `{CHECK}` (key {})", show(&k));
    let Some(id) = ok(store.acquire(&request).await, &ctx).permit() else {
        panic!("{ctx}: a fresh key must admit")
    };
    clock.advance(Duration::from_millis(8_000));
    assert!(
        ok(store.renew(&request, id).await, &ctx),
        "{ctx}: renewing a live permit must answer true"
    );
    clock.advance(Duration::from_millis(8_000));
    assert!(
        ok(store.acquire(&request).await, &ctx).is_denied(),
        "{ctx}: 8 s after a renewal a 10 s permit must still be held"
    );
    clock.advance(Duration::from_millis(2_000));
    assert!(
        !ok(store.renew(&request, id).await, &ctx),
        "{ctx}: renewing an expired permit must answer false"
    );
    assert!(
        ok(store.acquire(&request).await, &ctx).is_allowed(),
        "{ctx}: a renew after expiry must not bring the permit back"
    );
}

/// Keys, states, and the rate state of the same name are independent of each other.
pub async fn check_permit_keys_and_states_are_independent<S: PermitStore + Store + ?Sized>(
    store: &Arc<S>,
    _clock: &ManualClock,
) {
    const CHECK: &str = "permit_keys_and_states_are_independent";
    let keys = Keys::new(CHECK);
    let (ka, kb) = (keys.key("a"), keys.key("b"));
    let ctx = format!("check `{CHECK}` (keys {}, {})", show(&ka), show(&kb));
    let one = limit(1, 60_000);
    let a = PermitRequest::new(key(&ka), one);
    assert!(ok(store.acquire(&a).await, &ctx).is_allowed());
    assert!(
        ok(
            store.acquire(&PermitRequest::new(key(&kb), one)).await,
            &ctx
        )
        .is_allowed(),
        "{ctx}: another key must have its own permits"
    );
    let other = a
        .with_policy("other")
        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
    assert!(
        ok(store.acquire(&other).await, &ctx).is_allowed(),
        "{ctx}: another state must have its own permits"
    );
    let quota = Quota::per_minute(5).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    for algorithm in distlimit_core::Algorithm::ALL {
        let rate = Request::new(key(&ka), Limit::new(algorithm, quota));
        match store.decide(&rate).await {
            Ok(d) => assert!(
                d.is_allowed(),
                "{ctx}: a rate limit on a key holding permits must decide as a fresh key, got {d:?}"
            ),
            Err(e) => panic!(
                "{ctx}: a rate decision on a key holding permits must not fail (permits and rate \
                 states live apart): {e}"
            ),
        }
    }
    assert!(
        ok(store.acquire(&a).await, &ctx).is_denied(),
        "{ctx}: rate decisions must not touch the key's permits"
    );
}

/// Tasks racing for one key of max 5: exactly 5 are admitted (atomic acquire), and after all
/// release, 5 again.
pub async fn check_permit_concurrent_acquires_admit_exactly_max<
    S: PermitStore + ?Sized + 'static,
>(
    store: &Arc<S>,
    _clock: &ManualClock,
) {
    const CHECK: &str = "permit_concurrent_acquires_admit_exactly_max";
    const MAX: u32 = 5;
    let keys = Keys::new(CHECK);
    let k: Arc<[u8]> = keys.key("k").into();
    let ctx = format!("check `{CHECK}` (key {})", show(&k));
    let lim = limit(MAX, 60_000);
    for round in 0..2 {
        let answers = race(&ctx, |_| {
            let (store, k) = (Arc::clone(store), Arc::clone(&k));
            async move {
                store
                    .acquire(&PermitRequest::new(Key::new(&*k)?, lim))
                    .await
            }
        })
        .await;
        let ids: Vec<PermitId> = answers.iter().filter_map(PermitDecision::permit).collect();
        assert_eq!(
            ids.len(),
            MAX as usize,
            "{ctx}: round {round}: {TASKS} concurrent acquires of a key of max {MAX} must admit \
             exactly {MAX}"
        );
        let request = PermitRequest::new(key(&k), lim);
        for id in ids {
            assert!(ok(store.release(&request, id).await, &ctx));
        }
    }
}

/// Random sequences of acquire, release, renew and time steps on a few keys decide exactly as
/// the reference model [`Permits`] does (with the ids the store handed out).
pub async fn check_permit_matches_model<S: PermitStore + ?Sized>(
    store: &Arc<S>,
    clock: &ManualClock,
) {
    const CHECK: &str = "permit_matches_model";
    const STEPS: usize = 300;
    let keys = Keys::new(CHECK);
    let mut rng = Rng::new(seed(CHECK, 0));
    let names: Vec<Vec<u8>> = (0..3).map(|i| keys.key(i.to_string())).collect();
    let limits = [limit(1, 1_000), limit(3, 5_000), limit(4, 2_000)];
    let mut models: Vec<Permits> = vec![Permits::default(); names.len()];
    let mut taken: HashMap<usize, Vec<PermitId>> = HashMap::new();
    for step in 0..STEPS {
        let i = rng.below(names.len() as u64) as usize;
        let request = PermitRequest::new(key(&names[i]), limits[i]);
        let now = distlimit_core::Clock::now_us(clock);
        let ctx = format!("check `{CHECK}` step {step} (key {})", show(&names[i]));
        let held = taken.entry(i).or_default();
        match rng.below(4) {
            0 | 1 => {
                let got = ok(store.acquire(&request).await, &ctx);
                let id = got.permit().unwrap_or(PermitId::wrapping(u64::MAX));
                let expected = models[i].acquire(now, &limits[i], id);
                assert_eq!(
                    got, expected,
                    "{ctx}: acquire: the store's answer (left) differs from the model's (right)"
                );
                held.extend(got.permit());
            }
            2 if !held.is_empty() => {
                let id = held.swap_remove(rng.below(held.len() as u64) as usize);
                let got = ok(store.release(&request, id).await, &ctx);
                let expected = models[i].release(now, id);
                assert_eq!(
                    got, expected,
                    "{ctx}: release of {id}: store (left), model (right)"
                );
            }
            3 if !held.is_empty() => {
                let id = held[rng.below(held.len() as u64) as usize];
                let got = ok(store.renew(&request, id).await, &ctx);
                let expected = models[i].renew(now, &limits[i], id);
                assert_eq!(
                    got, expected,
                    "{ctx}: renew of {id}: store (left), model (right)"
                );
            }
            _ => clock.advance(Duration::from_micros(rng.range(1, 1_500_000))),
        }
    }
}
