//! `cargo xtask`: the one entry point for CI and for people (`cargo xtask help` lists the commands).
//!
//! Everything is plain Rust over [`std::process::Command`], so a command behaves the same on a
//! laptop and in CI and there are no shell scripts to keep in sync: `.ci/run` only prints the
//! toolchain and calls `cargo xtask test`.
//!
//! Code map:
//!
//! - `main.rs`: argument parsing and dispatch.
//! - [`step`]: a [`Step`](step::Step) is one command with its environment;
//!   [`run_all`](step::run_all) runs a list fail-fast, times each step and prints a summary.
//! - [`tasks`]: what `test`, `test-cluster`, `loom` and `bench` run, including the lists of loom
//!   packages and bench targets, the test name filter of `test-cluster`, and how the test step
//!   schedules its binaries.
//! - [`binaries`]: the test step's binaries (listed by `cargo test --no-run
//!   --message-format=json`) run side by side, each one's output printed whole when it ends.
//! - [`rls`]: `bench-rls`, distlimit-server against limitador-server and a bare tonic floor,
//!   with the project's runner (`xtask/rls-bench/`).
//! - [`redis`]: finding (or installing) `redis-server` and `openssl`, then starting the Redis
//!   setups with the harness of `distlimit_test::server` (its `Stack` passes their addresses
//!   to the tests as `DISTLIMIT_REDIS_*` variables), and `redis-up`.

// A CLI talks to its user on stdout; the workspace-wide lint is meant for the library crates.
#![allow(clippy::print_stdout)]

mod binaries;
mod redis;
mod rls;
mod step;
mod tasks;

use std::fmt;
use std::process::ExitCode;

/// Any failure of a command, reported to the user as `error: <message>`.
type Error = Box<dyn std::error::Error>;

/// `Result` with [`Error`] as the default error type.
type Result<T, E = Error> = std::result::Result<T, E>;

/// The command line printed by `cargo xtask help` and after a usage error.
///
/// Left out on purpose: `redis-smoke` (starts and stops one server).
const USAGE: &str = "\
Usage: cargo xtask <command> [args]

Commands:
  test              everything CI checks, fail-fast: fmt --check, clippy -D warnings,
                    doc (RUSTDOCFLAGS=-D warnings), build the tests, then start Redis
                    (standalone, Sentinel, 6-node Cluster on free loopback ports; redis-server
                    is installed with apt-get if missing and possible), test --workspace with
                    DISTLIMIT_REDIS_* and DISTLIMIT_REQUIRE_REDIS=1 set, skipping the tests
                    named `cluster` (the test binaries and the doctests side by side, 3 at a
                    time, the CPU-heavy ones before the slow Redis, server and demo binaries;
                    DISTLIMIT_TEST_JOBS sets how many), stop Redis, then `test-cluster`, then
                    the loom models
  ci                same as `test` (the CI entry point)
  loom              loom models only: one cargo test with profile loom (target/loom) and
                    --cfg distlimit_loom (LOOM_MAX_PREEMPTIONS defaults to 3; set it to override)
  bench [args...]   criterion benches; args go to criterion, e.g. `bench --save-baseline main`
  bench-rls [LIM_BIN]
                    distlimit-server against Kuadrant's limitador-server over gRPC, and a bare
                    tonic server answering OK (the floor): builds both with the `dist` profile,
                    runs xtask/rls-bench/run.sh on the configs and helpers of the shared runner
                    ../shared/peers/rls-bench/run.sh (RLS_BENCH names another) with DL_BIN,
                    FLOOR_BIN and LIM_BIN (the argument, else $LIM_BIN, else the shared
                    runner's bin/); PHASES defaults to `verify memory`, ROUNDS to 3
  test-cluster [args...]
                    start only the Redis Cluster and run the workspace tests whose names contain
                    `cluster` against it (`test` runs this too); args go to cargo test, those
                    after `--` to the test binaries, e.g. `test-cluster -- --nocapture`
  redis-up          start the Redis setups of `test`, print their variables as `export` lines,
                    keep them up until Ctrl-C, `kill <pid>` or (when stdin is a pipe) stdin closes
  help              this text
";

/// A command line that does not parse; reported with [`USAGE`] and exit code 2.
#[derive(Debug)]
struct UsageError(String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Every resource a command holds (Redis servers, temp dirs) is owned by a value inside
    // `run`, so it is dropped, and torn down, before we pick the exit code, on failure too.
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.is::<UsageError>() => {
            eprintln!("error: {err}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the command named by `args[0]` with the rest as its arguments.
fn run(args: &[String]) -> Result<()> {
    let Some((command, rest)) = args.split_first() else {
        print!("{USAGE}");
        return Ok(());
    };
    match command.as_str() {
        "help" | "-h" | "--help" => {
            print!("{USAGE}");
            Ok(())
        }
        "test" | "ci" => {
            no_args(command, rest)?;
            tasks::test()
        }
        "loom" => {
            no_args(command, rest)?;
            step::run_all(&[tasks::loom_step()])
        }
        "bench" => step::run_all(&tasks::bench_steps(rest)),
        "bench-rls" => rls::bench_rls(rest),
        "test-cluster" => tasks::test_cluster(rest),
        "redis-up" => {
            no_args(command, rest)?;
            tasks::redis_up()
        }
        "redis-smoke" => {
            no_args(command, rest)?;
            redis::smoke()
        }
        other => Err(UsageError(format!("unknown command `{other}`")).into()),
    }
}

/// Rejects arguments given to a command that takes none, rather than silently ignoring them.
fn no_args(command: &str, rest: &[String]) -> Result<()> {
    match rest.first() {
        None => Ok(()),
        Some(arg) => Err(UsageError(format!(
            "`cargo xtask {command}` takes no arguments, got `{arg}`"
        ))
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Turns a `&str` slice into the owned arguments `run` takes.
    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn unknown_commands_and_stray_arguments_are_usage_errors() {
        for bad in [
            &["frobnicate"][..],
            &["test", "--nope"],
            &["loom", "x"],
            &["redis-up", "x"],
        ] {
            let err = run(&args(bad)).err();
            assert!(err.is_some_and(|e| e.is::<UsageError>()), "{bad:?}");
        }
    }

    #[test]
    fn help_succeeds() {
        assert!(run(&args(&[])).is_ok());
        assert!(run(&args(&["help"])).is_ok());
    }
}
