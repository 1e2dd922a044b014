//! Allow and deny lists take CIDRs for IP keys: the key strings the tower layer builds
//! (`203.0.113.7` for an IPv4 client, IPv4-mapped IPv6 clients included; `2001:db8:1:2::/64`
//! for an IPv6 client grouped by /64) match a listed network when it contains them; exact keys
//! still work; bad CIDRs are typed errors naming the policy and the list.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use distlimit_memory::MemoryStore;
use distlimit_policy::{Field, Limiter, Listed, PolicySet};

fn limiter(lists: &str) -> Limiter<MemoryStore> {
    let text = format!(
        "[[policy]]\nname = \"api\"\n{lists}\ntiers = [ {{ name = \"t\", limit = 1, per = \"1h\" }} ]"
    );
    Limiter::new(
        Arc::new(MemoryStore::new()),
        PolicySet::from_toml_str(&text).unwrap(),
    )
}

fn listed(l: &Limiter<MemoryStore>, key: &str) -> Option<Listed> {
    l.check_now("api", key.as_bytes(), 1)
        .unwrap()
        .unwrap()
        .listed()
}

#[test]
fn ipv4_keys_match_the_networks_that_contain_them() {
    let l = limiter(
        r#"allow = ["10.0.0.0/8", "health-checker", "192.0.2.7"]
deny = ["10.6.6.0/24", "203.0.113.9"]"#,
    );
    assert_eq!(listed(&l, "10.1.2.3"), Some(Listed::Allow));
    // The most specific network wins.
    assert_eq!(listed(&l, "10.6.6.6"), Some(Listed::Deny));
    assert_eq!(listed(&l, "11.0.0.1"), None);
    // Exact keys and bare addresses.
    assert_eq!(listed(&l, "health-checker"), Some(Listed::Allow));
    assert_eq!(listed(&l, "192.0.2.7"), Some(Listed::Allow));
    assert_eq!(listed(&l, "192.0.2.8"), None);
    assert_eq!(listed(&l, "203.0.113.9"), Some(Listed::Deny));
    // A group key (the layer with an IPv4 prefix below 32) inside the network, and one wider.
    assert_eq!(listed(&l, "10.9.0.0/16"), Some(Listed::Allow));
    assert_eq!(listed(&l, "10.0.0.0/7"), None);
    // An IPv4-mapped IPv6 client: the layer keys it as IPv4; written mapped, it matches too.
    assert_eq!(listed(&l, "::ffff:10.1.2.3"), Some(Listed::Allow));
    // Not an address: never a network match.
    assert_eq!(listed(&l, "10.1.2.3.example"), None);
    // A leading zero is not an address (std's and `Cidr`'s reading, the layer's trusted
    // proxies included): listed, it is an exact key; as a key, it matches no network.
    assert_eq!(listed(&l, "010.1.2.3"), None);
    let l = limiter(r#"deny = ["010.1.2.3"]"#);
    assert_eq!(listed(&l, "010.1.2.3"), Some(Listed::Deny));
    assert_eq!(listed(&l, "10.1.2.3"), None);
}

#[test]
fn ipv6_keys_match_by_prefix() {
    let l = limiter(
        r#"allow = ["2001:db8::/32", "::ffff:172.16.0.0/108"]
deny = ["2001:db8:bad::/48"]"#,
    );
    // The layer's key for an IPv6 client: its /64, as text.
    assert_eq!(listed(&l, "2001:db8:1:2::/64"), Some(Listed::Allow));
    assert_eq!(listed(&l, "2001:db8:bad:1::/64"), Some(Listed::Deny));
    assert_eq!(listed(&l, "2001:db9::/64"), None);
    // A whole address (the layer's key with the IPv6 prefix at 128).
    assert_eq!(listed(&l, "2001:db8::1"), Some(Listed::Allow));
    // A mapped network in the list is the IPv4 network 172.16.0.0/12.
    assert_eq!(listed(&l, "172.20.1.1"), Some(Listed::Allow));
    assert_eq!(listed(&l, "172.32.0.1"), None);
}

#[test]
fn bad_cidrs_are_errors_naming_the_policy_and_the_list() {
    for (lists, field) in [
        (r#"allow = ["10.0.0.0/33"]"#, Field::Allow),
        (r#"deny = ["2001:db8::/129"]"#, Field::Deny),
        (r#"allow = ["10.0.0.300/8"]"#, Field::Allow),
        (
            r#"allow = ["10.0.0.0/8"]
deny = ["10.1.2.3/8"]"#,
            Field::Deny,
        ),
    ] {
        let text = format!(
            "[[policy]]\nname = \"api\"\n{lists}\ntiers = [ {{ name = \"t\", limit = 1, per = \"1h\" }} ]"
        );
        let e = PolicySet::from_toml_str(&text).unwrap_err();
        assert_eq!(
            (e.policy(), e.field()),
            (Some("api"), field),
            "{lists}: {e}"
        );
    }
    // Keys with a slash that are not CIDRs stay exact keys.
    let l = limiter(r#"allow = ["tenant/42", "v2/10"]"#);
    assert_eq!(listed(&l, "tenant/42"), Some(Listed::Allow));
    assert_eq!(listed(&l, "v2/10"), Some(Listed::Allow));
}
