//! One limit across regions through the binary (`--redis-home`): three regions on loopback,
//! each its own `redis-server` and two `distlimit-demo` processes deciding on it; region 0's
//! Redis is home. Every process reaches home through a `Proxy`: 40 ms each way from
//! regions 1 and 2, none from region 0 (its link is there to be cut). Clients are this test,
//! over HTTP.
//!
//! * `capped_limit_holds_across_six_processes`: a limit of 300 that does not refill during the
//!   test, 1 200 requests offered over 2 s through the six processes: admitted ≤ 300 and
//!   ≥ 270 (90 %); the same load on the six processes without `--redis-home` (each region
//!   limiting alone) admits more than 300, so the check can fail; the same with `--lease api`
//!   (instances lease from their region's pools);
//! * `home_cut_off_reaches_no_client_as_an_error`: 50 per second (burst 50) offered 120 per
//!   second for 9 s, all links to home cut from 1.5 s to 6.5 s, `--failure-mode fail-closed`:
//!   no 5xx reaches a client (while a process deciding at home through the same link answers
//!   5xx during the cut), admitted ≤ the limit's bound, and every region admits again once
//!   home is back;
//! * `a_far_region_serves_new_users_and_keeps_reported_debt`: one process in region 1 with the
//!   default policies: three new users' first `GET /api/data` is 200 (a new key waits for its
//!   pool's first refill instead of being denied), and a user whose answer used 15 000 tokens of
//!   the 10 000 a minute is denied next with a `Retry-After` of about 30 s (5 000 tokens of
//!   debt), as without regions.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use distlimit_test::Proxy;
use distlimit_test::server::RedisServer;
use http::StatusCode;
use support::{DemoProcess, Http, unique};

const REGIONS: usize = 3;
const INSTANCES: usize = 2;
const ONE_WAY: Duration = Duration::from_millis(40);

/// The capped limit: 300, refilled at one an hour (no refill during the test).
const CAPPED: &str = r#"
[[policy]]
name = "api"
tiers = [{ name = "capped", algorithm = "token_bucket", limit = 1, per = "1h", burst = 300 }]

# Every request comes from 127.0.0.1: the per-address limit (a token bucket too, so decided
# in the region) never denies.
[[policy]]
name = "api-ip"
tiers = [{ name = "client", algorithm = "token_bucket", limit = 100000, per = "1s", burst = 100000 }]
"#;

/// 50 per second, burst 50.
const STEADY: &str = r#"
[[policy]]
name = "api"
tiers = [{ name = "steady", algorithm = "token_bucket", limit = 50, per = "1s", burst = 50 }]

# Every request comes from 127.0.0.1: the per-address limit (a token bucket too, so decided
# in the region) never denies.
[[policy]]
name = "api-ip"
tiers = [{ name = "client", algorithm = "token_bucket", limit = 100000, per = "1s", burst = 100000 }]
"#;

/// Three regions: their servers (0 is home) and each region's link to home.
struct Regions {
    servers: Vec<RedisServer>,
    links: Vec<Proxy>,
    dir: std::path::PathBuf,
}

impl Regions {
    async fn start() -> Self {
        let servers: Vec<RedisServer> = (0..REGIONS)
            .map(|_| RedisServer::start().expect("this test needs redis-server"))
            .collect();
        let home: SocketAddr = servers[0].addr().parse().unwrap();
        let mut links = Vec::new();
        for region in 0..REGIONS {
            let one_way = if region == 0 { Duration::ZERO } else { ONE_WAY };
            links.push(Proxy::with_delay(home, one_way).unwrap());
        }
        let dir = std::env::temp_dir().join(unique("distlimit-demo-regions"));
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            servers,
            links,
            dir,
        }
    }

    fn policy(&self, text: &str) -> String {
        let path = self.dir.join(unique("policy") + ".toml");
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }

    /// Two demo processes per region on its own Redis, with `--redis-home` through the
    /// region's link when `home`, else limiting on the region's Redis alone.
    fn demos(&self, policy: &str, home: bool, extra: &[&str]) -> Vec<(usize, DemoProcess)> {
        let mut out = Vec::new();
        for region in 0..REGIONS {
            for _ in 0..INSTANCES {
                let local = self.servers[region].url();
                let link = self.links[region].redis_url();
                let mut args = vec![
                    "--policy",
                    policy,
                    "--redis",
                    &local,
                    // The region's own Redis never times out here: a 5xx is an error of the
                    // region store, not of a loaded test machine.
                    "--redis-budget-ms",
                    "5000",
                    "--redis-timeout-ms",
                    "1000",
                    "--failure-mode",
                    "fail-closed",
                ];
                if home {
                    args.extend(["--redis-home", &link]);
                }
                args.extend(extra);
                out.push((region, DemoProcess::start(&args)));
            }
        }
        out
    }

    fn cut(&self) {
        self.links.iter().for_each(Proxy::partition);
    }

    fn restore(&self) {
        self.links.iter().for_each(Proxy::heal);
    }
}

impl Drop for Regions {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What one process answered.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    region: usize,
    admitted: u64,
    denied: u64,
    errors: u64,
    /// Admitted among the requests sent at or after `late` from the start.
    admitted_late: u64,
}

/// Each process gets `rate` requests per second of `user` at a steady pace for `secs`
/// (`rate * secs` each, each answered within 30 s).
async fn offer(
    demos: &[(usize, SocketAddr)],
    user: &str,
    rate: u64,
    secs: u64,
    late: Option<Duration>,
) -> Vec<Tally> {
    let http = Http::new();
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let mut tasks = Vec::new();
    for &(region, addr) in demos {
        let (http, user) = (http.clone(), user.to_owned());
        tasks.push(tokio::spawn(async move {
            let period = Duration::from_secs(1) / u32::try_from(rate).unwrap();
            let mut requests = Vec::new();
            for i in 0..rate * secs {
                let at = start + period * u32::try_from(i).unwrap();
                tokio::time::sleep_until(at).await;
                let (http, user) = (http.clone(), user.clone());
                let is_late = late.is_some_and(|late| at >= start + late);
                requests.push(tokio::spawn(async move {
                    let reply = http.get(addr, "/api/data", Some(&user)).await;
                    (reply.status, is_late)
                }));
            }
            let mut tally = Tally {
                region,
                ..Tally::default()
            };
            for request in requests {
                let (status, is_late) = request.await.unwrap();
                match status {
                    StatusCode::OK => {
                        tally.admitted += 1;
                        tally.admitted_late += u64::from(is_late);
                    }
                    StatusCode::TOO_MANY_REQUESTS => tally.denied += 1,
                    _ => tally.errors += 1,
                }
            }
            tally
        }));
    }
    let mut tallies = Vec::new();
    for task in tasks {
        tallies.push(task.await.unwrap());
    }
    tallies
}

fn addrs(demos: &[(usize, DemoProcess)]) -> Vec<(usize, SocketAddr)> {
    demos.iter().map(|(r, d)| (*r, d.addr)).collect()
}

fn sum(tallies: &[Tally], field: impl Fn(&Tally) -> u64) -> u64 {
    tallies.iter().map(field).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capped_limit_holds_across_six_processes() {
    capped(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capped_limit_holds_across_six_processes_with_leases() {
    capped(&["--lease", "api"]).await;
}

/// The capped limit through six processes started with `extra` flags, then without
/// `--redis-home`.
async fn capped(extra: &[&str]) {
    let regions = Regions::start().await;
    let policy = regions.policy(CAPPED);
    let demos = regions.demos(&policy, true, extra);
    // 100 per second for 2 s through each of the six processes: 1 200, four times the limit.
    let tallies = offer(&addrs(&demos), "tenant", 100, 2, None).await;
    let admitted = sum(&tallies, |t| t.admitted);
    println!("regions: admitted {admitted} of 300: {tallies:?}");
    assert_eq!(sum(&tallies, |t| t.errors), 0, "{tallies:?}");
    assert!(admitted <= 300, "over-admission: {admitted} > 300");
    assert!(
        admitted >= 270,
        "under-admission above 10 %: {admitted} of 300"
    );
    drop(demos);

    // Without --redis-home each region limits alone: three limits in all (another user, whose
    // key region 0's Redis, home's, has not seen).
    let alone = regions.demos(&policy, false, extra);
    let tallies = offer(&addrs(&alone), "tenant-alone", 100, 2, None).await;
    let admitted = sum(&tallies, |t| t.admitted);
    println!("alone: admitted {admitted}: {tallies:?}");
    assert_eq!(sum(&tallies, |t| t.errors), 0, "{tallies:?}");
    assert!(admitted > 300, "regions alone admitted {admitted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn home_cut_off_reaches_no_client_as_an_error() {
    let regions = Regions::start().await;
    let policy = regions.policy(STEADY);
    let demos = regions.demos(&policy, true, &[]);
    // A process deciding at home through region 1's link, as without regions.
    let link = regions.links[1].redis_url();
    let plain = DemoProcess::start(&[
        "--policy",
        &policy,
        "--redis",
        &link,
        "--redis-budget-ms",
        "1000",
        "--redis-timeout-ms",
        "200",
        "--failure-mode",
        "fail-closed",
    ]);
    let mut targets = addrs(&demos);
    targets.push((usize::MAX, plain.addr));

    let began = Instant::now();
    // The load starts 200 ms from now.
    let cutter = async {
        tokio::time::sleep(Duration::from_millis(1_700)).await;
        regions.cut();
        tokio::time::sleep(Duration::from_secs(5)).await;
        regions.restore();
    };
    // 20 per second through each process for 9 s; the cut is from 1.5 s to 6.5 s of it, and
    // requests sent from 7.5 s on are "late": home has been back a second.
    let (tallies, ()) = tokio::join!(
        offer(
            &targets,
            "tenant",
            20,
            9,
            Some(Duration::from_millis(7_500))
        ),
        cutter
    );
    let elapsed = began.elapsed();
    let (plain_tally, tallies) = tallies.split_last().unwrap();
    let admitted = sum(tallies, |t| t.admitted);
    // Units come from home's bucket only: its burst and its refill over the whole run.
    let bound = 50 + 50 * elapsed.as_secs().saturating_add(1);
    println!(
        "cut: admitted {admitted} (bound {bound}) in {elapsed:?}: {tallies:?}; \
         plain: {plain_tally:?}"
    );
    assert_eq!(sum(tallies, |t| t.errors), 0, "{tallies:?}");
    assert!(
        plain_tally.errors > 0 && plain_tally.admitted > 0,
        "the cut did not reach a process deciding at home, or it never decided: {plain_tally:?}"
    );
    assert!(admitted <= bound, "over-admission: {admitted} > {bound}");
    for region in 0..REGIONS {
        let late = sum(tallies, |t| {
            if t.region == region {
                t.admitted_late
            } else {
                0
            }
        });
        assert!(
            late > 0,
            "region {region} admitted nothing once home was back"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_region_serves_new_users_and_keeps_reported_debt() {
    let regions = Regions::start().await;
    let (local, link) = (regions.servers[1].url(), regions.links[1].redis_url());
    let demo = DemoProcess::start(&[
        "--redis",
        &local,
        "--redis-home",
        &link,
        "--redis-budget-ms",
        "5000",
        "--redis-timeout-ms",
        "1000",
    ]);
    let http = Http::new();
    for i in 0..3 {
        let user = unique(&format!("new-user-{i}"));
        let first = http.get(demo.addr, "/api/data", Some(&user)).await;
        assert_eq!(first.status, StatusCode::OK, "{user}: {}", first.body);
    }
    let user = unique("big-spender");
    let generate = "/api/generate?tokens=15000";
    let used = http.get(demo.addr, generate, Some(&user)).await;
    assert_eq!(used.status, StatusCode::OK, "{}", used.body);
    // The settle is sent when the body ends (the reply was read whole): give it time to land.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let next = http.get(demo.addr, generate, Some(&user)).await;
    assert_eq!(next.status, StatusCode::TOO_MANY_REQUESTS, "{}", next.body);
    let retry: u64 = next.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (25..=31).contains(&retry),
        "retry after {retry} s, not about 30"
    );
}
