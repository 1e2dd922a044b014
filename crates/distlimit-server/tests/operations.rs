//! The binary as an operator runs it: started while Redis is down, signalled (SIGHUP,
//! SIGTERM), read through its logs, `/ready`, `/metrics` and the gRPC health service.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use distlimit_test::server::RedisServer;

use crate::support;

use support::binary::{Binary, http};

const CONFIG: &str = "
domain: api
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 3 }
";

const CHECK: &str = r#"{"domain":"api","descriptors":[[{"key":"user","value":"ann"}]]}"#;

/// The `overall_code` of one `/v1/check` of user `ann`.
fn check(addr: SocketAddr) -> (u16, String) {
    http(addr, "POST", "/v1/check", CHECK)
}

/// The gRPC health status of `service` (1 SERVING, 2 NOT_SERVING).
fn health(grpc: SocketAddr, service: &str) -> i32 {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap()
            .into_inner()
            .status
    })
}

fn config_dir(yaml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), yaml).unwrap();
    dir
}

/// Polls `probe` every 20 ms until it is true, at most `limit`.
fn eventually(limit: Duration, mut probe: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if probe() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A Redis server stopped by PID (its port refuses connections), and the binary started on
/// [`CONFIG`] with it as `--redis` and `--failure-mode mode`, and how long the start took;
/// `None` without redis-server.
fn start_while_redis_is_down(
    mode: &str,
) -> Option<(RedisServer, tempfile::TempDir, Binary, Duration)> {
    let mut redis = RedisServer::start()?;
    redis.kill();
    let dir = config_dir(CONFIG);
    let config = dir.path().to_str().unwrap();
    let url = redis.url();
    let started = Instant::now();
    let binary = Binary::start(
        &["--config", config, "--redis", &url, "--failure-mode", mode],
        &[],
    );
    Some((redis, dir, binary, started.elapsed()))
}

#[test]
fn starts_while_redis_is_down_answers_from_the_fallback_and_moves_to_redis() {
    let Some((mut redis, _dir, mut binary, start)) = start_while_redis_is_down("fallback") else {
        return;
    };
    assert!(start < Duration::from_secs(5), "started in {start:?}");
    // Ready (the fallback answers), and says Redis is down.
    let (status, body) = http(binary.http, "GET", "/ready", "");
    assert_eq!(
        (status, body.as_str()),
        (200, r#"{"status":"ready","redis":"down"}"#)
    );
    assert!(eventually(Duration::from_secs(5), || health(
        binary.grpc,
        "distlimit.redis"
    ) == 2));
    assert_eq!(health(binary.grpc, ""), 1, "the service itself serves");
    let (_, metrics) = http(binary.http, "GET", "/metrics", "");
    assert!(
        metrics.contains(r#"distlimit_server_store_up{store="redis"} 0"#),
        "{metrics}"
    );
    // The fallback decides: 3 per hour, this instance alone.
    let codes: Vec<bool> = (0..4)
        .map(|_| check(binary.http).1.contains("OVER_LIMIT"))
        .collect();
    assert_eq!(codes, [false, false, false, true], "the fallback's limit");

    // Redis comes up on its port: the binary connects and Redis decides.
    redis.restart().unwrap();
    assert!(
        eventually(Duration::from_secs(15), || {
            http(binary.http, "GET", "/ready", "").1 == r#"{"status":"ready","redis":"up"}"#
        }),
        "still down:\n{}",
        binary.log()
    );
    assert!(eventually(Duration::from_secs(5), || health(
        binary.grpc,
        "distlimit.redis"
    ) == 1));
    let (_, body) = check(binary.http);
    assert!(body.contains(r#""overall_code":"OK""#), "{body}");
    let keys: u64 = redis.command(&["DBSIZE"]).unwrap().parse().unwrap();
    assert!(keys > 0, "Redis decided nothing");
    assert_eq!(binary.count("redis: connected"), 1, "{}", binary.log());
    assert!(binary.running());
    binary.signal("TERM");
    assert_eq!(binary.wait_exit(Duration::from_secs(10)), Some(0));
}

#[test]
fn a_bad_redis_url_still_stops_the_start() {
    let output = Command::new(env!("CARGO_BIN_EXE_distlimit-server"))
        .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .args(["--redis", "mongodb://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown scheme"), "{stderr}");
}

#[test]
fn sighup_reloads_the_configuration_instead_of_killing_the_process() {
    let dir = config_dir(CONFIG);
    let config = dir.path().to_str().unwrap();
    // Polling alone would not see the change for 10 minutes.
    let mut binary = Binary::start(&["--config", config, "--reload-interval-ms", "600000"], &[]);
    binary.signal("HUP");
    binary.wait_for_line("configuration unchanged", Duration::from_secs(5));
    assert!(binary.running(), "SIGHUP ended the process");
    // A lower limit, read at the next SIGHUP.
    std::fs::write(
        dir.path().join("config.yaml"),
        CONFIG.replace("requests_per_unit: 3", "requests_per_unit: 1"),
    )
    .unwrap();
    binary.signal("HUP");
    binary.wait_for_line("configuration reloaded", Duration::from_secs(5));
    assert_eq!(binary.count("SIGHUP: reading the configuration now"), 2);
    assert!(check(binary.http).1.contains(r#""overall_code":"OK""#));
    assert!(check(binary.http).1.contains("OVER_LIMIT"));
    let (_, metrics) = http(binary.http, "GET", "/metrics", "");
    assert!(
        metrics.contains(r#"distlimit_server_config_loads_total{result="success"} 2"#),
        "{metrics}"
    );
    binary.signal("TERM");
    assert_eq!(binary.wait_exit(Duration::from_secs(10)), Some(0));
}

#[test]
fn on_sigterm_both_health_services_turn_not_serving() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let dir = config_dir(CONFIG);
    let config = dir.path().to_str().unwrap();
    let mut binary = Binary::start(&["--config", config, "--shutdown-timeout-ms", "2000"], &[]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let services = ["", "envoy.service.ratelimit.v3.RateLimitService"];
    let statuses = runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", binary.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut watches = Vec::new();
        for service in services {
            let mut watch = HealthClient::new(channel.clone())
                .watch(HealthCheckRequest {
                    service: service.to_owned(),
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(
                watch.message().await.unwrap().unwrap().status,
                1,
                "{service:?}"
            );
            watches.push(watch);
        }
        binary.signal("TERM");
        let mut statuses = Vec::new();
        for watch in &mut watches {
            let next = tokio::time::timeout(Duration::from_secs(5), watch.message()).await;
            statuses.push(next.ok().and_then(|m| m.ok().flatten()).map(|m| m.status));
        }
        statuses
    });
    assert_eq!(statuses, [Some(2), Some(2)], "NOT_SERVING for {services:?}");
    assert_eq!(binary.wait_exit(Duration::from_secs(10)), Some(0));
}

#[test]
fn a_failure_on_every_request_logs_a_few_lines_not_one_per_request() {
    let Some((_redis, _dir, binary, _)) = start_while_redis_is_down("fail-closed") else {
        return;
    };
    let requests = 200;
    let mut unavailable = 0;
    let started = Instant::now();
    for _ in 0..requests {
        if check(binary.http).0 == 503 {
            unavailable += 1;
        }
        assert!(started.elapsed() < Duration::from_secs(60));
    }
    assert_eq!(unavailable, requests, "fail-closed answers 503");
    std::thread::sleep(Duration::from_millis(100));
    let failures = binary.count("store failed to decide");
    assert!(
        (1..=5).contains(&failures),
        "{failures} lines for {requests} failed requests:\n{}",
        binary.log()
    );
    assert!(
        binary.count("circuit breaker open") <= 1,
        "{}",
        binary.log()
    );
}

#[test]
fn envoyproxy_environment_variables_configure_the_binary() {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("config.yaml"), CONFIG).unwrap();
    let root_path = root.path().to_str().unwrap();
    let mut binary = Binary::start(
        &[],
        &[
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("RUNTIME_ROOT", root_path),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ],
    );
    // The configuration of RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config: 3 an hour.
    let answers: Vec<bool> = (0..4)
        .map(|_| check(binary.http).1.contains("OVER_LIMIT"))
        .collect();
    assert_eq!(answers, [false, false, false, true], "{}", binary.log());
    binary.signal("TERM");
    assert_eq!(binary.wait_exit(Duration::from_secs(10)), Some(0));

    // A variable the server cannot use stops it with its name.
    let output = Command::new(env!("CARGO_BIN_EXE_distlimit-server"))
        .env("GRPC_PORT", "grpc")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("GRPC_PORT"), "{stderr}");
}

/// The JSON body of the server README's `curl … /v1/check … -d '<body>'`.
fn readme_curl_body() -> String {
    let readme =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .unwrap();
    let start = readme
        .find("/v1/check -H 'content-type: application/json'")
        .expect("the README's curl");
    let rest = &readme[start..];
    let body = &rest[rest.find("-d '").unwrap() + 4..];
    body[..body.find('\'').unwrap()].to_owned()
}

#[test]
fn the_repository_example_config_answers_the_readme_curl_ok_then_over_limit() {
    // The root README's command: `--config ./ratelimit-config` from the repository root.
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ratelimit-config");
    let binary = Binary::start(&["--config", config.to_str().unwrap()], &[]);
    let body = readme_curl_body();
    let answers: Vec<(u16, bool)> = (0..6)
        .map(|_| {
            let (status, text) = http(binary.http, "POST", "/v1/check", &body);
            (status, text.contains(r#""overall_code":"OVER_LIMIT""#))
        })
        .collect();
    let ok = (200, false);
    assert_eq!(
        answers,
        [ok, ok, ok, ok, ok, (429, true)],
        "for {body}:\n{}",
        binary.log()
    );
}
