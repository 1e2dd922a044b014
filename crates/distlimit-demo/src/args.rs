//! The command line.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use distlimit_tower::Cidr;

use crate::serve::ServeArgs;
use crate::serve::store::StoreArgs;

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

    /// The store's flags ([`StoreArgs`], shared with `distlimit-server`).
    #[command(flatten)]
    pub store: StoreArgs,

    /// A proxy (CIDR) whose X-Forwarded-For is believed; repeat for several. None by default:
    /// the client IP is the socket peer.
    #[arg(long = "trusted-proxy", value_name = "CIDR")]
    pub trusted_proxies: Vec<Cidr>,

    /// The most requests of one user (`X-User-ID`, else the client IP) in flight at once on
    /// `GET /api/generate`, across every instance sharing the store, unless the `--policy`
    /// file defines policy `generate` (its `max_in_flight` and `in_flight_lease` win).
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub max_in_flight: u32,

    /// How long a permit of `/api/generate` outlives an instance that crashed while holding
    /// it (it is renewed while its request runs), in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 30_000,
          value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub in_flight_lease_ms: u64,

    /// The tokens a streamed `GET /api/generate?stream=1` reserves at a time from policy
    /// `tokens` (about one store call per this many tokens streamed).
    #[arg(long, value_name = "N", default_value_t = distlimit_tower::DEFAULT_BLOCK,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub stream_block: u64,

    /// The serving limits ([`ServeArgs`], shared with `distlimit-server`).
    #[command(flatten)]
    pub serve: ServeArgs,
}

impl Default for Args {
    /// The defaults, as if run without flags.
    fn default() -> Self {
        Self::parse_from(["distlimit-demo"])
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The flags of `line` after the binary's name.
    fn parse(line: &str) -> Result<Args, clap::Error> {
        Args::try_parse_from(
            ["distlimit-demo"]
                .into_iter()
                .chain(line.split_whitespace()),
        )
    }

    #[test]
    fn the_shared_flags_are_those_of_the_server() {
        let args = parse(
            "--max-connections 5000000000 --failure-mode fail-closed --redis-timeout-ms 300 \
             --redis redis+sentinel://127.0.0.1:26379/distlimit --redis-durable-replicas 1 \
             --redis-durable-timeout-ms 30",
        )
        .unwrap();
        assert_eq!(args.serve.max_connections, 5_000_000_000);
        assert_eq!(args.store.redis_timeout_ms, 300);
        assert_eq!(
            args.store.redis_durable(),
            Some((1, std::time::Duration::from_millis(30)))
        );
        assert_eq!(
            args.store.failure_mode,
            Some(distlimit_serve::store::FailureModeArg::FailClosed)
        );
    }

    #[test]
    fn the_region_flags_need_a_region_and_a_home() {
        let both = "--redis redis://127.0.0.1:7001 --redis-home redis://127.0.0.1:7000";
        let flags = format!("{both} --region-horizon-ms 500 --home-unreachable allow");
        let args = parse(&flags).unwrap();
        assert_eq!(
            args.store.region.redis_home.as_deref(),
            Some("redis://127.0.0.1:7000")
        );
        assert_eq!(args.store.region.region_horizon_ms, 500);
        // A home without this region's Redis, and the region knobs without a home.
        for flags in [
            "--redis-home redis://127.0.0.1:7000",
            "--redis redis://127.0.0.1:7001 --region-horizon-ms 500",
            "--redis redis://127.0.0.1:7001 --home-unreachable deny",
        ] {
            let error = parse(flags).unwrap_err();
            let missing = clap::error::ErrorKind::MissingRequiredArgument;
            assert_eq!(error.kind(), missing, "{flags:?}");
        }
        assert!(parse(&format!("{both} --region-horizon-ms 0")).is_err());
    }
}
