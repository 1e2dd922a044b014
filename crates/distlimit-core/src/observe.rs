//! [`Observer`]: what the limiter and the stores report as they work, for metrics and logs.
//!
//! The core crate defines the events every store and the limiter share (decisions, store errors,
//! circuit breakers, evictions), and the Redis store's and the lease client's own
//! ([`RedisObserver`], [`LeaseObserver`], re-exported by `distlimit-redis` and
//! `distlimit-lease`), so that `distlimit-metrics` depends on core alone. It turns them into
//! Prometheus series; anything else (a `tracing` bridge, a test recorder) can implement the
//! traits too. Every method has an empty default, so an observer implements only what it needs,
//! and new events can be added without breaking it. Observers are called on the decision path:
//! they must be cheap and must never block.

use std::sync::Arc;
use std::time::Duration;

use crate::{Decision, Error};

/// `as_str` for each enum of metric labels: a stable lowercase name per variant.
macro_rules! labels {
    ($ty:ident: $v0:ident => $n0:literal $(, $variant:ident => $name:literal)*) => {
        impl $ty {
            #[doc = concat!("A stable lowercase name, for metric labels: `", $n0, "`", $(", `", $name, "`",)* ".")]
            pub fn as_str(self) -> &'static str {
                match self {
                    $ty::$v0 => $n0,
                    $($ty::$variant => $name,)*
                }
            }
        }
    };
}
pub(crate) use labels;

/// What a request's decision meant for the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Outcome {
    /// Admitted (and charged).
    Allowed,
    /// Denied and blocked.
    Denied,
    /// Denied by a policy in shadow mode: reported, but the request went through.
    ShadowDenied,
}

labels!(Outcome: Allowed => "allowed", Denied => "denied", ShadowDenied => "shadow_denied");

/// What happened to concurrency permits (see [`PermitStore`](crate::PermitStore)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum PermitEvent {
    /// A permit was taken: a request went in.
    Acquired,
    /// An acquire found the key full: a request was turned away (or waits in a queue).
    Rejected,
    /// A permit was given back when its request ended.
    Released,
    /// Permits were found expired: their holder neither released nor renewed them in time
    /// (it crashed, or its request outlived its lease).
    Expired,
}

labels!(PermitEvent: Acquired => "acquired", Rejected => "rejected", Released => "released",
    Expired => "expired");

/// What happened to a response body metered as it streams (`distlimit-tower`'s streaming
/// settlement): reported with a number of units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum StreamEvent {
    /// A stream ended (finished, stopped, dropped or failed) having passed on these units.
    Metered,
    /// A stream was stopped at its budget (units: 1).
    Stopped,
    /// A block of units was reserved for a stream.
    Reserved,
    /// The unused units of a stream's reservations were given back when it ended.
    Returned,
}

labels!(StreamEvent: Metered => "metered", Stopped => "stopped", Reserved => "reserved",
    Returned => "returned");

/// The state of a circuit breaker in front of a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum BreakerState {
    /// Decisions go to the primary store.
    Closed,
    /// Decisions go to the fallback without touching the primary.
    Open,
    /// One probe is on its way to the primary; everyone else still uses the fallback.
    HalfOpen,
}

labels!(BreakerState: Closed => "closed", Open => "open", HalfOpen => "half_open");

/// Receives what the limiter and the stores report. Every method defaults to doing nothing.
///
/// Labels derived from these events must stay bounded: `policy` names come from configuration,
/// `store` names from code; keys are never passed.
pub trait Observer: Send + Sync {
    /// A request was decided. `decision` is the most restrictive of its tiers (its
    /// [`source`](Decision::source) says who answered); `latency` is the time the decision took.
    fn on_decision(&self, policy: &str, outcome: Outcome, decision: &Decision, latency: Duration) {
        let _ = (policy, outcome, decision, latency);
    }

    /// A handle that receives the decisions of `policy` ([`PolicyObserver::on_decision`]) as
    /// [`on_decision`](Self::on_decision) with that name would: callers that report many
    /// decisions of one policy resolve it once and keep it (the limiter keeps one per policy of
    /// its set), so no decision looks the name up. `None` (the default): report by name.
    fn policy_observer(&self, policy: &str) -> Option<Arc<dyn PolicyObserver>> {
        let _ = policy;
        None
    }

    /// The store named `store` failed while deciding for `policy`. Reported even when a fallback
    /// then answered, so errors absorbed by a circuit breaker stay visible.
    fn on_store_error(&self, store: &'static str, policy: &str, error: &Error) {
        let _ = (store, policy, error);
    }

    /// The circuit breaker in front of the store named `store` went from `from` to `to`.
    fn on_breaker(&self, store: &'static str, from: BreakerState, to: BreakerState) {
        let _ = (store, from, to);
    }

    /// The store named `store` evicted `evicted` live keys to stay within its key cap: each
    /// starts over as a fresh key.
    fn on_evict(&self, store: &'static str, evicted: u64) {
        let _ = (store, evicted);
    }

    /// `count` permits of the concurrency limit of state `policy` had `event` (reported by
    /// whoever holds permits, such as `distlimit-tower`'s `InFlightLayer`).
    fn on_permits(&self, policy: &str, event: PermitEvent, count: u64) {
        let _ = (policy, event, count);
    }

    /// A response body metered under `policy` as it streams had `event`, for `units` units
    /// (reported by `distlimit-tower`'s streaming settlement, once per block and stream).
    fn on_stream(&self, policy: &str, event: StreamEvent, units: u64) {
        let _ = (policy, event, units);
    }
}

/// The decisions of one policy, resolved once by [`Observer::policy_observer`].
pub trait PolicyObserver: Send + Sync {
    /// A request was decided under the policy this handle was resolved for: as
    /// [`Observer::on_decision`] with its name.
    fn on_decision(&self, outcome: Outcome, decision: &Decision, latency: Duration);
}

/// An [`Observer`] that ignores everything: the default.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopObserver;

impl Observer for NoopObserver {}

/// Receives the Redis store's own events (those every store shares are [`Observer`]'s).
pub trait RedisObserver: Send + Sync {
    /// The store named `store` sent one coalesced call carrying `decisions` decisions (several
    /// callers' requests decided in one round trip; 1 when a caller's call carried only its own).
    fn on_coalesced(&self, store: &'static str, decisions: usize) {
        let _ = (store, decisions);
    }

    /// The store named `store` has `in_use` calls in flight on its connections (at most its pool
    /// size or call limit) and `waiting` callers queued for one.
    fn on_connections(&self, store: &'static str, in_use: usize, waiting: usize) {
        let _ = (store, in_use, waiting);
    }
}

/// Ignores every Redis event.
impl RedisObserver for NoopObserver {}

/// Receives the lease client's events (those every store shares are [`Observer`]'s).
pub trait LeaseObserver: Send + Sync {
    /// The lease client named `store` withdrew `units` units for `policy` in one store call (0
    /// when the store had none available).
    fn on_lease_taken(&self, store: &'static str, policy: &str, units: u64) {
        let _ = (store, policy, units);
    }

    /// The lease client named `store` gave back `units` unspent units of ended leases for
    /// `policy`.
    fn on_lease_returned(&self, store: &'static str, policy: &str, units: u64) {
        let _ = (store, policy, units);
    }

    /// The lease client named `store` holds `held` units in leases now, all keys together.
    fn on_lease_units(&self, store: &'static str, held: u64) {
        let _ = (store, held);
    }
}

/// Ignores every lease event: the default.
impl LeaseObserver for NoopObserver {}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl Observer for Recorder {
        fn on_breaker(&self, store: &'static str, from: BreakerState, to: BreakerState) {
            let line = format!("{store}:{}->{}", from.as_str(), to.as_str());
            self.0.lock().unwrap().push(line);
        }
    }

    #[test]
    fn shared_observers_forward_and_defaults_do_nothing() {
        let recorder = Arc::new(Recorder::default());
        let observer: Arc<dyn Observer> = recorder.clone();
        observer.on_breaker("redis", BreakerState::Closed, BreakerState::Open);
        observer.on_decision(
            "api",
            Outcome::Allowed,
            &Decision::allowed(1, 0, Duration::ZERO),
            Duration::ZERO,
        );
        NoopObserver.on_breaker("redis", BreakerState::Open, BreakerState::HalfOpen);
        assert_eq!(*recorder.0.lock().unwrap(), vec!["redis:closed->open"]);
    }
}
