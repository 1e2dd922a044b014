//! A watchdog that kills our Redis servers when xtask dies without dropping them.
//!
//! Normally every server is killed by the `Drop` of the value that owns it, on success and on
//! failure alike. A signal's default action, though (`kill <pid>`, `timeout`, Ctrl-C, SIGKILL),
//! ends xtask without running any `Drop`, and std cannot catch signals. So the first server
//! started also starts a reaper: this same executable, run as `xtask __reaper` in its own process
//! group (a terminal's Ctrl-C does not reach it), reading commands from a pipe:
//!
//! - `watch <pid> <marker>...` / `unwatch <pid>`: a process we started / reaped ourselves.
//! - `dir <path>` / `undir <path>`: a temp dir we created / removed ourselves.
//!
//! Only xtask holds the pipe's write end (std opens it close-on-exec, so no child inherits it),
//! so the reaper reads end-of-file exactly when xtask is gone, however it ended. It then kills
//! what is still watched, by PID, and only after checking that `/proc/<pid>/cmdline` still
//! contains every marker (the program name and the port), so a reused PID is left alone; then it
//! removes the directories. After a normal exit nothing is watched any more and it just exits.

use std::collections::{BTreeMap, BTreeSet};
use std::env;
use std::fs;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// The hidden command that runs [`main`].
pub(crate) const COMMAND: &str = "__reaper";

/// The pipe to the reaper: `None` before the first use, `Some(None)` if it could not start.
static PIPE: Mutex<Option<Option<ChildStdin>>> = Mutex::new(None);

/// Tells the reaper to kill `pid` if xtask dies, provided its command line then still contains
/// every one of `markers` (which must not contain whitespace).
pub(crate) fn watch(pid: u32, markers: &[&str]) {
    send(&format!("watch {pid} {}", markers.join(" ")));
}

/// Tells the reaper that `pid` is gone (we reaped it).
pub(crate) fn unwatch(pid: u32) {
    send(&format!("unwatch {pid}"));
}

/// Tells the reaper to remove `dir` if xtask dies.
pub(crate) fn watch_dir(dir: &Path) {
    send(&format!("dir {}", dir.display()));
}

/// Tells the reaper that `dir` is gone.
pub(crate) fn unwatch_dir(dir: &Path) {
    send(&format!("undir {}", dir.display()));
}

/// Writes one command line to the reaper, starting it first if needed. Failing to reach it only
/// costs robustness against signals, so it warns once and otherwise carries on.
fn send(line: &str) {
    if line.contains('\n') {
        return;
    }
    let mut pipe = PIPE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let pipe = pipe.get_or_insert_with(|| match spawn() {
        Ok(stdin) => stdin,
        Err(err) => {
            eprintln!(
                "warning: could not start the xtask reaper ({err}); if xtask is killed by a \
                 signal, its Redis servers keep running"
            );
            None
        }
    });
    if let Some(stdin) = pipe
        && writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .is_err()
    {
        eprintln!(
            "warning: the xtask reaper is gone; if xtask is killed by a signal, its Redis \
             servers keep running"
        );
        *pipe = None;
    }
}

/// Starts the reaper and returns the write end of its command pipe; `None` in xtask's own unit
/// tests, where the current executable is the test harness, which has no reaper command.
fn spawn() -> io::Result<Option<ChildStdin>> {
    if cfg!(test) {
        return Ok(None);
    }
    let mut command = Command::new(env::current_exe()?);
    command
        .arg(COMMAND)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // Its own process group: Ctrl-C in a terminal signals the foreground group, which would
        // otherwise end the reaper together with xtask, before it could clean up.
        command.process_group(0);
    }
    // The child handle is dropped without waiting: the reaper outlives xtask when it has to, and
    // otherwise exits when xtask does, to be reaped by init.
    let stdin = command.spawn()?.stdin.take();
    stdin
        .ok_or_else(|| io::Error::other("no stdin pipe"))
        .map(Some)
}

/// What the reaper was told is still alive.
#[derive(Debug, Default, PartialEq, Eq)]
struct Watched {
    /// PID → markers its command line must contain.
    pids: BTreeMap<u32, Vec<String>>,
    /// Temp dirs to remove.
    dirs: BTreeSet<PathBuf>,
}

impl Watched {
    /// Applies one command line; unknown or malformed lines are ignored.
    fn apply(&mut self, line: &str) {
        let (verb, rest) = line.split_once(' ').unwrap_or((line, ""));
        match verb {
            "watch" => {
                let mut words = rest.split_whitespace();
                if let Some(Ok(pid)) = words.next().map(str::parse) {
                    self.pids.insert(pid, words.map(str::to_owned).collect());
                }
            }
            "unwatch" => {
                if let Ok(pid) = rest.trim().parse() {
                    self.pids.remove(&pid);
                }
            }
            "dir" if !rest.is_empty() => {
                self.dirs.insert(PathBuf::from(rest));
            }
            "undir" => {
                self.dirs.remove(Path::new(rest));
            }
            _ => {}
        }
    }
}

/// `xtask __reaper`: reads commands until end-of-file, then cleans up what is still watched.
pub(crate) fn main() -> crate::Result<()> {
    let mut watched = Watched::default();
    for line in io::stdin().lock().lines() {
        match line {
            Ok(line) => watched.apply(&line),
            Err(_) => break,
        }
    }
    if watched == Watched::default() {
        return Ok(());
    }

    let mut killed = Vec::new();
    for (pid, markers) in &watched.pids {
        if still_ours(*pid, markers) {
            let status = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if status.is_ok_and(|s| s.success()) {
                killed.push(*pid);
            }
        }
    }
    // Let them die before their directories go, so none writes a file into a removed dir.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && killed.iter().any(|pid| alive(*pid)) {
        thread::sleep(Duration::from_millis(20));
    }
    for dir in &watched.dirs {
        let _ = fs::remove_dir_all(dir);
    }
    // Write errors are ignored: whoever read our stderr may be gone too.
    let _ = writeln!(
        io::stderr(),
        "xtask: xtask ended without stopping its Redis servers; killed {} leftover process(es) \
         {killed:?} and removed {} temp dir(s)",
        killed.len(),
        watched.dirs.len()
    );
    Ok(())
}

/// Whether `pid` still runs a command line containing every marker. Where there is no `/proc`
/// to ask, trusts the PID (the reaper runs right after xtask ends, so reuse is unlikely).
fn still_ours(pid: u32, markers: &[String]) -> bool {
    if !Path::new("/proc/self").exists() {
        return true;
    }
    match fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(cmdline) => {
            let cmdline = String::from_utf8_lossy(&cmdline);
            !cmdline.is_empty() && markers.iter().all(|m| cmdline.contains(m.as_str()))
        }
        Err(_) => false,
    }
}

/// Whether `pid` exists and is not a zombie (Linux); `false` where there is no `/proc`.
fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // `pid (comm) state ...`; comm may contain spaces and parentheses, state follows the last `)`.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_add_and_remove() {
        let mut watched = Watched::default();
        for line in [
            "watch 12 redis 41234",
            "watch 13 redis-cli --cluster",
            "dir /tmp/distlimit-xtask-redis-41234-1-0",
            "dir /tmp/with space",
            "unwatch 13",
            "undir /tmp/with space",
            "watch nonsense",
            "frobnicate 1",
            "",
        ] {
            watched.apply(line);
        }
        assert_eq!(
            watched.pids.into_iter().collect::<Vec<_>>(),
            [(12, vec!["redis".to_owned(), "41234".to_owned()])]
        );
        assert_eq!(
            watched.dirs.into_iter().collect::<Vec<_>>(),
            [PathBuf::from("/tmp/distlimit-xtask-redis-41234-1-0")]
        );
    }

    #[test]
    fn a_process_is_ours_only_while_its_command_line_matches() {
        let me = std::process::id();
        if !Path::new("/proc/self").exists() {
            return;
        }
        assert!(still_ours(me, &[]));
        assert!(!still_ours(me, &["distlimit-no-such-marker".to_owned()]));
        assert!(alive(me));
        assert!(!still_ours(u32::MAX, &[]));
        assert!(!alive(u32::MAX));
    }
}
