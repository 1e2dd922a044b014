//! Forwarding headers: believed only from trusted proxies, walked from the right, garbage falls
//! back to the peer. Over loopback TCP (the peer is 127.0.0.1) and as properties.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use distlimit_tower::{ClientIpResolver, ForwardedHeader, RateLimitLayer, TrustedProxies};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use proptest::prelude::*;
use support::{frozen_store, limiter, send, serve};

/// Sends `POST /login` (1 per minute per key) with `headers` through a layer trusting
/// `trusted` and reading `header`; returns which keys were charged among `candidates`.
async fn charged(
    trusted: &[&str],
    header: ForwardedHeader,
    headers: &[(&str, &str)],
    candidates: &[&str],
) -> Vec<String> {
    let limiter = limiter(frozen_store());
    let resolver =
        ClientIpResolver::new(TrustedProxies::parse(trusted).unwrap()).forwarded_header(header);
    let layer = RateLimitLayer::builder(limiter.clone(), "login")
        .client_ip(resolver)
        .build();
    let addr = serve(layer).await;
    assert_eq!(
        send(addr, Method::POST, "/login", headers).await.status,
        StatusCode::OK
    );
    let mut out = Vec::new();
    for key in candidates {
        if !limiter
            .peek("login", key.as_bytes())
            .await
            .unwrap()
            .is_allowed()
        {
            out.push((*key).to_owned());
        }
    }
    out
}

const XFF: ForwardedHeader = ForwardedHeader::XForwardedFor;
const FWD: ForwardedHeader = ForwardedHeader::Forwarded;
const KEYS: &[&str] = &[
    "127.0.0.1",
    "203.0.113.1",
    "203.0.113.2",
    "2001:db8:1:2::/64",
];

#[tokio::test]
async fn headers_from_an_untrusted_peer_change_nothing() {
    let spoof = [
        ("x-forwarded-for", "203.0.113.1, 203.0.113.2"),
        ("forwarded", "for=203.0.113.1, for=203.0.113.2"),
    ];
    // Nothing trusted (the default), or only other networks.
    for trusted in [&[][..], &["10.0.0.0/8", "::1/128"][..]] {
        for header in [XFF, FWD] {
            assert_eq!(charged(trusted, header, &spoof, KEYS).await, ["127.0.0.1"]);
        }
    }
}

#[tokio::test]
async fn a_trusted_proxy_names_the_rightmost_untrusted_hop() {
    let trusted = &["127.0.0.0/8", "10.0.0.0/8"];
    let xff = [("x-forwarded-for", "203.0.113.1, 203.0.113.2, 10.0.0.7")];
    assert_eq!(charged(trusted, XFF, &xff, KEYS).await, ["203.0.113.2"]);
    let fwd = [(
        "forwarded",
        r#"for=203.0.113.1, for="[2001:db8:1:2::99]:4711";proto=https, for=10.0.0.7"#,
    )];
    assert_eq!(
        charged(trusted, FWD, &fwd, KEYS).await,
        ["2001:db8:1:2::/64"]
    );
    // Each resolver reads only its own header: a client's `Forwarded` passed through by an
    // `X-Forwarded-For` proxy is ignored.
    let both = [xff[0], ("forwarded", "for=203.0.113.1")];
    assert_eq!(charged(trusted, XFF, &both, KEYS).await, ["203.0.113.2"]);
}

#[tokio::test]
async fn garbage_falls_back_to_the_peer() {
    let trusted = &["127.0.0.0/8"];
    for xff in [
        "garbage",
        "203.0.113.1, nonsense",
        "203.0.113.1,,",
        "unknown",
        "[::1",
        // A port above 65535 makes the entry garbage, not an address.
        "203.0.113.1:65536",
        "[2001:db8::1]:99999",
    ] {
        let headers = [("x-forwarded-for", xff)];
        assert_eq!(
            charged(trusted, XFF, &headers, KEYS).await,
            ["127.0.0.1"],
            "{xff}"
        );
    }
    for fwd in [
        "for=unknown",
        "for=_hidden",
        "proto=http",
        "for=\"203.0.113.1",
        "for=203.0.113.1;for=203.0.113.2",
        "for=\"203.0.113.1:65536\"",
    ] {
        let headers = [("forwarded", fwd)];
        assert_eq!(
            charged(trusted, FWD, &headers, KEYS).await,
            ["127.0.0.1"],
            "{fwd}"
        );
    }
}

fn trusted() -> TrustedProxies {
    TrustedProxies::parse(["10.0.0.0/8", "fd00::/8"]).unwrap()
}

/// One `X-Forwarded-For` entry: an address (trusted or not, IPv4 or IPv6, in any accepted
/// spelling), or junk that is never an address.
#[derive(Clone, Debug)]
enum Entry {
    Ip(IpAddr, String),
    Junk(String),
}

fn entry() -> impl Strategy<Value = Entry> {
    let v4 = any::<u32>().prop_map(|b| IpAddr::V4(Ipv4Addr::from(b)));
    let trusted_v4 = any::<u32>().prop_map(|b| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | (b >> 8))));
    let v6 = any::<u128>().prop_map(|b| IpAddr::V6(Ipv6Addr::from(b)));
    let trusted_v6 =
        any::<u128>().prop_map(|b| IpAddr::V6(Ipv6Addr::from((0xfd << 120) | (b >> 8))));
    let ip = prop_oneof![v4, trusted_v4.clone(), trusted_v4, v6, trusted_v6];
    let junk = prop_oneof![
        "[g-z_ ]{0,8}",
        Just("1.2.3".to_owned()),
        Just("[::1".to_owned()),
        Just("1.2.3.4:99999999".to_owned()),
        (any::<Ipv4Addr>(), 65536..100_000u32).prop_map(|(v4, port)| format!("{v4}:{port}")),
        (any::<Ipv6Addr>(), 65536..100_000u32).prop_map(|(v6, port)| format!("[{v6}]:{port}")),
        Just("[1.2.3.4]".to_owned()),
        Just("1.2.3.4 5.6.7.8".to_owned()),
    ];
    prop_oneof![
        4 => (ip, 0..4u8, 0..65536u32, " ?").prop_map(|(ip, form, port, pad)| {
            let text = match (ip, form) {
                (IpAddr::V6(v6), 1) => format!("[{v6}]"),
                (IpAddr::V6(v6), 2) => format!("[{v6}]:{port}"),
                (IpAddr::V4(v4), 2) => format!("{v4}:{port}"),
                (IpAddr::V4(v4), 3) => format!("::ffff:{v4}"),
                (ip, _) => ip.to_string(),
            };
            Entry::Ip(ip, format!("{pad}{text}{pad}"))
        }),
        1 => junk.prop_map(Entry::Junk),
    ]
}

/// The reference: the rightmost untrusted address; the peer for junk on the way or none.
fn model(entries: &[Entry], peer: IpAddr) -> IpAddr {
    for e in entries.iter().rev() {
        match e {
            Entry::Ip(ip, _) if trusted().contains(*ip) => continue,
            Entry::Ip(ip, _) => return *ip,
            Entry::Junk(_) => return peer,
        }
    }
    peer
}

fn render(entries: &[Entry]) -> String {
    let texts: Vec<&str> = entries
        .iter()
        .map(|e| match e {
            Entry::Ip(_, t) | Entry::Junk(t) => t.as_str(),
        })
        .collect();
    texts.join(",")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn xff_walk_never_returns_a_trusted_hop(
        entries in proptest::collection::vec(entry(), 0..8),
        split in 0..8usize,
        trusted_peer in any::<bool>(),
    ) {
        let peer: IpAddr = if trusted_peer { "10.0.0.1" } else { "192.0.2.1" }.parse().unwrap();
        let resolver = ClientIpResolver::new(trusted());
        // The list split over two header lines must read as one.
        let split = split.min(entries.len());
        let mut headers = HeaderMap::new();
        for part in [&entries[..split], &entries[split..]] {
            if !part.is_empty() {
                headers.append("x-forwarded-for", HeaderValue::from_str(&render(part)).unwrap());
            }
        }
        let got = resolver.resolve(peer, &headers).addr();
        if trusted_peer {
            prop_assert!(got == peer || !trusted().contains(got));
            prop_assert_eq!(got, model(&entries, peer));
        } else {
            prop_assert_eq!(got, peer);
        }
    }

    #[test]
    fn arbitrary_header_bytes_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..64),
        forwarded in any::<bool>(),
    ) {
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let header = if forwarded { ForwardedHeader::Forwarded } else { ForwardedHeader::XForwardedFor };
        let resolver = ClientIpResolver::new(trusted()).forwarded_header(header);
        if let Ok(value) = HeaderValue::from_bytes(&bytes) {
            let mut headers = HeaderMap::new();
            headers.insert(if forwarded { "forwarded" } else { "x-forwarded-for" }, value);
            let got = resolver.resolve(peer, &headers).addr();
            prop_assert!(got == peer || !trusted().contains(got));
        }
    }
}
