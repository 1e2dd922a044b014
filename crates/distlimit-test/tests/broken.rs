//! The checks can fail: deliberately broken stores, each caught by the check for the rule it
//! breaks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlimit_core::{
    Algorithm, Clock, Decision, Error, KeyError, MAX_KEY_LEN, ManualClock, Request, Settle, State,
    Store, validate_batch, validate_settles,
};
use distlimit_test::new_clock;
use parking_lot::Mutex;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    /// A denied request still takes one unit when one is left.
    ChargesDenied,
    /// A peek charges one unit.
    ChargesPeeks,
    /// decide_all charges the admitted requests of a denied batch.
    NotAllOrNothing,
    /// decide_all skips validate_batch (and answers an empty batch with no decisions).
    NoBatchValidation,
    /// retry_after one microsecond short.
    RetryOffByOne,
    /// A cost above the capacity is told to retry after one period instead of never.
    OverCapacityRetries,
    /// Reads its clock one microsecond late.
    ClockSkew,
    /// Never lets time go backwards: uses the latest time seen.
    MonotonicClock,
    /// Keys compared as lossy UTF-8 strings.
    LossyUtf8Keys,
    /// Keys end at the first NUL, as C strings.
    TruncatesAtNul,
    /// One state per key and algorithm instead of one per key.
    StatePerAlgorithm,
    /// Reads the state, yields, then writes it back: not atomic.
    NonAtomic,
    /// Admitted decisions report one unit more `remaining` than is left.
    RemainingOffByOne,
    /// Keys compared ignoring ASCII letter case.
    CaseInsensitiveKeys,
    /// A key idle past its state's expiry comes back exhausted instead of fresh, as a store
    /// would whose expiry restarts the window but keeps the count.
    ExpiredKeysExhausted,
    /// Refuses keys of exactly `MAX_KEY_LEN` bytes (it reserves a byte of its own).
    ShortensMaxKeyLen,
    /// One state per key whatever the policy name.
    IgnoresPolicy,
    /// Reports and give-backs decided like requests: a report past the limit is denied and
    /// charges nothing (usage lost), a give-back charges.
    SettlesAsDecisions,
    /// A report charges at most what is left: no debt.
    NoDebt,
    /// Does not settle: answers `Error::Unsupported` (the default `Store::settle_all`).
    CannotSettle,
}

/// Key bytes, the policy name, and the algorithm when states are kept per algorithm.
type MapKey = (Vec<u8>, String, Option<Algorithm>);

struct BuggyStore {
    clock: ManualClock,
    bug: Bug,
    latest: Mutex<u64>,
    states: Mutex<HashMap<MapKey, State>>,
}

impl BuggyStore {
    fn new(bug: Bug, clock: ManualClock) -> Self {
        Self {
            clock,
            bug,
            latest: Mutex::new(0),
            states: Mutex::default(),
        }
    }

    fn map_key(&self, r: &Request<'_>) -> MapKey {
        let bytes = r.key().as_bytes();
        let bytes = match self.bug {
            Bug::LossyUtf8Keys => String::from_utf8_lossy(bytes).into_owned().into_bytes(),
            Bug::TruncatesAtNul => bytes.split(|&b| b == 0).next().unwrap_or_default().to_vec(),
            Bug::CaseInsensitiveKeys => bytes.to_ascii_lowercase(),
            _ => bytes.to_vec(),
        };
        let policy = match self.bug {
            Bug::IgnoresPolicy => String::new(),
            _ => r.policy().to_owned(),
        };
        let algorithm = (self.bug == Bug::StatePerAlgorithm).then(|| r.limit().algorithm());
        (bytes, policy, algorithm)
    }

    /// The stored state of `r`'s key, as this store reads it at `now`.
    fn read(&self, states: &HashMap<MapKey, State>, r: &Request<'_>, now: u64) -> Option<State> {
        let state = states.get(&self.map_key(r))?.clone();
        let limit = r.limit();
        if self.bug == Bug::ExpiredKeysExhausted && now >= state.expires_at(limit.quota()) {
            let mut exhausted = State::fresh(limit.algorithm());
            limit.decide(&mut exhausted, now, limit.capacity());
            return Some(exhausted);
        }
        Some(state)
    }

    fn now(&self) -> u64 {
        let now = self.clock.now_us();
        match self.bug {
            Bug::ClockSkew => now + 1,
            Bug::MonotonicClock => {
                let mut latest = self.latest.lock();
                *latest = (*latest).max(now);
                *latest
            }
            _ => now,
        }
    }

    /// The decisions, and the states to store afterwards.
    fn plan(&self, requests: &[Request<'_>], now: u64) -> (Vec<Decision>, Vec<(MapKey, State)>) {
        let states = self.states.lock();
        let decisions: Vec<Decision> = requests
            .iter()
            .map(|r| {
                r.limit()
                    .evaluate(self.read(&states, r, now).as_ref(), now, r.cost())
            })
            .collect();
        let all = decisions.iter().all(Decision::is_allowed);
        let mut writes = Vec::new();
        for (r, d) in requests.iter().zip(&decisions) {
            let key = self.map_key(r);
            let mut state = self
                .read(&states, r, now)
                .unwrap_or_else(|| State::fresh(r.limit().algorithm()));
            if all || (self.bug == Bug::NotAllOrNothing && d.is_allowed()) {
                let cost = if self.bug == Bug::ChargesPeeks {
                    r.cost().max(1)
                } else {
                    r.cost()
                };
                r.limit().decide(&mut state, now, cost);
            } else if self.bug == Bug::ChargesDenied && !d.is_never() {
                r.limit().decide(&mut state, now, 1);
            }
            writes.push((key, state));
        }
        (decisions, writes)
    }
}

#[async_trait]
impl Store for BuggyStore {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        let ds = self.decide_all(std::slice::from_ref(request)).await?;
        ds.first()
            .copied()
            .ok_or(Error::InvalidRequest("no decision"))
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        if self.bug != Bug::NoBatchValidation {
            validate_batch(requests)?;
        }
        if self.bug == Bug::ShortensMaxKeyLen
            && let Some(r) = requests
                .iter()
                .find(|r| r.key().as_bytes().len() >= MAX_KEY_LEN)
        {
            let len = r.key().as_bytes().len();
            let max = MAX_KEY_LEN - 1;
            return Err(Error::InvalidKey(KeyError::TooLong { len, max }));
        }
        let now = self.now();
        let (decisions, writes) = self.plan(requests, now);
        if self.bug == Bug::NonAtomic {
            tokio::task::yield_now().await;
        }
        self.states.lock().extend(writes);
        Ok(decisions
            .into_iter()
            .map(|d| match self.bug {
                Bug::RetryOffByOne if d.is_denied() && !d.is_never() => Decision::denied(
                    d.limit(),
                    d.remaining(),
                    d.reset_after(),
                    d.retry_after() - Duration::from_micros(1),
                ),
                Bug::OverCapacityRetries if d.is_never() => Decision::denied(
                    d.limit(),
                    d.remaining(),
                    d.reset_after(),
                    Duration::from_secs(1),
                ),
                Bug::RemainingOffByOne if d.is_allowed() => {
                    Decision::allowed(d.limit(), d.remaining() + 1, d.reset_after())
                }
                _ => d,
            })
            .collect())
    }

    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        let requests: Vec<Request<'_>> = settles.iter().map(|s| *s.request()).collect();
        match self.bug {
            Bug::SettlesAsDecisions => return self.decide_all(&requests).await,
            Bug::CannotSettle => return Err(Error::Unsupported("settling")),
            _ => validate_settles(settles)?,
        }
        let now = self.now();
        let mut states = self.states.lock();
        let mut decisions = Vec::new();
        for (s, r) in settles.iter().zip(&requests) {
            let limit = r.limit();
            let mut state = self
                .read(&states, r, now)
                .unwrap_or_else(|| State::fresh(limit.algorithm()));
            if s.is_report() {
                let left = limit.evaluate(Some(&state), now, 0).remaining();
                let cost = match self.bug {
                    Bug::NoDebt => r.cost().min(left),
                    _ => r.cost(),
                };
                let _ = limit.force(&mut state, now, cost);
            } else {
                let _ = limit.give_back(&mut state, now, r.cost());
            }
            decisions.push(limit.evaluate(Some(&state), now, 0));
            states.insert(self.map_key(r), state);
        }
        Ok(decisions)
    }
}

fn buggy(bug: Bug) -> (BuggyStore, ManualClock) {
    let clock = new_clock();
    (BuggyStore::new(bug, clock.clone()), clock)
}

/// Each bug fails the check for the rule it breaks, and the panic message names that check.
macro_rules! caught {
    ($test:ident, $bug:expr, $check:ident, $expected:literal) => {
        #[tokio::test]
        #[should_panic(expected = $expected)]
        async fn $test() {
            let (store, clock) = buggy($bug);
            distlimit_test::$check(&store, &clock).await;
        }
    };
}

caught!(
    charging_denied_requests,
    Bug::ChargesDenied,
    check_denied_request_is_not_charged,
    "check `denied_request_is_not_charged`"
);
caught!(
    charging_denied_requests_diverges,
    Bug::ChargesDenied,
    check_matches_reference_model,
    "check `matches_reference_model`"
);
caught!(
    charging_peeks,
    Bug::ChargesPeeks,
    check_peek_changes_nothing,
    "check `peek_changes_nothing`"
);
caught!(
    partial_batches,
    Bug::NotAllOrNothing,
    check_decide_all_is_all_or_nothing,
    "check `decide_all_is_all_or_nothing`"
);
caught!(
    unvalidated_batches,
    Bug::NoBatchValidation,
    check_decide_all_rejects_invalid_batches,
    "check `decide_all_rejects_invalid_batches`"
);
caught!(
    inexact_retry_after,
    Bug::RetryOffByOne,
    check_retry_after_is_exact,
    "check `retry_after_is_exact`"
);
caught!(
    over_capacity_retries,
    Bug::OverCapacityRetries,
    check_cost_above_capacity_is_never,
    "check `cost_above_capacity_is_never`"
);
caught!(
    skewed_clock,
    Bug::ClockSkew,
    check_matches_reference_model,
    "check `matches_reference_model`"
);
caught!(
    clamped_clock,
    Bug::MonotonicClock,
    check_clock_going_backwards_follows_model,
    "check `clock_going_backwards_follows_model`"
);
caught!(
    lossy_utf8_keys,
    Bug::LossyUtf8Keys,
    check_key_bytes_are_opaque,
    "check `key_bytes_are_opaque`"
);
caught!(
    nul_terminated_keys,
    Bug::TruncatesAtNul,
    check_key_bytes_are_opaque,
    "check `key_bytes_are_opaque`"
);
caught!(
    remaining_off_by_one,
    Bug::RemainingOffByOne,
    check_fresh_key_admits_capacity,
    "check `fresh_key_admits_capacity`"
);
caught!(
    case_insensitive_keys,
    Bug::CaseInsensitiveKeys,
    check_keys_are_independent,
    "check `keys_are_independent`"
);
caught!(
    expired_keys_come_back_exhausted,
    Bug::ExpiredKeysExhausted,
    check_idle_key_decides_as_fresh,
    "check `idle_key_decides_as_fresh`"
);
caught!(
    max_len_keys_refused,
    Bug::ShortensMaxKeyLen,
    check_store_ext_validates_keys,
    "check `store_ext_validates_keys`"
);
caught!(
    policy_names_ignored,
    Bug::IgnoresPolicy,
    check_policies_are_independent,
    "check `policies_are_independent`"
);
caught!(
    settles_as_decisions,
    Bug::SettlesAsDecisions,
    check_settling_follows_model,
    "check `settling_follows_model`"
);
caught!(
    reports_without_debt,
    Bug::NoDebt,
    check_settling_follows_model,
    "check `settling_follows_model`"
);
caught!(
    state_per_algorithm,
    Bug::StatePerAlgorithm,
    check_limit_change_follows_model,
    "check `limit_change_follows_model`"
);

/// Lost updates: caught by the concurrency check. On a current-thread runtime the interleaving
/// is deterministic (every task reads before any writes); the panic is caught from the task's
/// `JoinHandle` instead of `#[should_panic]`.
#[tokio::test(flavor = "current_thread")]
async fn non_atomic_store() {
    let (store, clock) = buggy(Bug::NonAtomic);
    let store = Arc::new(store);
    let handle = tokio::spawn(async move {
        distlimit_test::check_concurrent_requests_admit_exactly_limit(&store, &clock).await;
    });
    let error = handle.await.expect_err("the check must fail");
    let payload = error.into_panic();
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(
        message.contains("check `concurrent_requests_admit_exactly_limit`")
            && message.contains("must admit exactly 10"),
        "{message}"
    );
}

#[tokio::test(flavor = "current_thread")]
#[should_panic(expected = "check `concurrent_batches_are_atomic`")]
async fn non_atomic_batches() {
    let (store, clock) = buggy(Bug::NonAtomic);
    distlimit_test::check_concurrent_batches_are_atomic(&Arc::new(store), &clock).await;
}

/// The same stores without their bug pass those checks: the failures above are the bugs'.
#[tokio::test]
async fn harmless_bugs_pass_other_checks() {
    let (store, clock) = buggy(Bug::StatePerAlgorithm);
    distlimit_test::check_matches_reference_model(&store, &clock).await;
    let (store, clock) = buggy(Bug::NoBatchValidation);
    distlimit_test::check_matches_reference_model(&store, &clock).await;
    let (store, clock) = buggy(Bug::MonotonicClock);
    distlimit_test::check_matches_reference_model(&store, &clock).await;
    let (store, clock) = buggy(Bug::StatePerAlgorithm);
    distlimit_test::check_settling_follows_model(&store, &clock).await;
    // A store that does not settle passes by answering the typed error, changing nothing.
    let (store, clock) = buggy(Bug::CannotSettle);
    distlimit_test::check_settling_follows_model(&store, &clock).await;
}
