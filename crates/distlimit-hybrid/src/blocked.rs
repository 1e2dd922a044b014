//! [`BlockedCache`]: denied keys answered locally until the store's `retry_after`, so a flood
//! on one denied key does not reach the primary. What it answers, and why it never denies longer
//! than the store, is the crate documentation's "The blocked-key cache".

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};

use distlimit_core::{Decision, Limit, Request, Source};
use foldhash::fast::RandomState;
use hashbrown::HashTable;
use parking_lot::Mutex;

const SHARDS: usize = 16;

#[derive(Debug)]
struct Entry {
    hash: u64,
    policy: Box<str>,
    key: Box<[u8]>,
    limit: Limit,
    cost: u64,
    /// The answer's capacity and remaining units, repeated as they were.
    capacity: u64,
    remaining: u64,
    /// When the request was sent: a lookup before it (the wall clock stepped back) misses, so
    /// a stepped clock never stretches a denial.
    sent_us: u64,
    /// Deadlines: the request's send time plus the store's `retry_after` and `reset_after`.
    until_us: u64,
    reset_at_us: u64,
}

#[derive(Debug)]
struct Shard {
    table: HashTable<Entry>,
    /// No entry expires before this instant (a lower bound), so a full shard knows when a sweep
    /// could free anything.
    earliest_until_us: u64,
}

/// The bounded cache of denied keys.
#[derive(Debug)]
pub(crate) struct BlockedCache {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    hasher: RandomState,
    /// Entries in all shards, changed under the shard's lock; read without one by a lookup (a
    /// stale count only costs a miss or a lock).
    entries: AtomicUsize,
}

impl BlockedCache {
    /// A cache of at most `max_entries` (at least 1) entries.
    pub(crate) fn new(max_entries: usize) -> Self {
        let max_entries = max_entries.max(1);
        let count = SHARDS.min(max_entries);
        let shards = (0..count)
            .map(|_| {
                Mutex::new(Shard {
                    table: HashTable::new(),
                    earliest_until_us: u64::MAX,
                })
            })
            .collect();
        Self {
            shards,
            per_shard: max_entries / count,
            hasher: RandomState::default(),
            entries: AtomicUsize::new(0),
        }
    }

    /// Entries held now (expired ones included until they are swept).
    pub(crate) fn len(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    fn locate(&self, policy: &str, key: &[u8]) -> (u64, &Mutex<Shard>) {
        let hash = self.hasher.hash_one((policy, key));
        // The high bits pick the shard; the table uses the low ones.
        let index = ((hash >> 32) as usize) % self.shards.len();
        (hash, &self.shards[index])
    }

    /// The cached denial of `request` at `now_us`, if the same limit and cost is still blocked.
    /// (Reports and give-backs never come here: `settle_all` sends them to a store.)
    pub(crate) fn lookup(&self, request: &Request<'_>, now_us: u64) -> Option<Decision> {
        if request.cost() == 0 || self.entries.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let (policy, key) = (request.policy(), request.key().as_bytes());
        let (hash, shard) = self.locate(policy, key);
        let mut shard = shard.lock();
        let entry = shard.table.find_entry(hash, |e| {
            e.hash == hash && *e.key == *key && *e.policy == *policy
        });
        let Ok(entry) = entry else {
            return None;
        };
        let e = entry.get();
        if now_us >= e.until_us || now_us < e.sent_us {
            entry.remove();
            self.entries.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        if e.limit != *request.limit() || e.cost != request.cost() {
            return None;
        }
        let reset_after = std::time::Duration::from_micros(e.reset_at_us.saturating_sub(now_us));
        let retry_after = std::time::Duration::from_micros(e.until_us - now_us);
        Some(
            Decision::denied(e.capacity, e.remaining, reset_after, retry_after)
                .with_source(Source::BlockedCache),
        )
    }

    /// Remembers `decision`, the primary's answer to `request` sent at `sent_us`, if it is a
    /// denial worth remembering.
    pub(crate) fn remember(&self, request: &Request<'_>, decision: &Decision, sent_us: u64) {
        if decision.is_allowed() || decision.is_never() || request.cost() == 0 {
            return;
        }
        let until_us = sent_us.saturating_add(decision.retry_after_us());
        let (policy, key) = (request.policy(), request.key().as_bytes());
        let (hash, shard) = self.locate(policy, key);
        let mut shard = shard.lock();
        let fill = |e: &mut Entry| {
            e.limit = *request.limit();
            e.cost = request.cost();
            e.capacity = decision.limit();
            e.remaining = decision.remaining();
            e.sent_us = sent_us;
            e.until_us = until_us;
            e.reset_at_us = sent_us.saturating_add(decision.reset_after_us());
        };
        if let Some(e) = shard.table.find_mut(hash, |e| {
            e.hash == hash && *e.key == *key && *e.policy == *policy
        }) {
            fill(e);
            shard.earliest_until_us = shard.earliest_until_us.min(until_us);
            return;
        }
        if shard.table.len() >= self.per_shard {
            if sent_us < shard.earliest_until_us {
                return; // full of live entries
            }
            let before = shard.table.len();
            shard.table.retain(|e| e.until_us > sent_us);
            self.entries
                .fetch_sub(before - shard.table.len(), Ordering::Relaxed);
            shard.earliest_until_us = shard
                .table
                .iter()
                .map(|e| e.until_us)
                .min()
                .unwrap_or(u64::MAX);
            if shard.table.len() >= self.per_shard {
                return;
            }
        }
        let mut entry = Entry {
            hash,
            policy: policy.into(),
            key: key.into(),
            limit: *request.limit(),
            cost: 0,
            capacity: 0,
            remaining: 0,
            sent_us: 0,
            until_us: 0,
            reset_at_us: 0,
        };
        fill(&mut entry);
        shard.earliest_until_us = shard.earliest_until_us.min(until_us);
        shard.table.insert_unique(hash, entry, |e| e.hash);
        self.entries.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use distlimit_core::{Key, NEVER, Quota};

    use super::*;

    fn limit() -> Limit {
        Limit::gcra(Quota::per_second(10).unwrap())
    }

    fn denied(retry_ms: u64) -> Decision {
        Decision::denied(
            10,
            0,
            Duration::from_millis(900),
            Duration::from_millis(retry_ms),
        )
    }

    #[test]
    fn blocks_the_same_request_until_the_deadline_only() {
        let cache = BlockedCache::new(100);
        let key = Key::new("abuser").unwrap();
        let r = Request::new(key, limit());
        cache.remember(&r, &denied(100), 1_000_000);
        let hit = cache.lookup(&r, 1_050_000).unwrap();
        assert!(hit.is_denied());
        assert_eq!(hit.source(), Source::BlockedCache);
        assert_eq!(hit.retry_after(), Duration::from_millis(50));
        assert_eq!(hit.reset_after(), Duration::from_millis(850));
        assert_eq!(cache.lookup(&r, 1_099_999).unwrap().retry_after_us(), 1);
        assert_eq!(cache.lookup(&r, 1_100_000), None);
        assert_eq!(cache.len(), 0, "an expired entry is dropped when met");

        // Another cost, another limit, another policy, a peek: not blocked.
        cache.remember(&r, &denied(100), 2_000_000);
        assert_eq!(cache.lookup(&r.with_cost(2), 2_000_001), None);
        assert_eq!(cache.lookup(&r.with_cost(0), 2_000_001), None);
        let other = Limit::gcra(Quota::per_second(11).unwrap());
        assert_eq!(cache.lookup(&Request::new(key, other), 2_000_001), None);
        assert_eq!(cache.lookup(&r.with_policy("p").unwrap(), 2_000_001), None);
        assert!(cache.lookup(&r, 2_000_001).is_some());
    }

    #[test]
    fn a_clock_stepped_back_ends_the_denial() {
        let cache = BlockedCache::new(100);
        let r = Request::new(Key::new("abuser").unwrap(), limit());
        cache.remember(&r, &denied(100), 1_000_000);
        // The clock stepped back before the send: the deadline no longer bounds the denial.
        assert_eq!(cache.lookup(&r, 999_999), None);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn ignores_admissions_peeks_and_never() {
        let cache = BlockedCache::new(100);
        let r = Request::new(Key::new("k").unwrap(), limit());
        cache.remember(&r, &Decision::allowed(10, 9, Duration::ZERO), 0);
        cache.remember(&r.with_cost(0), &denied(100), 0);
        cache.remember(&r, &Decision::denied(10, 0, Duration::ZERO, NEVER), 0);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn stays_bounded_and_makes_room_from_expired_entries() {
        let cache = BlockedCache::new(32);
        let keys: Vec<String> = (0..1000).map(|i| format!("k{i}")).collect();
        for k in &keys {
            let r = Request::new(Key::new(k).unwrap(), limit());
            cache.remember(&r, &denied(100), 0);
        }
        assert!(cache.len() <= 32, "{}", cache.len());
        // Once they expired, new keys get in again.
        let r = Request::new(Key::new("late").unwrap(), limit());
        cache.remember(&r, &denied(100), 200_000);
        assert!(cache.lookup(&r, 200_001).is_some());
        assert!(cache.len() <= 32);
    }
}
