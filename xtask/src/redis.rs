//! The Redis servers of `test`, `test-cluster` and `redis-up`: finding (or installing)
//! `redis-server`, then the harness of `distlimit_test::server`, whose [`Stack`] starts the
//! standalone server, the Sentinel set and the Cluster on free loopback ports, hands their
//! addresses to the tests as `DISTLIMIT_REDIS_*` variables, kills every server by its PID when
//! dropped, and leaves a watchdog that does it if xtask is killed first.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::Instant;

use distlimit_test::server::{RedisServer, find_on_path};
pub(crate) use distlimit_test::server::{Setups, Stack};

use crate::Result;
use crate::step::{Step, format_duration, shell_quote};

/// Finds (or installs) Redis, makes sure the `openssl` command the TLS test needs is there too,
/// and starts `setups`, printing one line per setup.
pub(crate) fn start(setups: Setups) -> Result<Stack> {
    let bin = ensure_redis_server()?;
    ensure_tool(
        "openssl",
        "openssl",
        "`openssl` on Fedora (dnf install openssl) and Homebrew (brew install openssl)",
    )?;
    eprintln!("==> redis: using {}", bin.display());
    let stack = Stack::start(setups, &bin)?;
    for line in stack.describe() {
        eprintln!("==> redis {line}");
    }
    Ok(stack)
}

/// Stops `stack` and says so.
pub(crate) fn stop(stack: Stack) {
    let start = Instant::now();
    let count = stack.server_count();
    drop(stack);
    eprintln!(
        "==> redis: stopped {count} servers in {}",
        format_duration(start.elapsed())
    );
}

/// Returns the path of `redis-server`, installing it first where that is safe to do unattended:
/// see [`ensure_tool`].
fn ensure_redis_server() -> Result<PathBuf> {
    ensure_tool(
        "redis-server",
        "redis-server",
        "`redis` on Fedora (dnf install redis) and Homebrew (brew install redis)",
    )
}

/// The executable `name` on `PATH`; when it is missing and we are root on Debian/Ubuntu, installs
/// the package `debian_package` with apt-get (non-interactively, as on a CI runner or in a
/// container); elsewhere fails with a message naming the package (`elsewhere` names it for other
/// systems).
fn ensure_tool(name: &str, debian_package: &str, elsewhere: &str) -> Result<PathBuf> {
    if let Some(path) = find_on_path(name) {
        return Ok(path);
    }
    let debian = Path::new("/etc/debian_version").exists() && find_on_path("apt-get").is_some();
    if !debian {
        return Err(format!(
            "`{name}` is not on PATH; install the package `{debian_package}` on Debian/Ubuntu \
             (apt-get install {debian_package}), {elsewhere}"
        )
        .into());
    }
    if !is_root() {
        return Err(format!(
            "`{name}` is not on PATH; install the Debian/Ubuntu package `{debian_package}` \
             (sudo apt-get install {debian_package}), or run as root to let xtask install it"
        )
        .into());
    }
    println!("==> `{name}` is not on PATH; installing the package `{debian_package}` with apt-get");
    for step in [
        Step::new("apt-get update", "apt-get", &["update"]),
        Step::new(
            "apt-get install",
            "apt-get",
            &["install", "-y", debian_package],
        ),
    ] {
        step.env("DEBIAN_FRONTEND", "noninteractive").run()?;
    }
    find_on_path(name).ok_or_else(|| {
        format!("installed the package `{debian_package}`, but `{name}` is still not on PATH")
            .into()
    })
}

/// Whether we run as root, asked of `id -u` (std has no `geteuid`); `false` if that fails.
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|out| out.status.success() && out.stdout.trim_ascii() == b"0")
}

/// `cargo xtask redis-up`: starts every setup, prints their variables as `export` lines on
/// stdout (progress goes to stderr), and keeps them up until stdin reaches end-of-file (when it
/// is a pipe or socket), Ctrl-C, or `kill <pid>`.
pub(crate) fn redis_up() -> Result<()> {
    let stack = start(Setups::ALL)?;
    let pid = std::process::id();
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "# Redis test servers of `cargo xtask redis-up` (pid {pid}); stop with Ctrl-C or `kill {pid}`"
    )?;
    for (key, value) in stack.env() {
        writeln!(out, "export {key}={}", shell_quote(&value))?;
    }
    out.flush()?;
    drop(out);

    if stdin_is_a_pipe() {
        eprintln!(
            "==> redis-up: up until stdin closes, Ctrl-C or `kill {pid}` (then everything stops)"
        );
        // Reads until end-of-file; an error (stdin gone) ends the wait as well.
        let _ = io::copy(&mut io::stdin().lock(), &mut io::sink());
        stop(stack);
        Ok(())
    } else {
        // A terminal is not read: a background job reading it would be stopped by SIGTTIN,
        // servers and all. A signal ends us here without unwinding; the harness's watchdog then
        // kills the servers and removes their directories.
        eprintln!("==> redis-up: up until Ctrl-C or `kill {pid}` (then everything stops)");
        loop {
            thread::park();
        }
    }
}

/// Whether stdin is a pipe or a socket, i.e. something whose end-of-file means "stop now".
fn stdin_is_a_pipe() -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        fs::metadata("/dev/stdin").is_ok_and(|meta| {
            let kind = meta.file_type();
            kind.is_fifo() || kind.is_socket()
        })
    }
    #[cfg(not(unix))]
    {
        false
    }
}

/// `cargo xtask redis-smoke`: start a server, ping it, stop it, check it is gone.
pub(crate) fn smoke() -> Result<()> {
    let bin = ensure_redis_server()?;
    println!("==> redis-smoke: using {}", bin.display());
    let server = RedisServer::spawn(&bin, "standalone", |_, _| Ok(Vec::new()))?;
    println!("==> started {}", server.name());
    let pong = server.command(&["PING"])?;
    println!("==> PING answered {pong}");
    let port = server.port();
    drop(server);
    if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        return Err(
            format!("port {port} still accepts connections after the server was stopped").into(),
        );
    }
    println!("==> stopped; port {port} no longer answers");
    Ok(())
}
