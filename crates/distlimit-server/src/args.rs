//! The command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use distlimit_serve::store::StoreArgs;

/// The rate-limit service's command line (`distlimit-server --help`).
#[derive(Clone, Debug, Parser)]
#[command(name = "distlimit-server", version, about)]
pub struct Args {
    /// envoyproxy/ratelimit's YAML configuration: a file, or a directory whose `.yaml`/`.yml`
    /// files are read (dot files skipped). Reloaded when it changes. Without it, no domain is
    /// configured and every descriptor is answered OK.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Address of the gRPC server (Envoy's RLS v3 and grpc.health.v1).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081")]
    pub grpc: SocketAddr,

    /// Address of the HTTP server (POST /v1/check, /metrics, /ready).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub http: SocketAddr,

    /// The store: `--redis`, `--instances`, `--redis-budget-ms`, `--redis-timeout-ms`,
    /// `--failure-mode`, `--lease` (shared with the demo).
    #[command(flatten)]
    pub store: StoreArgs,

    /// Add the rate-limit headers to every answer: `RateLimit` and `RateLimit-Policy`, and the
    /// `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` trio.
    #[arg(long)]
    pub response_headers: bool,

    /// How often the configuration path is read for changes, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..))]
    pub reload_interval_ms: u64,

    /// The most connections each server (gRPC, HTTP) holds open at once; further clients wait
    /// in the kernel's accept queue.
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,

    /// An HTTP connection with no request in progress, and none started or ended, for this long
    /// is closed, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_ms: u64,

    /// A gRPC connection with no request in progress, and none started or ended, for this long
    /// is closed, in milliseconds. The default, 65 minutes, is above the 1 hour after which
    /// Envoy closes its own idle upstream connections, so that Envoy closes first: a close from
    /// this side can cross a request Envoy has just sent on the connection.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_GRPC_IDLE_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub grpc_idle_timeout_ms: u64,

    /// An HTTP request's head must arrive within this time, and a connection on either port
    /// that has started no request this long after it was accepted is closed, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout_ms: u64,

    /// Time limit of one request, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_ms: u64,

    /// Serve both ports over TLS with this certificate chain (PEM: the server's certificate
    /// first, then intermediates). Needs `--tls-key`. Re-read every `--reload-interval-ms`:
    /// new connections get a changed certificate, open ones keep theirs.
    #[arg(long, value_name = "PATH", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of `--tls-cert` (PEM: PKCS#8, PKCS#1 or SEC1). Needs `--tls-cert`.
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Mutual TLS: clients must present a certificate issued by a certificate of this PEM file.
    /// Needs `--tls-cert` and `--tls-key`.
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// After SIGTERM or Ctrl-C, how long the requests in flight may take to finish, in
    /// milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub shutdown_timeout_ms: u64,
}

/// Default of `--grpc-idle-timeout-ms`: 65 minutes.
pub const DEFAULT_GRPC_IDLE_TIMEOUT_MS: u64 = 65 * 60 * 1000;

impl Args {
    /// The reload poll interval.
    pub fn reload_interval(&self) -> Duration {
        Duration::from_millis(self.reload_interval_ms)
    }

    /// The time limit of one request.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// The shutdown deadline.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown_timeout_ms)
    }

    /// The serving limits of the gRPC port: those of [`serve_config`](Self::serve_config)
    /// with the gRPC idle timeout.
    pub fn grpc_serve_config(&self) -> distlimit_serve::ServeConfig {
        distlimit_serve::ServeConfig {
            idle_timeout: Duration::from_millis(self.grpc_idle_timeout_ms),
            ..self.serve_config()
        }
    }

    /// The TLS files of both ports, if `--tls-cert` and `--tls-key` are given.
    pub fn tls_files(&self) -> Option<distlimit_serve::TlsFiles> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert_chain), Some(private_key)) => Some(distlimit_serve::TlsFiles {
                cert_chain: cert_chain.clone(),
                private_key: private_key.clone(),
                client_ca: self.tls_client_ca.clone(),
            }),
            _ => None,
        }
    }

    /// The serving limits of the HTTP port.
    pub fn serve_config(&self) -> distlimit_serve::ServeConfig {
        distlimit_serve::ServeConfig {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            shutdown_timeout: self.shutdown_timeout(),
        }
    }
}

impl Default for Args {
    /// The defaults, as if run without flags.
    fn default() -> Self {
        Self::parse_from(["distlimit-server"])
    }
}
