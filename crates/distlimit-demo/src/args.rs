//! The command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use distlimit_tower::Cidr;

/// The demo service's command line (`distlimit-demo --help`).
#[derive(Clone, Debug, Parser)]
#[command(name = "distlimit-demo", version, about)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,

    /// Share the limit through this Redis: redis://host:port, rediss://…,
    /// redis+sentinel://host:port[,host:port…]/service or redis+cluster://host:port[,host:port…].
    /// Without it, the embedded memory store limits this process alone.
    #[arg(long, value_name = "URL")]
    pub redis: Option<String>,

    /// A TOML policy file (hot-reloaded). It must define the policy `api`; without it, a token
    /// bucket of 100 refilled at 60 per minute.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,

    /// How many instances share the Redis limit: while Redis is unreachable each instance
    /// enforces 1/N of it on its own.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub instances: u64,

    /// Time budget of one Redis decision, in milliseconds; past it the local fallback answers
    /// and the circuit breaker opens.
    #[arg(long, value_name = "MS", default_value_t = 50)]
    pub redis_budget_ms: u64,

    /// A proxy (CIDR) whose X-Forwarded-For is believed; repeat for several. None by default:
    /// the client IP is the socket peer.
    #[arg(long = "trusted-proxy", value_name = "CIDR")]
    pub trusted_proxies: Vec<Cidr>,
}

impl Args {
    /// The Redis time budget.
    pub fn redis_budget(&self) -> Duration {
        Duration::from_millis(self.redis_budget_ms)
    }
}

impl Default for Args {
    /// The defaults, as if run without flags.
    fn default() -> Self {
        Self::parse_from(["distlimit-demo"])
    }
}
