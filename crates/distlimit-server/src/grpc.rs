//! Envoy's rate limit service, v3: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
//! on the messages of the `envoy-types` crate (generated from Envoy's published protos).

use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ResponseUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus as PbStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use envoy_types::pb::google::protobuf::UInt64Value;
use http_body_util::BodyExt;
use tonic::codegen::Body;
use tonic::codegen::{BoxFuture, Context, Poll, Service, StdError, http};
use tonic::server::NamedService;
use tonic::{Request, Response, Status};

use crate::answer::{self, HeaderNames, ResponseSettings};
use crate::check::{
    CheckError, CheckRequest, CheckResponse, Checker, Descriptor, DescriptorStatus, LimitOverride,
    REPORT_ENTRY,
};
use crate::config::Unit;
use crate::metrics::{Protocol, RequestResult};
use distlimit_core::SettleKind;

/// The gRPC service: Envoy's `RateLimitService` answered by a [`Checker`].
#[derive(Clone, Debug)]
pub struct RateLimitGrpc {
    checker: Arc<Checker>,
    settings: ResponseSettings,
}

impl RateLimitGrpc {
    /// The service on `checker`, its answers completed as `settings` say (the rate-limit
    /// response headers, see [`CheckResponse::headers`]; the dynamic metadata).
    pub fn new(checker: Arc<Checker>, settings: ResponseSettings) -> Self {
        Self { checker, settings }
    }

    /// The tonic server of this service: `ShouldRateLimit` decoded with bytes where Envoy's
    /// protos say `string` (see [`RlsServer`]).
    pub fn into_server(self) -> RlsServer {
        RlsServer(Arc::new(self))
    }
}

/// The gRPC server of [`RateLimitGrpc`], named as Envoy's `RateLimitService`.
///
/// It decodes a request's domain and entries as bytes, so a client's invalid UTF-8 is decided
/// instead of failing the whole call (prost's `string` decoding answers `INTERNAL`, which Envoy
/// lets through): each invalid sequence is read as U+FFFD (`String::from_utf8_lossy`) before
/// matching and counting, so values that differ only in invalid bytes share a counter.
#[derive(Clone, Debug)]
pub struct RlsServer(Arc<RateLimitGrpc>);

impl NamedService for RlsServer {
    const NAME: &'static str = <RateLimitServiceServer<RateLimitGrpc> as NamedService>::NAME;
}

/// `RateLimitRequest` with bytes for its strings (the same wire format).
#[derive(Clone, PartialEq, prost::Message)]
struct RawRequest {
    #[prost(bytes = "vec", tag = "1")]
    domain: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<RawDescriptor>,
    #[prost(uint32, tag = "3")]
    hits_addend: u32,
}

/// `RateLimitDescriptor` with bytes for its entries.
#[derive(Clone, PartialEq, prost::Message)]
struct RawDescriptor {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<RawEntry>,
    #[prost(message, optional, tag = "2")]
    limit: Option<RateLimitOverride>,
    #[prost(message, optional, tag = "3")]
    hits_addend: Option<UInt64Value>,
    #[prost(bool, tag = "4")]
    is_negative_hits: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawEntry {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

impl From<RawRequest> for RateLimitRequest {
    fn from(raw: RawRequest) -> Self {
        RateLimitRequest {
            domain: lossy(raw.domain),
            descriptors: raw
                .descriptors
                .into_iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| Entry {
                            key: lossy(e.key),
                            value: lossy(e.value),
                        })
                        .collect(),
                    limit: d.limit,
                    hits_addend: d.hits_addend,
                    is_negative_hits: d.is_negative_hits,
                })
                .collect(),
            hits_addend: raw.hits_addend,
        }
    }
}

/// The path of `ShouldRateLimit`.
pub(crate) const SHOULD_RATE_LIMIT: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The largest request message, as tonic's default (`RESOURCE_EXHAUSTED` past it).
const MAX_REQUEST_MESSAGE: usize = 4 * 1024 * 1024;

/// The 5-byte prefix of a gRPC message: the compressed flag and the length.
const PREFIX: usize = 5;

impl RlsServer {
    /// One `ShouldRateLimit` call, framed as gRPC's unary calls are (one length-prefixed
    /// message each way, the status in trailers; an error as a trailers-only answer), without
    /// tonic's generic streaming codec: the request is read from its body frames, decoded, and
    /// the answer is encoded into one buffer that leaves as one data frame.
    async fn should_rate_limit<B>(
        self,
        request: http::Request<B>,
    ) -> http::Response<tonic::body::Body>
    where
        B: Body + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        // Written out, not one async block with `?`: the nested future was moved whole once
        // more per request (about 200 more instructions of memcpy, callgrind).
        let message = match read_unary(request).await {
            Ok(message) => message,
            Err(status) => return status.into_http(),
        };
        let request = match <RawRequest as prost::Message>::decode(&message[PREFIX..]) {
            Ok(raw) => Request::new(RateLimitRequest::from(raw)),
            Err(error) => {
                return Status::internal(format!("failed to decode the request: {error}"))
                    .into_http();
            }
        };
        match self.0.should_rate_limit(request).await {
            Ok(response) => unary_response(response.get_ref()),
            Err(status) => status.into_http(),
        }
    }
}

/// The one message of a unary request, with its prefix: `UNIMPLEMENTED` for a compressed one
/// (no encoding is enabled), `RESOURCE_EXHAUSTED` past [`MAX_REQUEST_MESSAGE`], `INTERNAL`
/// without a whole message.
async fn read_unary<B>(request: http::Request<B>) -> Result<Bytes, Status>
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    if let Some(encoding) = request.headers().get("grpc-encoding")
        && encoding.as_bytes() != b"identity"
    {
        return Err(Status::unimplemented(format!(
            "Content is compressed with `{}` which isn't supported",
            String::from_utf8_lossy(encoding.as_bytes())
        )));
    }
    let mut body = std::pin::pin!(request.into_body());
    let mut message = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| Status::from_error(error.into()))?;
        if let Ok(data) = frame.into_data() {
            if message.len() + data.remaining() > PREFIX + MAX_REQUEST_MESSAGE {
                return Err(too_large(message.len() + data.remaining() - PREFIX));
            }
            message.put(data);
        }
    }
    if message.len() < PREFIX {
        return Err(Status::internal("Missing request message."));
    }
    if message[0] != 0 {
        return Err(Status::internal(
            "protocol error: received message with compressed-flag but no grpc-encoding was specified",
        ));
    }
    let len = u32::from_be_bytes([message[1], message[2], message[3], message[4]]) as usize;
    if len > MAX_REQUEST_MESSAGE {
        return Err(too_large(len));
    }
    if message.len() < PREFIX + len {
        return Err(Status::internal("Missing request message."));
    }
    message.truncate(PREFIX + len);
    Ok(message.freeze())
}

fn too_large(len: usize) -> Status {
    Status::resource_exhausted(format!(
        "Error, decoded message length too large: found {len} bytes, the limit is: \
         {MAX_REQUEST_MESSAGE} bytes"
    ))
}

/// A unary answer: `content-type: application/grpc`, `message` length-prefixed in one data
/// frame, then `grpc-status: 0`.
fn unary_response(message: &RateLimitResponse) -> http::Response<tonic::body::Body> {
    let len = prost::Message::encoded_len(message);
    let mut data = BytesMut::with_capacity(PREFIX + len);
    data.put_u8(0);
    // A response is a few hundred bytes: its length fits.
    data.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    prost::Message::encode_raw(message, &mut data);
    let mut response = http::Response::new(tonic::body::Body::new(UnaryBody::Data(data.freeze())));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// The body of a unary answer: its message, then the OK status.
enum UnaryBody {
    Data(Bytes),
    Trailers,
    Done,
}

impl Body for UnaryBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        match std::mem::replace(&mut *self, UnaryBody::Done) {
            UnaryBody::Data(data) => {
                *self = UnaryBody::Trailers;
                Poll::Ready(Some(Ok(http_body::Frame::data(data))))
            }
            UnaryBody::Trailers => {
                let mut trailers = http::HeaderMap::with_capacity(1);
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))))
            }
            UnaryBody::Done => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, UnaryBody::Done)
    }
}

impl<B> Service<http::Request<B>> for RlsServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let inner = Arc::clone(&self.0);
        match request.uri().path() {
            SHOULD_RATE_LIMIT => {
                Box::pin(async move { Ok(RlsServer(inner).should_rate_limit(request).await) })
            }
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimitGrpc {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let request = request.into_inner();
        let observe = |result| {
            self.checker.observe_request(
                Protocol::grpc,
                &request.domain,
                result,
                started.elapsed(),
            );
        };
        let check = to_check(&request).inspect_err(|_| observe(RequestResult::invalid))?;
        let answer = self.checker.check(&check).await;
        observe(RequestResult::of(&answer));
        let answer = answer.map_err(to_status)?;
        let mut response = to_response(&answer, self.settings.headers.as_ref());
        if self.settings.dynamic_metadata {
            response.dynamic_metadata = Some(answer::dynamic_metadata(&request, &answer));
        }
        Ok(Response::new(response))
    }
}

/// Reads an Envoy request.
///
/// # Errors
///
/// `INVALID_ARGUMENT` for a limit override without a known unit, or negative hits.
pub fn to_check(request: &RateLimitRequest) -> Result<CheckRequest<'_>, Status> {
    let descriptors = request
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, d)| to_descriptor(i, d))
        .collect::<Result<Vec<_>, Status>>()?;
    Ok(CheckRequest {
        domain: &request.domain,
        descriptors,
        hits: u64::from(request.hits_addend),
    })
}

fn to_descriptor(i: usize, d: &RateLimitDescriptor) -> Result<Descriptor<'_>, Status> {
    let report = d.entries.iter().any(|e| e.key == REPORT_ENTRY);
    let settle = match (d.is_negative_hits, report) {
        (false, false) => None,
        (false, true) => Some(SettleKind::Report),
        (true, false) => Some(SettleKind::GiveBack),
        (true, true) => {
            return Err(Status::invalid_argument(format!(
                "descriptor {i}: a report ({REPORT_ENTRY}) with is_negative_hits"
            )));
        }
    };
    let limit = match &d.limit {
        None => None,
        Some(o) => Some(LimitOverride {
            requests_per_unit: o.requests_per_unit,
            unit: override_unit(o.unit).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "descriptor {i}: the limit override has no valid unit ({})",
                    o.unit
                ))
            })?,
        }),
    };
    Ok(Descriptor {
        entries: d
            .entries
            .iter()
            .filter(|e| e.key != REPORT_ENTRY)
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect(),
        limit,
        hits: d.hits_addend.map(|h| h.value),
        settle,
    })
}

fn override_unit(unit: i32) -> Option<Unit> {
    match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Second => Some(Unit::Second),
        RateLimitUnit::Minute => Some(Unit::Minute),
        RateLimitUnit::Hour => Some(Unit::Hour),
        RateLimitUnit::Day => Some(Unit::Day),
        RateLimitUnit::Month => Some(Unit::Month),
        RateLimitUnit::Year => Some(Unit::Year),
        RateLimitUnit::Unknown => None,
    }
}

fn response_unit(unit: Option<Unit>) -> ResponseUnit {
    match unit {
        None => ResponseUnit::Unknown,
        Some(Unit::Second) => ResponseUnit::Second,
        Some(Unit::Minute) => ResponseUnit::Minute,
        Some(Unit::Hour) => ResponseUnit::Hour,
        Some(Unit::Day) => ResponseUnit::Day,
        Some(Unit::Week) => ResponseUnit::Week,
        Some(Unit::Month) => ResponseUnit::Month,
        Some(Unit::Year) => ResponseUnit::Year,
    }
}

/// The gRPC status of an error: `INVALID_ARGUMENT` or `UNAVAILABLE`.
pub fn to_status(error: CheckError) -> Status {
    match error {
        CheckError::InvalidArgument(message) => Status::invalid_argument(message),
        CheckError::Unavailable(error) => Status::unavailable(error.to_string()),
    }
}

/// Writes an answer as Envoy reads it; with `headers`, the rate-limit headers under those
/// names.
pub fn to_response(answer: &CheckResponse, headers: Option<&HeaderNames>) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code(answer.over_limit),
        statuses: answer.statuses.iter().map(to_status_message).collect(),
        response_headers_to_add: headers.map_or_else(Vec::new, |names| {
            let headers = answer.headers().into_iter();
            headers
                .map(|(key, value)| HeaderValue {
                    key: names.name(key).to_owned(),
                    value,
                    ..HeaderValue::default()
                })
                .collect()
        }),
        ..RateLimitResponse::default()
    }
}

/// `OVER_LIMIT` or `OK`.
fn code(over_limit: bool) -> i32 {
    if over_limit {
        Code::OverLimit
    } else {
        Code::Ok
    }
    .into()
}

fn to_status_message(status: &DescriptorStatus) -> PbStatus {
    PbStatus {
        code: code(status.over_limit),
        current_limit: status.current_limit.as_ref().map(|l| RateLimit {
            name: l.name.clone(),
            requests_per_unit: l.requests_per_unit,
            unit: response_unit(l.unit) as i32,
        }),
        limit_remaining: status.limit_remaining,
        duration_until_reset: status.duration_until_reset.map(|d| PbDuration {
            seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
        }),
        ..PbStatus::default()
    }
}
