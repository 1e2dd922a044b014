//! Property tests: any valid policy set survives TOML serialization and parsing unchanged, and
//! the tiers of a request are charged all together or not at all.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use distlimit_core::{Algorithm, Limit, ManualClock, Quota};
use distlimit_memory::MemoryStore;
use distlimit_policy::{Limiter, Policy, PolicySet, Scope, Tier};
use proptest::prelude::*;

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(Algorithm::ALL.to_vec())
}

/// Periods in every unit the TOML form has (with limits and bursts below 1000, every quota is
/// within the exact range).
fn period_us() -> impl Strategy<Value = u64> {
    prop_oneof![
        (1u64..1_000).prop_map(|n| n),
        (1u64..1_000).prop_map(|n| n * 1_000),
        (1u64..120).prop_map(|n| n * 1_000_000),
        (1u64..120).prop_map(|n| n * 60_000_000),
        (1u64..48).prop_map(|n| n * 3_600_000_000),
        (1u64..30).prop_map(|n| n * 86_400_000_000),
    ]
}

fn tier(name: String) -> impl Strategy<Value = Tier> {
    (
        algorithm(),
        1u64..1_000,
        period_us(),
        1u64..1_000,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            move |(algorithm, limit, period, burst, own_burst, global)| {
                let burst = match algorithm {
                    Algorithm::TokenBucket | Algorithm::Gcra if own_burst => burst,
                    _ => limit,
                };
                let quota = Quota::from_parts(limit, period, burst).unwrap();
                let scope = if global { Scope::Global } else { Scope::Key };
                Tier::new(name.clone(), Limit::new(algorithm, quota)).with_scope(scope)
            },
        )
}

fn tiers(prefix: &'static str, max: usize) -> impl Strategy<Value = Vec<Tier>> {
    (1..=max).prop_flat_map(move |n| {
        (0..n)
            .map(|i| tier(format!("{prefix}{i}")))
            .collect::<Vec<_>>()
    })
}

fn key() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9.:é _-]{1,20}"
}

fn policy(index: usize) -> impl Strategy<Value = Policy> {
    (
        tiers("t", 4),
        any::<bool>(),
        prop::collection::hash_set(key(), 0..6),
        0usize..3,
        0usize..3,
        prop::collection::vec(tiers("o", 3), 0..3),
    )
        .prop_map(move |(tiers, shadow, keys, allow, deny, overrides)| {
            let mut keys = keys.into_iter();
            let mut p = Policy::new(format!("policy-{index}")).shadow(shadow);
            for t in tiers {
                p = p.tier(t);
            }
            for k in keys.by_ref().take(allow) {
                p = p.allow(k);
            }
            for k in keys.by_ref().take(deny) {
                p = p.deny(k);
            }
            for (k, o) in keys.zip(overrides) {
                p = p.override_key(k, o.into_iter().map(|t| t.with_scope(Scope::Key)));
            }
            p
        })
}

/// At least one policy: a file without any is refused.
fn policy_set() -> impl Strategy<Value = PolicySet> {
    (1usize..4).prop_flat_map(|n| {
        (0..n)
            .map(policy)
            .collect::<Vec<_>>()
            .prop_map(|policies| PolicySet::new(policies).unwrap())
    })
}

proptest! {
    #[test]
    fn toml_round_trip(set in policy_set()) {
        let text = set.to_toml_string();
        let parsed = PolicySet::from_toml_str(&text).unwrap();
        prop_assert_eq!(&parsed, &set, "{}", text);
        prop_assert_eq!(parsed.to_toml_string(), text);
    }

    /// Checks with random costs on 2 to 4 tiers (one maybe global, shared with a second key),
    /// with the clock stopped so each tier simply holds `capacity` units: a request passes if and
    /// only if it fits in every tier, and then every tier is charged; otherwise none is.
    #[test]
    fn tiers_are_charged_all_or_nothing(
        caps in prop::collection::vec((algorithm(), 1u64..12), 2..=4),
        global_first in any::<bool>(),
        steps in prop::collection::vec((0u64..6, any::<bool>()), 1..40),
    ) {
        let mut policy = Policy::new("p");
        for (i, (algorithm, cap)) in caps.iter().enumerate() {
            let tier = Tier::new(format!("t{i}"), Limit::new(*algorithm, Quota::per_hour(*cap).unwrap()));
            policy = policy.tier(if i == 0 && global_first { tier.global() } else { tier });
        }
        let clock = ManualClock::new(1_700_000_000_000_000);
        let store = MemoryStore::builder().clock(clock).build();
        let limiter = Limiter::new(Arc::new(store), PolicySet::new([policy]).unwrap());
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        // used[key][tier]; a global tier counts in key 0's row for both keys.
        let mut used = [vec![0u64; caps.len()], vec![0u64; caps.len()]];
        runtime.block_on(async {
            for (cost, second_key) in steps {
                let k = usize::from(second_key);
                let row = |used: &[Vec<u64>; 2], i: usize| if i == 0 && global_first { used[0][0] } else { used[k][i] };
                let fits = caps.iter().enumerate().all(|(i, (_, cap))| row(&used, i) + cost.max(1) <= *cap);
                let key: &[u8] = if second_key { b"second" } else { b"first" };
                let verdict = limiter.check_cost("p", key, cost).await.unwrap();
                prop_assert_eq!(verdict.is_allowed(), fits);
                if fits {
                    let global = usize::from(global_first);
                    used[0][..global].iter_mut().for_each(|u| *u += cost);
                    used[k][global..].iter_mut().for_each(|u| *u += cost);
                }
                let peek = limiter.peek("p", key).await.unwrap();
                for (i, tier) in peek.tiers().enumerate() {
                    prop_assert_eq!(tier.decision().remaining(), caps[i].1 - row(&used, i), "tier {}", i);
                }
            }
            Ok(())
        })?;
    }

    /// Requests checking a random subset of three policies (1 to 3 tiers each) for one of two
    /// keys with random costs, with the clock stopped: a request is admitted if and only if
    /// every check fits every tier of its policy; then every tier of every policy checked is
    /// charged, otherwise none is (each verdict says what its check alone was answered).
    #[test]
    fn policies_are_charged_all_or_nothing_together(
        caps in prop::collection::vec(prop::collection::vec((algorithm(), 1u64..12), 1..=3), 3),
        steps in prop::collection::vec(
            prop::collection::vec((0usize..3, 0u64..5, any::<bool>()), 1..=3),
            1..30,
        ),
    ) {
        let policies = caps.iter().enumerate().map(|(p, tiers)| {
            tiers.iter().enumerate().fold(Policy::new(format!("p{p}")), |policy, (i, (algorithm, cap))| {
                policy.tier(Tier::new(format!("t{i}"), Limit::new(*algorithm, Quota::per_hour(*cap).unwrap())))
            })
        });
        let clock = ManualClock::new(1_700_000_000_000_000);
        let store = MemoryStore::builder().clock(clock).build();
        let limiter = Limiter::new(Arc::new(store), PolicySet::new(policies).unwrap());
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        // used[policy][key][tier]
        let mut used: Vec<[Vec<u64>; 2]> = caps.iter().map(|t| [vec![0; t.len()], vec![0; t.len()]]).collect();
        let names = ["p0", "p1", "p2"];
        runtime.block_on(async {
            for mut checks in steps {
                // Each policy at most once per request.
                checks.sort_by_key(|c| c.0);
                checks.dedup_by_key(|c| c.0);
                let fits: Vec<bool> = checks.iter().map(|&(p, cost, second)| {
                    let k = usize::from(second);
                    caps[p].iter().zip(&used[p][k]).all(|((_, cap), u)| u + cost.max(1) <= *cap)
                }).collect();
                let request: Vec<(&str, &[u8], u64)> = checks.iter().map(|&(p, cost, second)| {
                    let key: &[u8] = if second { b"second" } else { b"first" };
                    (names[p], key, cost)
                }).collect();
                let verdicts = limiter.check_all(&request).await.unwrap();
                let allowed: Vec<bool> = verdicts.iter().map(|v| v.is_allowed()).collect();
                prop_assert_eq!(&allowed, &fits);
                if fits.iter().all(|f| *f) {
                    for &(p, cost, second) in &checks {
                        used[p][usize::from(second)].iter_mut().for_each(|u| *u += cost);
                    }
                }
                for (p, name) in names.iter().enumerate() {
                    for (k, key) in [&b"first"[..], b"second"].into_iter().enumerate() {
                        let peek = limiter.peek(name, key).await.unwrap();
                        for (i, tier) in peek.tiers().enumerate() {
                            prop_assert_eq!(tier.decision().remaining(), caps[p][i].1 - used[p][k][i], "{} {} tier {}", name, k, i);
                        }
                    }
                }
            }
            Ok(())
        })?;
    }
}

#[test]
fn a_verdict_reports_what_the_toml_said() {
    let set = PolicySet::from_toml_str(
        r#"
        [[policy]]
        name = "api"
        tiers = [ { name = "burst", algorithm = "token_bucket", limit = 60, per = "1m", burst = 100 } ]
        "#,
    )
    .unwrap();
    let tier = &set.get("api").unwrap().tiers()[0];
    assert_eq!(tier.quota().period(), Duration::from_secs(60));
    assert_eq!((tier.quota().limit(), tier.quota().burst()), (60, 100));
}
