//! What every check shares: deterministic randomness, the quotas under test, unique keys, the
//! reference model, and store calls that turn an `Err` into a check failure.

// A check reports a contract violation by panicking: that is how a test fails.
#![allow(clippy::panic)]

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use distlimit_core::{
    Algorithm, Clock, Decision, Error, Key, Limit, MAX_KEY_LEN, ManualClock, Quota, Request, State,
    Store,
};
use tokio::sync::Barrier;

pub(crate) const SECOND: u64 = 1_000_000;
pub(crate) const MINUTE: u64 = 60 * SECOND;
pub(crate) const HOUR: u64 = 60 * MINUTE;
pub(crate) const DAY: u64 = 24 * HOUR;

/// Tasks racing on one key in the concurrency checks.
pub(crate) const TASKS: usize = 32;

/// A small, fast, deterministic generator (SplitMix64): a failing step reproduces exactly.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Uniform enough in `0..n`; 0 when `n` is 0.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }

    /// In `lo..=hi` (`lo` when `hi < lo`).
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.below((hi - lo).saturating_add(1))
        }
    }
}

/// A seed per check and case, so every case walks its own sequence.
pub(crate) fn seed(check: &str, case: usize) -> u64 {
    // FNV-1a over the name, mixed with the case number.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in check.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h ^ (case as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A quota the suite knows to be valid.
pub(crate) fn quota(limit: u64, period_us: u64, burst: u64) -> Quota {
    Quota::from_parts(limit, period_us, burst)
        .unwrap_or_else(|e| panic!("distlimit-test bug: a built-in quota is invalid: {e}"))
}

/// Quotas with small capacities, for checks that spend them one unit at a time.
pub(crate) fn small_quotas() -> Vec<Quota> {
    vec![
        quota(10, SECOND, 10),
        quota(60, MINUTE, 5),
        // GCRA's emission interval rounds up: ⌈1 000 000 / 3⌉ = 333 334 µs.
        quota(3, SECOND, 2),
        // A period that is no round number, so windows are not aligned with the start time.
        quota(7, 999_983, 7),
        quota(1, 1, 1),
        quota(5, 3, 4),
        quota(1, HOUR, 1),
    ]
}

/// Quotas for the reference-model walks: the small ones, plus a day and one near the exact
/// integer range (`limit × period` = 10^15, close to 2^50).
pub(crate) fn model_quotas() -> Vec<Quota> {
    let mut quotas = small_quotas();
    quotas.push(quota(100, DAY, 20));
    quotas.push(quota(1_000_000, 1_000 * SECOND, 1_000_000));
    quotas
}

/// Every algorithm under every quota.
pub(crate) fn all_limits(quotas: &[Quota]) -> Vec<Limit> {
    Algorithm::ALL
        .iter()
        .flat_map(|&a| quotas.iter().map(move |&q| Limit::new(a, q)))
        .collect()
}

/// One case per limit of [`all_limits`]`(quotas)`: a fresh key under one prefix for the check,
/// the limit, the failure messages' prefix naming both, and a generator seeded for the case.
pub(crate) fn cases(
    check: &'static str,
    quotas: &[Quota],
) -> impl Iterator<Item = (Vec<u8>, Limit, String, Rng)> {
    let keys = Keys::new(check);
    all_limits(quotas)
        .into_iter()
        .enumerate()
        .map(move |(i, limit)| {
            let key = keys.key(i.to_string());
            let ctx = format!("check `{check}` ({}, key {})", describe(&limit), show(&key));
            (key, limit, ctx, Rng::new(seed(check, i)))
        })
}

/// `gcra 3 per 1000000 µs, burst 2`.
pub(crate) fn describe(limit: &Limit) -> String {
    let q = limit.quota();
    format!(
        "{} {} per {} µs, burst {} (capacity {})",
        limit.algorithm(),
        q.limit(),
        q.period_us(),
        q.burst(),
        limit.capacity()
    )
}

/// A key as the failure message shows it.
pub(crate) fn show(key: &[u8]) -> String {
    format!("\"{}\"", key.escape_ascii())
}

/// Fresh keys for one check, all under one unique prefix.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: Vec<u8>,
}

impl Keys {
    pub(crate) fn new(check: &str) -> Self {
        Self {
            prefix: crate::unique_prefix(check),
        }
    }

    pub(crate) fn key(&self, suffix: impl AsRef<[u8]>) -> Vec<u8> {
        let mut key = self.prefix.clone();
        key.extend_from_slice(suffix.as_ref());
        key
    }

    /// A key of exactly `len` bytes ending in `last`.
    pub(crate) fn key_of_len(&self, len: usize, last: u8) -> Vec<u8> {
        let mut key = self.prefix.clone();
        key.resize(len.saturating_sub(1), b'x');
        key.push(last);
        assert!(
            key.len() == len && len <= MAX_KEY_LEN + 1,
            "distlimit-test bug: prefix too long for a {len}-byte key"
        );
        key
    }
}

/// A request for a key the suite built (so always a valid one).
pub(crate) fn request(key: &[u8], limit: Limit, cost: u64) -> Request<'_> {
    match Key::new(key) {
        Ok(key) => Request::new(key, limit).with_cost(cost),
        Err(e) => panic!(
            "distlimit-test bug: built an invalid key {}: {e}",
            show(key)
        ),
    }
}

/// `store.decide`, failing the check on `Err`.
pub(crate) async fn decide<S: Store + ?Sized>(
    store: &S,
    key: &[u8],
    limit: Limit,
    cost: u64,
    ctx: &(dyn fmt::Display + Sync),
) -> Decision {
    match store.decide(&request(key, limit, cost)).await {
        Ok(d) => d,
        Err(e) => panic!(
            "{ctx}: decide(key {}, cost {cost}) failed: {e} ({e:?})",
            show(key)
        ),
    }
}

/// `store.decide_all`, failing the check on `Err` or on an answer of the wrong length.
pub(crate) async fn decide_all<S: Store + ?Sized>(
    store: &S,
    requests: &[Request<'_>],
    ctx: &(dyn fmt::Display + Sync),
) -> Vec<Decision> {
    match store.decide_all(requests).await {
        Ok(ds) => {
            assert_eq!(
                ds.len(),
                requests.len(),
                "{ctx}: decide_all must answer one decision per request, in order"
            );
            ds
        }
        Err(e) => panic!(
            "{ctx}: decide_all of {} requests failed: {e} ({e:?})",
            requests.len()
        ),
    }
}

/// The reference model for many keys: [`Limit::decide_from`] on a local [`State`] per key and
/// the quota it was written under.
#[derive(Debug, Default)]
pub(crate) struct Model {
    states: HashMap<Vec<u8>, (State, Option<Quota>)>,
}

impl Model {
    pub(crate) fn decide(&mut self, key: &[u8], limit: Limit, now: u64, cost: u64) -> Decision {
        let (state, written) = self
            .states
            .entry(key.to_vec())
            .or_insert_with(|| (State::fresh(limit.algorithm()), None));
        limit.decide_from(state, written, now, cost)
    }

    pub(crate) fn evaluate(&self, key: &[u8], limit: Limit, now: u64, cost: u64) -> Decision {
        match self.states.get(key) {
            Some((state, written)) => limit.evaluate_from(Some(state), written.as_ref(), now, cost),
            None => limit.evaluate(None, now, cost),
        }
    }

    /// All-or-nothing, as [`Store::decide_all`] must be: every request's own answer, charged
    /// only if all are allowed; in a denied batch, a request that alone would pass is answered
    /// as a peek (its state as it is, since nothing was charged).
    pub(crate) fn decide_all(&mut self, requests: &[Request<'_>], now: u64) -> Vec<Decision> {
        let decisions: Vec<Decision> = requests
            .iter()
            .map(|r| self.evaluate(r.key().as_bytes(), *r.limit(), now, r.cost()))
            .collect();
        if decisions.iter().all(Decision::is_allowed) {
            for r in requests {
                self.decide(r.key().as_bytes(), *r.limit(), now, r.cost());
            }
            return decisions;
        }
        decisions
            .into_iter()
            .zip(requests)
            .map(|(d, r)| match d.is_allowed() {
                true => self.evaluate(r.key().as_bytes(), *r.limit(), now, 0),
                false => d,
            })
            .collect()
    }
}

/// How a walk step reached the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Via {
    Decide,
    Batch,
}

/// Every fourth step of a walk through `decide_all`.
pub(crate) fn via(step: usize) -> Via {
    if step % 4 == 3 {
        Via::Batch
    } else {
        Via::Decide
    }
}

#[derive(Clone, Debug)]
struct Step {
    limit: Limit,
    now: u64,
    cost: u64,
    via: Via,
    decision: Decision,
}

/// One key walked step by step, each store answer compared with [`Limit::decide`] on a local
/// [`State`]; a mismatch fails with the recent history.
#[derive(Debug)]
pub(crate) struct Walk<'a> {
    check: &'static str,
    /// What is walked, for failure messages: the limit's description unless set otherwise.
    pub(crate) case: String,
    key: &'a [u8],
    pub(crate) state: State,
    /// The quota `state` was written under.
    pub(crate) written: Option<Quota>,
    start: u64,
    history: Vec<Step>,
    /// `retry_after` of the last denial that can pass some day, to aim the next step at it.
    pub(crate) last_retry: Option<u64>,
}

impl<'a> Walk<'a> {
    pub(crate) fn new(check: &'static str, key: &'a [u8], limit: &Limit, start: u64) -> Self {
        Self {
            check,
            case: describe(limit),
            key,
            state: State::fresh(limit.algorithm()),
            written: None,
            start,
            history: Vec::new(),
            last_retry: None,
        }
    }

    /// Sends one request at the clock's current time and checks the answer against the model.
    pub(crate) async fn step<S: Store + ?Sized>(
        &mut self,
        store: &S,
        now: u64,
        limit: Limit,
        cost: u64,
        via: Via,
    ) -> Decision {
        let expected = limit.decide_from(&mut self.state, &mut self.written, now, cost);
        let req = request(self.key, limit, cost);
        let ctx = format!(
            "check `{}` ({}): step {}",
            self.check,
            self.case,
            self.history.len()
        );
        let got = match via {
            Via::Decide => decide(store, self.key, limit, cost, &ctx).await,
            Via::Batch => decide_all(store, std::slice::from_ref(&req), &ctx).await[0],
        };
        self.history.push(Step {
            limit,
            now,
            cost,
            via,
            decision: got,
        });
        assert_eq!(
            got,
            expected,
            "{}: the store's decision (left) differs from the reference model Limit::decide_from (right)\n{}",
            ctx,
            self.recent()
        );
        self.last_retry = (got.is_denied() && !got.is_never()).then(|| got.retry_after_us());
        got
    }

    /// `steps` random steps under `limit`: the clock moves by [`random_advance`] (or, for about
    /// `back_percent` % of the steps, back by up to two periods), then a [`random_cost`] is sent.
    pub(crate) async fn random<S: Store + ?Sized>(
        &mut self,
        store: &S,
        clock: &ManualClock,
        rng: &mut Rng,
        limit: Limit,
        steps: usize,
        back_percent: u64,
    ) {
        for step in 0..steps {
            if back_percent > 0 && rng.below(100) < back_percent {
                let back = rng.range(1, 2 * limit.quota().period_us());
                clock.set_us(clock.now_us().saturating_sub(back));
            } else {
                let advance = random_advance(rng, &limit, clock.now_us(), self.last_retry);
                clock.advance(Duration::from_micros(advance));
            }
            let cost = random_cost(rng, limit.capacity());
            self.step(store, clock.now_us(), limit, cost, via(step))
                .await;
        }
    }

    /// The last steps, for a failure message.
    fn recent(&self) -> String {
        let mut out = format!(
            "key {}; times relative to t0 = {} µs; the last steps, oldest first:\n",
            show(self.key),
            self.start
        );
        let skip = self.history.len().saturating_sub(12);
        for (i, s) in self.history.iter().enumerate().skip(skip) {
            let rel = i128::from(s.now) - i128::from(self.start);
            let _ = writeln!(
                out,
                "  step {i}: t0{rel:+} µs, {}, cost {}, via {:?} -> {:?}",
                describe(&s.limit),
                s.cost,
                s.via,
                s.decision
            );
        }
        out
    }
}

/// A random time step: mostly short, sometimes to a window boundary or a denial's exact
/// `retry_after` (or one microsecond before it), sometimes a long idle.
pub(crate) fn random_advance(
    rng: &mut Rng,
    limit: &Limit,
    now: u64,
    last_retry: Option<u64>,
) -> u64 {
    let period = limit.quota().period_us();
    let unit = (period / limit.quota().limit()).max(1);
    match rng.below(100) {
        0..=29 => 0,
        30..=54 => rng.range(1, unit),
        55..=64 => rng.range(1, 10),
        65..=74 => rng.range(1, period),
        75..=79 => {
            // To the next aligned window boundary, or a microsecond either side of it.
            let to_boundary = period - now % period;
            match rng.below(3) {
                0 => to_boundary.saturating_sub(1),
                1 => to_boundary,
                _ => to_boundary + 1,
            }
        }
        80..=82 => rng.range(period, 3 * period),
        _ => match last_retry {
            Some(r) if rng.below(2) == 0 => r.saturating_sub(1),
            Some(r) => r,
            None => rng.range(0, unit),
        },
    }
}

/// A random cost: peeks, single units, weighted costs, the whole capacity, and costs above it.
pub(crate) fn random_cost(rng: &mut Rng, capacity: u64) -> u64 {
    match rng.below(100) {
        0..=9 => 0,
        10..=49 => 1,
        50..=74 => rng.range(1, capacity),
        75..=84 => capacity,
        85..=94 => capacity.saturating_add(rng.range(1, 3)),
        _ => u64::MAX,
    }
}

/// Runs `task(t)` for every `t` in `0..TASKS` on Tokio tasks released together by a barrier;
/// their answers in order. An error or a panic of a task fails the check.
pub(crate) async fn race<T, Fut>(ctx: &str, task: impl Fn(usize) -> Fut) -> Vec<T>
where
    T: Send + 'static,
    Fut: Future<Output = Result<T, Error>> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(TASKS));
    let handles: Vec<_> = (0..TASKS)
        .map(|t| {
            let (barrier, task) = (Arc::clone(&barrier), task(t));
            tokio::spawn(async move {
                barrier.wait().await;
                task.await
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(TASKS);
    for (t, handle) in handles.into_iter().enumerate() {
        match handle.await {
            Ok(Ok(answer)) => answers.push(answer),
            Ok(Err(e)) => panic!("{ctx}: task {t} failed: {e} ({e:?})"),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("{ctx}: task {t} failed: {e}"),
        }
    }
    answers
}
