//! The command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use distlimit_tower::Cidr;

use crate::serve::store::StoreArgs;
use crate::serve::{self, ServeConfig};

/// The demo service's command line (`distlimit-demo --help`).
#[derive(Clone, Debug, Parser)]
#[command(name = "distlimit-demo", version, about)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,

    /// A TOML policy file (hot-reloaded). It must define the policy `api`; without it, a token
    /// bucket of 100 refilled at 60 per minute.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,

    /// The store: `--redis`, `--instances`, `--redis-budget-ms`, `--redis-timeout-ms`,
    /// `--failure-mode`, `--lease` (shared with `distlimit-server`).
    #[command(flatten)]
    pub store: StoreArgs,

    /// A proxy (CIDR) whose X-Forwarded-For is believed; repeat for several. None by default:
    /// the client IP is the socket peer.
    #[arg(long = "trusted-proxy", value_name = "CIDR")]
    pub trusted_proxies: Vec<Cidr>,

    /// A request's head must arrive within this many milliseconds of the connection starting
    /// to wait for it (at accept, and after each response).
    #[arg(long, value_name = "MS", default_value_t = millis(serve::DEFAULT_HEADER_READ_TIMEOUT), value_parser = timeout_ms())]
    pub header_read_timeout_ms: u64,

    /// A connection with no request in progress on which no byte moves for this many
    /// milliseconds is closed.
    #[arg(long, value_name = "MS", default_value_t = millis(serve::DEFAULT_IDLE_TIMEOUT), value_parser = timeout_ms())]
    pub idle_timeout_ms: u64,

    /// At most this many connections at once (more wait in the accept backlog); lowered to the
    /// descriptor limit minus 64.
    #[arg(long, value_name = "N", default_value_t = serve::DEFAULT_MAX_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// After SIGTERM or Ctrl-C, requests in progress get this many milliseconds to finish;
    /// then the process exits.
    #[arg(long, value_name = "MS", default_value_t = millis(serve::DEFAULT_SHUTDOWN_TIMEOUT), value_parser = timeout_ms())]
    pub shutdown_timeout_ms: u64,
}

/// The longest timeout a flag accepts: one day, in milliseconds.
const MAX_TIMEOUT_MS: u64 = 86_400_000;

fn timeout_ms() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..=MAX_TIMEOUT_MS)
}

const fn millis(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

impl Args {
    /// The server's limits, from the flags.
    pub fn serve_config(&self) -> ServeConfig {
        ServeConfig {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            shutdown_timeout: Duration::from_millis(self.shutdown_timeout_ms),
        }
    }
}

impl Default for Args {
    /// The defaults, as if run without flags.
    fn default() -> Self {
        Self::parse_from(["distlimit-demo"])
    }
}
