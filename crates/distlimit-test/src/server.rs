//! [`RedisServer`]: a real `redis-server` process a test owns, for fault tests (kill, pause,
//! restart, slow server).
//!
//! The binary is `DISTLIMIT_REDIS_SERVER_BIN`, else `redis-server` on the `PATH`. When neither
//! exists, [`RedisServer::start`] panics if `DISTLIMIT_REQUIRE_REDIS=1` (set by `cargo xtask
//! test`) and otherwise prints a note and returns `None`, so the test can return early (a skip).
//!
//! The server listens on a free loopback port with `--save "" --appendonly no` and a scratch
//! directory of its own. Faults act on this process only, by its PID: [`kill`](RedisServer::kill)
//! (SIGKILL), [`pause`](RedisServer::pause) and [`resume`](RedisServer::resume) (SIGSTOP and
//! SIGCONT through the `kill` command), [`restart`](RedisServer::restart) on the same port.
//! Dropping the handle kills the process and removes its directory.
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

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The variable naming the `redis-server` binary.
pub const ENV_SERVER_BIN: &str = "DISTLIMIT_REDIS_SERVER_BIN";
/// The variable that turns a missing server into a failure (`1`).
pub const ENV_REQUIRE: &str = "DISTLIMIT_REQUIRE_REDIS";

/// How long a started server may take to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Read and write timeout of [`RedisServer::command`].
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

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
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("redis-server"))
            .find(|p| p.is_file())
    })
}

/// A free loopback port (nothing listens on it right after this returns).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A `redis-server` process owned by the test: started on a free loopback port, faulted by its
/// PID, killed on drop. See the [module documentation](self).
#[derive(Debug)]
pub struct RedisServer {
    bin: PathBuf,
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
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
        let Some(bin) = server_bin() else {
            assert!(
                !required(),
                "{ENV_SERVER_BIN} is not set and no redis-server is on the PATH: run `cargo \
                 xtask test`, or install redis-server"
            );
            eprintln!("note: skipped: no redis-server ({ENV_SERVER_BIN} unset, none on the PATH)");
            return None;
        };
        let mut last = String::new();
        for _ in 0..5 {
            let port = match free_port() {
                Ok(port) => port,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let mut server = Self {
                bin: bin.clone(),
                port,
                dir: scratch_dir(port),
                args: args.iter().map(|&a| a.to_owned()).collect(),
                child: None,
            };
            match server.launch() {
                Ok(()) => return Some(server),
                Err(why) => last = why,
            }
        }
        panic!("cannot start {}: {last}", bin.display());
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on (the same after a [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the process with SIGKILL and reaps it: connections drop, the port closes.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
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
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Sends one command (arguments as bulk strings) on a new connection and returns the reply
    /// as text: a simple or bulk string as is, an integer in decimal, an array's elements one per
    /// line; an error reply is an `Err` with its message. For `INFO`, `CLIENT PAUSE`,
    /// `CONFIG RESETSTAT` and the like.
    pub fn command(&self, args: &[&str]) -> Result<String, String> {
        let stream = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(COMMAND_TIMEOUT))
            .and_then(|()| stream.set_write_timeout(Some(COMMAND_TIMEOUT)))
            .map_err(|e| e.to_string())?;
        let mut request = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            request.extend_from_slice(arg.as_bytes());
            request.extend_from_slice(b"\r\n");
        }
        (&stream).write_all(&request).map_err(|e| e.to_string())?;
        read_reply(&mut BufReader::new(stream))
    }

    /// `calls` of one command in `INFO commandstats` (`"evalsha"`), 0 when it never ran since
    /// the start or the last `CONFIG RESETSTAT`.
    pub fn command_calls(&self, command: &str) -> Result<u64, String> {
        let info = self.command(&["INFO", "commandstats"])?;
        let prefix = format!("cmdstat_{}:calls=", command.to_ascii_lowercase());
        Ok(info
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
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

    fn launch(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        let child = spawn(&self.bin, self.port, &self.dir, &self.args)?;
        self.child = Some(child);
        let start = Instant::now();
        while start.elapsed() < READY_TIMEOUT {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!("exited at startup: {status}"));
            }
            if ping(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        Err(format!("no PONG within {READY_TIMEOUT:?}"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            // A stopped process dies of SIGKILL all the same; continue it first anyway so that
            // nothing is left stopped if the kill failed.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn scratch_dir(port: u16) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "distlimit-test-redis-{}-{port}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

fn spawn(bin: &Path, port: u16, dir: &Path, args: &[String]) -> Result<Child, String> {
    Command::new(bin)
        .args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", bin.display()))
}

fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    // A server started with `--requirepass` answers `-NOAUTH …`: up all the same.
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && (&reply == b"+PONG\r\n" || &reply == b"-NOAUTH")
}

/// Reads one RESP2 reply.
fn read_reply<R: BufRead>(reader: &mut R) -> Result<String, String> {
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at_checked(1).ok_or("empty reply")?;
    match kind {
        "+" | ":" => Ok(rest.to_owned()),
        "-" => Err(rest.to_owned()),
        "$" => {
            let Ok(len) = rest.parse::<usize>() else {
                return Ok(String::new()); // `$-1`: nil
            };
            let mut body = vec![0; len + 2];
            reader.read_exact(&mut body).map_err(|e| e.to_string())?;
            body.truncate(len);
            String::from_utf8(body).map_err(|e| e.to_string())
        }
        "*" => {
            let n = rest.parse::<usize>().unwrap_or(0);
            let mut items = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                items.push(read_reply(reader)?);
            }
            Ok(items.join("\n"))
        }
        _ => Err(format!("unexpected reply: {line}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_replies() {
        let parse = |s: &str| read_reply(&mut s.as_bytes());
        assert_eq!(parse("+OK\r\n"), Ok("OK".to_owned()));
        assert_eq!(parse(":42\r\n"), Ok("42".to_owned()));
        assert_eq!(parse("$5\r\nhello\r\n"), Ok("hello".to_owned()));
        assert_eq!(parse("$-1\r\n"), Ok(String::new()));
        assert_eq!(parse("*2\r\n$1\r\na\r\n:7\r\n"), Ok("a\n7".to_owned()));
        assert_eq!(parse("-ERR bad\r\n"), Err("ERR bad".to_owned()));
        assert!(parse("").is_err());
        assert!(parse("?\r\n").is_err());
    }

    #[test]
    fn starts_faults_and_restarts_a_real_server() {
        let Some(mut server) = RedisServer::start() else {
            return;
        };
        assert_eq!(server.command(&["PING"]), Ok("PONG".to_owned()));
        assert_eq!(server.command(&["SET", "k", "v"]), Ok("OK".to_owned()));
        assert_eq!(server.command_calls("set"), Ok(1));
        let pid = server.pid();
        assert!(pid.is_some());

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
        assert!(server.command(&["PING"]).is_err());
        assert!(server.pause().is_err());

        let port = server.port();
        server.restart().unwrap();
        assert_eq!(server.port(), port);
        assert_ne!(server.pid(), pid);
        // An empty data set after the restart.
        assert_eq!(server.command(&["GET", "k"]), Ok(String::new()));
    }
}
