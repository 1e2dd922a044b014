//! The demo binary as an operator runs it: started while Redis is down, and signalled with
//! SIGHUP.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::{Duration, Instant};

use distlimit_test::server::RedisServer;
use support::{DemoProcess, Http};

/// Waits (at most 10 s) for a line of `process` containing `needle`.
fn wait_for_line(process: &DemoProcess, needle: &str) {
    let started = Instant::now();
    while !process.log().iter().any(|line| line.contains(needle)) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no \"{needle}\":\n{}",
            process.log().join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn starts_while_redis_is_down_and_survives_sighup() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    // Stopped by PID before the demo starts: its port refuses connections.
    redis.kill();
    let url = redis.url();
    let mut demo = DemoProcess::start(&["--redis", &url]);
    // The fallback answers.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let status = runtime
        .block_on(Http::new().get(demo.addr, "/api/data", Some("ann")))
        .status;
    assert_eq!(status, 200, "{}", demo.log().join("\n"));

    let kill = std::process::Command::new("kill")
        .args(["-HUP", &demo.pid().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    wait_for_line(&demo, "SIGHUP: ignored");
    let status = runtime
        .block_on(Http::new().get(demo.addr, "/api/data", Some("ann")))
        .status;
    assert_eq!(status, 200, "SIGHUP ended the demo");
    assert!(demo.terminate().success());
}

/// `--redis-durable-replicas 1 --failure-mode fallback` on a Redis without replicas: every
/// admission is refused for want of a replica, and the log and the metrics say so (kind
/// `durability`), not that Redis is down. With the default budget (50 ms) a WAIT outlasts it
/// and a warning at start says so.
#[test]
fn too_few_replicas_are_named_as_such_in_logs_and_metrics() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    // A budget above WAIT's real length (its timeout plus a Redis tick of 100 ms).
    let flags = [
        "--redis",
        &url,
        "--redis-durable-replicas",
        "1",
        "--redis-budget-ms",
        "500",
    ];
    let demo = DemoProcess::start(&[&flags[..], &["--failure-mode", "fallback"]].concat());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = Http::new();
    for _ in 0..20 {
        let reply = runtime.block_on(http.get(demo.addr, "/api/data", Some("ann")));
        assert_eq!(reply.status, 200, "{}", demo.log().join("\n"));
    }
    let metrics = runtime.block_on(http.get(demo.addr, "/metrics", None)).body;
    let errors: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("distlimit_store_errors_total"))
        .collect();
    assert!(
        errors.iter().any(|l| l.contains(r#"kind="durability""#)) && errors.len() == 1,
        "{errors:?}"
    );
    wait_for_line(
        &demo,
        "redis: durability: redis answers but its writes are not durable",
    );
    let log = demo.log().join("\n");
    assert!(log.contains("0 of 1 replicas acknowledged"), "{log}");
    assert!(!log.contains("until redis answers again"), "{log}");
    let flags = [
        "--redis",
        &url,
        "--redis-durable-replicas",
        "1",
        "--failure-mode",
        "fallback",
    ];
    let default_budget = DemoProcess::start(&flags);
    wait_for_line(
        &default_budget,
        "past --redis-budget-ms (50 ms): too few replicas then show as timeouts",
    );
}
