//! The serving flags every binary shares (feature `cli`): flatten [`ServeArgs`] with
//! `#[command(flatten)]`, and get a [`ServeConfig`] from it.

use std::time::Duration;

use crate::{
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_SHUTDOWN_TIMEOUT, ServeConfig,
};

/// The longest timeout a flag accepts: one day, in milliseconds.
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;

/// The serving limits as flags: `--header-read-timeout-ms`, `--idle-timeout-ms`,
/// `--max-connections`, `--shutdown-timeout-ms`.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct ServeArgs {
    /// A request's head must arrive within this many milliseconds of the connection starting
    /// to wait for it (at accept, and after each response), and a connection that has started
    /// no request this long after it was accepted is closed (1 to 86400000).
    #[arg(long, value_name = "MS", default_value_t = millis(DEFAULT_HEADER_READ_TIMEOUT), value_parser = timeout_ms())]
    pub header_read_timeout_ms: u64,

    /// A connection with no request in progress, and none started or ended, for this many
    /// milliseconds is closed (1 to 86400000).
    #[arg(long, value_name = "MS", default_value_t = millis(DEFAULT_IDLE_TIMEOUT), value_parser = timeout_ms())]
    pub idle_timeout_ms: u64,

    /// At most this many connections at once on each port (more wait in the accept backlog);
    /// lowered to the descriptor limit minus 64.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,

    /// After SIGTERM or Ctrl-C, requests in progress get this many milliseconds to finish;
    /// then the process exits (1 to 86400000).
    #[arg(long, value_name = "MS", default_value_t = millis(DEFAULT_SHUTDOWN_TIMEOUT), value_parser = timeout_ms())]
    pub shutdown_timeout_ms: u64,
}

fn timeout_ms() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..=MAX_TIMEOUT_MS)
}

/// `duration` in whole milliseconds, for a flag's default (here and in the store's flags).
pub(crate) const fn millis(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

impl ServeArgs {
    /// The shutdown deadline.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown_timeout_ms)
    }

    /// The serving limits of the flags.
    pub fn serve_config(&self) -> ServeConfig {
        ServeConfig {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            shutdown_timeout: self.shutdown_timeout(),
        }
    }
}
