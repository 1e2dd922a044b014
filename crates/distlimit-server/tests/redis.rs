//! Several server instances on one real Redis, and a Redis outage.
//!
//! Each test starts its own `redis-server` on a free loopback port; without one it is skipped,
//! unless `DISTLIMIT_REQUIRE_REDIS=1`, which turns the skip into a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use clap::Parser;
use distlimit_server::Args;
use distlimit_test::server::RedisServer;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use support::*;

const LIMIT: u32 = 50;

fn config() -> tempfile::TempDir {
    config_dir(&format!(
        "
domain: shared
descriptors:
  - key: tenant
    rate_limit: {{ unit: hour, requests_per_unit: {LIMIT} }}
"
    ))
}

/// 16 clients, 8 per instance, sending 3 x LIMIT `request`s between them at once: how many
/// were admitted.
async fn race(a: &Running, b: &Running, request: fn() -> RateLimitRequest) -> u32 {
    let mut tasks = Vec::new();
    for c in 0..16u32 {
        let mut client = if c % 2 == 0 {
            a.client().await
        } else {
            b.client().await
        };
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..(3 * LIMIT).div_ceil(16) {
                if call(&mut client, request()).await.overall_code == OK {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_admit_exactly_the_limit() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let dir = config();
    // A budget no debug build on a loaded machine runs out of: this test is about exactness,
    // not about the breaker.
    let flags = [
        "--redis",
        url.as_str(),
        "--instances",
        "2",
        "--redis-budget-ms",
        "5000",
    ];
    let a = Running::with_config(dir.path(), &flags).await;
    let b = Running::with_config(dir.path(), &flags).await;
    align(3_600, Duration::from_secs(10)).await;
    let admitted = race(&a, &b, || {
        request("shared", vec![descriptor(&[("tenant", "t1")])])
    })
    .await;
    assert_eq!(admitted, LIMIT, "{}", a.checker.metrics().encode());
    let metrics = a.checker.metrics().encode();
    assert!(!metrics.contains(r#"source="fallback""#), "{metrics}");
    // The Redis store reports its calls: how many are in flight, decisions per coalesced call.
    assert!(
        metrics.contains(r#"distlimit_store_calls_in_flight{store="redis"}"#),
        "{metrics}"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_is_answered_by_the_fallback_without_errors() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let dir = config();
    let server =
        Running::with_config(dir.path(), &["--redis", url.as_str(), "--instances", "5"]).await;
    let mut client = server.client().await;
    let tenant = || request("shared", vec![descriptor(&[("tenant", "outage")])]);
    assert_eq!(call(&mut client, tenant()).await.overall_code, OK);
    redis.kill();
    // The fallback holds this instance's share: 50 / 5 = 10 per hour.
    let mut codes = Vec::new();
    for _ in 0..15 {
        let answer = client.should_rate_limit(tenant()).await;
        codes.push(
            answer
                .expect("no gRPC error during the outage")
                .into_inner()
                .overall_code,
        );
    }
    assert_eq!(codes.iter().filter(|&&c| c == OK).count(), 10, "{codes:?}");
    let metrics = server.checker.metrics().encode();
    assert!(metrics.contains(r#"source="fallback""#), "{metrics}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_answers_unavailable_while_redis_is_down() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let dir = config();
    let flags = ["--redis", url.as_str(), "--failure-mode", "fail-closed"];
    let server = Running::with_config(dir.path(), &flags).await;
    let mut client = server.client().await;
    let tenant = || request("shared", vec![descriptor(&[("tenant", "closed")])]);
    assert_eq!(call(&mut client, tenant()).await.overall_code, OK);
    redis.kill();
    for _ in 0..3 {
        let status = client.should_rate_limit(tenant()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
    // A request without a limited descriptor needs no store.
    let free = call(
        &mut client,
        request("shared", vec![descriptor(&[("nothing", "x")])]),
    )
    .await;
    assert_eq!(free.overall_code, OK);
    server.stop().await;
}

/// Reads `distlimit_breaker_state` of the Redis store from an instance's metrics.
fn breaker_closed(server: &Running) -> bool {
    server
        .checker
        .metrics()
        .encode()
        .contains(r#"distlimit_breaker_state{store="redis",state="closed"} 1"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_redis_restart_the_instances_share_the_limit_again() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let dir = config();
    let flags = ["--redis", url.as_str(), "--instances", "2"];
    let a = Running::with_config(dir.path(), &flags).await;
    let b = Running::with_config(dir.path(), &flags).await;
    let mut clients = [a.client().await, b.client().await];
    let tenant = |name: &str| request("shared", vec![descriptor(&[("tenant", name)])]);
    redis.kill();
    // The outage: every answer comes from the fallback, never an error, until both breakers
    // open (3 failures in a row over at least 50 ms; bounded: 10 s).
    let started = std::time::Instant::now();
    while breaker_closed(&a) || breaker_closed(&b) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the breakers did not open"
        );
        for client in &mut clients {
            let answer = client.should_rate_limit(tenant("during")).await;
            assert_eq!(
                answer
                    .expect("no error during the outage")
                    .into_inner()
                    .overall_code,
                OK
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let opened = std::time::Instant::now();
    redis.restart().unwrap();
    let down_for = opened.elapsed();
    // Each instance's breaker closes by itself once its probe succeeds: requests keep
    // arriving, as they would from Envoy, until both do (bounded: 20 s).
    let started = std::time::Instant::now();
    while !(breaker_closed(&a) && breaker_closed(&b)) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still not back on Redis: {}",
            a.checker.metrics().encode()
        );
        for client in &mut clients {
            call(client, tenant("probe")).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let back_after = started.elapsed();
    println!(
        "Redis down {down_for:?} after the breakers opened; both instances back on it {back_after:?} after its restart"
    );
    // The cool-off doubles from 100 ms while probes fail: the probe after the restart comes
    // within about as long again as the breaker had been open (a fixed 5 s cool-off took 5 s).
    assert!(
        back_after <= 2 * down_for + Duration::from_millis(500),
        "back on Redis {back_after:?} after a restart {down_for:?} into the outage"
    );
    // Back on one shared count: the two instances admit exactly the limit between them, not
    // twice their fallback share each.
    align(3_600, Duration::from_secs(10)).await;
    let mut admitted = 0;
    for i in 0..2 * LIMIT {
        let answer = call(&mut clients[(i % 2) as usize], tenant("after")).await;
        if answer.overall_code == OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, LIMIT);
    a.stop().await;
    b.stop().await;
}

/// A TOML token bucket of `burst` that does not refill while the test runs (one unit per
/// hour), and one of 100 000 per second, under the domain `leased`.
fn leased_config(burst: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("limits.toml"),
        format!(
            r#"
[[policy]]
name = "scarce"
tiers = [ {{ name = "t", algorithm = "token_bucket", limit = 1, per = "1h", burst = {burst} }} ]

[[policy]]
name = "hot"
tiers = [ {{ name = "t", algorithm = "gcra", limit = 100000, per = "1s" }} ]

[domain.leased]
descriptors = [
  {{ keys = ["scarce"], policy = "scarce" }},
  {{ keys = ["hot"], policy = "hot" }},
]
"#
        ),
    )
    .unwrap();
    dir
}

/// A counter or gauge's value in an instance's metrics (0 when absent).
fn metric(server: &Running, series: &str) -> f64 {
    let text = server.checker.metrics().encode();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_spending_from_leases_admit_exactly_the_limit() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let dir = leased_config(LIMIT);
    let flags = [
        "--redis",
        url.as_str(),
        "--instances",
        "2",
        "--redis-budget-ms",
        "5000",
        "--lease",
        "scarce",
    ];
    let a = Running::with_config(dir.path(), &flags).await;
    let b = Running::with_config(dir.path(), &flags).await;
    let scarce = || request("leased", vec![descriptor(&[("scarce", "k")])]);
    let mut admitted = race(&a, &b, scarce).await;
    assert!(admitted <= LIMIT, "{admitted} admitted of {LIMIT}");
    // Units one instance withdrew and did not spend go back to Redis when its lease ends (a
    // horizon, 100 ms): asked again after that, the two instances admit the rest, and not
    // one more (bounded: 20 rounds).
    let mut clients = [a.client().await, b.client().await];
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let mut round = 0;
        for client in &mut clients {
            for _ in 0..LIMIT {
                if call(client, scarce()).await.overall_code == OK {
                    round += 1;
                }
            }
        }
        admitted += round;
        if round == 0 && admitted == LIMIT {
            break;
        }
    }
    assert_eq!(admitted, LIMIT, "{}", a.checker.metrics().encode());
    for server in [&a, &b] {
        let takes = metric(server, r#"distlimit_lease_takes_total{store="lease"}"#);
        assert!(takes >= 1.0, "{}", server.checker.metrics().encode());
        let metrics = server.checker.metrics().encode();
        assert!(!metrics.contains(r#"source="fallback""#), "{metrics}");
    }
    a.stop().await;
    b.stop().await;
}

/// Scripts run by `redis` so far.
fn script_calls(redis: &RedisServer) -> u64 {
    ["evalsha", "eval"]
        .iter()
        .map(|c| redis.command_calls(c).unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_hot_key_costs_a_fraction_of_a_redis_call_per_request() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let dir = leased_config(LIMIT);
    let flags = ["--redis", url.as_str(), "--redis-budget-ms", "5000"];
    let leased_flags: Vec<&str> = flags.iter().copied().chain(["--lease", "hot"]).collect();
    const REQUESTS: u32 = 1_000;
    let mut calls = Vec::new();
    // The same requests without leases, then with: Redis scripts run for each.
    for flags in [&flags[..], &leased_flags] {
        let server = Running::with_config(dir.path(), flags).await;
        let before = script_calls(&redis);
        let mut client = server.client().await;
        for _ in 0..REQUESTS {
            let answer = call(
                &mut client,
                request("leased", vec![descriptor(&[("hot", "tenant")])]),
            )
            .await;
            assert_eq!(answer.overall_code, OK);
        }
        calls.push(script_calls(&redis) - before);
        server.stop().await;
    }
    // Leases share a limit through Redis: without it, the flag is refused.
    assert!(Args::try_parse_from(["distlimit-server", "--lease", "hot"]).is_err());
    println!(
        "{REQUESTS} requests on a hot key: {} Redis scripts without leases, {} with",
        calls[0], calls[1]
    );
    assert!(calls[0] >= u64::from(REQUESTS), "{calls:?}");
    assert!(
        (1..=u64::from(REQUESTS) / 5).contains(&calls[1]),
        "{} Redis scripts for {REQUESTS} leased requests",
        calls[1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_under_leases_is_answered_by_the_fallback_without_errors() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let dir = leased_config(LIMIT);
    let flags = [
        "--redis",
        url.as_str(),
        "--instances",
        "5",
        "--lease",
        "scarce",
    ];
    let server = Running::with_config(dir.path(), &flags).await;
    let mut client = server.client().await;
    let scarce = || request("leased", vec![descriptor(&[("scarce", "outage")])]);
    assert_eq!(call(&mut client, scarce()).await.overall_code, OK);
    redis.kill();
    // Answers, never a gRPC error, and never more than the limit: what the lease held, then
    // the fallback's share (LIMIT / 5).
    let mut admitted = 1;
    for _ in 0..2 * LIMIT {
        let answer = client
            .should_rate_limit(scarce())
            .await
            .expect("no gRPC error during the outage")
            .into_inner();
        if answer.overall_code == OK {
            admitted += 1;
        }
    }
    println!("{admitted} of {LIMIT} admitted across a Redis outage under leases");
    assert!(
        (LIMIT / 5..=LIMIT).contains(&admitted),
        "{admitted} admitted: {}",
        server.checker.metrics().encode()
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_lowered_by_a_reload_holds_under_leases_as_without() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    // One instance spending leases, one deciding in Redis, each on a key of its own.
    let dir = leased_config(LIMIT);
    let flags = ["--redis", url.as_str(), "--redis-budget-ms", "5000"];
    let leased_flags: Vec<&str> = flags.iter().copied().chain(["--lease", "scarce"]).collect();
    let mut servers = [
        (
            "leased",
            Running::with_config(dir.path(), &leased_flags).await,
        ),
        ("plain", Running::with_config(dir.path(), &flags).await),
    ];
    let scarce = |key: &str| request("leased", vec![descriptor(&[("scarce", key)])]);
    for (key, server) in &servers {
        let mut client = server.client().await;
        for _ in 0..10 {
            assert_eq!(call(&mut client, scarce(key)).await.overall_code, OK);
        }
    }
    // The limit drops from LIMIT to 12 (the config is read again every 50 ms).
    let lowered = leased_config(12);
    std::fs::copy(
        lowered.path().join("limits.toml"),
        dir.path().join("limits.toml"),
    )
    .unwrap();
    let mut admitted = Vec::new();
    for (key, server) in &mut servers {
        assert!(matches!(
            server.next_reload().await,
            distlimit_server::Reload::Applied { .. }
        ));
        let mut client = server.client().await;
        let mut n = 0;
        for _ in 0..LIMIT {
            if call(&mut client, scarce(key)).await.overall_code == OK {
                n += 1;
            }
        }
        admitted.push(n);
    }
    println!("after the limit dropped to 12 with 10 spent: {admitted:?} admitted (leased, plain)");
    assert_eq!(admitted[0], admitted[1], "leases admitted otherwise");
    assert!(admitted[1] <= 2, "{admitted:?}");
    for (_, server) in servers {
        server.stop().await;
    }
}
