//! Limits charged from the response ([`Settle`]): reserve an estimate with the request's batch,
//! then settle with the actual cost when the response body ends.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use distlimit_core::{SettleKind, Store, StreamEvent};
use distlimit_policy::{Item, Limiter, Overrun, Verdict};
use http::HeaderName;
use http::response::Parts;
use smallvec::SmallVec;

use crate::stream::{DEFAULT_BLOCK, Exhausted, Meter, ReserveFuture, StreamConfig, Streaming};

/// The actual cost a settled limit reads from the response head (see [`Settle::actual`]).
type ActualFn = dyn Fn(&Parts) -> Option<u64> + Send + Sync;

/// The actual cost of a request, put by the inner service into its response's extensions: what
/// [`Settle::from_extension`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Usage(pub u64);

/// How a limit is charged from the response
/// ([`RateLimitLayerBuilder::and_settled`](crate::RateLimitLayerBuilder::and_settled)), for costs
/// known only after it (the tokens an LLM answer used); see the crate documentation, "Costs
/// known after the response".
///
/// The request reserves an [`estimate`](Self::estimate) (1 by default); the actual cost read from the response
/// head ([`from_header`](Self::from_header), [`from_extension`](Self::from_extension),
/// [`actual`](Self::actual)) settles it when the body ends, or the body is metered as it streams
/// ([`streamed`](Self::streamed), [`metered`](Self::metered)). A failed settle is logged
/// (`WARN`) and lost.
///
/// ```
/// use distlimit_tower::Settle;
///
/// // Reserve 1 token, charge what `x-usage-tokens` says when the response ends.
/// let settle = Settle::from_header(http::HeaderName::from_static("x-usage-tokens")).estimate(1);
/// # let _ = settle;
/// ```
#[derive(Clone)]
pub struct Settle {
    pub(crate) spec: Arc<Spec>,
}

pub(crate) struct Spec {
    /// The units reserved per request.
    pub(crate) estimate: u64,
    actual: Box<ActualFn>,
    refund_on_server_error: bool,
    refund_on_drop: bool,
    /// Metered as the body streams when the head says no actual cost.
    pub(crate) meter: Option<Meter>,
    /// The units a metered stream reserves at a time.
    pub(crate) block: u64,
    /// What a metered stream does at the budget.
    pub(crate) exhausted: Exhausted,
}

impl fmt::Debug for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settle")
            .field("estimate", &self.spec.estimate)
            .field("refund_on_server_error", &self.spec.refund_on_server_error)
            .field("refund_on_drop", &self.spec.refund_on_drop)
            .field("metered", &self.spec.meter.is_some())
            .field("block", &self.spec.block)
            .field("exhausted", &self.spec.exhausted)
            .finish_non_exhaustive()
    }
}

impl Settle {
    /// Settles with the actual cost `actual` reads from the response head (`None`: the
    /// estimate stands).
    pub fn actual<F>(actual: F) -> Self
    where
        F: Fn(&Parts) -> Option<u64> + Send + Sync + 'static,
    {
        Self {
            spec: Arc::new(Spec {
                estimate: 1,
                actual: Box::new(actual),
                refund_on_server_error: true,
                refund_on_drop: true,
                meter: None,
                block: DEFAULT_BLOCK,
                exhausted: Exhausted::default(),
            }),
        }
    }

    /// Settles by metering the response body as it streams ([`metered`](Self::metered) with
    /// `meter`; no cost read from the head).
    ///
    /// ```
    /// use distlimit_tower::{Exhausted, Meter, Settle};
    ///
    /// // One token per `data:` line; reserved 50 at a time; at the budget, an `event: limit`.
    /// let settle = Settle::streamed(Meter::sse()).block(50).on_exhausted(Exhausted::stop_sse());
    /// # let _ = settle;
    /// ```
    pub fn streamed(meter: Meter) -> Self {
        Self::actual(|_| None).metered(meter)
    }

    /// Meters the response body as it streams when the head gives no actual cost (a head that
    /// does, and a refunded 5xx, settle unmetered): each data frame passes once its units
    /// (`meter`) are covered by units reserved for the request, the estimate first, then
    /// [blocks](Self::block); a refused block is asked again for what is left, up to three asks
    /// per frame, then the budget is exhausted ([`on_exhausted`](Self::on_exhausted)). The crate
    /// documentation's "Streaming settlement" says what ending, failing and store errors do.
    #[must_use]
    pub fn metered(self, meter: Meter) -> Self {
        self.with(|spec| spec.meter = Some(meter))
    }

    /// The units a metered stream reserves at a time (default: [`DEFAULT_BLOCK`](crate::DEFAULT_BLOCK),
    /// 100; at least 1): more units, fewer store calls per stream (about `units / block`), and
    /// more held by a stream that other streams of the key cannot use until it ends.
    #[must_use]
    pub fn block(self, block: u64) -> Self {
        self.with(|spec| spec.block = block.max(1))
    }

    /// What a metered stream does when the budget cannot cover its next frame (default:
    /// [`Exhausted::stop_sse`]).
    #[must_use]
    pub fn on_exhausted(self, exhausted: Exhausted) -> Self {
        self.with(|spec| spec.exhausted = exhausted)
    }

    /// Settles with the decimal integer in the response header `name` (a missing or malformed
    /// value: the estimate stands).
    pub fn from_header(name: HeaderName) -> Self {
        Self::actual(move |parts| parts.headers.get(&name)?.to_str().ok()?.parse().ok())
    }

    /// Settles with the [`Usage`] the inner service put into its response's extensions.
    pub fn from_extension() -> Self {
        Self::actual(|parts| parts.extensions.get::<Usage>().map(|u| u.0))
    }

    /// Reserves `estimate` units per request (default: 1).
    #[must_use]
    pub fn estimate(self, estimate: u64) -> Self {
        self.with(|spec| spec.estimate = estimate)
    }

    /// Whether a 5xx response gives the whole estimate back (default: yes).
    #[must_use]
    pub fn refund_on_server_error(self, refund: bool) -> Self {
        self.with(|spec| spec.refund_on_server_error = refund)
    }

    /// Whether a response dropped before its body ended gives the whole estimate back
    /// (default: yes).
    #[must_use]
    pub fn refund_on_drop(self, refund: bool) -> Self {
        self.with(|spec| spec.refund_on_drop = refund)
    }

    fn with(mut self, change: impl FnOnce(&mut Spec)) -> Self {
        // A clone shares the spec: its builder methods change nothing (not reached: a settle is
        // configured, then given to a layer).
        if let Some(spec) = Arc::get_mut(&mut self.spec) {
            change(spec);
        }
        self
    }
}

/// Sends settles to the limiter, and reserves a stream's blocks, store type erased.
pub(crate) trait Sink: Send + Sync + 'static {
    fn send(self: Arc<Self>, settles: Vec<(Arc<str>, Bytes, SettleKind, u64)>);

    /// Reserves `cost` units if the store answers without waiting.
    fn reserve_now(&self, policy: &str, key: &[u8], cost: u64) -> Option<Option<Verdict>>;

    /// Reserves `cost` units, awaiting the store at most `timeout`; `None`: the store failed.
    fn reserve(
        self: Arc<Self>,
        policy: Arc<str>,
        key: Bytes,
        cost: u64,
        timeout: Option<std::time::Duration>,
    ) -> ReserveFuture;

    /// What `policy` says a stream at its budget does.
    fn overrun(&self, policy: &str) -> Option<Overrun>;

    /// Reports a stream's event to the limiter's observer.
    fn observe(&self, policy: &str, event: StreamEvent, units: u64);
}

/// A reservation's answer: `None` for a store failure (logged).
fn reserved(
    policy: &str,
    result: Result<Verdict, distlimit_policy::CheckError>,
) -> Option<Verdict> {
    result
        .inspect_err(|error| {
            tracing::warn!(policy, %error, "distlimit-tower: reserving a stream's block failed");
        })
        .ok()
}

impl<S: Store + ?Sized + 'static> Sink for Limiter<S> {
    fn reserve_now(&self, policy: &str, key: &[u8], cost: u64) -> Option<Option<Verdict>> {
        self.check_now(policy, key, cost)
            .map(|result| reserved(policy, result))
    }

    fn reserve(
        self: Arc<Self>,
        policy: Arc<str>,
        key: Bytes,
        cost: u64,
        timeout: Option<std::time::Duration>,
    ) -> ReserveFuture {
        Box::pin(async move {
            let check = self.check_cost(&policy, &key, cost);
            let what = "reserving a stream's block";
            let result = crate::layer::within(timeout, check, &policy, what).await?;
            reserved(&policy, result)
        })
    }

    fn overrun(&self, policy: &str) -> Option<Overrun> {
        self.policies().get(policy)?.overrun()
    }

    fn observe(&self, policy: &str, event: StreamEvent, units: u64) {
        if let Some(observer) = self.observer() {
            observer.on_stream(policy, event, units);
        }
    }

    fn send(self: Arc<Self>, settles: Vec<(Arc<str>, Bytes, SettleKind, u64)>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::error!("distlimit-tower: no Tokio runtime to settle on; the usage is lost");
            return;
        };
        runtime.spawn(async move {
            let items: Vec<Item<'_>> = settles
                .iter()
                .map(|(policy, key, kind, cost)| Item::policy(policy, key, *cost).settling(*kind))
                .collect();
            if let Err(error) = self.decide_batch(&items).await {
                let policy = settles.first().map_or("", |s| &*s.0);
                tracing::warn!(policy, %error, "distlimit-tower: settling failed; the usage is lost");
            }
        });
    }
}

/// One settled limit of an admitted request.
pub(crate) struct Reserved {
    pub(crate) policy: Arc<str>,
    pub(crate) key: Bytes,
    pub(crate) estimate: u64,
    /// The actual cost, from the response head (`None` before it came, or when it said
    /// nothing); 0 when the response was a refunded 5xx.
    pub(crate) actual: Option<u64>,
    pub(crate) spec: Arc<Spec>,
}

/// The reservations of an admitted request, settled once: when the body ends
/// ([`finish`](Self::finish)) or, if it never does, when dropped.
pub(crate) struct Settlement {
    sink: Arc<dyn Sink>,
    reserved: SmallVec<[Reserved; 1]>,
    /// The layer's settings for metered streams.
    config: StreamConfig,
    /// The metering of the body, when a reservation is metered ([`Settle::metered`]) and the
    /// head gave it no actual cost.
    streaming: Option<Box<Streaming>>,
    /// Settled already (the body's `is_end_stream` may say so through `&self`).
    done: AtomicBool,
}

impl Settlement {
    pub(crate) fn new(
        sink: Arc<dyn Sink>,
        reserved: SmallVec<[Reserved; 1]>,
        config: StreamConfig,
    ) -> Self {
        Self {
            sink,
            reserved,
            config,
            streaming: None,
            done: AtomicBool::new(false),
        }
    }

    /// Reads the actual costs from the response head; a metered reservation without one is
    /// metered as the body streams.
    pub(crate) fn head(&mut self, parts: &Parts) {
        let error = parts.status.is_server_error();
        for r in &mut self.reserved {
            r.actual = if error && r.spec.refund_on_server_error {
                Some(0)
            } else {
                (r.spec.actual)(parts)
            };
        }
        self.streaming = Streaming::new(&self.reserved, self.config);
    }

    /// Whether the body is metered as it streams.
    pub(crate) fn is_metered(&self) -> bool {
        self.streaming.is_some()
    }

    /// The next frame of a metered body (see [`Streaming::poll_frame`]), settling at its end.
    pub(crate) fn poll_metered<B: http_body::Body<Data = Bytes>>(
        &mut self,
        body: std::pin::Pin<&mut B>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        let poll = match &mut self.streaming {
            Some(streaming) => streaming.poll_frame(&self.reserved, &self.sink, body, cx),
            None => body.poll_frame(cx),
        };
        if matches!(poll, std::task::Poll::Ready(None)) {
            self.finish();
        }
        poll
    }

    /// Whether a metered body has ended: ended when the inner body has, with nothing held or
    /// left to send (settled then), or after its final frame.
    pub(crate) fn metered_end(&self, inner_end: bool) -> bool {
        let streaming = self.streaming.as_ref();
        let end = streaming.map_or(inner_end, |s| s.is_done() || (inner_end && s.is_idle()));
        if end {
            self.finish();
        }
        end
    }

    /// The body ended: settle with the actual costs.
    pub(crate) fn finish(&self) {
        self.settle(false);
    }

    fn settle(&self, dropped: bool) {
        if self.done.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut settles = Vec::with_capacity(self.reserved.len());
        for (i, r) in self.reserved.iter().enumerate() {
            let flow = self
                .streaming
                .as_ref()
                .and_then(|s| s.flows.get(i)?.as_ref());
            let (reserved, actual) = match (flow, r.actual) {
                // Metered: charged what it sent, whatever ended it.
                (Some(flow), _) => (r.estimate.saturating_add(flow.charged), flow.used),
                (None, _) if dropped && r.spec.refund_on_drop => (r.estimate, 0),
                (None, Some(actual)) => (r.estimate, actual),
                (None, None) => (r.estimate, r.estimate),
            };
            let (kind, cost) = if actual < reserved {
                (SettleKind::GiveBack, reserved - actual)
            } else {
                (SettleKind::Report, actual - reserved)
            };
            if let Some(flow) = flow {
                self.sink
                    .observe(&r.policy, StreamEvent::Metered, flow.used);
                if kind == SettleKind::GiveBack && cost > 0 {
                    self.sink.observe(&r.policy, StreamEvent::Returned, cost);
                }
            }
            if cost > 0 {
                settles.push((r.policy.clone(), r.key.clone(), kind, cost));
            }
        }
        if !settles.is_empty() {
            self.sink.clone().send(settles);
        }
    }
}

impl Drop for Settlement {
    fn drop(&mut self) {
        self.settle(true);
        // A block still being reserved: awaited on a task, and given back if granted.
        let Some((index, future)) = self.streaming.as_mut().and_then(|s| s.take_reserving()) else {
            return;
        };
        let (Some(r), Ok(runtime)) = (
            self.reserved.get(index),
            tokio::runtime::Handle::try_current(),
        ) else {
            return;
        };
        let (sink, policy, key) = (self.sink.clone(), r.policy.clone(), r.key.clone());
        runtime.spawn(async move {
            if let Some((verdict, asked)) = future.await
                && verdict.is_allowed()
            {
                sink.observe(&policy, StreamEvent::Returned, asked);
                sink.send(vec![(policy, key, SettleKind::GiveBack, asked)]);
            }
        });
    }
}

impl fmt::Debug for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settlement")
            .field("reserved", &self.reserved.len())
            .field("done", &self.done.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}
