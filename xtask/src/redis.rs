//! Throwaway Redis servers for the tests: find (or install) `redis-server`, pick free loopback
//! ports, and run servers as child processes that are killed by PID when dropped.
//!
//! Not part of `cargo xtask test` yet; the hidden `cargo xtask redis-smoke` exercises it. The
//! servers keep nothing: no RDB snapshots, no AOF, a temporary `--dir` removed on drop.
//!
//! Sentinel and Cluster setups build on the same pieces: [`RedisServer::start`] takes extra
//! arguments (`--cluster-enabled yes`, `--replicaof ...`); start servers one after another, since
//! [`free_port`] only promises the port was free a moment ago, and keep every [`RedisServer`] in
//! one owner so they all go down together.

use std::env;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::Result;
use crate::step::Step;

/// Highest port [`free_port`] returns: a cluster node also listens on its port + 10000 (the
/// cluster bus), which must still be a valid port.
const MAX_PORT: u16 = 65535 - 10000;

/// Offset of the cluster bus port from the client port, fixed by Redis Cluster.
const CLUSTER_BUS_OFFSET: u16 = 10000;

/// How long a fresh server gets to answer `PING`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// How many ports [`RedisServer::start`] tries when another process takes the port first.
const START_ATTEMPTS: usize = 3;

/// Returns the path of `redis-server`, installing it first where that is safe to do unattended.
///
/// It is looked up on `PATH`. When it is missing and we are root on Debian or Ubuntu, it is
/// installed with `apt-get` (non-interactively, as on a CI runner or in a container); anywhere
/// else the error names the package to install.
pub(crate) fn ensure_redis_server() -> Result<PathBuf> {
    if let Some(path) = find_on_path("redis-server") {
        return Ok(path);
    }
    let debian = Path::new("/etc/debian_version").exists() && find_on_path("apt-get").is_some();
    if !debian {
        return Err(
            "`redis-server` is not on PATH; install Redis: the package is `redis-server` \
                    on Debian/Ubuntu (apt-get install redis-server), `redis` on Fedora \
                    (dnf install redis) and Homebrew (brew install redis)"
                .into(),
        );
    }
    if !is_root() {
        return Err(
            "`redis-server` is not on PATH; install the Debian/Ubuntu package \
                    `redis-server` (sudo apt-get install redis-server), or run as root to let \
                    xtask install it"
                .into(),
        );
    }
    println!(
        "==> `redis-server` is not on PATH; installing the package `redis-server` with apt-get"
    );
    for step in [
        Step::new("apt-get update", "apt-get", &["update"]),
        Step::new(
            "apt-get install",
            "apt-get",
            &["install", "-y", "redis-server"],
        ),
    ] {
        step.env("DEBIAN_FRONTEND", "noninteractive").run()?;
    }
    find_on_path("redis-server").ok_or_else(|| {
        "installed the package `redis-server`, but `redis-server` is still not on PATH".into()
    })
}

/// The first executable file called `name` in a directory of `PATH`.
fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// Whether `path` is a file we may execute.
#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether `path` is a file we may execute.
#[cfg(not(unix))]
fn is_executable(path: &Path) -> bool {
    path.is_file()
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

/// A loopback port nobody listened on a moment ago, below 55536, whose cluster bus port
/// (port + 10000) was free too.
///
/// Another process may still take it before we bind it, so callers retry on "address in use"
/// (as [`RedisServer::start`] does) and start servers one at a time rather than collecting
/// ports first, since the OS may hand out a just-released port again.
pub(crate) fn free_port() -> Result<u16> {
    for _ in 0..1000 {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port();
        if port <= MAX_PORT
            && TcpListener::bind((Ipv4Addr::LOCALHOST, port + CLUSTER_BUS_OFFSET)).is_ok()
        {
            return Ok(port);
        }
    }
    Err(format!("found no free loopback port at or below {MAX_PORT} in 1000 tries").into())
}

/// A directory under the system temp dir, removed with its contents on drop.
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    /// Creates a fresh `distlimit-xtask-<label>-<pid>-<n>` directory.
    fn new(label: &str) -> Result<TempDir> {
        let base = env::temp_dir();
        for n in 0..1000 {
            let path = base.join(format!(
                "distlimit-xtask-{label}-{}-{n}",
                std::process::id()
            ));
            match fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir(path)),
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(err) => {
                    return Err(format!("could not create {}: {err}", path.display()).into());
                }
            }
        }
        Err(format!("could not create a fresh temp dir under {}", base.display()).into())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A `redis-server` child process on a loopback port; killed (by its PID) and reaped on drop.
#[derive(Debug)]
pub(crate) struct RedisServer {
    /// The server; `--daemonize no` keeps it our direct child, so its PID is the server's.
    child: Child,
    /// Its client port on 127.0.0.1.
    port: u16,
    /// Its `--dir` and output log; declared last so it is removed after the child is gone.
    dir: TempDir,
}

/// Result of one attempt to start a server on a given port.
enum Launch {
    /// The server answers `PING`.
    Ready(RedisServer),
    /// Another process took the port between [`free_port`] and the server's `bind`.
    PortTaken,
}

impl RedisServer {
    /// Starts `redis_server` on a free loopback port with `extra_args` appended to its command
    /// line, and waits until it answers `PING`.
    pub(crate) fn start(redis_server: &Path, extra_args: &[&str]) -> Result<RedisServer> {
        for _ in 0..START_ATTEMPTS {
            match Self::launch(redis_server, free_port()?, extra_args)? {
                Launch::Ready(server) => return Ok(server),
                Launch::PortTaken => continue,
            }
        }
        Err(format!("redis-server lost its port to another process {START_ATTEMPTS} times").into())
    }

    /// One attempt at starting a server on `port`.
    fn launch(redis_server: &Path, port: u16, extra_args: &[&str]) -> Result<Launch> {
        let dir = TempDir::new(&format!("redis-{port}"))?;
        // Without `--logfile` the server logs to stdout; it and stderr go to this file, so the
        // test output stays readable and a failed start can show why.
        let log = File::create(dir.0.join("redis.log"))?;
        let child = Command::new(redis_server)
            .arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(&dir.0)
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|err| format!("could not start {}: {err}", redis_server.display()))?;
        let mut server = RedisServer { child, port, dir };

        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(status) = server.child.try_wait()? {
                let log = server.log();
                if log.contains("Address already in use") {
                    return Ok(Launch::PortTaken);
                }
                return Err(format!(
                    "redis-server on port {port} exited during startup ({status}); its output:\n{log}"
                )
                .into());
            }
            if ping(port).is_ok() {
                return Ok(Launch::Ready(server));
            }
            if Instant::now() >= deadline {
                // `server` is dropped on return, which kills it.
                return Err(format!(
                    "redis-server on port {port} did not answer PING within {}s; its output:\n{}",
                    STARTUP_TIMEOUT.as_secs(),
                    server.log()
                )
                .into());
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's client port on 127.0.0.1.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// The PID of the server process.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The URL clients connect with, e.g. `redis://127.0.0.1:41234/`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Sends `PING` and expects `+PONG`.
    pub(crate) fn ping(&self) -> Result<()> {
        ping(self.port).map_err(|err| format!("PING to {} failed: {err}", self.url()).into())
    }

    /// What the server wrote to stdout and stderr so far.
    fn log(&self) -> String {
        fs::read_to_string(self.dir.0.join("redis.log")).unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // `Child::kill` signals exactly the PID we spawned, never a process found by name, so
        // other Redis servers on the machine are left alone. Then reap it so no zombie remains.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `PING` (as a RESP array) to 127.0.0.1:`port` and checks the reply is `+PONG`.
fn ping(port: u16) -> io::Result<()> {
    let timeout = Duration::from_secs(1);
    let mut stream =
        TcpStream::connect_timeout(&SocketAddr::from((Ipv4Addr::LOCALHOST, port)), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(b"*1\r\n$4\r\nPING\r\n")?;
    let mut reply = [0; 7];
    stream.read_exact(&mut reply)?;
    if &reply == b"+PONG\r\n" {
        Ok(())
    } else {
        // e.g. `-LOADING` while the server reads a dataset.
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected reply {:?}", String::from_utf8_lossy(&reply)),
        ))
    }
}

/// `cargo xtask redis-smoke`: start a server, ping it, stop it, check it is gone.
pub(crate) fn smoke() -> Result<()> {
    let redis_server = ensure_redis_server()?;
    println!("==> redis-smoke: using {}", redis_server.display());
    let server = RedisServer::start(&redis_server, &[])?;
    let port = server.port();
    println!(
        "==> started redis-server (pid {}) at {}",
        server.pid(),
        server.url()
    );
    server.ping()?;
    println!("==> PING answered PONG");
    drop(server);
    if ping(port).is_ok() {
        return Err(format!("port {port} still answers PING after the server was stopped").into());
    }
    println!("==> stopped; port {port} no longer answers");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_leave_room_for_the_cluster_bus() -> Result<()> {
        for _ in 0..20 {
            let port = free_port()?;
            assert!(port <= MAX_PORT);
        }
        Ok(())
    }

    #[test]
    fn temp_dirs_are_removed_on_drop() -> Result<()> {
        let dir = TempDir::new("test")?;
        let path = dir.0.clone();
        fs::write(path.join("file"), "x")?;
        drop(dir);
        assert!(!path.exists());
        Ok(())
    }
}
