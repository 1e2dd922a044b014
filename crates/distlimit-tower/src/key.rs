//! [`KeyExtractor`]: which bytes of a request name the client being limited.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};

use crate::RequestInfo;

/// The default [`KeyExtractor::header`] length limit, in bytes.
pub const DEFAULT_MAX_HEADER_KEY_LEN: usize = 128;

type KeyFn = dyn Fn(&RequestInfo<'_>) -> Option<Bytes> + Send + Sync;

/// Which bytes of a request name the client being limited.
///
/// * [`client_ip`](Self::client_ip): `203.0.113.7`, or `2001:db8:1:2::/64` for IPv6 clients
///   grouped by prefix (see [`ClientIpResolver`](crate::ClientIpResolver)).
/// * [`header`](Self::header): the raw bytes of a header such as `X-User-ID`, falling back to the
///   client IP when the header is absent, empty, longer than its limit (128 bytes by default), or
///   is itself an IP address or network. Header values are untrusted: the fallback keeps such
///   requests limited (by address) instead of rejecting them, and the last rule keeps a client
///   from spending another client's IP quota by naming it in the header.
/// * [`custom`](Self::custom): a closure; `None` falls back to the client IP. Its keys are used
///   verbatim, so namespace them yourself.
///
/// The key must fit the store's limit (1 to 1024 bytes); a custom key outside it makes the store
/// refuse the request, which the layer answers like any store error.
#[derive(Clone)]
pub struct KeyExtractor(pub(crate) Kind);

#[derive(Clone)]
pub(crate) enum Kind {
    ClientIp,
    Header { name: HeaderName, max_len: usize },
    Custom(Arc<KeyFn>),
}

impl KeyExtractor {
    /// Keys by client IP (the default).
    pub fn client_ip() -> Self {
        Self(Kind::ClientIp)
    }

    /// Keys by the value of header `name`, falling back to the client IP.
    pub fn header(name: HeaderName) -> Self {
        Self::header_with_max_len(name, DEFAULT_MAX_HEADER_KEY_LEN)
    }

    /// Keys by the value of header `name` when it is at most `max_len` bytes (capped at 1024),
    /// falling back to the client IP.
    pub fn header_with_max_len(name: HeaderName, max_len: usize) -> Self {
        Self(Kind::Header {
            name,
            max_len: max_len.min(distlimit_core::MAX_KEY_LEN),
        })
    }

    /// Keys by what `f` returns, falling back to the client IP on `None`.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use distlimit_tower::KeyExtractor;
    ///
    /// // The API key's tenant, taken from a header set by the authentication layer.
    /// let key = KeyExtractor::custom(|req| {
    ///     let tenant = req.headers().get("x-tenant")?;
    ///     Some(Bytes::copy_from_slice(tenant.as_bytes()))
    /// });
    /// ```
    pub fn custom<F>(f: F) -> Self
    where
        F: Fn(&RequestInfo<'_>) -> Option<Bytes> + Send + Sync + 'static,
    {
        Self(Kind::Custom(Arc::new(f)))
    }
}

impl Default for KeyExtractor {
    fn default() -> Self {
        Self::client_ip()
    }
}

impl fmt::Debug for KeyExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::ClientIp => f.write_str("KeyExtractor::ClientIp"),
            Kind::Header { name, max_len } => f
                .debug_struct("KeyExtractor::Header")
                .field("name", name)
                .field("max_len", max_len)
                .finish(),
            Kind::Custom(_) => f.write_str("KeyExtractor::Custom(..)"),
        }
    }
}

/// A usable header key: present, non-empty, within `max_len`, not an IP key.
pub(crate) fn header_key<'a>(
    info: &RequestInfo<'a>,
    name: &HeaderName,
    max_len: usize,
) -> Option<&'a HeaderValue> {
    let value = info.headers().get(name)?;
    let bytes = value.as_bytes();
    let usable = !bytes.is_empty() && bytes.len() <= max_len && !is_ip_key(bytes);
    usable.then_some(value)
}

/// Whether `value` has the form of a client-IP key: an address, optionally with `/prefix`.
fn is_ip_key(value: &[u8]) -> bool {
    let addr = value.split(|&b| b == b'/').next().unwrap_or_default();
    // An address is hex digits, `.` and `:` only: anything else, as in most user ids, is no
    // address, without running the parser.
    if !addr
        .iter()
        .all(|b| b.is_ascii_hexdigit() || matches!(b, b'.' | b':'))
    {
        return false;
    }
    let Ok(text) = std::str::from_utf8(value) else {
        return false;
    };
    let addr = text.split_once('/').map_or(text, |(addr, _)| addr);
    addr.parse::<std::net::IpAddr>().is_ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use http::{Extensions, HeaderMap, HeaderValue, Method, Uri};

    use super::*;

    #[test]
    fn header_keys_are_bounded_and_kept_out_of_the_ip_namespace() {
        let name = HeaderName::from_static("x-user-id");
        let (method, uri, ext) = (Method::GET, Uri::from_static("/"), Extensions::new());
        let check = |value: &[u8], max_len: usize| {
            let mut headers = HeaderMap::new();
            headers.insert(&name, HeaderValue::from_bytes(value).unwrap());
            let info = RequestInfo::new(&method, &uri, &headers, &ext, None);
            header_key(&info, &name, max_len).map(|v| v.as_bytes().to_vec())
        };
        assert_eq!(check(b"alice", 128), Some(b"alice".to_vec()));
        assert_eq!(check(b"alice", 5), Some(b"alice".to_vec()));
        assert_eq!(check(b"alice", 4), None);
        assert_eq!(check(b"", 128), None);
        assert_eq!(check(b"203.0.113.7", 128), None);
        assert_eq!(check(b"2001:db8::/64", 128), None);
        assert_eq!(check(b"203.0.113.7x", 128), Some(b"203.0.113.7x".to_vec()));
        assert_eq!(check(b"\xff", 128), Some(b"\xff".to_vec()));
        assert_eq!(check(b"203.0.113.7/x", 128), None);
        assert_eq!(check(b"::ffff:203.0.113.7", 128), None);
        assert_eq!(check(b"bench-user-1", 128), Some(b"bench-user-1".to_vec()));
        let headers = HeaderMap::new();
        let info = RequestInfo::new(&method, &uri, &headers, &ext, None);
        assert_eq!(header_key(&info, &name, 128), None);
    }
}
