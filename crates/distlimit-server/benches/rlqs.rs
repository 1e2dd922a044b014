//! Usage reports per second one server answers on the rate limit quota service: `STREAMS`
//! streams of `BUCKETS` buckets each (the same buckets on every stream: one rule, `BUCKETS`
//! tenants, each shared by every stream), each stream sending its next report as soon as the
//! last one is answered, over loopback, on the memory store. The server runs in this process on
//! a runtime (one worker) of its own; the clients on another.
//!
//! `cargo bench -p distlimit-server --bench rlqs` (bounded: `WARMUP` then `MEASURE`).
//! `RLQS_STREAMS=n` opens `n` streams instead of 1000; `RLQS_REPORTS=r` has each stream send
//! exactly `r` reports (no warmup, bounded at 10 minutes), to count instructions under
//! callgrind: the difference between two runs of `r` reports, per report, is what one report
//! costs (server and client together), e.g.
//! `RLQS_STREAMS=10 RLQS_REPORTS=12 valgrind --tool=callgrind <bench binary>` and `=22`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::panic,
    missing_docs,
    unreachable_pub
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use distlimit_server::{Args, Server};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const STREAMS: usize = 1_000;
/// Bounds a run of `RLQS_REPORTS` reports per stream (slow under callgrind).
const REPORTS_BOUND: Duration = Duration::from_secs(600);

fn env_usize(name: &str) -> Option<usize> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?}: not a count")),
    )
}
const BUCKETS: usize = 100;
/// Streams per HTTP/2 connection.
const PER_CONNECTION: usize = 100;
const WARMUP: Duration = Duration::from_secs(3);
const MEASURE: Duration = Duration::from_secs(10);

fn report() -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "bench".into(),
        bucket_quota_usages: (0..BUCKETS)
            .map(|i| BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: [("tenant".to_owned(), format!("t{i}"))]
                        .into_iter()
                        .collect(),
                }),
                time_elapsed: Some(PbDuration {
                    seconds: 1,
                    nanos: 0,
                }),
                num_requests_allowed: 5,
                num_requests_denied: 1,
            })
            .collect(),
    }
}

fn main() {
    let streams = env_usize("RLQS_STREAMS").unwrap_or(STREAMS);
    let reports_each = env_usize("RLQS_REPORTS");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        "domain: bench\ndescriptors:\n  - key: tenant\n    rate_limit: { unit: minute, requests_per_unit: 60000 }\n",
    )
    .unwrap();
    let config = dir.path().to_str().unwrap().to_owned();
    let args = Args::parse_from([
        "distlimit-server",
        "--grpc",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--config",
        &config,
        // Streams wait their turn on a loaded server: no silence timeout within the run.
        "--rlqs-report-interval-ms",
        "60000",
        "--rlqs-max-buckets",
        &BUCKETS.to_string(),
    ]);
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let grpc = server_rt.block_on(async {
        let server = Server::build(&args).await.unwrap();
        let grpc = tokio::net::TcpListener::bind(args.grpc).await.unwrap();
        let http = tokio::net::TcpListener::bind(args.http).await.unwrap();
        let addr = grpc.local_addr().unwrap();
        tokio::spawn(server.serve(grpc, http, async move {
            let _ = stopped.await;
        }));
        addr
    });
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let answered = Arc::new(AtomicU64::new(0));
    let (reports, elapsed) = client_rt.block_on(async {
        let started = Instant::now();
        let end = started
            + match reports_each {
                Some(_) => REPORTS_BOUND,
                None => WARMUP + MEASURE,
            };
        let mut tasks = Vec::new();
        let mut channel: Option<Channel> = None;
        for i in 0..streams {
            if i % PER_CONNECTION == 0 {
                channel = Some(
                    Channel::from_shared(format!("http://{grpc}"))
                        .unwrap()
                        .connect()
                        .await
                        .unwrap(),
                );
            }
            let mut client = RateLimitQuotaServiceClient::new(channel.clone().unwrap());
            let answered = answered.clone();
            tasks.push(tokio::spawn(async move {
                let (tx, rx) = mpsc::channel(2);
                let report = report();
                tx.send(report.clone()).await.unwrap();
                let mut inbound = client
                    .stream_rate_limit_quotas(ReceiverStream::new(rx))
                    .await
                    .unwrap()
                    .into_inner();
                let mut sent = 1;
                while Instant::now() < end {
                    match tokio::time::timeout_at(end.into(), inbound.message()).await {
                        Ok(Ok(Some(answer))) => {
                            assert_eq!(answer.bucket_action.len(), BUCKETS);
                            answered.fetch_add(1, Ordering::Relaxed);
                            if reports_each.is_some_and(|r| sent >= r) {
                                break;
                            }
                            sent += 1;
                            if tx.send(report.clone()).await.is_err() {
                                break;
                            }
                        }
                        Ok(other) => panic!("stream ended: {other:?}"),
                        Err(_) => break,
                    }
                }
            }));
        }
        if reports_each.is_none() {
            tokio::time::sleep_until((started + WARMUP).into()).await;
        }
        let at_warmup = answered.load(Ordering::Relaxed);
        let measured = Instant::now();
        for task in tasks {
            task.await.unwrap();
        }
        (
            answered.load(Ordering::Relaxed) - at_warmup,
            measured.elapsed(),
        )
    });
    if let Some(each) = reports_each {
        assert_eq!(
            reports,
            (each * streams) as u64,
            "every report answered in time"
        );
    }
    let per_second = reports as f64 / elapsed.as_secs_f64();
    println!(
        "rlqs: {streams} streams x {BUCKETS} buckets: {per_second:.0} reports/s \
         ({:.0} bucket usages/s) over {elapsed:.1?}",
        per_second * BUCKETS as f64
    );
    let _ = stop.send(());
    drop(client_rt);
    drop(server_rt);
}
