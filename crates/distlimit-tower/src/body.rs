//! [`RateLimitBody`]: the inner service's response body, or the layer's own small body.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::settle::Settlement;

pin_project_lite::pin_project! {
    /// The response body of a [`RateLimit`](crate::RateLimit) service: the inner service's
    /// body, or the layer's own (a problem document, or nothing for a gRPC trailers-only
    /// answer). No boxing: passing a response through adds one branch per frame. (axum boxes
    /// every response body that is not its own `Body` once more, this one included.)
    #[derive(Debug)]
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Kind<B>,
        // The reservations settled when the body ends (or, dropped first, as a dropped
        // response).
        settle: Option<Box<Settlement>>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> RateLimitBody<B> {
    /// Wraps the inner service's body.
    pub fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
            settle: None,
        }
    }

    /// Wraps the inner service's body, settling `settle` when it ends.
    pub(crate) fn settled(body: B, settle: Box<Settlement>) -> Self {
        Self {
            kind: Kind::Inner { body },
            settle: Some(settle),
        }
    }

    /// A body of `data` (nothing when empty).
    pub fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            settle: None,
        }
    }

    /// An empty body.
    pub fn empty() -> Self {
        Self::full(Bytes::new())
    }
}

impl<B: Body<Data = Bytes>> Body for RateLimitBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Inner { mut body } => {
                if let Some(settle) = this.settle
                    && settle.is_metered()
                {
                    return settle.poll_metered(body, cx);
                }
                let frame = body.as_mut().poll_frame(cx);
                if let Some(settle) = this.settle
                    && matches!(&frame, Poll::Ready(None) | Poll::Ready(Some(Ok(_))))
                    && (matches!(&frame, Poll::Ready(None)) || body.is_end_stream())
                {
                    settle.finish();
                }
                frame
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => {
                if let Some(settle) = &self.settle
                    && settle.is_metered()
                {
                    return settle.metered_end(body.is_end_stream());
                }
                let end = body.is_end_stream();
                if end && let Some(settle) = &self.settle {
                    settle.finish();
                }
                end
            }
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            // A metered body may stop early, or end with a frame of its own.
            Kind::Inner { .. } if self.settle.as_ref().is_some_and(|s| s.is_metered()) => {
                SizeHint::default()
            }
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
