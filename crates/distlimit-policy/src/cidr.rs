//! [`Cidr`]: the one parser of IP networks, for policies' allow and deny lists and for the
//! tower layer's trusted proxies.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

/// An IP network in CIDR notation, such as `10.0.0.0/8` or `2001:db8::/32`: a thin wrapper of
/// [`ipnet::IpNet`] that parses the forms operators write and compares the way the tower
/// layer's client IP resolver sees clients.
///
/// A bare address is a network of one (`/32` or `/128`). Host bits below the prefix are
/// cleared. IPv4-mapped IPv6 networks (`::ffff:10.0.0.0/104`) are stored as IPv4, as the
/// resolver treats IPv4-mapped clients as IPv4.
///
/// ```
/// use distlimit_policy::Cidr;
/// use ipnet::IpNet;
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
        self.0.contains(&ip.to_canonical())
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
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
}
