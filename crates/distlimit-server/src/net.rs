//! The gRPC port's connections: `distlimit-serve`'s [`Acceptor`] (connection cap, accept
//! backoff, idle timeout, as on the HTTP port) as the stream of connections tonic serves.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use distlimit_serve::{Acceptor, Connection, ConnectionInfo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

/// An accepted gRPC connection; tonic puts its [`ConnectionInfo`] into each request's
/// extensions, where `distlimit_serve::TrackRequestsLayer` counts the request in progress.
#[derive(Debug)]
pub struct GrpcConnection(Connection);

impl AsyncRead for GrpcConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

impl Connected for GrpcConnection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        self.0.info()
    }
}

/// The connections of `acceptor` as a stream, for tonic: a task accepts them while the stream
/// lives (and stops accepting, dropping the listener, once it is dropped).
pub fn incoming(mut acceptor: Acceptor) -> ReceiverStream<io::Result<GrpcConnection>> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            let connection = tokio::select! {
                connection = acceptor.accept() => connection,
                () = tx.closed() => return,
            };
            if tx.send(Ok(GrpcConnection(connection))).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}
