//! The gRPC port's listener: at most a fixed number of connections open; past the cap, new
//! clients wait in the kernel's accept queue instead of costing this process memory and tasks.
//! (The HTTP port is served by `distlimit-serve`, with the same cap.)

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// An accepted connection holding one of its listener's permits until it closes.
#[derive(Debug)]
pub struct CappedStream {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for CappedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CappedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl Connected for CappedStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

/// A TCP listener accepting only while fewer than `max` of its connections are open.
#[derive(Debug)]
pub struct CappedListener {
    listener: TcpListener,
    permits: Arc<Semaphore>,
}

impl CappedListener {
    /// Caps `listener` at `max` open connections.
    pub fn new(listener: TcpListener, max: usize) -> Self {
        Self {
            listener,
            permits: Arc::new(Semaphore::new(max.clamp(1, Semaphore::MAX_PERMITS))),
        }
    }

    /// Waits for a permit, then for a connection. Accept errors (out of file descriptors, a
    /// connection reset before it was accepted) are logged and retried after a pause.
    pub async fn accept_capped(&mut self) -> (CappedStream, SocketAddr) {
        let permit = loop {
            match self.permits.clone().acquire_owned().await {
                Ok(permit) => break permit,
                // The semaphore is never closed; wait as if it were full.
                Err(_) => std::future::pending::<()>().await,
            }
        };
        loop {
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    return (
                        CappedStream {
                            stream,
                            _permit: permit,
                        },
                        addr,
                    );
                }
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// The connections as a stream, for tonic: a task accepts them while the stream lives.
    pub fn into_stream(mut self) -> ReceiverStream<io::Result<CappedStream>> {
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = self.accept_capped() => accepted,
                    () = tx.closed() => return,
                };
                if tx.send(Ok(accepted.0)).await.is_err() {
                    return;
                }
            }
        });
        ReceiverStream::new(rx)
    }
}
