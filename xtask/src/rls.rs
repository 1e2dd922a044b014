//! `cargo xtask bench-rls`: distlimit-server against Kuadrant's limitador-server in one command.
//!
//! It builds `distlimit-server` with the [`PROFILE`] operators are told to ship (LTO, one
//! codegen unit), then runs the side-by-side runner of `../shared/peers/rls-bench/run.sh`
//! (h2load and `rlsload` on one core, each server pinned to the other, interleaved rounds, one
//! table of ratios in `target/rls-bench/results/<time>/summary.md`) with `DL_BIN` set to that
//! build and `LIM_BIN` to the peer's binary.

use std::env;
use std::path::{Path, PathBuf};

use crate::Result;
use crate::step::{Step, project_root, run_all};

/// The cargo profile the bench builds, the one the server's README tells operators to use.
pub(crate) const PROFILE: &str = "dist";

/// The runner, relative to the project root, unless `RLS_BENCH` names another.
const RUNNER: &str = "../shared/peers/rls-bench/run.sh";

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
    let runner = set("RLS_BENCH").map_or_else(|| root.join(RUNNER), PathBuf::from);
    let runner_dir = runner.parent().unwrap_or(Path::new(".")).to_path_buf();
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
    let build = Step::cargo(
        format!("build distlimit-server ({PROFILE})"),
        &["build", "--profile", PROFILE, "-p", "distlimit-server"],
    );
    let run = Step::new("rls-bench", "bash", &[runner.to_string_lossy().as_ref()])
        .env("DL_BIN", dl_bin.to_string_lossy())
        .env("LIM_BIN", lim_bin.to_string_lossy())
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
            ["build", "--profile", "dist", "-p", "distlimit-server"]
        );
        assert_eq!(steps[1].args, ["/bench/run.sh"]);
        assert_eq!(
            env_of(&steps[1], "DL_BIN"),
            Some("/t/dist/distlimit-server")
        );
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
