//! Coalesced script calls: decisions waiting for the same server sent as one script call.
//!
//! A store with coalescing on bounds its script calls in flight ([`Coalescer::new`]'s
//! `in_flight`; per hash slot in a Cluster, where one script's keys must share a slot). A decision that finds a free slot is sent at once, as before, on its own script
//! (no task, no channel, no added latency). One that finds every slot taken waits in a queue;
//! whichever call frees a slot takes everything queued (up to [`MAX_DECISIONS`] decisions and
//! [`MAX_BYTES`] of keys and arguments) and sends it as one call of the coalesced script
//! (`scripts/coalesced.lua`), which decides each caller's group (one request, or a
//! `decide_all` batch) in arrival order, exactly as that group's own script would, and answers
//! each one separately. That call runs on a task of its own, so a caller that stops waiting (a
//! timeout, a dropped future) never cancels the decisions of the others.
//!
//! Failures: a bad value at a key fails only the group holding it (the script catches it and
//! goes on with the next group). A failure of the call itself (a timeout, a lost connection)
//! fails every group of the call with the same classification; the call is never resent, as
//! anywhere in this driver (see [`connection`](crate::connection)). A caller that gave up while
//! still queued is left out of the next call, so its decision is never applied.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use distlimit_core::observe::Observer;
use distlimit_core::{Decision, Error, Limit, MAX_BATCH, NotSent};
use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, ServerErrorKind, Value};
use tokio::sync::oneshot;

use crate::config::STORE;
use crate::connection::{Backend, Op, Timeouts};
use crate::script::{
    self, Compiled, DECISION_BYTES, Expect, Kind, ScriptRequest, TimeSource, parameters, protocol,
};

/// The most decisions one coalesced call carries.
pub(crate) const MAX_DECISIONS: usize = 128;

/// The most bytes of keys and arguments one coalesced call carries (a group larger than that
/// alone is still sent, alone).
pub(crate) const MAX_BYTES: usize = 64 * 1024;

/// The coalesced script: the prelude, every algorithm, and the coalesced main.
static COALESCED: LazyLock<Compiled> = LazyLock::new(|| {
    Compiled::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/token_bucket.lua"),
        include_str!("scripts/gcra.lua"),
        include_str!("scripts/fixed_window.lua"),
        include_str!("scripts/sliding_log.lua"),
        include_str!("scripts/sliding_window.lua"),
        include_str!("scripts/coalesced.lua"),
    ))
});

/// Loads every script, the coalesced one included, into the server's script cache.
pub(crate) async fn load_scripts<C: ConnectionLike + Send>(conn: &mut C) -> Result<(), Error> {
    script::load_scripts(conn).await?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(COALESCED.source)
        .query_async(conn)
        .await
        .map_err(|e| script::map_error(e, &[]))?;
    if sha != COALESCED.sha {
        return Err(protocol(format!(
            "SCRIPT LOAD answered the SHA-1 {sha:?}, expected {}",
            COALESCED.sha
        )));
    }
    Ok(())
}

/// One caller's decisions, owned, ready to join a coalesced call: one request (decided as the
/// single-key script does) or an all-or-nothing batch (as the batch script does).
pub(crate) struct Group {
    /// The Redis keys, one after the other; `ends[j]` is where key `j` ends.
    keys: Vec<u8>,
    ends: Vec<usize>,
    time: TimeSource,
    /// 0 for one request; `2n + 1` a batch of `n` that commits, `2n` one that cannot.
    shape: u64,
    /// Per request: its limit (algorithm id and four parameter slots) and its cost.
    requests: Vec<([u64; 5], u64)>,
    expect: Vec<Expect>,
}

impl Group {
    /// One request, as [`script::decide`] sends it; the same errors for the same input.
    pub(crate) fn single(
        redis_key: &[u8],
        limit: &Limit,
        cost: u64,
        time: TimeSource,
    ) -> Result<Self, Error> {
        script::check_time(time)?;
        let mut group = Group {
            keys: Vec::with_capacity(redis_key.len()),
            ends: Vec::with_capacity(1),
            time,
            shape: 0,
            requests: Vec::with_capacity(1),
            expect: Vec::with_capacity(1),
        };
        group.push(redis_key, limit, cost)?;
        Ok(group)
    }

    /// An all-or-nothing batch, as [`script::decide_all`] sends it; the same errors for the
    /// same input.
    pub(crate) fn batch(requests: &[ScriptRequest<'_>], time: TimeSource) -> Result<Self, Error> {
        script::check_time(time)?;
        if requests.is_empty() {
            return Err(Error::InvalidRequest("empty batch"));
        }
        if requests.len() > MAX_BATCH {
            return Err(Error::InvalidRequest("batch larger than MAX_BATCH"));
        }
        let mut group = Group {
            keys: Vec::with_capacity(requests.iter().map(|r| r.redis_key.len()).sum()),
            ends: Vec::with_capacity(requests.len()),
            time,
            shape: 0,
            requests: Vec::with_capacity(requests.len()),
            expect: Vec::with_capacity(requests.len()),
        };
        for (i, r) in requests.iter().enumerate() {
            if requests[..i].iter().any(|o| o.redis_key == r.redis_key) {
                return Err(Error::InvalidRequest("the same key twice in one batch"));
            }
            group.push(r.redis_key, &r.limit, r.cost)?;
        }
        let n = requests.len() as u64;
        let commit = !group.expect.iter().any(|e| e.never);
        group.shape = 2 * n + u64::from(commit);
        Ok(group)
    }

    fn push(&mut self, redis_key: &[u8], limit: &Limit, cost: u64) -> Result<(), Error> {
        let kind = Kind::of(limit.algorithm())?;
        let (expect, cost) = Expect::new(limit, cost);
        let ([p1, p2, p3, p4], _) = parameters(kind, limit);
        self.keys.extend_from_slice(redis_key);
        self.ends.push(self.keys.len());
        self.requests.push(([kind.id(), p1, p2, p3, p4], cost));
        self.expect.push(expect);
        Ok(())
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    /// About what the group adds to a call, in bytes.
    fn bytes(&self) -> usize {
        self.keys.len() + 16 * (self.requests.len() + 1)
    }

    fn key_slices(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let key = &self.keys[start..end];
            start = end;
            key
        })
    }
}

/// One coalesced script call over `groups`, in order.
struct Call<'a> {
    groups: Vec<&'a Group>,
}

impl Call<'_> {
    fn cmd(&self, eval: bool) -> Cmd {
        let mut cmd = if eval {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(COALESCED.source);
            cmd
        } else {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&COALESCED.sha);
            cmd
        };
        cmd.arg(self.groups.iter().map(|g| g.len()).sum::<usize>());
        for group in &self.groups {
            for key in group.key_slices() {
                cmd.arg(key);
            }
        }
        cmd.arg(self.arguments());
        cmd
    }

    /// `ARGV[1]` of the coalesced script: big-endian doubles (see `coalesced.lua`). Every value
    /// is an integer below 2^53 (quota bounds, [`script::MAX_CLIENT_TIME_US`]), exact in a double.
    fn arguments(&self) -> Vec<u8> {
        let mut limits: Vec<[u64; 5]> = Vec::new();
        let mut body: Vec<f64> = Vec::new();
        for group in &self.groups {
            body.push(match group.time {
                TimeSource::Server => -1.0,
                TimeSource::Client(now) => exact(now),
            });
            body.push(exact(group.shape));
            for (limit, cost) in &group.requests {
                let index = match limits.iter().position(|l| l == limit) {
                    Some(i) => i,
                    None => {
                        limits.push(*limit);
                        limits.len() - 1
                    }
                };
                body.push(exact(index as u64 + 1));
                body.push(exact(*cost));
            }
        }
        let mut out = Vec::with_capacity(8 * (1 + 5 * limits.len() + body.len()));
        out.extend_from_slice(&exact(limits.len() as u64).to_be_bytes());
        for value in limits.iter().flatten() {
            out.extend_from_slice(&exact(*value).to_be_bytes());
        }
        for value in body {
            out.extend_from_slice(&value.to_be_bytes());
        }
        out
    }

    /// The reply's parts: per group its decisions, or its own error.
    fn parse(&self, reply: Value) -> Result<Vec<Result<Vec<Decision>, Error>>, Error> {
        let Value::BulkString(bytes) = reply else {
            return Err(protocol(format!(
                "the coalesced script answered {}, expected a string",
                script::describe(&reply)
            )));
        };
        let groups = self.groups.len();
        let Some(split) = bytes.len().checked_sub(groups) else {
            return Err(protocol(
                "the coalesced script answered too few bytes".into(),
            ));
        };
        let (mut body, status) = bytes.split_at(split);
        let mut out = Vec::with_capacity(groups);
        for (group, &status) in self.groups.iter().zip(status) {
            match status {
                b'o' => {
                    let want = DECISION_BYTES * group.len();
                    let Some((part, rest)) = body.split_at_checked(want) else {
                        return Err(protocol("the coalesced script's reply is cut short".into()));
                    };
                    body = rest;
                    out.push(
                        part.chunks_exact(DECISION_BYTES)
                            .zip(&group.expect)
                            .map(|(chunk, e)| script::parse_decision(chunk, *e))
                            .collect(),
                    );
                }
                b'e' => {
                    let Some((len, rest)) = body.split_first_chunk::<4>() else {
                        return Err(protocol("the coalesced script's reply is cut short".into()));
                    };
                    let len = u32::from_be_bytes(*len) as usize;
                    let Some((message, rest)) = rest.split_at_checked(len) else {
                        return Err(protocol("the coalesced script's reply is cut short".into()));
                    };
                    body = rest;
                    out.push(Err(group_error(message, group)));
                }
                other => {
                    return Err(protocol(format!(
                        "the coalesced script answered the status {other:#04x}"
                    )));
                }
            }
        }
        if !body.is_empty() {
            return Err(protocol(
                "the coalesced script answered more bytes than its groups".into(),
            ));
        }
        Ok(out)
    }
}

/// `x` as a double: exact for the integers below 2^53 the script is sent.
#[allow(clippy::cast_precision_loss)]
fn exact(x: u64) -> f64 {
    x as f64
}

/// A group's error message from the script (`DISTLIMIT_CORRUPT …`, `WRONGTYPE …`), classified
/// exactly as the same reply to the group's own script would be.
fn group_error(message: &[u8], group: &Group) -> Error {
    // Redis turns line breaks in error replies into spaces; so does this, and the message then
    // parses as the error reply the group's own script would have sent.
    let mut wire = Vec::with_capacity(message.len() + 3);
    wire.push(b'-');
    wire.extend(message.iter().map(|&b| match b {
        b'\r' | b'\n' => b' ',
        b => b,
    }));
    wire.extend_from_slice(b"\r\n");
    let keys: Vec<&[u8]> = group.key_slices().collect();
    match redis::parse_redis_value(&wire).and_then(|v| v.extract_error()) {
        Err(e) => script::map_error(e, &keys),
        Ok(_) => protocol("the coalesced script failed a group without an error".into()),
    }
}

impl Op for Call<'_> {
    type Output = Vec<Result<Vec<Decision>, Error>>;

    async fn run<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        _time: TimeSource,
    ) -> Result<Self::Output, Error> {
        let reply = match self.cmd(false).query_async::<Value>(conn).await {
            // The script did not run: sending it with its text cannot decide twice.
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.cmd(true).query_async::<Value>(conn).await
            }
            other => other,
        };
        let reply = reply.map_err(|e| script::map_error(e, &[]))?;
        self.parse(reply)
    }
}

/// A queued caller: its group, and where its answer goes.
struct Waiter {
    group: Group,
    reply: oneshot::Sender<Result<Vec<Decision>, Error>>,
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
    /// The sums over every slot, for [`Observer::on_connections`].
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
    observer: Option<Arc<dyn Observer>>,
}

impl fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coalescer")
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

/// A call slot held by a caller that sends its own script; freed on drop (also when the
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
        observer: Option<Arc<dyn Observer>>,
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
    /// then sends its own script at once.
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
    pub(crate) async fn queued(
        self: &Arc<Self>,
        slot: u16,
        group: Group,
    ) -> Result<Vec<Decision>, Error> {
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
            Err(_) => Err(Error::Timeout {
                store: STORE,
                after,
            }),
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
        let call = Call {
            groups: batch.iter().map(|w| &w.group).collect(),
        };
        // The groups carry their own times.
        let result = self
            .backend
            .call(&call, TimeSource::Server, self.timeouts)
            .await;
        drop(call);
        match result {
            Ok(answers) => {
                for (waiter, answer) in batch.into_iter().zip(answers) {
                    // A caller that stopped waiting has nobody to tell.
                    let _ = waiter.reply.send(answer);
                }
            }
            Err(error) => {
                let mut copies = Copies::new(error);
                for waiter in batch {
                    let _ = waiter.reply.send(Err(copies.next()));
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

/// One error for every group of a failed call: the same variant, classification and message.
struct Copies {
    error: Arc<Error>,
}

impl Copies {
    fn new(error: Error) -> Self {
        Self {
            error: Arc::new(error),
        }
    }

    fn next(&mut self) -> Error {
        let source = || -> distlimit_core::BoxError { Box::new(Shared(Arc::clone(&self.error))) };
        match &*self.error {
            Error::Timeout { store, after } => Error::Timeout {
                store,
                after: *after,
            },
            // A call that was never sent was not sent for any of its callers.
            Error::Unavailable { store, .. } if self.error.is_not_sent() => Error::Unavailable {
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
