//! Coalesced calls: the groups of callers waiting for the same server sent as one call (what
//! it guarantees: the crate documentation, "Coalesced script calls").
//!
//! A group that finds a free call slot ([`Coalescer::slot`]; per hash slot in a Cluster) is sent
//! at once by its caller, a call of one group (no task, no channel). One that finds every slot
//! taken waits in a queue ([`Coalescer::queued`]); whichever call frees a slot takes what is
//! queued (up to [`MAX_DECISIONS`] requests and [`MAX_BYTES`], leaving out callers that gave up)
//! and sends it as one call, on a task of its own, so a caller that stops waiting never cancels
//! the decisions of the others. A failure of that call fails every group of it alike
//! ([`copy`]); it is never resent.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use distlimit_core::{Error, NotSent};
use tokio::sync::oneshot;

use crate::NotDurable;
use crate::RedisObserver;
use crate::config::STORE;
use crate::connection::{Backend, Timeouts, timeout};
use crate::script::{Answer, Call, Group};

/// The most decisions one coalesced call carries.
pub(crate) const MAX_DECISIONS: usize = 128;

/// The most bytes of keys and arguments one coalesced call carries (a group larger than that
/// alone is still sent, alone).
pub(crate) const MAX_BYTES: usize = 64 * 1024;

/// A queued caller: its group, and where its answer goes.
struct Waiter {
    group: Group,
    reply: oneshot::Sender<Result<Answer, Error>>,
}

/// The callers of one hash slot (every key of a standalone server counts as one slot).
#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiter>,
    in_flight: usize,
}

/// Every slot's queue; a slot with nothing in flight and nobody waiting has none.
#[derive(Default)]
struct Queues {
    by_slot: HashMap<u16, Queue>,
    /// The sums over every slot, for [`RedisObserver::on_connections`].
    in_flight: usize,
    waiting: usize,
}

/// The calls in flight to a server (per hash slot in a Cluster, where one script's keys share a
/// slot), and the decisions waiting for one.
pub(crate) struct Coalescer {
    backend: Arc<Backend>,
    timeouts: Timeouts,
    /// The most calls in flight per slot.
    in_flight: usize,
    queues: Mutex<Queues>,
    observer: Option<Arc<dyn RedisObserver>>,
}

impl fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coalescer")
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

/// A call slot held by a caller that sends its own call; freed on drop (also when the
/// caller's future is dropped), handing the slot to the queue if anyone waits.
pub(crate) struct Slot<'a> {
    coalescer: &'a Arc<Coalescer>,
    slot: u16,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.coalescer.release(self.slot);
    }
}

impl Coalescer {
    /// At most `in_flight` (at least 1) script calls in flight per slot on `backend`.
    pub(crate) fn new(
        backend: Arc<Backend>,
        timeouts: Timeouts,
        in_flight: usize,
        observer: Option<Arc<dyn RedisObserver>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            backend,
            timeouts,
            in_flight: in_flight.max(1),
            queues: Mutex::new(Queues::default()),
            observer,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A free call slot for hash slot `slot` (0 on one server), if there is one: the caller
    /// then sends its own call at once.
    pub(crate) fn slot(self: &Arc<Self>, slot: u16) -> Option<Slot<'_>> {
        let mut queues = self.lock();
        let queue = queues.by_slot.entry(slot).or_default();
        if queue.in_flight < self.in_flight {
            queue.in_flight += 1;
            queues.in_flight += 1;
            self.report(&queues);
            Some(Slot {
                coalescer: self,
                slot,
            })
        } else {
            None
        }
    }

    /// Queues `group` (on hash slot `slot`) for the next coalesced call and waits for its
    /// answer, at most the response timeout.
    pub(crate) async fn queued(self: &Arc<Self>, slot: u16, group: Group) -> Result<Answer, Error> {
        let (tx, rx) = oneshot::channel();
        {
            let mut queues = self.lock();
            queues.waiting += 1;
            let queue = queues.by_slot.entry(slot).or_default();
            queue.waiting.push_back(Waiter { group, reply: tx });
            // A slot freed since `slot` looked: nobody would pick this caller up, so a new
            // sender starts.
            if queue.in_flight < self.in_flight {
                queue.in_flight += 1;
                queues.in_flight += 1;
                drop(queues);
                self.spawn_sender(slot);
            }
        }
        let after = self.timeouts.response;
        match tokio::time::timeout(after, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Error::Unavailable {
                store: STORE,
                source: "the coalesced call carrying this decision was dropped (the runtime \
                         shut down)"
                    .into(),
            }),
            Err(_) => Err(timeout(after)),
        }
    }

    /// Frees a call slot of `slot`, or hands it to a sender of what is queued there.
    fn release(self: &Arc<Self>, slot: u16) {
        let mut queues = self.lock();
        let waiting = queues
            .by_slot
            .get(&slot)
            .is_some_and(|q| !q.waiting.is_empty());
        if waiting {
            drop(queues);
            self.spawn_sender(slot);
        } else {
            free(&mut queues, slot);
        }
    }

    /// Starts a task that sends what is queued on `slot`, call after call, on the call slot its
    /// caller holds.
    fn spawn_sender(self: &Arc<Self>, slot: u16) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(Arc::clone(self).send_queued(slot));
            }
            Err(_) => {
                // No runtime (it is shutting down): the waiters are answered by their dropped
                // channels, and the call slot is freed.
                let mut queues = self.lock();
                let dropped = queues
                    .by_slot
                    .get_mut(&slot)
                    .map_or(0, |q| std::mem::take(&mut q.waiting).len());
                queues.waiting = queues.waiting.saturating_sub(dropped);
                free(&mut queues, slot);
            }
        }
    }

    /// Sends what is queued on `slot` until its queue is empty, then frees the call slot.
    async fn send_queued(self: Arc<Self>, slot: u16) {
        loop {
            let batch = {
                let mut queues = self.lock();
                let (batch, left) = match queues.by_slot.get_mut(&slot) {
                    Some(queue) => {
                        let before = queue.waiting.len();
                        let batch = take(&mut queue.waiting);
                        (batch, before - queue.waiting.len())
                    }
                    None => (Vec::new(), 0),
                };
                queues.waiting = queues.waiting.saturating_sub(left);
                if batch.is_empty() {
                    free(&mut queues, slot);
                    return;
                }
                self.report(&queues);
                batch
            };
            self.send(batch).await;
        }
    }

    /// One coalesced call over `batch`, each answer to its caller.
    async fn send(&self, batch: Vec<Waiter>) {
        if let Some(observer) = &self.observer {
            observer.on_coalesced(STORE, batch.iter().map(|w| w.group.len()).sum());
        }
        let call = Call::new(batch.iter().map(|w| &w.group).collect());
        let result = self.backend.call(&call, self.timeouts).await;
        drop(call);
        match result {
            Ok(answers) => {
                for (waiter, answer) in batch.into_iter().zip(answers) {
                    // A caller that stopped waiting has nobody to tell.
                    let _ = waiter.reply.send(answer);
                }
            }
            Err(error) => {
                let error = Arc::new(error);
                for waiter in batch {
                    let _ = waiter.reply.send(Err(copy(&error)));
                }
            }
        }
    }

    /// Reports the calls in flight and the callers waiting.
    fn report(&self, queues: &Queues) {
        if let Some(observer) = &self.observer {
            observer.on_connections(STORE, queues.in_flight, queues.waiting);
        }
    }
}

/// Frees one call slot of `slot`, forgetting the slot's queue once it is idle.
fn free(queues: &mut Queues, slot: u16) {
    queues.in_flight = queues.in_flight.saturating_sub(1);
    if let Some(queue) = queues.by_slot.get_mut(&slot) {
        queue.in_flight = queue.in_flight.saturating_sub(1);
        if queue.in_flight == 0 && queue.waiting.is_empty() {
            queues.by_slot.remove(&slot);
        }
    }
}

/// The waiters of the next call: the oldest first, as many as fit in [`MAX_DECISIONS`] and
/// [`MAX_BYTES`] (at least one), leaving out those whose caller stopped waiting.
fn take(waiting: &mut VecDeque<Waiter>) -> Vec<Waiter> {
    let mut batch = Vec::new();
    let (mut decisions, mut bytes) = (0, 0);
    while let Some(next) = waiting.front() {
        if next.reply.is_closed() {
            waiting.pop_front();
            continue;
        }
        let (d, b) = (next.group.len(), next.group.bytes());
        if !batch.is_empty() && (decisions + d > MAX_DECISIONS || bytes + b > MAX_BYTES) {
            break;
        }
        decisions += d;
        bytes += b;
        if let Some(waiter) = waiting.pop_front() {
            batch.push(waiter);
        }
    }
    batch
}

/// A copy of a failed call's `error` for one of its groups: the same variant, classification
/// and message.
fn copy(error: &Arc<Error>) -> Error {
    // Too few replicas for every caller alike: each gets the typed source (`NotDurable::of`).
    if let Some(not) = NotDurable::of(error) {
        return Error::Unavailable {
            store: STORE,
            source: Box::new(not.clone()),
        };
    }
    let source = || -> distlimit_core::BoxError { Box::new(Shared(Arc::clone(error))) };
    match &**error {
        Error::Timeout { store, after } => Error::Timeout {
            store,
            after: *after,
        },
        // A call that was never sent was not sent for any of its callers.
        Error::Unavailable { store, .. } if error.is_not_sent() => Error::Unavailable {
            store,
            source: Box::new(NotSent(source())),
        },
        Error::Unavailable { store, .. } => Error::Unavailable {
            store,
            source: source(),
        },
        Error::Backend {
            store, transient, ..
        } => Error::Backend {
            store,
            transient: *transient,
            source: source(),
        },
        Error::Protocol { store, message } => Error::Protocol {
            store,
            message: message.clone(),
        },
        Error::BadState { store, message } => Error::BadState {
            store,
            message: message.clone(),
        },
        Error::Config { store, message } => Error::Config {
            store,
            message: message.clone(),
        },
        Error::InvalidRequest(why) => Error::InvalidRequest(why),
        // Not produced by a call; kept transient and unknown, like a lost connection.
        _ => Error::Unavailable {
            store: STORE,
            source: source(),
        },
    }
}

/// The source of a copied error: the failed call's error, shown as it is.
struct Shared(Arc<Error>);

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The copy's own variant already names the store and the kind: show the cause.
        match &*self.0 {
            Error::Unavailable { source, .. } | Error::Backend { source, .. } => {
                match source.downcast_ref::<NotSent>() {
                    Some(NotSent(inner)) => fmt::Display::fmt(inner, f),
                    None => fmt::Display::fmt(source, f),
                }
            }
            other => fmt::Display::fmt(other, f),
        }
    }
}

impl std::error::Error for Shared {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::Durable;
    use std::time::Duration;

    #[test]
    fn every_caller_of_a_call_too_few_replicas_acknowledged_gets_the_typed_error() {
        let durable = Durable {
            replicas: 2,
            timeout: Duration::from_millis(5),
        };
        let error = Arc::new(durable.shortfall(1));
        for _ in 0..3 {
            let e = copy(&error);
            let not = NotDurable::of(&e);
            assert!(not.is_some_and(|n| n.acknowledged == 1), "{e:?}");
            assert!(e.is_transient() && !e.is_not_sent());
        }
    }
}
