//! The floor of `cargo xtask bench-rls`: a bare tonic server of Envoy's `RateLimitService`
//! that decides nothing and answers every `ShouldRateLimit` with one constant OK of the shape
//! `distlimit-server` sends (one descriptor status). Under the same load as the two servers of
//! the bench, it measures what tonic's gRPC serving alone costs on this machine.
//!
//! It takes the server's command line and reads only `--grpc HOST:PORT` (the rest, such as
//! `--http` and `--config`, is ignored), so the bench's runner starts it as it starts
//! `distlimit-server`:
//!
//! ```sh
//! cargo build --profile dist -p distlimit-server --features floor --bin rls-floor
//! target/dist/rls-floor --grpc 127.0.0.1:8081
//! ```
//!
//! It runs as the server does: Tokio's multi-thread runtime (one worker per core it may use),
//! mimalloc, tonic's server with its defaults and `TCP_NODELAY`.
#![allow(clippy::print_stderr)]

use std::net::SocketAddr;
use std::process::ExitCode;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::server::TcpIncoming;

/// The server's allocator, so that the floor allocates alike.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The port of `distlimit-server` when `--grpc` is not given.
const DEFAULT_GRPC: &str = "127.0.0.1:8081";

/// The service: one constant answer.
struct Floor;

#[tonic::async_trait]
impl RateLimitService for Floor {
    async fn should_rate_limit(
        &self,
        _: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![DescriptorStatus {
                code: Code::Ok as i32,
                current_limit: Some(RateLimit {
                    name: String::new(),
                    requests_per_unit: 1_000_000_000,
                    unit: Unit::Minute as i32,
                }),
                limit_remaining: 999_999_999,
                duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration {
                    seconds: 59,
                    nanos: 0,
                }),
                ..DescriptorStatus::default()
            }],
            ..RateLimitResponse::default()
        }))
    }
}

/// The address after `--grpc` (or in `--grpc=ADDR`), else [`DEFAULT_GRPC`].
fn grpc_addr(args: impl IntoIterator<Item = String>) -> Result<SocketAddr, String> {
    let mut args = args.into_iter();
    let mut addr = None;
    while let Some(arg) = args.next() {
        if arg == "--grpc" {
            addr = args.next();
        } else if let Some(value) = arg.strip_prefix("--grpc=") {
            addr = Some(value.to_owned());
        }
    }
    let addr = addr.unwrap_or_else(|| DEFAULT_GRPC.to_owned());
    addr.parse()
        .map_err(|error| format!("--grpc {addr}: {error}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    let addr = match grpc_addr(std::env::args().skip(1)) {
        Ok(addr) => addr,
        Err(error) => {
            eprintln!("rls-floor: {error}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("rls-floor: bind {addr}: {error}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("rls-floor: grpc listening on {addr}");
    let served = tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Floor))
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            async {
                let _ = tokio::signal::ctrl_c().await;
            },
        )
        .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("rls-floor: {error}");
            ExitCode::FAILURE
        }
    }
}
