//! [`Decision`]: the answer to one rate-limit request.

use std::time::Duration;

/// `retry_after` of a request that can never pass because its cost exceeds the capacity.
pub const NEVER: Duration = Duration::from_micros(u64::MAX);

/// The answer to one request: admitted or not, and what the client may do next.
///
/// A denial is a value, not an error: `Err` from a store means the store failed to decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    allowed: bool,
    source: Source,
    limit: u64,
    remaining: u64,
    reset_after_us: u64,
    retry_after_us: u64,
}

impl Decision {
    /// An admitted request. Store drivers build their answers with this; `remaining` is capped
    /// at `limit`.
    #[inline]
    pub fn allowed(limit: u64, remaining: u64, reset_after: Duration) -> Self {
        Self::from_micros(true, limit, remaining, micros(reset_after), 0)
    }

    /// A denied request. Store drivers build their answers with this; `remaining` is capped at
    /// `limit` and `retry_after` is at least one microsecond (a denial always has a wait).
    #[inline]
    pub fn denied(
        limit: u64,
        remaining: u64,
        reset_after: Duration,
        retry_after: Duration,
    ) -> Self {
        Self::from_micros(
            false,
            limit,
            remaining,
            micros(reset_after),
            micros(retry_after),
        )
    }

    /// A decision from its fields in microseconds (what a store driver that computes in
    /// microseconds has; what [`reset_after_us`](Self::reset_after_us) and
    /// [`retry_after_us`](Self::retry_after_us) return), with the guarantees of
    /// [`allowed`](Self::allowed) and [`denied`](Self::denied): `remaining` capped at `limit`,
    /// `retry_after` zero when allowed and at least one microsecond when denied.
    #[inline]
    pub fn from_micros(
        allowed: bool,
        limit: u64,
        remaining: u64,
        reset_after_us: u64,
        retry_after_us: u64,
    ) -> Self {
        // `from_micros_exact` zeroes the wait of an allowed decision.
        Self::from_micros_exact(
            allowed,
            limit,
            remaining.min(limit),
            reset_after_us,
            retry_after_us.max(1),
        )
    }

    /// [`from_micros`](Self::from_micros) for the reference algorithms, whose answers hold the
    /// guarantees already.
    #[inline]
    pub(crate) fn from_micros_exact(
        allowed: bool,
        limit: u64,
        remaining: u64,
        reset_after_us: u64,
        retry_after_us: u64,
    ) -> Self {
        Self {
            allowed,
            source: Source::Primary,
            limit,
            remaining,
            reset_after_us,
            retry_after_us: if allowed { 0 } else { retry_after_us },
        }
    }

    /// Who answered: [`Source::Primary`] for a decision made by the store that was asked. A
    /// store that delegates (the hybrid store's fallback, its blocked-key cache) re-tags it
    /// with [`with_source`](Self::with_source).
    #[inline]
    pub fn source(&self) -> Source {
        self.source
    }

    /// The same decision, attributed to `source`.
    #[inline]
    #[must_use]
    pub fn with_source(mut self, source: Source) -> Self {
        self.source = source;
        self
    }

    /// Whether the request was admitted (and charged).
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Whether the request was denied (and not charged).
    #[inline]
    pub fn is_denied(&self) -> bool {
        !self.is_allowed()
    }

    /// The capacity (the burst for the token bucket and GCRA, the limit per window for the
    /// window algorithms): the largest value [`remaining`](Self::remaining) can take.
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Units that could still be spent right now, after this request.
    #[inline]
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Time until the key is back to full capacity if nothing else is consumed.
    #[inline]
    pub fn reset_after(&self) -> Duration {
        Duration::from_micros(self.reset_after_us)
    }

    /// [`reset_after`](Self::reset_after) in microseconds.
    #[inline]
    pub fn reset_after_us(&self) -> u64 {
        self.reset_after_us
    }

    /// [`retry_after`](Self::retry_after) in microseconds (`u64::MAX` for [`NEVER`]).
    #[inline]
    pub fn retry_after_us(&self) -> u64 {
        self.retry_after_us
    }

    /// For a denial, the time after which the same request would be admitted if nothing else is
    /// consumed meanwhile (exactly: a microsecond earlier it would still be denied); zero when
    /// allowed; [`NEVER`] when it can never pass.
    #[inline]
    pub fn retry_after(&self) -> Duration {
        Duration::from_micros(self.retry_after_us)
    }

    /// Whether the request can never pass (its cost exceeds the capacity).
    #[inline]
    pub fn is_never(&self) -> bool {
        self.retry_after_us == u64::MAX
    }

    /// The most restrictive of several decisions (for example the tiers of one request, checked
    /// all-or-nothing): denied if any is denied, the smallest `remaining`, the largest
    /// `retry_after` and `reset_after`. `None` for an empty input.
    ///
    /// `limit` is that of the decision with the smallest `remaining`.
    pub fn most_restrictive<'a, I: IntoIterator<Item = &'a Decision>>(
        decisions: I,
    ) -> Option<Self> {
        let mut iter = decisions.into_iter();
        let mut acc = *iter.next()?;
        for d in iter {
            if d.remaining < acc.remaining {
                acc.remaining = d.remaining;
                acc.limit = d.limit;
            }
            if d.is_denied() {
                acc.allowed = false;
            }
            acc.reset_after_us = acc.reset_after_us.max(d.reset_after_us);
            acc.retry_after_us = acc.retry_after_us.max(d.retry_after_us);
        }
        Some(acc)
    }
}

/// Where a [`Decision`] came from, for metrics and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Source {
    /// The store that was asked decided itself (every plain store; the hybrid store's primary).
    #[default]
    Primary,
    /// A fallback store decided because the primary failed or its circuit breaker was open.
    Fallback,
    /// A local cache of denied keys answered without asking any store.
    BlockedCache,
    /// No store could decide and the policy's failure mode admitted the request unchecked.
    FailOpen,
}

crate::observe::labels!(Source: Primary => "primary", Fallback => "fallback",
    BlockedCache => "blocked_cache", FailOpen => "fail_open");

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
