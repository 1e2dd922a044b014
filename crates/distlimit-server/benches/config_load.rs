//! Time to load envoyproxy/ratelimit YAML files, side by side in one run: descriptors at one
//! level (10 000 to 100 000, and a file at the 16 MiB size cap), the same nested 20 levels deep
//! in chains, and the time to refuse 200 KB of nested flow sequences. Loading is linear when
//! the time per descriptor stays flat down each column.
//!
//! `cargo bench -p distlimit-server --bench config_load` (bounded: each line is the best of
//! `RUNS` loads).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs,
    unreachable_pub
)]

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use distlimit_server::Config;
use distlimit_server::config::MAX_CONFIG_FILE_BYTES;

const RUNS: usize = 3;

/// `n` descriptors at one level.
fn flat(n: usize) -> String {
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for i in 0..n {
        let _ = write!(
            yaml,
            "  - key: k\n    value: v{i}\n    rate_limit: {{ unit: second, requests_per_unit: {i} }}\n"
        );
    }
    yaml
}

/// `n` descriptors in chains 20 levels deep.
fn chains(n: usize) -> String {
    let depth = 20;
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for c in 0..n / depth {
        for level in 0..depth {
            let pad = "    ".repeat(level);
            let _ = write!(
                yaml,
                "{pad}  - key: k{level}\n{pad}    value: v{c}\n{pad}    rate_limit: {{ unit: minute, requests_per_unit: 5 }}\n"
            );
            if level + 1 < depth {
                let _ = writeln!(yaml, "{pad}    descriptors:");
            }
        }
    }
    yaml
}

/// The best of `RUNS` loads (or refusals) of `yaml`.
fn best(yaml: &str, expect_ok: bool) -> Duration {
    (0..RUNS)
        .map(|_| {
            let started = Instant::now();
            let loaded = Config::from_yaml("bench.yaml", yaml);
            let took = started.elapsed();
            assert_eq!(loaded.is_ok(), expect_ok, "{:?}", loaded.err());
            took
        })
        .min()
        .unwrap_or_default()
}

fn main() {
    println!("descriptors  layout        bytes      load     per descriptor");
    let mut cap = 0;
    while flat(cap + 10_000).len() as u64 <= MAX_CONFIG_FILE_BYTES {
        cap += 10_000;
    }
    for n in [10_000, 20_000, 40_000, 100_000, cap] {
        for (layout, yaml) in [("one level", flat(n)), ("20 deep", chains(n))] {
            let took = best(&yaml, true);
            println!(
                "{n:>11}  {layout:<10} {:>8} KB {:>7.1} ms {:>8.0} ns",
                yaml.len() / 1024,
                took.as_secs_f64() * 1e3,
                took.as_secs_f64() * 1e9 / n as f64
            );
        }
    }
    let deep = format!(
        "domain: d\ndescriptors: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let took = best(&deep, false);
    println!(
        "200 KB of nested [ refused in {:.3} ms",
        took.as_secs_f64() * 1e3
    );
}
