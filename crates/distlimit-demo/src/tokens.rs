//! [`Tokens`]: the body of a streamed `/api/generate?stream=1` answer.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Bytes;
use http_body::{Body, Frame};
use tokio::time::{Instant, Sleep};

/// `n` tokens as server-sent events spread evenly over a duration, one `data:` line (one
/// frame) per token, then `event: done` with the count.
#[derive(Debug)]
pub(crate) struct Tokens {
    n: u64,
    sent: u64,
    start: Instant,
    over: Duration,
    sleep: Pin<Box<Sleep>>,
    done: bool,
}

impl Tokens {
    pub(crate) fn new(n: u64, over: Duration) -> Self {
        let start = Instant::now();
        Self {
            n,
            sent: 0,
            start,
            over,
            sleep: Box::pin(tokio::time::sleep_until(start)),
            done: false,
        }
    }

    /// When token `i` (0-based) is due: the `i+1`-th of `n` equal steps.
    fn due(&self, i: u64) -> Instant {
        let step = self.over.as_micros() * u128::from(i + 1) / u128::from(self.n.max(1));
        self.start + Duration::from_micros(u64::try_from(step).unwrap_or(u64::MAX))
    }
}

impl Body for Tokens {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.sent == self.n {
            self.done = true;
            let done = format!("event: done\ndata: {{\"tokens\":{}}}\n\n", self.n);
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(done)))));
        }
        let due = self.due(self.sent);
        if due > Instant::now() {
            self.sleep.as_mut().reset(due);
            ready!(self.sleep.as_mut().poll(cx));
        }
        let token = format!("data: token {}\n\n", self.sent);
        self.sent += 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(token)))))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}
