//! The permit checks can fail: a permit store built on the reference model `Permits` with one
//! deliberate bug each, caught by the check for the rule it breaks; without a bug it passes them
//! all.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use distlimit_core::{
    Clock, Decision, Error, ManualClock, PermitDecision, PermitId, PermitLimit, PermitRequest,
    PermitStore, Permits, Request, State, Store,
};
use distlimit_test::new_clock;
use parking_lot::Mutex;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    /// No bug: the reference model.
    None,
    /// Admits one permit more than the limit.
    OneTooMany,
    /// A release of a permit that is not live frees another one.
    ReleaseAlwaysFrees,
    /// Permits never expire.
    NeverExpires,
    /// A renew answers true but does not extend the lease.
    RenewIgnored,
    /// One permit set per key whatever the state name.
    IgnoresPolicy,
    /// A rate decision on a key drops its permits (one record per key for both).
    RateResetsPermits,
    /// Reads the set, yields, then writes it back: not atomic.
    NonAtomic,
    /// A denial's retry_after is the whole lease, not the earliest expiry.
    RetryAfterIsLease,
}

struct BuggyPermits {
    clock: ManualClock,
    bug: Bug,
    next: Mutex<u64>,
    permits: Mutex<HashMap<(Vec<u8>, String), Permits>>,
    states: Mutex<HashMap<(Vec<u8>, String), State>>,
}

impl BuggyPermits {
    fn new(bug: Bug) -> (Arc<Self>, ManualClock) {
        let clock = new_clock();
        let store = Self {
            clock: clock.clone(),
            bug,
            next: Mutex::new(1),
            permits: Mutex::default(),
            states: Mutex::default(),
        };
        (Arc::new(store), clock)
    }

    fn id(&self, r: &PermitRequest<'_>) -> (Vec<u8>, String) {
        let policy = match self.bug {
            Bug::IgnoresPolicy => String::new(),
            _ => r.policy().to_owned(),
        };
        (r.key().as_bytes().to_vec(), policy)
    }

    fn now(&self) -> u64 {
        match self.bug {
            Bug::NeverExpires => distlimit_test::EPOCH_US,
            _ => self.clock.now_us(),
        }
    }
}

#[async_trait]
impl PermitStore for BuggyPermits {
    async fn acquire(&self, request: &PermitRequest<'_>) -> Result<PermitDecision, Error> {
        let id = {
            let mut next = self.next.lock();
            *next += 1;
            PermitId::wrapping(*next)
        };
        let now = self.now();
        let limit = match self.bug {
            Bug::OneTooMany => {
                PermitLimit::new(request.limit().max_in_flight() + 1, request.limit().lease())?
            }
            _ => *request.limit(),
        };
        let mut d = if self.bug == Bug::NonAtomic {
            // Read, yield, write: two acquires interleave and both see the same free places.
            let mut permits = self
                .permits
                .lock()
                .get(&self.id(request))
                .cloned()
                .unwrap_or_default();
            tokio::task::yield_now().await;
            let d = permits.acquire(now, &limit, id);
            self.permits.lock().insert(self.id(request), permits);
            d
        } else {
            // One lock over the read, the decision and the write: atomic, as a store must be.
            let mut all = self.permits.lock();
            all.entry(self.id(request))
                .or_default()
                .acquire(now, &limit, id)
        };
        if self.bug == Bug::OneTooMany && d.is_allowed() {
            d = PermitDecision::acquired(
                id,
                d.in_flight(),
                request.limit().max_in_flight(),
                d.expired(),
            );
        }
        if self.bug == Bug::RetryAfterIsLease && d.is_denied() {
            d = PermitDecision::denied(d.in_flight(), d.max_in_flight(), limit.lease(), 0);
        }
        Ok(d)
    }

    async fn release(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        let now = self.now();
        let mut all = self.permits.lock();
        let permits = all.entry(self.id(request)).or_default();
        let live = permits.release(now, permit);
        if !live && self.bug == Bug::ReleaseAlwaysFrees {
            // Frees whichever permit comes first: probe the ids handed out.
            let last = *self.next.lock();
            let freed = (0..=last).any(|n| permits.release(now, PermitId::wrapping(n)));
            return Ok(freed);
        }
        Ok(live)
    }

    async fn renew(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        let now = self.now();
        let mut all = self.permits.lock();
        let permits = all.entry(self.id(request)).or_default();
        if self.bug == Bug::RenewIgnored {
            return Ok(permits.in_flight(now) > 0);
        }
        Ok(permits.renew(now, request.limit(), permit))
    }
}

#[async_trait]
impl Store for BuggyPermits {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        let id = (
            request.key().as_bytes().to_vec(),
            request.policy().to_owned(),
        );
        if self.bug == Bug::RateResetsPermits {
            self.permits.lock().remove(&id);
        }
        let mut states = self.states.lock();
        let state = states
            .entry(id)
            .or_insert_with(|| State::fresh(request.limit().algorithm()));
        Ok(request
            .limit()
            .decide(state, self.clock.now_us(), request.cost()))
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        let mut out = Vec::new();
        for r in requests {
            out.push(self.decide(r).await?);
        }
        Ok(out)
    }
}

macro_rules! caught {
    ($test:ident, $bug:expr, $check:ident, $expected:literal) => {
        #[tokio::test(flavor = "current_thread")]
        #[should_panic(expected = $expected)]
        async fn $test() {
            let (store, clock) = BuggyPermits::new($bug);
            distlimit_test::$check(&store, &clock).await;
        }
    };
}

caught!(
    one_too_many,
    Bug::OneTooMany,
    check_permit_fresh_key_admits_max,
    "check `permit_fresh_key_admits_max`"
);
caught!(
    one_too_many_diverges,
    Bug::OneTooMany,
    check_permit_matches_model,
    "check `permit_matches_model`"
);
caught!(
    release_always_frees,
    Bug::ReleaseAlwaysFrees,
    check_permit_release_frees_one_place,
    "check `permit_release_frees_one_place`"
);
caught!(
    never_expires,
    Bug::NeverExpires,
    check_permit_expires_after_lease,
    "check `permit_expires_after_lease`"
);
caught!(
    renew_ignored,
    Bug::RenewIgnored,
    check_permit_renew_extends_lease,
    "check `permit_renew_extends_lease`"
);
caught!(
    ignores_policy,
    Bug::IgnoresPolicy,
    check_permit_keys_and_states_are_independent,
    "check `permit_keys_and_states_are_independent`"
);
caught!(
    rate_resets_permits,
    Bug::RateResetsPermits,
    check_permit_keys_and_states_are_independent,
    "check `permit_keys_and_states_are_independent`"
);
caught!(
    retry_after_is_lease,
    Bug::RetryAfterIsLease,
    check_permit_expires_after_lease,
    "check `permit_expires_after_lease`"
);

/// Lost updates: on a current-thread runtime every task reads before any writes.
#[tokio::test(flavor = "current_thread")]
async fn non_atomic_acquires() {
    let (store, clock) = BuggyPermits::new(Bug::NonAtomic);
    let handle = tokio::spawn(async move {
        distlimit_test::check_permit_concurrent_acquires_admit_exactly_max(&store, &clock).await;
    });
    let error = handle.await.expect_err("the check must fail");
    let payload = error.into_panic();
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(
        message.contains("check `permit_concurrent_acquires_admit_exactly_max`"),
        "{message}"
    );
}

/// The model itself passes every permit check: the failures above are the bugs'.
#[tokio::test(flavor = "multi_thread")]
async fn the_model_passes_every_check() {
    macro_rules! all {
        ($($check:ident),*) => {$({
            let (store, clock) = BuggyPermits::new(Bug::None);
            distlimit_test::$check(&store, &clock).await;
        })*};
    }
    all!(
        check_permit_fresh_key_admits_max,
        check_permit_release_frees_one_place,
        check_permit_expires_after_lease,
        check_permit_renew_extends_lease,
        check_permit_keys_and_states_are_independent,
        check_permit_concurrent_acquires_admit_exactly_max,
        check_permit_matches_model
    );
    assert_eq!(distlimit_test::PERMIT_CHECKS.len(), 7);
}
