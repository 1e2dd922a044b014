//! The reference store: the contract's minimal driver, a map of states under a mutex, reading a
//! `ManualClock`. The suite must pass on it.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use distlimit_core::{Clock, Decision, Error, ManualClock, Request, State, Store, validate_batch};
use parking_lot::Mutex;

/// The states, shareable between clients with clocks of their own (like one Redis server).
/// What a state is stored under: (policy, key).
type Id = (String, Vec<u8>);

#[derive(Clone, Debug, Default)]
pub(crate) struct Backend(Arc<Mutex<HashMap<Id, State>>>);

/// `Limit::evaluate` for every request, then `Limit::decide` for all of them if all pass.
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
        Ok(self.decide_all(std::slice::from_ref(request)).await?[0])
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        validate_batch(requests)?;
        let mut states = self.backend.0.lock();
        let now = self.clock.now_us();
        let decisions: Vec<Decision> = requests
            .iter()
            .map(|r| r.limit().evaluate(states.get(&id(r)), now, r.cost()))
            .collect();
        if decisions.iter().all(Decision::is_allowed) {
            for r in requests {
                let state = states
                    .entry(id(r))
                    .or_insert_with(|| State::fresh(r.limit().algorithm()));
                r.limit().decide(state, now, r.cost());
            }
        }
        Ok(decisions)
    }
}

/// A state per (policy, key), as the contract asks.
fn id(r: &distlimit_core::Request<'_>) -> Id {
    (r.policy().to_owned(), r.key().as_bytes().to_vec())
}
