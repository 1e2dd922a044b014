//! Real `redis-server` processes for tests, benchmarks and `cargo xtask`: the one Redis harness
//! of the workspace.
//!
//! - [`RedisServer`]: one server on a free loopback port, in a scratch directory of its own, with
//!   no persistence. Faults act on this process only, by its PID: [`kill`](RedisServer::kill)
//!   (SIGKILL), [`pause`](RedisServer::pause) and [`resume`](RedisServer::resume) (SIGSTOP and
//!   SIGCONT), [`restart`](RedisServer::restart) on the same port. Dropping it kills it.
//! - [`Sentinel`] (a primary, a replica and three sentinels) and [`Cluster`] (six nodes, three
//!   primaries with a replica each), returned only once they really serve.
//! - [`Stack`]: the setups [`Setups`] asks for, and the `DISTLIMIT_REDIS_*` variables that tell
//!   the tests where they are ([`Stack::env`]; the `ENV_*` constants are that contract).
//!   `cargo xtask test` and `cargo xtask redis-up` start one.
//!
//! Commands go through the `redis` crate's synchronous client ([`RedisServer::query`],
//! [`RedisServer::command`]).
//!
//! # Example
//!
//! ```no_run
//! use distlimit_test::server::{self, Setups, Stack};
//!
//! // The shared setups, as `cargo xtask test` starts them.
//! let bin = server::server_bin().expect("redis-server on the PATH");
//! let stack = Stack::start(Setups::ALL, &bin).unwrap();
//! for (key, value) in stack.env() {
//!     eprintln!("export {key}={value}");
//! }
//! ```
//!
//! # Skipping and requiring
//!
//! The binary is `DISTLIMIT_REDIS_SERVER_BIN`, else `redis-server` on the `PATH`. When there is
//! none, [`RedisServer::start`] panics if `DISTLIMIT_REQUIRE_REDIS=1` (set by `cargo xtask test`)
//! and otherwise prints a note and returns `None`, so the test can return early (a skip). [`var`]
//! does the same for the variables naming the shared servers.
//!
//! # Cleanup
//!
//! Every server is killed by its PID and reaped on drop. If the process that started it dies
//! without dropping it (a signal, `std::process::exit`), a watchdog does it: the first server of
//! a process starts `sh` in a process group of its own (Ctrl-C does not reach it) reading a pipe
//! only this process holds. At end-of-file, whatever way the process ended, it sends SIGKILL to
//! the PIDs of the servers still running (each has a `pid-<pid>` file in the process's scratch
//! directory, removed when the server is reaped) and removes that directory.
//!
//! ```no_run
//! use distlimit_test::server::RedisServer;
//!
//! let Some(mut server) = RedisServer::start() else { return }; // no redis-server: skipped
//! let url = server.url();
//! assert_eq!(server.command(&["PING"]).unwrap(), "PONG");
//! server.pause().unwrap(); // a hung server: connections stay open, nothing answers
//! server.resume().unwrap();
//! server.kill(); // SIGKILL
//! server.restart().unwrap(); // same port, empty data set
//! # let _ = url;
//! ```

mod cluster;
mod sentinel;
mod stack;

use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redis::FromRedisValue;

pub use cluster::Cluster;
pub use sentinel::{SERVICE, Sentinel};
pub use stack::{Setups, Stack};

/// `1`: a test that cannot reach its server fails instead of skipping.
pub const ENV_REQUIRE: &str = "DISTLIMIT_REQUIRE_REDIS";
/// `redis://127.0.0.1:<port>`: the standalone server.
pub const ENV_URL: &str = "DISTLIMIT_REDIS_URL";
/// Path of `redis-server`, for tests that start (and kill, pause, restart) a server of their own.
pub const ENV_SERVER_BIN: &str = "DISTLIMIT_REDIS_SERVER_BIN";
/// Path of `redis-cli`.
pub const ENV_CLI_BIN: &str = "DISTLIMIT_REDIS_CLI_BIN";
/// `redis://127.0.0.1:<port>,...`: the three sentinels.
pub const ENV_SENTINEL_URLS: &str = "DISTLIMIT_REDIS_SENTINEL_URLS";
/// The service name the sentinels monitor ([`SERVICE`]).
pub const ENV_SENTINEL_SERVICE: &str = "DISTLIMIT_REDIS_SENTINEL_SERVICE";
/// `127.0.0.1:<port>`: the Sentinel set's primary at startup.
pub const ENV_SENTINEL_PRIMARY: &str = "DISTLIMIT_REDIS_SENTINEL_PRIMARY";
/// `127.0.0.1:<port>`: the Sentinel set's replica at startup.
pub const ENV_SENTINEL_REPLICA: &str = "DISTLIMIT_REDIS_SENTINEL_REPLICA";
/// `redis://127.0.0.1:<port>,...`: all six Cluster nodes (3 primaries, 3 replicas).
pub const ENV_CLUSTER_URLS: &str = "DISTLIMIT_REDIS_CLUSTER_URLS";

/// Offset of the cluster bus port from the client port, fixed by Redis Cluster.
const CLUSTER_BUS_OFFSET: u16 = 10000;
/// Highest port [`free_port`] returns, so that the cluster bus port is valid too.
const MAX_PORT: u16 = u16::MAX - CLUSTER_BUS_OFFSET;
/// How long a started server may take to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Connect, read and write timeout of one command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// How many ports a start tries when another process takes the port first.
const START_ATTEMPTS: usize = 5;
/// Pause between two polls of a wait.
const POLL: Duration = Duration::from_millis(20);
/// How many lines of a server's log an error shows.
const LOG_TAIL_LINES: usize = 25;

/// Whether a missing server fails the test (`DISTLIMIT_REQUIRE_REDIS=1`).
pub fn required() -> bool {
    std::env::var(ENV_REQUIRE).is_ok_and(|v| v.trim() == "1")
}

/// The environment variable `name` (trimmed) when it is set and not empty. When it is missing:
/// a panic naming it if servers are required ([`required`]), else a note on stderr and `None`,
/// on which the caller returns early (a skip outside `cargo xtask test`).
///
/// # Panics
///
/// When the variable is missing and `DISTLIMIT_REQUIRE_REDIS=1`.
#[allow(clippy::panic)] // test support: a missing server fails the test
pub fn var(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => Some(value.trim().to_owned()),
        _ => {
            if required() {
                panic!(
                    "{name} is not set: run `cargo xtask test` (it starts the Redis servers and \
                     sets the DISTLIMIT_REDIS_* variables)"
                );
            }
            eprintln!(
                "note: skipped: {name} is not set (run `cargo xtask test`, or `cargo xtask \
                 redis-up` and source the export lines it prints)"
            );
            None
        }
    }
}

/// The `redis-server` binary: `DISTLIMIT_REDIS_SERVER_BIN`, else one on the `PATH`.
pub fn server_bin() -> Option<PathBuf> {
    if let Ok(bin) = std::env::var(ENV_SERVER_BIN)
        && !bin.trim().is_empty()
    {
        return Some(PathBuf::from(bin.trim()));
    }
    find_on_path("redis-server")
}

/// [`server_bin`] for a test: `None` (the caller returns early, a skip) with a note on stderr
/// when there is none.
///
/// # Panics
///
/// When there is none and servers are required (`DISTLIMIT_REQUIRE_REDIS=1`).
pub fn server_bin_or_skip() -> Option<PathBuf> {
    let bin = server_bin();
    if bin.is_none() {
        assert!(
            !required(),
            "{ENV_SERVER_BIN} is not set and no redis-server is on the PATH: run `cargo xtask \
             test`, or install redis-server"
        );
        eprintln!("note: skipped: no redis-server ({ENV_SERVER_BIN} unset, none on the PATH)");
    }
    bin
}

/// The Redis tool `name` (`redis-cli`, `redis-benchmark`) of the same installation as
/// `server`: next to it, else on the `PATH`.
pub fn tool_bin(server: &Path, name: &str) -> Option<PathBuf> {
    let sibling = server.with_file_name(name);
    if sibling.is_file() {
        return Some(sibling);
    }
    find_on_path(name)
}

/// The first file called `name` in a directory of the `PATH`.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// A loopback port nobody listened on a moment ago, whose cluster bus port (port + 10000) was
/// free too. Another process may still take it first: starts retry on another port.
pub fn free_port() -> io::Result<u16> {
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
    Err(io::Error::other(format!(
        "found no free loopback port at or below {MAX_PORT} in 1000 tries"
    )))
}

/// A `redis-server` process on a loopback port: started on a free port, faulted by its PID,
/// killed on drop. See the [module documentation](self).
#[derive(Debug)]
pub struct RedisServer {
    bin: PathBuf,
    /// What it is (`standalone`, `cluster node`, `sentinel`, ...), for messages.
    role: &'static str,
    port: u16,
    /// Its `--dir` and `redis.log`.
    dir: PathBuf,
    /// The arguments before ours, kept for [`restart`](Self::restart).
    args: Vec<OsString>,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server with the default arguments; `None` (after a note on stderr) when there
    /// is no binary and servers are not required.
    ///
    /// # Panics
    ///
    /// When there is no binary and `DISTLIMIT_REQUIRE_REDIS=1`, or when the server does not
    /// come up (a test cannot continue without it).
    pub fn start() -> Option<Self> {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line arguments (`["--maxmemory", "1mb"]`).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    #[allow(clippy::panic)] // test support: a server that cannot start fails the test
    pub fn start_with(args: &[&str]) -> Option<Self> {
        let bin = server_bin_or_skip()?;
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        match Self::spawn(&bin, "standalone", |_, _| Ok(args.clone())) {
            Ok(server) => Some(server),
            Err(why) => panic!("{why}"),
        }
    }

    /// Starts `bin` on a free loopback port, with the arguments `args` makes from the port and
    /// the server's (empty) directory, where it may write a config file, and waits until it
    /// answers `PING`. `role` names it in messages.
    ///
    /// `args` come first on the command line, so a config file can be among them; ours follow:
    /// `--port`, `--bind 127.0.0.1`, no persistence, no delay before a replica's full sync,
    /// `--dir`. A port another process took first is retried on another.
    pub fn spawn(
        bin: &Path,
        role: &'static str,
        mut args: impl FnMut(u16, &Path) -> Result<Vec<OsString>, String>,
    ) -> Result<Self, String> {
        static NEXT_DIR: AtomicU64 = AtomicU64::new(0);
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port().map_err(|e| e.to_string())?;
            // A fresh directory in the scratch directory.
            let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
            let dir = scratch()?.join(format!("{}-{port}-{n}", role.replace(' ', "-")));
            let mut server = Self {
                bin: bin.to_owned(),
                role,
                port,
                args: args(port, &dir)?,
                dir,
                child: None,
            };
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(why) if server.log().contains("Address already in use") => last = why,
                Err(why) => return Err(why),
            }
        }
        Err(format!(
            "{role} redis-server lost its port to another process {START_ATTEMPTS} times: {last}"
        ))
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The port it listens on (the same after a [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The `redis-server` binary it runs.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// `cluster node redis-server on 127.0.0.1:41234 (pid 123)`, for messages.
    pub fn name(&self) -> String {
        let pid = self
            .pid()
            .map_or("stopped".to_owned(), |p| format!("pid {p}"));
        format!("{} redis-server on {} ({pid})", self.role, self.addr())
    }

    /// Kills the process with SIGKILL and reaps it: connections drop, the port closes.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            if child.wait().is_ok() {
                let _ = fs::remove_file(pid_file(child.id()));
            }
        }
    }

    /// Stops the process with SIGSTOP: a hung server (connections stay open, nothing answers).
    pub fn pause(&self) -> Result<(), String> {
        self.signal("-STOP")
    }

    /// Continues a [`pause`](Self::pause)d process with SIGCONT.
    pub fn resume(&self) -> Result<(), String> {
        self.signal("-CONT")
    }

    /// Kills the process if it runs, then starts a new one on the same port with the same
    /// arguments (an empty data set, like a restart without persistence) and waits until it
    /// answers.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        let start = Instant::now();
        // The port may stay in use for a moment after the kill; retry briefly.
        loop {
            match self.launch() {
                Ok(()) => return Ok(()),
                Err(why) if start.elapsed() > READY_TIMEOUT => return Err(why),
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// A new synchronous connection, with a 5 s timeout for connecting, reading and
    /// writing.
    pub fn connection(&self) -> Result<redis::Connection, String> {
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        let conn = client
            .get_connection_with_timeout(COMMAND_TIMEOUT)
            .map_err(|e| format!("connecting to {}: {e}", self.addr()))?;
        conn.set_read_timeout(Some(COMMAND_TIMEOUT))
            .and_then(|()| conn.set_write_timeout(Some(COMMAND_TIMEOUT)))
            .map_err(|e| e.to_string())?;
        Ok(conn)
    }

    /// Sends `cmd` on a new connection and converts the reply to `T`.
    pub fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, String> {
        let mut conn = self.connection()?;
        cmd.query(&mut conn)
            .map_err(|e| format!("{} answered: {e}", self.addr()))
    }

    /// Sends one command (`["CLIENT", "PAUSE", "1500"]`) on a new connection and returns the
    /// reply as text: a string as is, an integer in decimal, nil as `""`, an array's elements
    /// one per line; an error reply is an `Err` with its message.
    pub fn command(&self, args: &[&str]) -> Result<String, String> {
        let (name, rest) = args.split_first().ok_or("no command")?;
        let mut cmd = redis::cmd(name);
        cmd.arg(rest);
        let value: redis::Value = self.query(&cmd)?;
        Ok(text(&value))
    }

    /// The `INFO` `section` (`"replication"`) as text.
    pub fn info(&self, section: &str) -> Result<String, String> {
        self.query(redis::cmd("INFO").arg(section))
    }

    /// `role` of `INFO replication`: `master` or `slave`.
    pub fn role(&self) -> Result<String, String> {
        let info = self.info("replication")?;
        info_field(&info, "role")
            .map(str::to_owned)
            .ok_or_else(|| format!("{} reports no role", self.addr()))
    }

    /// `calls` of one command in `INFO commandstats` (`"evalsha"`), 0 when it never ran since
    /// the start or the last `CONFIG RESETSTAT`.
    pub fn command_calls(&self, command: &str) -> Result<u64, String> {
        let info = self.info("commandstats")?;
        let prefix = format!("cmdstat_{}:calls=", command.to_ascii_lowercase());
        Ok(info
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
    }

    /// An error naming the server if its process is not running (it should until killed).
    pub fn check_running(&mut self) -> Result<(), String> {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => Ok(()),
            Some(Ok(Some(status))) => Err(format!("{} exited ({status})", self.name())),
            Some(Err(e)) => Err(format!("could not check on {}: {e}", self.name())),
            None => Err(format!("{} was killed", self.name())),
        }
    }

    /// The last lines of the server's log, as a paragraph to append to an error message.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
        let tail: Vec<String> = tail.iter().map(|line| format!("    {line}")).collect();
        format!(
            "\n  last lines of the log of the {}:\n{}",
            self.name(),
            tail.join("\n")
        )
    }

    /// What the server wrote to stdout and stderr so far.
    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    fn signal(&self, signal: &str) -> Result<(), String> {
        let pid = self.pid().ok_or("the server is not running")?;
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .map_err(|e| format!("kill {signal} {pid}: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("kill {signal} {pid}: {status}"))
        }
    }

    /// Starts the process on `self.port` and waits until it answers `PING`.
    fn launch(&mut self) -> Result<(), String> {
        fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        // Without `--logfile` the server logs to stdout: into this file, so a failed start can
        // show why.
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("redis.log"))
            .map_err(|e| e.to_string())?;
        let stderr = log.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&self.bin)
            .args(&self.args)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            // A replica's full sync otherwise waits 5 s for more replicas to share the transfer.
            .args(["--repl-diskless-sync-delay", "0"])
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("could not start {}: {e}", self.bin.display()))?;
        let _ = File::create(pid_file(child.id()));
        self.child = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Err(why) = self.check_running() {
                self.kill();
                return Err(format!("{why} during startup{}", self.log_tail()));
            }
            if self.answers_ping() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let why = format!(
                    "{} did not answer PING within {READY_TIMEOUT:?}{}",
                    self.name(),
                    self.log_tail()
                );
                self.kill();
                return Err(why);
            }
            thread::sleep(POLL);
        }
    }

    /// Whether it answers `PING` with `PONG`, or says it needs a password (`--requirepass`):
    /// up all the same. `LOADING` and the like are not ready.
    fn answers_ping(&self) -> bool {
        let client = match redis::Client::open(self.url()) {
            Ok(client) => client,
            Err(_) => return false,
        };
        let result = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .and_then(|mut conn| {
                conn.set_read_timeout(Some(Duration::from_millis(500)))?;
                redis::cmd("PING").query::<String>(&mut conn)
            });
        match result {
            Ok(pong) => pong == "PONG",
            Err(e) => e.code() == Some("NOAUTH"),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A stopped process dies of SIGKILL all the same; continue it first anyway so that
        // nothing is left stopped if the kill failed.
        let _ = self.resume();
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A reply as text (see [`RedisServer::command`]).
fn text(value: &redis::Value) -> String {
    use redis::Value;
    match value {
        Value::Nil => String::new(),
        Value::Int(n) => n.to_string(),
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".to_owned(),
        Value::Array(items) | Value::Set(items) => {
            items.iter().map(text).collect::<Vec<_>>().join("\n")
        }
        Value::Map(pairs) => pairs
            .iter()
            .map(|(k, v)| format!("{}\n{}", text(k), text(v)))
            .collect::<Vec<_>>()
            .join("\n"),
        other => format!("{other:?}"),
    }
}

/// The value of `field` in `INFO`-style text (`role:master` lines).
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// Why a setup is not ready yet, and which of its servers to blame.
#[derive(Debug)]
struct NotReady {
    why: String,
    /// The index of the server whose log explains it.
    server: Option<usize>,
    /// Waiting longer cannot help (a server exited).
    fatal: bool,
}

impl NotReady {
    fn at(server: usize, why: impl Into<String>) -> Self {
        let why = why.into();
        Self {
            why,
            server: Some(server),
            fatal: false,
        }
    }

    fn new(why: impl Into<String>) -> Self {
        Self {
            why: why.into(),
            server: None,
            fatal: false,
        }
    }
}

/// Polls `check` until it succeeds, fails fatally, or `timeout` has passed; then the last
/// complaint, prefixed with how long we waited.
fn wait_until(
    timeout: Duration,
    mut check: impl FnMut() -> Result<(), NotReady>,
) -> Result<(), NotReady> {
    let start = Instant::now();
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(not_ready) if not_ready.fatal => return Err(not_ready),
            Err(mut not_ready) if start.elapsed() >= timeout => {
                not_ready.why = format!("not ready after {:?}: {}", start.elapsed(), not_ready.why);
                return Err(not_ready);
            }
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Checks that every one of `servers` still runs; the first that exited is a fatal [`NotReady`].
fn check_all_running<'a>(
    servers: impl IntoIterator<Item = &'a mut RedisServer>,
) -> Result<(), NotReady> {
    for (i, server) in servers.into_iter().enumerate() {
        server.check_running().map_err(|why| NotReady {
            why,
            server: Some(i),
            fatal: true,
        })?;
    }
    Ok(())
}

/// This process's scratch directory, and the watchdog that removes it (see the [module
/// documentation](self)).
struct Scratch {
    dir: PathBuf,
    /// The write end of the watchdog's pipe, held until the process ends.
    _watchdog: Option<ChildStdin>,
}

/// The watchdog: waits for end-of-file on stdin, then kills the servers still listed in `$1`
/// and removes `$1`.
const WATCHDOG: &str = r#"read -r _
cd "$1" || exit 0
for f in pid-*; do [ -e "$f" ] && kill -KILL "${f#pid-}" 2>/dev/null; done
sleep 1
cd / && rm -rf -- "$1""#;

/// This process's scratch directory, created (and its watchdog started) on first use.
fn scratch() -> Result<&'static Path, String> {
    static SCRATCH: OnceLock<Result<Scratch, String>> = OnceLock::new();
    let scratch = SCRATCH.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("distlimit-redis-")
            .tempdir()
            .map_err(|e| format!("cannot create a scratch directory: {e}"))?
            .keep();
        Ok(Scratch {
            _watchdog: start_watchdog(&dir),
            dir,
        })
    });
    match scratch {
        Ok(scratch) => Ok(&scratch.dir),
        Err(why) => Err(why.clone()),
    }
}

/// Starts the watchdog for `dir`; without one, a warning (only a signal would leak servers).
fn start_watchdog(dir: &Path) -> Option<ChildStdin> {
    let mut command = Command::new("sh");
    command
        .args(["-c", WATCHDOG, "distlimit-redis-watchdog"])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // Its own process group: Ctrl-C in a terminal must not end it together with us.
        command.process_group(0);
    }
    // The child is not waited for: it outlives us when it has to.
    match command.spawn() {
        Ok(mut child) => child.stdin.take(),
        Err(e) => {
            eprintln!(
                "warning: no watchdog for the Redis test servers ({e}): if this process is \
                 killed by a signal, they keep running"
            );
            None
        }
    }
}

/// The file whose presence tells the watchdog that `pid` is a server of ours.
fn pid_file(pid: u32) -> PathBuf {
    scratch().map_or_else(|_| PathBuf::new(), |dir| dir.join(format!("pid-{pid}")))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::*;

    #[test]
    fn free_ports_leave_room_for_the_cluster_bus() {
        for _ in 0..20 {
            assert!(free_port().unwrap() <= MAX_PORT);
        }
    }

    #[test]
    fn replies_become_text() {
        use redis::Value;
        assert_eq!(text(&Value::Okay), "OK");
        assert_eq!(text(&Value::Int(42)), "42");
        assert_eq!(text(&Value::Nil), "");
        let array = Value::Array(vec![Value::BulkString(b"a".to_vec()), Value::Int(7)]);
        assert_eq!(text(&array), "a\n7");
        assert_eq!(info_field("# x\r\nrole:master\r\n", "role"), Some("master"));
        assert_eq!(info_field("role:master", "rol"), None);
    }

    #[test]
    fn starts_faults_and_restarts_a_real_server() {
        let Some(mut server) = RedisServer::start() else {
            return;
        };
        assert_eq!(server.command(&["PING"]), Ok("PONG".to_owned()));
        assert_eq!(server.command(&["SET", "k", "v"]), Ok("OK".to_owned()));
        assert_eq!(server.command_calls("set"), Ok(1));
        assert!(server.command(&["NOSUCHCOMMAND"]).is_err());
        let pid = server.pid().unwrap();
        assert!(pid_file(pid).exists(), "the watchdog knows the server");

        server.pause().unwrap();
        let stream = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        (&stream).write_all(b"PING\r\n").unwrap();
        let mut buf = [0u8; 7];
        assert!(
            (&stream).read_exact(&mut buf).is_err(),
            "a stopped server must not answer"
        );
        server.resume().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        (&stream).read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"+PONG\r\n");

        server.kill();
        assert!(server.pid().is_none());
        assert!(
            !pid_file(pid).exists(),
            "a reaped server is not the watchdog's"
        );
        assert!(server.command(&["PING"]).is_err());
        assert!(server.pause().is_err());

        let port = server.port();
        server.restart().unwrap();
        assert_eq!(server.port(), port);
        assert_ne!(server.pid(), Some(pid));
        // An empty data set after the restart.
        assert_eq!(server.command(&["GET", "k"]), Ok(String::new()));
        let dir = server.dir.clone();
        drop(server);
        assert!(!dir.exists());
    }

    #[test]
    fn a_password_protected_server_counts_as_up() {
        let Some(server) = RedisServer::start_with(&["--requirepass", "s3cret"]) else {
            return;
        };
        assert!(server.command(&["GET", "k"]).is_err());
    }
}
