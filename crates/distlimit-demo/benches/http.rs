//! Requests per second, and server CPU time per request, of the demo service with its
//! rate-limit layers (memory store) against the same routes without them, under the same
//! loopback load: a hyper HTTP/1.1 client on 64 keep-alive connections, every request naming
//! one of 1 000 000 users (`X-User-ID`) drawn in a pseudo-random order, so nearly every
//! request's user is new to the store.
//!
//! Three servers, each a separate process (this executable, re-run with `BENCH_ROLE=server`)
//! pinned to one core, so the client's own work is not counted in theirs:
//!
//! * `bare`: the routes without a limiter;
//! * `allow`: with the limits, on policies that never deny;
//! * `deny`: with the limits, every user already spent before the run (1 per hour, burst 1):
//!   every request is answered 429.
//!
//! Each server's CPU time is read from `/proc/<pid>/task/*/schedstat` around every round.
//! Rounds run in back-to-back triples, rotating which goes first, so that machine noise hits
//! all alike; the medians of the triples' ratios to `bare` are the result.
//!
//! `cargo bench -p distlimit-demo --bench http` (servers on CPU 0); the client on the other
//! core: `taskset -c 1 cargo bench -p distlimit-demo --bench http`.
//!
//! Knobs (environment): `BENCH_CONNECTIONS` (64), `BENCH_USERS` (1000000), `BENCH_REQUESTS`
//! per round (20000), `BENCH_ROUND_SECS` (3, the time bound of a round), `BENCH_ROUNDS` (11
//! triples), `BENCH_SERVER_CPUS` (a `taskset -c` list for the servers, `0`; empty: not
//! pinned), `BENCH_SERVER_THREADS` (1) and `BENCH_CLIENT_THREADS` (1) worker threads.
//! `BENCH_SIDE` (`bare`, `allow` or `deny`) instead runs one server alone for
//! `BENCH_REQUESTS × BENCH_ROUNDS` requests, and prints its PID first (for `perf record -p`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use distlimit_demo::{DATA_BODY, POLICY, ServeConfig, api_limits, limiter, router, serve};
use distlimit_memory::MemoryStore;
use distlimit_metrics::Metrics;
use distlimit_policy::PolicySet;
use distlimit_tower::TrustedProxies;
use http::{HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

/// Never denies: a million per second per user, a billion per client IP.
const ALLOW_POLICIES: &str = r#"
[[policy]]
name = "api"
tiers = [{ name = "burst", algorithm = "token_bucket", limit = 1000000, per = "1s" }]

[[policy]]
name = "api-ip"
tiers = [{ name = "client", algorithm = "token_bucket", limit = 1000000000, per = "1s" }]
"#;

/// One request per user per hour (spent before the run), a billion per client IP: every
/// request passes the IP tier and is denied by the user's.
const DENY_POLICIES: &str = r#"
[[policy]]
name = "api"
tiers = [{ name = "burst", algorithm = "token_bucket", limit = 1, per = "1h", burst = 1 }]

[[policy]]
name = "api-ip"
tiers = [{ name = "client", algorithm = "token_bucket", limit = 1000000000, per = "1s" }]
"#;

/// The servers compared, in the order of the table's columns.
const SIDES: [Side; 3] = [Side::Bare, Side::Allow, Side::Deny];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Bare,
    Allow,
    Deny,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Self::Bare => "bare",
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }

    fn parse(name: &str) -> Self {
        SIDES
            .into_iter()
            .find(|side| side.name() == name)
            .unwrap_or_else(|| panic!("a side is `bare`, `allow` or `deny`, not {name:?}"))
    }

    fn status(self) -> StatusCode {
        match self {
            Self::Bare | Self::Allow => StatusCode::OK,
            Self::Deny => StatusCode::TOO_MANY_REQUESTS,
        }
    }
}

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn runtime(threads: u64) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::try_from(threads.max(1)).unwrap())
        .enable_all()
        .build()
        .unwrap()
}

/// The `X-User-ID` of user `n`.
fn user(n: u64) -> String {
    format!("u{n}")
}

/// The users in a pseudo-random order that visits each of `users` once per cycle (an additive
/// step coprime with `users`), from `start`.
struct Users {
    next: u64,
    step: u64,
    users: u64,
}

impl Users {
    fn new(users: u64, start: u64) -> Self {
        // A step near users × 0.618, made coprime with `users`.
        let mut step = users * 618 / 1000 + 1;
        while gcd(step, users) != 1 {
            step += 1;
        }
        Self {
            next: start % users,
            step,
            users,
        }
    }

    fn next(&mut self) -> u64 {
        let n = self.next;
        self.next = (self.next + self.step) % self.users;
        n
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

async fn start(side: Side, users: u64) -> SocketAddr {
    let metrics = Metrics::new();
    let limits = match side {
        Side::Bare => None,
        Side::Allow | Side::Deny => {
            let toml = if side == Side::Allow {
                ALLOW_POLICIES
            } else {
                DENY_POLICIES
            };
            let policies = PolicySet::from_toml_str(toml).unwrap();
            let limiter = limiter(Arc::new(MemoryStore::new()), policies, &metrics);
            if side == Side::Deny {
                for n in 0..users {
                    let verdict = limiter.check_now(POLICY, user(n).as_bytes(), 1);
                    assert!(verdict.unwrap().unwrap().is_allowed());
                }
            }
            Some(api_limits(limiter, TrustedProxies::none()))
        }
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        listener,
        router(limits, metrics),
        ServeConfig::default(),
        std::future::pending(),
    ));
    addr
}

/// The load: `connections` keep-alive connections share `requests` within `bound`, each
/// request naming the next user of its connection's walk over `users`.
struct Load {
    connections: u64,
    users: u64,
    requests: u64,
    bound: Duration,
}

/// One round against `addr`, expecting `status` of every answer. Returns (requests answered,
/// elapsed).
async fn round(addr: SocketAddr, load: &Load, status: StatusCode, seed: u64) -> (u64, Duration) {
    let issued = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + load.bound;
    let tasks: Vec<_> = (0..load.connections)
        .map(|c| {
            let (issued, done) = (issued.clone(), done.clone());
            let requests = load.requests;
            // Connections start their walks spread over the users.
            let mut users = Users::new(load.users, seed + c * (load.users / load.connections));
            tokio::spawn(async move {
                let stream = TcpStream::connect(addr).await.unwrap();
                stream.set_nodelay(true).unwrap();
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream))
                        .await
                        .unwrap();
                tokio::spawn(conn);
                while issued.fetch_add(1, Ordering::Relaxed) < requests && Instant::now() < deadline
                {
                    let id = HeaderValue::try_from(user(users.next())).unwrap();
                    let request = Request::get("/api/data")
                        .header("host", "bench")
                        .header("x-user-id", id)
                        .body(Empty::<Bytes>::new())
                        .unwrap();
                    let response = sender.send_request(request).await.unwrap();
                    let got = response.status();
                    let body = response.into_body().collect().await.unwrap().to_bytes();
                    assert_eq!(got, status);
                    if status == StatusCode::OK {
                        assert_eq!(&body[..], DATA_BODY.as_bytes());
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (done.load(Ordering::Relaxed), start.elapsed())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A server process: the demo's routes as `side`, until its stdin closes.
struct Server {
    side: Side,
    child: Child,
    addr: SocketAddr,
    /// Keeps the pipe open; the server reads nothing else from it.
    _stdout: BufReader<ChildStdout>,
}

impl Server {
    fn spawn(side: Side, users: u64) -> Self {
        let exe = std::env::current_exe().unwrap();
        let cpus = std::env::var("BENCH_SERVER_CPUS").unwrap_or_else(|_| "0".into());
        let mut command = if cpus.is_empty() {
            Command::new(exe)
        } else {
            let mut taskset = Command::new("taskset");
            taskset.arg("-c").arg(cpus).arg(exe);
            taskset
        };
        let mut child = command
            .env("BENCH_ROLE", "server")
            .env("BENCH_LAYER", side.name())
            .env("BENCH_USERS", users.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the server process");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("unexpected server output {line:?}"));
        Self {
            side,
            child,
            addr,
            _stdout: stdout,
        }
    }

    /// The CPU time (user and system, all threads, in nanoseconds: the first field of each
    /// thread's `/proc/<pid>/task/<tid>/schedstat`) the server has used so far.
    fn cpu(&self) -> Duration {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.child.id())).unwrap();
        let nanos = tasks
            .map(|task| {
                let path = task.unwrap().path().join("schedstat");
                let stat = std::fs::read_to_string(path).unwrap_or_default();
                stat.split_whitespace()
                    .next()
                    .and_then(|ns| ns.parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum();
        Duration::from_nanos(nanos)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Closing stdin ends the server; it is our own child, waited for by PID.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// `BENCH_ROLE=server`: serve until stdin closes.
fn server_role(users: u64) {
    let side = Side::parse(&std::env::var("BENCH_LAYER").unwrap_or_default());
    let runtime = runtime(knob("BENCH_SERVER_THREADS", 1));
    let addr = runtime.block_on(start(side, users));
    println!("listening {addr}");
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

fn main() {
    let load = Load {
        connections: knob("BENCH_CONNECTIONS", 64),
        users: knob("BENCH_USERS", 1_000_000).max(1),
        requests: knob("BENCH_REQUESTS", 20_000),
        bound: Duration::from_secs(knob("BENCH_ROUND_SECS", 3)),
    };
    let rounds = knob("BENCH_ROUNDS", 11);
    if std::env::var("BENCH_ROLE").as_deref() == Ok("server") {
        server_role(load.users);
        return;
    }
    if let Ok(side) = std::env::var("BENCH_SIDE") {
        one_side(Side::parse(&side), &load, rounds);
        return;
    }
    let servers = SIDES.map(|side| Server::spawn(side, load.users));
    let client = runtime(knob("BENCH_CLIENT_THREADS", 1));
    client.block_on(async {
        // Warm-up: connections, allocator, the store's tables.
        for server in &servers {
            let warm = Load {
                requests: load.requests / 4,
                ..load
            };
            round(server.addr, &warm, server.side.status(), 0).await;
        }
        println!(
            "{} connections, {} users, {} requests or {:?} per round, {rounds} triples of rounds, server CPUs: {}",
            load.connections,
            load.users,
            load.requests,
            load.bound,
            std::env::var("BENCH_SERVER_CPUS").unwrap_or_else(|_| "0".into())
        );
        println!(
            "round  {:>24}  {:>24}  {:>24}  allow/bare  deny/bare",
            "bare req/s, µs CPU/req", "allow req/s, µs CPU/req", "deny req/s, µs CPU/req"
        );
        let mut rates: [Vec<f64>; 3] = Default::default();
        let mut cpus: [Vec<f64>; 3] = Default::default();
        let mut rate_ratios: [Vec<f64>; 3] = Default::default();
        let mut cpu_ratios: [Vec<f64>; 3] = Default::default();
        for r in 0..rounds {
            let mut rate = [0.0; 3];
            let mut cpu = [0.0; 3];
            for k in 0..3 {
                // Rotated, so each side goes first, second and third alike.
                let i = (k + usize::try_from(r).unwrap()) % 3;
                let server = &servers[i];
                let before = server.cpu();
                let (n, elapsed) =
                    round(server.addr, &load, server.side.status(), (r + 1) * 7919).await;
                let used = server.cpu() - before;
                rate[i] = n as f64 / elapsed.as_secs_f64();
                cpu[i] = used.as_secs_f64() * 1e6 / n as f64;
            }
            println!(
                "{r:>5}  {:>12.0} {:>11.2}  {:>12.0} {:>11.2}  {:>12.0} {:>11.2}  {:>10.3}  {:>9.3}",
                rate[0],
                cpu[0],
                rate[1],
                cpu[1],
                rate[2],
                cpu[2],
                rate[1] / rate[0],
                rate[2] / rate[0]
            );
            for i in 0..3 {
                rates[i].push(rate[i]);
                cpus[i].push(cpu[i]);
                rate_ratios[i].push(rate[i] / rate[0]);
                cpu_ratios[i].push(cpu[i] / cpu[0]);
            }
        }
        let [bare_rate, allow_rate, deny_rate] = rates.map(median);
        let [bare_cpu, allow_cpu, deny_cpu] = cpus.map(median);
        let [_, allow_ratio, deny_ratio] = rate_ratios.map(median);
        let [_, allow_cpu_ratio, deny_cpu_ratio] = cpu_ratios.map(median);
        println!(
            "median req/s: bare {bare_rate:.0}, allow {allow_rate:.0}, deny {deny_rate:.0}; µs server CPU per request: bare {bare_cpu:.2}, allow {allow_cpu:.2}, deny {deny_cpu:.2}"
        );
        for (name, ratio, cpu_ratio) in [
            ("allow", allow_ratio, allow_cpu_ratio),
            ("deny", deny_ratio, deny_cpu_ratio),
        ] {
            println!(
                "median {name}/bare: throughput {ratio:.3}, server CPU per request {cpu_ratio:.3} (the layers' share of the server's CPU: {:.1} %)",
                (1.0 - 1.0 / cpu_ratio) * 100.0
            );
        }
    });
}

/// `BENCH_SIDE=bare|allow|deny`: one server and its client in this process, for profiling one
/// side.
fn one_side(side: Side, load: &Load, rounds: u64) {
    println!("pid {}", std::process::id());
    runtime(2).block_on(async {
        let addr = start(side, load.users).await;
        let total = Load {
            requests: load.requests * rounds,
            bound: load.bound * 10,
            ..*load
        };
        let (n, elapsed) = round(addr, &total, side.status(), 1).await;
        println!(
            "{}: {n} requests in {elapsed:.2?}, {:.0} req/s",
            side.name(),
            n as f64 / elapsed.as_secs_f64()
        );
    });
}
