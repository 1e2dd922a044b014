//! Real gRPC over loopback TCP: tonic's health service behind the layer, tonic's client.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::net::SocketAddr;

use distlimit_test::{Fault, FaultKind, FaultyStore};
use distlimit_tower::{RateLimitHeaders, RateLimitLayer};
use support::{GUARD, frozen_store, limiter};
use tonic::Code;
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

async fn serve_grpc(layer: RateLimitLayer) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

async fn check(
    addr: SocketAddr,
) -> Result<tonic::Response<tonic_health::pb::HealthCheckResponse>, tonic::Status> {
    let call = async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = HealthClient::new(channel);
        client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
    };
    tokio::time::timeout(GUARD, call)
        .await
        .expect("the server answered")
}

fn metadata<'a>(status: &'a tonic::Status, key: &str) -> Option<&'a str> {
    status.metadata().get(key).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn a_denial_is_resource_exhausted_with_the_retry_delay() {
    let layer = RateLimitLayer::builder(limiter(frozen_store()), "api")
        .headers(RateLimitHeaders::Always)
        .build();
    let addr = serve_grpc(layer).await;

    for _ in 0..2 {
        let ok = check(addr).await.unwrap();
        assert_eq!(ok.get_ref().status, 1, "SERVING");
        // Allowed gRPC responses carry the fields as metadata too.
        assert!(ok.metadata().get("ratelimit").is_some());
    }
    let denied = check(addr).await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted);
    assert_eq!(denied.message(), "rate limit exceeded");
    assert_eq!(metadata(&denied, "retry-after"), Some("1"));
    assert_eq!(metadata(&denied, "grpc-retry-pushback-ms"), Some("300"));
    assert_eq!(
        metadata(&denied, "ratelimit"),
        Some(r#""api/second";r=0;t=1"#)
    );
    assert_eq!(
        metadata(&denied, "ratelimit-policy"),
        Some(r#""api/second";q=2;w=1"#)
    );
}

#[tokio::test]
async fn a_store_failure_is_unavailable() {
    let store = FaultyStore::new(frozen_store()).with_default(Fault::Fail(FaultKind::Unavailable));
    let addr = serve_grpc(RateLimitLayer::new(limiter(store), "api")).await;
    let failed = check(addr).await.unwrap_err();
    assert_eq!(failed.code(), Code::Unavailable);
    assert_eq!(failed.message(), "rate limiter unavailable");
    assert_eq!(metadata(&failed, "retry-after"), Some("1"));
    assert_eq!(metadata(&failed, "grpc-retry-pushback-ms"), Some("1000"));
}

#[tokio::test]
async fn an_unknown_policy_is_internal() {
    let addr = serve_grpc(RateLimitLayer::new(limiter(frozen_store()), "nope")).await;
    let failed = check(addr).await.unwrap_err();
    assert_eq!(failed.code(), Code::Internal);
}
