//! `ShouldRateLimit`'s own gRPC framing refuses what tonic's codec refused, with the same
//! codes, and keeps serving: bytes that are no request (`INTERNAL`), a message past 4 MiB
//! (`RESOURCE_EXHAUSTED`), a compressed request (`UNIMPLEMENTED`: no encoding is enabled).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use bytes::{Buf, BufMut};
use prost::Message;
use support::*;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};

const CONFIG: &str = "
domain: api
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 1000 }
";

/// A codec of raw message bytes, both ways.
#[derive(Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let bytes = src.chunk().to_vec();
        src.advance(bytes.len());
        Ok(Some(bytes))
    }
}

/// Sends `message` as the request of `ShouldRateLimit`, with `metadata`; the answer's bytes.
async fn send(
    channel: &tonic::transport::Channel,
    message: Vec<u8>,
    metadata: &[(&'static str, &'static str)],
) -> Result<Vec<u8>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(message);
    for (key, value) in metadata {
        request.metadata_mut().insert(*key, value.parse().unwrap());
    }
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    grpc.unary(request, path, Raw)
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn malformed_oversized_and_compressed_requests_are_refused_and_serving_goes_on() {
    let dir = config_dir(CONFIG);
    let server = Running::with_config(dir.path(), &[]).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let valid = request("api", vec![descriptor(&[("user", "a")])]).encode_to_vec();

    let garbage = send(&channel, vec![0xff, 0xff, 0xff], &[]).await;
    assert_eq!(garbage.unwrap_err().code(), Code::Internal);

    let mut huge = valid.clone();
    huge.resize(4 * 1024 * 1024 + 1, 0);
    let huge = send(&channel, huge, &[]).await;
    assert_eq!(huge.unwrap_err().code(), Code::ResourceExhausted);

    let compressed = send(&channel, valid.clone(), &[("grpc-encoding", "gzip")]).await;
    assert_eq!(compressed.unwrap_err().code(), Code::Unimplemented);

    // The same bytes, plainly sent, are decided.
    let answer = send(&channel, valid, &[]).await.unwrap();
    let answer =
        envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse::decode(&answer[..])
            .unwrap();
    assert_eq!(answer.overall_code, OK);
    assert_eq!(answer.statuses.len(), 1);
    server.stop().await;
}
