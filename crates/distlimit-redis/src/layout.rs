//! [`KeyLayout`]: where a (policy, key) pair's state lives in Redis, `<prefix>:{<identity>}:<policy>`.

use distlimit_core::{Error, Key};
use sha2::{Digest, Sha256};
use smallvec::SmallVec;

use crate::config::config_error;

/// The prefix of every Redis key unless [`RedisStoreBuilder::prefix`](crate::RedisStoreBuilder::prefix)
/// says otherwise.
pub const DEFAULT_PREFIX: &str = "distlimit";

/// The longest prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 256;

/// The number of hash slots of a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16384;

/// Redis keys up to this length are built on the stack.
const INLINE_KEY: usize = 192;

/// How a request's (policy, key) pair is named in Redis: `<prefix>:{<identity>}:<policy>`.
///
/// This is a storage format: changing it orphans every existing state (the old keys expire by
/// their TTL, and the limits start over).
///
/// * `prefix`: [`DEFAULT_PREFIX`] unless configured; any bytes except `{` and `}`, at most
///   [`MAX_PREFIX_LEN`].
/// * `identity`: the request's key, escaped: `%` → `%25`, `{` → `%7B`, `}` → `%7D`, every other
///   byte as it is (NUL, newlines, invalid UTF-8 included). Or, with
///   [`hash_identities`](crate::RedisStoreBuilder::hash_identities), the lowercase hex SHA-256 of
///   the key's bytes (64 characters), so no personal data (user ids, IP addresses) appears in key
///   names, `SCAN` output or `MONITOR`.
/// * `policy`: the request's [policy](distlimit_core::Request::policy) name, escaped the same
///   way (empty for the unnamed policy).
///
/// Why it is safe:
///
/// * **One slot per identity.** Redis Cluster hashes only what lies between the first `{` and
///   the first `}` after it. The prefix has no braces and the escaped identity has none, so the
///   hash tag is exactly the escaped identity: every policy of one identity is in one slot (a
///   batch over them is one script on one node, never `CROSSSLOT`), and different identities
///   spread over the masters.
/// * **No collisions.** The escaping is injective (`%` itself is escaped), and the layout can be
///   parsed back: the identity ends at the only `}`. So two different (policy, key) pairs never
///   share a Redis key. In hashed mode, two identities share a name only on a SHA-256 collision.
///   Do not use one prefix for a hashed and an unhashed store: a 64-hex-digit key of the one
///   could name the hash of a key of the other.
///
/// ```
/// use distlimit_core::Key;
/// use distlimit_redis::KeyLayout;
///
/// let layout = KeyLayout::new("rl", false).unwrap();
/// let key = Key::new("user:{42}%").unwrap();
/// assert_eq!(layout.redis_key("per-day", key), b"rl:{user:%7B42%7D%25}:per-day");
///
/// let hashed = KeyLayout::new("rl", true).unwrap();
/// assert_eq!(
///     hashed.redis_key("", Key::new("abc").unwrap()),
///     b"rl:{ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad}:"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyLayout {
    prefix: Box<[u8]>,
    hash_identities: bool,
}

impl Default for KeyLayout {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.as_bytes().into(),
            hash_identities: false,
        }
    }
}

impl KeyLayout {
    /// A layout under `prefix`, hashing identities if `hash_identities`. A prefix containing `{`
    /// or `}` (which would move the Cluster hash tag), or longer than [`MAX_PREFIX_LEN`], is an
    /// [`Error::Config`].
    pub fn new(prefix: impl AsRef<[u8]>, hash_identities: bool) -> Result<Self, Error> {
        let prefix = prefix.as_ref();
        if prefix.iter().any(|&b| b == b'{' || b == b'}') {
            return Err(config_error(format!(
                "the key prefix \"{}\" contains a brace, which would change the Redis Cluster \
                 hash tag",
                prefix.escape_ascii()
            )));
        }
        if prefix.len() > MAX_PREFIX_LEN {
            return Err(config_error(format!(
                "the key prefix is {} bytes long, the maximum is {MAX_PREFIX_LEN}",
                prefix.len()
            )));
        }
        Ok(Self {
            prefix: prefix.into(),
            hash_identities,
        })
    }

    /// The prefix.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The Redis key holding the state of `key` under `policy`.
    pub fn redis_key(&self, policy: &str, key: Key<'_>) -> Vec<u8> {
        self.key_buf(policy.as_bytes(), key.as_bytes()).into_vec()
    }

    /// The Cluster hash slot of every policy of `key` (see [`hash_slot`]).
    pub fn slot(&self, key: Key<'_>) -> u16 {
        hash_slot(&self.key_buf(b"", key.as_bytes()))
    }

    /// Appends the Redis key of (`policy`, `key`) to `out`.
    pub(crate) fn write(&self, policy: &[u8], key: &[u8], out: &mut KeyBuf) {
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(b":{");
        if self.hash_identities {
            out.extend_from_slice(&sha256_hex(key));
        } else {
            escape(key, out);
        }
        out.extend_from_slice(b"}:");
        escape(policy, out);
    }

    /// The Redis key of (`policy`, `key`) in a stack buffer (spilling to the heap only for long
    /// keys).
    pub(crate) fn key_buf(&self, policy: &[u8], key: &[u8]) -> KeyBuf {
        let mut buf = KeyBuf::new();
        self.write(policy, key, &mut buf);
        buf
    }
}

/// Redis keys under construction: on the stack up to [`INLINE_KEY`] bytes, else on the heap.
pub(crate) type KeyBuf = SmallVec<[u8; INLINE_KEY]>;

/// `%` → `%25`, `{` → `%7B`, `}` → `%7D`; runs of other bytes are copied as they are.
fn escape(bytes: &[u8], out: &mut KeyBuf) {
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let replacement: &[u8] = match b {
            b'%' => b"%25",
            b'{' => b"%7B",
            b'}' => b"%7D",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(replacement);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

fn sha256_hex(bytes: &[u8]) -> [u8; 64] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(bytes);
    let mut out = [0u8; 64];
    for (pair, byte) in out.chunks_exact_mut(2).zip(digest.iter()) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0x0f)];
    }
    out
}

/// The Redis Cluster hash slot of a Redis key, as the Cluster specification defines it: CRC16
/// (XMODEM: polynomial 0x1021, initial value 0) of the hash tag (the bytes between the first `{`
/// and the first `}` after it, when not empty) or else of the whole key, modulo 16384.
///
/// ```
/// use distlimit_redis::hash_slot;
///
/// // The specification's check value: CRC16("123456789") = 0x31C3.
/// assert_eq!(hash_slot(b"123456789"), 0x31C3 % 16384);
/// assert_eq!(hash_slot(b"a:{user}:x"), hash_slot(b"b:{user}:y"));
/// ```
pub fn hash_slot(redis_key: &[u8]) -> u16 {
    crc16(hash_tag(redis_key).unwrap_or(redis_key)) % CLUSTER_SLOTS
}

fn crc16(bytes: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(bytes)
}

fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let close = key[open + 1..].iter().position(|&b| b == b'}')?;
    let tag = &key[open + 1..open + 1 + close];
    (!tag.is_empty()).then_some(tag)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn key(bytes: &[u8]) -> Key<'_> {
        Key::new(bytes).unwrap()
    }

    fn pairs() -> Vec<(Vec<u8>, String)> {
        let identities: Vec<&[u8]> = vec![
            b"a",
            b"a}b",
            b"a}",
            b"}",
            b"{",
            b"{}",
            b"{x}",
            b"%7Bx%7D",
            b"%",
            b"%25",
            b"%7B",
            b"a%7Db",
            b"a}:b",
            b"a:b",
            b"a\0b",
            b"\0",
            b"\xff\xfe",
            "é".as_bytes(),
            "e\u{301}".as_bytes(),
            b"a}:",
            b"user:{42}",
        ];
        let policies = ["", "b", ":b", "}:b", "x", "{x}", "%7Bx%7D", "per-day", "é"];
        let pairs = identities
            .iter()
            .flat_map(|id| policies.map(|p| (id.to_vec(), p.to_owned())));
        pairs.collect()
    }

    #[test]
    fn named_examples() {
        let layout = KeyLayout::default();
        // `a}b` with no policy vs `a` with policy `b`: the brace cannot end the tag early.
        assert_eq!(layout.redis_key("", key(b"a}b")), b"distlimit:{a%7Db}:");
        assert_eq!(layout.redis_key("b", key(b"a")), b"distlimit:{a}:b");
        assert_eq!(layout.redis_key("", key(b"{x}")), b"distlimit:{%7Bx%7D}:");
        assert_eq!(
            layout.redis_key("", key(b"%7Bx%7D")),
            b"distlimit:{%257Bx%257D}:"
        );
        assert_eq!(
            layout.redis_key("{p}", key(b"\0\xff")),
            b"distlimit:{\0\xff}:%7Bp%7D"
        );
    }

    #[test]
    fn layout_is_injective_and_parses_back() {
        fn unescape(s: &[u8]) -> Vec<u8> {
            let mut out = Vec::new();
            let mut i = 0;
            while i < s.len() {
                match &s[i..] {
                    [b'%', b'2', b'5', ..] => (out.push(b'%'), i += 3),
                    [b'%', b'7', b'B', ..] => (out.push(b'{'), i += 3),
                    [b'%', b'7', b'D', ..] => (out.push(b'}'), i += 3),
                    [b, ..] => (out.push(*b), i += 1),
                    [] => unreachable!(),
                };
            }
            out
        }
        for hash in [false, true] {
            let layout = KeyLayout::new("p:x", hash).unwrap();
            let mut seen = HashSet::new();
            for (id, policy) in pairs() {
                let k = layout.redis_key(&policy, key(&id));
                assert!(seen.insert(k.clone()), "{hash}: {} twice", k.escape_ascii());
                let rest = k.strip_prefix(b"p:x:{".as_slice()).unwrap();
                let close = rest.iter().position(|&b| b == b'}').unwrap();
                if !hash {
                    assert_eq!(unescape(&rest[..close]), id);
                }
                let tail = rest[close..].strip_prefix(b"}:".as_slice()).unwrap();
                assert!(!tail.contains(&b'{') && !tail.contains(&b'}'));
                assert_eq!(unescape(tail), policy.as_bytes());
            }
        }
    }

    #[test]
    fn one_identity_is_one_slot_across_policies() {
        for hash in [false, true] {
            let layout = KeyLayout::new("distlimit", hash).unwrap();
            for (id, _) in pairs() {
                let slot = layout.slot(key(&id));
                for policy in ["", "second", "minute", "day", "{x}", "}", "%"] {
                    let k = layout.redis_key(policy, key(&id));
                    assert_eq!(hash_slot(&k), slot, "{}", k.escape_ascii());
                    // The redis crate's own slot computation agrees.
                    assert_eq!(
                        redis::cluster_routing::Slot::new(slot),
                        Some(redis::cluster_routing::Slot::for_key(&k))
                    );
                }
            }
        }
    }

    #[test]
    fn identities_spread_over_slots() {
        let layout = KeyLayout::default();
        let slots: HashSet<u16> = (0..1000)
            .map(|i| layout.slot(key(format!("user:{i}").as_bytes())))
            .collect();
        assert!(slots.len() > 900, "{}", slots.len());
    }

    #[test]
    fn crc16_matches_the_specification() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        // Examples from the Cluster specification.
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(
            hash_slot(b"foo{}{bar}"),
            crc16(b"foo{}{bar}") % CLUSTER_SLOTS
        );
        assert_eq!(hash_slot(b"foo{{bar}}zap"), crc16(b"{bar") % CLUSTER_SLOTS);
        assert_eq!(hash_slot(b"foo{bar}{zap}"), crc16(b"bar") % CLUSTER_SLOTS);
        for k in [
            &b"foo{}{bar}"[..],
            b"foo{{bar}}zap",
            b"x{\0\xff}y",
            b"plain",
        ] {
            assert_eq!(
                redis::cluster_routing::Slot::new(hash_slot(k)),
                Some(redis::cluster_routing::Slot::for_key(k))
            );
        }
    }

    #[test]
    fn prefixes_with_braces_are_refused() {
        for bad in ["a{b", "}", "{x}"] {
            assert!(matches!(
                KeyLayout::new(bad, false),
                Err(Error::Config { .. })
            ));
        }
        assert!(KeyLayout::new(vec![b'p'; MAX_PREFIX_LEN + 1], false).is_err());
        assert!(KeyLayout::new("", false).is_ok());
    }

    #[test]
    fn key_buffer_spills_to_the_heap_correctly() {
        let layout = KeyLayout::default();
        for len in [1, 100, 170, 180, 181, 190, 200, 1024] {
            let id = vec![b'{'; len];
            let escaped = "%7B".repeat(len);
            let want = format!("distlimit:{{{escaped}}}:policy");
            assert_eq!(layout.key_buf(b"policy", &id).as_slice(), want.as_bytes());
        }
    }
}
