//! Store calls and CPU per streamed token of streaming settlement (`Settle::streamed`): a
//! 1 000-token server-sent-events answer through the layer (no network: the body is read in
//! process), on a store wrapper counting calls.
//!
//! ```text
//! # store calls per 1 000-token stream at blocks 1, 10, 100, 1000 (Redis too when
//! # DISTLIMIT_REDIS_URL is set)
//! cargo run --release -p distlimit-tower --example stream_calls
//! # instructions: N streams of 1 000 tokens, block 100, metered or not, on memory (or
//! # Redis: a fourth argument `redis`); per token, the difference of two runs (21 and 1
//! # streams) over the difference of their tokens
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/stream_calls cpu 21 metered [redis]
//! ```

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use distlimit_core::{Decision, Error, Request, Settle as StoreSettle, Store};
use distlimit_memory::MemoryStore;
use distlimit_policy::{Limiter, PolicySet};
use distlimit_tower::{KeyExtractor, Meter, PeerAddr, RateLimitLayer, Settle};
use http::{HeaderName, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tower::{Layer, ServiceExt};

const TOKENS: usize = 1000;
const USER: HeaderName = HeaderName::from_static("x-user-id");

/// A store counting the calls that reach it (a `decide_now` that answers counts; one that
/// defers to `decide` does not, `decide` does).
struct Counting<S> {
    inner: S,
    calls: AtomicU64,
}

impl<S> Counting<S> {
    fn count(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl<S: Store> Store for Counting<S> {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        self.count();
        self.inner.decide(request).await
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        self.count();
        self.inner.decide_all(requests).await
    }

    fn decide_now(&self, request: &Request<'_>) -> Option<Result<Decision, Error>> {
        let answer = self.inner.decide_now(request);
        if answer.is_some() {
            self.count();
        }
        answer
    }

    fn decide_all_now(
        &self,
        requests: &[Request<'_>],
        decisions: &mut [Decision],
    ) -> Option<Result<(), Error>> {
        let answer = self.inner.decide_all_now(requests, decisions);
        if answer.is_some() {
            self.count();
        }
        answer
    }

    async fn settle_all(&self, settles: &[StoreSettle<'_>]) -> Result<Vec<Decision>, Error> {
        self.count();
        self.inner.settle_all(settles).await
    }
}

/// `TOKENS` frames of one `data:` line each.
#[derive(Clone)]
struct Frames(VecDeque<Bytes>);

impl Frames {
    fn new() -> Self {
        Self(
            (0..TOKENS)
                .map(|_| Bytes::from_static(b"data: token\n\n"))
                .collect(),
        )
    }
}

impl Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(|data| Ok(Frame::data(data))))
    }
}

fn limiter(store: Arc<dyn Store>) -> Result<Arc<Limiter>, Box<dyn std::error::Error>> {
    // Never exhausted here: a million tokens an hour.
    let policies = PolicySet::from_toml_str(
        r#"
        [[policy]]
        name = "tokens"
        tiers = [{ name = "hour", algorithm = "token_bucket", limit = 1000000, per = "1h" }]
        "#,
    )?;
    Ok(Arc::new(Limiter::new(store, policies)))
}

/// Streams `streams` answers of `TOKENS` tokens of user `user` through a layer metering them
/// in blocks of `block` (or not metering, `block` `None`); the tokens read.
async fn stream(
    limiter: Arc<Limiter>,
    user: &str,
    block: Option<u64>,
    streams: usize,
) -> Result<usize, Box<dyn std::error::Error>> {
    let builder = RateLimitLayer::builder(limiter, "tokens").key(KeyExtractor::header(USER));
    let layer = match block {
        Some(block) => builder.settle(Settle::streamed(Meter::sse()).estimate(1).block(block)),
        None => builder,
    }
    .build();
    let frames = Frames::new();
    let service = layer.layer(tower::service_fn(move |_req: http::Request<()>| {
        let frames = frames.clone();
        async move { Ok::<_, std::convert::Infallible>(Response::new(frames)) }
    }));
    let mut tokens = 0;
    for _ in 0..streams {
        let mut request = http::Request::get("/").header(USER, user).body(())?;
        request
            .extensions_mut()
            .insert(PeerAddr(SocketAddr::from(([127, 0, 0, 1], 1))));
        let mut body = service.clone().oneshot(request).await?.into_body();
        while let Some(frame) = body.frame().await {
            if frame.map_err(|e| format!("{e:?}"))?.is_data() {
                tokens += 1;
            }
        }
    }
    // The give-back is sent on a task of its own.
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(tokens)
}

async fn calls(name: &str, store: Arc<dyn Store>) -> Result<(), Box<dyn std::error::Error>> {
    for block in [1, 10, 100, 1000] {
        let counting = Arc::new(Counting {
            inner: Arc::clone(&store),
            calls: AtomicU64::new(0),
        });
        let user = format!("user-{}-{block}", std::process::id());
        let tokens = stream(limiter(counting.clone())?, &user, Some(block), 1).await?;
        let calls = counting.calls.load(Ordering::Relaxed);
        eprintln!("{name}: block {block:>4}: {calls:>4} store calls for {tokens} tokens");
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("cpu") => {
            let streams = args.get(1).map_or(Ok(1), |n| n.parse())?;
            let block = match args.get(2).map(String::as_str) {
                Some("unmetered") => None,
                _ => Some(100),
            };
            let store: Arc<dyn Store> = match args.get(3).map(String::as_str) {
                Some("redis") => {
                    let url = std::env::var("DISTLIMIT_REDIS_URL")?;
                    Arc::new(distlimit_redis::RedisStore::connect(&url).await?)
                }
                _ => Arc::new(MemoryStore::new()),
            };
            let user = format!("cpu-{}", std::process::id());
            let tokens = stream(limiter(store)?, &user, block, streams).await?;
            eprintln!("{tokens} tokens in {streams} streams, block {block:?}");
        }
        _ => {
            calls("memory", Arc::new(MemoryStore::new())).await?;
            if let Ok(url) = std::env::var("DISTLIMIT_REDIS_URL") {
                let redis = distlimit_redis::RedisStore::connect(&url).await?;
                calls("redis", Arc::new(redis)).await?;
            }
        }
    }
    Ok(())
}
