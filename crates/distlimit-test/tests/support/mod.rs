//! The reference store: the contract's minimal driver, a map of states under a mutex, reading a
//! `ManualClock`. The suite must pass on it.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use distlimit_core::{
    Clock, Decision, Error, ManualClock, Quota, Request, Settle, State, Store, validate_batch,
    validate_settles,
};
use parking_lot::Mutex;

/// The states, shareable between clients with clocks of their own (like one Redis server).
/// What a state is stored under: (policy, key).
type Id = (String, Vec<u8>);

#[derive(Clone, Debug, Default)]
pub(crate) struct Backend(Arc<Mutex<HashMap<Id, Stored>>>);

/// A state and the quota it was written under (for carry-over on a quota change).
type Stored = (State, Option<Quota>);

/// `Limit::evaluate_from` for every request, then `Limit::decide_from` for all of them if all
/// pass; in a denied batch, those that alone would pass are answered as peeks.
#[derive(Debug)]
pub(crate) struct ReferenceStore {
    clock: ManualClock,
    backend: Backend,
}

impl ReferenceStore {
    /// A store with a backend of its own.
    pub(crate) fn new(clock: ManualClock) -> Self {
        Self::on(&Backend::default(), clock)
    }

    /// A client of a shared backend, reading its own clock.
    pub(crate) fn on(backend: &Backend, clock: ManualClock) -> Self {
        Self {
            clock,
            backend: backend.clone(),
        }
    }
}

#[async_trait]
impl Store for ReferenceStore {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        validate_batch(std::slice::from_ref(request))?;
        let mut states = self.backend.0.lock();
        let now = self.clock.now_us();
        let (state, written) = states
            .entry(id(request))
            .or_insert_with(|| (State::fresh(request.limit().algorithm()), None));
        Ok(request
            .limit()
            .decide_from(state, written, now, request.cost()))
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        validate_batch(requests)?;
        let mut states = self.backend.0.lock();
        let now = self.clock.now_us();
        let evaluate = |r: &Request<'_>, cost: u64| match states.get(&id(r)) {
            Some((state, written)) => {
                r.limit()
                    .evaluate_from(Some(state), written.as_ref(), now, cost)
            }
            None => r.limit().evaluate(None, now, cost),
        };
        let decisions: Vec<Decision> = requests.iter().map(|r| evaluate(r, r.cost())).collect();
        if !decisions.iter().all(Decision::is_allowed) {
            let peek = |(d, r): (Decision, &Request<'_>)| match d.is_allowed() {
                true => evaluate(r, 0),
                false => d,
            };
            return Ok(decisions.into_iter().zip(requests).map(peek).collect());
        }
        for r in requests {
            let (state, written) = states
                .entry(id(r))
                .or_insert_with(|| (State::fresh(r.limit().algorithm()), None));
            r.limit().decide_from(state, written, now, r.cost());
        }
        Ok(decisions)
    }

    /// Every report and give-back applied, answered by the peek after it.
    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        validate_settles(settles)?;
        let mut states = self.backend.0.lock();
        let now = self.clock.now_us();
        Ok(settles
            .iter()
            .map(|s| {
                let r = s.request();
                let (state, written) = states
                    .entry(id(r))
                    .or_insert_with(|| (State::fresh(r.limit().algorithm()), None));
                settle(s, state, written, now)
            })
            .collect())
    }
}

/// A report (`Limit::force_from`) or a give-back (`Limit::give_back_from`), checked by
/// `validate_settles`, answered by the peek after it.
fn settle(s: &Settle<'_>, state: &mut State, written: &mut Option<Quota>, now: u64) -> Decision {
    let (r, limit) = (s.request(), s.request().limit());
    if s.is_report()
        && let Ok(decision) = limit.force_from(state, written, now, r.cost())
    {
        return decision;
    }
    let _ = limit.give_back_from(state, written, now, r.cost());
    limit.evaluate_from(Some(state), written.as_ref(), now, 0)
}

/// A state per (policy, key), as the contract asks.
fn id(r: &distlimit_core::Request<'_>) -> Id {
    (r.policy().to_owned(), r.key().as_bytes().to_vec())
}
