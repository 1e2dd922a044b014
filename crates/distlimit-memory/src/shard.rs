//! One of the 64 shards: a swiss table of entries with an incremental sweep and a size cap.

use std::hash::{BuildHasher, Hasher};

use distlimit_core::{Decision, Limit, State};
use hashbrown::HashTable;

/// Keys up to this many bytes live inside the entry; longer ones take one heap allocation.
const INLINE: usize = 22;

/// Buckets examined for expired entries on every insert.
const SWEEP_STEP: usize = 2;

/// Buckets examined for an expired entry before evicting a live one when the shard is full.
const EVICT_SCAN: usize = 32;

/// Equality of short byte strings without a call to libc's `memcmp`.
///
/// Slice `==` compiles to a `memcmp` call when the length is not known at compile time. On this
/// project's benchmark machine (AMD EPYC) glibc's `__memcmp_evex_movbe` made a lookup of an
/// 8-byte key cost 106 ns instead of 20 ns (`cargo xtask bench`, hot key; perf showed 56 % of the
/// time in memcmp). Keys are mostly short (IPs, ids), so compare them with a few overlapping word
/// loads and leave longer ones to `memcmp`.
#[inline(always)]
fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    #[inline(always)]
    fn word(s: &[u8], at: usize) -> u64 {
        let mut w = [0; 8];
        w.copy_from_slice(&s[at..at + 8]);
        u64::from_ne_bytes(w)
    }
    #[inline(always)]
    fn half(s: &[u8], at: usize) -> u32 {
        let mut w = [0; 4];
        w.copy_from_slice(&s[at..at + 4]);
        u32::from_ne_bytes(w)
    }
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        _ => a == b,
    }
}

/// What a state is stored under: a key in a policy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Id<'a> {
    pub(crate) key: &'a [u8],
    /// At most `MAX_POLICY_LEN` (128) bytes, so its length fits the trailing byte of a `KeyBuf`.
    pub(crate) policy: &'a [u8],
}

impl PartialEq for Id<'_> {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        bytes_eq(self.key, other.key) && bytes_eq(self.policy, other.policy)
    }
}

impl Eq for Id<'_> {}

impl Id<'_> {
    /// One keyed hash of the pair; the unnamed policy (the common case) adds nothing to hash.
    #[inline]
    pub(crate) fn hash<S: BuildHasher>(&self, hasher: &S) -> u64 {
        let mut h = hasher.build_hasher();
        h.write(self.key);
        if !self.policy.is_empty() {
            h.write(self.policy);
        }
        h.finish()
    }
}

/// An [`Id`]'s bytes, `key ‖ policy ‖ policy length`, inline when short (IP addresses, numeric
/// ids, UUIDs in binary form).
#[derive(Debug)]
enum KeyBuf {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl KeyBuf {
    fn new(id: Id<'_>) -> Self {
        let len = id.key.len() + id.policy.len() + 1;
        // The policy length fits a byte: `Request::with_policy` caps it at 128.
        let policy_len = u8::try_from(id.policy.len()).unwrap_or(u8::MAX);
        if len <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..id.key.len()].copy_from_slice(id.key);
            bytes[id.key.len()..len - 1].copy_from_slice(id.policy);
            bytes[len - 1] = policy_len;
            KeyBuf::Inline {
                len: len as u8, // ≤ INLINE
                bytes,
            }
        } else {
            let mut bytes = Vec::with_capacity(len);
            bytes.extend_from_slice(id.key);
            bytes.extend_from_slice(id.policy);
            bytes.push(policy_len);
            KeyBuf::Heap(bytes.into_boxed_slice())
        }
    }

    #[inline]
    fn as_bytes(&self) -> &[u8] {
        match self {
            KeyBuf::Inline { len, bytes } => &bytes[..usize::from(*len)],
            KeyBuf::Heap(bytes) => bytes,
        }
    }

    /// The stored pair.
    #[inline]
    fn id(&self) -> Id<'_> {
        let bytes = self.as_bytes();
        let (rest, policy_len) = match bytes.split_last() {
            Some((&n, rest)) => (rest, usize::from(n).min(rest.len())),
            None => (bytes, 0),
        };
        let (key, policy) = rest.split_at(rest.len() - policy_len);
        Id { key, policy }
    }

    #[inline]
    fn is(&self, id: Id<'_>) -> bool {
        self.id() == id
    }
}

/// One key's state, and the instant from which it may be forgotten.
#[derive(Debug)]
pub(crate) struct Entry {
    key: KeyBuf,
    expires_at: u64,
    state: State,
}

/// What a shard's table reports back to the store besides the decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Effects {
    /// A live entry was evicted to respect the cap.
    pub(crate) evicted: bool,
}

/// The map behind one shard lock.
#[derive(Debug, Default)]
pub(crate) struct Table {
    map: HashTable<Entry>,
    /// The next bucket the incremental sweep examines.
    cursor: usize,
}

impl Table {
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    fn find(&self, hash: u64, id: Id<'_>) -> Option<&Entry> {
        self.map.find(hash, |e| e.key.is(id))
    }

    /// What `limit` would answer for `key` now, changing nothing.
    pub(crate) fn evaluate(
        &self,
        hash: u64,
        id: Id<'_>,
        limit: &Limit,
        now: u64,
        cost: u64,
    ) -> Decision {
        limit.evaluate(self.find(hash, id).map(|e| &e.state), now, cost)
    }

    /// Decides and charges one request.
    #[allow(clippy::too_many_arguments)] // the hot path: no struct to build per call
    #[inline]
    pub(crate) fn decide<S: BuildHasher>(
        &mut self,
        hash: u64,
        id: Id<'_>,
        limit: &Limit,
        now: u64,
        cost: u64,
        max_len: usize,
        hasher: &S,
    ) -> (Decision, Effects) {
        if let Some(entry) = self.map.find_mut(hash, |e| e.key.is(id)) {
            let decision = limit.decide(&mut entry.state, now, cost);
            if decision.is_allowed() && cost > 0 {
                // Equal to `State::expires_at` (property-tested in core), without its division.
                entry.expires_at = now.saturating_add(decision.reset_after_us());
            }
            return (decision, Effects::default());
        }
        let decision = limit.evaluate(None, now, cost);
        let mut effects = Effects::default();
        if decision.is_allowed() && cost > 0 {
            let mut state = State::fresh(limit.algorithm());
            limit.decide(&mut state, now, cost);
            let expires_at = now.saturating_add(decision.reset_after_us());
            effects = self.insert(hash, id, state, expires_at, now, max_len, hasher);
        }
        (decision, effects)
    }

    #[allow(clippy::too_many_arguments)]
    fn insert<S: BuildHasher>(
        &mut self,
        hash: u64,
        id: Id<'_>,
        state: State,
        expires_at: u64,
        now: u64,
        max_len: usize,
        hasher: &S,
    ) -> Effects {
        let mut effects = Effects::default();
        self.sweep(now, SWEEP_STEP);
        if self.map.len() >= max_len {
            self.sweep(now, EVICT_SCAN);
            if self.map.len() >= max_len {
                effects.evicted = self.evict_one();
            }
        }
        self.map.insert_unique(
            hash,
            Entry {
                key: KeyBuf::new(id),
                expires_at,
                state,
            },
            |e| e.key.id().hash(hasher),
        );
        effects
    }

    /// Examines `steps` buckets from the cursor and drops the expired entries found there.
    fn sweep(&mut self, now: u64, steps: usize) {
        let buckets = self.map.num_buckets();
        if buckets == 0 {
            return;
        }
        debug_assert!(buckets.is_power_of_two());
        for _ in 0..steps {
            // The bucket count is a power of two.
            self.cursor = (self.cursor + 1) & (buckets - 1);
            if let Ok(entry) = self.map.get_bucket_entry(self.cursor)
                && entry.get().expires_at <= now
            {
                entry.remove();
            }
        }
    }

    /// Drops the first live entry after the cursor: a victim the client cannot choose, since
    /// bucket positions follow the keyed hash.
    fn evict_one(&mut self) -> bool {
        let buckets = self.map.num_buckets();
        for i in 1..=buckets {
            let index = (self.cursor + i) % buckets;
            if let Ok(entry) = self.map.get_bucket_entry(index) {
                entry.remove();
                self.cursor = index;
                return true;
            }
        }
        false
    }

    /// Drops every expired entry and gives back memory a flood left behind.
    pub(crate) fn purge<S: BuildHasher>(&mut self, now: u64, hasher: &S) {
        self.map.retain(|e| e.expires_at > now);
        if self.map.capacity() > 4 * self.map.len().max(16) {
            self.map
                .shrink_to(self.map.len(), |e| e.key.id().hash(hasher));
            self.cursor = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlimit_core::Quota;

    fn hasher() -> foldhash::quality::RandomState {
        foldhash::quality::RandomState::default()
    }

    fn id(key: &[u8]) -> Id<'_> {
        Id { key, policy: b"" }
    }

    /// Decides on `key` in the unnamed policy.
    fn decide(
        table: &mut Table,
        h: &foldhash::quality::RandomState,
        key: &[u8],
        limit: &Limit,
        now: u64,
        cost: u64,
        max_len: usize,
    ) -> (Decision, Effects) {
        table.decide(id(key).hash(h), id(key), limit, now, cost, max_len, h)
    }

    #[test]
    fn bytes_eq_agrees_with_slice_equality() {
        let data: Vec<u8> = (0..64u8).collect();
        for n in 0..40 {
            let a = &data[..n];
            assert!(bytes_eq(a, a));
            for i in 0..n {
                let mut b = a.to_vec();
                b[i] ^= 1;
                assert!(!bytes_eq(a, &b), "length {n}, byte {i}");
            }
            assert!(!bytes_eq(a, &data[..n + 1]));
        }
    }

    #[test]
    fn an_entry_fits_one_cache_line() {
        assert_eq!(std::mem::size_of::<State>(), 32);
        assert_eq!(std::mem::size_of::<Entry>(), 64);
    }

    #[test]
    fn key_buf_round_trips_inline_and_heap() {
        for len in [1, 2, INLINE - 2, INLINE - 1, INLINE, 1024] {
            let key: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
            for policy in [&b""[..], b"p", b"per-day", &[0xff; 128]] {
                let id = Id { key: &key, policy };
                assert_eq!(KeyBuf::new(id).id(), id);
                assert!(KeyBuf::new(id).is(id));
            }
        }
        assert!(matches!(
            KeyBuf::new(id(&[0; INLINE - 1])),
            KeyBuf::Inline { .. }
        ));
        assert!(matches!(KeyBuf::new(id(&[0; INLINE])), KeyBuf::Heap(_)));
        // The pair is what is compared: moving bytes between key and policy is another id.
        let a = KeyBuf::new(Id {
            key: b"ab",
            policy: b"c",
        });
        assert!(!a.is(Id {
            key: b"a",
            policy: b"bc"
        }));
        assert!(!a.is(Id {
            key: b"abc",
            policy: b""
        }));
    }

    #[test]
    fn expired_entries_are_swept_by_later_inserts() {
        let h = hasher();
        let limit = Limit::gcra(Quota::per_second(10).unwrap());
        let mut table = Table::default();
        for i in 0u32..100 {
            decide(&mut table, &h, &i.to_be_bytes(), &limit, 0, 1, usize::MAX);
        }
        assert_eq!(table.len(), 100);
        // Much later every entry has expired; new inserts sweep them out incrementally.
        for i in 1000u32..1400 {
            decide(
                &mut table,
                &h,
                &i.to_be_bytes(),
                &limit,
                10_000_000,
                1,
                usize::MAX,
            );
        }
        let old_left = (0u32..100)
            .filter(|i| {
                let key = i.to_be_bytes();
                table.find(id(&key).hash(&h), id(&key)).is_some()
            })
            .count();
        assert!(old_left < 100, "the sweep removed nothing");
        table.purge(10_000_000, &h);
        assert_eq!(table.len(), 400, "purge keeps the live entries only");
    }

    #[test]
    fn the_cap_holds_under_a_flood_of_unique_keys() {
        let h = hasher();
        let limit = Limit::token_bucket(Quota::per_minute(10).unwrap());
        let mut table = Table::default();
        let mut evictions = 0;
        for i in 0u64..10_000 {
            let (d, fx) = decide(&mut table, &h, &i.to_le_bytes(), &limit, 5, 1, 100);
            assert!(d.is_allowed());
            assert!(table.len() <= 100);
            evictions += usize::from(fx.evicted);
        }
        assert_eq!(evictions, 10_000 - 100);
    }

    #[test]
    fn denied_and_peeked_fresh_keys_store_nothing() {
        let h = hasher();
        let limit = Limit::token_bucket(Quota::per_minute(10).unwrap());
        let mut table = Table::default();
        assert!(
            decide(&mut table, &h, b"k", &limit, 0, 0, 10)
                .0
                .is_allowed()
        );
        assert!(decide(&mut table, &h, b"k", &limit, 0, 11, 10).0.is_never());
        assert_eq!(table.len(), 0);
    }
}
