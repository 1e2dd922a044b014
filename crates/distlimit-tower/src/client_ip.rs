//! The client's IP address, taken from forwarding headers only through trusted proxies
//! ([`ClientIpResolver::resolve`] says how).

use std::fmt;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use distlimit_policy::{Cidr, CidrError};
use http::HeaderMap;
use http::header::{FORWARDED, HeaderName};
use ipnet::IpNet;

/// The proxies whose forwarding headers are believed: a list of networks, empty by default
/// (no forwarding header is ever read).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    networks: Vec<Cidr>,
}

impl TrustedProxies {
    /// Trusts no proxy: the client is always the socket peer.
    pub fn none() -> Self {
        Self::default()
    }

    /// Trusts the given networks.
    pub fn new(networks: impl IntoIterator<Item = Cidr>) -> Self {
        Self {
            networks: networks.into_iter().collect(),
        }
    }

    /// Parses a list of CIDRs (`"10.0.0.0/8"`, `"2001:db8::/32"`, `"192.0.2.7"`).
    ///
    /// ```
    /// use distlimit_tower::TrustedProxies;
    ///
    /// let trusted = TrustedProxies::parse(["10.0.0.0/8", "fd00::/8"]).unwrap();
    /// assert!(trusted.contains("10.1.2.3".parse().unwrap()));
    /// assert!(TrustedProxies::parse(["10.0.0.0/33"]).is_err());
    /// ```
    pub fn parse<I>(cidrs: I) -> Result<Self, CidrError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let networks = cidrs
            .into_iter()
            .map(|s| s.as_ref().trim().parse())
            .collect::<Result<_, _>>()?;
        Ok(Self { networks })
    }

    /// Whether `ip` is a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.networks.iter().any(|n| n.contains(ip))
    }
}

/// Which forwarding header the trusted proxies write.
///
/// Exactly one is read: a proxy that appends to `X-Forwarded-For` passes a client's own
/// `Forwarded` header through untouched, so reading both would let clients choose their address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (nginx, HAProxy, Envoy, cloud load balancers).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`.
    Forwarded,
}

/// Finds the client address of a request from its socket peer and, through trusted proxies, its
/// forwarding header; and groups addresses into rate-limit keys (IPv6 by /64 by default).
///
/// ```
/// use distlimit_tower::{ClientIpResolver, TrustedProxies};
/// use http::HeaderMap;
///
/// let resolver = ClientIpResolver::new(TrustedProxies::parse(["10.0.0.0/8"]).unwrap());
/// let mut headers = HeaderMap::new();
/// headers.insert("x-forwarded-for", "198.51.100.9, 203.0.113.5, 10.0.0.2".parse().unwrap());
///
/// // From a trusted proxy: the rightmost untrusted hop.
/// let ip = resolver.resolve("10.0.0.1".parse().unwrap(), &headers);
/// assert_eq!(ip.addr(), "203.0.113.5".parse::<std::net::IpAddr>().unwrap());
///
/// // From anyone else the header changes nothing.
/// let ip = resolver.resolve("192.0.2.1".parse().unwrap(), &headers);
/// assert_eq!(ip.addr(), "192.0.2.1".parse::<std::net::IpAddr>().unwrap());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientIpResolver {
    trusted: TrustedProxies,
    header: ForwardedHeader,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
}

impl Default for ClientIpResolver {
    fn default() -> Self {
        Self::new(TrustedProxies::none())
    }
}

impl ClientIpResolver {
    /// A resolver believing `X-Forwarded-For` from `trusted` proxies, keying IPv4 clients by
    /// address and IPv6 clients by /64.
    pub fn new(trusted: TrustedProxies) -> Self {
        Self {
            trusted,
            header: ForwardedHeader::default(),
            ipv4_prefix: 32,
            ipv6_prefix: 64,
        }
    }

    /// Reads `header` instead of `X-Forwarded-For`.
    #[must_use]
    pub fn forwarded_header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv4 clients by the first `prefix` bits (clamped to 32; default 32: one key per
    /// address).
    #[must_use]
    pub fn ipv4_prefix(mut self, prefix: u8) -> Self {
        self.ipv4_prefix = prefix.min(32);
        self
    }

    /// Groups IPv6 clients by the first `prefix` bits (clamped to 128; default 64: a host that
    /// rotates through the addresses of its /64 stays one key).
    #[must_use]
    pub fn ipv6_prefix(mut self, prefix: u8) -> Self {
        self.ipv6_prefix = prefix.min(128);
        self
    }

    /// The client of a request that arrived from the socket peer `peer` with `headers`.
    ///
    /// The forwarding header is read only when `peer` is trusted. It is walked from the right,
    /// skipping trusted hops; the first untrusted address is the client. A header that is
    /// absent, holds only trusted hops, or has an unparsable entry where the walk reaches it
    /// makes the peer the client: the result is never a trusted hop from the header.
    pub fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> ClientIp {
        let peer = peer.to_canonical();
        let addr = if self.trusted.contains(peer) {
            self.walk(headers).unwrap_or(peer)
        } else {
            peer
        };
        let prefix = if addr.is_ipv4() {
            self.ipv4_prefix
        } else {
            self.ipv6_prefix
        };
        ClientIp { addr, prefix }
    }

    /// The client named by the forwarding header, or `None` for no header or garbage.
    fn walk(&self, headers: &HeaderMap) -> Option<IpAddr> {
        let (name, parse): (HeaderName, fn(&str) -> Option<IpAddr>) = match self.header {
            ForwardedHeader::XForwardedFor => (X_FORWARDED_FOR, parse_xff_entry),
            ForwardedHeader::Forwarded => (FORWARDED, parse_forwarded_element),
        };
        // Several header lines form one list, in order.
        for value in headers.get_all(name).iter().rev() {
            let value = value.to_str().ok()?;
            for entry in value.rsplit(',') {
                let ip = parse(entry)?;
                if !self.trusted.contains(ip) {
                    return Some(ip);
                }
            }
        }
        None
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// One `X-Forwarded-For` entry: an address, optionally bracketed (IPv6) and with a port.
fn parse_xff_entry(entry: &str) -> Option<IpAddr> {
    parse_node(entry.trim_matches([' ', '\t']))
}

/// One RFC 7239 `Forwarded` element (`for=...;proto=...;by=...`): its `for` node. An element
/// without `for`, or with an `unknown` or obfuscated node, is garbage.
fn parse_forwarded_element(element: &str) -> Option<IpAddr> {
    let mut found = None;
    for pair in element.split(';') {
        let (name, value) = pair.trim_matches([' ', '\t']).split_once('=')?;
        if name.eq_ignore_ascii_case("for") {
            if found.is_some() {
                return None;
            }
            let value = match value.strip_prefix('"') {
                Some(quoted) => quoted.strip_suffix('"')?,
                None => value,
            };
            // Quoted pairs never occur in a valid node.
            if value.contains(['\\', '"']) {
                return None;
            }
            found = Some(parse_node(value)?);
        }
    }
    found
}

/// `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:80`, normalized.
fn parse_node(node: &str) -> Option<IpAddr> {
    let ip = if let Some(rest) = node.strip_prefix('[') {
        let (v6, port) = rest.split_once(']')?;
        if !(port.is_empty() || port.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        IpAddr::V6(v6.parse::<Ipv6Addr>().ok()?)
    } else if let Ok(ip) = node.parse::<IpAddr>() {
        ip
    } else {
        let (v4, port) = node.split_once(':')?;
        if !is_port(port) {
            return None;
        }
        IpAddr::V4(v4.parse::<Ipv4Addr>().ok()?)
    };
    Some(ip.to_canonical())
}

/// A port: 1 to 5 digits, at most 65535 (`u16::from_str` alone would accept a leading `+`).
fn is_port(s: &str) -> bool {
    (1..=5).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit()) && s.parse::<u16>().is_ok()
}

/// A request's client: its address and the prefix its rate-limit key is grouped by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientIp {
    addr: IpAddr,
    prefix: u8,
}

/// The longest key [`ClientIp::key`] writes: a full IPv6 address and `/128`, with room to spare.
const MAX_IP_KEY: usize = 48;

impl ClientIp {
    /// The client's address (IPv4-mapped IPv6 as IPv4).
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The network the client is grouped in for rate limiting (`/64` for IPv6 by default).
    pub fn network(&self) -> Cidr {
        // `prefix` is clamped to the family's length when the resolver is configured.
        Cidr::new(self.addr, self.prefix).unwrap_or_else(|| Cidr::from(IpNet::from(self.addr)))
    }

    /// The rate-limit key: `203.0.113.7` for a whole address, `2001:db8:1:2::/64` for a group
    /// (the forms a policy's allow and deny lists name). Written into a fixed buffer: no
    /// allocation.
    pub fn key(&self) -> IpKey {
        let mut key = IpKey {
            buf: [0u8; MAX_IP_KEY],
            len: 0,
        };
        let network = self.network();
        match network.network() {
            // The common case, by hand: `fmt` machinery costs more than the rest of the key.
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        key.push(b'.');
                    }
                    key.push_decimal(octet);
                }
                if network.prefix() < 32 {
                    key.push(b'/');
                    key.push_decimal(network.prefix());
                }
            }
            IpAddr::V6(v6) => {
                let mut cursor = &mut key.buf[..];
                // The buffer fits the longest form, so the writes cannot fail.
                let _ = if network.prefix() == 128 {
                    write!(cursor, "{v6}")
                } else {
                    write!(cursor, "{network}")
                };
                key.len = MAX_IP_KEY - cursor.len();
            }
        }
        key
    }
}

impl fmt::Display for ClientIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.addr.fmt(f)
    }
}

/// The bytes of a client-IP rate-limit key, on the stack ([`ClientIp::key`]).
#[derive(Clone, Copy)]
pub struct IpKey {
    buf: [u8; MAX_IP_KEY],
    len: usize,
}

impl IpKey {
    /// Appends `byte` (at most 19 bytes of an IPv4 key are ever written).
    fn push(&mut self, byte: u8) {
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = byte;
            self.len += 1;
        }
    }

    /// Appends `n` in decimal, without leading zeros.
    fn push_decimal(&mut self, n: u8) {
        if n >= 100 {
            self.push(b'0' + n / 100);
        }
        if n >= 10 {
            self.push(b'0' + n / 10 % 10);
        }
        self.push(b'0' + n % 10);
    }

    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or_default()
    }
}

impl fmt::Debug for IpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&String::from_utf8_lossy(self.as_bytes()), f)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(name: &str, values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    fn resolver(trusted: &[&str]) -> ClientIpResolver {
        ClientIpResolver::new(TrustedProxies::parse(trusted).unwrap())
    }

    #[test]
    fn xff_walks_from_the_right_skipping_trusted_hops_and_garbage_means_the_peer() {
        let r = resolver(&["10.0.0.0/8", "fd00::/8"]);
        let peer = ip("10.0.0.1");
        let h = headers(
            "x-forwarded-for",
            &["6.6.6.6, 5.5.5.5", "10.0.0.3,fd00::1 , 10.0.0.2"],
        );
        assert_eq!(r.resolve(peer, &h).addr(), ip("5.5.5.5"));
        // Absent header: the peer.
        assert_eq!(r.resolve(peer, &HeaderMap::new()).addr(), peer);
        // Ports, brackets and mapped addresses; only trusted hops, or garbage (ports above
        // 65535, or not plain digits, among it), make the peer the client.
        for (v, want) in [
            ("10.0.0.9, 10.0.0.2", "10.0.0.1"),
            ("1.2.3.4:8080", "1.2.3.4"),
            ("[2001:db8::1]:443", "2001:db8::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("::ffff:1.2.3.4", "1.2.3.4"),
            ("1.2.3.4:65535", "1.2.3.4"),
            ("1.2.3.4:0", "1.2.3.4"),
            ("1.2.3.4:00080", "1.2.3.4"),
            ("[2001:db8::1]:65535", "2001:db8::1"),
            // Garbage left of the first untrusted hop is never reached.
            ("garbage, 1.2.3.4", "1.2.3.4"),
            ("garbage", "10.0.0.1"),
            ("", "10.0.0.1"),
            ("1.2.3.4, ", "10.0.0.1"),
            ("1.2.3.4,,10.0.0.2", "10.0.0.1"),
            ("1.2.3.4:99999999", "10.0.0.1"),
            ("1.2.3.4:65536", "10.0.0.1"),
            ("1.2.3.4:99999", "10.0.0.1"),
            ("[2001:db8::1]:65536", "10.0.0.1"),
            ("1.2.3.4:+80", "10.0.0.1"),
            ("1.2.3.4:", "10.0.0.1"),
            ("1.2.3.4:080a", "10.0.0.1"),
            ("1.2.3.4:000080", "10.0.0.1"),
            ("[2001:db8::1]:", "10.0.0.1"),
            ("[2001:db8::1]80", "10.0.0.1"),
            ("1.2.3.4:80:80", "10.0.0.1"),
            ("[1.2.3.4]", "10.0.0.1"),
            ("unknown", "10.0.0.1"),
            ("1.2.3.4 5.6.7.8", "10.0.0.1"),
        ] {
            let h = headers("x-forwarded-for", &[v]);
            assert_eq!(r.resolve(peer, &h).addr(), ip(want), "{v:?}");
        }
        // Non-UTF-8 bytes.
        let mut h = HeaderMap::new();
        h.insert(
            X_FORWARDED_FOR,
            http::HeaderValue::from_bytes(b"1.2.3.4\xff").unwrap(),
        );
        assert_eq!(r.resolve(peer, &h).addr(), peer);
    }

    #[test]
    fn rfc7239_forwarded() {
        let r = resolver(&["10.0.0.0/8"]).forwarded_header(ForwardedHeader::Forwarded);
        let peer = ip("10.0.0.1");
        for (v, want) in [
            ("for=192.0.2.60;proto=http;by=203.0.113.43", "192.0.2.60"),
            ("For=\"[2001:db8:cafe::17]:4711\"", "2001:db8:cafe::17"),
            ("for=\"192.0.2.60:80\"", "192.0.2.60"),
            ("for=198.51.100.1, for=10.0.0.5;proto=https", "198.51.100.1"),
            ("for=unknown, for=198.51.100.1", "198.51.100.1"),
            // Garbage: unknown, obfuscated, missing `for`, duplicated `for`, bad quoting.
            ("for=unknown", "10.0.0.1"),
            ("for=_hidden", "10.0.0.1"),
            ("for=\"_SEVKISEK\"", "10.0.0.1"),
            ("proto=https", "10.0.0.1"),
            ("for=1.2.3.4;for=5.6.7.8", "10.0.0.1"),
            ("for=\"1.2.3.4", "10.0.0.1"),
            ("for=\"1.2.3.\\4\"", "10.0.0.1"),
            ("for=[2001:db8::1]", "2001:db8::1"),
            ("for=\"192.0.2.60:65536\"", "10.0.0.1"),
            ("for=\"[2001:db8::1]:99999\"", "10.0.0.1"),
            ("for", "10.0.0.1"),
        ] {
            let h = headers("forwarded", &[v]);
            assert_eq!(r.resolve(peer, &h).addr(), ip(want), "{v:?}");
        }
        // The resolver reading `Forwarded` ignores `X-Forwarded-For`, and vice versa.
        let h = headers("x-forwarded-for", &["1.2.3.4"]);
        assert_eq!(r.resolve(peer, &h).addr(), peer);
        let h = headers("forwarded", &["for=1.2.3.4"]);
        assert_eq!(resolver(&["10.0.0.0/8"]).resolve(peer, &h).addr(), peer);
    }

    #[test]
    fn ipv4_keys_match_the_display_forms() {
        let none = HeaderMap::new();
        for addr in [
            "0.0.0.0",
            "255.255.255.255",
            "10.0.9.99",
            "100.20.3.109",
            "1.10.100.200",
        ] {
            for prefix in 0..=32 {
                let r = ClientIpResolver::default().ipv4_prefix(prefix);
                let client = r.resolve(ip(addr), &none);
                let network = client.network();
                let want = if prefix == 32 {
                    network.network().to_string()
                } else {
                    network.to_string()
                };
                assert_eq!(client.key().as_bytes(), want.as_bytes(), "{addr}/{prefix}");
            }
        }
    }

    #[test]
    fn keys_group_ipv6_by_64() {
        let default = ClientIpResolver::default();
        let wide = ClientIpResolver::default().ipv6_prefix(200).ipv4_prefix(24);
        let v6_127 = ClientIpResolver::default().ipv6_prefix(127);
        let max = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff";
        for (r, addr, want) in [
            (&default, "203.0.113.7", "203.0.113.7"),
            (&default, "::ffff:203.0.113.7", "203.0.113.7"),
            (&default, "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
            (&default, "2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),
            (&wide, max, max),
            (&wide, "203.0.113.7", "203.0.113.0/24"),
            (&v6_127, max, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127"),
        ] {
            let key = r.resolve(ip(addr), &HeaderMap::new()).key();
            assert_eq!(key.as_bytes(), want.as_bytes(), "{addr}");
        }
    }
}
