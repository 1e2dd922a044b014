//! The limiter's publish/read protocol for its policy snapshot, explored over every
//! interleaving by loom.
//!
//! arc-swap's internals are invisible to loom (it uses std atomics), so the protocol is modelled
//! with a stand-in of the same shape and no stronger orderings than arc-swap gives:
//!
//! * a snapshot is built completely before it is published and never written after (a
//!   [`PolicySet`](crate::PolicySet) is immutable behind its `Arc`): here, a slot's fields are
//!   written with `Relaxed` stores before the slot is published, and never again;
//! * publishing is one atomic store of the pointer with `Release` (arc-swap: `SeqCst` swap);
//! * a decision loads the pointer once with `Acquire` (arc-swap: `SeqCst` load) and reads only
//!   that snapshot: here, one load of the slot index, then `Relaxed` reads of its fields;
//! * `update_policy` is a read-copy-update: load, copy with one change, compare-and-swap,
//!   retry on a lost race (arc-swap's `rcu`).
//!
//! What the models prove: a reader never sees a snapshot half built or fields of two
//! snapshots (every field pair it reads is consistent), concurrent updates of different
//! fields are all kept, and a check that starts after a publication returned decides with the
//! new snapshot. What they do not model: arc-swap's own memory reclamation (its debt lists),
//! which arc-swap tests itself; slots here are never freed. One model breaks the protocol on
//! purpose (a `Relaxed` publication) and checks that loom finds the failure: the models can
//! fail.

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use loom::thread;

/// Slots available to one model run: the initial snapshot plus every publication attempt.
const SLOTS: usize = 6;

/// One snapshot: two policies' limits, and for each a window that must equal 10 × its limit in
/// the same snapshot (the consistency a decision relies on).
#[derive(Default)]
struct Slot {
    x: AtomicU64,
    x_window: AtomicU64,
    y: AtomicU64,
    y_window: AtomicU64,
}

/// The stand-in for the limiter's `ArcSwap<PolicySet>`: the published slot and an
/// append-only slot pool.
struct Cell {
    current: AtomicUsize,
    next: AtomicUsize,
    slots: [Slot; SLOTS],
    publish: Ordering,
}

impl Cell {
    fn new(x: u64, y: u64, publish: Ordering) -> Self {
        let cell = Self {
            current: AtomicUsize::new(0),
            next: AtomicUsize::new(1),
            slots: Default::default(),
            publish,
        };
        cell.write(0, x, y);
        cell
    }

    fn write(&self, slot: usize, x: u64, y: u64) {
        let s = &self.slots[slot];
        s.x.store(x, Ordering::Relaxed);
        s.x_window.store(10 * x, Ordering::Relaxed);
        s.y.store(y, Ordering::Relaxed);
        s.y_window.store(10 * y, Ordering::Relaxed);
    }

    /// A fresh slot holding `(x, y)`, not yet published.
    fn build(&self, x: u64, y: u64) -> usize {
        let slot = self.next.fetch_add(1, Ordering::Relaxed);
        assert!(slot < SLOTS, "the model needs more slots");
        self.write(slot, x, y);
        slot
    }

    /// `replace`: publish a complete new snapshot.
    fn replace(&self, x: u64, y: u64) {
        let slot = self.build(x, y);
        self.current.store(slot, self.publish);
    }

    /// A decision: one load, then only that snapshot. Returns `(x, y)` after checking that the
    /// snapshot is consistent.
    fn decide(&self) -> (u64, u64) {
        self.read(self.current.load(Ordering::Acquire))
    }

    /// Reads snapshot `slot`, checking that it is whole.
    fn read(&self, slot: usize) -> (u64, u64) {
        let s = &self.slots[slot];
        let fields = [&s.x, &s.x_window, &s.y, &s.y_window];
        let [x, xw, y, yw] = fields.map(|field| field.load(Ordering::Relaxed));
        assert!(
            x > 0 && y > 0,
            "a snapshot read before it was built: ({x}, {y})"
        );
        assert_eq!((xw, yw), (10 * x, 10 * y), "a torn snapshot");
        (x, y)
    }

    /// `update_policy`: read-copy-update of one field.
    fn update(&self, change: impl Fn(u64, u64) -> (u64, u64)) {
        let mut current = self.current.load(Ordering::Acquire);
        loop {
            let s = &self.slots[current];
            let (x, y) = change(s.x.load(Ordering::Relaxed), s.y.load(Ordering::Relaxed));
            let slot = self.build(x, y);
            match self
                .current
                .compare_exchange(current, slot, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(now) => current = now,
            }
        }
    }
}

/// Two readers and a writer publishing twice: every read is one whole snapshot, and a reader
/// never goes back to an older one.
#[test]
fn loom_readers_see_whole_snapshots_in_order() {
    loom::model(|| {
        let cell = Arc::new(Cell::new(1, 1, Ordering::Release));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let cell = cell.clone();
                thread::spawn(move || {
                    let first = cell.decide();
                    let second = cell.decide();
                    assert!(
                        second.0 >= first.0,
                        "went back from {first:?} to {second:?}"
                    );
                })
            })
            .collect();
        cell.replace(2, 2);
        cell.replace(3, 3);
        for r in readers {
            r.join().unwrap();
        }
        assert_eq!(cell.decide(), (3, 3));
    });
}

/// Two concurrent updates of different policies, and a reader: both updates are kept.
#[test]
fn loom_concurrent_updates_are_all_kept() {
    loom::model(|| {
        let cell = Arc::new(Cell::new(1, 1, Ordering::Release));
        let a = {
            let cell = cell.clone();
            thread::spawn(move || cell.update(|x, y| (x + 1, y)))
        };
        let b = {
            let cell = cell.clone();
            thread::spawn(move || cell.update(|x, y| (x, y + 1)))
        };
        let (x, y) = cell.decide();
        assert!((1..=2).contains(&x) && (1..=2).contains(&y));
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(cell.decide(), (2, 2));
    });
}

/// A reader deciding while a writer publishes: once the reader has seen that the publication
/// finished (here: a flag set after `replace` returned), it decides with the new set.
#[test]
fn loom_a_check_after_a_publication_sees_it() {
    loom::model(|| {
        let cell = Arc::new(Cell::new(1, 1, Ordering::Release));
        let done = Arc::new(AtomicUsize::new(0));
        let reader = {
            let (cell, done) = (cell.clone(), done.clone());
            thread::spawn(move || {
                let first = cell.decide();
                let finished = done.load(Ordering::Acquire) == 1;
                let second = cell.decide();
                assert!(
                    second.0 >= first.0,
                    "went back from {first:?} to {second:?}"
                );
                if finished {
                    assert_eq!(
                        second,
                        (2, 2),
                        "a check after the publication used the old set"
                    );
                }
            })
        };
        cell.replace(2, 2);
        done.store(1, Ordering::Release);
        reader.join().unwrap();
    });
}

/// The same protocol with a `Relaxed` publication is wrong, and loom finds the reader that
/// sees the slot before its fields.
#[test]
#[should_panic(expected = "a snapshot read before it was built")]
fn loom_a_relaxed_publication_is_caught() {
    loom::model(|| {
        let cell = Arc::new(Cell::new(1, 1, Ordering::Relaxed));
        let reader = {
            let cell = cell.clone();
            thread::spawn(move || {
                cell.decide();
            })
        };
        cell.replace(2, 2);
        reader.join().unwrap();
    });
}
