//! Steps: one command each, run from the workspace root with inherited output, timed, fail-fast.

use std::env;
use std::ffi::OsString;
use std::io::{self, IsTerminal};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Result;

/// One command of a task, e.g. `clippy: cargo clippy --workspace --all-targets -- -D warnings`.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    /// Short name used in the header, the summary and the failure message.
    pub(crate) name: String,
    /// What to execute: `$CARGO` for cargo steps, otherwise a name looked up on `PATH`.
    program: OsString,
    /// How the program is shown to the user (`cargo`, not the full path of `$CARGO`).
    display: String,
    /// Arguments, passed as they are (no shell in between).
    pub(crate) args: Vec<String>,
    /// Variables set for this step only, on top of the inherited environment.
    pub(crate) env: Vec<(String, String)>,
}

impl Step {
    /// A step running `program` (looked up on `PATH`) with `args`.
    pub(crate) fn new(name: impl Into<String>, program: &str, args: &[&str]) -> Step {
        Step {
            name: name.into(),
            program: program.into(),
            display: program.to_owned(),
            args: Vec::new(),
            env: Vec::new(),
        }
        .args(args)
    }

    /// A step running the cargo that runs us (`$CARGO`, so the same toolchain) with `args`.
    pub(crate) fn cargo(name: impl Into<String>, args: &[&str]) -> Step {
        let mut step = Step::new(name, "cargo", args);
        step.program = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        step
    }

    /// Appends `args`.
    pub(crate) fn args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Step {
        self.args
            .extend(args.into_iter().map(|arg| arg.as_ref().to_owned()));
        self
    }

    /// Sets `key=value` for this step.
    pub(crate) fn env(mut self, key: &str, value: impl Into<String>) -> Step {
        self.env.push((key.to_owned(), value.into()));
        self
    }

    /// Sets every `(key, value)` of `vars` for this step.
    pub(crate) fn envs(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Step {
        self.env.extend(vars);
        self
    }

    /// The step as a shell command line, for headers and error messages.
    pub(crate) fn command_line(&self) -> String {
        let env = self
            .env
            .iter()
            .map(|(key, value)| format!("{key}={}", shell_quote(value)));
        let argv =
            std::iter::once(self.display.clone()).chain(self.args.iter().map(|a| shell_quote(a)));
        env.chain(argv).collect::<Vec<_>>().join(" ")
    }

    /// How the program is shown: `cargo`, not the full path of `$CARGO`.
    pub(crate) fn display_program(&self) -> &str {
        &self.display
    }

    /// The step as a [`Command`] run in `dir`, output inherited.
    pub(crate) fn command(&self, dir: &Path) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .current_dir(dir);
        command
    }

    /// Prints a header, runs the step to completion and reports how long it took.
    ///
    /// The error names the step, how it ended and its command line.
    pub(crate) fn run(&self) -> Result<Duration> {
        println!("==> {}: {}", self.name, self.command_line());
        let start = Instant::now();
        let mut command = self.command(&project_root());
        // Nothing we run should ask questions; make sure nothing can when nobody could answer.
        if !interactive() {
            command.stdin(Stdio::null());
        }
        let status = command.status();
        let took = start.elapsed();
        let failure = match status {
            Ok(status) if status.success() => {
                println!("==> {}: ok in {}", self.name, format_duration(took));
                return Ok(took);
            }
            Ok(status) => status.to_string(),
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                format!("`{}` not found", self.display)
            }
            Err(err) => format!("could not start it: {err}"),
        };
        Err(format!(
            "step `{}` failed ({failure}) after {}\n  command: {}",
            self.name,
            format_duration(took),
            self.command_line()
        )
        .into())
    }
}

/// How a row of a [`Summary`] ended.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// Succeeded after this long.
    Passed(Duration),
    /// Failed after this long; later rows were skipped.
    Failed(Duration),
}

/// The rows of a task, each timed as it runs, printed as a summary at the end: rows never
/// reached (after a failure) are listed as skipped.
#[derive(Debug)]
pub(crate) struct Summary {
    /// Every planned row in order, with its outcome once it ran.
    rows: Vec<(String, Option<Outcome>)>,
    /// When the task began.
    start: Instant,
}

impl Summary {
    /// A summary planning the rows `names`, in order.
    pub(crate) fn new<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Summary {
        Summary {
            rows: names.into_iter().map(|name| (name.into(), None)).collect(),
            start: Instant::now(),
        }
    }

    /// Runs `step` as the row of its name.
    pub(crate) fn step(&mut self, step: &Step) -> Result<()> {
        let began = Instant::now();
        let result = step.run();
        self.record(&step.name, result.is_ok(), began.elapsed());
        result.map(|_| ())
    }

    /// Runs `action` in-process as the row `name`, with the same header and timing as a step.
    pub(crate) fn action<T>(
        &mut self,
        name: &str,
        action: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        println!("==> {name}");
        let began = Instant::now();
        let result = action();
        let took = began.elapsed();
        match &result {
            Ok(_) => println!("==> {name}: ok in {}", format_duration(took)),
            Err(_) => println!("==> {name}: FAILED after {}", format_duration(took)),
        }
        self.record(name, result.is_ok(), took);
        result
    }

    /// Marks the first row called `name` that has not run yet (a new row if none).
    fn record(&mut self, name: &str, ok: bool, took: Duration) {
        let outcome = if ok {
            Outcome::Passed(took)
        } else {
            Outcome::Failed(took)
        };
        match self
            .rows
            .iter_mut()
            .find(|(row, outcome)| row == name && outcome.is_none())
        {
            Some(row) => row.1 = Some(outcome),
            None => self.rows.push((name.to_owned(), Some(outcome))),
        }
    }

    /// Prints the summary and passes `result` (the task's) through.
    pub(crate) fn finish(self, result: Result<()>) -> Result<()> {
        let width = self
            .rows
            .iter()
            .map(|(name, _)| name.len())
            .max()
            .unwrap_or(0);
        println!("==> summary");
        for (name, outcome) in &self.rows {
            let (status, took) = match outcome {
                Some(Outcome::Passed(took)) => ("ok", format_duration(*took)),
                Some(Outcome::Failed(took)) => ("FAILED", format_duration(*took)),
                None => ("skipped", String::new()),
            };
            println!("    {name:<width$}  {status:<7}  {took}");
        }
        let failed = result.is_err()
            || self
                .rows
                .iter()
                .any(|(_, outcome)| matches!(outcome, Some(Outcome::Failed(_))));
        let verdict = if failed { "FAILED" } else { "ok" };
        println!("==> {verdict} in {}", format_duration(self.start.elapsed()));
        result
    }
}

/// Runs `steps` in order, stopping at the first failure, then prints a summary of all of them.
pub(crate) fn run_all(steps: &[Step]) -> Result<()> {
    let mut summary = Summary::new(steps.iter().map(|step| step.name.clone()));
    let result = steps.iter().try_for_each(|step| summary.step(step));
    summary.finish(result)
}

/// The workspace root: the parent of this crate's directory, wherever we are run from.
pub(crate) fn project_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// Whether someone could answer a prompt: stdin is a terminal and we are not on CI.
pub(crate) fn interactive() -> bool {
    let on_ci = env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    !on_ci && io::stdin().is_terminal()
}

/// `value` followed by `extra`, separated by a space; for appending to `RUSTFLAGS`-like variables
/// instead of clobbering what the user set.
pub(crate) fn append_flags(var: &str, extra: &str) -> String {
    match env::var(var) {
        Ok(value) if !value.trim().is_empty() => format!("{} {extra}", value.trim()),
        _ => extra.to_owned(),
    }
}

/// `1.2s` or `3m04.5s`.
pub(crate) fn format_duration(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.1}s")
    } else {
        let minutes = d.as_secs() / 60;
        let rest = secs - (minutes * 60) as f64;
        format!("{minutes}m{rest:04.1}s")
    }
}

/// Quotes `s` for a POSIX shell when it needs it, so printed commands can be copied and re-run.
pub(crate) fn shell_quote(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_can_be_pasted_into_a_shell() {
        let step = Step::new("doc", "cargo", &["doc", "--workspace", ""])
            .env("RUSTDOCFLAGS", "-D warnings")
            .args(["it's"]);
        assert_eq!(
            step.command_line(),
            r"RUSTDOCFLAGS='-D warnings' cargo doc --workspace '' 'it'\''s'"
        );
    }

    #[test]
    fn durations_are_short() {
        assert_eq!(format_duration(Duration::from_millis(1234)), "1.2s");
        assert_eq!(format_duration(Duration::from_millis(184_500)), "3m04.5s");
    }

    #[test]
    fn a_failed_step_names_itself_and_its_command() {
        let step = Step::new("missing", "distlimit-xtask-no-such-program", &["--flag"]);
        let message = step.run().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("step `missing` failed"), "{message}");
        assert!(
            message.contains("distlimit-xtask-no-such-program --flag"),
            "{message}"
        );
    }

    #[test]
    fn run_all_stops_at_the_first_failure() {
        let steps = [
            Step::new("fails", "distlimit-xtask-no-such-program", &[]),
            Step::new("never", "distlimit-xtask-no-such-program-either", &[]),
        ];
        let message = run_all(&steps)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(message.contains("`fails`"), "{message}");
        assert!(!message.contains("`never`"), "{message}");
    }
}
