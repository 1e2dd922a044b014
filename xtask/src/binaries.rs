//! The test step's binaries side by side.
//!
//! `cargo test` runs its test binaries one after the other. Most of the workspace's test time is
//! waiting (fault scenarios sleeping through a Sentinel failover or an unreachable home, Redis
//! round trips, child processes starting), so [`run`] runs the executables that `cargo test
//! --no-run` lists itself, a few at a time ([`Plan::jobs`]), and the doctests (`cargo test
//! --doc`, which compiles them) as one more job beside them. Each binary runs as cargo runs it:
//! from its package's directory, with its package's `CARGO_MANIFEST_DIR`, `CARGO_MANIFEST_PATH`,
//! `CARGO_PKG_NAME` and `CARGO_PKG_VERSION`, the step's environment and the test arguments (what
//! follows `--`). Its output (stdout and stderr, in order) goes to a file and is printed whole
//! when it ends, so two binaries' lines never interleave; a table of every job's time ends the
//! step. Three phases: the binaries of [`Plan::alone`] one at a time, nothing beside them; then
//! every other job but the [`Plan::last`] ones, [`Plan::first`] first; then the [`Plan::last`]
//! ones, so the jobs that burn CPU (compiling the doctests, property tests) are done before the
//! ones that time their Redis calls start. After a failure no new job starts; the running ones
//! end and the step fails naming every failed job.

use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use crate::Result;
use crate::step::{Step, format_duration, project_root, shell_quote};

/// How [`run`] schedules a step's jobs, named by their labels as printed: a binary's
/// `package/target` (`distlimit-redis/integration`; unit tests add the kind:
/// `distlimit-core/distlimit_core (lib)`), and [`DOCTESTS`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// How many jobs run at once.
    pub(crate) jobs: usize,
    /// Binaries whose tests must not run beside another binary's: run first, one at a time.
    pub(crate) alone: &'static [&'static str],
    /// Jobs started first in the second phase, in this order; the others follow in package
    /// order.
    pub(crate) first: &'static [&'static str],
    /// Jobs of the third phase, started (in this order) once every other job has ended.
    pub(crate) last: &'static [&'static str],
}

/// The label of the doctests' job (`cargo test --doc`).
pub(crate) const DOCTESTS: &str = "doctests";

/// A test executable of the workspace, as `cargo test --no-run --message-format=json` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Binary {
    /// Package name.
    pub(crate) package: String,
    /// Package version.
    version: String,
    /// Target name: `integration`, `alloc`, the crate name of a lib's unit tests.
    pub(crate) target: String,
    /// Target kind: `lib`, `bin`, `test`.
    kind: String,
    /// The executable.
    executable: PathBuf,
    /// The package's `Cargo.toml`.
    manifest: PathBuf,
}

impl Binary {
    /// Reads one line of cargo's JSON messages: a test executable, or `None` for anything else
    /// (other messages, libraries, the binaries built for the integration tests to run).
    pub(crate) fn from_message(line: &str) -> Option<Binary> {
        let message: serde_json::Value = serde_json::from_str(line).ok()?;
        let text = |value: &serde_json::Value| value.as_str().map(str::to_owned);
        if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
            return None;
        }
        let (package, version) = package_of(message["package_id"].as_str()?)?;
        Some(Binary {
            package,
            version,
            target: text(&message["target"]["name"])?,
            kind: text(&message["target"]["kind"][0])?,
            executable: text(&message["executable"])?.into(),
            manifest: text(&message["manifest_path"])?.into(),
        })
    }

    /// `package/target`, with the kind for unit tests: `distlimit-redis/integration`,
    /// `distlimit-core/distlimit_core (lib)`.
    fn label(&self) -> String {
        match self.kind.as_str() {
            "test" => format!("{}/{}", self.package, self.target),
            kind => format!("{}/{} ({kind})", self.package, self.target),
        }
    }
}

/// The name and version in a package ID spec: `path+file:///w/crates/a#0.1.0` (the directory
/// is the name) or `path+file:///w/crates/x#a@0.1.0`.
fn package_of(id: &str) -> Option<(String, String)> {
    let (url, fragment) = id.rsplit_once('#')?;
    match fragment.split_once('@') {
        Some((name, version)) => Some((name.to_owned(), version.to_owned())),
        None => {
            let name = url.trim_end_matches('/').rsplit('/').next()?;
            Some((name.to_owned(), fragment.to_owned()))
        }
    }
}

/// Runs the step `cargo test <cargo args> -- <test args>` (`step`) as described in the module
/// docs: its binaries per `plan`, and its doctests.
pub(crate) fn run(step: &Step, plan: &Plan) -> Result<()> {
    let (cargo_args, test_args) = match step.args.iter().position(|a| a == "--") {
        Some(i) => (&step.args[..i], &step.args[i + 1..]),
        None => (&step.args[..], &[][..]),
    };
    let binaries = list(step, cargo_args)?;
    let count = binaries.len();
    let mut jobs: Vec<Job> = binaries
        .iter()
        .map(|binary| Job::binary(binary, step, test_args))
        .collect();
    jobs.push(Job {
        label: DOCTESTS.to_owned(),
        command: Step::cargo(DOCTESTS, &[])
            .args(cargo_args)
            .args(["--doc", "--"])
            .args(test_args)
            .envs(step.env.iter().cloned()),
        dir: project_root(),
    });
    let [alone, pooled, last] = schedule(jobs, plan);
    println!(
        "==> {}: `{}`, its {count} binaries run side by side: {} alone first, then {} jobs \
         (the doctests one of them), then {}, {} at a time",
        step.name,
        step.command_line(),
        alone.len(),
        pooled.len(),
        last.len(),
        plan.jobs
    );
    let mut done = Vec::new();
    let mut failed = pool(&step.name, alone, 1, &mut done);
    for phase in [pooled, last] {
        if failed.is_empty() {
            failed = pool(&step.name, phase, plan.jobs, &mut done);
        }
    }
    done.sort_by_key(|(_, took)| std::cmp::Reverse(*took));
    println!("==> {}: each job's time", step.name);
    for (label, took) in &done {
        println!("    {:>7}  {label}", format_duration(*took));
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("step `{}`: failed: {}", step.name, failed.join(", ")).into())
    }
}

/// The test executables `cargo test <cargo_args> --no-run` builds, sorted by package and target
/// (the build tests step built them: nothing is compiled here; if something were, its errors
/// would show as usual).
fn list(step: &Step, cargo_args: &[String]) -> Result<Vec<Binary>> {
    let listing = Step::cargo(format!("{} (list)", step.name), &[])
        .args(cargo_args)
        .args(["--no-run", "--message-format=json-render-diagnostics"])
        .envs(step.env.iter().cloned());
    let mut child = listing
        .command(&project_root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", listing.command_line()))?;
    let mut binaries = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            binaries.extend(Binary::from_message(&line?));
        }
    }
    let status = child.wait()?;
    if !status.success() {
        return Err(format!("{status}: {}", listing.command_line()).into());
    }
    binaries
        .sort_by(|a, b| (&a.package, &a.kind, &a.target).cmp(&(&b.package, &b.kind, &b.target)));
    binaries.dedup();
    Ok(binaries)
}

/// Splits `jobs` into the three phases: [`Plan::alone`]; the others, [`Plan::first`] first;
/// [`Plan::last`], in its order.
fn schedule(jobs: Vec<Job>, plan: &Plan) -> [Vec<Job>; 3] {
    let (alone, others): (Vec<Job>, Vec<Job>) = jobs
        .into_iter()
        .partition(|job| plan.alone.contains(&job.label.as_str()));
    let (mut last, mut pooled): (Vec<Job>, Vec<Job>) = others
        .into_iter()
        .partition(|job| plan.last.contains(&job.label.as_str()));
    let rank = |list: &[&str], job: &Job| list.iter().position(|l| *l == job.label);
    // Stable: the others keep their order.
    pooled.sort_by_key(|job| rank(plan.first, job).unwrap_or(usize::MAX));
    last.sort_by_key(|job| rank(plan.last, job));
    [alone, pooled, last]
}

/// One command of the pool and where it runs.
struct Job {
    /// Name in the output and the table.
    label: String,
    /// The command, with its environment.
    command: Step,
    /// Its working directory.
    dir: PathBuf,
}

impl Job {
    /// `binary` with the step's environment and `test_args`, as cargo runs it.
    fn binary(binary: &Binary, step: &Step, test_args: &[String]) -> Job {
        let dir = binary
            .manifest
            .parent()
            .unwrap_or(Path::new("."))
            .to_owned();
        let exe = binary.executable.to_string_lossy();
        let command = Step::new(binary.label(), &exe, &[])
            .args(test_args)
            .envs(step.env.iter().cloned())
            .env("CARGO_MANIFEST_DIR", dir.to_string_lossy())
            .env("CARGO_MANIFEST_PATH", binary.manifest.to_string_lossy())
            .env("CARGO_PKG_NAME", binary.package.as_str())
            .env("CARGO_PKG_VERSION", binary.version.as_str());
        Job {
            label: binary.label(),
            command,
            dir,
        }
    }

    /// Runs the job with its output in `log`; how it ended and how long it took.
    fn execute(&self, log: &Path) -> (std::io::Result<ExitStatus>, Duration, String) {
        let start = Instant::now();
        let status = File::create(log).and_then(|file| {
            self.command
                .command(&self.dir)
                .stdin(Stdio::null())
                .stdout(file.try_clone()?)
                .stderr(file)
                .status()
        });
        let took = start.elapsed();
        let output = fs::read(log).unwrap_or_default();
        let _ = fs::remove_file(log);
        (status, took, String::from_utf8_lossy(&output).into_owned())
    }
}

/// Runs `jobs`, `width` at a time, printing each one's output when it ends; records every
/// finished job's time in `done` and returns the labels of the failed ones. After a failure no
/// new job starts.
fn pool(
    step: &str,
    jobs: Vec<Job>,
    width: usize,
    done: &mut Vec<(String, Duration)>,
) -> Vec<String> {
    let queue = Mutex::new(jobs.into_iter().enumerate().collect::<VecDeque<_>>());
    let stop = AtomicBool::new(false);
    let mut failed = Vec::new();
    let logs = std::env::temp_dir();
    let pid = std::process::id();
    thread::scope(|scope| {
        let (sender, finished) = mpsc::channel();
        for _ in 0..width.max(1) {
            let sender = sender.clone();
            let (queue, stop, logs) = (&queue, &stop, &logs);
            scope.spawn(move || {
                loop {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let next = queue.lock().map(|mut q| q.pop_front());
                    let Ok(Some((i, job))) = next else { break };
                    let log = logs.join(format!("xtask-{pid}-{step}-{i}.log").replace(' ', "-"));
                    let (status, took, output) = job.execute(&log);
                    if !status.as_ref().is_ok_and(ExitStatus::success) {
                        stop.store(true, Ordering::Relaxed);
                    }
                    if sender.send((job, status, took, output)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(sender);
        for (job, status, took, output) in finished {
            let dir = job.dir.strip_prefix(project_root()).unwrap_or(&job.dir);
            let dir = shell_quote(&dir.to_string_lossy());
            let exe = shell_quote(job.command.display_program());
            println!("==> {step}: {} (in {dir}: {exe} ...)", job.label);
            print!("{output}");
            if !output.is_empty() && !output.ends_with('\n') {
                println!();
            }
            let took_text = format_duration(took);
            match status {
                Ok(status) if status.success() => {
                    println!("==> {step}: {}: ok in {took_text}", job.label)
                }
                Ok(status) => {
                    println!(
                        "==> {step}: {}: FAILED ({status}) after {took_text}",
                        job.label
                    );
                    failed.push(job.label.clone());
                }
                Err(err) => {
                    println!("==> {step}: {}: could not run it: {err}", job.label);
                    failed.push(job.label.clone());
                }
            }
            done.push((job.label, took));
        }
    });
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: &str = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/distlimit-core#0.1.0","manifest_path":"/w/crates/distlimit-core/Cargo.toml","target":{"kind":["lib"],"crate_types":["lib"],"name":"distlimit_core","src_path":"/w/crates/distlimit-core/src/lib.rs","edition":"2024","doc":true,"doctest":true,"test":true},"profile":{"opt_level":"0","debuginfo":0,"debug_assertions":true,"overflow_checks":true,"test":true},"features":[],"filenames":["/t/debug/deps/distlimit_core-af88"],"executable":"/t/debug/deps/distlimit_core-af88","fresh":true}"#;

    #[test]
    fn cargo_messages_name_the_test_executables_and_nothing_else() {
        let lib = Binary::from_message(LIB);
        assert_eq!(
            lib,
            Some(Binary {
                package: "distlimit-core".to_owned(),
                version: "0.1.0".to_owned(),
                target: "distlimit_core".to_owned(),
                kind: "lib".to_owned(),
                executable: "/t/debug/deps/distlimit_core-af88".into(),
                manifest: "/w/crates/distlimit-core/Cargo.toml".into(),
            })
        );
        assert_eq!(
            lib.map(|b| b.label()).as_deref(),
            Some("distlimit-core/distlimit_core (lib)")
        );
        // The binary an integration test runs (built without the test harness).
        let bin = LIB.replace(r#""test":true},"features""#, r#""test":false},"features""#);
        assert_eq!(Binary::from_message(&bin), None);
        // The library itself (no executable).
        let rlib = LIB.replace(
            r#""executable":"/t/debug/deps/distlimit_core-af88""#,
            r#""executable":null"#,
        );
        assert_eq!(Binary::from_message(&rlib), None);
        assert_eq!(
            Binary::from_message(r#"{"reason":"build-finished","success":true}"#),
            None
        );
        assert_eq!(Binary::from_message("not json"), None);
    }

    #[test]
    fn package_ids_give_name_and_version() {
        let of = |id| package_of(id).unwrap_or_default();
        assert_eq!(
            of("path+file:///w/crates/distlimit-core#0.1.0"),
            ("distlimit-core".into(), "0.1.0".into())
        );
        assert_eq!(
            of("path+file:///w/xtask#xtask@0.0.0"),
            ("xtask".into(), "0.0.0".into())
        );
        assert_eq!(
            of("registry+https://github.com/rust-lang/crates.io-index#serde@1.0.2"),
            ("serde".into(), "1.0.2".into())
        );
    }

    #[test]
    fn alone_jobs_go_first_and_the_last_ones_last() {
        let job = |label: &str| Job {
            label: label.to_owned(),
            command: Step::new(label, "true", &[]),
            dir: PathBuf::new(),
        };
        let plan = Plan {
            jobs: 3,
            alone: &["b/failover"],
            first: &[DOCTESTS, "a/integration"],
            last: &["c/integration", "b/integration"],
        };
        let labels = |jobs: &[Job]| jobs.iter().map(|j| j.label.clone()).collect::<Vec<_>>();
        let all = [
            "a/alloc",
            "a/integration",
            "b/failover",
            "b/integration",
            "c/integration",
        ];
        let mut jobs: Vec<Job> = all.into_iter().map(job).collect();
        jobs.push(job(DOCTESTS));
        let [alone, pooled, last] = schedule(jobs, &plan);
        assert_eq!(labels(&alone), ["b/failover"]);
        assert_eq!(labels(&pooled), [DOCTESTS, "a/integration", "a/alloc"]);
        assert_eq!(labels(&last), ["c/integration", "b/integration"]);
    }

    #[test]
    fn a_binary_runs_in_its_package_with_the_step_environment_and_test_arguments() {
        let binary = Binary::from_message(LIB);
        let step = Step::new("test", "cargo", &[]).env("DISTLIMIT_REQUIRE_REDIS", "1");
        let test_args = ["--skip".to_owned(), "cluster".to_owned()];
        let Some(job) = binary.map(|b| Job::binary(&b, &step, &test_args)) else {
            panic!("no binary in {LIB}");
        };
        assert_eq!(job.dir, Path::new("/w/crates/distlimit-core"));
        assert_eq!(job.command.args, test_args);
        let var = |key: &str| {
            job.command
                .env
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(var("DISTLIMIT_REQUIRE_REDIS"), Some("1"));
        assert_eq!(var("CARGO_MANIFEST_DIR"), Some("/w/crates/distlimit-core"));
        assert_eq!(var("CARGO_PKG_NAME"), Some("distlimit-core"));
    }
}
