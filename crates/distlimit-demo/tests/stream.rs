//! `/api/generate?stream=1` of the built binary: tokens metered as they stream (one per
//! `data:` line), covered by blocks reserved before they are sent: stopped at the budget with an
//! `event: limit`, within the budget across three processes on one Redis, the unused block
//! given back when the client leaves, and run on as debt when the policy says so.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use http::StatusCode;
use support::{DemoProcess, Http, redis_url, unique};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A policy file with policy `tokens` of `budget` tokens an hour (nothing measurable refills
/// while a test runs), plus `extra` lines.
fn policy_file(dir: &std::path::Path, budget: u64, extra: &str) -> String {
    support::tokens_policy_file(
        dir,
        &format!(
            "{extra}\ntiers = [{{ name = \"hour\", algorithm = \"token_bucket\", limit = {budget}, per = \"1h\" }}]"
        ),
    )
}

/// The tokens of a streamed answer.
fn tokens(body: &str) -> usize {
    body.lines()
        .filter(|l| l.starts_with("data: token"))
        .count()
}

/// The `retry_after` of the final `event: limit` (panics without one).
fn limit_retry_after(body: &str) -> u64 {
    let (_, event) = body
        .split_once("event: limit\ndata: ")
        .unwrap_or_else(|| panic!("no limit event in {body:?}"));
    let (_, rest) = event.split_once("\"retry_after\":").unwrap();
    rest.split(',').next().unwrap().parse().unwrap()
}

/// The value of a series on `/metrics` (0 when absent).
async fn metric(http: &Http, demo: &DemoProcess, series: &str) -> u64 {
    let text = http.get(demo.addr, "/metrics", None).await.body;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

/// A user with 100 tokens left (900 of 1 000 used by an answer that reported them) streams a
/// 1 000-token answer: exactly 100 tokens arrive, then an `event: limit` saying when to retry
/// (a token of 1 000 an hour: 3.6 s); the next request is 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_stops_at_the_budget_with_a_limit_event() {
    let dir = tempfile::tempdir().unwrap();
    let policy = policy_file(dir.path(), 1000, "");
    let demo = DemoProcess::start(&["--policy", &policy]);
    let http = Http::new();
    let user = unique("stream-user");

    let used = http
        .get(demo.addr, "/api/generate?tokens=900", Some(&user))
        .await;
    assert_eq!(used.status, StatusCode::OK, "{}", used.body);
    tokio::time::sleep(Duration::from_millis(100)).await;

    let reply = http
        .get(
            demo.addr,
            "/api/generate?tokens=1000&delay_ms=300&stream=1",
            Some(&user),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    eprintln!("stop: {} tokens of 100 left", tokens(&reply.body));
    assert_eq!(reply.headers["content-type"], "text/event-stream");
    assert_eq!(tokens(&reply.body), 100, "{}", reply.body);
    assert!(!reply.body.contains("event: done"));
    assert_eq!(limit_retry_after(&reply.body), 4, "{}", reply.body);

    let next = http
        .get(demo.addr, "/api/generate?tokens=1&stream=1", Some(&user))
        .await;
    assert_eq!(next.status, StatusCode::TOO_MANY_REQUESTS);
    let stopped = r#"distlimit_stream_stopped_total{policy="tokens"}"#;
    assert_eq!(metric(&http, &demo, stopped).await, 1);
    let units = r#"distlimit_stream_units_total{policy="tokens"}"#;
    assert_eq!(metric(&http, &demo, units).await, 100);
}

/// Two streams of one user at once on two of three processes sharing one Redis, blocks of 10:
/// together they deliver the budget (300 tokens), not more; a third request, on the third
/// process, is 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_on_three_processes_stay_within_the_budget() {
    let Some(url) = redis_url() else { return };
    let dir = tempfile::tempdir().unwrap();
    let policy = policy_file(dir.path(), 300, "");
    let args = [
        "--redis",
        &url,
        "--policy",
        &policy,
        "--instances",
        "3",
        "--redis-budget-ms",
        "10000",
        "--stream-block",
        "10",
    ];
    let demos = [
        DemoProcess::start(&args),
        DemoProcess::start(&args),
        DemoProcess::start(&args),
    ];
    let http = Http::new();
    let user = unique("stream-pair");
    let path = "/api/generate?tokens=1000&delay_ms=600&stream=1";
    let (a, b) = tokio::join!(
        http.get(demos[0].addr, path, Some(&user)),
        http.get(demos[1].addr, path, Some(&user)),
    );
    let (ta, tb) = (tokens(&a.body), tokens(&b.body));
    eprintln!(
        "two streams, three processes: {ta} + {tb} = {} tokens of 300",
        ta + tb
    );
    assert!(
        ta + tb <= 300 && ta + tb >= 290,
        "{ta} + {tb} tokens streamed of a budget of 300"
    );
    assert!(ta > 0 && tb > 0, "both streamed: {ta} and {tb}");
    limit_retry_after(&a.body);
    limit_retry_after(&b.body);
    let third = http
        .get(
            demos[2].addr,
            "/api/generate?tokens=1&stream=1",
            Some(&user),
        )
        .await;
    assert_eq!(
        third.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        third.body
    );
}

/// A client that leaves after 150 tokens of a 1 000-token stream (blocks of 100: 201 reserved
/// by then) is charged about what was sent, not a whole extra block: the unused part goes back,
/// and a second stream of the user gets the rest of the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_gets_the_unused_block_back() {
    let dir = tempfile::tempdir().unwrap();
    let policy = policy_file(dir.path(), 1000, "");
    let demo = DemoProcess::start(&["--policy", &policy]);
    let http = Http::new();
    let user = unique("stream-leaver");

    // A raw connection, dropped mid-stream.
    let mut socket = tokio::net::TcpStream::connect(demo.addr).await.unwrap();
    let request = format!(
        "GET /api/generate?tokens=1000&delay_ms=2000&stream=1 HTTP/1.1\r\nhost: demo\r\nx-user-id: {user}\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let received = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let n = socket.read(&mut buf).await.unwrap();
            assert!(n > 0, "the stream ended early");
            seen.extend_from_slice(&buf[..n]);
            let received = tokens(&String::from_utf8_lossy(&seen));
            if received >= 150 {
                return received;
            }
        }
    })
    .await
    .unwrap();
    drop(socket);
    // The server notices at its next write (a token every 2 ms), then settles.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let returned = r#"distlimit_stream_blocks_total{policy="tokens",event="returned"}"#;
    assert_eq!(metric(&http, &demo, returned).await, 1);

    let rest = http
        .get(
            demo.addr,
            "/api/generate?tokens=1000&delay_ms=100&stream=1",
            Some(&user),
        )
        .await;
    let second = tokens(&rest.body);
    // Charged what was sent: at least what arrived, and only the few tokens in flight more.
    let charged = 1000 - second;
    eprintln!("disconnect: {received} received, {charged} charged (blocks of 100)");
    assert!(
        charged >= received && charged <= received + 20,
        "{received} tokens received, {charged} charged"
    );
}

/// A policy with `overrun = "debt"`: a 1 000-token stream of a user with 100 tokens runs to
/// its end (`event: done`), and the 900 over the budget are debt the next request waits out
/// (901 tokens at 100 an hour: about 9 hours).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debt_mode_finishes_the_stream_and_the_next_request_waits() {
    let dir = tempfile::tempdir().unwrap();
    let policy = policy_file(dir.path(), 100, "overrun = \"debt\"");
    let demo = DemoProcess::start(&["--policy", &policy]);
    let http = Http::new();
    let user = unique("stream-debtor");

    let reply = http
        .get(
            demo.addr,
            "/api/generate?tokens=1000&delay_ms=200&stream=1",
            Some(&user),
        )
        .await;
    eprintln!("debt: {} tokens of 100", tokens(&reply.body));
    assert_eq!(tokens(&reply.body), 1000);
    assert!(
        reply
            .body
            .ends_with("event: done\ndata: {\"tokens\":1000}\n\n"),
        "{}",
        &reply.body[reply.body.len().saturating_sub(200)..]
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let next = http
        .get(demo.addr, "/api/generate?tokens=1&stream=1", Some(&user))
        .await;
    assert_eq!(next.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = next.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    eprintln!("debt: the next request 429, retry-after {retry} s");
    assert!((901 * 36 - 2..=901 * 36).contains(&retry), "{retry}");
}
