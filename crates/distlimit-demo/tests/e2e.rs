//! The built `distlimit-demo` binary, as separate processes: graceful shutdown, and two
//! instances sharing one `redis-server` enforcing one limit together.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;
use distlimit_test::replace_file;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use distlimit_test::server::RedisServer;
use http::StatusCode;
use support::openmetrics::parse;
use support::{
    DemoProcess, ENV_CLUSTER_URLS, ENV_SENTINEL_SERVICE, ENV_SENTINEL_URLS, Http, redis_list,
    redis_url, unique,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_on_the_memory_store_and_stops_on_sigterm() {
    let mut demo = DemoProcess::start(&[]);
    let http = Http::new();
    let reply = http.get(demo.addr, "/api/data", Some("alice")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, r#"{"message":"Success"}"#);
    assert_eq!(
        http.get(demo.addr, "/healthz", None).await.status,
        StatusCode::OK
    );

    let status = demo.terminate();
    assert!(status.success(), "{status:?}\n{}", demo.log().join("\n"));
    assert!(demo.log().iter().any(|line| line.contains("stopped")));
}

/// Per user, a burst of 100 refilled at one token per hour: no refill while a test runs, however
/// slow the machine. Per client IP, more than the tests send.
const SLOW_POLICY: &str = "[[policy]]\nname = \"api\"\ntiers = [{ name = \"burst\", limit = 1, per = \"1h\", burst = 100 }]\n\n[[policy]]\nname = \"api-ip\"\ntiers = [{ name = \"client\", limit = 1000, per = \"1s\", burst = 100000 }]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_redis_enforce_one_limit() {
    let Some(url) = redis_url() else { return };
    two_instances_enforce_one_limit(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_a_cluster_enforce_one_limit() {
    let Some(urls) = redis_list(ENV_CLUSTER_URLS) else {
        return;
    };
    two_instances_enforce_one_limit(&format!("redis+cluster://{}", hosts(&urls))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_a_sentinel_primary_enforce_one_limit() {
    let Some(urls) = redis_list(ENV_SENTINEL_URLS) else {
        return;
    };
    let Some(service) = redis_list(ENV_SENTINEL_SERVICE) else {
        return;
    };
    let url = format!("redis+sentinel://{}/{}", hosts(&urls), service[0]);
    two_instances_enforce_one_limit(&url).await;
}

/// `host:port,host:port` from `redis://host:port` URLs.
fn hosts(urls: &[String]) -> String {
    urls.iter()
        .map(|u| u.trim_start_matches("redis://").trim_end_matches('/'))
        .collect::<Vec<_>>()
        .join(",")
}

async fn two_instances_enforce_one_limit(url: &str) {
    let url = url.to_owned();
    // The same policy file for both instances, as in a deployment.
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    replace_file(&policy, SLOW_POLICY).unwrap();
    let policy = policy.to_str().unwrap();
    // A budget no loaded test machine exceeds: a timed-out call would be decided by this
    // instance's fallback, not by Redis.
    let args = [
        "--redis",
        &url,
        "--policy",
        policy,
        "--instances",
        "2",
        "--redis-budget-ms",
        "10000",
    ];
    let a = DemoProcess::start(&args);
    let b = DemoProcess::start(&args);
    let http = Http::new();
    // A user no other run has used: parallel runs on the same Redis do not collide.
    let user = unique("e2e-user");

    let mut allowed = [0_u32; 2];
    let mut denied = [0_u32; 2];
    for i in 0..160 {
        let (index, demo) = if i % 2 == 0 { (0, &a) } else { (1, &b) };
        let reply = http.get(demo.addr, "/api/data", Some(&user)).await;
        match reply.status {
            StatusCode::OK => allowed[index] += 1,
            StatusCode::TOO_MANY_REQUESTS => denied[index] += 1,
            other => panic!("request {i}: {other}: {}", reply.body),
        }
    }
    assert_eq!(
        allowed[0] + allowed[1],
        100,
        "allowed {allowed:?}, denied {denied:?}"
    );
    // Alternating, each instance admitted half: neither enforced a limit of its own.
    assert_eq!(allowed, [50, 50]);
    assert_eq!(denied, [30, 30]);

    // Each instance's metrics show Redis (the primary) deciding, and a closed breaker.
    for (index, demo) in [&a, &b].into_iter().enumerate() {
        let reply = http.get(demo.addr, "/metrics", None).await;
        let exposition = parse(&reply.body).unwrap_or_else(|e| panic!("{e}\n{}", reply.body));
        let count = |outcome| {
            exposition
                .find(
                    "distlimit_decisions_total",
                    &[("policy", "api"), ("outcome", outcome)],
                )
                .iter()
                .map(|s| {
                    assert_ne!(s.labels["source"], "fallback", "Redis was up");
                    s.value
                })
                .sum::<f64>()
        };
        assert_eq!(count("allowed"), f64::from(allowed[index]));
        assert_eq!(count("denied"), f64::from(denied[index]));
        assert_eq!(
            exposition.value(
                "distlimit_breaker_state",
                &[("store", "redis"), ("state", "closed")]
            ),
            Some(1.0)
        );
    }
}

/// Every algorithm, raced: two processes on one Redis, 8 clients on each sending 240 requests
/// in all at once to one user whose limit is 100: exactly 100 are admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_racing_admit_exactly_the_limit_with_every_algorithm() {
    let Some(url) = redis_url() else { return };
    for algorithm in [
        "token_bucket",
        "gcra",
        "fixed_window",
        "sliding_window",
        "sliding_log",
    ] {
        race(&url, algorithm, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_spending_from_leases_never_admit_more_than_the_limit() {
    let Some(url) = redis_url() else { return };
    for algorithm in ["token_bucket", "gcra"] {
        race(&url, algorithm, true).await;
    }
}

/// 240 requests of one user from 16 clients spread over two instances on a limit of 100 that
/// does not refill during the test. Without leases Redis decides each: exactly 100 admitted.
/// With `--lease api` (token bucket and GCRA) units withdrawn by one instance and not spent
/// when the requests end are admitted by nobody: at most 100, never more.
async fn race(url: &str, algorithm: &str, lease: bool) {
    // No refill (one unit per hour) while the test runs; the windows are days (aligned: a run
    // across midnight UTC would see a second window).
    let tier = match algorithm {
        "token_bucket" | "gcra" => "limit = 1, per = \"1h\", burst = 100",
        _ => "limit = 100, per = \"1d\"",
    };
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    replace_file(
        &policy,
        format!(
            "[[policy]]\nname = \"api\"\ntiers = [{{ name = \"t\", algorithm = \"{algorithm}\", {tier} }}]\n\n[[policy]]\nname = \"api-ip\"\ntiers = [{{ name = \"client\", limit = 1000, per = \"1s\", burst = 100000 }}]\n"
        ),
    ).unwrap();
    let policy = policy.to_str().unwrap();
    // A budget no loaded test machine exceeds: this test is about Redis's decisions, and a
    // timed-out call would be decided by the fallback instead.
    let args = [
        "--redis",
        url,
        "--policy",
        policy,
        "--instances",
        "2",
        "--redis-budget-ms",
        "10000",
    ];
    let args: Vec<&str> = match lease {
        true => args.iter().copied().chain(["--lease", "api"]).collect(),
        false => args.to_vec(),
    };
    let demos = [DemoProcess::start(&args), DemoProcess::start(&args)];
    let user = Arc::new(unique(&format!("race-{algorithm}")));
    let issued = Arc::new(AtomicU32::new(0));
    let http = Http::new();
    let clients: Vec<_> = (0..16)
        .map(|c| {
            let addr = demos[c % 2].addr;
            let (http, user, issued) = (http.clone(), user.clone(), issued.clone());
            tokio::spawn(async move {
                let (mut allowed, mut denied) = (0_u32, 0_u32);
                while issued.fetch_add(1, Ordering::Relaxed) < 240 {
                    let reply = http.get(addr, "/api/data", Some(&user)).await;
                    match reply.status {
                        StatusCode::OK => allowed += 1,
                        StatusCode::TOO_MANY_REQUESTS => denied += 1,
                        other => panic!("{other}: {}", reply.body),
                    }
                }
                (allowed, denied)
            })
        })
        .collect();
    let (mut allowed, mut denied) = (0, 0);
    for client in clients {
        let (a, d) = client.await.unwrap();
        allowed += a;
        denied += d;
    }
    // Redis decided every one: no instance fell back to its own share.
    for demo in &demos {
        let reply = http.get(demo.addr, "/metrics", None).await;
        let exposition = parse(&reply.body).unwrap_or_else(|e| panic!("{e}\n{}", reply.body));
        for sample in exposition.find("distlimit_decisions_total", &[("policy", "api")]) {
            assert_ne!(sample.labels["source"], "fallback", "{algorithm}");
        }
        // The Redis store reports its calls on the same page.
        assert!(
            exposition
                .value("distlimit_store_calls_in_flight", &[("store", "redis")])
                .is_some(),
            "{algorithm}: no distlimit_store_calls_in_flight\n{}",
            reply.body
        );
        if lease {
            let takes = exposition.value("distlimit_lease_takes_total", &[("store", "lease")]);
            assert!(
                takes.is_some_and(|n| n >= 1.0),
                "{algorithm}: no lease taken"
            );
        }
    }
    eprintln!("{algorithm}, leases {lease}: {allowed} admitted, {denied} denied");
    assert_eq!(allowed + denied, 240, "{algorithm}");
    match lease {
        true => assert!(
            (1..=100).contains(&allowed),
            "{algorithm}: {allowed} admitted"
        ),
        false => assert_eq!((allowed, denied), (100, 140), "{algorithm}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_falls_back_to_this_instances_share() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    replace_file(&policy, SLOW_POLICY).unwrap();
    let demo = DemoProcess::start(&[
        "--redis",
        &redis.url(),
        "--policy",
        policy.to_str().unwrap(),
        "--instances",
        "2",
    ]);
    let http = Http::new();
    let user = unique("outage-user");
    for _ in 0..10 {
        let reply = http.get(demo.addr, "/api/data", Some(&user)).await;
        assert_eq!(reply.status, StatusCode::OK);
    }

    redis.kill();
    // Every request is still answered, by the local fallback: a fresh bucket of this
    // instance's share, 100 / 2 instances.
    let (mut allowed, mut denied) = (0, 0);
    for i in 0..60 {
        if i == 1 {
            // The default opening rule wants failures that go on for 50 ms: an outage, not a burst.
            tokio::time::sleep(std::time::Duration::from_millis(60)).await;
        }
        let reply = http.get(demo.addr, "/api/data", Some(&user)).await;
        match reply.status {
            StatusCode::OK => allowed += 1,
            StatusCode::TOO_MANY_REQUESTS => denied += 1,
            other => panic!("request {i} during the outage: {other}: {}", reply.body),
        }
    }
    assert_eq!((allowed, denied), (50, 10));

    let reply = http.get(demo.addr, "/metrics", None).await;
    let exposition = parse(&reply.body).unwrap_or_else(|e| panic!("{e}\n{}", reply.body));
    let decisions = |outcome, source| {
        exposition.value(
            "distlimit_decisions_total",
            &[("policy", "api"), ("outcome", outcome), ("source", source)],
        )
    };
    assert_eq!(decisions("allowed", "primary"), Some(10.0));
    assert_eq!(decisions("allowed", "fallback"), Some(50.0));
    assert_eq!(decisions("denied", "fallback"), Some(10.0));
    let errors: f64 = exposition
        .find("distlimit_store_errors_total", &[("store", "redis")])
        .iter()
        .map(|s| s.value)
        .sum();
    assert!(errors >= 1.0, "the failed Redis call is counted");
    assert_eq!(
        exposition.value(
            "distlimit_breaker_transitions_total",
            &[("store", "redis"), ("from", "closed"), ("to", "open")]
        ),
        Some(1.0)
    );
    assert_eq!(
        exposition.value(
            "distlimit_breaker_state",
            &[("store", "redis"), ("state", "closed")]
        ),
        Some(0.0)
    );
}

#[test]
fn out_of_range_flags_are_refused_with_their_bounds() {
    for (flag, value, bound) in [
        ("--instances", "18446744073709551615", "1..=10000"),
        ("--instances", "0", "1..=10000"),
        ("--redis-budget-ms", "18446744073709551615", "1..=60000"),
        ("--redis-budget-ms", "0", "1..=60000"),
        (
            "--shutdown-timeout-ms",
            "18446744073709551615",
            "1..=86400000",
        ),
    ] {
        let (status, log) = DemoProcess::run(&[flag, value]);
        assert_eq!(status.code(), Some(2), "{flag} {value}: {log}");
        assert!(
            log.contains(&format!("invalid value '{value}' for '{flag}")) && log.contains(bound),
            "{flag} {value}: {log}"
        );
    }
}

#[test]
fn a_redis_error_names_redis_once() {
    let (status, log) = DemoProcess::run(&["--redis", "notaurl"]);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("redis: configuration: invalid Redis URL"),
        "{log}"
    );
    assert!(!log.contains("redis: redis:"), "{log}");
}

#[test]
fn durable_decisions_without_a_stated_failure_mode_are_refused_at_start() {
    let durable = [
        "--redis",
        "redis://127.0.0.1:1",
        "--redis-durable-replicas",
        "1",
    ];
    let (status, log) = DemoProcess::run(&durable);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("--redis-durable-replicas needs a failure mode stated")
            && log.contains("--failure-mode fail-closed")
            && log.contains("--failure-mode fallback"),
        "{log}"
    );
}

#[test]
fn an_address_in_use_is_named() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (status, log) = DemoProcess::run(&["--listen", &addr]);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!("cannot listen on {addr}: Address already in use")),
        "{log}"
    );
}
