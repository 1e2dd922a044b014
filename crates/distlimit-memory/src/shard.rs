//! One of the 64 shards: four swiss tables under one lock, the expiry of entries and the key cap.
//!
//! Which table holds a state follows from the request alone ([`Home`]): GCRA states, one
//! theoretical arrival time each, sit in compact entries with the id packed inline (16 bytes for
//! an 8-byte key, 32 for ids up to 22 bytes, 64 for ids up to 54 bytes); every other state in a
//! 64-byte [`Entry`] holding the [`State`] enum, the key inline up to 21 bytes or on the heap, and
//! its expiry. Small entries are what keeps a large key set in the caches: the lookup's cost is
//! the cache misses on its entry (`keys_100k` and `keys_1m` in `benches/compare.rs`).

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use distlimit_core::algorithm::{Gcra, TokenBucket};
use distlimit_core::{Algorithm, Decision, Limit, NEVER, State, bytes_eq};
use hashbrown::HashTable;

/// Keys up to this many bytes live inside the entry; longer ones take one heap allocation.
const INLINE: usize = 22;

/// Tables of at least this many buckets look for an entry in its home bucket first (see
/// [`Part::home`]): 4096 buckets are 64 KiB of 16-byte entries per shard, 4 MiB over the 64
/// shards, more than this machine's L2 cache.
const HOME_FIRST: usize = 4096;

/// Buckets examined for an expired entry before evicting a live one when the shard is full.
const EVICT_SCAN: usize = 32;

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

/// Words of a short packed id: 22 bytes and the two lengths, in half-line entries.
const SHORT: usize = 3;

/// Words of a longer packed id: 54 bytes and the two lengths, in one-line entries.
const LONG: usize = 7;

/// `s[at..at + 8]` as a little-endian word.
#[inline(always)]
fn word_at(s: &[u8], at: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&s[at..at + 8]);
    u64::from_le_bytes(w)
}

/// `s[at..at + 4]` as a little-endian word.
#[inline(always)]
fn half_at(s: &[u8], at: usize) -> u64 {
    let mut w = [0; 4];
    w.copy_from_slice(&s[at..at + 4]);
    u64::from(u32::from_le_bytes(w))
}

/// The bytes of `s` (fewer than `8 × W`) as little-endian words, zero-padded, built from
/// overlapping loads: no call to `memcpy` and no loop over bytes.
#[inline(always)]
fn load_words<const W: usize>(s: &[u8]) -> [u64; W] {
    let mut words = [0; W];
    let n = s.len();
    let head = match n {
        0 => 0,
        1..=3 => {
            let b = |i: usize| u64::from(s[i]) << (8 * i);
            b(0) | b(n / 2) | b(n - 1)
        }
        4..=7 => half_at(s, 0) | half_at(s, n - 4) << (8 * (n - 4)),
        _ => {
            let full = (n / 8).min(W);
            for (i, w) in words.iter_mut().enumerate().take(full) {
                *w = word_at(s, 8 * i);
            }
            if !n.is_multiple_of(8)
                && let Some(w) = words.get_mut(full)
            {
                // The last `n % 8` bytes, from the word ending at `n`.
                *w = word_at(s, n - 8) >> (8 * (8 - n % 8));
            }
            return words;
        }
    };
    if let Some(w) = words.first_mut() {
        *w = head;
    }
    words
}

/// An [`Id`] of at most `8 × W − 2` bytes packed into `W` words: `key ‖ policy`, zero-padded,
/// then the total length and the policy's length in the last two bytes. Two ids are equal
/// exactly when their packed words are, so a lookup compares words and never loops over bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Packed<const W: usize>([u64; W]);

impl<const W: usize> Packed<W> {
    /// The longest id that fits.
    const MAX: usize = 8 * W - 2;

    #[inline(always)]
    fn new(id: Id<'_>) -> Option<Self> {
        let n = id.key.len() + id.policy.len();
        if n > Self::MAX {
            return None;
        }
        let mut words = if id.policy.is_empty() {
            load_words(id.key)
        } else {
            let mut bytes = [0; 64];
            let bytes = bytes.get_mut(..n)?;
            let (key, policy) = bytes.split_at_mut(id.key.len());
            key.copy_from_slice(id.key);
            policy.copy_from_slice(id.policy);
            load_words(bytes)
        };
        // The lengths, both at most `MAX` < 256, in the last two bytes.
        let last = words.last_mut()?;
        *last |= (n as u64) << 48 | (id.policy.len() as u64) << 56;
        Some(Packed(words))
    }

    /// Equality in `W` word comparisons, without early exits.
    #[inline(always)]
    fn is(&self, other: &Self) -> bool {
        self.0
            .iter()
            .zip(&other.0)
            .fold(0, |diff, (a, b)| diff | (a ^ b))
            == 0
    }

    /// The packed id's hash, for rehashing.
    fn hash<S: BuildHasher>(&self, hasher: &S) -> u64 {
        let mut bytes = [0; 64];
        for (chunk, word) in bytes.chunks_exact_mut(8).zip(self.0) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        let n = usize::from(bytes[8 * W - 2]).min(Self::MAX);
        let k = n - usize::from(bytes[8 * W - 1]).min(n);
        Id {
            key: &bytes[..k],
            policy: &bytes[k..n],
        }
        .hash(hasher)
    }
}

/// Where a request's state lives: GCRA states of ids up to 54 bytes in compact entries,
/// everything else in [`Entry`]s. An id's home follows from its length and the limit's
/// algorithm alone.
///
/// It carries no packed id: each map packs the id where it looks it up, in registers. (Moving
/// a 56-byte packed id around inside an enum made the compiler copy it through the stack with
/// loads wider than the stores, a store-forwarding stall that cost a fifth of a decision.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Home {
    /// A GCRA state of an id that is an 8-byte key in the unnamed policy (a `u64` in binary).
    Word,
    /// A GCRA state of another id of at most 22 bytes.
    Short,
    /// A GCRA state of another id of at most 54 bytes.
    Long,
    /// Any other state.
    Wide,
}

impl Home {
    /// The home of `id` if its state were a GCRA state.
    #[inline(always)]
    fn compact(id: Id<'_>) -> Self {
        let n = id.key.len() + id.policy.len();
        if id.key.len() == 8 && id.policy.is_empty() {
            Home::Word
        } else if n <= Packed::<SHORT>::MAX {
            Home::Short
        } else if n <= Packed::<LONG>::MAX {
            Home::Long
        } else {
            Home::Wide
        }
    }

    #[inline(always)]
    fn of(id: Id<'_>, limit: &Limit) -> Self {
        match limit.algorithm() {
            Algorithm::Gcra => Home::compact(id),
            _ => Home::Wide,
        }
    }
}

/// Decides a GCRA request (`limit` is GCRA) on a stored theoretical arrival time (zero for a key
/// never seen), charging it when admitted.
///
/// The reference is `Limit::decide` on a [`Gcra`] state; this is the same arithmetic written out
/// for the one algorithm, so that the compiler inlines it into the lookup: the generic path
/// dispatches over every algorithm in two calls the compiler does not inline, 90 instructions
/// per decision against about 40 here (callgrind). `gcra_matches_the_reference` checks it
/// against the reference.
#[inline(always)]
fn decide_gcra(tat: &mut u64, limit: &Limit, now: u64, cost: u64) -> Decision {
    let q = limit.quota();
    let (burst, interval) = (q.burst(), q.emission_interval_us());
    let debt = tat.saturating_sub(now);
    let reset = Duration::from_micros(debt);
    // `burst − ⌈debt / interval⌉`, without the division when there is no debt.
    let available = match debt {
        0 => burst,
        _ => burst.saturating_sub(if interval <= 1 {
            debt
        } else {
            debt.div_ceil(interval)
        }),
    };
    if cost > burst {
        return Decision::denied(burst, available, reset, NEVER);
    }
    let want = cost.max(1);
    if want <= available {
        let spent = cost.saturating_mul(interval);
        if cost > 0 {
            *tat = (*tat).max(now).saturating_add(spent);
        }
        let reset = Duration::from_micros(debt.saturating_add(spent));
        Decision::allowed(burst, available - cost, reset)
    } else {
        let retry = debt.saturating_sub((burst - want).saturating_mul(interval));
        Decision::denied(burst, available, reset, Duration::from_micros(retry.max(1)))
    }
}

/// `⌈a / b⌉`, without the division for `b ≤ 1`: the core reference's rounding.
#[inline(always)]
fn div_ceil(a: u64, b: u64) -> u64 {
    if b <= 1 { a } else { a.div_ceil(b) }
}

/// Decides a token-bucket request (`limit` is a token bucket) on its state, charging it when
/// admitted: `Limit::decide`'s arithmetic written out for the one algorithm, like
/// [`decide_gcra`], and checked against it by `token_bucket_matches_the_reference`.
#[inline(always)]
fn decide_token_bucket(bucket: &mut TokenBucket, limit: &Limit, now: u64, cost: u64) -> Decision {
    let q = limit.quota();
    let ((rate, token), burst) = (q.refill_units(), q.burst());
    let elapsed = now.saturating_sub(bucket.last_us);
    let deficit = bucket.deficit.saturating_sub(elapsed.saturating_mul(rate));
    let ahead = bucket.last_us.saturating_sub(now);
    let available = (burst.saturating_mul(token).saturating_sub(deficit) / token).min(burst);
    // µs until the bucket is full again after `extra` more units.
    let reset_after =
        |extra: u64| match div_ceil(deficit.saturating_add(extra.saturating_mul(token)), rate) {
            0 => 0,
            refill => ahead.saturating_add(refill),
        };
    let reset = Duration::from_micros(reset_after(0));
    if cost > burst {
        return Decision::denied(burst, available, reset, NEVER);
    }
    let want = cost.max(1);
    if want <= available {
        let reset = Duration::from_micros(reset_after(cost));
        if cost > 0 {
            bucket.deficit = deficit.saturating_add(cost.saturating_mul(token));
            bucket.last_us = bucket.last_us.max(now);
        }
        Decision::allowed(burst, available - cost, reset)
    } else {
        let allowed_deficit = burst.saturating_sub(want).saturating_mul(token);
        let retry = ahead.saturating_add(div_ceil(deficit.saturating_sub(allowed_deficit), rate));
        Decision::denied(burst, available, reset, Duration::from_micros(retry.max(1)))
    }
}

/// The GCRA state of an 8-byte key, in a quarter of a cache line (aligned so that it never
/// straddles two). The theoretical arrival time is also the instant the entry expires.
#[derive(Debug)]
#[repr(C, align(16))]
struct WordEntry {
    key: u64,
    tat: u64,
}

/// The GCRA state of an id of at most 22 bytes, in half a cache line.
#[derive(Debug)]
#[repr(C, align(32))]
struct ShortEntry {
    id: Packed<SHORT>,
    tat: u64,
}

/// The GCRA state of an id of at most 54 bytes, in one cache line.
#[derive(Debug)]
#[repr(C, align(64))]
struct LongEntry {
    id: Packed<LONG>,
    tat: u64,
}

/// Every other state: any algorithm, any id, and the instant from which it may be forgotten.
#[derive(Debug)]
struct Entry {
    key: KeyBuf,
    expires_at: u64,
    state: State,
}

/// What expiry and the key cap need to know about an entry.
trait Slot {
    /// The instant from which the entry may be forgotten.
    fn expires_at(&self) -> u64;
    /// The keyed hash of its id, for rehashing.
    fn rehash<S: BuildHasher>(&self, hasher: &S) -> u64;
}

impl Slot for Entry {
    #[inline]
    fn expires_at(&self) -> u64 {
        self.expires_at
    }

    fn rehash<S: BuildHasher>(&self, hasher: &S) -> u64 {
        self.key.id().hash(hasher)
    }
}

/// A compact GCRA entry: an id of one fixed form and a theoretical arrival time, which is also
/// the instant the entry expires.
trait GcraSlot {
    /// The form of the id.
    type Id: Copy;
    /// `id` in that form, if it fits.
    fn pack(id: Id<'_>) -> Option<Self::Id>;
    /// An entry for `id`.
    fn new(id: Self::Id, tat: u64) -> Self;
    /// Whether the entry is `id`'s.
    fn is(&self, id: &Self::Id) -> bool;
    /// The theoretical arrival time.
    fn tat(&self) -> u64;
    /// Where the theoretical arrival time is stored.
    fn tat_mut(&mut self) -> &mut u64;
    /// The keyed hash of the id.
    fn id_hash<S: BuildHasher>(&self, hasher: &S) -> u64;
}

impl<T: GcraSlot> Slot for T {
    #[inline]
    fn expires_at(&self) -> u64 {
        self.tat()
    }

    fn rehash<S: BuildHasher>(&self, hasher: &S) -> u64 {
        self.id_hash(hasher)
    }
}

impl GcraSlot for WordEntry {
    type Id = u64;

    #[inline(always)]
    fn pack(id: Id<'_>) -> Option<u64> {
        (id.key.len() == 8 && id.policy.is_empty()).then(|| word_at(id.key, 0))
    }

    #[inline(always)]
    fn new(key: u64, tat: u64) -> Self {
        Self { key, tat }
    }

    #[inline(always)]
    fn is(&self, key: &u64) -> bool {
        self.key == *key
    }

    #[inline(always)]
    fn tat(&self) -> u64 {
        self.tat
    }

    #[inline(always)]
    fn tat_mut(&mut self) -> &mut u64 {
        &mut self.tat
    }

    fn id_hash<S: BuildHasher>(&self, hasher: &S) -> u64 {
        let key = self.key.to_le_bytes();
        Id {
            key: &key,
            policy: b"",
        }
        .hash(hasher)
    }
}

/// `GcraSlot` for an entry `{ id: Packed<N>, tat }`: the two sizes differ only in alignment,
/// which a const generic cannot set, hence two structs and one implementation.
macro_rules! packed_slot {
    ($entry:ty, $words:expr) => {
        impl GcraSlot for $entry {
            type Id = Packed<$words>;

            #[inline(always)]
            fn pack(id: Id<'_>) -> Option<Packed<$words>> {
                Packed::new(id)
            }

            #[inline(always)]
            fn new(id: Packed<$words>, tat: u64) -> Self {
                Self { id, tat }
            }

            #[inline(always)]
            fn is(&self, id: &Packed<$words>) -> bool {
                self.id.is(id)
            }

            #[inline(always)]
            fn tat(&self) -> u64 {
                self.tat
            }

            #[inline(always)]
            fn tat_mut(&mut self) -> &mut u64 {
                &mut self.tat
            }

            fn id_hash<S: BuildHasher>(&self, hasher: &S) -> u64 {
                self.id.hash(hasher)
            }
        }
    };
}

packed_slot!(ShortEntry, SHORT);
packed_slot!(LongEntry, LONG);

/// What a shard's table reports back to the store besides the decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Effects {
    /// A live entry was evicted to respect the cap.
    pub(crate) evicted: bool,
}

/// One swiss table of entries and its sweep cursor.
#[derive(Debug)]
struct Part<T> {
    map: HashTable<T>,
    /// The next bucket examined when the shard is at its key cap.
    cursor: usize,
}

impl<T> Default for Part<T> {
    fn default() -> Self {
        Self {
            map: HashTable::new(),
            cursor: 0,
        }
    }
}

impl<T: Slot> Part<T> {
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
                && entry.get().expires_at() <= now
            {
                entry.remove();
            }
        }
    }

    /// Makes room for one more entry without growing the map for expired ones: when it is full
    /// (no free slot left before hashbrown would resize it), drops its expired entries in one
    /// sequential pass, then leaves at least an eighth of it free. Erased slots may be tombstones
    /// that only a rehash reclaims: hashbrown rehashes in place when the live entries fill at
    /// most half the table and grows it otherwise. Either way the next pass is at least an
    /// eighth of the table's inserts away, so a pass costs at most eight entries examined per
    /// insert, and a pass is never longer than the resize it replaces.
    #[inline]
    fn make_room<S: BuildHasher>(&mut self, now: u64, hasher: &S) {
        if self.map.len() < self.map.capacity() {
            return;
        }
        self.map.retain(|e| e.expires_at() > now);
        // hashbrown's load factor: all but one bucket below 8 buckets, 7/8 from 8 on.
        let buckets = self.map.num_buckets();
        let usable = if buckets < 8 {
            buckets.saturating_sub(1)
        } else {
            buckets / 8 * 7
        };
        self.map.reserve(usable / 8 + 1, |e| e.rehash(hasher));
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

    /// The bucket where the probe sequence of `hash` starts: where an entry inserted into a
    /// table with room lands, so where most entries are.
    ///
    /// Lookups in a table of at least [`HOME_FIRST`] buckets look there first, then through the
    /// table's probe. The table's own lookup reads a group of control bytes, and only from their
    /// value knows which bucket to read: in a table larger than the cache, two misses one after
    /// the other. The home bucket's address depends on the hash alone, so the CPU reads it while
    /// the control byte that says whether it is full is still on its way: one miss for most
    /// keys (1 million 8-byte keys: 152 → 106 ns). In a table that stays in the cache the extra
    /// check costs more than it saves (10 000 keys: 20 → 22 ns; a third of the keys are not at
    /// home, a mispredicted branch), hence the threshold.
    #[inline(always)]
    fn home(&self, hash: u64) -> usize {
        // hashbrown starts probing at `hash & (buckets - 1)` (buckets: a power of two).
        (hash as usize) & self.map.num_buckets().wrapping_sub(1)
    }

    /// Removes the entry `is` picks out, if any.
    fn remove(&mut self, hash: u64, is: impl FnMut(&T) -> bool) {
        if !self.map.is_empty()
            && let Ok(entry) = self.map.find_entry(hash, is)
        {
            entry.remove();
        }
    }

    fn insert<S: BuildHasher>(&mut self, hash: u64, entry: T, hasher: &S) {
        self.map.insert_unique(hash, entry, |e| e.rehash(hasher));
    }

    /// Drops every expired entry and gives back memory a flood left behind.
    fn purge<S: BuildHasher>(&mut self, now: u64, hasher: &S) {
        self.map.retain(|e| e.expires_at() > now);
        if self.map.capacity() > 4 * self.map.len().max(16) {
            self.map.shrink_to(self.map.len(), |e| e.rehash(hasher));
            self.cursor = 0;
        }
    }
}

impl<T: GcraSlot> Part<T> {
    /// Decides and charges a GCRA request on `id`'s entry, if the map holds one.
    #[inline(always)]
    fn decide_gcra(
        &mut self,
        hash: u64,
        id: Id<'_>,
        limit: &Limit,
        now: u64,
        cost: u64,
    ) -> Option<Decision> {
        let id = T::pack(id)?;
        let entry = if self.map.num_buckets() >= HOME_FIRST {
            self.find_large_mut(hash, id)?
        } else {
            self.map.find_mut(hash, |e| e.is(&id))?
        };
        Some(decide_gcra(entry.tat_mut(), limit, now, cost))
    }

    /// `id`'s entry in a table of at least [`HOME_FIRST`] buckets: home bucket first (see
    /// [`Part::home`]). Out of line, so that the lookup in smaller tables, which do not need
    /// it, stays as small as before and inlined.
    #[inline(never)]
    fn find_large(&self, hash: u64, id: T::Id) -> Option<&T> {
        match self.map.get_bucket(self.home(hash)) {
            Some(entry) if entry.is(&id) => Some(entry),
            _ => self.map.find(hash, |e| e.is(&id)),
        }
    }

    /// [`find_large`](Self::find_large), for a change.
    #[inline(never)]
    fn find_large_mut(&mut self, hash: u64, id: T::Id) -> Option<&mut T> {
        let home = self.home(hash);
        match self.map.get_bucket(home) {
            Some(entry) if entry.is(&id) => self.map.get_bucket_mut(home),
            _ => self.map.find_mut(hash, |e| e.is(&id)),
        }
    }

    /// What a GCRA request on `id` would answer, changing nothing.
    fn evaluate_gcra(&self, hash: u64, id: Id<'_>, limit: &Limit, now: u64, cost: u64) -> Decision {
        let entry = T::pack(id).and_then(|id| {
            if self.map.num_buckets() >= HOME_FIRST {
                self.find_large(hash, id)
            } else {
                self.map.find(hash, |e| e.is(&id))
            }
        });
        let mut tat = entry.map_or(0, T::tat);
        decide_gcra(&mut tat, limit, now, cost)
    }

    /// Drops `id`'s entry, if any.
    fn remove_id(&mut self, hash: u64, id: Id<'_>) {
        if let Some(id) = T::pack(id) {
            self.remove(hash, |e| e.is(&id));
        }
    }

    /// Stores `id`'s first entry; false if `id` does not fit this map.
    fn insert_id<S: BuildHasher>(&mut self, hash: u64, id: Id<'_>, tat: u64, hasher: &S) -> bool {
        let Some(id) = T::pack(id) else {
            return false;
        };
        self.insert(hash, T::new(id, tat), hasher);
        true
    }
}

impl Part<Entry> {
    /// `id`'s entry in a table of at least [`HOME_FIRST`] buckets: home bucket first (see
    /// [`Part::home`]); out of line like [`Part::find_large`].
    #[inline(never)]
    fn find_large(&self, hash: u64, id: Id<'_>) -> Option<&Entry> {
        match self.map.get_bucket(self.home(hash)) {
            Some(entry) if entry.key.is(id) => Some(entry),
            _ => self.map.find(hash, |e| e.key.is(id)),
        }
    }

    /// [`find_large`](Self::find_large), for a change.
    #[inline(never)]
    fn find_large_mut(&mut self, hash: u64, id: Id<'_>) -> Option<&mut Entry> {
        let home = self.home(hash);
        match self.map.get_bucket(home) {
            Some(entry) if entry.key.is(id) => self.map.get_bucket_mut(home),
            _ => self.map.find_mut(hash, |e| e.key.is(id)),
        }
    }
}

/// The maps behind one shard lock, one per [`Home`]. An id lives in at most one of them.
///
/// In declaration order (`repr(C)`), so that the lock word and the header of the map of 8-byte
/// keys share the shard's first cache line.
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct Table {
    word: Part<WordEntry>,
    short: Part<ShortEntry>,
    long: Part<LongEntry>,
    wide: Part<Entry>,
}

impl Table {
    pub(crate) fn len(&self) -> usize {
        self.word.map.len() + self.short.map.len() + self.long.map.len() + self.wide.map.len()
    }

    /// What `limit` would answer for `key` now, changing nothing. A state of another algorithm
    /// counts as a fresh key, so only the request's own map is searched.
    pub(crate) fn evaluate(
        &self,
        hash: u64,
        id: Id<'_>,
        limit: &Limit,
        now: u64,
        cost: u64,
    ) -> Decision {
        match Home::of(id, limit) {
            Home::Word => self.word.evaluate_gcra(hash, id, limit, now, cost),
            Home::Short => self.short.evaluate_gcra(hash, id, limit, now, cost),
            Home::Long => self.long.evaluate_gcra(hash, id, limit, now, cost),
            Home::Wide => {
                let entry = if self.wide.map.num_buckets() >= HOME_FIRST {
                    self.wide.find_large(hash, id)
                } else {
                    self.wide.map.find(hash, |e| e.key.is(id))
                };
                limit.evaluate(entry.map(|e| &e.state), now, cost)
            }
        }
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
        let home = Home::of(id, limit);
        let known = match home {
            Home::Word => self.word.decide_gcra(hash, id, limit, now, cost),
            Home::Short => self.short.decide_gcra(hash, id, limit, now, cost),
            Home::Long => self.long.decide_gcra(hash, id, limit, now, cost),
            Home::Wide => if self.wide.map.num_buckets() >= HOME_FIRST {
                self.wide.find_large_mut(hash, id)
            } else {
                self.wide.map.find_mut(hash, |e| e.key.is(id))
            }
            .map(|entry| {
                let decision = match &mut entry.state {
                    State::TokenBucket(bucket) if limit.algorithm() == Algorithm::TokenBucket => {
                        decide_token_bucket(bucket, limit, now, cost)
                    }
                    state => limit.decide(state, now, cost),
                };
                if decision.is_allowed() && cost > 0 {
                    // Equal to `State::expires_at` (property-tested in core), without its
                    // division.
                    entry.expires_at = now.saturating_add(decision.reset_after_us());
                }
                decision
            }),
        };
        match known {
            Some(decision) => (decision, Effects::default()),
            None => self.decide_fresh(hash, id, home, limit, now, cost, max_len, hasher),
        }
    }

    /// [`decide`](Self::decide) for an id not in its map: a fresh key, or one whose state
    /// belongs to another algorithm, which counts as fresh and is replaced when this request is
    /// admitted. Kept out of line so that the known-key path stays small enough to inline into
    /// every caller.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn decide_fresh<S: BuildHasher>(
        &mut self,
        hash: u64,
        id: Id<'_>,
        home: Home,
        limit: &Limit,
        now: u64,
        cost: u64,
        max_len: usize,
        hasher: &S,
    ) -> (Decision, Effects) {
        let (decision, state) = match home {
            Home::Wide => {
                let mut state = State::fresh(limit.algorithm());
                (limit.decide(&mut state, now, cost), state)
            }
            _ => {
                let mut tat = 0;
                let decision = decide_gcra(&mut tat, limit, now, cost);
                (decision, State::Gcra(Gcra { tat_us: tat }))
            }
        };
        if !decision.is_allowed() || cost == 0 {
            return (decision, Effects::default());
        }
        let expires_at = now.saturating_add(decision.reset_after_us());
        let effects = self.insert(hash, id, home, state, expires_at, now, max_len, hasher);
        (decision, effects)
    }

    /// Stores the first state of `id` in its `home` map, dropping a state of another algorithm
    /// it had in another map.
    #[allow(clippy::too_many_arguments)]
    fn insert<S: BuildHasher>(
        &mut self,
        hash: u64,
        id: Id<'_>,
        home: Home,
        state: State,
        expires_at: u64,
        now: u64,
        max_len: usize,
        hasher: &S,
    ) -> Effects {
        match home {
            Home::Word | Home::Short | Home::Long => self.wide.remove(hash, |e| e.key.is(id)),
            Home::Wide => match Home::compact(id) {
                Home::Word => self.word.remove_id(hash, id),
                Home::Short => self.short.remove_id(hash, id),
                Home::Long => self.long.remove_id(hash, id),
                Home::Wide => {}
            },
        }
        let mut effects = Effects::default();
        if self.len() >= max_len {
            self.word.sweep(now, EVICT_SCAN);
            self.short.sweep(now, EVICT_SCAN);
            self.long.sweep(now, EVICT_SCAN);
            self.wide.sweep(now, EVICT_SCAN);
            if self.len() >= max_len {
                effects.evicted = self.word.evict_one()
                    || self.short.evict_one()
                    || self.long.evict_one()
                    || self.wide.evict_one();
            }
        } else {
            match home {
                Home::Word => self.word.make_room(now, hasher),
                Home::Short => self.short.make_room(now, hasher),
                Home::Long => self.long.make_room(now, hasher),
                Home::Wide => self.wide.make_room(now, hasher),
            }
        }
        let compact = match (home, &state) {
            (Home::Word, State::Gcra(gcra)) => self.word.insert_id(hash, id, gcra.tat_us, hasher),
            (Home::Short, State::Gcra(gcra)) => self.short.insert_id(hash, id, gcra.tat_us, hasher),
            (Home::Long, State::Gcra(gcra)) => self.long.insert_id(hash, id, gcra.tat_us, hasher),
            _ => false,
        };
        if !compact {
            let entry = Entry {
                key: KeyBuf::new(id),
                expires_at,
                state,
            };
            self.wide.insert(hash, entry, hasher);
        }
        effects
    }

    /// Drops every expired entry and gives back memory a flood left behind.
    pub(crate) fn purge<S: BuildHasher>(&mut self, now: u64, hasher: &S) {
        self.word.purge(now, hasher);
        self.short.purge(now, hasher);
        self.long.purge(now, hasher);
        self.wide.purge(now, hasher);
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
    fn entries_fit_half_and_one_cache_line() {
        assert_eq!(std::mem::size_of::<State>(), 32);
        assert_eq!(std::mem::size_of::<Entry>(), 64);
        assert_eq!(std::mem::size_of::<ShortEntry>(), 32);
        assert_eq!(std::mem::align_of::<ShortEntry>(), 32);
        assert_eq!(std::mem::size_of::<LongEntry>(), 64);
        assert_eq!(std::mem::align_of::<LongEntry>(), 64);
        assert_eq!(std::mem::size_of::<WordEntry>(), 16);
        assert_eq!(std::mem::align_of::<WordEntry>(), 16);
    }

    fn packed_round_trip<const W: usize>() {
        let h = hasher();
        let max = Packed::<W>::MAX;
        let key: Vec<u8> = (0..max as u8).map(|i| i.wrapping_mul(37) | 1).collect();
        let mut seen: Vec<Packed<W>> = Vec::new();
        for k in 1..=max {
            for p in 0..=max - k {
                let id = Id {
                    key: &key[..k],
                    policy: &key[k..k + p],
                };
                let packed = Packed::<W>::new(id).unwrap();
                assert_eq!(packed.hash(&h), id.hash(&h), "key {k}, policy {p}");
                assert!(packed.is(&packed));
                assert!(
                    !seen.iter().any(|other| packed.is(other)),
                    "key {k}, policy {p}"
                );
                seen.push(packed);
                // The fast loads equal the bytes laid out one by one.
                let mut bytes = [0; 64];
                bytes[..k + p].copy_from_slice(&key[..k + p]);
                let mut words = [0u64; W];
                for (i, w) in words.iter_mut().enumerate() {
                    *w = word_at(&bytes, 8 * i);
                }
                assert_eq!(load_words::<W>(&key[..k + p]), words, "{k} + {p} bytes");
            }
        }
        // Trailing zero bytes are part of the id.
        let zeros = [0u8; 2];
        let one = Packed::<W>::new(id(&zeros[..1])).unwrap();
        assert!(!one.is(&Packed::new(id(&zeros)).unwrap()));
        assert!(Packed::<W>::new(id(&vec![1; max + 1])).is_none());
    }

    #[test]
    fn packed_ids_round_trip_and_differ_when_the_pair_differs() {
        packed_round_trip::<SHORT>();
        packed_round_trip::<LONG>();
    }

    /// An id switching between GCRA (a compact map) and other algorithms (the wide map) decides
    /// like the reference and is held once, for ids of every home.
    #[test]
    fn an_id_switching_algorithms_moves_between_maps_and_matches_the_reference() {
        let h = hasher();
        let quota = Quota::per_second(3).unwrap().with_burst(2).unwrap();
        let limits = [
            Limit::gcra(quota),
            Limit::token_bucket(quota),
            Limit::fixed_window(quota),
        ];
        let long = [7; 40];
        let wide = [9; 60];
        for key in [&b"client"[..], b"8 bytes!", &long, &wide] {
            let mut table = Table::default();
            let mut reference = State::fresh(Algorithm::Gcra);
            let mut seed = 7u64;
            let mut now = 1_000_000;
            for step in 0..2_000 {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let limit = limits[(seed >> 33) as usize % limits.len()];
                let cost = (seed >> 40) % 3;
                now += (seed >> 50) % 300_000;
                let (got, _) = decide(&mut table, &h, key, &limit, now, cost, usize::MAX);
                let want = limit.decide(&mut reference, now, cost);
                assert_eq!(got, want, "{key:?}, step {step}");
                assert!(table.len() <= 1, "{key:?}, step {step}");
                let peek = table.evaluate(id(key).hash(&h), id(key), &limit, now, 0);
                let want = limit.evaluate(Some(&reference), now, 0);
                assert_eq!(peek, want, "{key:?}, step {step}");
            }
        }
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

    proptest::proptest! {
        /// The inlined GCRA equals the reference on any state, time, cost and quota, including
        /// debts, peeks, costs above the burst and times before the stored arrival time.
        #[test]
        fn gcra_matches_the_reference(
            limit in 1u64..1_000,
            period in 1u64..100_000_000,
            burst in 1u64..1_000,
            start in 0u64..1u64 << 50,
            steps in proptest::collection::vec((0u64..3_000_000, 0u64..1_200), 1..40),
        ) {
            let Ok(quota) = Quota::from_parts(limit, period, burst) else {
                return Ok(());
            };
            let limit = Limit::gcra(quota);
            let (mut tat, mut reference, mut now) = (0, State::fresh(Algorithm::Gcra), start);
            for (advance, cost) in steps {
                now += advance;
                let cost = cost % (burst + 2);
                let got = decide_gcra(&mut tat, &limit, now, cost);
                proptest::prop_assert_eq!(got, limit.decide(&mut reference, now, cost));
                proptest::prop_assert_eq!(State::Gcra(Gcra { tat_us: tat }), reference.clone());
                // Time going backwards too.
                let back = now.saturating_sub(advance / 2);
                let got = decide_gcra(&mut tat, &limit, back, 1);
                proptest::prop_assert_eq!(got, limit.decide(&mut reference, back, 1));
            }
        }
    }

    proptest::proptest! {
        /// The inlined token bucket equals the reference on any state, time, cost and quota.
        #[test]
        fn token_bucket_matches_the_reference(
            limit in 1u64..1_000,
            period in 1u64..100_000_000,
            burst in 1u64..1_000,
            start in 0u64..1u64 << 50,
            steps in proptest::collection::vec((0u64..3_000_000, 0u64..1_200), 1..40),
        ) {
            let Ok(quota) = Quota::from_parts(limit, period, burst) else {
                return Ok(());
            };
            let limit = Limit::token_bucket(quota);
            let mut bucket = TokenBucket::default();
            let (mut reference, mut now) = (State::fresh(Algorithm::TokenBucket), start);
            for (advance, cost) in steps {
                now += advance;
                let cost = cost % (burst + 2);
                let got = decide_token_bucket(&mut bucket, &limit, now, cost);
                proptest::prop_assert_eq!(got, limit.decide(&mut reference, now, cost));
                proptest::prop_assert_eq!(State::TokenBucket(bucket), reference.clone());
                let back = now.saturating_sub(advance / 2);
                let got = decide_token_bucket(&mut bucket, &limit, back, 1);
                proptest::prop_assert_eq!(got, limit.decide(&mut reference, back, 1));
            }
        }
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
        // Much later every entry has expired: the insert that finds the table full drops them.
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
                let packed = Packed::new(id(&key)).unwrap();
                let hash = id(&key).hash(&h);
                table.short.map.find(hash, |e| e.id.is(&packed)).is_some()
            })
            .count();
        assert!(old_left < 100, "the full table dropped nothing");
        table.purge(10_000_000, &h);
        assert_eq!(table.len(), 400, "purge keeps the live entries only");
    }

    /// Memory follows the live keys, not the history: 5 000 keys go through the table, never
    /// more than 100 live at once, and it stays within two doublings of the 128 buckets 100
    /// keys need (a pass late in a round, with more than 3/8 of the table live, grows it once).
    #[test]
    fn a_table_grows_with_live_entries_not_expired_ones() {
        let h = hasher();
        let limit = Limit::gcra(Quota::per_second(10).unwrap());
        let mut table = Table::default();
        // 50 rounds of 100 new keys, each round's keys expired (after 100 ms) by the next one.
        for round in 0u32..50 {
            let now = u64::from(round) * 1_000_000;
            for i in 0u32..100 {
                let key = (round * 100 + i).to_be_bytes();
                decide(&mut table, &h, &key, &limit, now, 1, usize::MAX);
            }
            assert!(table.short.map.num_buckets() <= 512, "round {round}");
            assert!(table.len() <= 448, "round {round}: {} entries", table.len());
        }
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
