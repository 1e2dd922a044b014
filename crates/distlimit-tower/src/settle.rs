//! Limits charged from the response ([`Settle`]): reserve an estimate with the request's batch,
//! then settle with the actual cost when the response body ends.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use distlimit_core::{SettleKind, Store};
use distlimit_policy::{Item, Limiter};
use http::HeaderName;
use http::response::Parts;
use smallvec::SmallVec;

use crate::RequestInfo;

/// The estimate a settled limit reserves per request (see [`Settle::estimate`]).
type EstimateFn = dyn Fn(&RequestInfo<'_>) -> u64 + Send + Sync;

/// The actual cost a settled limit reads from the response head (see [`Settle::actual`]).
type ActualFn = dyn Fn(&Parts) -> Option<u64> + Send + Sync;

/// The actual cost of a request, put by the inner service into its response's extensions: what
/// [`Settle::from_extension`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Usage(pub u64);

/// How a limit is charged from the response
/// ([`RateLimitLayerBuilder::and_settled`](crate::RateLimitLayerBuilder::and_settled)): for
/// costs known only after the response (the tokens an LLM answer used).
///
/// 1. The request reserves an estimate ([`estimate`](Self::estimate): a fixed number, 1 by
///    default, or [`estimate_with`](Self::estimate_with) from the request's head), decided
///    with the layer's other limits as one all-or-nothing batch: a key without room for the
///    estimate is answered 429, charged nothing.
/// 2. When the response body ends, the actual cost, read from the response head (a header,
///    [`from_header`](Self::from_header); the [`Usage`] extension,
///    [`from_extension`](Self::from_extension); or a closure, [`actual`](Self::actual)), settles
///    the reservation: `estimate − actual` goes back, or `actual − estimate` is reported and
///    charged even past the limit, as debt that later requests wait out (429 with a
///    `Retry-After` until the debt is paid). A response without the value settles at the
///    estimate.
/// 3. A 5xx response gives the whole estimate back ([`refund_on_server_error`](Self::refund_on_server_error),
///    on by default), and so does a response (or body) dropped before its end, the client gone
///    or the service failed ([`refund_on_drop`](Self::refund_on_drop), on by default; off, a
///    dropped response settles like a finished one).
///
/// Settling is a store call of its own, sent on a Tokio task after the body ends (the response
/// is not delayed); a failed settle is logged (`WARN`) and lost, like any request the store
/// cannot record. The policy's tiers must be token buckets or GCRA: the window algorithms
/// cannot carry debt, and their settles fail (logged).
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
    estimate: Estimate,
    actual: Box<ActualFn>,
    refund_on_server_error: bool,
    refund_on_drop: bool,
}

enum Estimate {
    Fixed(u64),
    With(Box<EstimateFn>),
}

impl fmt::Debug for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let estimate = match &self.spec.estimate {
            Estimate::Fixed(n) => Some(*n),
            Estimate::With(_) => None,
        };
        f.debug_struct("Settle")
            .field("estimate", &estimate)
            .field("refund_on_server_error", &self.spec.refund_on_server_error)
            .field("refund_on_drop", &self.spec.refund_on_drop)
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
                estimate: Estimate::Fixed(1),
                actual: Box::new(actual),
                refund_on_server_error: true,
                refund_on_drop: true,
            }),
        }
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
        self.with(|spec| spec.estimate = Estimate::Fixed(estimate))
    }

    /// Reserves the units `estimate` computes from the request's head.
    #[must_use]
    pub fn estimate_with<F>(self, estimate: F) -> Self
    where
        F: Fn(&RequestInfo<'_>) -> u64 + Send + Sync + 'static,
    {
        self.with(|spec| spec.estimate = Estimate::With(Box::new(estimate)))
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

    fn with(self, change: impl FnOnce(&mut Spec)) -> Self {
        let spec = match Arc::try_unwrap(self.spec) {
            Ok(mut spec) => {
                change(&mut spec);
                spec
            }
            // Built once per layer, never shared before it is built: not reached.
            Err(shared) => return Self { spec: shared },
        };
        Self {
            spec: Arc::new(spec),
        }
    }

    /// The estimate of one request.
    pub(crate) fn estimate_of(spec: &Spec, info: &RequestInfo<'_>) -> u64 {
        match &spec.estimate {
            Estimate::Fixed(n) => *n,
            Estimate::With(f) => f(info),
        }
    }
}

/// Sends settles to the limiter, store type erased.
pub(crate) trait Sink: Send + Sync + 'static {
    fn send(self: Arc<Self>, settles: Vec<(Arc<str>, Bytes, SettleKind, u64)>);
}

impl<S: Store + ?Sized + 'static> Sink for Limiter<S> {
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
    pub(crate) spec: Arc<Spec>,
}

/// The reservations of an admitted request, settled once: when the body ends
/// ([`finish`](Self::finish)) or, if it never does, when dropped.
pub(crate) struct Settlement {
    sink: Arc<dyn Sink>,
    reserved: SmallVec<[Reserved; 1]>,
    /// The actual cost per reservation, from the response head (`None` before it came, or when
    /// it said nothing); the estimate when the response was a refunded 5xx: 0.
    actual: SmallVec<[Option<u64>; 1]>,
    /// Settled already (the body's `is_end_stream` may say so through `&self`).
    done: AtomicBool,
}

impl Settlement {
    pub(crate) fn new(sink: Arc<dyn Sink>, reserved: SmallVec<[Reserved; 1]>) -> Self {
        let actual = reserved.iter().map(|_| None).collect();
        Self {
            sink,
            reserved,
            actual,
            done: AtomicBool::new(false),
        }
    }

    /// Reads the actual costs from the response head.
    pub(crate) fn head(&mut self, parts: &Parts) {
        let error = parts.status.is_server_error();
        for (r, actual) in self.reserved.iter().zip(&mut self.actual) {
            *actual = if error && r.spec.refund_on_server_error {
                Some(0)
            } else {
                (r.spec.actual)(parts)
            };
        }
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
        for (r, actual) in self.reserved.iter().zip(&self.actual) {
            let actual = match actual {
                _ if dropped && r.spec.refund_on_drop => 0,
                Some(actual) => *actual,
                None => r.estimate,
            };
            let (kind, cost) = if actual < r.estimate {
                (SettleKind::GiveBack, r.estimate - actual)
            } else {
                (SettleKind::Report, actual - r.estimate)
            };
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
    }
}

impl fmt::Debug for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settlement")
            .field("reserved", &self.reserved.len())
            .field("actual", &self.actual)
            .field("done", &self.done.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}
