//! Quota mode against a model, on random rules and request sequences: a request is denied when
//! a descriptor outside quota mode is over its limit or every quota descriptor is (as
//! envoyproxy/ratelimit decides), a denied request charges nothing, and an admitted one
//! charges every descriptor that passed (its quota descriptors over their limits not).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlimit_memory::MemoryStore;
use distlimit_metrics::Metrics;
use distlimit_server::check::Descriptor;
use distlimit_server::{CheckRequest, Checker, Config};
use proptest::prelude::*;

const RULES: usize = 5;

/// Waits past midnight (UTC) if it is less than a minute away, so one case stays in one day
/// window.
fn clear_of_midnight() {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let left = 86_400 - now.as_secs() % 86_400;
    if left < 60 {
        std::thread::sleep(Duration::from_secs(left + 1));
    }
}

fn config(rules: &[(u32, bool)]) -> Config {
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for (i, (limit, quota)) in rules.iter().enumerate() {
        writeln!(
            yaml,
            "  - key: r{i}\n    quota_mode: {quota}\n    rate_limit: {{ unit: day, requests_per_unit: {limit} }}"
        )
        .unwrap();
    }
    Config::from_yaml("model.yaml", &yaml).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn quota_denials_charge_nothing(
        rules in proptest::collection::vec((0_u32..4, any::<bool>()), RULES),
        requests in proptest::collection::vec(
            proptest::sample::subsequence((0..RULES).collect::<Vec<_>>(), 1..=RULES),
            1..30,
        ),
    ) {
        clear_of_midnight();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let checker = Checker::new(Arc::new(MemoryStore::new()), config(&rules), Metrics::new());
        let keys: Vec<String> = (0..RULES).map(|i| format!("r{i}")).collect();
        let mut used = [0_u32; RULES];
        for subset in requests {
            let request = CheckRequest {
                domain: "d",
                descriptors: subset
                    .iter()
                    .map(|&i| Descriptor {
                        entries: vec![(keys[i].as_str(), "v")],
                        limit: None,
                        hits: None,
                        settle: None,
                    })
                    .collect(),
                hits: 1,
            };
            let answer = runtime.block_on(checker.check(&request)).unwrap();
            let over_now: Vec<bool> = (0..RULES).map(|i| used[i] + 1 > rules[i].0).collect();
            let over = |i: usize| over_now[i];
            let quotas: Vec<usize> = subset.iter().copied().filter(|&i| rules[i].1).collect();
            let denied = subset.iter().any(|&i| !rules[i].1 && over(i))
                || (!quotas.is_empty() && quotas.iter().all(|&i| over(i)));
            prop_assert_eq!(answer.over_limit, denied, "{:?} on {:?} used {:?}", subset, rules, used);
            if !denied {
                for (&i, status) in subset.iter().zip(&answer.statuses) {
                    prop_assert_eq!(status.over_limit, over(i));
                    if !over(i) {
                        used[i] += 1;
                        prop_assert_eq!(status.limit_remaining, rules[i].0 - used[i]);
                    }
                }
            }
        }
    }
}
