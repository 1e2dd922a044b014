//! Throwaway Redis servers for the tests: find (or install) `redis-server`, pick free loopback
//! ports, run servers as child processes killed by PID when dropped, and build the three setups
//! the Redis tests need: a standalone server, a Sentinel set ([`Sentinel`]) and a 6-node
//! [`Cluster`]. [`Stack`] starts the ones asked for and hands their addresses to the tests as
//! environment variables (the `ENV_*` constants are the contract with the test code).
//!
//! The servers keep nothing: no RDB snapshots, no AOF, each in a temporary `--dir` removed on drop.
//! Every wait is bounded, polls with short sleeps, and fails with the tail of the log of the
//! server that was not ready.
//!
//! Teardown: each [`RedisServer`] is killed by its own PID and reaped when dropped, on success and
//! on failure. If xtask itself is killed by a signal no `Drop` runs; the [`reaper`] then kills
//! what is left (still by PID) and removes the temp dirs.

mod cluster;
mod reaper;
mod resp;
mod sentinel;

use std::env;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

pub(crate) use cluster::Cluster;
pub(crate) use reaper::{COMMAND as REAPER_COMMAND, main as reaper_main};
pub(crate) use sentinel::Sentinel;

use crate::Result;
use crate::step::{Step, format_duration, shell_quote};

/// `1`: the tests must treat a missing Redis variable as a failure, not as a reason to skip.
pub(crate) const ENV_REQUIRE: &str = "DISTLIMIT_REQUIRE_REDIS";
/// `redis://127.0.0.1:<port>`: the standalone server.
pub(crate) const ENV_URL: &str = "DISTLIMIT_REDIS_URL";
/// Path of `redis-server`, for tests that start (and kill, pause, restart) a server of their own.
pub(crate) const ENV_SERVER_BIN: &str = "DISTLIMIT_REDIS_SERVER_BIN";
/// Path of `redis-cli`.
pub(crate) const ENV_CLI_BIN: &str = "DISTLIMIT_REDIS_CLI_BIN";
/// `redis://127.0.0.1:<port>,...`: the three sentinels.
pub(crate) const ENV_SENTINEL_URLS: &str = "DISTLIMIT_REDIS_SENTINEL_URLS";
/// The service name the sentinels monitor ([`sentinel::SERVICE`]).
pub(crate) const ENV_SENTINEL_SERVICE: &str = "DISTLIMIT_REDIS_SENTINEL_SERVICE";
/// `127.0.0.1:<port>`: the Sentinel set's primary at startup.
pub(crate) const ENV_SENTINEL_PRIMARY: &str = "DISTLIMIT_REDIS_SENTINEL_PRIMARY";
/// `127.0.0.1:<port>`: the Sentinel set's replica at startup.
pub(crate) const ENV_SENTINEL_REPLICA: &str = "DISTLIMIT_REDIS_SENTINEL_REPLICA";
/// `redis://127.0.0.1:<port>,...`: all six cluster nodes (3 primaries, 3 replicas).
pub(crate) const ENV_CLUSTER_URLS: &str = "DISTLIMIT_REDIS_CLUSTER_URLS";

/// Highest port [`free_port`] returns: a cluster node also listens on its port + 10000 (the
/// cluster bus), which must still be a valid port.
const MAX_PORT: u16 = 65535 - 10000;

/// Offset of the cluster bus port from the client port, fixed by Redis Cluster.
const CLUSTER_BUS_OFFSET: u16 = 10000;

/// How long a fresh server gets to answer `PING`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// How many ports [`RedisServer::start`] tries when another process takes the port first.
const START_ATTEMPTS: usize = 3;

/// Pause between two polls of a wait.
const POLL: Duration = Duration::from_millis(50);

/// How many lines of a server's log an error shows.
const LOG_TAIL_LINES: usize = 25;

/// Returns the path of `redis-server`, installing it first where that is safe to do unattended.
///
/// It is looked up on `PATH`. When it is missing and we are root on Debian or Ubuntu, it is
/// installed with `apt-get` (non-interactively, as on a CI runner or in a container); anywhere
/// else the error names the package to install.
pub(crate) fn ensure_redis_server() -> Result<PathBuf> {
    ensure_tool(
        "redis-server",
        "redis-server",
        "`redis` on Fedora (dnf install redis) and Homebrew (brew install redis)",
    )
}

/// The `openssl` command, which the Redis TLS test uses to make its certificates: found on
/// `PATH`, or installed like [`ensure_redis_server`].
pub(crate) fn ensure_openssl() -> Result<PathBuf> {
    ensure_tool(
        "openssl",
        "openssl",
        "`openssl` on Fedora (dnf install openssl) and Homebrew (brew install openssl)",
    )
}

/// The executable `name` on `PATH`; when it is missing and we are root on Debian/Ubuntu, installs
/// the package `debian_package` with apt-get; elsewhere fails with a message naming the package
/// (`elsewhere` names it for other systems).
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
/// Another process (or our other setup thread, see [`Stack::start`]) may still take it before
/// we bind it, so callers retry on "address in use" (as [`RedisServer::start`] does, for the
/// cluster bus port too) and start each server before asking for the next port rather than
/// collecting ports first, since the OS may hand out a just-released port again.
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

/// Returns the path of `redis-cli`: next to `redis_server` (they come from the same package), or
/// else on `PATH`.
pub(crate) fn find_redis_cli(redis_server: &Path) -> Result<PathBuf> {
    let sibling = redis_server.with_file_name("redis-cli");
    if is_executable(&sibling) {
        return Ok(sibling);
    }
    find_on_path("redis-cli").ok_or_else(|| {
        format!(
            "`redis-cli` is neither next to {} nor on PATH; it comes with Redis (the \
             Debian/Ubuntu package is `redis-tools`, a dependency of `redis-server`)",
            redis_server.display()
        )
        .into()
    })
}

/// A directory under the system temp dir, removed with its contents on drop (and by the
/// [`reaper`] if xtask dies first).
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
                Ok(()) => {
                    reaper::watch_dir(&path);
                    return Ok(TempDir(path));
                }
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(err) => {
                    return Err(format!("could not create {}: {err}", path.display()).into());
                }
            }
        }
        Err(format!("could not create a fresh temp dir under {}", base.display()).into())
    }

    /// The directory.
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
        reaper::unwatch_dir(&self.0);
    }
}

/// A `redis-server` child process on a loopback port; killed (by its PID) and reaped on drop.
#[derive(Debug)]
pub(crate) struct RedisServer {
    /// The server; `--daemonize no` keeps it our direct child, so its PID is the server's.
    child: Child,
    /// Its client port on 127.0.0.1.
    port: u16,
    /// What it is (`standalone`, `cluster node`, `sentinel`, ...), for messages.
    role: &'static str,
    /// Its `--dir` and output log; declared last so it is removed after the child is gone.
    dir: TempDir,
}

/// Result of one attempt to start a server on a given port.
enum Launch {
    /// The server answers `PING`.
    Ready(RedisServer),
    /// Another process took the port (or the cluster bus port) between [`free_port`] and the
    /// server's `bind`.
    PortTaken,
}

impl RedisServer {
    /// Starts `redis_server` on a free loopback port with `extra_args` added to its command line,
    /// and waits until it answers `PING`.
    pub(crate) fn start(
        redis_server: &Path,
        role: &'static str,
        extra_args: &[&str],
    ) -> Result<RedisServer> {
        Self::start_with(redis_server, role, |_, _| {
            Ok(extra_args.iter().map(OsString::from).collect())
        })
    }

    /// Like [`start`](RedisServer::start), with the extra arguments made by `args` from the port
    /// and the server's (empty) directory, where it may write a config file.
    ///
    /// They come first on the command line, so a config file can be among them (it must be the
    /// first argument); our options (`--port`, `--bind 127.0.0.1`, no persistence, no delay
    /// before a replica's full sync, `--dir`) follow and win over the file.
    pub(crate) fn start_with(
        redis_server: &Path,
        role: &'static str,
        mut args: impl FnMut(u16, &Path) -> Result<Vec<OsString>>,
    ) -> Result<RedisServer> {
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            let dir = TempDir::new(&format!("{}-{port}", role.replace(' ', "-")))?;
            let extra = args(port, dir.path())?;
            match Self::launch(redis_server, role, port, dir, &extra)? {
                Launch::Ready(server) => return Ok(server),
                Launch::PortTaken => continue,
            }
        }
        Err(
            format!("{role} redis-server lost its port to another process {START_ATTEMPTS} times")
                .into(),
        )
    }

    /// One attempt at starting a server on `port` in `dir`.
    fn launch(
        redis_server: &Path,
        role: &'static str,
        port: u16,
        dir: TempDir,
        extra_args: &[OsString],
    ) -> Result<Launch> {
        // Without `--logfile` the server logs to stdout; it and stderr go to this file, so the
        // test output stays readable and a failed start can show why.
        let log = File::create(dir.path().join("redis.log"))?;
        let child = Command::new(redis_server)
            .args(extra_args)
            .arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            // A replica's full sync otherwise waits 5 s for more replicas to share the transfer,
            // in startup and again after every failover a test triggers.
            .args(["--repl-diskless-sync-delay", "0"])
            .arg("--dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|err| format!("could not start {}: {err}", redis_server.display()))?;
        // Redis retitles itself `redis-server 127.0.0.1:<port>`: both markers survive that.
        reaper::watch(child.id(), &["redis", &port.to_string()]);
        let mut server = RedisServer {
            child,
            port,
            role,
            dir,
        };

        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(status) = server.child.try_wait()? {
                if server.log().contains("Address already in use") {
                    return Ok(Launch::PortTaken);
                }
                return Err(format!(
                    "{} exited during startup ({status}){}",
                    server.name(),
                    server.log_tail()
                )
                .into());
            }
            if ping(port).is_ok() {
                return Ok(Launch::Ready(server));
            }
            if Instant::now() >= deadline {
                // `server` is dropped on return, which kills it.
                return Err(format!(
                    "{} did not answer PING within {}s{}",
                    server.name(),
                    STARTUP_TIMEOUT.as_secs(),
                    server.log_tail()
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

    /// `127.0.0.1:<port>`.
    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The URL clients connect with: `redis://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `sentinel redis-server on 127.0.0.1:41234 (pid 123)`, for messages.
    pub(crate) fn name(&self) -> String {
        format!(
            "{} redis-server on {} (pid {})",
            self.role,
            self.addr(),
            self.pid()
        )
    }

    /// Sends `PING` and expects `+PONG`.
    pub(crate) fn ping(&self) -> Result<()> {
        ping(self.port).map_err(|err| format!("PING to {} failed: {err}", self.url()).into())
    }

    /// An error if the process has exited (it should run until we kill it).
    pub(crate) fn check_running(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("{} exited ({status})", self.name())),
            Err(err) => Err(format!("could not check on {}: {err}", self.name())),
        }
    }

    /// What the server wrote to stdout and stderr so far.
    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// The last lines of the server's log, as a paragraph to append to an error message.
    pub(crate) fn log_tail(&self) -> String {
        format!(
            "\n  last lines of the log of the {}:\n{}",
            self.name(),
            indent(&tail(&self.log(), LOG_TAIL_LINES))
        )
    }

    /// Sends SIGKILL to the server (by PID) without waiting; [`Drop`] reaps it.
    fn kill(&mut self) {
        let _ = self.child.kill();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // `Child::kill` signals exactly the PID we spawned, never a process found by name, so
        // other Redis servers on the machine are left alone. Then reap it so no zombie remains.
        // (std does not signal a child it has already reaped, so a PID is never reused here.)
        let pid = self.child.id();
        let _ = self.child.kill();
        if self.child.wait().is_ok() {
            reaper::unwatch(pid);
        }
    }
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `text` with every line indented by four spaces (`(empty)` if there is none).
fn indent(text: &str) -> String {
    if text.trim().is_empty() {
        return "    (empty)".to_owned();
    }
    text.lines()
        .map(|line| format!("    {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Sends `PING` to 127.0.0.1:`port` and checks the reply is `+PONG` (not e.g. `-LOADING`).
fn ping(port: u16) -> io::Result<()> {
    match resp::call(port, &["PING"])? {
        resp::Value::Simple(pong) if pong == "PONG" => Ok(()),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected reply {other:?}"),
        )),
    }
}

/// Why a setup is not ready yet, and which of its servers to blame.
#[derive(Debug)]
pub(crate) struct NotReady {
    /// What is missing, e.g. `node 127.0.0.1:41234: cluster_state:fail`.
    pub(crate) why: String,
    /// The index of the server whose log explains it, in the setup's own numbering.
    pub(crate) server: Option<usize>,
    /// Waiting longer cannot help (a server exited).
    pub(crate) fatal: bool,
}

impl NotReady {
    /// Not ready yet, because of server number `server`.
    pub(crate) fn at(server: usize, why: impl Into<String>) -> NotReady {
        NotReady {
            why: why.into(),
            server: Some(server),
            fatal: false,
        }
    }

    /// Not ready yet, without one server to blame.
    pub(crate) fn new(why: impl Into<String>) -> NotReady {
        NotReady {
            why: why.into(),
            server: None,
            fatal: false,
        }
    }
}

/// Polls `check` every [`POLL`] until it succeeds, fails fatally, or `timeout` has passed; then
/// returns its last complaint, prefixed with how long we waited.
pub(crate) fn wait_until<T>(
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, NotReady>,
) -> Result<T, NotReady> {
    let start = Instant::now();
    loop {
        match check() {
            Ok(value) => return Ok(value),
            Err(not_ready) if not_ready.fatal => return Err(not_ready),
            Err(mut not_ready) if start.elapsed() >= timeout => {
                not_ready.why = format!(
                    "not ready after {}: {}",
                    format_duration(start.elapsed()),
                    not_ready.why
                );
                return Err(not_ready);
            }
            Err(_) => thread::sleep(POLL),
        }
    }
}

/// Checks that every one of `servers` still runs; the first that exited is a fatal [`NotReady`].
pub(crate) fn check_all_running(servers: &mut [RedisServer]) -> Result<(), NotReady> {
    for (i, server) in servers.iter_mut().enumerate() {
        server.check_running().map_err(|why| NotReady {
            why,
            server: Some(i),
            fatal: true,
        })?;
    }
    Ok(())
}

/// Runs `command` to completion with stdin closed, killing it (by PID) if it takes longer than
/// `timeout`; returns its exit status (`None` if it was killed) and its stdout followed by its
/// stderr.
///
/// `markers` identify it to the [`reaper`] (see [`reaper::watch`]).
fn output_within(
    mut command: Command,
    markers: &[&str],
    timeout: Duration,
) -> Result<(Option<ExitStatus>, String)> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    reaper::watch(pid, markers);
    // One reader per pipe, so a full pipe can never block the child while we wait on it.
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|mut pipe| {
        thread::spawn(move || {
            let mut text = Vec::new();
            let _ = pipe.read_to_end(&mut text);
            String::from_utf8_lossy(&text).into_owned()
        })
    })
    .collect();
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    reaper::unwatch(pid);
    let output = readers
        .into_iter()
        .map(|reader| reader.join().unwrap_or_default())
        .collect::<Vec<_>>()
        .concat();
    Ok((status, output))
}

/// Which setups a [`Stack`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Setups {
    /// One standalone server ([`ENV_URL`]).
    pub(crate) standalone: bool,
    /// A primary, a replica and three sentinels ([`ENV_SENTINEL_URLS`] and friends).
    pub(crate) sentinel: bool,
    /// Six cluster nodes ([`ENV_CLUSTER_URLS`]).
    pub(crate) cluster: bool,
}

impl Setups {
    /// Everything `cargo xtask test` and `redis-up` start.
    pub(crate) const ALL: Setups = Setups {
        standalone: true,
        sentinel: true,
        cluster: true,
    };

    /// What `cargo xtask test-cluster` starts.
    pub(crate) const CLUSTER: Setups = Setups {
        standalone: false,
        sentinel: false,
        cluster: true,
    };
}

/// The Redis executables a [`Stack`] runs.
#[derive(Debug, Clone)]
pub(crate) struct Binaries {
    /// `redis-server` (also run as a sentinel with `--sentinel`).
    pub(crate) server: PathBuf,
    /// `redis-cli` (for `--cluster create`).
    pub(crate) cli: PathBuf,
}

impl Binaries {
    /// Finds both, installing Redis first if needed and possible ([`ensure_redis_server`]), and
    /// makes sure the `openssl` command the TLS test needs is there too ([`ensure_openssl`]).
    pub(crate) fn ensure() -> Result<Binaries> {
        let server = ensure_redis_server()?;
        let cli = find_redis_cli(&server)?;
        ensure_openssl()?;
        Ok(Binaries { server, cli })
    }
}

/// The running setups, torn down together on drop: every server is sent SIGKILL (by its PID)
/// first, then each is reaped and its temp dir removed.
#[derive(Debug)]
pub(crate) struct Stack {
    /// The executables, exported to the tests.
    bins: Binaries,
    /// The standalone server.
    standalone: Option<RedisServer>,
    /// The Sentinel set.
    sentinel: Option<Sentinel>,
    /// The cluster.
    cluster: Option<Cluster>,
}

impl Stack {
    /// Finds (or installs) Redis and starts `setups`, printing one line per setup with its ports
    /// and how long it took to become ready. The Sentinel set and the cluster start in parallel
    /// (both mostly wait for gossip). An error names the setup that failed.
    pub(crate) fn start(setups: Setups) -> Result<Stack> {
        let bins = Binaries::ensure()?;
        eprintln!(
            "==> redis: using {} and {}",
            bins.server.display(),
            bins.cli.display()
        );
        let standalone = if setups.standalone {
            let start = Instant::now();
            let server = RedisServer::start(&bins.server, "standalone", &[])
                .map_err(|err| format!("starting the standalone Redis server failed: {err}"))?;
            eprintln!(
                "==> redis standalone: {} (pid {}) up in {}",
                server.addr(),
                server.pid(),
                format_duration(start.elapsed())
            );
            Some(server)
        } else {
            None
        };
        // The other thread's error crosses as a `String` (a boxed `dyn Error` is not `Send`).
        let (sentinel, cluster) = thread::scope(|scope| {
            let sentinel = setups.sentinel.then(|| {
                scope.spawn(|| {
                    timed("Sentinel", || Sentinel::start(&bins), Sentinel::describe)
                        .map_err(|err| err.to_string())
                })
            });
            let cluster = setups
                .cluster
                .then(|| timed("Cluster", || Cluster::start(&bins), Cluster::describe));
            let sentinel = sentinel.map(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|_| Err("the Sentinel setup thread panicked".to_owned()))
            });
            (sentinel.transpose(), cluster.transpose())
        });
        // On an error, whatever did start is dropped here, which stops it.
        let stack = Stack {
            bins,
            standalone,
            sentinel: sentinel?,
            cluster: cluster?,
        };
        Ok(stack)
    }

    /// The variables that tell the tests where the servers are (see the `ENV_*` constants),
    /// [`ENV_REQUIRE`] included.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        let mut vars = vec![
            (ENV_REQUIRE, "1".to_owned()),
            (ENV_SERVER_BIN, self.bins.server.display().to_string()),
            (ENV_CLI_BIN, self.bins.cli.display().to_string()),
        ];
        if let Some(server) = &self.standalone {
            vars.push((ENV_URL, server.url()));
        }
        if let Some(sentinel) = &self.sentinel {
            vars.extend(sentinel.env());
        }
        if let Some(cluster) = &self.cluster {
            vars.push((ENV_CLUSTER_URLS, cluster.urls()));
        }
        vars.into_iter()
            .map(|(key, value)| (key.to_owned(), value))
            .collect()
    }

    /// Every server of every setup.
    fn servers_mut(&mut self) -> Vec<&mut RedisServer> {
        let mut servers: Vec<&mut RedisServer> = self.standalone.iter_mut().collect();
        if let Some(sentinel) = &mut self.sentinel {
            servers.extend(sentinel.servers_mut());
        }
        if let Some(cluster) = &mut self.cluster {
            servers.extend(cluster.servers_mut());
        }
        servers
    }

    /// Stops everything (as dropping does) and says so.
    pub(crate) fn stop(mut self) {
        let start = Instant::now();
        let count = self.servers_mut().len();
        drop(self);
        eprintln!(
            "==> redis: stopped {count} servers in {}",
            format_duration(start.elapsed())
        );
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // Signal them all first, so the waits in the fields' drops overlap.
        for server in self.servers_mut() {
            server.kill();
        }
    }
}

/// Runs `start` for the setup `name`, prints its description and how long it took, and prefixes
/// an error with the setup's name.
fn timed<T>(
    name: &str,
    start: impl FnOnce() -> Result<T>,
    describe: fn(&T) -> String,
) -> Result<T> {
    let began = Instant::now();
    match start() {
        Ok(setup) => {
            eprintln!(
                "==> redis {}: {} up in {}",
                name.to_lowercase(),
                describe(&setup),
                format_duration(began.elapsed())
            );
            Ok(setup)
        }
        Err(err) => Err(format!(
            "starting the Redis {name} setup failed after {}: {err}",
            format_duration(began.elapsed())
        )
        .into()),
    }
}

/// `cargo xtask redis-up`: starts every setup, prints their variables as `export` lines on
/// stdout (progress goes to stderr), and keeps them up until stdin reaches end-of-file (when it
/// is a pipe or socket), Ctrl-C, or `kill <pid>`.
pub(crate) fn redis_up() -> Result<()> {
    let stack = Stack::start(Setups::ALL)?;
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
        stack.stop();
        Ok(())
    } else {
        // A terminal is not read: a background job reading it would be stopped by SIGTTIN,
        // servers and all. A signal ends us here without unwinding; the servers share our
        // process group, so Ctrl-C reaches them too, and the reaper kills whatever is left
        // and removes the temp dirs.
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
    let redis_server = ensure_redis_server()?;
    println!("==> redis-smoke: using {}", redis_server.display());
    let server = RedisServer::start(&redis_server, "standalone", &[])?;
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
        let path = dir.path().to_path_buf();
        fs::write(path.join("file"), "x")?;
        drop(dir);
        assert!(!path.exists());
        Ok(())
    }

    #[test]
    fn log_tails_are_short_and_indented() {
        let log: String = (1..=40).map(|i| format!("line {i}\n")).collect();
        let tail = tail(&log, 3);
        assert_eq!(tail, "line 38\nline 39\nline 40");
        assert_eq!(indent(&tail), "    line 38\n    line 39\n    line 40");
        assert_eq!(indent(""), "    (empty)");
    }

    #[test]
    fn waits_are_bounded_and_keep_the_last_complaint() {
        let mut polls = 0;
        let result: Result<(), NotReady> = wait_until(Duration::from_millis(120), || {
            polls += 1;
            Err(NotReady::at(2, format!("poll {polls}")))
        });
        let not_ready = result.err();
        assert!(polls >= 2);
        assert!(not_ready.as_ref().is_some_and(|n| n.server == Some(2)));
        let why = not_ready.map(|n| n.why).unwrap_or_default();
        assert!(why.starts_with("not ready after"), "{why}");
        assert!(why.ends_with(&format!("poll {polls}")), "{why}");
    }

    #[test]
    fn fatal_complaints_end_a_wait_at_once() {
        let start = Instant::now();
        let result: Result<(), NotReady> = wait_until(Duration::from_secs(30), || {
            Err(NotReady {
                why: "exited".into(),
                server: None,
                fatal: true,
            })
        });
        assert!(result.is_err());
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[cfg(unix)]
    #[test]
    fn bounded_commands_are_killed_on_timeout() -> Result<()> {
        let mut sleep = Command::new("sleep");
        sleep.arg("30");
        let start = Instant::now();
        let (status, _) = output_within(sleep, &["sleep"], Duration::from_millis(200))?;
        assert!(status.is_none());
        assert!(start.elapsed() < Duration::from_secs(10));

        let mut echo = Command::new("sh");
        echo.args(["-c", "echo out; echo err >&2; exit 3"]);
        let (status, output) = output_within(echo, &["sh"], Duration::from_secs(10))?;
        assert_eq!(status.and_then(|s| s.code()), Some(3));
        assert!(output.contains("out") && output.contains("err"), "{output}");
        Ok(())
    }
}
