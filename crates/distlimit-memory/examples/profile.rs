//! Drives one contender of `benches/compare.rs` through one case for a fixed number of
//! decisions, so a deterministic counter (callgrind, cachegrind) can count instructions per
//! decision: only [`measure`] is meant to be counted (`--toggle-collect='profile::measure*'`;
//! a bare `*measure*` also matches governor's `measure_and_replace`, whose nested toggle stops
//! the count inside it).
//!
//! `cargo run --release -p distlimit-memory --example profile -- <tb|gcra|governor> <u64|string24>
//! <hot|10k|100k|1m|new> <decisions>`; see `docs/measurements/2026-12-03-memory-vs-governor.md`.
//!
//! `... --example profile -- race <u64|string24> <hot|10k|100k|1m> <rounds>` times the three
//! contenders instead, in turns of 20 000 decisions each, and prints each one's fastest turn
//! (ns per decision) and its ratio to governor's: on a shared machine a turn that no other
//! process interrupted is the closest reading of a quiet one (the bench's quota, 1 per second
//! with a burst of 10^9).

// A measurement driver: bad arguments abort loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::num::NonZeroU32;

use distlimit_core::{Key, Limit, Quota, Request};
use distlimit_memory::MemoryStore;

/// One decision of one unit for the key `bytes` / `i`.
trait Check {
    fn check(&self, i: u64, bytes: &[u8]) -> bool;
}

struct Ours(MemoryStore, Limit);

impl Check for Ours {
    #[inline]
    fn check(&self, _: u64, bytes: &[u8]) -> bool {
        let request = Request::new(Key::new(bytes).unwrap(), self.1);
        self.0.decide_sync(&request).is_allowed()
    }
}

struct GovU64(governor::DefaultKeyedRateLimiter<u64>);
impl Check for GovU64 {
    #[inline]
    fn check(&self, i: u64, _: &[u8]) -> bool {
        self.0.check_key(&i).is_ok()
    }
}

/// Populating: the same loop, not counted.
#[inline(never)]
fn fill<C: Check>(c: &C, ids: &[u64], keys: &[Vec<u8>]) {
    for (&i, key) in ids.iter().zip(keys) {
        assert!(c.check(i, key));
    }
}

/// The counted loop: `n` decisions cycling through `keys`.
#[inline(never)]
fn measure<C: Check>(c: &C, ids: &[u64], keys: &[Vec<u8>], n: usize) -> u64 {
    let mut denied = 0;
    for j in 0..n {
        let i = j % ids.len();
        denied += u64::from(!c.check(black_box(ids[i]), black_box(&keys[i])));
    }
    denied
}

#[inline(never)]
fn fill_gov_str(c: &governor::DefaultKeyedRateLimiter<String>, keys: &[String]) {
    for key in keys {
        assert!(c.check_key(key).is_ok());
    }
}

#[inline(never)]
fn measure_gov_str(
    c: &governor::DefaultKeyedRateLimiter<String>,
    keys: &[String],
    n: usize,
) -> u64 {
    let mut denied = 0;
    for j in 0..n {
        denied += u64::from(c.check_key(black_box(&keys[j % keys.len()])).is_err());
    }
    denied
}

/// Decisions per timed turn of `race`.
const TURN: usize = 20_000;

/// One turn: `TURN` decisions from `start` on, cycling through `n` keys; ns per decision.
#[inline(never)]
fn turn(check: &dyn Fn(usize) -> bool, start: usize, n: usize) -> f64 {
    let t = std::time::Instant::now();
    let mut denied = 0u64;
    for j in start..start + TURN {
        denied += u64::from(!check(black_box(j % n)));
    }
    let ns = t.elapsed().as_nanos() as f64 / TURN as f64;
    assert_eq!(denied, 0);
    ns
}

/// A contender of `race`: its name and one decision on the key of an index.
type Contender<'a> = (&'static str, Box<dyn Fn(usize) -> bool + 'a>);

/// `race`: see the module documentation. Its report is the program's output.
#[allow(clippy::print_stdout)]
fn race(ty: &str, count: usize, rounds: usize) {
    let quota = Quota::per_second(1)
        .and_then(|q| q.with_burst(1_000_000_000))
        .unwrap();
    let gquota = governor::Quota::per_second(NonZeroU32::new(1).unwrap())
        .allow_burst(NonZeroU32::new(1_000_000_000).unwrap());
    let ids: Vec<u64> = (0..count as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) % (count as u64 * 16))
        .collect();
    let strings: Vec<String> = ids.iter().map(|i| format!("user-{i:019}")).collect();
    let store = |limit| (MemoryStore::builder().max_keys(1 << 24).build(), limit);
    let (tb, gcra) = (store(Limit::token_bucket(quota)), store(Limit::gcra(quota)));
    let gov_u64 = governor::RateLimiter::<u64, _, _>::keyed(gquota);
    let gov_str = governor::RateLimiter::<String, _, _>::keyed(gquota);
    let ours = |(s, l): &(MemoryStore, Limit), i: usize| {
        if ty == "u64" {
            let bytes = ids[i].to_le_bytes();
            s.decide_sync(&Request::new(Key::new(&bytes).unwrap(), *l))
                .is_allowed()
        } else {
            s.decide_sync(&Request::new(Key::new(&strings[i]).unwrap(), *l))
                .is_allowed()
        }
    };
    let contenders: [Contender<'_>; 3] = [
        ("tb", Box::new(|i| ours(&tb, i))),
        ("gcra", Box::new(|i| ours(&gcra, i))),
        (
            "governor",
            if ty == "u64" {
                Box::new(|i| gov_u64.check_key(&ids[i]).is_ok())
            } else {
                Box::new(|i| gov_str.check_key(&strings[i]).is_ok())
            },
        ),
    ];
    for (_, check) in &contenders {
        for i in 0..count {
            assert!(check(i));
        }
    }
    let mut best = [f64::MAX; 3];
    for round in 0..rounds {
        for (c, (_, check)) in contenders.iter().enumerate() {
            best[c] = best[c].min(turn(check.as_ref(), round * TURN, count));
        }
    }
    for (c, (name, _)) in contenders.iter().enumerate() {
        println!(
            "{ty} {name}: {:.2} ns, {:.2} of governor",
            best[c],
            best[c] / best[2]
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args[1] == "race" {
        let count = match args[3].as_str() {
            "hot" => 1,
            "10k" => 10_000,
            "100k" => 100_000,
            "1m" => 1_000_000,
            other => panic!("case {other}"),
        };
        return race(&args[2], count, args[4].parse().unwrap());
    }
    let (who, ty, case, n) = (
        &args[1],
        &args[2],
        &args[3],
        args[4].parse::<usize>().unwrap(),
    );
    let count = match case.as_str() {
        "hot" => 1,
        "10k" => 10_000,
        "100k" => 100_000,
        "1m" => 1_000_000,
        "new" => n,
        other => panic!("case {other}"),
    };
    // The bench's shuffle is irrelevant to instruction counts; a multiplicative permutation
    // keeps consecutive keys apart in memory-order terms anyway.
    let ids: Vec<u64> = (0..count as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) % (count as u64 * 16))
        .collect();
    let strings: Vec<String> = ids.iter().map(|i| format!("user-{i:019}")).collect();
    let keys: Vec<Vec<u8>> = match ty.as_str() {
        "u64" => ids.iter().map(|i| i.to_le_bytes().to_vec()).collect(),
        _ => strings.iter().map(|s| s.as_bytes().to_vec()).collect(),
    };
    // One unit an hour (burst 10^6, above any key's decisions here): a state visited once stays live for an hour, however slowly the
    // program runs under valgrind (with the bench's one per second, 1 000 000 keys expire
    // between two visits and every decision becomes an insert).
    let quota = Quota::per_hour(1)
        .and_then(|q| q.with_burst(1_000_000))
        .unwrap();
    let gquota = governor::Quota::per_hour(NonZeroU32::new(1).unwrap())
        .allow_burst(NonZeroU32::new(1_000_000).unwrap());
    let populate = case != "new";
    let denied = match (who.as_str(), ty.as_str()) {
        ("governor", "u64") => {
            let c = GovU64(governor::RateLimiter::keyed(gquota));
            if populate {
                fill(&c, &ids, &keys);
            }
            measure(&c, &ids, &keys, n)
        }
        ("governor", _) => {
            let c = governor::RateLimiter::keyed(gquota);
            if populate {
                fill_gov_str(&c, &strings);
            }
            measure_gov_str(&c, &strings, n)
        }
        (algo, _) => {
            let limit = if algo == "gcra" {
                Limit::gcra(quota)
            } else {
                Limit::token_bucket(quota)
            };
            let c = Ours(MemoryStore::builder().max_keys(1 << 24).build(), limit);
            if populate {
                fill(&c, &ids, &keys);
            }
            measure(&c, &ids, &keys, n)
        }
    };
    assert_eq!(denied, 0);
}
