//! The gRPC port's connections: `distlimit-serve`'s [`Acceptor`] (connection cap, accept
//! backoff, idle timeout, as on the HTTP port) as the stream of connections tonic serves, over
//! TLS when the server has a certificate.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use distlimit_serve::{
    Acceptor, Alpn, CoalesceWrites, Connection, ConnectionInfo, Tls, TlsConnection,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

/// An accepted gRPC connection; tonic puts its [`ConnectionInfo`] into each request's
/// extensions, where `distlimit_serve::TrackRequestsLayer` counts the request in progress.
#[derive(Debug)]
pub(crate) struct GrpcConnection(Stream);

/// A plaintext connection or one after its TLS handshake, its writes coalesced
/// ([`CoalesceWrites`]): the responses of the connection's streams that finish together leave
/// in one system call (one TLS record batch) instead of one each.
#[derive(Debug)]
enum Stream {
    Plain(CoalesceWrites<Connection>),
    Tls(Box<CoalesceWrites<TlsConnection>>),
}

/// The I/O of either stream.
trait Io: AsyncRead + AsyncWrite + Unpin {}

impl<T: AsyncRead + AsyncWrite + Unpin> Io for T {}

impl Stream {
    fn io(&mut self) -> Pin<&mut dyn Io> {
        match self {
            Stream::Plain(connection) => Pin::new(connection),
            Stream::Tls(stream) => Pin::new(stream.as_mut()),
        }
    }
}

impl AsyncRead for GrpcConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.0.io().poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.0.io().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.io().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.io().poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.0.io().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        match &self.0 {
            Stream::Plain(connection) => connection.is_write_vectored(),
            Stream::Tls(stream) => stream.is_write_vectored(),
        }
    }
}

impl Connected for GrpcConnection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        match &self.0 {
            Stream::Plain(connection) => connection.get_ref().info(),
            Stream::Tls(stream) => stream.get_ref().get_ref().0.info(),
        }
    }
}

/// The connections of `acceptor` as a stream, for tonic: a task accepts them while the stream
/// lives (and stops accepting, dropping the listener, once it is dropped). With `tls`, each
/// connection's handshake (ALPN `h2`) runs on a task of its own within `handshake_timeout`,
/// never in the accept loop; a failed one is logged at debug and closes that connection only.
pub(crate) fn incoming(
    mut acceptor: Acceptor,
    tls: Option<Tls>,
    handshake_timeout: Duration,
) -> ReceiverStream<io::Result<GrpcConnection>> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            let connection = tokio::select! {
                connection = acceptor.accept() => connection,
                () = tx.closed() => return,
            };
            let Some(tls) = &tls else {
                let plain = Stream::Plain(CoalesceWrites::new(connection));
                if tx.send(Ok(GrpcConnection(plain))).await.is_err() {
                    return;
                }
                continue;
            };
            let (tls, tx) = (tls.clone(), tx.clone());
            tokio::spawn(async move {
                let peer = connection.info().peer;
                match tls.accept(connection, Alpn::H2, handshake_timeout).await {
                    Ok(stream) => {
                        let tls = Stream::Tls(Box::new(CoalesceWrites::new(stream)));
                        // The server has stopped when the stream is gone: the connection closes.
                        let _ = tx.send(Ok(GrpcConnection(tls))).await;
                    }
                    Err(error) => tracing::debug!("connection from {peer}: TLS handshake: {error}"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
