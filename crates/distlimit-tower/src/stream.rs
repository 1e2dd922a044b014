//! Streaming settlement ([`Settle::streamed`](crate::Settle::streamed)): a response body
//! metered frame by frame ([`Meter`]), each frame's cost covered by units reserved through the
//! store, in blocks, before the frame is passed on; at the budget, [`Exhausted`] says what
//! happens.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use distlimit_core::StreamEvent;
use distlimit_policy::{Overrun, Verdict};
use http_body::{Body, Frame};
use smallvec::SmallVec;

use crate::OnError;
use crate::settle::{Reserved, Sink};

/// The default [block](crate::Settle::block) of a streamed limit: 100 units per reservation.
pub const DEFAULT_BLOCK: u64 = 100;

/// The most reservations one frame asks for before its stream counts as at the budget: the
/// first for a block, the next for what the refusal said was left, at least the frame's need
/// (another stream of the key may take it first; refused, its `retry_after` is the frame's).
const MAX_TRIES: u8 = 3;

type MeterFn = dyn Fn(&[u8]) -> u64 + Send + Sync;

/// The units one data frame of a streamed response costs (see
/// [`Settle::streamed`](crate::Settle::streamed)). Trailers cost nothing.
///
/// ```
/// use distlimit_tower::Meter;
///
/// let sse = Meter::sse();
/// assert_eq!(sse.units(b"data: Hel\n\ndata: lo\n\n"), 2);
/// assert_eq!(sse.units(b"event: usage\ntokens: 12\ndata: {}\n\n"), 12);
/// assert_eq!(sse.units(b"event: done\ndata: {}\n\n"), 0);
/// assert_eq!(Meter::bytes().units(b"hello"), 5);
/// // One unit per started kilobyte.
/// assert_eq!(Meter::with(|data| data.len().div_ceil(1024) as u64).units(&[0; 1500]), 2);
/// ```
#[derive(Clone)]
pub struct Meter(Arc<MeterFn>);

impl fmt::Debug for Meter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Meter(..)")
    }
}

impl Meter {
    /// Server-sent events (`text/event-stream`), one token per `data:` line, as LLM endpoints
    /// stream their answers. Per event in the frame:
    ///
    /// * an event with a `tokens: N` field costs `N` (a field name clients ignore: the service
    ///   says what the event carries, several tokens or none);
    /// * else a named event (`event: done`, any `event:` other than `message`) costs nothing;
    /// * else each `data:` line costs one, except `data: [DONE]`.
    ///
    /// Each frame is metered on its own: it must hold whole lines (servers write whole events
    /// per frame).
    pub fn sse() -> Self {
        Self::with(sse_units)
    }

    /// One unit per byte of data.
    pub fn bytes() -> Self {
        Self::with(|data| data.len() as u64)
    }

    /// The units `meter` reads from each data frame.
    pub fn with<F>(meter: F) -> Self
    where
        F: Fn(&[u8]) -> u64 + Send + Sync + 'static,
    {
        Self(Arc::new(meter))
    }

    /// The units of one data frame.
    pub fn units(&self, data: &[u8]) -> u64 {
        (self.0)(data)
    }
}

/// [`Meter::sse`]'s count.
fn sse_units(data: &[u8]) -> u64 {
    #[derive(Default)]
    struct Event {
        data: u64,
        named: bool,
        tokens: Option<u64>,
    }
    impl Event {
        fn units(&self) -> u64 {
            self.tokens
                .unwrap_or(if self.named { 0 } else { self.data })
        }
    }
    let mut total = 0u64;
    let mut event = Event::default();
    for line in data.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            total = total.saturating_add(event.units());
            event = Event::default();
            continue;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => (&line[..i], &line[i + 1..]),
            None => (line, &b""[..]),
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        match field {
            b"data" if value != b"[DONE]" => event.data += 1,
            b"event" => event.named = value != b"message",
            b"tokens" => {
                event.tokens = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
            }
            _ => {}
        }
    }
    total.saturating_add(event.units())
}

type StopFn = dyn Fn(&Stop) -> Bytes + Send + Sync;

/// What a streamed response does when its budget runs out (see
/// [`Settle::on_exhausted`](crate::Settle::on_exhausted)).
///
/// [`stop_sse`](Self::stop_sse) (the default) or [`stop`](Self::stop): the frame the budget
/// cannot cover is not sent, the stream ends with a final frame. [`debt`](Self::debt): the
/// stream runs on, what it sends past the budget charged as debt when it ends. A policy's
/// `overrun = "stop" | "debt"` (`distlimit_policy::Overrun`, read when a stream reaches the
/// budget) overrides this; its stop, where the layer said debt, ends with the SSE frame.
#[derive(Clone)]
pub struct Exhausted {
    debt: bool,
    frame: Arc<StopFn>,
}

impl fmt::Debug for Exhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exhausted")
            .field("debt", &self.debt)
            .finish_non_exhaustive()
    }
}

impl Default for Exhausted {
    fn default() -> Self {
        Self::stop_sse()
    }
}

impl Exhausted {
    /// Stop, ending the stream with the frame `final_frame` writes (none when empty).
    pub fn stop<F>(final_frame: F) -> Self
    where
        F: Fn(&Stop) -> Bytes + Send + Sync + 'static,
    {
        Self {
            debt: false,
            frame: Arc::new(final_frame),
        }
    }

    /// Stop, ending a server-sent-events stream with [`Stop::sse_event`]: an `event: limit`
    /// saying when to retry.
    pub fn stop_sse() -> Self {
        Self::stop(Stop::sse_event)
    }

    /// Run on, charging the overrun as debt (a policy that says stop, or a store failure
    /// under fail-closed, then ends the stream with [`Stop::sse_event`]).
    pub fn debt() -> Self {
        Self {
            debt: true,
            frame: Arc::new(Stop::sse_event),
        }
    }
}

/// Why a stream was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// The key's budget could not cover the next frame.
    Budget,
    /// The store failed or timed out, under [`OnError::FailClosed`].
    Unavailable,
}

/// A stream stopped: what its final frame may say ([`Exhausted::stop`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Stop {
    /// Why.
    pub reason: StopReason,
    /// When the next frame's units will be there (the store's `retry_after`), or the
    /// [`OnError`] wait when the store failed.
    pub retry_after: Duration,
}

impl Stop {
    /// The server-sent event saying the stream was stopped, with the wait in milliseconds
    /// (rounded up; also as the stream's `retry:` reconnection time) and in whole seconds
    /// (rounded up, as `Retry-After`):
    ///
    /// ```text
    /// event: limit
    /// data: {"reason":"budget","retry_after":3,"retry_after_ms":2500}
    /// retry: 2500
    ///
    /// ```
    pub fn sse_event(&self) -> Bytes {
        let ms = self.retry_after.as_micros().div_ceil(1000);
        let secs = ms.div_ceil(1000);
        let reason = match self.reason {
            StopReason::Budget => "budget",
            StopReason::Unavailable => "unavailable",
        };
        Bytes::from(format!(
            "event: limit\ndata: {{\"reason\":\"{reason}\",\"retry_after\":{secs},\"retry_after_ms\":{ms}}}\nretry: {ms}\n\n"
        ))
    }
}

/// The layer's settings a stream follows.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StreamConfig {
    pub(crate) on_error: OnError,
    pub(crate) timeout: Option<Duration>,
}

/// How one reservation's frames are covered now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Mode {
    /// Each frame covered by reserved units.
    #[default]
    Reserving,
    /// Past the budget in debt mode: frames pass, counted, charged at the end.
    Debt,
    /// The store failed under [`OnError::FailOpen`]: frames pass uncounted.
    Open,
}

/// One metered reservation of a stream.
#[derive(Debug, Default)]
pub(crate) struct Flow {
    /// Units reserved and not used yet.
    credit: u64,
    /// Units passed on and counted (past the budget too, in debt mode).
    pub(crate) used: u64,
    /// Units reserved in blocks (beyond the request's estimate).
    pub(crate) charged: u64,
    /// The units of the frame held for coverage.
    pending: u64,
    mode: Mode,
}

/// A boxed reservation in flight.
pub(crate) type ReserveFuture = Pin<Box<dyn Future<Output = Option<Verdict>> + Send>>;

/// A stream's metering, kept by its settlement.
pub(crate) struct Streaming {
    /// One per reservation: `None` for one not metered.
    pub(crate) flows: SmallVec<[Option<Flow>; 1]>,
    config: StreamConfig,
    /// The frame waiting to be covered.
    held: Option<Frame<Bytes>>,
    /// The reservation in flight: its flow, the units asked, and the future.
    reserving: Option<(usize, u64, ReserveFuture)>,
    /// The units of the next ask after a refusal (what it said was left).
    retry: Option<u64>,
    tries: u8,
    end: End,
}

#[derive(Debug)]
enum End {
    Open,
    /// Stopped: the final frame to send (none when empty), then the end.
    Final(Bytes),
    /// Ended: nothing more to send.
    Done,
}

/// What the next step of a stream is.
enum Cover {
    /// Every flow covers the held frame.
    Covered,
    /// Flow `index` needs `need` more units.
    Short { index: usize, need: u64 },
}

impl Streaming {
    /// The metering of a response's reservations that are metered and got no actual cost from
    /// its head (their estimates the first credit); `None` when none is.
    pub(crate) fn new(reserved: &[Reserved], config: StreamConfig) -> Option<Box<Self>> {
        let flows: SmallVec<[Option<Flow>; 1]> = reserved
            .iter()
            .map(|r| {
                (r.spec.meter.is_some() && r.actual.is_none()).then(|| Flow {
                    credit: r.estimate,
                    ..Flow::default()
                })
            })
            .collect();
        flows.iter().any(Option::is_some).then(|| {
            Box::new(Self {
                flows,
                config,
                held: None,
                reserving: None,
                retry: None,
                tries: 0,
                end: End::Open,
            })
        })
    }

    /// The reservation in flight, if any: its flow and its future, answering the verdict
    /// and the units asked.
    pub(crate) fn take_reserving(
        &mut self,
    ) -> Option<(
        usize,
        impl Future<Output = Option<(Verdict, u64)>> + Send + 'static,
    )> {
        let (index, asked, future) = self.reserving.take()?;
        Some((index, async move { future.await.map(|v| (v, asked)) }))
    }

    /// Whether the stream has ended (the inner body's end passed on, or the final frame sent).
    pub(crate) fn is_done(&self) -> bool {
        matches!(self.end, End::Done)
    }

    /// Whether nothing is held or left to send besides what `body` still has.
    pub(crate) fn is_idle(&self) -> bool {
        matches!(self.end, End::Open) && self.held.is_none()
    }

    /// The next frame of the metered body: polls `body`, meters its frame, covers it (asking
    /// the store for blocks when the credit falls short), passes it on or stops.
    pub(crate) fn poll_frame<B: Body<Data = Bytes>>(
        &mut self,
        reserved: &[Reserved],
        sink: &Arc<dyn Sink>,
        mut body: Pin<&mut B>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        loop {
            match &mut self.end {
                End::Open => {}
                End::Final(frame) => {
                    let frame = std::mem::take(frame);
                    self.end = End::Done;
                    if !frame.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(frame))));
                    }
                    continue;
                }
                End::Done => return Poll::Ready(None),
            }
            if let Some((index, asked, future)) = &mut self.reserving {
                let answer = std::task::ready!(future.as_mut().poll(cx));
                let (index, asked) = (*index, *asked);
                self.reserving = None;
                self.answer(reserved, sink, index, asked, answer);
                continue;
            }
            if self.held.is_none() {
                match std::task::ready!(body.as_mut().poll_frame(cx)) {
                    None => {
                        self.end = End::Done;
                        return Poll::Ready(None);
                    }
                    Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                    Some(Ok(frame)) => {
                        for (flow, r) in self.flows.iter_mut().zip(reserved) {
                            if let (Some(flow), Some(data), Some(meter)) =
                                (flow, frame.data_ref(), r.spec.meter.as_ref())
                            {
                                flow.pending = meter.units(data);
                            }
                        }
                        self.held = Some(frame);
                    }
                }
            }
            match self.cover() {
                Cover::Covered => {
                    for flow in self.flows.iter_mut().flatten() {
                        match flow.mode {
                            Mode::Reserving => {
                                flow.credit -= flow.pending;
                                flow.used += flow.pending;
                            }
                            Mode::Debt => flow.used = flow.used.saturating_add(flow.pending),
                            Mode::Open => {}
                        }
                        flow.pending = 0;
                    }
                    self.tries = 0;
                    if let Some(frame) = self.held.take() {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                }
                Cover::Short { index, need } => {
                    let Some(r) = reserved.get(index) else {
                        // Flows and reservations are built together: not reached.
                        self.end = End::Done;
                        continue;
                    };
                    let ask = self.retry.take().unwrap_or(r.spec.block).max(need);
                    match sink.reserve_now(&r.policy, &r.key, ask) {
                        Some(answer) => self.answer(reserved, sink, index, ask, answer),
                        None => {
                            let future = Arc::clone(sink).reserve(
                                Arc::clone(&r.policy),
                                r.key.clone(),
                                ask,
                                self.config.timeout,
                            );
                            self.reserving = Some((index, ask, future));
                        }
                    }
                }
            }
        }
    }

    /// Whether every flow covers the held frame; the first that falls short if not.
    fn cover(&self) -> Cover {
        for (index, flow) in self.flows.iter().enumerate() {
            if let Some(flow) = flow
                && flow.mode == Mode::Reserving
                && flow.pending > flow.credit
            {
                let need = flow.pending - flow.credit;
                return Cover::Short { index, need };
            }
        }
        Cover::Covered
    }

    /// The store's answer to a reservation of `asked` units for flow `index`.
    fn answer(
        &mut self,
        reserved: &[Reserved],
        sink: &Arc<dyn Sink>,
        index: usize,
        asked: u64,
        answer: Option<Verdict>,
    ) {
        let (Some(Some(flow)), Some(r)) = (self.flows.get_mut(index), reserved.get(index)) else {
            return;
        };
        let need = flow.pending.saturating_sub(flow.credit);
        match answer {
            Some(verdict) if verdict.is_allowed() => {
                flow.credit += asked;
                flow.charged += asked;
                sink.observe(&r.policy, StreamEvent::Reserved, asked);
            }
            Some(verdict) => {
                self.tries += 1;
                let left = verdict.decision().remaining();
                if self.tries < MAX_TRIES && asked > need {
                    // Ask for what is left (another stream may have taken part of the block),
                    // at least the frame's need: refused, that says when it will be there.
                    self.retry = Some(left.clamp(need, asked));
                    return;
                }
                let overrun = sink.overrun(&r.policy);
                let debt = overrun.map_or(r.spec.exhausted.debt, |o| o == Overrun::Debt);
                if debt {
                    // The credit left goes to this frame; the rest is debt.
                    flow.used = flow.used.saturating_add(flow.credit);
                    flow.pending -= flow.credit;
                    flow.credit = 0;
                    flow.mode = Mode::Debt;
                } else {
                    let stop = Stop {
                        reason: StopReason::Budget,
                        retry_after: verdict.decision().retry_after(),
                    };
                    let frame = (r.spec.exhausted.frame)(&stop);
                    sink.observe(&r.policy, StreamEvent::Stopped, 1);
                    self.stop(frame);
                }
            }
            None => match self.config.on_error {
                OnError::FailOpen => flow.mode = Mode::Open,
                OnError::FailClosed { retry_after } => {
                    let stop = Stop {
                        reason: StopReason::Unavailable,
                        retry_after,
                    };
                    self.stop((r.spec.exhausted.frame)(&stop));
                }
            },
        }
    }

    /// Ends the stream with `frame`: the held frame is not sent.
    fn stop(&mut self, frame: Bytes) {
        self.held = None;
        for flow in self.flows.iter_mut().flatten() {
            flow.pending = 0;
        }
        self.end = End::Final(frame);
    }
}
