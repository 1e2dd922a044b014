//! What the demo's integration tests share: an HTTP client, demo processes started and killed
//! by the test, and where the test Redis is.

// Each test binary uses a part of this module; a failed setup fails the test.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

#[path = "../../../distlimit-metrics/tests/support/openmetrics.rs"]
pub mod openmetrics;

use distlimit_test::replace_file;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// One answer.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

/// A keep-alive HTTP/1.1 client.
#[derive(Clone)]
pub struct Http(Client<HttpConnector, Empty<Bytes>>);

impl Http {
    pub fn new() -> Self {
        Self(Client::builder(TokioExecutor::new()).build_http())
    }

    /// `GET http://addr/path`, with `X-User-ID: user` when given.
    pub async fn get(&self, addr: SocketAddr, path: &str, user: Option<&str>) -> Reply {
        self.send(http::Method::GET, addr, path, user).await
    }

    /// `method http://addr/path` without a body, with `X-User-ID: user` when given.
    pub async fn send(
        &self,
        method: http::Method,
        addr: SocketAddr,
        path: &str,
        user: Option<&str>,
    ) -> Reply {
        let mut request = Request::builder()
            .method(method.clone())
            .uri(format!("http://{addr}{path}"));
        if let Some(user) = user {
            request = request.header("x-user-id", user);
        }
        let exchange = async {
            let response = self
                .0
                .request(request.body(Empty::new()).unwrap())
                .await
                .unwrap();
            let (parts, body) = response.into_parts();
            (parts, body.collect().await.unwrap().to_bytes())
        };
        // A hung server fails the test instead of hanging it.
        let (parts, body) = tokio::time::timeout(Duration::from_secs(30), exchange)
            .await
            .unwrap_or_else(|_| panic!("{method} {path} on {addr}: no answer within 30 s"));
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }
}

pub const ENV_URL: &str = "DISTLIMIT_REDIS_URL";

/// The standalone test Redis (`DISTLIMIT_REDIS_URL`). Missing: a panic under
/// `DISTLIMIT_REQUIRE_REDIS=1` (`cargo xtask test`), else a note and `None` (the test skips).
pub fn redis_url() -> Option<String> {
    distlimit_test::server::var(ENV_URL)
}

pub const ENV_CLUSTER_URLS: &str = "DISTLIMIT_REDIS_CLUSTER_URLS";
pub const ENV_SENTINEL_URLS: &str = "DISTLIMIT_REDIS_SENTINEL_URLS";
pub const ENV_SENTINEL_SERVICE: &str = "DISTLIMIT_REDIS_SENTINEL_SERVICE";

/// The comma-separated variable `name`, with the same rules as [`redis_url`].
pub fn redis_list(name: &str) -> Option<Vec<String>> {
    let value = distlimit_test::server::var(name)?;
    Some(
        value
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}

/// A name no other test run uses.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// A `distlimit-demo` process this test started, on a free loopback port; killed on drop.
pub struct DemoProcess {
    child: Child,
    pub addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl DemoProcess {
    /// Starts the binary with `args` (plus `--listen 127.0.0.1:0`) and waits, at most 60 s,
    /// for the address it logs.
    pub fn start(args: &[&str]) -> Self {
        Self::spawn(Command::new(env!("CARGO_BIN_EXE_distlimit-demo")), args)
    }

    /// [`start`](Self::start) with the process's descriptor limit lowered to `nofile` (soft and
    /// hard, through the shell's `ulimit -n`).
    pub fn start_with_nofile(nofile: u64, args: &[&str]) -> Self {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_distlimit-demo"));
        Self::spawn(command, args)
    }

    fn spawn(mut command: Command, args: &[&str]) -> Self {
        let mut child = command
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some((_, addr)) = line.split_once("listening on http://") {
                    let _ = tx.send(addr.trim().parse::<SocketAddr>().unwrap());
                }
                lines.lock().unwrap().push(line);
            }
        });
        let mut process = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
        };
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(addr) => process.addr = addr,
            Err(_) => panic!(
                "distlimit-demo {:?} did not start:\n{}",
                command.get_args().collect::<Vec<_>>(),
                process.log().join("\n")
            ),
        }
        process
    }

    /// Runs the binary with `args` to its end (at most 60 s): its exit status and what it
    /// logged.
    pub fn run(args: &[&str]) -> (ExitStatus, String) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_distlimit-demo"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut stderr, &mut text).unwrap();
            text
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("distlimit-demo {args:?} still running after 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        (status, reader.join().unwrap())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the process logged so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Sends SIGTERM (through `kill`, to this child's PID only) and waits at most 30 s.
    pub fn terminate(&mut self) -> ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "no exit 30 s after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for DemoProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The demo's `api` and `api-ip` policies (a burst of 5 an hour per user, 1 000 a second per
/// client IP), the base of the token tests' policy files.
const TOKEN_TESTS_BASE: &str = r#"
[[policy]]
name = "api"
tiers = [{ name = "burst", algorithm = "token_bucket", limit = 1, per = "1h", burst = 5 }]

[[policy]]
name = "api-ip"
tiers = [{ name = "client", algorithm = "token_bucket", limit = 1000, per = "1s", burst = 100000 }]
"#;

/// Writes `dir/policy.toml`: [`TOKEN_TESTS_BASE`] and policy `tokens` with `lines` (its tiers
/// and options); answers the file's path.
pub fn tokens_policy_file(dir: &std::path::Path, lines: &str) -> String {
    let path = dir.join("policy.toml");
    replace_file(
        &path,
        format!("{TOKEN_TESTS_BASE}\n[[policy]]\nname = \"tokens\"\n{lines}\n"),
    )
    .unwrap();
    path.to_str().unwrap().to_owned()
}
