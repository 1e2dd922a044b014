//! What `cargo xtask test`, `test-cluster`, `loom` and `bench` run, as lists of [`Step`]s.
//!
//! # The Redis servers of `test`
//!
//! [`test()`] runs the checks that need no server first (fmt, clippy, doc, and building the
//! tests), so a mistake fails fast and no server idles through a long compile. Only then does it
//! start the Redis setups ([`redis::Stack`]), run the [`TEST_STEP`] with their addresses in its
//! environment (the `ENV_*` constants of `distlimit_test::server`; `DISTLIMIT_REQUIRE_REDIS=1`
//! turns a skipped Redis test into a failure), and stop them again, pass or fail. The
//! [`TEST_STEP`] skips the tests whose names contain [`CLUSTER_FILTER`]: the
//! [`TEST_CLUSTER_STEP`] runs them, exactly as `cargo xtask test-cluster` does, with only the
//! Cluster up, so that command cannot break unnoticed and no test runs twice. Then the loom
//! models ([`LOOM_STEP`]). A new check is one more [`Step`] in [`test_steps`].
//!
//! The [`TEST_STEP`] does not run its `cargo test` as one command, which would run the test
//! binaries one after the other: [`binaries::run`] runs them side by side as [`TEST_PLAN`] says
//! (a few at a time, the ones in [`TEST_ALONE`] alone first), the doctests beside them.

use std::env;

use crate::Result;
use crate::binaries::{self, DOCTESTS, Plan};
use crate::redis::{self, Setups};
use crate::step::{Step, Summary, append_flags, project_root};

/// The step of [`test_steps`] that runs with the Redis servers up.
pub(crate) const TEST_STEP: &str = "test";

/// How the [`TEST_STEP`] runs its binaries: [`TEST_JOBS`] at a time, after [`TEST_ALONE`];
/// first the jobs that burn CPU ([`TEST_FIRST`] and the small binaries), then the slow ones that
/// mostly wait ([`TEST_LAST`]).
pub(crate) const TEST_PLAN: Plan = Plan {
    jobs: TEST_JOBS,
    alone: TEST_ALONE,
    first: TEST_FIRST,
    last: TEST_LAST,
};

/// How many jobs (test binaries, the doctests) the [`TEST_STEP`] runs at once, unless
/// `DISTLIMIT_TEST_JOBS` says otherwise ([`test_jobs`]). Most of their time is waiting
/// (failovers, timeouts, Redis round trips), so 3 pay on CI's 2 cores.
const TEST_JOBS: usize = 3;

/// [`TEST_JOBS`] unless `DISTLIMIT_TEST_JOBS` is set to a number of jobs (`1`: one binary at a
/// time, as `cargo test` runs them).
fn test_jobs() -> usize {
    env::var("DISTLIMIT_TEST_JOBS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&jobs| jobs > 0)
        .unwrap_or(TEST_JOBS)
}

/// Binaries whose tests must not run beside another binary's (`distlimit-redis/tests/main.rs`
/// says why they are binaries of their own): `failover` fails the shared Sentinel set's primary
/// over, which the other binaries' Sentinel tests would see; `bad_input` pauses the shared
/// Cluster's primaries (those tests run in `test-cluster`, the rest as well stay alone here).
const TEST_ALONE: &[&str] = &["distlimit-redis/failover", "distlimit-redis/bad_input"];

/// The CPU-heavy jobs, started first (2026-12-04, alone on 2 cores: the doctests about 25 s,
/// mostly compiling; distlimit-hybrid's binary 22 s with 19 s of CPU), with the small binaries
/// (under 6 s each) after them.
const TEST_FIRST: &[&str] = &[DOCTESTS, "distlimit-hybrid/integration"];

/// The slow binaries, which mostly wait (failovers, timeouts, child processes: the Redis binary
/// 95 s with 56 s of CPU, the server's 60 s with 11 s, the demo's 45 s with 15 s), started once
/// the CPU-heavy jobs have ended: their tests time Redis calls (200 ms response timeouts) and
/// throughput, which a starved CPU fails.
const TEST_LAST: &[&str] = &[
    "distlimit-redis/integration",
    "distlimit-server/integration",
    "distlimit-demo/integration",
];

/// Summary row for starting the Redis servers.
const REDIS_UP: &str = "redis up";

/// Summary row for stopping them.
const REDIS_DOWN: &str = "redis down";

/// The step of [`test_steps`] that runs the Cluster tests with only the Cluster up, as
/// `cargo xtask test-cluster` does.
pub(crate) const TEST_CLUSTER_STEP: &str = "test-cluster";

/// The test name filter of `test-cluster`: every test whose name contains it needs the Cluster
/// and nothing else (`DISTLIMIT_REQUIRE_REDIS=1` fails any that reaches for another setup).
/// [`TEST_STEP`] skips these tests, so together the two steps run every test once. A test's name
/// is its module path: every test of `distlimit-redis/tests/cluster_*.rs` matches. No doctest's
/// name (file and item path) contains it; one that did would run in neither step.
pub(crate) const CLUSTER_FILTER: &str = "cluster";

/// Packages with loom models: tests under `src/tests/loom_*.rs`, compiled only with
/// `--cfg distlimit_loom`, whose names contain `loom`.
pub(crate) const LOOM_PACKAGES: &[&str] =
    &["distlimit-memory", "distlimit-hybrid", "distlimit-policy"];

/// The step of [`test_steps`] and `cargo xtask loom` that runs the loom models.
pub(crate) const LOOM_STEP: &str = "loom";

/// The cargo profile of [`LOOM_STEP`] (root `Cargo.toml`).
const LOOM_PROFILE: &str = "loom";

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
/// The [`TEST_STEP`] runs its binaries side by side ([`binaries::run`] with [`TEST_PLAN`]).
fn with_redis(summary: &mut Summary, setups: Setups, step: &Step) -> Result<()> {
    let stack = summary.action(REDIS_UP, || redis::start(setups))?;
    let step = step.clone().envs(stack.env());
    let tested = if step.name == TEST_STEP {
        let plan = Plan {
            jobs: test_jobs(),
            ..TEST_PLAN
        };
        summary.action(TEST_STEP, || binaries::run(&step, &plan))
    } else {
        summary.step(&step)
    };
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
    vec![
        Step::cargo("fmt", &["fmt", "--all", "--", "--check"]),
        clippy.args(["--", "-D", "warnings"]),
        Step::cargo("doc", &["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", append_flags("RUSTDOCFLAGS", "-D warnings")),
        Step::cargo("build tests", &["test", "--workspace", "--no-run"]),
        // Includes the doctests; runs with the Redis servers up (see `test`). The Cluster tests
        // are left to the next step, so each test runs once.
        Step::cargo(
            TEST_STEP,
            &["test", "--workspace", "--", "--skip", CLUSTER_FILTER],
        ),
        // Exactly what `cargo xtask test-cluster` runs, with only the Cluster up.
        test_cluster_step(&[]),
        loom_step(),
    ]
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

/// The step of `cargo xtask loom`: the `loom` tests of every [`LOOM_PACKAGES`] package, in one
/// cargo invocation with the `loom` profile.
///
/// `--cfg distlimit_loom` goes through `RUSTFLAGS`, so every crate of the build sees it; the
/// profile gives the build its own directory (`target/loom`), so switching never rebuilds the
/// normal one, and compiles only the workspace's crates and loom's scheduler with
/// optimizations, and none of the packages' dev-dependencies (the root `Cargo.toml` says why).
pub(crate) fn loom_step() -> Step {
    let preemptions =
        env::var("LOOM_MAX_PREEMPTIONS").unwrap_or_else(|_| LOOM_MAX_PREEMPTIONS.to_owned());
    let mut step = Step::cargo(LOOM_STEP, &["test", "--profile", LOOM_PROFILE]);
    for package in LOOM_PACKAGES {
        step = step.args(["-p", package]);
    }
    step.args(["--lib", "loom"])
        .env(
            "RUSTFLAGS",
            append_flags("RUSTFLAGS", "--cfg distlimit_loom"),
        )
        .env("LOOM_MAX_PREEMPTIONS", preemptions)
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
            names,
            [
                "fmt",
                "clippy",
                "doc",
                "build tests",
                TEST_STEP,
                TEST_CLUSTER_STEP,
                LOOM_STEP
            ]
        );
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
        assert_eq!(build.last().map(String::as_str), Some("--no-run"));
        // Same cargo arguments (so nothing is built again); the rest goes to the test binaries.
        let cargo_args = test.iter().position(|a| a == "--").map(|i| &test[..i]);
        assert_eq!(cargo_args, Some(&build[..build.len() - 1]));
    }

    #[test]
    fn test_skips_exactly_the_tests_test_cluster_runs() {
        let steps = test_steps();
        let args = |name: &str| {
            let step = steps.iter().find(|s| s.name == name);
            step.map(|s| s.args.clone()).unwrap_or_default()
        };
        let test = args(TEST_STEP);
        assert_eq!(test[test.len() - 3..], ["--", "--skip", CLUSTER_FILTER]);
        let cluster = args(TEST_CLUSTER_STEP);
        assert_eq!(cluster[cluster.len() - 2..], ["--", CLUSTER_FILTER]);
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
    fn loom_builds_every_package_at_once_with_its_cfg_and_profile() {
        let step = loom_step();
        let var = |key: &str| {
            step.env
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        assert!(var("RUSTFLAGS").ends_with("--cfg distlimit_loom"));
        assert!(!var("LOOM_MAX_PREEMPTIONS").is_empty());
        assert_eq!(step.args[..3], ["test", "--profile", LOOM_PROFILE]);
        for package in LOOM_PACKAGES {
            assert!(step.args.windows(2).any(|w| w == ["-p", *package]));
        }
        assert_eq!(step.args[step.args.len() - 2..], ["--lib", "loom"]);
    }

    #[test]
    fn every_integration_test_file_is_in_a_test_target() {
        // With `autotests = false`, a `tests/<file>.rs` compiles only as a module of
        // `tests/main.rs` or as a `[[test]]` of its own: a file that is neither never runs.
        let mut files = 0;
        let mut missing = Vec::new();
        let crates = std::fs::read_dir(project_root().join("crates"));
        for krate in crates.into_iter().flatten().flatten().map(|e| e.path()) {
            let Ok(tests) = std::fs::read_dir(krate.join("tests")) else {
                continue;
            };
            let read = |path| std::fs::read_to_string(krate.join(path)).unwrap_or_default();
            let (main, manifest) = (read("tests/main.rs"), read("Cargo.toml"));
            for name in tests
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
            {
                let Some(module) = name.strip_suffix(".rs").filter(|m| *m != "main") else {
                    continue;
                };
                files += 1;
                let declared = main.lines().any(|l| l == format!("mod {module};"));
                if !declared && !manifest.contains(&format!("path = \"tests/{name}\"")) {
                    missing.push(krate.join("tests").join(&name));
                }
            }
        }
        assert!(files > 0);
        assert!(missing.is_empty(), "in no test target: {missing:?}");
    }

    #[test]
    fn the_test_plan_names_test_targets_that_exist() {
        // A renamed target would silently lose its place in the plan (alone, first or last).
        for label in TEST_ALONE
            .iter()
            .chain(TEST_FIRST)
            .chain(TEST_LAST)
            .filter(|l| **l != DOCTESTS)
        {
            let (package, target) = label.split_once('/').unwrap_or_default();
            let manifest = project_root()
                .join("crates")
                .join(package)
                .join("Cargo.toml");
            let manifest = std::fs::read_to_string(manifest).unwrap_or_default();
            let declared = format!("[[test]]\nname = \"{target}\"");
            assert!(manifest.contains(&declared), "{label} is not a test target");
        }
        assert!(TEST_FIRST.contains(&DOCTESTS));
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
