//! What the layer knows about a request: [`RequestInfo`], and the socket peer ([`PeerAddr`]).

use std::net::SocketAddr;

use http::{Extensions, HeaderMap, Method, Uri};

use crate::ClientIp;

/// The socket peer of a request, as a request extension: insert it when serving with plain
/// hyper (axum's `ConnectInfo<SocketAddr>` and tonic's `TcpConnectInfo` are read directly with
/// the `axum` and `tonic` features).
///
/// ```
/// use distlimit_tower::PeerAddr;
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(PeerAddr("192.0.2.1:4711".parse().unwrap()));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);

/// The socket peer of a request, from the first extension present: [`PeerAddr`], axum's
/// `ConnectInfo<SocketAddr>`, tonic's `TcpConnectInfo`.
pub(crate) fn peer_addr(ext: &Extensions) -> Option<SocketAddr> {
    if let Some(PeerAddr(addr)) = ext.get::<PeerAddr>() {
        return Some(*addr);
    }
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) =
        ext.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(*addr);
    }
    #[cfg(feature = "tonic")]
    if let Some(info) = ext.get::<tonic::transport::server::TcpConnectInfo>() {
        return info.remote_addr();
    }
    None
}

/// A borrowed view of a request, for key and policy closures.
#[derive(Clone, Copy, Debug)]
pub struct RequestInfo<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
    client_ip: Option<ClientIp>,
}

impl<'a> RequestInfo<'a> {
    /// A view of a request's parts, with its client (`None` when the peer address is unknown).
    pub fn new(
        method: &'a Method,
        uri: &'a Uri,
        headers: &'a HeaderMap,
        extensions: &'a Extensions,
        client_ip: Option<ClientIp>,
    ) -> Self {
        Self {
            method,
            uri,
            headers,
            extensions,
            client_ip,
        }
    }

    /// A view of `req`'s head, its client not resolved yet.
    pub(crate) fn of<B>(req: &'a http::Request<B>) -> Self {
        let (method, uri) = (req.method(), req.uri());
        Self::new(method, uri, req.headers(), req.extensions(), None)
    }

    /// The same view, its client resolved by `resolver` from the socket peer.
    pub(crate) fn resolved(self, resolver: &crate::ClientIpResolver) -> Self {
        let peer = peer_addr(self.extensions);
        let client_ip = peer.map(|peer| resolver.resolve(peer.ip(), self.headers));
        Self { client_ip, ..self }
    }

    /// The request method.
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The request URI.
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The request path (for gRPC, `/package.Service/Method`).
    pub fn path(&self) -> &'a str {
        self.uri.path()
    }

    /// The request headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The request extensions.
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }

    /// The client, resolved through the trusted proxies; `None` when no peer address is known.
    pub fn client_ip(&self) -> Option<ClientIp> {
        self.client_ip
    }
}
