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
