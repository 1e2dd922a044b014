//! What `cargo xtask test`, `test-cluster`, `loom` and `bench` run, as lists of [`Step`]s.
//!
//! # The Redis servers of `test`
//!
//! [`test()`] runs the checks that need no server first (fmt, clippy, doc, and building the
//! tests), so a mistake fails fast and no server idles through a long compile. Only then does it
//! start the Redis setups ([`redis::Stack`]), run the [`TEST_STEP`] with their addresses in its
//! environment (the `ENV_*` constants of `distlimit_test::server`; `DISTLIMIT_REQUIRE_REDIS=1`
//! turns a skipped Redis test into a failure), and stop them again, pass or fail. Then the
//! [`TEST_CLUSTER_STEP`] runs exactly what `cargo xtask test-cluster` runs, with only the Cluster
//! up, so that command cannot break unnoticed; then the loom models. A new check is one more
//! [`Step`] in [`test_steps`].

use std::env;

use crate::Result;
use crate::redis::{self, Setups};
use crate::step::{Step, Summary, append_flags, project_root};

/// The step of [`test_steps`] that runs with the Redis servers up.
pub(crate) const TEST_STEP: &str = "test";

/// Summary row for starting the Redis servers.
const REDIS_UP: &str = "redis up";

/// Summary row for stopping them.
const REDIS_DOWN: &str = "redis down";

/// The step of [`test_steps`] that runs the Cluster tests with only the Cluster up, as
/// `cargo xtask test-cluster` does.
pub(crate) const TEST_CLUSTER_STEP: &str = "test-cluster";

/// The test name filter of `test-cluster`: every test whose name contains it needs the Cluster
/// and nothing else (`DISTLIMIT_REQUIRE_REDIS=1` fails any that reaches for another setup).
pub(crate) const CLUSTER_FILTER: &str = "cluster";

/// Packages with loom models: tests under `src/tests/loom_*.rs`, compiled only with
/// `--cfg distlimit_loom`, whose names contain `loom`.
pub(crate) const LOOM_PACKAGES: &[&str] =
    &["distlimit-memory", "distlimit-hybrid", "distlimit-policy"];

/// Criterion bench targets as `(package, bench)`, run by `cargo xtask bench`.
pub(crate) const BENCH_TARGETS: &[(&str, &str)] = &[
    ("distlimit-memory", "compare"),
    ("distlimit-redis", "redis"),
    ("distlimit-policy", "limiter"),
    ("distlimit-hybrid", "hybrid"),
    ("distlimit-demo", "http"),
    ("distlimit-lease", "lease"),
];

/// Preemption bound for loom unless `LOOM_MAX_PREEMPTIONS` is already set: 3 finds the bugs our
/// small models can have and keeps the run to minutes.
const LOOM_MAX_PREEMPTIONS: &str = "3";

/// `cargo xtask test` (and `ci`): every check, fail-fast, with the Redis servers up for the
/// [`TEST_STEP`] only.
pub(crate) fn test() -> Result<()> {
    let steps = test_steps();
    let mut rows = Vec::new();
    for step in &steps {
        if setups_of(step).is_some() {
            rows.extend([REDIS_UP, &step.name, REDIS_DOWN].map(str::to_owned));
        } else {
            rows.push(step.name.clone());
        }
    }
    let mut summary = Summary::new(rows);
    let result = steps.iter().try_for_each(|step| match setups_of(step) {
        Some(setups) => with_redis(&mut summary, setups, step),
        None => summary.step(step),
    });
    summary.finish(result)
}

/// The Redis setups `step` of [`test_steps`] runs with, if any.
fn setups_of(step: &Step) -> Option<Setups> {
    match step.name.as_str() {
        TEST_STEP => Some(Setups::ALL),
        TEST_CLUSTER_STEP => Some(Setups::CLUSTER),
        _ => None,
    }
}

/// Starts `setups`, runs `step` with their variables, and stops them whether it passed or not.
fn with_redis(summary: &mut Summary, setups: Setups, step: &Step) -> Result<()> {
    let stack = summary.action(REDIS_UP, || redis::start(setups))?;
    let step = step.clone().envs(stack.env());
    let tested = summary.step(&step);
    summary.action(REDIS_DOWN, || {
        redis::stop(stack);
        Ok(())
    })?;
    tested
}

/// The steps of `cargo xtask test`, in order: cheap checks first so they fail fast, and the tests
/// built before [`TEST_STEP`] so no Redis server waits through the compile.
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
        Step::cargo("build tests", &["test", "--workspace", "--no-run"]),
        // Includes the doctests; runs with the Redis servers up (see `test`).
        Step::cargo(TEST_STEP, &["test", "--workspace"]),
        // Exactly what `cargo xtask test-cluster` runs, with only the Cluster up.
        test_cluster_step(&[]),
    ];
    steps.extend(loom_steps());
    steps
}

/// `cargo xtask test-cluster [args...]`: starts only the Cluster and runs the workspace's tests
/// whose names contain [`CLUSTER_FILTER`] against it.
pub(crate) fn test_cluster(extra: &[String]) -> Result<()> {
    let step = test_cluster_step(extra);
    let mut summary = Summary::new([REDIS_UP, TEST_CLUSTER_STEP, REDIS_DOWN]);
    let result = with_redis(&mut summary, Setups::CLUSTER, &step);
    summary.finish(result)
}

/// The test step of `test-cluster`: `cargo test --workspace --tests <cargo args> -- cluster
/// <test args>`, where `extra` is `<cargo args> [-- <test args>]` (`--release`, or
/// `-- --nocapture`). `--workspace --tests` builds exactly what `cargo xtask test` builds, so
/// within it this step compiles nothing.
pub(crate) fn test_cluster_step(extra: &[String]) -> Step {
    let (cargo_args, test_args) = match extra.iter().position(|arg| arg == "--") {
        Some(i) => (&extra[..i], &extra[i + 1..]),
        None => (extra, &[][..]),
    };
    Step::cargo(TEST_CLUSTER_STEP, &["test", "--workspace", "--tests"])
        .args(cargo_args)
        .args(["--", CLUSTER_FILTER])
        .args(test_args)
}

/// `cargo xtask redis-up`: the servers of `test`, for running tests by hand.
pub(crate) fn redis_up() -> Result<()> {
    redis::redis_up()
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
        assert_eq!(
            names[..6],
            [
                "fmt",
                "clippy",
                "doc",
                "build tests",
                TEST_STEP,
                TEST_CLUSTER_STEP
            ]
        );
        assert_eq!(names.len(), 6 + LOOM_PACKAGES.len());
        assert!(names[6..].iter().all(|name| name.starts_with("loom ")));
    }

    #[test]
    fn the_tests_are_built_before_the_servers_start_with_the_same_arguments() {
        let steps = test_steps();
        let find = |name: &str| {
            steps
                .iter()
                .find(|s| s.name == name)
                .map(|s| s.args.clone())
        };
        let build = find("build tests").unwrap_or_default();
        let test = find(TEST_STEP).unwrap_or_default();
        assert_eq!(build[..build.len() - 1], test[..]);
        assert_eq!(build.last().map(String::as_str), Some("--no-run"));
    }

    #[test]
    fn test_cluster_passes_its_arguments_through() {
        let extra = ["--release", "--", "--nocapture"].map(str::to_owned);
        let step = test_cluster_step(&extra);
        assert_eq!(
            step.args,
            [
                "test",
                "--workspace",
                "--tests",
                "--release",
                "--",
                CLUSTER_FILTER,
                "--nocapture"
            ]
        );
        assert_eq!(
            test_cluster_step(&[]).args,
            ["test", "--workspace", "--tests", "--", CLUSTER_FILTER]
        );
    }

    #[test]
    fn test_runs_exactly_what_test_cluster_runs() {
        let steps = test_steps();
        let in_test = steps.iter().find(|s| s.name == TEST_CLUSTER_STEP);
        assert_eq!(in_test.map(|s| &s.args), Some(&test_cluster_step(&[]).args));
        assert_eq!(in_test.and_then(setups_of), Some(Setups::CLUSTER));
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
