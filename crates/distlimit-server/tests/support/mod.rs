//! A server on loopback and a gRPC client built from the same Envoy protos.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

pub mod binary;

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use distlimit_serve::TlsReload;
use distlimit_server::{Args, Checker, Reload, Server};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// A running server.
pub struct Running {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub checker: Arc<Checker>,
    pub reloads: Option<watch::Receiver<Reload>>,
    pub tls_reloads: Option<watch::Receiver<TlsReload>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
}

/// The command line of a server on loopback ports chosen by the system, with `flags`.
pub fn args(flags: &[&str]) -> Args {
    let mut argv = vec![
        "distlimit-server",
        "--grpc",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
    ];
    argv.extend_from_slice(flags);
    Args::parse_from(argv)
}

/// Reads until the server closes `socket`; how long that took. Panics if it is still open after
/// `limit`.
pub async fn closed_within(socket: &mut tokio::net::TcpStream, limit: Duration) -> Duration {
    use tokio::io::AsyncReadExt;
    let started = std::time::Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(limit, socket.read(&mut buf)).await {
            Err(_) => panic!("still open after {limit:?}"),
            Ok(Ok(0) | Err(_)) => return started.elapsed(),
            // What the server sent first (an HTTP/2 preface and settings, say).
            Ok(Ok(_)) => {}
        }
    }
}

impl Running {
    /// Starts a server with `flags` (besides the loopback addresses).
    pub async fn start(flags: &[&str]) -> Self {
        let args = args(flags);
        let server = Server::build(&args).await.expect("server starts");
        let checker = server.checker().clone();
        let reloads = server.reloads();
        let tls_reloads = server.tls_reloads();
        let grpc = TcpListener::bind(args.grpc).await.unwrap();
        let http = TcpListener::bind(args.http).await.unwrap();
        let (grpc_addr, http_addr) = (grpc.local_addr().unwrap(), http.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(grpc, http, async move {
            let _ = stopped.await;
        }));
        Self {
            grpc: grpc_addr,
            http: http_addr,
            checker,
            reloads,
            tls_reloads,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Starts a server on the configuration at `path`.
    pub async fn with_config(path: &Path, flags: &[&str]) -> Self {
        let path = path.to_str().unwrap().to_owned();
        let mut all = vec!["--config", path.as_str(), "--reload-interval-ms", "50"];
        all.extend_from_slice(flags);
        Self::start(&all).await
    }

    /// A gRPC client.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connects")
    }

    /// Stops the server and waits for it.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("stops in time")
                .unwrap()
                .unwrap();
        }
    }

    /// Waits (at most 10 s) for the next reload event.
    pub async fn next_reload(&mut self) -> Reload {
        let reloads = self.reloads.as_mut().expect("a config path");
        tokio::time::timeout(Duration::from_secs(10), reloads.changed())
            .await
            .expect("a reload in time")
            .unwrap();
        reloads.borrow_and_update().clone()
    }
}

impl Running {
    /// Waits (at most 10 s) for the next TLS reload event.
    pub async fn next_tls_reload(&mut self) -> TlsReload {
        let reloads = self.tls_reloads.as_mut().expect("--tls-cert");
        tokio::time::timeout(Duration::from_secs(10), reloads.changed())
            .await
            .expect("a TLS reload in time")
            .unwrap();
        reloads.borrow_and_update().clone()
    }
}

/// A configuration directory holding `yaml` as `config.yaml`.
pub fn config_dir(yaml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), yaml).unwrap();
    dir
}

/// A descriptor of `(key, value)` entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// A request of `domain` with `descriptors`.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

/// Calls `ShouldRateLimit`, expecting an answer.
pub async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .expect("an answer")
        .into_inner()
}

pub const OK: i32 = 1;
pub const OVER_LIMIT: i32 = 2;

/// Waits until at least `margin` is left in the current window of `unit_secs`, so a burst of
/// requests lands in one window.
pub async fn align(unit_secs: u64, margin: Duration) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let period = Duration::from_secs(unit_secs).as_micros();
    let left = Duration::from_micros((period - now.as_micros() % period) as u64);
    if left < margin {
        tokio::time::sleep(left + Duration::from_millis(5)).await;
    }
}

/// A configuration of domain `d` limiting each `user` to `rpu` requests an hour.
pub fn limit_of(rpu: u32) -> String {
    format!(
        "
domain: d
descriptors:
  - key: user
    rate_limit: {{ unit: hour, requests_per_unit: {rpu} }}
"
    )
}

/// The `requests_per_unit` the server answers for `d`/`user`, if limited.
pub async fn configured_limit(server: &Running) -> Option<u32> {
    let mut client = server.client().await;
    let answer = call(
        &mut client,
        request("d", vec![descriptor(&[("user", "r")])]),
    )
    .await;
    answer.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}
