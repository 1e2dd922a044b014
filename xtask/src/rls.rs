//! `cargo xtask bench-rls`: distlimit-server against Kuadrant's limitador-server in one command.
//!
//! It builds `distlimit-server` and the floor (its `rls-floor` binary, feature `floor`: a bare
//! tonic server answering a constant OK) with the [`PROFILE`] operators are told to ship (LTO, one codegen
//! unit), then runs the project's runner, `xtask/rls-bench/run.sh` (adapted from the shared
//! `../shared/peers/rls-bench/run.sh`, whose configs, helpers and peer binary it reads: h2load and
//! `rlsload` on one core, each server pinned to the other, interleaved rounds, one table of
//! ratios in `target/rls-bench/results/<time>/summary.md`) with `DL_BIN` set to that build,
//! `FLOOR_BIN` to the floor and `LIM_BIN` to the peer's binary.

use std::env;
use std::path::{Path, PathBuf};

use crate::Result;
use crate::step::{Step, project_root, run_all};

/// The cargo profile the bench builds, the one the server's README tells operators to use.
pub(crate) const PROFILE: &str = "dist";

/// The shared runner, relative to the project root, unless `RLS_BENCH` names another: its
/// folder holds the configs, helpers and peer binary the project's runner reads.
const SHARED_RUNNER: &str = "../shared/peers/rls-bench/run.sh";

/// The project's runner (the shared one with the floor side), relative to the project root.
const RUNNER: &str = "xtask/rls-bench/run.sh";

/// The floor's binary (`src/bin/rls_floor.rs` of the server, feature `floor`), built beside
/// the server.
const FLOOR: &str = "rls-floor";

/// The phases run unless `PHASES` is set: the memory store against limitador's, about 3
/// minutes per round (the runner's own default adds Redis and exactness, about 18 minutes).
const DEFAULT_PHASES: &str = "verify memory";

/// `cargo xtask bench-rls [LIM_BIN]`: builds, then runs the runner; see the module docs.
pub(crate) fn bench_rls(args: &[String]) -> Result<()> {
    let steps = bench_rls_steps(args, &|key| env::var(key).ok())?;
    run_all(&steps)
}

/// The two steps of `bench-rls`, with the environment read through `var` (a test passes its
/// own): `args` is at most the peer's binary (else `LIM_BIN`, else the runner's `bin/`).
pub(crate) fn bench_rls_steps(
    args: &[String],
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<Step>> {
    let set = |key: &str| var(key).filter(|value| !value.is_empty());
    let root = project_root();
    let shared = set("RLS_BENCH").map_or_else(|| root.join(SHARED_RUNNER), PathBuf::from);
    let runner_dir = shared.parent().unwrap_or(Path::new(".")).to_path_buf();
    let lim_bin = match args {
        [] => set("LIM_BIN").map_or_else(|| runner_dir.join("bin/limitador-server"), PathBuf::from),
        [path] => PathBuf::from(path),
        [_, extra, ..] => {
            return Err(crate::UsageError(format!(
                "`cargo xtask bench-rls` takes at most the peer's binary, got `{extra}` too"
            ))
            .into());
        }
    };
    // Relative target dirs are resolved from the workspace root, where steps run.
    let target = set("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |dir| root.join(dir));
    let dl_bin = target.join(PROFILE).join("distlimit-server");
    let floor_bin = target.join(PROFILE).join(FLOOR);
    let build = Step::cargo(
        format!("build distlimit-server and its floor ({PROFILE})"),
        &[
            "build",
            "--profile",
            PROFILE,
            "-p",
            "distlimit-server",
            "--features",
            "floor",
        ],
    );
    let runner = root.join(RUNNER);
    let run = Step::new("rls-bench", "bash", &[runner.to_string_lossy().as_ref()])
        .env("DL_BIN", dl_bin.to_string_lossy())
        .env("FLOOR_BIN", floor_bin.to_string_lossy())
        .env("LIM_BIN", lim_bin.to_string_lossy())
        .env("PEER", runner_dir.to_string_lossy())
        .env(
            "PHASES",
            set("PHASES").unwrap_or_else(|| DEFAULT_PHASES.to_owned()),
        );
    Ok(vec![build, run])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of<'a>(step: &'a Step, key: &str) -> Option<&'a str> {
        step.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn builds_the_dist_profile_and_hands_both_binaries_to_the_runner() {
        let vars = |key: &str| match key {
            "CARGO_TARGET_DIR" => Some("/t".to_owned()),
            "RLS_BENCH" => Some("/bench/run.sh".to_owned()),
            _ => None,
        };
        let steps = bench_rls_steps(&[], &vars).unwrap_or_default();
        assert_eq!(steps.len(), 2);
        assert_eq!(
            steps[0].args,
            [
                "build",
                "--profile",
                "dist",
                "-p",
                "distlimit-server",
                "--features",
                "floor"
            ]
        );
        assert_eq!(
            steps[1].args,
            [project_root().join(RUNNER).to_string_lossy().as_ref()]
        );
        assert_eq!(env_of(&steps[1], "PEER"), Some("/bench"));
        assert_eq!(
            env_of(&steps[1], "DL_BIN"),
            Some("/t/dist/distlimit-server")
        );
        assert_eq!(env_of(&steps[1], "FLOOR_BIN"), Some("/t/dist/rls-floor"));
        assert_eq!(
            env_of(&steps[1], "LIM_BIN"),
            Some("/bench/bin/limitador-server")
        );
        assert_eq!(env_of(&steps[1], "PHASES"), Some(DEFAULT_PHASES));
        let given = bench_rls_steps(&["/lim".to_owned()], &vars).unwrap_or_default();
        assert_eq!(env_of(&given[1], "LIM_BIN"), Some("/lim"));
    }

    #[test]
    fn more_than_one_argument_is_a_usage_error() {
        let err = bench_rls_steps(&["a".to_owned(), "b".to_owned()], &|_| None).err();
        assert!(err.is_some_and(|e| e.is::<crate::UsageError>()));
    }
}
