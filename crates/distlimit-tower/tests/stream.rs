//! Streaming settlement (`Settle::streamed`): a body metered frame by frame, each frame
//! covered by blocks reserved through the store; stopped at the budget with a final frame, or
//! run on as debt; the unused block given back when the stream ends, is dropped or fails; a
//! store failure answered by the layer's `OnError`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use distlimit_core::{Observer, StreamEvent};
use distlimit_memory::MemoryStore;
use distlimit_policy::{Limiter, PolicySet};
use distlimit_test::{Fault, FaultKind, FaultyStore};
use distlimit_tower::{
    Exhausted, KeyExtractor, Meter, OnError, PeerAddr, RateLimitLayer, Settle, Stop, StopReason,
};
use http::{HeaderName, Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tower::{Layer, ServiceExt};

const USER: HeaderName = HeaderName::from_static("x-user-id");

/// A body of scripted frames: SSE tokens, then optionally an error.
#[derive(Clone)]
struct Frames(VecDeque<Result<Bytes, &'static str>>);

impl Frames {
    /// `n` SSE frames of one `data:` line each, then an `event: done` (free).
    fn tokens(n: usize) -> Self {
        let mut frames: VecDeque<_> = (0..n)
            .map(|i| Ok(Bytes::from(format!("data: t{i}\n\n"))))
            .collect();
        frames.push_back(Ok(Bytes::from_static(b"event: done\ndata: {}\n\n")));
        Self(frames)
    }
}

impl Body for Frames {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(
            self.0
                .pop_front()
                .map(|f| f.map(Frame::data).map_err(std::io::Error::other)),
        )
    }
}

/// The stream events reported, in order.
#[derive(Default)]
struct Recorder(Mutex<Vec<(StreamEvent, u64)>>);

impl Observer for Recorder {
    fn on_stream(&self, policy: &str, event: StreamEvent, units: u64) {
        assert_eq!(policy, "tokens");
        self.0.lock().unwrap().push((event, units));
    }
}

impl Recorder {
    fn units(&self, event: StreamEvent) -> Vec<u64> {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|(e, _)| *e == event)
            .map(|e| e.1)
            .collect()
    }
}

/// `budget` tokens an hour (nothing refills while a test runs), `extra` lines added to the
/// policy.
fn policies(budget: u64, extra: &str) -> PolicySet {
    PolicySet::from_toml_str(&format!(
        "[[policy]]\nname = \"tokens\"\n{extra}\ntiers = [{{ name = \"hour\", algorithm = \"token_bucket\", limit = {budget}, per = \"1h\" }}]\n"
    ))
    .unwrap()
}

struct Setup {
    limiter: Arc<Limiter>,
    recorder: Arc<Recorder>,
    layer: RateLimitLayer,
}

fn setup(store: Arc<dyn distlimit_core::Store>, policies: PolicySet, settle: Settle) -> Setup {
    setup_with(store, policies, settle, OnError::default())
}

fn setup_with(
    store: Arc<dyn distlimit_core::Store>,
    policies: PolicySet,
    settle: Settle,
    on_error: OnError,
) -> Setup {
    let recorder = Arc::new(Recorder::default());
    let limiter = Arc::new(Limiter::new(store, policies).with_observer(recorder.clone()));
    let layer = RateLimitLayer::builder(limiter.clone(), "tokens")
        .key(KeyExtractor::header(USER))
        .settle(settle)
        .on_error(on_error)
        .build();
    Setup {
        limiter,
        recorder,
        layer,
    }
}

fn request() -> Request<()> {
    let mut request = Request::get("/").header(USER, "alice").body(()).unwrap();
    request
        .extensions_mut()
        .insert(PeerAddr(SocketAddr::from(([127, 0, 0, 1], 1))));
    request
}

/// The response to one request whose handler streams `frames`.
async fn respond(
    layer: &RateLimitLayer,
    frames: Frames,
) -> Response<distlimit_tower::RateLimitBody<Frames>> {
    let service = layer.layer(tower::service_fn(move |_req: Request<()>| {
        let frames = frames.clone();
        async move { Ok::<_, std::convert::Infallible>(Response::new(frames)) }
    }));
    service.oneshot(request()).await.unwrap()
}

/// The data frames of a body read to its end.
async fn read_all<B>(body: B) -> Vec<Bytes>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let mut body = body;
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            frames.push(data);
        }
    }
    frames
}

/// Tokens left for alice, once the settle task ran.
async fn left(limiter: &Limiter) -> u64 {
    tokio::time::sleep(Duration::from_millis(50)).await;
    let verdict = limiter.peek("tokens", b"alice").await.unwrap();
    verdict.decision().remaining()
}

#[tokio::test]
async fn frames_are_covered_by_blocks_and_the_rest_given_back() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let s = setup(
        store.clone(),
        policies(1000, ""),
        Settle::streamed(Meter::sse()).estimate(1).block(10),
    );
    let response = respond(&s.layer, Frames::tokens(25)).await;
    let frames = read_all(response.into_body()).await;
    assert_eq!(frames.len(), 26, "25 tokens and the done event");
    assert!(frames[25].starts_with(b"event: done"));
    // The estimate covers the first token, then blocks of 10: 11, 21, 31 reserved.
    assert_eq!(s.recorder.units(StreamEvent::Reserved), [10, 10, 10]);
    assert_eq!(s.recorder.units(StreamEvent::Metered), [25]);
    assert_eq!(s.recorder.units(StreamEvent::Returned), [6]);
    assert_eq!(left(&s.limiter).await, 1000 - 25);
    // The admission, three blocks, the give-back (and the peek).
    assert_eq!(store.calls(), 1 + 3 + 1 + 1);
}

#[tokio::test]
async fn at_the_budget_the_stream_stops_with_a_final_frame() {
    let s = setup(
        Arc::new(MemoryStore::new()),
        policies(15, ""),
        Settle::streamed(Meter::sse()).estimate(1).block(10),
    );
    let response = respond(&s.layer, Frames::tokens(100)).await;
    let frames = read_all(response.into_body()).await;
    // Exactly the budget: 15 tokens, then the limit event; the 16th was never sent.
    assert_eq!(frames.len(), 16, "{frames:?}");
    assert!(frames[..15].iter().all(|f| f.starts_with(b"data: t")));
    let last = std::str::from_utf8(&frames[15]).unwrap();
    assert!(
        last.starts_with("event: limit\ndata: {\"reason\":\"budget\",\"retry_after\":"),
        "{last}"
    );
    assert!(last.contains("\nretry: "), "{last}");
    // 1 + 10, then 10 refused with 4 left: 4 asked again and granted; then none left.
    assert_eq!(s.recorder.units(StreamEvent::Reserved), [10, 4]);
    assert_eq!(s.recorder.units(StreamEvent::Stopped), [1]);
    assert_eq!(s.recorder.units(StreamEvent::Returned), Vec::<u64>::new());
    assert_eq!(left(&s.limiter).await, 0);
}

#[tokio::test]
async fn two_streams_of_one_key_together_deliver_the_budget() {
    let s = setup(
        Arc::new(MemoryStore::new()),
        policies(50, ""),
        Settle::streamed(Meter::sse()).estimate(1).block(10),
    );
    let mut bodies = [
        respond(&s.layer, Frames::tokens(100)).await.into_body(),
        respond(&s.layer, Frames::tokens(100)).await.into_body(),
    ];
    let mut tokens = [0, 0];
    let mut open = [true, true];
    // Frame by frame, in turn: each stream's blocks are taken between the other's.
    while open.iter().any(|o| *o) {
        for (i, body) in bodies.iter_mut().enumerate() {
            if !open[i] {
                continue;
            }
            match body.frame().await {
                Some(frame) => {
                    let data = frame.unwrap().into_data().unwrap();
                    tokens[i] += usize::from(data.starts_with(b"data: t"));
                }
                None => open[i] = false,
            }
        }
    }
    assert_eq!(tokens[0] + tokens[1], 50, "{tokens:?}");
    assert!(tokens[0] > 10 && tokens[1] > 10, "{tokens:?}");
    assert_eq!(s.recorder.units(StreamEvent::Stopped), [1, 1]);
    assert_eq!(left(&s.limiter).await, 0);
}

#[tokio::test]
async fn a_stop_frame_of_the_service_and_an_empty_one() {
    let settle = Settle::streamed(Meter::bytes())
        .estimate(0)
        .block(4)
        .on_exhausted(Exhausted::stop(|stop: &Stop| {
            assert_eq!(stop.reason, StopReason::Budget);
            Bytes::from_static(b"[cut]")
        }));
    let s = setup(Arc::new(MemoryStore::new()), policies(10, ""), settle);
    let frames = Frames(
        ["abcd", "efgh", "ijkl"]
            .into_iter()
            .map(|f| Ok(Bytes::from(f)))
            .collect(),
    );
    let response = respond(&s.layer, frames.clone()).await;
    let body: Vec<_> = read_all(response.into_body()).await;
    assert_eq!(body, ["abcd", "efgh", "[cut]"]);

    let settle = Settle::streamed(Meter::bytes())
        .estimate(0)
        .on_exhausted(Exhausted::stop(|_: &Stop| Bytes::new()));
    let s = setup(Arc::new(MemoryStore::new()), policies(10, ""), settle);
    let response = respond(&s.layer, frames).await;
    assert_eq!(read_all(response.into_body()).await, ["abcd", "efgh"]);
}

#[tokio::test]
async fn a_dropped_stream_gives_back_its_unused_block() {
    let s = setup(
        Arc::new(MemoryStore::new()),
        policies(1000, ""),
        Settle::streamed(Meter::sse()).estimate(1).block(100),
    );
    let response = respond(&s.layer, Frames::tokens(500)).await;
    let mut body = response.into_body();
    for _ in 0..30 {
        body.frame().await.unwrap().unwrap();
    }
    drop(body);
    // 101 reserved, 30 sent: 71 back.
    assert_eq!(s.recorder.units(StreamEvent::Returned), [71]);
    assert_eq!(left(&s.limiter).await, 1000 - 30);
}

#[tokio::test]
async fn a_block_still_being_reserved_when_the_stream_is_dropped_goes_back() {
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let s = setup(
        store.clone(),
        policies(1000, ""),
        Settle::streamed(Meter::sse()).estimate(1).block(10),
    );
    // The admission passes; the first block takes 100 ms.
    store.extend([Fault::Pass, Fault::Delay(Duration::from_millis(100))]);
    let response = respond(&s.layer, Frames::tokens(50)).await;
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    let waiting = tokio::time::timeout(Duration::from_millis(10), body.frame()).await;
    assert!(waiting.is_err(), "the second token waits for its block");
    drop(body);
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Granted after the drop, then given back: one token charged.
    assert_eq!(s.recorder.units(StreamEvent::Returned), [10]);
    assert_eq!(left(&s.limiter).await, 1000 - 1);
}

#[tokio::test]
async fn a_failed_stream_is_charged_what_it_sent() {
    let s = setup(
        Arc::new(MemoryStore::new()),
        policies(1000, ""),
        Settle::streamed(Meter::sse()).block(10),
    );
    let mut frames = Frames::tokens(3);
    frames.0.truncate(3);
    frames.0.push_back(Err("upstream gone"));
    let response = respond(&s.layer, frames).await;
    let mut body = response.into_body();
    for _ in 0..3 {
        body.frame().await.unwrap().unwrap();
    }
    assert!(body.frame().await.unwrap().is_err());
    drop(body);
    assert_eq!(left(&s.limiter).await, 1000 - 3);
}

#[tokio::test]
async fn debt_mode_from_the_policy_runs_on_and_the_next_request_waits() {
    // The layer says stop; the policy says debt, and wins.
    let s = setup(
        Arc::new(MemoryStore::new()),
        policies(20, "overrun = \"debt\""),
        Settle::streamed(Meter::sse()).estimate(1).block(10),
    );
    let response = respond(&s.layer, Frames::tokens(50)).await;
    let frames = read_all(response.into_body()).await;
    assert_eq!(frames.len(), 51, "every token and the done event");
    assert_eq!(s.recorder.units(StreamEvent::Stopped), Vec::<u64>::new());
    assert_eq!(left(&s.limiter).await, 0);
    // 30 tokens of debt (and one for the estimate) at 20 an hour: 93 minutes.
    let denied = respond(&s.layer, Frames::tokens(1)).await;
    assert_eq!(denied.status(), http::StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = denied.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((31 * 180 - 1..=31 * 180).contains(&retry), "{retry}");
}

#[tokio::test]
async fn a_store_failure_mid_stream_follows_on_error() {
    // Fail closed (the default): the stream stops, saying the limiter is unavailable.
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let s = setup(
        store.clone(),
        policies(1000, ""),
        Settle::streamed(Meter::sse()).estimate(5).block(10),
    );
    store.extend([Fault::Pass, Fault::Fail(FaultKind::Unavailable)]);
    let frames = read_all(respond(&s.layer, Frames::tokens(20)).await.into_body()).await;
    assert_eq!(frames.len(), 6, "{frames:?}");
    assert!(
        frames[5]
            .starts_with(b"event: limit\ndata: {\"reason\":\"unavailable\",\"retry_after\":1,")
    );
    assert_eq!(left(&s.limiter).await, 1000 - 5);

    // Fail open: the rest passes unmetered.
    let store = Arc::new(FaultyStore::new(MemoryStore::new()));
    let s = setup_with(
        store.clone(),
        policies(1000, ""),
        Settle::streamed(Meter::sse()).estimate(5).block(10),
        OnError::FailOpen,
    );
    store.extend([Fault::Pass, Fault::Fail(FaultKind::Unavailable)]);
    let frames = read_all(respond(&s.layer, Frames::tokens(20)).await.into_body()).await;
    assert_eq!(frames.len(), 21);
    assert_eq!(s.recorder.units(StreamEvent::Metered), [5]);
    assert_eq!(left(&s.limiter).await, 1000 - 5);
}

#[test]
fn the_sse_meter_counts_tokens() {
    let sse = Meter::sse();
    assert_eq!(sse.units(b"data: a\n\n"), 1);
    assert_eq!(sse.units(b"data: a\ndata: b\n\ndata: c\n\n"), 3);
    assert_eq!(sse.units(b"data: a\r\n\r\n"), 1);
    assert_eq!(sse.units(b"data: [DONE]\n\n"), 0);
    assert_eq!(sse.units(b"event: message\ndata: a\n\n"), 1);
    assert_eq!(sse.units(b"event: done\ndata: {}\n\n"), 0);
    assert_eq!(sse.units(b"tokens: 7\ndata: abc\n\n"), 7);
    assert_eq!(sse.units(b": comment\nid: 3\n\n"), 0);
    assert_eq!(sse.units(b""), 0);
}
