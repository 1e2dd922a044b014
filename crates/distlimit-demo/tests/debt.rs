//! `/api/generate` of the built binary: tokens charged from the response (reserve 1, settle
//! with `x-usage-tokens`), debt waited out, and three processes reporting on one Redis.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::{Duration, Instant};

use distlimit_core::{Key, Limit, Quota, Request, StateName, Store};
use distlimit_redis::RedisStore;
use http::StatusCode;
use support::{DemoProcess, Http, redis_url, tokens_policy_file as policy_file, unique};

/// A user whose answer used 40 tokens of a quota of 10 per second (burst 10) is in debt: the
/// next request is denied with a `Retry-After` that matches the debt (30 tokens of debt, then
/// one token: 3.1 s after the settle), denied still just before, admitted just after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_over_the_quota_waits_out_the_debt() {
    let dir = tempfile::tempdir().unwrap();
    let policy = policy_file(
        dir.path(),
        r#"tiers = [{ name = "second", algorithm = "token_bucket", limit = 10, per = "1s" }]"#,
    );
    let demo = DemoProcess::start(&["--policy", &policy]);
    let http = Http::new();
    let user = unique("debt-user");

    let used = http
        .get(demo.addr, "/api/generate?tokens=40", Some(&user))
        .await;
    assert_eq!(used.status, StatusCode::OK, "{}", used.body);
    assert_eq!(used.headers["x-usage-tokens"], "40");
    // The settle is sent when the body ends; the reply was read whole.
    let settled = Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let denied = http
        .get(demo.addr, "/api/generate?tokens=1", Some(&user))
        .await;
    assert_eq!(
        denied.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        denied.body
    );
    // 3.1 s after the settle, asked 0.2 s after it: 2.9 s, rounded up.
    assert_eq!(denied.headers["retry-after"], "3", "{:?}", denied.headers);

    tokio::time::sleep_until((settled + Duration::from_millis(2_700)).into()).await;
    let early = http
        .get(demo.addr, "/api/generate?tokens=1", Some(&user))
        .await;
    assert_eq!(early.status, StatusCode::TOO_MANY_REQUESTS, "still in debt");

    tokio::time::sleep_until((settled + Duration::from_millis(3_500)).into()).await;
    let paid = http
        .get(demo.addr, "/api/generate?tokens=1", Some(&user))
        .await;
    assert_eq!(
        paid.status,
        StatusCode::OK,
        "the debt is paid: {}",
        paid.body
    );

    // Another user was never affected.
    let other = http
        .get(demo.addr, "/api/generate?tokens=1", Some(&unique("other")))
        .await;
    assert_eq!(other.status, StatusCode::OK);
    // Bad input is a typed 400, never a 5xx.
    let bad = http
        .get(
            demo.addr,
            "/api/generate?delay_ms=10001",
            Some(&unique("bad")),
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(
        bad.body
            .contains("delay_ms must be an integer from 0 to 10000"),
        "{}",
        bad.body
    );
}

/// Three processes on one Redis, 8 clients each sending a user's requests reporting random
/// token counts at once: what Redis holds for the user is exactly the sum of the tokens the
/// admitted requests reported, debt included (a burst of 20 000 that the reports exceed; one
/// token a day refills nothing measurable). Denied requests reported nothing and charged
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_reporting_on_one_redis_charge_the_exact_sum() {
    let Some(url) = redis_url() else { return };
    let dir = tempfile::tempdir().unwrap();
    let policy = policy_file(
        dir.path(),
        r#"tiers = [{ name = "day", algorithm = "token_bucket", limit = 1, per = "24h", burst = 20000 }]"#,
    );
    let args = [
        "--redis",
        &url,
        "--policy",
        &policy,
        "--instances",
        "3",
        "--redis-budget-ms",
        "10000",
    ];
    let demos = [
        DemoProcess::start(&args),
        DemoProcess::start(&args),
        DemoProcess::start(&args),
    ];
    let http = Http::new();
    let user = unique("three-user");

    let mut tasks = Vec::new();
    for client in 0..24u64 {
        let (http, user) = (http.clone(), user.clone());
        let addr = demos[(client % 3) as usize].addr;
        tasks.push(tokio::spawn(async move {
            // A small deterministic generator per client: random-looking token counts.
            let mut x = client.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let (mut reported, mut admitted, mut denied) = (0u64, 0u64, 0u64);
            for _ in 0..20 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let tokens = x % 300;
                let path = format!("/api/generate?tokens={tokens}&delay_ms={}", x % 5);
                let reply = http.get(addr, &path, Some(&user)).await;
                match reply.status {
                    StatusCode::OK => {
                        reported += tokens;
                        admitted += 1;
                    }
                    StatusCode::TOO_MANY_REQUESTS => denied += 1,
                    other => panic!("{other}: {}", reply.body),
                }
            }
            (reported, admitted, denied)
        }));
    }
    let (mut reported, mut admitted, mut denied) = (0, 0, 0);
    for task in tasks {
        let (r, a, d) = task.await.unwrap();
        (reported, admitted, denied) = (reported + r, admitted + a, denied + d);
    }
    assert!(
        admitted > 0 && denied > 0,
        "the reports must run into debt: {admitted} admitted, {denied} denied, {reported} reported"
    );
    // The settles are sent when the bodies end: give them a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Read what Redis holds through a peek of the same state: with one token a day, the units
    // refilled during the test are far below one token, so the tokens charged, rounded up, are
    // exact. reset_after = the deficit in µs (one unit of 1/P' token refills per µs).
    let store = RedisStore::connect(&url).await.unwrap();
    let limit = Limit::token_bucket(Quota::from_parts(1, 24 * 3_600_000_000, 20_000).unwrap());
    let state = StateName::of_tier("tokens", "day").unwrap();
    let peek = store
        .decide(&Request::peek(Key::new(&user).unwrap(), limit).with_state(&state))
        .await
        .unwrap();
    let per_token = 24 * 3_600_000_000u64;
    let charged = peek.reset_after_us().div_ceil(per_token);
    assert_eq!(
        charged, reported,
        "Redis holds {charged} tokens, the admitted requests reported {reported} ({admitted} admitted, {denied} denied)"
    );
}
