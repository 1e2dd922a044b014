use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream whose first write after each flush first yields once to the scheduler, so that
/// the other tasks ready to run (the request handlers of the same HTTP/2 connection) finish
/// their responses before the protocol writes: it then writes them all in one system call
/// instead of one per response (why hyper needs it, and what it saves: the crate documentation).
///
/// A yield is one trip through the runtime's queue, at most once per flush: the wait is
/// bounded by the tasks already queued, and a write that finds the socket full waits for the
/// socket as before, without another yield. For HTTP/1 (one response at a time) it only adds
/// that trip: use it on multiplexed protocols.
#[derive(Debug)]
pub struct CoalesceWrites<T> {
    inner: T,
    /// The yield of the current batch has happened: write through until the next flush.
    yielded: bool,
}

impl<T> CoalesceWrites<T> {
    /// Wraps `inner`.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            yielded: false,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// True (and the task woken to run again after the tasks already queued) the first time
    /// in a batch; false afterwards.
    fn yield_first(&mut self, cx: &mut Context<'_>) -> bool {
        if self.yielded {
            return false;
        }
        self.yielded = true;
        // Waking the running task makes Tokio queue it behind the tasks ready now (a yield).
        cx.waker().wake_by_ref();
        true
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CoalesceWrites<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CoalesceWrites<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if !buf.is_empty() && self.yield_first(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if bufs.iter().any(|buf| !buf.is_empty()) && self.yield_first(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.inner).poll_flush(cx);
        if flushed.is_ready() {
            // The batch is out: the next write starts another.
            self.yielded = false;
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;

    /// Counts the write calls that reach it.
    #[derive(Default)]
    struct Counter(Arc<AtomicUsize>, Vec<u8>);

    impl AsyncWrite for Counter {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            self.1.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn yields_once_per_flush_and_writes_everything() {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut stream = CoalesceWrites::new(Counter(calls.clone(), Vec::new()));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let write = |stream: &mut CoalesceWrites<_>, bytes: &[u8]| {
            Pin::new(stream).poll_write(&mut Context::from_waker(std::task::Waker::noop()), bytes)
        };
        // The first write of a batch yields, the next ones write through.
        assert!(write(&mut stream, b"ab").is_pending());
        assert_eq!(calls.load(Ordering::Relaxed), 0);
        assert!(matches!(write(&mut stream, b"ab"), Poll::Ready(Ok(2))));
        assert!(matches!(write(&mut stream, b"cd"), Poll::Ready(Ok(2))));
        assert!(Pin::new(&mut stream).poll_flush(&mut cx).is_ready());
        // After a flush, the next batch yields again.
        assert!(write(&mut stream, b"ef").is_pending());
        // Through the async API nothing is lost.
        stream.write_all(b"ef").await.expect("write");
        stream.flush().await.expect("flush");
        assert_eq!(stream.get_ref().1, b"abcdef");
        assert_eq!(calls.load(Ordering::Relaxed), 3);
    }
}
