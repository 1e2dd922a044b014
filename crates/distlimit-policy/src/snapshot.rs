//! The active policy set: published through an [`ArcSwap`], read through a per-thread cache.
//!
//! Loading an `ArcSwap` and releasing the guard are two atomic read-modify-write operations
//! (arc-swap's debt slot), about 12 ns per check on the benchmark machine in the middle of a
//! decision, which drains the store buffer; the limiter's whole budget is 10 ns. So each
//! thread keeps the set it last used, with the generation it was published under, and a check
//! that finds the generation unchanged (one load, no write) uses that set without touching the
//! `ArcSwap`. A new generation reloads it (`load_full`, a reference count). This is
//! arc-swap's own `Cache`, kept per thread and per limiter. The thread's cache is borrowed only
//! to find the entry, which lends its set to the check as an `Rc` (a plain counter), so the
//! check runs outside the thread-local's closure and a check made from inside a check (from a
//! store) uses the cache too. The thread's first entry (the first limiter it checked with) is
//! looked at before any scan: the usual service has one limiter, and the check stays a few
//! inlined instructions.
//!
//! Publication stores the set, then bumps the generation with `Release`; a check loads the
//! generation with `Acquire` before it reloads, so a check that starts after
//! [`Limiter::replace`](crate::Limiter::replace) returned sees the new set. `src/tests/
//! loom_publish.rs` models the protocol.
//!
//! Memory: a thread's cache holds one set per limiter it checked with, until it checks again
//! after a change or exits; an entry of a dropped limiter is removed when that thread next
//! misses its cache.

use std::cell::{Cell, RefCell, RefMut};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use arc_swap::ArcSwap;

use crate::PolicySet;

/// Where a limiter publishes its policy sets.
pub(crate) struct Published {
    swap: ArcSwap<PolicySet>,
    /// Bumped with `Release` after every publication.
    generation: AtomicU64,
}

impl Published {
    pub(crate) fn new(set: PolicySet) -> Arc<Self> {
        Arc::new(Self {
            swap: ArcSwap::from_pointee(set),
            generation: AtomicU64::new(0),
        })
    }

    /// The current set, shared.
    pub(crate) fn load_full(&self) -> Arc<PolicySet> {
        self.swap.load_full()
    }

    /// Makes `set` current.
    pub(crate) fn store(&self, set: Arc<PolicySet>) {
        self.swap.store(set);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Replaces the current set with `f` of it, retrying if another publication came first
    /// (arc-swap's read-copy-update).
    pub(crate) fn rcu(&self, f: impl FnMut(&Arc<PolicySet>) -> Arc<PolicySet>) {
        self.swap.rcu(f);
        self.generation.fetch_add(1, Ordering::Release);
    }
}

/// A thread's copy of one limiter's current set.
struct Cached {
    /// The limiter's publication point: gone when the limiter is.
    owner: Weak<Published>,
    /// Its address, which identifies the entry: compared without `Weak::as_ptr`'s check for a
    /// dangling `Weak`, and no other `Published` can be at this address while `owner` keeps
    /// the allocation.
    address: *const Published,
    generation: u64,
    current: Rc<Current>,
}

/// The set a thread checks with, lent to each check (an `Rc` clone: the cache is borrowed only
/// to find it, so a check made from inside a check, from a store, uses the cache too).
struct Current {
    set: Arc<PolicySet>,
    /// The index of the policy this thread last checked in `set`: tried first.
    hint: Cell<usize>,
}

thread_local! {
    static CACHE: RefCell<Vec<Cached>> = const { RefCell::new(Vec::new()) };
}

/// Calls `f` with `published`'s current set, from this thread's cache when the generation is
/// unchanged (loaded from the `ArcSwap` when the thread is exiting and its cache is gone).
///
/// `f` runs here, not in the closure given to the thread-local: that closure returns one
/// pointer. Were the check inside it, it would return the check's verdict (about 100 bytes)
/// through memory whenever the compiler does not inline `LocalKey::try_with`, and the copy out
/// stalls the CPU (see `Limiter::poll_now`).
#[inline(always)]
pub(crate) fn with_current<F: UseSet>(published: &Arc<Published>, mut f: F) -> F::Output {
    match CACHE.try_with(|cache| current(cache, published)) {
        Ok(Some(current)) => {
            let mut hint = current.hint.get();
            let output = f.call(&current.set, &mut hint);
            current.hint.set(hint);
            output
        }
        _ => uncached(published, &mut f),
    }
}

/// This thread's current set of `published`, refreshed if a new one was published since.
///
/// The common case, the thread's first entry up to date, is all this function does: small
/// enough that `LocalKey::try_with` and its closure are inlined into the check (a call, with
/// the generic scan of the entries, cost about 2 ns).
#[inline(always)]
fn current(cache: &RefCell<Vec<Cached>>, published: &Arc<Published>) -> Option<Rc<Current>> {
    let generation = published.generation.load(Ordering::Acquire);
    let cache = cache.try_borrow_mut().ok()?;
    if let Some(entry) = cache.first()
        && std::ptr::eq(entry.address, Arc::as_ptr(published))
        && entry.generation == generation
    {
        return Some(Rc::clone(&entry.current));
    }
    current_slow(cache, published, generation)
}

/// [`current`] when the thread's first entry is another limiter's or out of date.
#[inline(never)]
fn current_slow(
    mut cache: RefMut<'_, Vec<Cached>>,
    published: &Arc<Published>,
    generation: u64,
) -> Option<Rc<Current>> {
    let at = match cache
        .iter()
        .position(|c| std::ptr::eq(c.address, Arc::as_ptr(published)))
    {
        Some(at) => at,
        None => miss(&mut cache, published, generation),
    };
    let entry = cache.get_mut(at)?;
    if entry.generation != generation {
        refresh(entry, published, generation);
    }
    Some(Rc::clone(&entry.current))
}

/// Replaces `entry`'s set with `published`'s current one: in place when no check holds the
/// old one (no allocation), else in a new `Current`.
#[inline(never)]
fn refresh(entry: &mut Cached, published: &Published, generation: u64) {
    let set = published.load_full();
    match Rc::get_mut(&mut entry.current) {
        Some(current) => {
            current.set = set;
            current.hint.set(0);
        }
        None => {
            entry.current = Rc::new(Current {
                set,
                hint: Cell::new(0),
            });
        }
    }
    entry.generation = generation;
}

/// [`with_current`] without the cache (the thread is exiting). Inlined although rare: were it
/// a call, the check's result, which can come from either path, would be returned through
/// memory and moved once more (see `Limiter::poll_now`; it cost a check about 2 ns).
#[inline(always)]
fn uncached<F: UseSet>(published: &Published, f: &mut F) -> F::Output {
    f.call(&published.swap.load(), &mut 0)
}

/// What [`with_current`] does with the set: a trait rather than a closure, so that its
/// implementation can be marked `#[inline(always)]` (a check's whole decision happens inside,
/// and returning its result through memory from a call costs store-forwarding stalls).
pub(crate) trait UseSet {
    /// The result.
    type Output;

    /// Uses `set`; `hint` is the thread's guess of the policy index, for the caller to use
    /// and update.
    fn call(&mut self, set: &Arc<PolicySet>, hint: &mut usize) -> Self::Output;
}

impl<R, F: FnMut(&Arc<PolicySet>) -> R> UseSet for F {
    type Output = R;

    #[inline]
    fn call(&mut self, set: &Arc<PolicySet>, _: &mut usize) -> R {
        self(set)
    }
}

/// Adds `published`'s entry to this thread's cache, dropping entries of dropped limiters, and
/// returns its index.
#[cold]
fn miss(cache: &mut Vec<Cached>, published: &Arc<Published>, generation: u64) -> usize {
    cache.retain(|c| c.owner.strong_count() > 0);
    cache.push(Cached {
        owner: Arc::downgrade(published),
        address: Arc::as_ptr(published),
        generation,
        current: Rc::new(Current {
            set: published.load_full(),
            hint: Cell::new(0),
        }),
    });
    cache.len() - 1
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::{Policy, Tier};
    use distlimit_core::{Limit, Quota};

    fn set(limit: u64) -> PolicySet {
        let quota = Quota::per_second(limit).unwrap();
        PolicySet::builder()
            .policy(Policy::new("p").tier(Tier::new("t", Limit::gcra(quota))))
            .build()
            .unwrap()
    }

    fn limit_seen(published: &Arc<Published>) -> u64 {
        with_current(published, |s: &Arc<PolicySet>| {
            s.policies()[0].tiers()[0].quota().limit()
        })
    }

    #[test]
    fn a_publication_is_seen_by_the_next_check() {
        let published = Published::new(set(1));
        assert_eq!(limit_seen(&published), 1);
        published.store(Arc::new(set(2)));
        assert_eq!(limit_seen(&published), 2);
        published.rcu(|_| Arc::new(set(3)));
        assert_eq!(limit_seen(&published), 3);
    }

    #[test]
    fn limiters_have_their_own_entries_and_dropped_ones_are_removed() {
        let a = Published::new(set(1));
        let b = Published::new(set(2));
        assert_eq!((limit_seen(&a), limit_seen(&b)), (1, 2));
        let entries = || CACHE.with(|c| c.borrow().len());
        assert_eq!(entries(), 2);
        drop(a);
        let c = Published::new(set(3));
        assert_eq!(limit_seen(&c), 3);
        assert_eq!(
            entries(),
            2,
            "the dropped limiter's entry was removed when c missed"
        );
    }

    #[test]
    fn a_limiter_behind_the_first_entry_sees_publications_too() {
        let first = Published::new(set(1));
        let second = Published::new(set(2));
        assert_eq!((limit_seen(&first), limit_seen(&second)), (1, 2));
        second.store(Arc::new(set(3)));
        assert_eq!((limit_seen(&first), limit_seen(&second)), (1, 3));
        first.store(Arc::new(set(4)));
        assert_eq!((limit_seen(&first), limit_seen(&second)), (4, 3));
    }

    #[test]
    fn a_check_from_inside_a_check_uses_the_cache_too() {
        let published = Published::new(set(1));
        let inner = with_current(&published, |_: &Arc<PolicySet>| limit_seen(&published));
        assert_eq!(inner, 1);
        // A publication between the outer check's start and the inner one: the inner check
        // refreshes the entry while the outer one still holds the old set (a new `Current`),
        // and each decides with its own set.
        let (outer, inner) = with_current(&published, |s: &Arc<PolicySet>| {
            published.store(Arc::new(set(2)));
            (
                s.policies()[0].tiers()[0].quota().limit(),
                limit_seen(&published),
            )
        });
        assert_eq!((outer, inner), (1, 2));
        assert_eq!(limit_seen(&published), 2);
        assert_eq!(CACHE.with(|c| c.borrow().len()), 1);
    }
}
