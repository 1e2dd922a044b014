#![doc = include_str!("../README.md")]

mod body;
mod client_ip;
mod future;
pub mod headers;
mod in_flight;
mod key;
mod layer;
mod policy;
mod request;
pub mod response;
mod settle;
mod stream;

pub use body::RateLimitBody;
pub use client_ip::{ClientIp, ClientIpResolver, ForwardedHeader, IpKey, TrustedProxies};
pub use distlimit_core::{Quota, QuotaError};
pub use distlimit_policy::{Cidr, CidrError};
pub use future::ResponseFuture;
pub use headers::RateLimitHeaders;
pub use in_flight::{
    InFlight, InFlightBody, InFlightFuture, InFlightLayer, InFlightLayerBuilder, OnFull,
};
pub use ipnet::IpNet;
pub use key::{DEFAULT_MAX_HEADER_KEY_LEN, KeyExtractor};
pub use layer::{DEFAULT_TIMEOUT, OnError, RateLimit, RateLimitLayer, RateLimitLayerBuilder};
pub use policy::{PolicySelector, RouteTable};
pub use request::{PeerAddr, RequestInfo};
pub use settle::{Settle, Usage};
pub use stream::{DEFAULT_BLOCK, Exhausted, Meter, Stop, StopReason};
