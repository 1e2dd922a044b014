//! [`RateLimitBody`]: the inner service's response body, or the layer's own small body.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

pin_project_lite::pin_project! {
    /// The response body of a [`RateLimit`](crate::RateLimit) service: the inner service's
    /// body, or the layer's own (a problem document, or nothing for a gRPC trailers-only
    /// answer). No boxing: passing a response through adds one branch per frame. (axum boxes
    /// every response body that is not its own `Body` once more, this one included.)
    #[derive(Debug)]
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Kind<B>,
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
        }
    }

    /// A body of `data` (nothing when empty).
    pub fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    /// An empty body.
    pub fn empty() -> Self {
        Self {
            kind: Kind::Full { data: None },
        }
    }
}

impl<B: Body<Data = Bytes>> Body for RateLimitBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
