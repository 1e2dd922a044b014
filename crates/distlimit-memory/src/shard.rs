//! One of the 64 shards: the tables behind one lock, the expiry of entries and the key cap.
//!
//! A GCRA state is one instant (the theoretical arrival time, which is also when the key may be
//! forgotten), stored next to its id packed into words ([`Compact`]): 16-byte entries for an
//! 8-byte key in the unnamed policy, 32 bytes for ids up to 22 bytes, 64 up to 54 bytes. A
//! token bucket (deficit, last refill) is stored the same way ([`Bucket`]): 24 bytes for an
//! 8-byte key, 64 for ids up to 46 bytes; its expiry is derived from the state and the quota it
//! was written under when an eviction or a purge asks for it, so a decision writes two words and
//! divides nothing for it. Every other state takes a 64-byte [`Wide`] entry.
//! A known key's decision under the quota it was written under runs core's one-pass decisions
//! with the quota's [`QuotaDivisors`], interned with the quota: no hardware division. [`Part`] is the one table code for every entry
//! type, through the [`Slot`] trait; [`Home`] says which table a request's state lives in.
//! Each entry also records, in 11 spare bits, which quota its state was written under (an index
//! into the shard's [`Stamps`]), so a state read under a changed quota is carried over.

use std::hash::{BuildHasher, Hasher};

use distlimit_core::algorithm::{Gcra, QuotaDivisors, TokenBucket};
use distlimit_core::{Algorithm, Decision, Grant, Limit, Quota, State};
use hashbrown::HashTable;

/// Entries sampled per table when the shard is at its key cap; the victim is the one that
/// becomes fresh soonest.
const SAMPLE: usize = 8;

/// What a state is stored under: a key in a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Id<'a> {
    pub(crate) key: &'a [u8],
    /// At most `MAX_POLICY_LEN` (128) bytes, so its length fits a byte.
    pub(crate) policy: &'a [u8],
}

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

/// `id` packed into `W` words, if it fits. One word holds exactly an 8-byte key in the unnamed
/// policy (a `u64` id in binary). More words hold `key ‖ policy` zero-padded, then the total
/// length and the policy's length in the last two bytes: two ids are equal exactly when their
/// words are.
#[inline(always)]
fn pack<const W: usize>(id: Id<'_>) -> Option<[u64; W]> {
    let (k, n) = (id.key.len(), id.key.len() + id.policy.len());
    let fits = if W == 1 {
        k == 8 && n == 8
    } else {
        n <= 8 * W - 2
    };
    if !fits {
        return None;
    }
    // Whole words of the key, then its rest and the policy by `or_bytes`: a variable-length
    // copy would be a `memcpy` call, which made the hot 24-byte key's decision a third slower
    // (compare bench).
    let mut words = [0u64; W];
    let mut chunks = id.key.chunks_exact(8);
    for (word, chunk) in words.iter_mut().zip(&mut chunks) {
        *word = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
    }
    or_bytes(&mut words, k / 8 * 8, chunks.remainder());
    or_bytes(&mut words, k, id.policy);
    if W > 1 {
        words[W - 1] |= (n as u64) << 48 | (id.policy.len() as u64) << 56;
    }
    Some(words)
}

/// ORs `src` into the little-endian bytes of `words` from byte `at` on: eight bytes at a time
/// (a word, or two when `at` is not word-aligned), the last few one by one.
#[inline(always)]
fn or_bytes<const W: usize>(words: &mut [u64; W], mut at: usize, src: &[u8]) {
    let mut chunks = src.chunks_exact(8);
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        let (i, shift) = (at / 8, at % 8 * 8);
        words[i] |= word << shift;
        if let (1.., Some(next)) = (shift, words.get_mut(i + 1)) {
            *next |= word >> (64 - shift);
        }
        at += 8;
    }
    for &byte in chunks.remainder() {
        words[at / 8] |= u64::from(byte) << (at % 8 * 8);
        at += 1;
    }
}

/// The keyed hash of the id `words` were packed from.
fn packed_hash<const W: usize, S: BuildHasher>(words: &[u64; W], hasher: &S) -> u64 {
    let mut bytes = [0u8; 64];
    for (chunk, word) in bytes.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    let (n, p) = if W == 1 {
        (8, 0)
    } else {
        let n = usize::from(bytes[8 * W - 2]).min(8 * W - 2);
        (n, usize::from(bytes[8 * W - 1]).min(n))
    };
    let (key, policy) = bytes[..n].split_at(n - p);
    Id { key, policy }.hash(hasher)
}

/// Alignments that keep a compact entry inside one cache line.
#[derive(Debug)]
#[repr(align(16))]
struct Align16;
#[derive(Debug)]
#[repr(align(32))]
struct Align32;
#[derive(Debug)]
#[repr(align(64))]
struct Align64;

/// Instants (a GCRA state's arrival time, a wide entry's expiry) take the low 53 bits of their
/// word; the 11 bits above hold the [`Stamps`] index of the quota the state was written under,
/// so a compact entry stays 16 bytes (memory per key is what users measure).
const STAMP_SHIFT: u32 = 53;
/// The largest instant a word holds: times up to 2^53 µs, as in core's contract.
const INSTANT_MASK: u64 = (1 << STAMP_SHIFT) - 1;
/// Stamp indices `1..=MAX_STAMPS`; 0 is "no stamp", read as written under the current quota.
const MAX_STAMPS: usize = (1 << (64 - STAMP_SHIFT)) - 1;

/// `a == b` in three compares instead of eight: every other field of a quota derives from its
/// limit, period and burst (see `Quota::from_parts`).
#[inline(always)]
fn same_quota(a: &Quota, b: &Quota) -> bool {
    ((a.limit() ^ b.limit()) | (a.period_us() ^ b.period_us()) | (a.burst() ^ b.burst())) == 0
}

/// An instant and a stamp index in one word.
#[inline(always)]
fn stamped(instant: u64, stamp: u64) -> u64 {
    instant.min(INSTANT_MASK) | stamp << STAMP_SHIFT
}

/// The quotas states were written under, interned per shard: entries keep an 11-bit index, so a
/// state read under a changed quota is carried over (`Limit::decide_from`) instead of being
/// read in the new quota's units. Once `MAX_STAMPS` distinct quotas were seen in a shard, new
/// ones are not recorded (index 0): such states read as written under the quota they are next
/// decided with.
#[derive(Debug, Default)]
struct Stamps {
    /// Each quota with its divisors: a known key's decision under the quota it was written
    /// under divides by multiplications (no hardware division).
    quotas: Vec<(Quota, QuotaDivisors)>,
    index: std::collections::HashMap<Quota, u64, foldhash::fast::RandomState>,
    /// The index [`of`](Self::of) last answered: nearly every insert of a shard is under the
    /// quota of the one before (SipHash of the quota on every insert cost a new key about 600
    /// instructions: callgrind, the demo with a million users).
    last: u64,
    /// The entry of `last` (`None` for 0), copied into the shard: a decision reads it at an
    /// address that does not wait for the entry's word (one load fewer on its critical path).
    hot: Option<(Quota, QuotaDivisors)>,
}

impl Stamps {
    /// The quota of stamp index `stamp`, `None` for "no stamp".
    #[inline(always)]
    fn get(&self, stamp: u64) -> Option<&Quota> {
        self.entry(stamp).map(|(quota, _)| quota)
    }

    /// The quota of stamp index `stamp` and its divisors, `None` for "no stamp".
    #[inline(always)]
    fn entry(&self, stamp: u64) -> Option<(&Quota, &QuotaDivisors)> {
        if stamp == self.last {
            return self.hot.as_ref().map(|(quota, divisors)| (quota, divisors));
        }
        let i = usize::try_from(stamp.checked_sub(1)?).ok()?;
        let (quota, divisors) = self.quotas.get(i)?;
        Some((quota, divisors))
    }

    /// The index of `quota`, interned on first use (0 when the registry is full).
    #[inline]
    fn of(&mut self, quota: &Quota) -> u64 {
        if self
            .hot
            .as_ref()
            .is_some_and(|(last, _)| same_quota(last, quota))
        {
            return self.last;
        }
        self.of_other(quota)
    }

    /// [`of`](Self::of) for a quota other than the last one's.
    #[inline(never)]
    fn of_other(&mut self, quota: &Quota) -> u64 {
        let i = match self.index.get(quota) {
            Some(&i) => i,
            None if self.quotas.len() >= MAX_STAMPS => return 0,
            None => {
                self.quotas.push((*quota, QuotaDivisors::new(quota)));
                let i = self.quotas.len() as u64;
                self.index.insert(*quota, i);
                i
            }
        };
        self.last = i;
        self.hot = self.quotas.get((i - 1) as usize).copied();
        i
    }
}

/// A state's `words` next to its id packed into `W` words; the zero-sized `A` sets the alignment.
#[derive(Debug)]
#[repr(C)]
struct Packed<const W: usize, A, S> {
    id: [u64; W],
    words: S,
    align: [A; 0],
}

/// A GCRA state: its theoretical arrival time and the stamp index (see [`stamped`]).
type Compact<const W: usize, A> = Packed<W, A, u64>;

impl<const W: usize, A> Compact<W, A> {
    #[inline(always)]
    fn state(&self) -> Gcra {
        Gcra {
            tat_us: self.words & INSTANT_MASK,
        }
    }
}

/// 16 bytes: an 8-byte key in the unnamed policy.
type WordEntry = Compact<1, Align16>;
/// 32 bytes: ids up to 22 bytes.
type ShortEntry = Compact<3, Align32>;
/// 64 bytes: ids up to 54 bytes.
type LongEntry = Compact<7, Align64>;

/// A [`Wide`] entry's id bytes, `key ‖ policy ‖ policy length`, inline up to 22 bytes (IP
/// addresses, user ids, UUIDs) and on the heap beyond.
#[derive(Debug)]
enum KeyBuf {
    Inline { len: u8, bytes: [u8; 22] },
    Heap(Box<[u8]>),
}

impl KeyBuf {
    fn new(id: Id<'_>) -> Self {
        let len = id.key.len() + id.policy.len() + 1;
        let policy_len = id.policy.len() as u8; // ≤ 128
        if len <= 22 {
            let mut bytes = [0; 22];
            bytes[..id.key.len()].copy_from_slice(id.key);
            bytes[id.key.len()..len - 1].copy_from_slice(id.policy);
            bytes[len - 1] = policy_len;
            KeyBuf::Inline {
                len: len as u8,
                bytes,
            }
        } else {
            KeyBuf::Heap(
                [id.key, id.policy, &[policy_len]]
                    .concat()
                    .into_boxed_slice(),
            )
        }
    }

    /// The stored pair.
    #[inline]
    fn id(&self) -> Id<'_> {
        let bytes = match self {
            KeyBuf::Inline { len, bytes } => &bytes[..usize::from(*len)],
            KeyBuf::Heap(bytes) => bytes,
        };
        let (rest, policy_len) = match bytes.split_last() {
            Some((&n, rest)) => (rest, usize::from(n).min(rest.len())),
            None => (bytes, 0),
        };
        let (key, policy) = rest.split_at(rest.len() - policy_len);
        Id { key, policy }
    }
}

/// Any state of any id, and the instant from which it may be forgotten.
#[derive(Debug)]
struct Wide {
    key: KeyBuf,
    /// The instant from which it may be forgotten, and the stamp index (see [`stamped`]).
    expires: u64,
    state: State,
}

/// A token-bucket state and the instant from which it may be forgotten.
type Bucket<const W: usize, A> = Packed<W, A, Refill>;

/// The words of a [`Bucket`]: no expiry, which [`Slot::expires_at`] derives from the state
/// under the quota of its stamp.
#[derive(Debug)]
struct Refill {
    /// [`TokenBucket::deficit`].
    deficit: u64,
    /// [`TokenBucket::last_us`] and the stamp index (see [`stamped`]).
    last_us: u64,
}

impl Refill {
    #[inline(always)]
    fn new(state: TokenBucket, stamp: u64) -> Self {
        Self {
            deficit: state.deficit,
            last_us: stamped(state.last_us, stamp),
        }
    }
}

impl<const W: usize, A> Bucket<W, A> {
    #[inline(always)]
    fn state(&self) -> TokenBucket {
        TokenBucket {
            deficit: self.words.deficit,
            last_us: self.words.last_us & INSTANT_MASK,
        }
    }

    /// The stamp index of the quota the state was written under.
    #[inline(always)]
    fn stamp(&self) -> u64 {
        self.words.last_us >> STAMP_SHIFT
    }

    /// Runs `f` on the state as a [`State`] with a stamped expiry word holding only the stamp
    /// (what [`charge_state`] and [`give_back_state`] take), then keeps the state and the stamp
    /// `f` left.
    fn with_state<R>(&mut self, f: impl FnOnce(&mut State, &mut u64) -> R) -> R {
        let mut state = State::TokenBucket(self.state());
        let mut expires = self.stamp() << STAMP_SHIFT;
        let out = f(&mut state, &mut expires);
        if let State::TokenBucket(state) = state {
            self.words = Refill::new(state, expires >> STAMP_SHIFT);
        }
        out
    }

    /// [`Slot::charge`] on any other path than a decision under the quota the state was
    /// written under: as a [`Wide`] entry's state. Out of line, so the common path inlines.
    #[inline(never)]
    fn charge_other(
        &mut self,
        how: Charge,
        limit: &Limit,
        now: u64,
        cost: u64,
        stamps: &mut Stamps,
    ) -> Decision {
        self.with_state(|state, expires| {
            charge_state(state, expires, how, limit, now, cost, stamps)
        })
    }

    /// Gives `units` back, as `Limit::give_back_from` (see [`give_back_state`]).
    fn give_back(&mut self, limit: &Limit, now: u64, units: u64, stamps: &Stamps) {
        self.with_state(|state, expires| {
            give_back_state(state, expires, limit, now, units, stamps);
        });
    }
}

/// 24 bytes: a token bucket of an 8-byte key in the unnamed policy.
type WordBucket = Bucket<1, u64>;
/// 64 bytes: a token bucket of an id up to 46 bytes.
type ShortBucket = Bucket<6, Align64>;

/// Whether packed ids are equal, word by word: array `==` called libc's `memcmp` (12 % of a
/// hot 24-byte key's time).
#[inline(always)]
fn same<const W: usize>(a: &[u64; W], b: &[u64; W]) -> bool {
    a.iter().zip(b).fold(0, |diff, (a, b)| diff | (a ^ b)) == 0
}

/// [`Slot::charge`] of a state stored with its stamped expiry `expires`: `Limit::decide_from`
/// or `Limit::force_from` under the quota it was written under.
#[inline]
fn charge_state(
    state: &mut State,
    expires: &mut u64,
    how: Charge,
    limit: &Limit,
    now: u64,
    cost: u64,
    stamps: &mut Stamps,
) -> Decision {
    let stamp = *expires >> STAMP_SHIFT;
    let before = stamps.get(stamp).copied();
    let mut written = before;
    match how {
        Charge::Decide => {
            let decision = if before.as_ref() == Some(limit.quota()) {
                limit.decide(state, now, cost) // `decide_from`, nothing to carry
            } else {
                limit.decide_from(state, &mut written, now, cost)
            };
            if written != before || (decision.is_allowed() && cost > 0) {
                // `State::expires_at` (property-tested equal in core), without a division:
                // the reset of an admission, or of the carried state when denied.
                let stamp = if written == before {
                    stamp
                } else {
                    stamps.of(limit.quota())
                };
                *expires = stamped(now.saturating_add(decision.reset_after_us()), stamp);
            }
            decision
        }
        Charge::Force => {
            let decision = limit
                .force_from(state, &mut written, now, cost)
                .unwrap_or_else(|_| limit.evaluate(Some(state), now, 0));
            *expires = stamped(state.expires_at(limit.quota()), stamps.of(limit.quota()));
            decision
        }
    }
}

/// Gives `units` back to a state stored with its stamped expiry `expires`, if it belongs to
/// `limit`'s algorithm: under the quota it was written under, which stays its quota.
fn give_back_state(
    state: &mut State,
    expires: &mut u64,
    limit: &Limit,
    now: u64,
    units: u64,
    stamps: &Stamps,
) {
    if state.algorithm() != limit.algorithm() {
        return;
    }
    let stamp = *expires >> STAMP_SHIFT;
    let mut written = stamps.get(stamp).copied();
    if limit
        .give_back_from(state, &mut written, now, units)
        .is_ok()
    {
        let written = written.as_ref().unwrap_or(limit.quota());
        *expires = stamped(state.expires_at(written), stamp);
    }
}

/// How a table's entries are found: by their id packed into words, or by the id itself.
trait Keyed {
    /// An id in the form this table compares: packed words, or the id itself.
    type Probe<'a>: Copy;
    /// `id` in that form, if it fits this table.
    fn probe(id: Id<'_>) -> Option<Self::Probe<'_>>;
    /// Whether this is the entry of `probe`.
    fn is(&self, probe: &Self::Probe<'_>) -> bool;
    /// The keyed hash of its id, for rehashing.
    fn hash<S: BuildHasher>(&self, hasher: &S) -> u64;
}

impl<const W: usize, A, S> Keyed for Packed<W, A, S> {
    type Probe<'a> = [u64; W];

    #[inline(always)]
    fn probe(id: Id<'_>) -> Option<[u64; W]> {
        pack(id)
    }

    #[inline(always)]
    fn is(&self, probe: &[u64; W]) -> bool {
        same(&self.id, probe)
    }

    fn hash<H: BuildHasher>(&self, hasher: &H) -> u64 {
        packed_hash(&self.id, hasher)
    }
}

/// An entry of one of a shard's tables.
trait Slot: Keyed {
    /// The instant from which the entry may be forgotten (`stamps`: the shard's quotas).
    fn expires_at(&self, stamps: &Stamps) -> u64;
    /// Charges this entry as `how` says: `Limit::decide_from` or `Limit::force_from` on its
    /// state, under the quota it was written under.
    fn charge(
        &mut self,
        how: Charge,
        limit: &Limit,
        now: u64,
        cost: u64,
        stamps: &mut Stamps,
    ) -> Decision;
    /// What `limit` would answer for `entry` (`None`: a fresh key), changing nothing.
    fn evaluate(
        entry: Option<&Self>,
        limit: &Limit,
        now: u64,
        cost: u64,
        stamps: &Stamps,
    ) -> Decision;
}

impl<const W: usize, A> Slot for Compact<W, A> {
    #[inline]
    fn expires_at(&self, _: &Stamps) -> u64 {
        self.words & INSTANT_MASK
    }

    #[inline(always)]
    fn charge(
        &mut self,
        how: Charge,
        limit: &Limit,
        now: u64,
        cost: u64,
        stamps: &mut Stamps,
    ) -> Decision {
        match how {
            Charge::Decide => self.decide(limit, now, cost, stamps),
            Charge::Force => self.force(limit, now, cost, stamps),
        }
    }

    #[inline]
    fn evaluate(
        entry: Option<&Self>,
        limit: &Limit,
        now: u64,
        cost: u64,
        stamps: &Stamps,
    ) -> Decision {
        let quota = limit.quota();
        let mut state = match entry {
            None => Gcra::default(),
            Some(entry) => match stamps.get(entry.words >> STAMP_SHIFT) {
                Some(from) if from != quota => entry.state().carried(from, quota, now),
                _ => entry.state(),
            },
        };
        state.decide(quota, now, cost)
    }
}

impl Keyed for Wide {
    type Probe<'a> = Id<'a>;

    #[inline(always)]
    fn probe(id: Id<'_>) -> Option<Id<'_>> {
        Some(id)
    }

    #[inline]
    fn is(&self, probe: &Id<'_>) -> bool {
        self.key.id() == *probe
    }

    fn hash<S: BuildHasher>(&self, hasher: &S) -> u64 {
        self.key.id().hash(hasher)
    }
}

impl Slot for Wide {
    #[inline]
    fn expires_at(&self, _: &Stamps) -> u64 {
        self.expires & INSTANT_MASK
    }

    #[inline]
    fn charge(
        &mut self,
        how: Charge,
        limit: &Limit,
        now: u64,
        cost: u64,
        stamps: &mut Stamps,
    ) -> Decision {
        charge_state(
            &mut self.state,
            &mut self.expires,
            how,
            limit,
            now,
            cost,
            stamps,
        )
    }

    #[inline]
    fn evaluate(
        entry: Option<&Self>,
        limit: &Limit,
        now: u64,
        cost: u64,
        stamps: &Stamps,
    ) -> Decision {
        match entry {
            None => limit.evaluate(None, now, cost),
            Some(e) => {
                let from = stamps.get(e.expires >> STAMP_SHIFT);
                limit.evaluate_from(Some(&e.state), from, now, cost)
            }
        }
    }
}

impl<const W: usize, A> Slot for Bucket<W, A> {
    #[inline]
    fn expires_at(&self, stamps: &Stamps) -> u64 {
        // A state whose quota was not recorded (the registry was full) is kept until evicted.
        stamps
            .entry(self.stamp())
            .map_or(u64::MAX, |(_, divisors)| {
                self.state().expires_with(divisors)
            })
    }

    #[inline(always)]
    fn charge(
        &mut self,
        how: Charge,
        limit: &Limit,
        now: u64,
        cost: u64,
        stamps: &mut Stamps,
    ) -> Decision {
        let stamp = self.stamp();
        if how == Charge::Decide
            && let Some((quota, divisors)) = stamps.entry(stamp)
            && same_quota(quota, limit.quota())
        {
            // The common case, in one pass: a decision under the quota the state was written
            // under (`Limit::decide_from` with nothing to carry over).
            let mut state = self.state();
            let decision = state.decide_with(quota, divisors, now, cost);
            if decision.is_allowed() && cost > 0 {
                self.words = Refill::new(state, stamp);
            }
            return decision;
        }
        self.charge_other(how, limit, now, cost, stamps)
    }

    #[inline]
    fn evaluate(
        entry: Option<&Self>,
        limit: &Limit,
        now: u64,
        cost: u64,
        stamps: &Stamps,
    ) -> Decision {
        match entry {
            None => limit.evaluate(None, now, cost),
            Some(e) => {
                let from = stamps.get(e.stamp());
                let state = State::TokenBucket(e.state());
                limit.evaluate_from(Some(&state), from, now, cost)
            }
        }
    }
}

/// How a request charges a key: a decision (only within the limit) or a report (whatever is
/// left, as debt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Charge {
    Decide,
    Force,
}

/// One swiss table of entries, and where its next sample for an eviction starts.
#[derive(Debug)]
struct Part<T> {
    map: HashTable<T>,
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
    #[inline(always)]
    fn get_mut(&mut self, hash: u64, id: Id<'_>) -> Option<&mut T> {
        let probe = T::probe(id)?;
        self.warm(hash, &probe);
        self.map.find_mut(hash, |e| e.is(&probe))
    }

    /// The index of `id`'s entry, if the table holds one: valid until the next insert or
    /// removal.
    #[inline(always)]
    fn find(&self, hash: u64, id: Id<'_>) -> Option<usize> {
        let probe = T::probe(id)?;
        self.warm(hash, &probe);
        self.map.find_bucket_index(hash, |e| e.is(&probe))
    }

    /// Reads the entry in the first bucket `hash` probes, where an entry usually sits, before
    /// the table's own search. The search loads the control bytes, then the entry their value
    /// points to: over a table larger than the caches, two misses one after the other. This
    /// read depends on the control byte only through a branch (is the bucket full), which the
    /// processor predicts, so its miss overlaps the control bytes' one and the search finds
    /// both lines on their way.
    #[inline(always)]
    fn warm(&self, hash: u64, probe: &T::Probe<'_>) {
        let first = self.first_bucket(hash);
        std::hint::black_box(self.map.get_bucket(first).is_some_and(|e| e.is(probe)));
    }

    /// The bucket hashbrown probes first for `hash`: its low bits (`h1`) masked to the bucket
    /// count. Were that to change, [`warm`](Self::warm)'s read would only be wasted: it decides
    /// nothing.
    #[inline(always)]
    fn first_bucket(&self, hash: u64) -> usize {
        hash as usize & self.map.num_buckets().wrapping_sub(1)
    }

    fn remove(&mut self, hash: u64, id: Id<'_>) {
        if let Some(probe) = T::probe(id)
            && let Ok(entry) = self.map.find_entry(hash, |e| e.is(&probe))
        {
            entry.remove();
        }
    }

    /// Stores the entry of an id the table does not hold. Expired entries never grow the
    /// table: when it is full (the next insert would grow it), they are dropped in one pass and
    /// an eighth of the capacity is kept free, so passes are at least `capacity / 8` inserts
    /// apart.
    fn insert<S: BuildHasher>(
        &mut self,
        hash: u64,
        entry: T,
        now: u64,
        hasher: &S,
        stamps: &Stamps,
    ) {
        let capacity = self.map.capacity();
        if self.map.len() >= capacity {
            self.drop_expired(now, stamps);
            self.map.reserve(capacity / 8 + 1, |e| e.hash(hasher));
        }
        self.map.insert_unique(hash, entry, |e| e.hash(hasher));
    }

    /// Of up to [`SAMPLE`] entries after the cursor, the one that expires first: its expiry and
    /// bucket. Bucket positions follow the keyed hash, so clients cannot choose the sample. The
    /// scan spans the buckets that hold `2 × SAMPLE` entries on average, or the whole table.
    fn sample(&mut self, whole: bool, stamps: &Stamps) -> Option<(u64, usize)> {
        if self.map.is_empty() {
            return None;
        }
        let buckets = self.map.num_buckets();
        let scan = if whole {
            buckets
        } else {
            (2 * SAMPLE * buckets / self.map.len()).min(buckets)
        };
        let mut best: Option<(u64, usize)> = None;
        let mut seen = 0;
        for _ in 0..scan {
            self.cursor = (self.cursor + 1) % buckets;
            if let Some(entry) = self.map.get_bucket(self.cursor) {
                let expires = entry.expires_at(stamps);
                if best.is_none_or(|(at, _)| expires < at) {
                    best = Some((expires, self.cursor));
                }
                seen += 1;
                if seen == SAMPLE {
                    break;
                }
            }
        }
        best
    }

    fn remove_bucket(&mut self, bucket: usize) {
        if let Ok(entry) = self.map.get_bucket_entry(bucket) {
            entry.remove();
        }
    }

    fn drop_expired(&mut self, now: u64, stamps: &Stamps) {
        self.map.retain(|e| e.expires_at(stamps) > now);
    }

    /// Drops every expired entry and gives back memory a flood left behind.
    fn purge<S: BuildHasher>(&mut self, now: u64, hasher: &S, stamps: &Stamps) {
        self.drop_expired(now, stamps);
        if self.map.capacity() > 4 * self.map.len().max(16) {
            self.map.shrink_to(self.map.len(), |e| e.hash(hasher));
            self.cursor = 0;
        }
    }
}

impl<const W: usize, A> Compact<W, A> {
    /// Decides a GCRA request on this entry.
    #[inline(always)]
    fn decide(&mut self, limit: &Limit, now: u64, cost: u64, stamps: &mut Stamps) -> Decision {
        let quota = limit.quota();
        let stamp = self.words >> STAMP_SHIFT;
        match stamps.entry(stamp) {
            Some((from, divisors)) if same_quota(from, quota) => {
                // The common case: written under this quota.
                let mut state = self.state();
                let decision = state.decide_with(quota, divisors, now, cost);
                if decision.is_allowed() && cost > 0 {
                    self.words = stamped(state.tat_us, stamp);
                }
                decision
            }
            Some((from, _)) => {
                // Written under another quota: carried over, kept even when denied, but not by
                // a peek or a cost above the capacity (`Limit::decide_from`).
                let mut state = self.state().carried(from, quota, now);
                let decision = state.decide(quota, now, cost);
                if cost > 0 && cost <= quota.burst() {
                    self.words = stamped(state.tat_us, stamps.of(quota));
                }
                decision
            }
            None => {
                let mut state = self.state();
                let decision = state.decide(quota, now, cost);
                if decision.is_allowed() && cost > 0 {
                    self.words = stamped(state.tat_us, stamps.of(quota));
                }
                decision
            }
        }
    }

    /// Charges `cost` to this GCRA entry whatever is left ([`Gcra::force`]): carried over first
    /// when written under another quota, as `Limit::force_from`.
    fn force(&mut self, limit: &Limit, now: u64, cost: u64, stamps: &mut Stamps) -> Decision {
        let quota = limit.quota();
        let stamp = self.words >> STAMP_SHIFT;
        let (mut state, stamp) = match stamps.get(stamp) {
            Some(from) if from != quota => {
                (self.state().carried(from, quota, now), stamps.of(quota))
            }
            _ if stamp == 0 => (self.state(), stamps.of(quota)),
            _ => (self.state(), stamp),
        };
        state.force(quota, now, cost);
        self.words = stamped(state.tat_us, stamp);
        state.decide(quota, now, 0)
    }
}

impl<const W: usize, A> Part<Compact<W, A>> {
    /// Gives `units` back to `id`'s GCRA entry, if the table holds one: under the quota it was
    /// written under, which stays its quota, as `Limit::give_back_from`.
    fn give_back(
        &mut self,
        hash: u64,
        id: Id<'_>,
        quota: &Quota,
        now: u64,
        units: u64,
        stamps: &Stamps,
    ) {
        let Some(entry) = self.get_mut(hash, id) else {
            return;
        };
        let stamp = entry.words >> STAMP_SHIFT;
        let mut state = entry.state();
        // More than the capacity counts as the capacity, as `Limit::give_back`.
        let written = stamps.get(stamp).unwrap_or(quota);
        state.give_back(written, now, units.min(written.burst()));
        entry.words = stamped(state.tat_us, stamp);
    }
}

impl<const W: usize, A, S> Part<Packed<W, A, S>>
where
    Packed<W, A, S>: Slot,
{
    /// Stores `words` as the state of `id`, which the table does not hold.
    fn insert_packed<H: BuildHasher>(
        &mut self,
        hash: u64,
        id: Id<'_>,
        words: S,
        now: u64,
        h: &H,
        stamps: &Stamps,
    ) {
        if let Some(id) = pack(id) {
            let entry = Packed {
                id,
                words,
                align: [],
            };
            self.insert(hash, entry, now, h, stamps);
        }
    }
}

/// Which table holds a request's state: GCRA states of ids up to 54 bytes and token buckets of
/// ids up to 46 bytes in compact entries, everything else in [`Wide`] ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Home {
    /// A GCRA state of an 8-byte key in the unnamed policy.
    Word,
    /// A GCRA state of another id of at most 22 bytes.
    Short,
    /// A GCRA state of another id of at most 54 bytes.
    Long,
    /// A token bucket of an 8-byte key in the unnamed policy.
    WordBucket,
    /// A token bucket of another id of at most 46 bytes.
    ShortBucket,
    /// Any other state.
    Wide,
}

impl Home {
    /// The table `id` would have with a GCRA state.
    #[inline(always)]
    fn compact(id: Id<'_>) -> Self {
        let n = id.key.len() + id.policy.len();
        if id.key.len() == 8 && id.policy.is_empty() {
            Home::Word
        } else if n <= 22 {
            Home::Short
        } else if n <= 54 {
            Home::Long
        } else {
            Home::Wide
        }
    }

    /// The table `id` would have with a token-bucket state.
    #[inline(always)]
    fn bucket(id: Id<'_>) -> Self {
        if id.key.len() == 8 && id.policy.is_empty() {
            Home::WordBucket
        } else if id.key.len() + id.policy.len() <= 46 {
            Home::ShortBucket
        } else {
            Home::Wide
        }
    }

    #[inline(always)]
    fn of(id: Id<'_>, limit: &Limit) -> Self {
        match limit.algorithm() {
            Algorithm::Gcra => Home::compact(id),
            Algorithm::TokenBucket => Home::bucket(id),
            _ => Home::Wide,
        }
    }
}

/// Runs `$body` with `$part` bound to the table of `$home` in `$table` (borrowed as `&` or
/// `&mut`): the one dispatch from a [`Home`] to its table.
macro_rules! in_part {
    (&mut $table:ident, $home:expr, |$part:ident| $body:expr) => {
        in_part!((mut) $table, $home, |$part| $body)
    };
    (&$table:ident, $home:expr, |$part:ident| $body:expr) => {
        in_part!(() $table, $home, |$part| $body)
    };
    (($($mut:tt)?) $table:ident, $home:expr, |$part:ident| $body:expr) => {
        match $home {
            Home::Word => {
                let $part = &$($mut)? $table.word;
                $body
            }
            Home::Short => {
                let $part = &$($mut)? $table.short;
                $body
            }
            Home::Long => {
                let $part = &$($mut)? $table.long;
                $body
            }
            Home::WordBucket => {
                let $part = &$($mut)? $table.word_bucket;
                $body
            }
            Home::ShortBucket => {
                let $part = &$($mut)? $table.short_bucket;
                $body
            }
            Home::Wide => {
                let $part = &$($mut)? $table.wide;
                $body
            }
        }
    };
}

/// Where a request's state is in a [`Table`] ([`Table::find`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct At {
    home: Home,
    /// The entry's index in its table; `None`: a fresh key there.
    entry: Option<usize>,
}

impl At {
    /// Whether the table holds no state for the request: deciding it inserts one.
    pub(crate) fn is_fresh(&self) -> bool {
        self.entry.is_none()
    }
}

/// The tables behind one shard lock, one per [`Home`]; an id lives in at most one of them.
#[derive(Debug, Default)]
pub(crate) struct Table {
    word: Part<WordEntry>,
    short: Part<ShortEntry>,
    long: Part<LongEntry>,
    word_bucket: Part<WordBucket>,
    short_bucket: Part<ShortBucket>,
    wide: Part<Wide>,
    /// The quotas the states were written under.
    stamps: Stamps,
    /// Inserts since expired entries were last dropped at the key cap.
    inserts: usize,
    /// Whether a live key was evicted to make room since [`take_evicted`](Self::take_evicted).
    /// Kept here rather than returned with each decision: a `(Decision, bool)` puts the flag in
    /// the decision's padding, and reading it back stalls the decision on a store-to-load
    /// forward.
    evicted: bool,
}

impl Table {
    /// Whether a live key was evicted to make room since the last call.
    #[inline]
    pub(crate) fn take_evicted(&mut self) -> bool {
        std::mem::take(&mut self.evicted)
    }

    pub(crate) fn len(&self) -> usize {
        self.word.map.len()
            + self.short.map.len()
            + self.long.map.len()
            + self.word_bucket.map.len()
            + self.short_bucket.map.len()
            + self.wide.map.len()
    }

    /// What `limit` would answer for `id` now, changing nothing. A state of another algorithm
    /// counts as a fresh key, so only the request's own table is searched.
    pub(crate) fn evaluate(
        &self,
        hash: u64,
        id: Id<'_>,
        limit: &Limit,
        now: u64,
        cost: u64,
    ) -> Decision {
        self.evaluate_at(self.find(hash, id, limit), limit, now, cost)
    }

    /// Where `id`'s state under `limit` is: its table, and its entry's index there if it has
    /// one. Valid under this lock until the next insert or removal: what a batch decides in
    /// two passes ([`evaluate_at`](Self::evaluate_at), then [`decide_at`](Self::decide_at))
    /// looks up once.
    #[inline]
    pub(crate) fn find(&self, hash: u64, id: Id<'_>, limit: &Limit) -> At {
        let home = Home::of(id, limit);
        let entry = in_part!(&self, home, |part| part.find(hash, id));
        At { home, entry }
    }

    /// [`evaluate`](Self::evaluate) of the state [`find`](Self::find) found.
    #[inline]
    pub(crate) fn evaluate_at(&self, at: At, limit: &Limit, now: u64, cost: u64) -> Decision {
        let stamps = &self.stamps;
        in_part!(&self, at.home, |part| {
            let entry = at.entry.and_then(|i| part.map.get_bucket(i));
            Slot::evaluate(entry, limit, now, cost, stamps)
        })
    }

    /// [`decide`](Self::decide) of the state [`find`](Self::find) found (nothing inserted or
    /// removed in between).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn decide_at<S: BuildHasher>(
        &mut self,
        at: At,
        hash: u64,
        id: Id<'_>,
        limit: &Limit,
        now: u64,
        cost: u64,
        max_len: usize,
        hasher: &S,
    ) -> Decision {
        let stamps = &mut self.stamps;
        let known = in_part!(&mut self, at.home, |part| {
            let entry = at.entry.and_then(|i| part.map.get_bucket_mut(i));
            entry.map(|e| e.charge(Charge::Decide, limit, now, cost, stamps))
        });
        match known {
            Some(decision) => decision,
            None => self.charge_fresh(
                Charge::Decide,
                hash,
                id,
                at.home,
                limit,
                now,
                cost,
                max_len,
                hasher,
            ),
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
    ) -> Decision {
        self.charge(Charge::Decide, hash, id, limit, now, cost, max_len, hasher)
    }

    /// Charges one request as `how` says, on the id's entry in its table or else on a fresh
    /// state (the one dispatch of decisions and reports).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn charge<S: BuildHasher>(
        &mut self,
        how: Charge,
        hash: u64,
        id: Id<'_>,
        limit: &Limit,
        now: u64,
        cost: u64,
        max_len: usize,
        hasher: &S,
    ) -> Decision {
        let home = Home::of(id, limit);
        let stamps = &mut self.stamps;
        let known = in_part!(&mut self, home, |part| {
            let entry = part.get_mut(hash, id);
            entry.map(|e| e.charge(how, limit, now, cost, stamps))
        });
        match known {
            Some(decision) => decision,
            None => self.charge_fresh(how, hash, id, home, limit, now, cost, max_len, hasher),
        }
    }

    /// Withdraws up to `want` available units, as `Limit::take_from`: a peek, then one
    /// admitted request of the units granted.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn take<S: BuildHasher>(
        &mut self,
        hash: u64,
        id: Id<'_>,
        limit: &Limit,
        now: u64,
        want: u64,
        max_len: usize,
        hasher: &S,
    ) -> Grant {
        let peek = self.evaluate(hash, id, limit, now, 0);
        let granted = want.min(peek.remaining());
        if granted == 0 {
            return Grant {
                granted,
                decision: peek,
            };
        }
        let decision = self.decide(hash, id, limit, now, granted, max_len, hasher);
        Grant { granted, decision }
    }

    /// Gives `units` back to `id`'s state, as `Limit::give_back_from`; a key without a state of
    /// this algorithm is full already.
    pub(crate) fn give_back(&mut self, hash: u64, id: Id<'_>, limit: &Limit, now: u64, units: u64) {
        if units == 0 {
            return;
        }
        let quota = limit.quota();
        let stamps = &self.stamps;
        match Home::of(id, limit) {
            Home::Word => self.word.give_back(hash, id, quota, now, units, stamps),
            Home::Short => self.short.give_back(hash, id, quota, now, units, stamps),
            Home::Long => self.long.give_back(hash, id, quota, now, units, stamps),
            Home::WordBucket => {
                if let Some(entry) = self.word_bucket.get_mut(hash, id) {
                    entry.give_back(limit, now, units, stamps);
                }
            }
            Home::ShortBucket => {
                if let Some(entry) = self.short_bucket.get_mut(hash, id) {
                    entry.give_back(limit, now, units, stamps);
                }
            }
            Home::Wide => {
                if let Some(entry) = self.wide.get_mut(hash, id) {
                    give_back_state(
                        &mut entry.state,
                        &mut entry.expires,
                        limit,
                        now,
                        units,
                        stamps,
                    );
                }
            }
        }
    }

    /// Settles one request (a report, else a give-back, on the token bucket or GCRA, checked by the
    /// caller): `Limit::force_from` or `Limit::give_back_from`, answering the peek after it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn settle<S: BuildHasher>(
        &mut self,
        hash: u64,
        id: Id<'_>,
        limit: &Limit,
        report: bool,
        now: u64,
        cost: u64,
        max_len: usize,
        hasher: &S,
    ) -> Decision {
        if !report {
            self.give_back(hash, id, limit, now, cost);
            return self.evaluate(hash, id, limit, now, 0);
        }
        self.charge(Charge::Force, hash, id, limit, now, cost, max_len, hasher)
    }

    /// [`charge`](Self::charge) for an id not in its table: a fresh key, or one whose state
    /// belongs to another algorithm (then in another table), which counts as fresh and is
    /// replaced when this request is stored (a decision that charged, or a report). Out of
    /// line, so the known-key path inlines.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn charge_fresh<S: BuildHasher>(
        &mut self,
        how: Charge,
        hash: u64,
        id: Id<'_>,
        home: Home,
        limit: &Limit,
        now: u64,
        cost: u64,
        max_len: usize,
        hasher: &S,
    ) -> Decision {
        let mut state = State::fresh(limit.algorithm());
        // Interned for the insert; a decision also takes the quota's divisors from it.
        let stamp = self.stamps.of(limit.quota());
        let (decision, expires) = match how {
            Charge::Decide => {
                // The one-pass decisions (equal to `Limit::decide`, property-tested in core).
                let decision = match (&mut state, self.stamps.entry(stamp)) {
                    (State::TokenBucket(s), Some((_, divisors))) => {
                        s.decide_with(limit.quota(), divisors, now, cost)
                    }
                    (State::Gcra(s), Some((_, divisors))) => {
                        s.decide_with(limit.quota(), divisors, now, cost)
                    }
                    (state, _) => limit.decide(state, now, cost),
                };
                if !decision.is_allowed() || cost == 0 {
                    return decision;
                }
                (decision, now.saturating_add(decision.reset_after_us()))
            }
            Charge::Force => match limit.force(&mut state, now, cost) {
                Ok(decision) => (decision, state.expires_at(limit.quota())),
                Err(_) => return limit.evaluate(None, now, 0),
            },
        };
        self.evicted |=
            self.insert_fresh(hash, id, home, stamp, state, expires, now, max_len, hasher);
        decision
    }

    /// Inserts `state`, just written under the quota of `stamp` and equivalent to a fresh one
    /// from `expires` on, for an id not in its table (removing a state of another algorithm from the other
    /// tables). True if a live key was evicted.
    #[allow(clippy::too_many_arguments)]
    fn insert_fresh<S: BuildHasher>(
        &mut self,
        hash: u64,
        id: Id<'_>,
        home: Home,
        stamp: u64,
        state: State,
        expires: u64,
        now: u64,
        max_len: usize,
        hasher: &S,
    ) -> bool {
        // A state of another algorithm lives in one of the id's other tables (`Wide` may be
        // searched twice, for a GCRA id of 47 to 54 bytes: the second search finds nothing).
        for other in [Home::compact(id), Home::bucket(id), Home::Wide] {
            if other != home && in_part!(&self, other, |part| !part.map.is_empty()) {
                self.remove_from(other, hash, id);
            }
        }
        let evicted = self.len() >= max_len && self.evict(now, max_len);
        self.inserts += 1;
        match (home, state) {
            (Home::Word, State::Gcra(gcra)) => {
                let word = stamped(gcra.tat_us, stamp);
                self.word
                    .insert_packed(hash, id, word, now, hasher, &self.stamps)
            }
            (Home::Short, State::Gcra(gcra)) => {
                let word = stamped(gcra.tat_us, stamp);
                self.short
                    .insert_packed(hash, id, word, now, hasher, &self.stamps)
            }
            (Home::Long, State::Gcra(gcra)) => {
                let word = stamped(gcra.tat_us, stamp);
                self.long
                    .insert_packed(hash, id, word, now, hasher, &self.stamps)
            }
            (Home::WordBucket, State::TokenBucket(state)) => {
                let refill = Refill::new(state, stamp);
                self.word_bucket
                    .insert_packed(hash, id, refill, now, hasher, &self.stamps)
            }
            (Home::ShortBucket, State::TokenBucket(state)) => {
                let refill = Refill::new(state, stamp);
                self.short_bucket
                    .insert_packed(hash, id, refill, now, hasher, &self.stamps)
            }
            (_, state) => {
                let expires = stamped(expires, stamp);
                let entry = Wide {
                    key: KeyBuf::new(id),
                    expires,
                    state,
                };
                self.wide.insert(hash, entry, now, hasher, &self.stamps);
            }
        }
        evicted
    }

    /// Removes `id`'s entry from the table of `home`, if it holds one. Out of line: only ids
    /// decided under several algorithms get here.
    #[cold]
    #[inline(never)]
    fn remove_from(&mut self, home: Home, hash: u64, id: Id<'_>) {
        in_part!(&mut self, home, |part| part.remove(hash, id));
    }

    /// Frees one place in a shard at its cap of `max_len` entries: drops the expired entries
    /// (a pass at most every `max_len / 8` inserts), else removes, of a few sampled entries per
    /// table, the one that becomes fresh soonest. True if that one was still live: an eviction.
    fn evict(&mut self, now: u64, max_len: usize) -> bool {
        if self.inserts >= max_len / 8 {
            self.inserts = 0;
            self.word.drop_expired(now, &self.stamps);
            self.short.drop_expired(now, &self.stamps);
            self.long.drop_expired(now, &self.stamps);
            self.word_bucket.drop_expired(now, &self.stamps);
            self.short_bucket.drop_expired(now, &self.stamps);
            self.wide.drop_expired(now, &self.stamps);
            if self.len() < max_len {
                return false;
            }
        }
        // A short scan may show no entry by chance: then whole tables are scanned.
        let victim = self.sample(false).or_else(|| self.sample(true));
        let Some(((expires_at, bucket), part)) = victim else {
            return false;
        };
        match part {
            0 => self.word.remove_bucket(bucket),
            1 => self.short.remove_bucket(bucket),
            2 => self.long.remove_bucket(bucket),
            3 => self.word_bucket.remove_bucket(bucket),
            4 => self.short_bucket.remove_bucket(bucket),
            _ => self.wide.remove_bucket(bucket),
        }
        expires_at > now
    }

    /// The entry that expires first of a sample of each table (see [`Part::sample`]), with the
    /// index of its table.
    fn sample(&mut self, whole: bool) -> Option<((u64, usize), usize)> {
        [
            self.word.sample(whole, &self.stamps),
            self.short.sample(whole, &self.stamps),
            self.long.sample(whole, &self.stamps),
            self.word_bucket.sample(whole, &self.stamps),
            self.short_bucket.sample(whole, &self.stamps),
            self.wide.sample(whole, &self.stamps),
        ]
        .into_iter()
        .enumerate()
        .filter_map(|(part, sample)| Some((sample?, part)))
        .min()
    }

    /// Drops every expired entry and gives back memory a flood left behind.
    pub(crate) fn purge<S: BuildHasher>(&mut self, now: u64, hasher: &S) {
        self.word.purge(now, hasher, &self.stamps);
        self.short.purge(now, hasher, &self.stamps);
        self.long.purge(now, hasher, &self.stamps);
        self.word_bucket.purge(now, hasher, &self.stamps);
        self.short_bucket.purge(now, hasher, &self.stamps);
        self.wide.purge(now, hasher, &self.stamps);
    }
}

#[cfg(all(test, not(distlimit_loom)))]
mod tests {
    use super::*;
    use distlimit_core::Quota;
    use proptest::prelude::*;

    type Hasher = foldhash::quality::RandomState;

    /// Interning answers each quota its own index whichever was asked last (the one-entry
    /// cache of the last answer included), and reads it back.
    #[test]
    fn stamps_intern_each_quota_once() {
        let a = Quota::per_second(10).unwrap();
        let b = Quota::per_minute(10).unwrap();
        let mut stamps = Stamps::default();
        assert_eq!(stamps.get(0), None);
        for _ in 0..3 {
            assert_eq!(stamps.of(&a), 1);
            assert_eq!(stamps.of(&a), 1);
            assert_eq!(stamps.of(&b), 2);
        }
        assert_eq!(stamps.get(1), Some(&a));
        assert_eq!(stamps.get(2), Some(&b));
        assert_eq!(stamps.quotas.len(), 2);
    }

    fn id(key: &[u8]) -> Id<'_> {
        Id { key, policy: b"" }
    }

    proptest! {
        /// Quotas are equal exactly when their limits, periods and bursts are.
        #[test]
        fn same_quota_is_equality(
            a in (1u64..50, 1u64..5_000_000, 1u64..50),
            b in (1u64..50, 1u64..5_000_000, 1u64..50),
            same in any::<bool>(),
        ) {
            let (Ok(a), Ok(b)) = (Quota::from_parts(a.0, a.1, a.2), Quota::from_parts(b.0, b.1, b.2)) else {
                return Ok(());
            };
            let b = if same { a.with_burst(b.burst()).unwrap_or(a) } else { b };
            prop_assert_eq!(same_quota(&a, &b), a == b);
            prop_assert!(same_quota(&a, &a));
        }
    }

    /// A table and the hasher that places its keys.
    #[derive(Default)]
    struct Keyed(Table, Hasher);

    impl Keyed {
        /// Decides on `key` in the unnamed policy.
        fn decide(
            &mut self,
            key: &[u8],
            limit: &Limit,
            now: u64,
            cost: u64,
            max: usize,
        ) -> (Decision, bool) {
            let Keyed(table, h) = self;
            let decision = table.decide(id(key).hash(h), id(key), limit, now, cost, max, h);
            (decision, table.take_evicted())
        }
    }

    /// `Part::warm`'s premise: most entries sit in the first bucket their hash probes. Should
    /// hashbrown probe from elsewhere, the read ahead is wasted on every decision; this says so.
    #[test]
    fn most_entries_sit_where_the_read_ahead_looks() {
        let limit = Limit::gcra(Quota::per_second(1).unwrap());
        let mut keyed = Keyed::default();
        let keys: Vec<[u8; 8]> = (0..50_000_u64).map(u64::to_le_bytes).collect();
        for key in &keys {
            assert!(keyed.decide(key, &limit, 1, 1, usize::MAX).0.is_allowed());
        }
        let Keyed(table, h) = &keyed;
        let part = &table.word;
        let at_first = keys
            .iter()
            .filter(|key| {
                let (hash, probe) = (id(&key[..]).hash(h), pack::<1>(id(&key[..])).unwrap());
                let first = part.map.get_bucket(part.first_bucket(hash));
                first.is_some_and(|e| <WordEntry as super::Keyed>::is(e, &probe))
            })
            .count();
        assert_eq!(part.map.len(), keys.len());
        assert!(at_first * 2 > keys.len(), "{at_first} of {}", keys.len());
    }

    #[test]
    fn entry_sizes_and_alignments() {
        fn layout<T>() -> (usize, usize) {
            (std::mem::size_of::<T>(), std::mem::align_of::<T>())
        }
        assert_eq!(layout::<WordEntry>(), (16, 16));
        assert_eq!(layout::<ShortEntry>(), (32, 32));
        assert_eq!(layout::<LongEntry>(), (64, 64));
        // A quarter less memory than a 32-byte entry, although one in four crosses a line.
        assert_eq!(layout::<WordBucket>(), (24, 8));
        assert_eq!(layout::<ShortBucket>(), (64, 64));
        assert_eq!(layout::<Wide>().0, 64);
    }

    fn packed_round_trip<const W: usize>() {
        let h = Hasher::default();
        let bytes: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) | 1).collect();
        let mut seen: Vec<[u64; W]> = Vec::new();
        for n in 0..=8 * W {
            for p in 0..=n {
                let id = Id {
                    key: &bytes[..n - p],
                    policy: &bytes[n - p..n],
                };
                let Some(words) = pack::<W>(id) else {
                    assert!(n > 8 * W - 2 || (W == 1 && (n, p) != (8, 0)), "{n}, {p}");
                    continue;
                };
                assert_eq!(packed_hash(&words, &h), id.hash(&h), "{n}, {p}");
                assert!(!seen.contains(&words), "{n} bytes, policy {p}");
                seen.push(words);
            }
        }
        // Trailing zero bytes are part of the id.
        if W > 1 {
            assert_ne!(pack::<W>(id(&[0])), pack::<W>(id(&[0, 0])));
        }
    }

    #[test]
    fn packed_ids_round_trip_and_differ_when_the_pair_differs() {
        packed_round_trip::<1>();
        packed_round_trip::<3>();
        packed_round_trip::<5>();
        packed_round_trip::<7>();
    }

    #[test]
    fn key_buf_round_trips_inline_and_heap() {
        for len in [1, 2, 20, 21, 22, 1024] {
            let key: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
            for policy in [&b""[..], b"p", b"per-day", &[0xff; 128]] {
                let id = Id { key: &key, policy };
                assert_eq!(KeyBuf::new(id).id(), id);
            }
        }
        assert!(matches!(KeyBuf::new(id(&[0; 21])), KeyBuf::Inline { .. }));
        assert!(matches!(KeyBuf::new(id(&[0; 22])), KeyBuf::Heap(_)));
    }

    /// Keys of every home: an 8-byte key, short ids (GCRA up to 22 bytes, token buckets up to
    /// 46 with or without a name of 9 bytes), long ids (up to 54 bytes) and wide ones.
    const KEYS: [&[u8]; 6] = [
        b"8 bytes!",
        b"client",
        &[5; 24],
        &[6; 33],
        &[7; 40],
        &[9; 60],
    ];

    proptest! {
        /// The table decides like `Limit::decide_from` on a state per id and the quota it was
        /// written under, whatever the sequence of keys, policies, algorithms, quotas (changed
        /// between requests), costs and times, and holds an id once: states move between tables
        /// when the algorithm changes. (Time going back is core's arithmetic, property-tested
        /// there; a store may forget an expired state, so here time moves on.)
        #[test]
        fn the_table_agrees_with_the_reference(
            quotas in proptest::collection::vec((1u64..1_000, 1u64..100_000_000, 1u64..1_000), 2),
            start in 0u64..1u64 << 50,
            steps in proptest::collection::vec(
                (0usize..KEYS.len(), any::<bool>(), 0usize..4, 0u64..3_000_000, 0u64..1_200, 0usize..2),
                1..60,
            ),
        ) {
            let quotas: Vec<Quota> = quotas
                .into_iter()
                .filter_map(|(l, p, b)| Quota::from_parts(l, p, b).ok())
                .collect();
            if quotas.len() < 2 {
                return Ok(());
            }
            let limits = |q: Quota| {
                [Limit::gcra(q), Limit::token_bucket(q), Limit::fixed_window(q), Limit::sliding_window(q)]
            };
            let h = Hasher::default();
            let mut table = Table::default();
            let mut reference: Vec<((usize, bool), State, Option<Quota>)> = Vec::new();
            let mut now = start;
            for (key, named, algorithm, advance, cost, quota) in steps {
                now += advance;
                let limit = limits(quotas[quota])[algorithm];
                let cost = cost % (limit.capacity() + 2);
                let id = Id { key: KEYS[key], policy: if named { b"api/burst" } else { b"" } };
                let hash = id.hash(&h);
                let i = match reference.iter().position(|(k, _, _)| *k == (key, named)) {
                    Some(i) => i,
                    None => {
                        reference.push(((key, named), State::fresh(limit.algorithm()), None));
                        reference.len() - 1
                    }
                };
                let (_, state, written) = &mut reference[i];
                let peek = table.evaluate(hash, id, &limit, now, cost);
                prop_assert_eq!(peek, limit.evaluate_from(Some(state), written.as_ref(), now, cost));
                let got = table.decide(hash, id, &limit, now, cost, usize::MAX, &h);
                let evicted = table.take_evicted();
                prop_assert_eq!(got, limit.decide_from(state, written, now, cost));
                prop_assert!(!evicted);
                prop_assert!(table.len() <= reference.len());
            }
        }
    }

    #[test]
    fn expired_entries_are_dropped_when_the_table_is_full() {
        let limit = Limit::gcra(Quota::per_second(10).unwrap());
        let mut t = Keyed::default();
        for i in 0u32..100 {
            t.decide(&i.to_be_bytes(), &limit, 0, 1, usize::MAX);
        }
        assert_eq!(t.0.len(), 100);
        // Much later every entry has expired: the insert that finds the table full drops them.
        for i in 1000u32..1400 {
            t.decide(&i.to_be_bytes(), &limit, 10_000_000, 1, usize::MAX);
        }
        let Keyed(table, h) = &mut t;
        let old_left = (0u32..100)
            .filter(|i| {
                let key = i.to_be_bytes();
                table.short.find(id(&key).hash(h), id(&key)).is_some()
            })
            .count();
        assert!(old_left < 100, "the full table dropped nothing");
        table.purge(10_000_000, h);
        assert_eq!(table.len(), 400, "purge keeps the live entries only");
    }

    /// Memory follows the live keys, not the history: 5 000 keys go through the table, never
    /// more than 100 live at once, and it stays within two doublings of the 128 buckets 100
    /// keys need.
    #[test]
    fn a_table_grows_with_live_entries_not_expired_ones() {
        let limit = Limit::gcra(Quota::per_second(10).unwrap());
        let mut t = Keyed::default();
        // 50 rounds of 100 new keys, each round's keys expired (after 100 ms) by the next one.
        for round in 0u32..50 {
            let now = u64::from(round) * 1_000_000;
            for i in 0u32..100 {
                t.decide(&(round * 100 + i).to_be_bytes(), &limit, now, 1, usize::MAX);
            }
            assert!(t.0.short.map.num_buckets() <= 512, "round {round}");
        }
    }

    #[test]
    fn the_cap_holds_under_a_flood_of_unique_keys() {
        let limit = Limit::token_bucket(Quota::per_minute(10).unwrap());
        let mut t = Keyed::default();
        let mut evictions = 0;
        for i in 0u64..10_000 {
            let (d, evicted) = t.decide(&i.to_le_bytes(), &limit, 5, 1, 100);
            assert!(d.is_allowed());
            assert!(t.0.len() <= 100);
            evictions += usize::from(evicted);
        }
        assert_eq!(evictions, 10_000 - 100);
    }

    /// At the cap, expired entries go first, and of live ones those closest to full: keys that
    /// spent their whole burst outlive a flood of keys that spent one unit each.
    #[test]
    fn evictions_take_expired_then_the_fullest_entries() {
        for limit in [
            Limit::gcra(Quota::per_hour(1).unwrap().with_burst(10).unwrap()),
            Limit::token_bucket(Quota::per_hour(1).unwrap().with_burst(10).unwrap()),
        ] {
            let mut t = Keyed::default();
            let denied: Vec<String> = (0..20).map(|i| format!("denied-{i}")).collect();
            let mut now = 1_000_000;
            for key in &denied {
                assert!(
                    t.decide(key.as_bytes(), &limit, now, 10, 1_000)
                        .0
                        .is_allowed()
                );
            }
            // Expired entries (a second's quota, long past) are dropped without an eviction.
            let short = Limit::gcra(Quota::per_second(1).unwrap());
            for i in 0..500u32 {
                t.decide(format!("old-{i}").as_bytes(), &short, now, 1, 1_000);
            }
            now += 10_000_000;
            let mut evictions = 0;
            for i in 0..20_000u32 {
                now += 1;
                let (d, evicted) = t.decide(format!("flood-{i}").as_bytes(), &limit, now, 1, 1_000);
                assert!(d.is_allowed());
                evictions += usize::from(evicted);
                assert!(t.0.len() <= 1_000, "{limit:?} {i} {}", t.0.len());
            }
            assert!(evictions <= 20_000 - (1_000 - 520), "{evictions}");
            assert!(evictions >= 20_000 - 1_000, "{evictions}");
            let still_denied = denied
                .iter()
                .filter(|key| {
                    t.decide(key.as_bytes(), &limit, now, 1, 1_000)
                        .0
                        .is_denied()
                })
                .count();
            // A random victim would keep each denied key with probability about (1 − 1/1000)^19 000.
            assert!(
                still_denied >= 18,
                "{limit:?}: {still_denied} of 20 denied keys left"
            );
        }
    }

    #[test]
    fn denied_and_peeked_fresh_keys_store_nothing() {
        let limit = Limit::token_bucket(Quota::per_minute(10).unwrap());
        let mut t = Keyed::default();
        assert!(t.decide(b"k", &limit, 0, 0, 10).0.is_allowed());
        assert!(t.decide(b"k", &limit, 0, 11, 10).0.is_never());
        assert_eq!(t.0.len(), 0);
    }
}
