//! `GET /api/generate`'s concurrency limit across processes: three `distlimit-demo` processes
//! on one `redis-server` (this test's own, on a free loopback port), one user's slow requests
//! spread over them. The handler reports when each request entered and left it; at no instant
//! were more than `--max-in-flight` inside, and a process SIGKILLed while holding permits gives
//! them back within the lease.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;
use distlimit_test::replace_file;

use std::time::{Duration, Instant};

use distlimit_test::server::RedisServer;
use http::StatusCode;
use support::openmetrics::parse;
use support::{DemoProcess, Http, unique};

fn demos(redis: &RedisServer, lease_ms: &str) -> Vec<DemoProcess> {
    let url = redis.url();
    let args = [
        "--redis",
        url.as_str(),
        "--redis-budget-ms",
        "10000",
        "--max-in-flight",
        "4",
        "--in-flight-lease-ms",
        lease_ms,
    ];
    (0..3).map(|_| DemoProcess::start(&args)).collect()
}

fn header(reply: &support::Reply, name: &str) -> u64 {
    reply.headers[name].to_str().unwrap().parse().unwrap()
}

/// 4 + 8 concurrent requests of one user over three processes: never more than 4 inside the
/// handler at once (counted from the handler's own entry and exit times), exactly 4 served,
/// 8 answered 429 with `Retry-After: 1`; once they end, the user is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_never_sees_more_than_max_in_flight_across_processes() {
    let redis = RedisServer::start().expect("a redis-server binary");
    let demos = demos(&redis, "30000");
    let http = Http::new();
    let user = unique("in-flight");
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let (http, addr, user) = (http.clone(), demos[i % 3].addr, user.clone());
            tokio::spawn(async move {
                http.get(addr, "/api/generate?delay_ms=3000", Some(&user))
                    .await
            })
        })
        .collect();
    let mut inside = Vec::new();
    let mut rejected = 0;
    for task in tasks {
        let reply = task.await.unwrap();
        match reply.status {
            StatusCode::OK => inside.push((
                header(&reply, "x-handler-entered-us"),
                header(&reply, "x-handler-left-us"),
            )),
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(reply.headers["retry-after"], "1");
                rejected += 1;
            }
            other => panic!("{other}: {}", reply.body),
        }
    }
    // The most intervals holding one instant: the largest count at an entry.
    let most = inside
        .iter()
        .map(|&(at, _)| inside.iter().filter(|&&(e, l)| e <= at && at < l).count())
        .max()
        .unwrap_or(0);
    assert!(
        most <= 4,
        "{most} requests inside the handler at once: {inside:?}"
    );
    assert_eq!((inside.len(), rejected), (4, 8), "{inside:?}");
    let again = http.get(demos[1].addr, "/api/generate", Some(&user)).await;
    assert_eq!(again.status, StatusCode::OK);

    // The processes' metrics add up to what happened: 5 permits taken and given back, 8
    // requests turned away, none held now. (A permit is counted back when its body is dropped,
    // which may follow the client's read by a moment: read again for up to 2 s.)
    let mut seen = (0.0, 0.0, 0.0, -1.0);
    for _ in 0..20 {
        let (mut acquired, mut rejected, mut released, mut held) = (0.0, 0.0, 0.0, 0.0);
        for demo in &demos {
            let reply = http.get(demo.addr, "/metrics", None).await;
            let exposition = parse(&reply.body).unwrap_or_else(|e| panic!("{e}\n{}", reply.body));
            let value =
                |name, labels: &[(&str, &str)]| exposition.value(name, labels).unwrap_or(0.0);
            let event = |event| {
                value(
                    "distlimit_permits_total",
                    &[("policy", "generate"), ("event", event)],
                )
            };
            acquired += event("acquired");
            rejected += event("rejected");
            released += event("released");
            // No series at all on a process that never held a permit.
            held += value("distlimit_permits_held", &[("policy", "generate")]);
        }
        seen = (acquired, rejected, released, held);
        if seen == (5.0, 8.0, 5.0, 0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        seen,
        (5.0, 8.0, 5.0, 0.0),
        "(acquired, rejected, released, held)"
    );
}

/// A process SIGKILLed while holding all four permits of a user: the others still refuse the
/// user at once (a crash releases nothing), and serve them again within the 2 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_permits_of_a_killed_process_come_back_within_the_lease() {
    let redis = RedisServer::start().expect("a redis-server binary");
    let mut demos = demos(&redis, "2000");
    let http = Http::new();
    let user = unique("in-flight-kill");
    let doomed = demos.remove(0);
    let holders: Vec<_> = (0..4)
        .map(|_| {
            let (http, addr, user) = (http.clone(), doomed.addr, user.clone());
            tokio::spawn(async move {
                http.get(addr, "/api/generate?delay_ms=10000", Some(&user))
                    .await
            })
        })
        .collect();
    // Bounded: the four reach the handler (the others refuse the user) within 10 s. Probing
    // takes a permit for a moment, so the four go first, alone.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let started = Instant::now();
    loop {
        let reply = http.get(demos[0].addr, "/api/generate", Some(&user)).await;
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(8) && !holders.iter().any(|h| h.is_finished()),
            "the four slow requests never held the user's permits"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Held for longer than one lease: renewed while the requests run.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        http.get(demos[1].addr, "/api/generate", Some(&user))
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS,
        "the permits must be renewed past their first lease"
    );
    drop(doomed); // SIGKILL, by PID, then reaped.
    let killed = Instant::now();
    // Their connections were cut by the kill (their tasks' panics are that, printed): ended
    // only now, so that no client disconnect could have released a permit first.
    for holder in holders {
        holder.abort();
    }
    assert_eq!(
        http.get(demos[0].addr, "/api/generate", Some(&user))
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS,
        "a crash releases nothing: the permits must still be held right after it"
    );
    loop {
        let reply = http.get(demos[1].addr, "/api/generate", Some(&user)).await;
        if reply.status == StatusCode::OK {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_millis(2_500),
            "the killed process's permits did not come back within the 2 s lease"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("permits back {:?} after the kill", killed.elapsed());
}

/// A `--policy` file whose policy `generate` has `max_in_flight = max`, next to the two
/// policies `/api/data` needs.
fn policy_file(max: &str) -> String {
    format!(
        "[[policy]]\nname = \"api\"\ntiers = [{{ name = \"b\", limit = 100, per = \"1s\" }}]\n\
         [[policy]]\nname = \"api-ip\"\ntiers = [{{ name = \"c\", limit = 100, per = \"1s\" }}]\n\
         [[policy]]\nname = \"generate\"\n{max}tiers = [{{ name = \"g\", limit = 100, per = \"1s\" }}]\n"
    )
}

/// `(served, refused)` of `n` concurrent slow requests of `user`.
async fn concurrently(http: &Http, demo: &DemoProcess, user: &str, n: usize) -> (usize, usize) {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (http, addr, user) = (http.clone(), demo.addr, user.to_owned());
            tokio::spawn(async move {
                http.get(addr, "/api/generate?delay_ms=3000", Some(&user))
                    .await
            })
        })
        .collect();
    let (mut served, mut refused) = (0, 0);
    for task in tasks {
        let reply = task.await.unwrap();
        match reply.status {
            StatusCode::OK => served += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("{other}: {}", reply.body),
        }
    }
    (served, refused)
}

/// `max_in_flight = 2` on policy `generate` in the `--policy` file is the limit of
/// `/api/generate`, over `--max-in-flight 4`: of 3 concurrent slow requests of one user, 2 are
/// served and 1 is refused. The limit is fixed at start: a reload raising it to 3 logs that it
/// is not applied, and the route still admits 2. A policy `generate` without `max_in_flight`
/// stops the start, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_in_flight_of_the_generate_policy_limits_the_route() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policies.toml");
    replace_file(&path, policy_file("max_in_flight = 2\n")).unwrap();
    let file = path.to_str().unwrap();
    let demo = DemoProcess::start(&["--policy", file, "--max-in-flight", "4"]);
    let http = Http::new();
    assert_eq!(concurrently(&http, &demo, "ada", 3).await, (2, 1));

    replace_file(&path, policy_file("max_in_flight = 3\n")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !demo.log().iter().any(|l| l.contains("fixed at start")) {
        assert!(
            Instant::now() < deadline,
            "no warning about the reloaded concurrency limit:\n{}",
            demo.log().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(concurrently(&http, &demo, "bob", 3).await, (2, 1));

    replace_file(&path, policy_file("")).unwrap();
    let (status, log) = DemoProcess::run(&["--listen", "127.0.0.1:0", "--policy", file]);
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("policy \"generate\": max_in_flight: the policy has no max_in_flight"),
        "{log}"
    );
}
