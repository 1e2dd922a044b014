//! The client's IP address, taken from forwarding headers only through trusted proxies
//! ([`ClientIpResolver::resolve`] says how).

use std::fmt;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use http::HeaderMap;
use http::header::{FORWARDED, HeaderName};
use ipnet::IpNet;

/// An IP network in CIDR notation, such as `10.0.0.0/8` or `2001:db8::/32`: a thin wrapper of
/// [`ipnet::IpNet`] (re-exported as [`IpNet`](crate::IpNet)) that parses the forms operators
/// write and compares the way the resolver sees clients.
///
/// A bare address is a network of one (`/32` or `/128`). Host bits below the prefix are
/// cleared. IPv4-mapped IPv6 networks (`::ffff:10.0.0.0/104`) are stored as IPv4, as the
/// resolver treats IPv4-mapped clients as IPv4.
///
/// ```
/// use distlimit_tower::{Cidr, IpNet};
///
/// let net: Cidr = "10.1.2.3/8".parse().unwrap();
/// assert_eq!(net.to_string(), "10.0.0.0/8");
/// assert!(net.contains("::ffff:10.9.9.9".parse().unwrap()));
/// let ipnet: IpNet = net.into();
/// assert_eq!(ipnet.prefix_len(), 8);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cidr(IpNet);

/// Why a [`Cidr`] could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CidrError {
    /// The address part is not an IPv4 or IPv6 address.
    #[error("invalid CIDR {0:?}: not an IP address")]
    Address(String),
    /// The prefix length is not a number, or too long for the address family.
    #[error("invalid CIDR {0:?}: prefix length must be 0..=32 for IPv4 and 0..=128 for IPv6")]
    Prefix(String),
}

impl Cidr {
    /// The network of `addr` with the first `prefix` bits kept, or `None` when `prefix` is too
    /// long for the address family.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        IpNet::new(addr, prefix).ok().map(Self::from)
    }

    /// The network address (host bits cleared).
    pub fn network(&self) -> IpAddr {
        self.0.network()
    }

    /// The prefix length in bits.
    pub fn prefix(&self) -> u8 {
        self.0.prefix_len()
    }

    /// Whether `ip` (IPv4-mapped IPv6 counts as IPv4) lies in this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&normalize(ip))
    }
}

impl From<IpNet> for Cidr {
    /// The network with host bits cleared, an IPv4-mapped IPv6 network as IPv4.
    fn from(net: IpNet) -> Self {
        let net = match net {
            IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
                Some(v4) => IpNet::new(IpAddr::V4(v4), v6.prefix_len() - 96).unwrap_or(net),
                None => net,
            },
            _ => net,
        };
        Self(net.trunc())
    }
}

impl From<Cidr> for IpNet {
    fn from(cidr: Cidr) -> Self {
        cidr.0
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // The address goes through std's parser first: it refuses octets with leading zeros
        // (`010.0.0.0`, octal to some tools), which ipnet's parser reads as decimal.
        let (addr, prefix) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let addr: IpAddr = addr.parse().map_err(|_| CidrError::Address(s.to_owned()))?;
        let net = match prefix {
            // A bare address is a network of one.
            None => IpNet::from(addr),
            Some(_) => s.parse().map_err(|_| CidrError::Prefix(s.to_owned()))?,
        };
        Ok(Self::from(net))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

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
        let peer = normalize(peer);
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
    Some(normalize(ip))
}

/// A port: 1 to 5 digits, at most 65535 (`u16::from_str` alone would accept a leading `+`).
fn is_port(s: &str) -> bool {
    (1..=5).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit()) && s.parse::<u16>().is_ok()
}

/// IPv4-mapped IPv6 (`::ffff:192.0.2.1`) as IPv4.
pub(crate) fn normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
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
        Cidr::new(self.addr, self.prefix).unwrap_or(Cidr(IpNet::from(self.addr)))
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
    fn cidr_parsing() {
        let c: Cidr = "10.1.2.3/8".parse().unwrap();
        assert_eq!(c.to_string(), "10.0.0.0/8");
        assert!(c.contains(ip("10.255.0.1")));
        assert!(c.contains(ip("::ffff:10.0.0.1")));
        assert!(!c.contains(ip("11.0.0.1")));
        assert!(!c.contains(ip("::a00:1")));
        assert_eq!("192.0.2.1".parse::<Cidr>().unwrap().prefix(), 32);
        assert_eq!("2001:db8::1".parse::<Cidr>().unwrap().prefix(), 128);
        assert_eq!(
            "::ffff:10.0.0.0/104".parse::<Cidr>().unwrap(),
            "10.0.0.0/8".parse().unwrap()
        );
        // Through ipnet and back.
        let net: IpNet = "2001:db8::1/32".parse().unwrap();
        let c = Cidr::from(net);
        assert_eq!(c.to_string(), "2001:db8::/32");
        assert_eq!(IpNet::from(c), net.trunc());
        assert_eq!(Cidr::new(ip("10.0.0.1"), 33), None);
        assert_eq!(
            Cidr::new(ip("::ffff:10.0.0.1"), 104).unwrap().to_string(),
            "10.0.0.0/8"
        );
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("255.1.2.3")) && !all.contains(ip("::1")));
        let bad = |s: &str| s.parse::<Cidr>().unwrap_err();
        for s in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "10.0.0.0/-1",
            "10.0.0.0/8/8",
            "10.0.0.0/ 8",
            "::/",
        ] {
            assert_eq!(bad(s), CidrError::Prefix(s.into()));
        }
        for s in [
            "",
            "10.0.0",
            "example.com/8",
            "10.0.0.0.0/8",
            "[::1]/128",
            "010.0.0.0/8",
            "10.0.0.1 /8",
        ] {
            assert_eq!(bad(s), CidrError::Address(s.into()));
        }
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
