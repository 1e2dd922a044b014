//! The real `distlimit-server` binary, spawned on loopback ports and killed by PID on drop.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

/// The samples of successful configuration loads in `/metrics`.
pub const LOADS_OK: &str = "distlimit_server_config_loads_total{result=\"success\"}";
/// The samples of failed configuration loads in `/metrics`.
pub const LOADS_ERROR: &str = "distlimit_server_config_loads_total{result=\"error\"}";

/// The real binary, its stderr collected line by line; killed by PID on drop.
pub struct Binary {
    pub child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
}

impl Binary {
    /// Starts the binary with `flags` and the environment variables `envs`, on loopback ports
    /// chosen by the system unless `envs` sets `GRPC_PORT`, and waits until it listens (10 s
    /// at most).
    pub fn start(flags: &[&str], envs: &[(&str, &str)]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_distlimit-server"));
        if !envs.iter().any(|(name, _)| *name == "GRPC_PORT") {
            command.args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"]);
        }
        command
            .args(flags)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (name, value) in envs {
            command.env(name, value);
        }
        let mut child = command.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    lines.lock().unwrap().push(line);
                }
            });
        }
        let mut binary = Self {
            child,
            lines,
            grpc: "127.0.0.1:0".parse().unwrap(),
            http: "127.0.0.1:0".parse().unwrap(),
        };
        let grpc = binary.wait_for_line("grpc listening on ", Duration::from_secs(10));
        binary.grpc = after(&grpc, "grpc listening on ").parse().unwrap();
        let http = binary.wait_for_line("http listening on http://", Duration::from_secs(10));
        binary.http = after(&http, "http listening on http://").parse().unwrap();
        binary
    }

    /// Starts the binary on the configuration at `path` (re-read every 50 ms) with `flags`.
    pub fn with_config(path: &Path, flags: &[&str]) -> Self {
        let path = path.to_str().unwrap();
        let mut all = vec!["--config", path, "--reload-interval-ms", "50"];
        all.extend_from_slice(flags);
        Self::start(&all, &[])
    }

    /// A gRPC client of its RLS service.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connects")
    }

    /// A gRPC channel to its gRPC port (RLS, RLQS and health share it).
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.grpc))
            .unwrap()
            .connect()
            .await
            .expect("connects")
    }

    /// Its `/metrics` text.
    pub fn metrics(&self) -> String {
        let (status, body) = http(self.http, "GET", "/metrics", "");
        assert_eq!(status, 200);
        body
    }

    /// The sum of the samples of `/metrics` whose line starts with `prefix`.
    pub fn metric(&self, prefix: &str) -> u64 {
        self.metric_with(prefix, "")
    }

    /// The sum of the samples of `/metrics` whose line starts with `prefix` and contains
    /// `part`.
    pub fn metric_with(&self, prefix: &str, part: &str) -> u64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with(prefix) && l.contains(part))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Polls until `metric(prefix)` exceeds `before` (10 s at most); its value.
    pub fn wait_metric_above(&self, prefix: &str, before: u64) -> u64 {
        let started = Instant::now();
        loop {
            let now = self.metric(prefix);
            if now > before {
                return now;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{prefix} stayed at {now}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The first line containing `needle`, waiting at most `limit`.
    pub fn wait_for_line(&mut self, needle: &str, limit: Duration) -> String {
        let started = Instant::now();
        loop {
            if let Some(line) = self.lines().into_iter().find(|l| l.contains(needle)) {
                return line;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("exited ({status}) before \"{needle}\":\n{}", self.log());
            }
            assert!(
                started.elapsed() < limit,
                "no \"{needle}\" within {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    pub fn log(&self) -> String {
        self.lines().join("\n")
    }

    /// How many lines contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.lines().iter().filter(|l| l.contains(needle)).count()
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits (at most `limit`) for the process to exit; its exit code.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            if started.elapsed() > limit {
                panic!("still running after {limit:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn after<'a>(line: &'a str, prefix: &str) -> &'a str {
    let start = line.find(prefix).unwrap() + prefix.len();
    line[start..].split_whitespace().next().unwrap()
}

/// One HTTP/1.1 request on a new connection: the status and the body.
pub fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let (status, response) = http_response(addr, method, path, body);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// One HTTP/1.1 `POST` on a new connection: the status and the head (status line and headers,
/// each line ending `\r\n`, header names as sent).
pub fn http_head(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    let (status, response) = http_response(addr, "POST", path, body);
    let head = response
        .split_once("\r\n\r\n")
        .map(|(h, _)| format!("{h}\r\n"))
        .unwrap_or_default();
    (status, head)
}

/// One HTTP/1.1 request on a new connection: the status and the whole response.
fn http_response(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    (status, response)
}
