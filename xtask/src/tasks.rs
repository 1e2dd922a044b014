//! What `cargo xtask test`, `loom` and `bench` run, as lists of [`Step`]s.
//!
//! # Adding the Redis tests
//!
//! `test` will start its own servers: in [`test()`], before running the steps, start them with
//! [`crate::redis`] (a standalone [`RedisServer`](crate::redis::RedisServer), later a Sentinel
//! set and a 6-node cluster), add their URLs to the `test` step with [`Step::env`] (e.g.
//! `DISTLIMIT_REDIS_URL`), and keep the server values alive until [`run_all`] returns. They are
//! dropped when `test` returns, on success and on failure alike, and each `Drop` kills its own
//! child by PID. A new check is one more [`Step`] in [`test_steps`].

use std::env;

use crate::Result;
use crate::step::{Step, append_flags, project_root, run_all};

/// Packages with loom models: tests under `src/tests/loom_*.rs`, compiled only with
/// `--cfg distlimit_loom`, whose names contain `loom`.
pub(crate) const LOOM_PACKAGES: &[&str] = &["distlimit-memory"];

/// Criterion bench targets as `(package, bench)`, run by `cargo xtask bench`.
pub(crate) const BENCH_TARGETS: &[(&str, &str)] = &[("distlimit-memory", "compare")];

/// Preemption bound for loom unless `LOOM_MAX_PREEMPTIONS` is already set: 3 finds the bugs our
/// small models can have and keeps the run to minutes.
const LOOM_MAX_PREEMPTIONS: &str = "3";

/// `cargo xtask test` (and `ci`): every check, fail-fast.
pub(crate) fn test() -> Result<()> {
    run_all(&test_steps())
}

/// The steps of `cargo xtask test`, in order: cheap checks first so they fail fast.
pub(crate) fn test_steps() -> Vec<Step> {
    let mut clippy = Step::cargo("clippy", &["clippy", "--workspace", "--all-targets"]);
    // A committed lock file must be up to date; before there is one, cargo creates it.
    if project_root().join("Cargo.lock").exists() {
        clippy = clippy.args(["--locked"]);
    }
    let mut steps = vec![
        Step::cargo("fmt", &["fmt", "--all", "--", "--check"]),
        clippy.args(["--", "-D", "warnings"]),
        Step::cargo("doc", &["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", append_flags("RUSTDOCFLAGS", "-D warnings")),
        // Includes the doctests.
        Step::cargo("test", &["test", "--workspace"]),
    ];
    steps.extend(loom_steps());
    steps
}

/// The steps of `cargo xtask loom`: one release-mode run of the `loom` tests per package.
///
/// They build in their own target dir (`target/loom`) because `--cfg distlimit_loom` changes
/// `RUSTFLAGS`, which would otherwise rebuild the normal target dir on every switch.
pub(crate) fn loom_steps() -> Vec<Step> {
    // Relative paths in CARGO_TARGET_DIR are resolved from the workspace root, where steps run.
    let target_dir = match env::var("CARGO_TARGET_DIR") {
        Ok(dir) if !dir.is_empty() => format!("{}/loom", dir.trim_end_matches('/')),
        _ => "target/loom".to_owned(),
    };
    let preemptions =
        env::var("LOOM_MAX_PREEMPTIONS").unwrap_or_else(|_| LOOM_MAX_PREEMPTIONS.to_owned());
    LOOM_PACKAGES
        .iter()
        .map(|package| {
            let args = ["test", "--release", "-p", package, "--lib", "loom"];
            Step::cargo(format!("loom {package}"), &args)
                .env(
                    "RUSTFLAGS",
                    append_flags("RUSTFLAGS", "--cfg distlimit_loom"),
                )
                .env("CARGO_TARGET_DIR", target_dir.clone())
                .env("LOOM_MAX_PREEMPTIONS", preemptions.clone())
        })
        .collect()
}

/// The steps of `cargo xtask bench`: every bench target, with `extra` passed to criterion.
pub(crate) fn bench_steps(extra: &[String]) -> Vec<Step> {
    // `cargo xtask bench -- --foo` would otherwise reach criterion as `-- -- --foo`.
    let extra = match extra.split_first() {
        Some((first, rest)) if first == "--" => rest,
        _ => extra,
    };
    BENCH_TARGETS
        .iter()
        .map(|(package, bench)| {
            let args = ["bench", "-p", package, "--bench", bench, "--"];
            Step::cargo(format!("bench {package}/{bench}"), &args).args(extra)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_runs_the_checks_in_order_and_ends_with_loom() {
        let names: Vec<String> = test_steps().into_iter().map(|s| s.name).collect();
        assert_eq!(names[..4], ["fmt", "clippy", "doc", "test"]);
        assert_eq!(names.len(), 4 + LOOM_PACKAGES.len());
        assert!(names[4..].iter().all(|name| name.starts_with("loom ")));
    }

    #[test]
    fn loom_builds_with_its_cfg_in_its_own_target_dir() {
        for step in loom_steps() {
            let var = |key: &str| {
                step.env
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            assert!(var("RUSTFLAGS").ends_with("--cfg distlimit_loom"));
            assert!(var("CARGO_TARGET_DIR").ends_with("loom"));
            assert!(!var("LOOM_MAX_PREEMPTIONS").is_empty());
            assert_eq!(step.args[..2], ["test", "--release"]);
            assert_eq!(step.args.last().map(String::as_str), Some("loom"));
        }
    }

    #[test]
    fn bench_passes_arguments_to_criterion() {
        let extra = [
            "--".to_owned(),
            "--save-baseline".to_owned(),
            "main".to_owned(),
        ];
        for step in bench_steps(&extra) {
            let tail = &step.args[step.args.len() - 3..];
            assert_eq!(tail, ["--", "--save-baseline", "main"]);
        }
    }
}
