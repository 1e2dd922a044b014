//! One of the 64 shards: a swiss table of entries with an incremental sweep and a size cap.

use std::hash::BuildHasher;

use distlimit_core::{Decision, Limit, State};
use hashbrown::HashTable;

/// Keys up to this many bytes live inside the entry; longer ones take one heap allocation.
const INLINE: usize = 22;

/// Buckets examined for expired entries on every insert.
const SWEEP_STEP: usize = 2;

/// Buckets examined for an expired entry before evicting a live one when the shard is full.
const EVICT_SCAN: usize = 32;

/// A key's bytes, inline when short (IP addresses, numeric ids, UUIDs in binary form).
#[derive(Debug)]
enum KeyBuf {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl KeyBuf {
    fn new(key: &[u8]) -> Self {
        if key.len() <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..key.len()].copy_from_slice(key);
            // len ≤ INLINE < 256
            KeyBuf::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            KeyBuf::Heap(key.into())
        }
    }

    #[inline]
    fn as_bytes(&self) -> &[u8] {
        match self {
            KeyBuf::Inline { len, bytes } => &bytes[..usize::from(*len)],
            KeyBuf::Heap(bytes) => bytes,
        }
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

    fn find(&self, hash: u64, key: &[u8]) -> Option<&Entry> {
        self.map.find(hash, |e| e.key.as_bytes() == key)
    }

    /// What `limit` would answer for `key` now, changing nothing.
    pub(crate) fn evaluate(
        &self,
        hash: u64,
        key: &[u8],
        limit: &Limit,
        now: u64,
        cost: u64,
    ) -> Decision {
        limit.evaluate(self.find(hash, key).map(|e| &e.state), now, cost)
    }

    /// Decides and charges one request.
    #[allow(clippy::too_many_arguments)] // the hot path: no struct to build per call
    #[inline]
    pub(crate) fn decide<S: BuildHasher>(
        &mut self,
        hash: u64,
        key: &[u8],
        limit: &Limit,
        now: u64,
        cost: u64,
        max_len: usize,
        hasher: &S,
    ) -> (Decision, Effects) {
        if let Some(entry) = self.map.find_mut(hash, |e| e.key.as_bytes() == key) {
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
            effects = self.insert(hash, key, state, expires_at, now, max_len, hasher);
        }
        (decision, effects)
    }

    /// Charges a request already evaluated as admitted (the commit phase of a batch).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn commit<S: BuildHasher>(
        &mut self,
        hash: u64,
        key: &[u8],
        limit: &Limit,
        now: u64,
        cost: u64,
        max_len: usize,
        hasher: &S,
    ) -> Effects {
        self.decide(hash, key, limit, now, cost, max_len, hasher).1
    }

    #[allow(clippy::too_many_arguments)]
    fn insert<S: BuildHasher>(
        &mut self,
        hash: u64,
        key: &[u8],
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
                key: KeyBuf::new(key),
                expires_at,
                state,
            },
            |e| hasher.hash_one(e.key.as_bytes()),
        );
        effects
    }

    /// Examines `steps` buckets from the cursor and drops the expired entries found there.
    fn sweep(&mut self, now: u64, steps: usize) {
        let buckets = self.map.num_buckets();
        if buckets == 0 {
            return;
        }
        for _ in 0..steps {
            self.cursor = (self.cursor + 1) % buckets;
            if let Ok(entry) = self.map.get_bucket_entry(self.cursor) {
                if entry.get().expires_at <= now {
                    entry.remove();
                }
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
                .shrink_to(self.map.len(), |e| hasher.hash_one(e.key.as_bytes()));
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

    #[test]
    fn an_entry_fits_one_cache_line() {
        assert_eq!(std::mem::size_of::<State>(), 32);
        assert_eq!(std::mem::size_of::<Entry>(), 64);
    }

    #[test]
    fn key_buf_round_trips_inline_and_heap() {
        for len in [1, 2, INLINE - 1, INLINE, INLINE + 1, 1024] {
            let key: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
            assert_eq!(KeyBuf::new(&key).as_bytes(), key.as_slice());
        }
        assert!(matches!(KeyBuf::new(&[0; INLINE]), KeyBuf::Inline { .. }));
        assert!(matches!(KeyBuf::new(&[0; INLINE + 1]), KeyBuf::Heap(_)));
    }

    #[test]
    fn expired_entries_are_swept_by_later_inserts() {
        let h = hasher();
        let limit = Limit::gcra(Quota::per_second(10).unwrap());
        let mut table = Table::default();
        for i in 0u32..100 {
            let key = i.to_be_bytes();
            table.decide(h.hash_one(&key[..]), &key, &limit, 0, 1, usize::MAX, &h);
        }
        assert_eq!(table.len(), 100);
        // Much later every entry has expired; new inserts sweep them out incrementally.
        for i in 1000u32..1400 {
            let key = i.to_be_bytes();
            table.decide(
                h.hash_one(&key[..]),
                &key,
                &limit,
                10_000_000,
                1,
                usize::MAX,
                &h,
            );
        }
        let old_left = (0u32..100)
            .filter(|i| {
                table
                    .find(h.hash_one(&i.to_be_bytes()[..]), &i.to_be_bytes())
                    .is_some()
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
            let key = i.to_le_bytes();
            let (d, fx) = table.decide(h.hash_one(&key[..]), &key, &limit, 5, 1, 100, &h);
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
        let key = b"k";
        let hash = h.hash_one(&key[..]);
        assert!(table.decide(hash, key, &limit, 0, 0, 10, &h).0.is_allowed());
        assert!(table.decide(hash, key, &limit, 0, 11, 10, &h).0.is_never());
        assert_eq!(table.len(), 0);
    }
}
