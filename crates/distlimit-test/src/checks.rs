//! The conformance checks: one `pub async fn check_*` per rule of the [`Store`] contract.

// A check reports a contract violation by panicking: that is how a test fails.
#![allow(clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use distlimit_core::{
    Algorithm, Clock, Decision, Error, KeyError, Limit, MAX_BATCH, MAX_KEY_LEN, ManualClock, NEVER,
    Quota, Request, Settle, State, Store, StoreExt,
};

use crate::support::{
    HOUR, Keys, MINUTE, Model, Rng, SECOND, TASKS, Via, Walk, all_limits, cases, decide,
    decide_all, describe, model_quotas, quota, race, random_advance, random_cost, request, seed,
    show, small_quotas, via,
};

/// Steps per algorithm and quota in [`check_matches_reference_model`].
const MODEL_STEPS: usize = 200;

/// The limit the concurrency checks' tasks race for.
const RACE_LIMIT: u64 = 10;

/// `decide` compared with the reference model for the same key; a peek (cost 0) must not
/// change the model.
async fn like_model<S: Store + ?Sized>(
    store: &S,
    model: &mut Model,
    key: &[u8],
    limit: Limit,
    now: u64,
    cost: u64,
    ctx: &str,
) -> Decision {
    let expected = if cost == 0 {
        model.evaluate(key, limit, now, 0)
    } else {
        model.decide(key, limit, now, cost)
    };
    let got = decide(store, key, limit, cost, &ctx).await;
    assert_eq!(
        got,
        expected,
        "{ctx}: key {}, {}, cost {cost} at {now} µs: the store's decision (left) differs from the \
         reference model Limit::decide (right)",
        show(key),
        describe(&limit)
    );
    got
}

/// `decide_all`, compared with the reference model's all-or-nothing batch.
async fn decide_all_like_model<S: Store + ?Sized>(
    store: &S,
    model: &mut Model,
    requests: &[Request<'_>],
    now: u64,
    ctx: &str,
) -> Vec<Decision> {
    let expected = model.decide_all(requests, now);
    let got = decide_all(store, requests, &ctx).await;
    assert_eq!(
        got, expected,
        "{ctx}: decide_all at {now} µs: the store's decisions (left) differ from the reference \
         model (right): each must be what its request alone would get (a peek's answer in a \
         denied batch), and the batch charged only if all are allowed"
    );
    got
}

/// A fresh key admits exactly [`Limit::capacity`] requests of cost 1 at one instant, counting
/// `remaining` down to 0, then denies with a finite `retry_after`. Every algorithm, several quotas.
pub async fn check_fresh_key_admits_capacity<S: Store + ?Sized>(store: &S, clock: &ManualClock) {
    const CHECK: &str = "fresh_key_admits_capacity";
    for (key, limit, ctx, _) in cases(CHECK, &small_quotas()) {
        let cap = limit.capacity();
        let now = clock.now_us();
        let mut model = Model::default();
        for n in 1..=cap {
            let d = like_model(store, &mut model, &key, limit, now, 1, &ctx).await;
            assert!(
                d.is_allowed() && d.limit() == cap && d.remaining() == cap - n,
                "{ctx}: request {n} of {cap} at one instant must be allowed with limit {cap} and \
                 remaining {}, got {d:?}",
                cap - n
            );
        }
        let d = like_model(store, &mut model, &key, limit, now, 1, &ctx).await;
        assert!(
            d.is_denied()
                && d.remaining() == 0
                && !d.is_never()
                && d.retry_after() > Duration::ZERO,
            "{ctx}: request {} at the same instant must be denied with remaining 0 and a finite \
             retry_after > 0, got {d:?}",
            cap + 1
        );
    }
}

/// A denial's `retry_after` is exact: the same request is still denied one microsecond before
/// `now + retry_after` (with `retry_after` 1 µs) and admitted at it. Costs 0 (peek), 1, about
/// half and all of the capacity; from a just-exhausted key and from partly refilled states.
pub async fn check_retry_after_is_exact<S: Store + ?Sized>(store: &S, clock: &ManualClock) {
    const CHECK: &str = "retry_after_is_exact";
    let keys = Keys::new(CHECK);
    for (i, limit) in all_limits(&small_quotas()).into_iter().enumerate() {
        let mut rng = Rng::new(seed(CHECK, i));
        let cap = limit.capacity();
        let period = limit.quota().period_us();
        let mut costs = vec![0, 1, cap / 2 + 1, cap];
        costs.sort_unstable();
        costs.dedup();
        for (j, &cost) in costs.iter().enumerate() {
            for variant in 0..3 {
                let key = keys.key(format!("{i}/{j}/{variant}"));
                let ctx = format!(
                    "check `{CHECK}` ({}, key {}, cost {cost}, variant {variant})",
                    describe(&limit),
                    show(&key)
                );
                let d = decide(store, &key, limit, cap, &ctx).await;
                assert!(
                    d.is_allowed(),
                    "{ctx}: spending the whole capacity of a fresh key at once must be allowed, got {d:?}"
                );
                if variant > 0 {
                    // Move into a partly refilled state and spend what it holds.
                    let wait = if variant == 1 {
                        period / 2 + 1
                    } else {
                        rng.range(1, 2 * period)
                    };
                    clock.advance(Duration::from_micros(wait));
                    let peek = decide(store, &key, limit, 0, &ctx).await;
                    if peek.remaining() > 0 {
                        let d = decide(store, &key, limit, peek.remaining(), &ctx).await;
                        assert!(
                            d.is_allowed() && d.remaining() == 0,
                            "{ctx}: spending the {} units a peek reported must be allowed, leaving 0, got {d:?}",
                            peek.remaining()
                        );
                    }
                }
                let t = clock.now_us();
                let denied = decide(store, &key, limit, cost, &ctx).await;
                assert!(
                    denied.is_denied()
                        && !denied.is_never()
                        && denied.retry_after() > Duration::ZERO,
                    "{ctx}: with nothing left at t = {t} µs the request must be denied with a \
                     finite retry_after > 0, got {denied:?}"
                );
                let r = denied.retry_after_us();
                clock.set_us(t + r - 1);
                let before = decide(store, &key, limit, cost, &ctx).await;
                assert!(
                    before.is_denied() && before.retry_after() == Duration::from_micros(1),
                    "{ctx}: denied at t = {t} µs with retry_after {r} µs, the same request must still \
                     be denied at t + retry_after - 1 µs, with retry_after 1 µs; got {before:?}"
                );
                clock.set_us(t + r);
                let after = decide(store, &key, limit, cost, &ctx).await;
                assert!(
                    after.is_allowed(),
                    "{ctx}: denied at t = {t} µs with retry_after {r} µs, the same request must pass \
                     at t + retry_after; got {after:?}"
                );
            }
        }
    }
}

/// The strongest check: for every algorithm and several quotas (tiny and odd periods, a day, a
/// quota near the exact-integer range), a deterministic pseudo-random walk of
/// 200 steps (time advances of zero, a few µs, a refill unit, a window boundary ± 1 µs, a
/// denial's `retry_after` or 1 µs before it, long idles; costs 0, 1, weighted, the capacity, above
/// it, `u64::MAX`), sent through `decide` and single-request `decide_all`, where every decision
/// must equal [`Limit::decide`] on a local [`State`].
pub async fn check_matches_reference_model<S: Store + ?Sized>(store: &S, clock: &ManualClock) {
    const CHECK: &str = "matches_reference_model";
    for (key, limit, _, mut rng) in cases(CHECK, &model_quotas()) {
        let mut walk = Walk::new(CHECK, &key, &limit, clock.now_us());
        walk.random(store, clock, &mut rng, limit, MODEL_STEPS, 0)
            .await;
    }
}

/// A request of cost 0 (a peek) changes nothing: on a fresh key it is allowed with the whole
/// capacity and `reset_after` zero, repeated peeks answer the same, the key still admits its whole
/// capacity afterwards, peeks on an exhausted key are denied without pushing `retry_after` out;
/// then a walk mixing peeks and charges matches the reference model.
pub async fn check_peek_changes_nothing<S: Store + ?Sized>(store: &S, clock: &ManualClock) {
    const CHECK: &str = "peek_changes_nothing";
    for (key, limit, ctx, mut rng) in cases(CHECK, &small_quotas()) {
        let cap = limit.capacity();
        let mut walk = Walk::new(CHECK, &key, &limit, clock.now_us());
        let now = clock.now_us();
        let first = walk.step(store, now, limit, 0, Via::Decide).await;
        assert!(
            first.is_allowed() && first.remaining() == cap && first.reset_after() == Duration::ZERO,
            "{ctx}: a peek at a fresh key must be allowed with remaining = capacity and reset_after 0, got {first:?}"
        );
        for _ in 0..3 {
            let again = walk.step(store, now, limit, 0, Via::Decide).await;
            assert_eq!(again, first, "{ctx}: repeated peeks must answer the same");
        }
        let all = walk.step(store, now, limit, cap, Via::Decide).await;
        assert!(
            all.is_allowed(),
            "{ctx}: after peeks only, the whole capacity must still pass at once, got {all:?}"
        );
        let p1 = walk.step(store, now, limit, 0, Via::Decide).await;
        let p2 = walk.step(store, now, limit, 0, Via::Batch).await;
        assert!(
            p1.is_denied() && p1 == p2,
            "{ctx}: peeks at an exhausted key must be denied, identically: {p1:?} then {p2:?}"
        );
        for step in 0..30 {
            let advance = random_advance(&mut rng, &limit, clock.now_us(), walk.last_retry);
            clock.advance(Duration::from_micros(advance));
            let now = clock.now_us();
            let cost = if rng.below(2) == 0 {
                0
            } else {
                random_cost(&mut rng, cap)
            };
            let d = walk.step(store, now, limit, cost, via(step)).await;
            if cost == 0 {
                let again = walk.step(store, now, limit, 0, Via::Decide).await;
                assert_eq!(
                    again, d,
                    "{ctx}: a second peek at the same instant must answer the same"
                );
            }
        }
    }
}

/// A request costing more than the capacity is denied with `retry_after` = [`NEVER`]
/// (`is_never()`), `remaining` unchanged, and charges nothing: the whole capacity still passes
/// afterwards. Through `decide` and `decide_all`, costs `capacity + 1` and `u64::MAX`.
pub async fn check_cost_above_capacity_is_never<S: Store + ?Sized>(store: &S, clock: &ManualClock) {
    const CHECK: &str = "cost_above_capacity_is_never";
    for (key, limit, ctx, _) in cases(CHECK, &small_quotas()) {
        let cap = limit.capacity();
        let now = clock.now_us();
        let mut walk = Walk::new(CHECK, &key, &limit, now);
        for (cost, via) in [
            (cap + 1, Via::Decide),
            (cap + 1, Via::Batch),
            (u64::MAX, Via::Decide),
            (u64::MAX, Via::Batch),
        ] {
            let d = walk.step(store, now, limit, cost, via).await;
            assert!(
                d.is_denied()
                    && d.is_never()
                    && d.retry_after() == NEVER
                    && d.remaining() == cap
                    && d.limit() == cap,
                "{ctx}: cost {cost} > capacity {cap} on a fresh key (via {via:?}) must be denied \
                 with retry_after NEVER and remaining {cap}, got {d:?}"
            );
        }
        let all = walk.step(store, now, limit, cap, Via::Decide).await;
        assert!(
            all.is_allowed() && all.remaining() == 0,
            "{ctx}: requests above the capacity must charge nothing: the whole capacity must \
             still pass at once, got {all:?}"
        );
        let d = walk.step(store, now, limit, cap + 1, Via::Decide).await;
        assert!(
            d.is_never() && d.remaining() == 0,
            "{ctx}: cost above capacity on an exhausted key must be NEVER with remaining 0, got {d:?}"
        );
    }
}

/// A denied request is not charged: repeated denials leave the remaining units spendable and do
/// not push the time the key frees up any further out.
pub async fn check_denied_request_is_not_charged<S: Store + ?Sized>(
    store: &S,
    clock: &ManualClock,
) {
    const CHECK: &str = "denied_request_is_not_charged";
    for (key, limit, ctx, _) in cases(CHECK, &small_quotas()) {
        let cap = limit.capacity();
        let now = clock.now_us();
        let mut walk = Walk::new(CHECK, &key, &limit, now);
        if cap >= 2 {
            walk.step(store, now, limit, cap - 1, Via::Decide).await;
            for n in 0..6 {
                let d = walk.step(store, now, limit, 2, via(n)).await;
                assert!(
                    d.is_denied(),
                    "{ctx}: cost 2 with one unit left must be denied, got {d:?}"
                );
            }
            let last = walk.step(store, now, limit, 1, Via::Decide).await;
            assert!(
                last.is_allowed() && last.remaining() == 0,
                "{ctx}: after six denied requests of cost 2, the one unit left must still pass: \
                 denied requests must not be charged; got {last:?}"
            );
        } else {
            walk.step(store, now, limit, 1, Via::Decide).await;
        }
        let first = walk.step(store, now, limit, 1, Via::Decide).await;
        let r = first.retry_after_us();
        assert!(
            first.is_denied() && r > 0 && !first.is_never(),
            "{ctx}: an exhausted key must deny cost 1 with a finite retry_after, got {first:?}"
        );
        for k in 1..=3 {
            clock.set_us(now + r * k / 4);
            let d = walk
                .step(store, clock.now_us(), limit, 1, via(k as usize))
                .await;
            assert!(
                d.is_denied(),
                "{ctx}: before the first denial's retry_after ({r} µs) has passed, cost 1 must \
                 still be denied, got {d:?}"
            );
        }
        clock.set_us(now + r);
        let d = walk.step(store, now + r, limit, 1, Via::Decide).await;
        assert!(
            d.is_allowed(),
            "{ctx}: at the first denial's retry_after ({r} µs) cost 1 must pass: the denials in \
             between must not have been charged; got {d:?}"
        );
    }
}

/// Different keys are independent: exhausting one leaves another (including one that extends it,
/// or differs only in letter case) untouched, and charging the other leaves the first as it was.
pub async fn check_keys_are_independent<S: Store + ?Sized>(store: &S, clock: &ManualClock) {
    const CHECK: &str = "keys_are_independent";
    let keys = Keys::new(CHECK);
    for (i, limit) in all_limits(&small_quotas()).into_iter().enumerate() {
        let a = keys.key(format!("{i}/a"));
        let others = [
            keys.key(format!("{i}/b")),
            keys.key(format!("{i}/a/")),
            keys.key(format!("{i}/A")),
            keys.key(format!("{i}/")),
        ];
        let cap = limit.capacity();
        let ctx = format!("check `{CHECK}` ({})", describe(&limit));
        let now = clock.now_us();
        let mut model = Model::default();
        like_model(store, &mut model, &a, limit, now, cap, &ctx).await;
        let denied = like_model(store, &mut model, &a, limit, now, 1, &ctx).await;
        assert!(
            denied.is_denied(),
            "{ctx}: key {} must be exhausted",
            show(&a)
        );
        for other in &others {
            let p = like_model(store, &mut model, other, limit, now, 0, &ctx).await;
            assert!(
                p.is_allowed() && p.remaining() == cap,
                "{ctx}: exhausting key {} must not touch key {}, got {p:?}",
                show(&a),
                show(other)
            );
            let d = like_model(store, &mut model, other, limit, now, 1, &ctx).await;
            assert!(
                d.is_allowed(),
                "{ctx}: key {} must pass, got {d:?}",
                show(other)
            );
        }
        let again = like_model(store, &mut model, &a, limit, now, 1, &ctx).await;
        assert_eq!(
            again,
            denied,
            "{ctx}: charging other keys must not change key {}",
            show(&a)
        );
    }
}

/// Keys are opaque bytes: braces (Redis Cluster hash tags), NUL, escapes that look like NUL,
/// invalid UTF-8, composed and decomposed Unicode, letter case, trailing whitespace, separators,
/// and keys of exactly [`MAX_KEY_LEN`] bytes all work and are distinct identities, through
/// `decide` and `decide_all` (a batch of such keys holds no duplicates).
pub async fn check_key_bytes_are_opaque<S: Store + ?Sized>(store: &S, clock: &ManualClock) {
    const CHECK: &str = "key_bytes_are_opaque";
    let suffixes: Vec<Vec<u8>> = vec![
        b"a{b}".to_vec(),
        b"a{b".to_vec(),
        b"{a}b".to_vec(),
        b"a}b{".to_vec(),
        b"{}".to_vec(),
        b"{a}".to_vec(),
        b"a".to_vec(),
        b"a\0b".to_vec(),
        b"a\0c".to_vec(),
        b"a\0".to_vec(),
        b"a\\0b".to_vec(),
        b"a\\x00b".to_vec(),
        b"a%00b".to_vec(),
        vec![0xff],
        vec![0xfe],
        vec![0xc3],
        "é".as_bytes().to_vec(),
        "e\u{301}".as_bytes().to_vec(),
        "😀".as_bytes().to_vec(),
        b"A".to_vec(),
        b"a ".to_vec(),
        b"a\n".to_vec(),
        b"a\r\n".to_vec(),
        b"a:b".to_vec(),
        b"a\\:b".to_vec(),
        b"*".to_vec(),
    ];
    for (i, &algorithm) in Algorithm::ALL.iter().enumerate() {
        let keys = Keys::new(CHECK);
        let mut all: Vec<Vec<u8>> = suffixes.iter().map(|s| keys.key(s)).collect();
        all.push(keys.key_of_len(MAX_KEY_LEN, b'1'));
        all.push(keys.key_of_len(MAX_KEY_LEN, b'2'));
        all.push(keys.key_of_len(MAX_KEY_LEN - 1, b'1'));
        for (j, k) in all.iter().enumerate() {
            assert!(
                !all[..j].contains(k),
                "distlimit-test bug: duplicate key {}",
                show(k)
            );
        }
        let limit = Limit::new(algorithm, quota(64, HOUR, 64));
        let ctx = format!("check `{CHECK}` ({}, case {i})", describe(&limit));
        let now = clock.now_us();
        let mut model = Model::default();
        // Key j is charged j + 1 units, so a peek tells every key apart.
        for (j, key) in all.iter().enumerate() {
            let d = like_model(store, &mut model, key, limit, now, j as u64 + 1, &ctx).await;
            assert!(
                d.is_allowed() && d.remaining() == 64 - (j as u64 + 1),
                "{ctx}: key {} was charged as if it shared state with another key: {d:?}",
                show(key)
            );
        }
        for (j, key) in all.iter().enumerate() {
            let p = like_model(store, &mut model, key, limit, now, 0, &ctx).await;
            assert_eq!(
                p.remaining(),
                64 - (j as u64 + 1),
                "{ctx}: key {} must be its own identity",
                show(key)
            );
        }
        let batch: Vec<Request<'_>> = all
            .iter()
            .take(MAX_BATCH)
            .map(|k| request(k, limit, 1))
            .collect();
        let ds = decide_all_like_model(store, &mut model, &batch, now, &ctx).await;
        assert!(
            ds.iter().all(Decision::is_allowed),
            "{ctx}: a batch of distinct (if similar) keys must be accepted and admitted, got {ds:?}"
        );
        for key in &all {
            like_model(store, &mut model, key, limit, now, 0, &ctx).await;
        }
    }
}

/// `decide_all` is all-or-nothing: tiers of different algorithms are all charged when every one
/// admits; when one denies (by exhaustion, cost above capacity, or a denied peek) nobody is
/// charged, as peeks afterwards show, and every decision is what its request alone would get
/// (in a denied batch, what its peek gets).
/// Also full batches of [`MAX_BATCH`] requests.
pub async fn check_decide_all_is_all_or_nothing<S: Store + ?Sized>(store: &S, clock: &ManualClock) {
    const CHECK: &str = "decide_all_is_all_or_nothing";
    let all_algorithms = Algorithm::ALL;
    for (i, &algorithm) in all_algorithms.iter().enumerate() {
        let keys = Keys::new(CHECK);
        let la = Limit::new(algorithm, quota(10, HOUR, 10));
        let lb = Limit::new(all_algorithms[(i + 1) % 5], quota(3, HOUR, 3));
        let lc = Limit::new(all_algorithms[(i + 2) % 5], quota(8, MINUTE, 8));
        let (a, b, c) = (keys.key("a"), keys.key("b"), keys.key("c"));
        let ctx = format!(
            "check `{CHECK}` (key a: {}; key b: {}; key c: {})",
            describe(&la),
            describe(&lb),
            describe(&lc)
        );
        let now = clock.now_us();
        let mut model = Model::default();
        let tiers = [request(&a, la, 1), request(&b, lb, 1), request(&c, lc, 2)];

        for round in 1..=3 {
            let ds = decide_all_like_model(store, &mut model, &tiers, now, &ctx).await;
            assert!(
                ds.iter().all(Decision::is_allowed),
                "{ctx}: batch {round} fits every tier and must be admitted, got {ds:?}"
            );
        }
        // b is exhausted now: the batch is denied and charges nobody, though a and c alone pass.
        for round in 4..=5 {
            let ds = decide_all_like_model(store, &mut model, &tiers, now, &ctx).await;
            assert!(
                ds[0].is_allowed() && ds[1].is_denied() && ds[2].is_allowed(),
                "{ctx}: batch {round}: a and c alone pass, b is exhausted: got {ds:?}"
            );
            assert!(
                ds[0].remaining() == 7 && ds[2].remaining() == 2,
                "{ctx}: batch {round} charges nobody, so a and c report their state as it is \
                 (7 and 2 left, as a peek would), got {ds:?}"
            );
        }
        let pa = like_model(store, &mut model, &a, la, now, 0, &ctx).await;
        let pc = like_model(store, &mut model, &c, lc, now, 0, &ctx).await;
        assert!(
            pa.remaining() == 7 && pc.remaining() == 2,
            "{ctx}: denied batches must charge no key: a must have 7 left and c 2, got {pa:?} and {pc:?}"
        );

        // A request above its capacity makes the batch impossible, and charges nobody.
        let d = keys.key("d");
        let ld = Limit::new(algorithm, quota(4, HOUR, 4));
        let batch = [request(&a, la, 1), request(&d, ld, 5)];
        let ds = decide_all_like_model(store, &mut model, &batch, now, &ctx).await;
        assert!(
            ds[0].is_allowed() && ds[1].is_never(),
            "{ctx}: cost 5 on capacity 4 must be NEVER and deny the batch, got {ds:?}"
        );
        let pa = like_model(store, &mut model, &a, la, now, 0, &ctx).await;
        let pd = like_model(store, &mut model, &d, ld, now, 0, &ctx).await;
        assert!(
            pa.remaining() == 7 && pd.remaining() == 4,
            "{ctx}: an impossible batch must charge no key, got {pa:?} and {pd:?}"
        );

        // A full batch of fresh keys is admitted and charges every key; then one whose last
        // request is exhausted key b's charges none of them.
        let fresh: Vec<Vec<u8>> = (0..MAX_BATCH).map(|j| keys.key(format!("f{j}"))).collect();
        let lf = Limit::new(algorithm, quota(2, HOUR, 2));
        for admitted in [true, false] {
            let mut batch: Vec<Request<'_>> = fresh.iter().map(|k| request(k, lf, 1)).collect();
            if !admitted {
                batch[MAX_BATCH - 1] = request(&b, lb, 1);
            }
            let ds = decide_all_like_model(store, &mut model, &batch, now, &ctx).await;
            assert!(
                ds[..MAX_BATCH - 1].iter().all(Decision::is_allowed)
                    && ds[MAX_BATCH - 1].is_allowed() == admitted,
                "{ctx}: a full batch of {MAX_BATCH} keys{}: got {ds:?}",
                if admitted {
                    ", all fresh"
                } else {
                    " ending with exhausted key b"
                }
            );
            for k in &fresh {
                let p = like_model(store, &mut model, k, lf, now, 0, &ctx).await;
                assert_eq!(
                    p.remaining(),
                    1,
                    "{ctx}: the admitted batch must charge key {} once, the denied one not",
                    show(k)
                );
            }
        }

        // Peeks in a batch: an allowed peek charges nothing; a denied peek denies the batch.
        let e = keys.key("e");
        let le = Limit::new(algorithm, quota(5, HOUR, 5));
        let batch = [request(&a, la, 0), request(&e, le, 3)];
        let ds = decide_all_like_model(store, &mut model, &batch, now, &ctx).await;
        assert!(
            ds.iter().all(Decision::is_allowed),
            "{ctx}: a peek at a and 3 units of fresh key e must be admitted, got {ds:?}"
        );
        let batch = [request(&b, lb, 0), request(&e, le, 1)];
        let ds = decide_all_like_model(store, &mut model, &batch, now, &ctx).await;
        assert!(
            ds[0].is_denied() && ds[1].is_allowed(),
            "{ctx}: a peek at exhausted key b is denied and denies the batch, got {ds:?}"
        );
        let pa = like_model(store, &mut model, &a, la, now, 0, &ctx).await;
        let pe = like_model(store, &mut model, &e, le, now, 0, &ctx).await;
        assert!(
            pa.remaining() == 7 && pe.remaining() == 2,
            "{ctx}: a peek in a batch must charge nothing and a denied batch must not charge e: \
             got {pa:?} and {pe:?}"
        );
    }
}

/// `decide_all` rejects an empty batch, a batch of more than [`MAX_BATCH`] requests, and a batch
/// naming one key twice (same limit, different limits, or peeks) with [`Error::InvalidRequest`],
/// and charges nothing for them.
pub async fn check_decide_all_rejects_invalid_batches<S: Store + ?Sized>(
    store: &S,
    clock: &ManualClock,
) {
    const CHECK: &str = "decide_all_rejects_invalid_batches";
    for (i, &algorithm) in Algorithm::ALL.iter().enumerate() {
        let keys = Keys::new(CHECK);
        let limit = Limit::new(algorithm, quota(5, HOUR, 5));
        let other = Limit::new(Algorithm::ALL[(i + 1) % 5], quota(3, MINUTE, 3));
        let ctx = format!("check `{CHECK}` ({})", describe(&limit));

        let many: Vec<Vec<u8>> = (0..=MAX_BATCH).map(|j| keys.key(format!("m{j}"))).collect();
        let (a, b, c) = (keys.key("a"), keys.key("b"), keys.key("c"));
        // Equal bytes in separate buffers: keys are compared by value.
        let (a2, c2) = (a.clone(), c.clone());
        let invalid: [(&str, Vec<Request<'_>>); 5] = [
            ("an empty batch", Vec::new()),
            (
                "a batch of MAX_BATCH + 1 requests",
                many.iter().map(|k| request(k, limit, 1)).collect(),
            ),
            (
                "a batch naming one key twice",
                vec![
                    request(&a, limit, 1),
                    request(&b, limit, 1),
                    request(&a2, limit, 1),
                ],
            ),
            (
                "a batch naming one key twice under different limits",
                vec![request(&c, limit, 1), request(&c2, other, 1)],
            ),
            (
                "a batch of two peeks at one key",
                vec![request(&a, limit, 0), request(&a2, limit, 0)],
            ),
        ];
        for (what, batch) in &invalid {
            let result = store.decide_all(batch).await;
            assert!(
                matches!(result, Err(Error::InvalidRequest(_))),
                "{ctx}: {what} must be rejected with Error::InvalidRequest (see validate_batch), \
                 got {result:?}"
            );
        }

        let now = clock.now_us();
        let mut model = Model::default();
        for k in many.iter().chain([&a, &b, &c]) {
            let p = like_model(store, &mut model, k, limit, now, 0, &ctx).await;
            assert_eq!(
                p.remaining(),
                limit.capacity(),
                "{ctx}: a rejected batch must charge nothing, but key {} was charged",
                show(k)
            );
        }
        let p = like_model(store, &mut model, &c, other, now, 0, &ctx).await;
        assert_eq!(
            p.remaining(),
            other.capacity(),
            "{ctx}: a rejected batch must charge nothing, but key {} was charged under {}",
            show(&c),
            describe(&other)
        );
    }
}

/// One key used under different limits in turn behaves as [`Limit::decide`] says: under another
/// quota of the same algorithm the state carries over; under another algorithm the key starts
/// fresh, and once admitted there, the old algorithm's state is gone (so switching back starts
/// fresh too). A store must therefore keep one state per key, not one per key and algorithm.
///
/// For every ordered pair of algorithms `(a, b)`: a walk under `a`, under `a` with another
/// quota, under `b` (briefly, so `a`'s old state would still matter), then under `a` again, every
/// decision compared with the model. Before each switch of algorithm the key is spent out, and
/// the switch is made by an admitted request of cost ≥ 1, where every reading of the contract
/// agrees; what a denied request or a peek under a new algorithm does to the old state is left
/// unchecked.
pub async fn check_limit_change_follows_model<S: Store + ?Sized>(store: &S, clock: &ManualClock) {
    const CHECK: &str = "limit_change_follows_model";
    const STEPS_PER_LIMIT: usize = 20;
    let keys = Keys::new(CHECK);
    let q1 = quota(10, SECOND, 5);
    let q2 = quota(4, 2 * SECOND, 8);
    let mut case = 0;
    for &a in &Algorithm::ALL {
        for &b in &Algorithm::ALL {
            if a == b {
                continue;
            }
            case += 1;
            let key = keys.key(case.to_string());
            let mut rng = Rng::new(seed(CHECK, case));
            let segments = [
                Limit::new(a, q1),
                Limit::new(a, q2),
                Limit::new(b, q1),
                Limit::new(a, q1),
            ];
            let mut walk = Walk::new(CHECK, &key, &segments[0], clock.now_us());
            walk.case = format!("{a}, then {a} with another quota, then {b}, then {a} again");
            for (n, limit) in segments.iter().copied().enumerate() {
                let switched = n > 0 && segments[n - 1].algorithm() != limit.algorithm();
                let brief = limit.algorithm() == b;
                for step in 0..STEPS_PER_LIMIT {
                    let advance = if brief {
                        rng.range(0, 3)
                    } else {
                        random_advance(&mut rng, &limit, clock.now_us(), walk.last_retry)
                    };
                    clock.advance(Duration::from_micros(advance));
                    let cost = if switched && step == 0 {
                        rng.range(1, limit.capacity())
                    } else {
                        random_cost(&mut rng, limit.capacity())
                    };
                    walk.step(store, clock.now_us(), limit, cost, via(step))
                        .await;
                }
                if segments
                    .get(n + 1)
                    .is_some_and(|next| next.algorithm() != limit.algorithm())
                {
                    // Spend the key out, so a store that kept this state would deny later.
                    let now = clock.now_us();
                    let peek = walk.step(store, now, limit, 0, Via::Decide).await;
                    if peek.remaining() > 0 {
                        walk.step(store, now, limit, peek.remaining(), Via::Decide)
                            .await;
                    }
                }
            }
        }
    }
}

/// A clock that goes backwards (an NTP step, or clients with skewed clocks sharing a server) is
/// handled as [`Limit::decide`] handles it: a walk with backward jumps matches the reference model.
pub async fn check_clock_going_backwards_follows_model<S: Store + ?Sized>(
    store: &S,
    clock: &ManualClock,
) {
    const CHECK: &str = "clock_going_backwards_follows_model";
    const STEPS: usize = 60;
    for (key, limit, _, mut rng) in cases(CHECK, &small_quotas()) {
        let mut walk = Walk::new(CHECK, &key, &limit, clock.now_us());
        walk.random(store, clock, &mut rng, limit, STEPS, 15).await;
    }
}

/// From [`State::expires_at`] on, a key decides exactly like a fresh one (so stores may forget
/// state then, for example through a TTL): after a random walk, at the state's expiry, peeks and
/// charges match both the walked model and a fresh key.
pub async fn check_idle_key_decides_as_fresh<S: Store + ?Sized>(store: &S, clock: &ManualClock) {
    const CHECK: &str = "idle_key_decides_as_fresh";
    const STEPS: usize = 25;
    for (key, limit, ctx, mut rng) in cases(CHECK, &model_quotas()) {
        let mut walk = Walk::new(CHECK, &key, &limit, clock.now_us());
        walk.random(store, clock, &mut rng, limit, STEPS, 0).await;
        let expires = walk.state.expires_at(limit.quota());
        let now = clock.now_us().max(expires);
        clock.set_us(now);
        let mut fresh = State::fresh(limit.algorithm());
        let cap = limit.capacity();
        for (cost, via) in [
            (0, Via::Decide),
            (cap, Via::Batch),
            (0, Via::Decide),
            (1, Via::Decide),
        ] {
            let expected = limit.decide(&mut fresh, now, cost);
            let got = walk.step(store, now, limit, cost, via).await;
            assert_eq!(
                got, expected,
                "{ctx}: at the state's expires_at ({expires} µs, now {now} µs) cost {cost} must \
                 be decided like on a fresh key (right); the store (left) matched the reference \
                 model, so State::expires_at in distlimit-core is wrong"
            );
        }
    }
}

/// Concurrent requests on one key are atomic: 32 Tokio tasks released together
/// race for one fresh key with capacity 10, half through `decide`, half through `decide_all`;
/// exactly 10 are admitted. Every algorithm.
///
/// Takes an `Arc` because the tasks are spawned with `tokio::spawn`; run it on a multi-threaded
/// runtime for real parallelism (it also works, interleaved, on a current-thread one).
pub async fn check_concurrent_requests_admit_exactly_limit<S: Store + ?Sized + 'static>(
    store: &Arc<S>,
    _clock: &ManualClock,
) {
    const CHECK: &str = "concurrent_requests_admit_exactly_limit";
    let keys = Keys::new(CHECK);
    for (i, &algorithm) in Algorithm::ALL.iter().enumerate() {
        let limit = Limit::new(algorithm, quota(RACE_LIMIT, HOUR, RACE_LIMIT));
        let key: Arc<[u8]> = keys.key(i.to_string()).into();
        let ctx = format!("check `{CHECK}` ({}, key {})", describe(&limit), show(&key));
        let answers = race(&ctx, |t| {
            let (store, key) = (Arc::clone(store), Arc::clone(&key));
            async move {
                let request = Request::new(distlimit_core::Key::new(&*key)?, limit);
                if t % 2 == 0 {
                    store.decide(&request).await.map(|d| vec![d])
                } else {
                    store.decide_all(std::slice::from_ref(&request)).await
                }
            }
        })
        .await;
        let mut allowed = 0;
        for (t, ds) in answers.iter().enumerate() {
            assert!(
                ds.len() == 1 && (ds[0].is_allowed() || !ds[0].is_never()),
                "{ctx}: task {t}: one request must get one decision, a denial of cost 1 not \
                 NEVER, got {ds:?}"
            );
            allowed += u64::from(ds[0].is_allowed());
        }
        assert_eq!(
            allowed, RACE_LIMIT,
            "{ctx}: {TASKS} concurrent requests on one key of capacity {RACE_LIMIT} must admit \
             exactly {RACE_LIMIT}: decisions on one key must be atomic"
        );
        let p = decide(&**store, &key, limit, 0, &ctx).await;
        assert!(
            p.is_denied() && p.remaining() == 0,
            "{ctx}: after the race the key must be exhausted, got {p:?}"
        );
    }
}

/// Concurrent batches are atomic across keys: 32 tasks each send the batch
/// `[shared key, own key]` (half in the other order, to catch lock-order deadlocks, which show as
/// a hang); the shared key has capacity 10, so exactly 10 batches are admitted, and exactly the
/// admitted tasks' own keys are charged.
pub async fn check_concurrent_batches_are_atomic<S: Store + ?Sized + 'static>(
    store: &Arc<S>,
    _clock: &ManualClock,
) {
    const CHECK: &str = "concurrent_batches_are_atomic";
    let keys = Keys::new(CHECK);
    for (i, &algorithm) in Algorithm::ALL.iter().enumerate() {
        let shared_limit = Limit::new(algorithm, quota(RACE_LIMIT, HOUR, RACE_LIMIT));
        let own_limit = Limit::new(Algorithm::ALL[(i + 3) % 5], quota(5, HOUR, 5));
        let shared: Arc<[u8]> = keys.key(format!("{i}/shared")).into();
        let own: Vec<Arc<[u8]>> = (0..TASKS)
            .map(|t| keys.key(format!("{i}/own/{t}")).into())
            .collect();
        let ctx = format!(
            "check `{CHECK}` (shared key {}: {}; own keys: {})",
            show(&shared),
            describe(&shared_limit),
            describe(&own_limit)
        );
        let answers = race(&ctx, |t| {
            let (store, shared, own_key) =
                (Arc::clone(store), Arc::clone(&shared), Arc::clone(&own[t]));
            async move {
                let s = Request::new(distlimit_core::Key::new(&*shared)?, shared_limit);
                let o = Request::new(distlimit_core::Key::new(&*own_key)?, own_limit);
                let batch = if t % 2 == 0 { [s, o] } else { [o, s] };
                store.decide_all(&batch).await
            }
        })
        .await;
        let mut admitted = [false; TASKS];
        for (t, ds) in answers.iter().enumerate() {
            assert_eq!(ds.len(), 2, "{ctx}: task {t}: two requests, {ds:?}");
            let (s, o) = if t % 2 == 0 {
                (ds[0], ds[1])
            } else {
                (ds[1], ds[0])
            };
            assert!(
                o.is_allowed(),
                "{ctx}: task {t}: its own fresh key must pass on its own, got {o:?}"
            );
            admitted[t] = s.is_allowed();
        }
        let count = admitted.iter().filter(|&&a| a).count() as u64;
        assert_eq!(
            count, RACE_LIMIT,
            "{ctx}: {TASKS} concurrent batches sharing a key of capacity {RACE_LIMIT} must admit \
             exactly {RACE_LIMIT}"
        );
        for (t, own_key) in own.iter().enumerate() {
            let p = decide(&**store, own_key, own_limit, 0, &ctx).await;
            let expected = if admitted[t] { 4 } else { 5 };
            assert_eq!(
                p.remaining(),
                expected,
                "{ctx}: task {t}'s batch was {}, so its own key must have {expected} left",
                if admitted[t] { "admitted" } else { "denied" }
            );
        }
    }
}

/// The [`StoreExt`] conveniences map an empty key and a key over [`MAX_KEY_LEN`] bytes to
/// [`Error::InvalidKey`], accept a key of exactly `MAX_KEY_LEN` bytes, and charge 1 (`check`),
/// `cost` (`check_cost`) and nothing (`peek`).
pub async fn check_store_ext_validates_keys<S: Store + ?Sized>(store: &S, clock: &ManualClock) {
    const CHECK: &str = "store_ext_validates_keys";
    for &algorithm in &Algorithm::ALL {
        let keys = Keys::new(CHECK);
        let limit = Limit::new(algorithm, quota(5, HOUR, 5));
        let ctx = format!("check `{CHECK}` ({})", describe(&limit));
        let long = keys.key_of_len(MAX_KEY_LEN + 1, b'x');
        for key in [&b""[..], &long] {
            let calls = [
                store.check(key, limit).await,
                store.check_cost(key, limit, 2).await,
                store.peek(key, limit).await,
            ];
            for (n, r) in calls.iter().enumerate() {
                assert!(
                    match r {
                        Err(Error::InvalidKey(KeyError::Empty)) => key.is_empty(),
                        Err(Error::InvalidKey(KeyError::TooLong { len, max })) => {
                            key.len() == *len && *len == MAX_KEY_LEN + 1 && *max == MAX_KEY_LEN
                        }
                        _ => false,
                    },
                    "{ctx}: call {n} (check, check_cost, peek) with a key of {} bytes must fail \
                     with Error::InvalidKey (KeyError::Empty, or TooLong above MAX_KEY_LEN), \
                     got {r:?}",
                    key.len()
                );
            }
        }

        let key = keys.key_of_len(MAX_KEY_LEN, b'1');
        let now = clock.now_us();
        let mut model = Model::default();
        let results = [
            (store.check(&key, limit).await, 1),
            (store.check_cost(&key[..], limit, 3).await, 3),
            (store.peek(&key, limit).await, 0),
            (store.check(&key, limit).await, 1),
            (store.check(&key, limit).await, 1),
        ];
        for (n, (r, cost)) in results.into_iter().enumerate() {
            let expected = model.decide(&key, limit, now, cost);
            match r {
                Ok(d) => assert_eq!(
                    d, expected,
                    "{ctx}: call {n} (cost {cost}) on a key of exactly MAX_KEY_LEN bytes: the \
                     store (left) differs from the reference model (right)"
                ),
                Err(e) => panic!(
                    "{ctx}: call {n} (cost {cost}) on a key of exactly MAX_KEY_LEN bytes must \
                     work, got {e} ({e:?})"
                ),
            }
        }
    }
}

/// One key under two policies holds two states: exhausting one leaves the other whole, and a
/// batch of the same key under both policies is valid and all-or-nothing.
pub async fn check_policies_are_independent<S: Store + ?Sized>(store: &S, clock: &ManualClock) {
    const CHECK: &str = "policies_are_independent";
    let keys = Keys::new(CHECK);
    let key = keys.key("client");
    let per_second = Limit::token_bucket(quota(2, SECOND, 2));
    let per_minute = Limit::gcra(quota(3, MINUTE, 3));
    let named = |policy: &'static str, limit: Limit, cost: u64| {
        (request(&key, limit, cost).with_policy(policy))
            .unwrap_or_else(|e| panic!("distlimit-test bug: {e}"))
    };
    let ctx = format!("check `{CHECK}`");

    // Exhaust the key in the unnamed policy and in "second"; "minute" stays whole.
    for policy in ["", "second"] {
        let d = store.decide(&named(policy, per_second, 2)).await;
        assert!(
            matches!(&d, Ok(d) if d.is_allowed()),
            "{ctx}: the first request under policy {policy:?} must pass, got {d:?}"
        );
    }
    let minute = store.decide(&named("minute", per_minute, 0)).await;
    assert!(
        matches!(&minute, Ok(d) if d.is_allowed() && d.remaining() == 3),
        "{ctx}: policy \"minute\" must be untouched by the others, got {minute:?}"
    );

    // A batch over both named policies: "second" is exhausted, so nothing is charged.
    let batch = [
        named("second", per_second, 1),
        named("minute", per_minute, 1),
    ];
    let decisions = store.decide_all(&batch).await;
    assert!(
        matches!(&decisions, Ok(d) if d.len() == 2 && d[0].is_denied() && d[1].is_allowed()),
        "{ctx}: the same key under two policies is a valid batch, denied by \"second\": {decisions:?}"
    );
    let minute = store.decide(&named("minute", per_minute, 0)).await;
    assert!(
        matches!(&minute, Ok(d) if d.remaining() == 3),
        "{ctx}: a denied batch must not charge policy \"minute\", got {minute:?}"
    );

    // Once "second" refills, the batch charges both.
    clock.advance(Duration::from_secs(1));
    let decisions = store.decide_all(&batch).await;
    assert!(
        matches!(&decisions, Ok(d) if d.iter().all(Decision::is_allowed)),
        "{ctx}: the batch must pass after a second, got {decisions:?}"
    );
    let minute = store.decide(&named("minute", per_minute, 0)).await;
    assert!(
        matches!(&minute, Ok(d) if d.remaining() == 2),
        "{ctx}: an admitted batch charges policy \"minute\" once, got {minute:?}"
    );
}

/// Reports and give-backs through [`Store::settle_all`] (see [`Store`], "Settling"), for the token
/// bucket and GCRA: a deterministic walk of decisions, reports (past the limit, as debt) and
/// give-backs on two keys, one settle at a time and in two-key batches, where every answer must
/// equal [`Limit::force_from`], [`Limit::give_back_from`] (then a peek) or [`Limit::decide_from`]
/// on local states; a key in debt is denied until exactly `now + retry_after`. The window
/// algorithms and a cost above [`MAX_REPORT`](distlimit_core::MAX_REPORT) are
/// [`Error::InvalidRequest`]s that change nothing. A store that does not settle must answer
/// [`Error::Unsupported`] and change nothing (then the rest is skipped), never a decision.
pub async fn check_settling_follows_model<S: Store + ?Sized>(store: &S, clock: &ManualClock) {
    const CHECK: &str = "settling_follows_model";
    let keys = Keys::new(CHECK);
    let ctx = format!("check `{CHECK}`");
    let probe = keys.key("probe");
    let limit = Limit::gcra(quota(5, SECOND, 5));
    let report = Settle::Report(request(&probe, limit, 7));
    if let Err(Error::Unsupported(_)) = store.settle_all(&[report]).await {
        let peek = decide(store, &probe, limit, 0, &ctx).await;
        assert_eq!(
            peek.remaining(),
            5,
            "{ctx}: an unsupported settle changed something"
        );
        return;
    }
    let quotas = [
        quota(10, SECOND, 10),
        quota(7, SECOND, 9),
        quota(3, MINUTE, 2),
    ];
    let algorithms = [Algorithm::TokenBucket, Algorithm::Gcra];
    let limits = algorithms.map(|a| quotas.map(|q| Limit::new(a, q)));
    for (i, limit) in limits.into_iter().flatten().enumerate() {
        let names = [keys.key(format!("{i}a")), keys.key(format!("{i}b"))];
        let mut states: [State; 2] = std::array::from_fn(|_| State::fresh(limit.algorithm()));
        let mut written = [None, None];
        let mut rng = Rng::new(seed(CHECK, i));
        for step in 0..MODEL_STEPS {
            clock.advance(Duration::from_micros(match rng.below(4) {
                0 => 0,
                1 => rng.below(1_000),
                _ => rng.below(limit.quota().period_us()),
            }));
            let now = clock.now_us();
            let j = step % 2;
            let cost = rng.below(3 * limit.capacity() + 2);
            let req = request(&names[j], limit, cost);
            // A report or give-back applied to the model: the decision after it.
            let settle = |state: &mut State, written: &mut Option<Quota>, s: &Settle<'_>| {
                let cost = s.request().cost();
                if s.is_report() {
                    return limit
                        .force_from(state, written, now, cost)
                        .unwrap_or_else(|e| panic!("distlimit-test bug: {e}"));
                }
                if let Err(e) = limit.give_back_from(state, written, now, cost) {
                    panic!("distlimit-test bug: {e}");
                }
                limit.evaluate_from(Some(state), written.as_ref(), now, 0)
            };
            let settled = match rng.below(3) {
                0 => {
                    let got = store.decide(&req).await;
                    let want = limit.decide_from(&mut states[j], &mut written[j], now, cost);
                    assert!(
                        matches!(&got, Ok(d) if *d == want),
                        "{ctx}: {}, step {step} at {now} µs: a request of {cost}: the store \
                         answered {got:?}, the model {want:?}",
                        describe(&limit)
                    );
                    continue;
                }
                1 => Settle::Report(req),
                _ => Settle::GiveBack(req),
            };
            let (got, want) = if step % 3 == 2 {
                // A batch: this settle and a report of 1 on the other key, both applied.
                let other = Settle::Report(request(&names[1 - j], limit, 1));
                let got = store.settle_all(&[settled, other]).await;
                let want = vec![
                    settle(&mut states[j], &mut written[j], &settled),
                    settle(&mut states[1 - j], &mut written[1 - j], &other),
                ];
                (got, want)
            } else {
                let got = store.settle_all(&[settled]).await;
                (got, vec![settle(&mut states[j], &mut written[j], &settled)])
            };
            assert!(
                matches!(&got, Ok(d) if *d == want),
                "{ctx}: {}, step {step} at {now} µs: settling {settled:?} (with a report of 1 \
                 on the other key when two are expected): the store answered {got:?}, the model \
                 {want:?} (a report charges past the limit as debt, a give-back never above \
                 capacity; both answer the peek after them)",
                describe(&limit)
            );
            let peek = decide(store, &names[j], limit, 0, &ctx).await;
            if peek.is_denied() && peek.retry_after() != NEVER {
                let r = peek.retry_after_us();
                let want = limit.evaluate_from(Some(&states[j]), written[j].as_ref(), now + r, 1);
                assert!(
                    want.is_allowed(),
                    "{ctx}: a key in debt must admit one unit at now + retry_after ({peek:?})"
                );
            }
        }
    }

    // What cannot be settled is refused, changing nothing.
    let key = keys.key("refused");
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
    ] {
        let limit = Limit::new(algorithm, quota(5, SECOND, 5));
        let req = request(&key, limit, 1);
        for settle in [Settle::Report(req.with_cost(9)), Settle::GiveBack(req)] {
            let got = store.settle_all(&[settle]).await;
            assert!(
                matches!(got, Err(Error::InvalidRequest(_))),
                "{ctx}: {settle:?} on {algorithm} must be an InvalidRequest, got {got:?}"
            );
        }
        let peek = decide(store, &key, limit, 0, &ctx).await;
        assert_eq!(
            peek.remaining(),
            5,
            "{ctx}: a refused report on {algorithm} must change nothing"
        );
    }
    let limit = Limit::gcra(quota(5, SECOND, 5));
    let other = keys.key("other");
    let (a, b) = (request(&key, limit, 1), request(&other, limit, 1));
    let refused: [&[Settle<'_>]; 2] = [
        &[Settle::Report(a), Settle::GiveBack(a.with_cost(2))],
        &[
            Settle::GiveBack(b),
            Settle::Report(a.with_cost(distlimit_core::MAX_REPORT + 1)),
        ],
    ];
    for batch in refused {
        let got = store.settle_all(batch).await;
        assert!(
            matches!(got, Err(Error::InvalidRequest(_))),
            "{ctx}: {batch:?} must be an InvalidRequest, got {got:?}"
        );
    }
    for name in [&key, &other] {
        let peek = decide(store, name, limit, 0, &ctx).await;
        assert_eq!(
            peek.remaining(),
            5,
            "{ctx}: a refused batch must change nothing"
        );
    }
}
