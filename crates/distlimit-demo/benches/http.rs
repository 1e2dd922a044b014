//! Requests per second, and server CPU time per request, of the demo service with its
//! rate-limit layers (memory store) against the same routes without them, under the same
//! loopback load: an HTTP/1.1 client written by hand (cheaper per request than any server here,
//! so it keeps the pinned server busy) on 64 keep-alive connections, every request naming
//! one of 1 000 000 users (`X-User-ID`) drawn in a pseudo-random order, so nearly every
//! request's user is new to the store.
//!
//! Seven servers, each a separate process pinned to one core, so the client's own work is not
//! counted in theirs:
//!
//! * `demo`: the `distlimit-demo` binary itself, as users run it, on the default per-user
//!   policy with the per-address tier raised out of the way (the outside harness's setup);
//!
//! and six built by this executable, re-run with `BENCH_ROLE=server`:
//!
//! * `axum`: a bare `axum::serve` app answering `GET /api/data` with the demo's body, none of
//!   the demo's serving stack (what an outside harness compares the demo with);
//! * `bare`: the demo's routes and serving stack (`distlimit-serve`) without a limiter;
//! * `pass`: with the limits' layer on a policy selector that names no policy, so every request
//!   passes unchecked: what the layer costs before it decides anything (reading the client
//!   IP, the response future, the body axum boxes once more);
//! * `allow`: with the limits, on policies that never deny;
//! * `deny`: with the limits, every user already spent before the run (1 per hour, burst 1):
//!   every request is answered 429;
//! * `bare429`: the control for `deny`, the routes without a limiter answering every request
//!   with a copy of the limits' 429 (status, headers and body), made once at start: what
//!   sending those bytes costs without deciding anything.
//!
//! Each server's CPU time is read from `/proc/<pid>/task/*/schedstat` around every round.
//! Rounds run in back-to-back sets of seven, rotating which goes first, so that machine noise
//! hits all alike; the medians of the sets' ratios are the result (`deny` also against
//! `bare429`).
//!
//! A client that leaves the server idle between requests reads its own pace, and ratios near 1
//! whatever the server does (hyper's client on one thread did). What a load generator that
//! saturates the pinned server reads is its capacity, the inverse of its CPU time per request:
//! the `capacity` ratios (base CPU per request / side CPU per request) are the result, against
//! `axum` (what users compare with) and against `bare`.
//!
//! `cargo bench -p distlimit-demo --bench http` (servers on CPU 0); the client on the other
//! core: `taskset -c 1 cargo bench -p distlimit-demo --bench http`.
//!
//! Knobs (environment): `BENCH_CONNECTIONS` (64), `BENCH_USERS` (1000000), `BENCH_REQUESTS`
//! per round (20000), `BENCH_ROUND_SECS` (3, the time bound of a round), `BENCH_ROUNDS` (11
//! sets), `BENCH_SERVER_CPUS` (a `taskset -c` list for the servers, `0`; empty: not
//! pinned), `BENCH_SERVER_THREADS` (1) and `BENCH_CLIENT_THREADS` (1) worker threads.
//! `BENCH_SIDE` (`axum`, `bare`, `pass`, `allow`, `deny` or `bare429`) instead runs one server alone for
//! `BENCH_REQUESTS × BENCH_ROUNDS` requests, and prints its PID first (for `perf record -p`).
//! `BENCH_TARGET=<addr>` runs the client alone, one round against a server started elsewhere
//! (`BENCH_SEED` picks where the users' walk starts, `BENCH_STATUS` the status every answer
//! must have, 200).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use distlimit_demo::{DATA_BODY, POLICY, ServeConfig, api_limits, limiter, router, serve};
use distlimit_memory::MemoryStore;
use distlimit_metrics::Metrics;
use distlimit_policy::PolicySet;
use distlimit_tower::{PeerAddr, PolicySelector, RateLimitLayer, TrustedProxies};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

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

/// The real binary's policies as the outside harness of issue 22 ran them: the default
/// per-user policy ([`distlimit_demo::DEFAULT_POLICIES`]), the per-address tier raised out of
/// the way (every request of the run comes from 127.0.0.1).
const DEMO_POLICIES: &str = r#"
[[policy]]
name = "api"
tiers = [{ name = "burst", algorithm = "token_bucket", limit = 60, per = "1m", burst = 100 }]

[[policy]]
name = "api-ip"
tiers = [{ name = "client", algorithm = "token_bucket", limit = 1000000000, per = "1s" }]
"#;

/// The servers compared, in the order of the table's columns.
const SIDES: [Side; 7] = [
    Side::Axum,
    Side::Bare,
    Side::Pass,
    Side::Allow,
    Side::Deny,
    Side::Bare429,
    Side::Demo,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    /// A bare `axum::serve` app: no limiter, none of the demo's serving stack.
    Axum,
    Bare,
    /// The limits' layer, its selector naming no policy: every request unchecked.
    Pass,
    Allow,
    Deny,
    /// The control of `Deny`: no limiter, the same 429 bytes.
    Bare429,
    /// The `distlimit-demo` binary itself (`--policy` [`DEMO_POLICIES`]), as users run it.
    Demo,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Self::Axum => "axum",
            Self::Bare => "bare",
            Self::Pass => "pass",
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Bare429 => "bare429",
            Self::Demo => "demo",
        }
    }

    fn parse(name: &str) -> Self {
        SIDES
            .into_iter()
            .find(|side| side.name() == name)
            .unwrap_or_else(|| {
                panic!(
                    "a side is `axum`, `bare`, `pass`, `allow`, `deny`, `bare429` or `demo`, not {name:?}"
                )
            })
    }

    fn status(self) -> StatusCode {
        match self {
            Self::Axum | Self::Bare | Self::Pass | Self::Allow | Self::Demo => StatusCode::OK,
            Self::Deny | Self::Bare429 => StatusCode::TOO_MANY_REQUESTS,
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
        Side::Axum => return serve_axum().await,
        Side::Demo => unreachable!("the demo side is the binary, spawned by `Server::spawn`"),
        Side::Bare => None,
        Side::Pass => {
            let policies = PolicySet::from_toml_str(ALLOW_POLICIES).unwrap();
            let limiter = limiter(Arc::new(MemoryStore::new()), policies, &metrics);
            let mut limits = api_limits(limiter.clone(), TrustedProxies::none());
            limits.layer = RateLimitLayer::new(limiter, PolicySelector::custom(|_| None));
            Some(limits)
        }
        Side::Bare429 => return serve_control(denial().await).await,
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

/// The limits' answer to a spent user: status, headers (without those hyper adds when sending)
/// and body, from the demo's routes called in process.
async fn denial() -> (StatusCode, HeaderMap, Bytes) {
    let metrics = Metrics::new();
    let policies = PolicySet::from_toml_str(DENY_POLICIES).unwrap();
    let limiter = limiter(Arc::new(MemoryStore::new()), policies, &metrics);
    let spent = limiter.check_now(POLICY, user(0).as_bytes(), 1);
    assert!(spent.unwrap().unwrap().is_allowed());
    let app = router(Some(api_limits(limiter, TrustedProxies::none())), metrics);
    let mut request = Request::get("/api/data")
        .header("host", "bench")
        .header("x-user-id", user(0))
        .body(axum::body::Body::empty())
        .unwrap();
    request
        .extensions_mut()
        .insert(PeerAddr(SocketAddr::from(([127, 0, 0, 1], 1))));
    let response = app.oneshot(request).await.unwrap();
    let (head, body) = response.into_parts();
    assert_eq!(head.status, StatusCode::TOO_MANY_REQUESTS);
    let body = body.collect().await.unwrap().to_bytes();
    (head.status, head.headers, body)
}

/// The `axum` server: `axum::serve` with the demo's answer on `GET /api/data`, nothing else.
async fn serve_axum() -> SocketAddr {
    let app = axum::Router::new().route(
        "/api/data",
        axum::routing::get(|| async {
            (
                [(http::header::CONTENT_TYPE, "application/json")],
                DATA_BODY,
            )
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// The `bare429` server: `GET /api/data` answers `answer`, nothing is limited.
async fn serve_control(answer: (StatusCode, HeaderMap, Bytes)) -> SocketAddr {
    let app = axum::Router::new().route(
        "/api/data",
        axum::routing::get(move || std::future::ready(answer.clone())),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        listener,
        app,
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
                // Written and parsed by hand, not with hyper's client: a client cheaper per
                // request than the server keeps the pinned server busy, so what is read is the
                // server's capacity, as an outside load generator (h2load, wrk) reads it.
                let mut stream = TcpStream::connect(addr).await.unwrap();
                stream.set_nodelay(true).unwrap();
                let mut request = Vec::with_capacity(128);
                let mut buf = vec![0u8; 4096];
                while issued.fetch_add(1, Ordering::Relaxed) < requests && Instant::now() < deadline
                {
                    request.clear();
                    request
                        .extend_from_slice(b"GET /api/data HTTP/1.1\r\nhost: bench\r\nx-user-id: ");
                    request.extend_from_slice(user(users.next()).as_bytes());
                    request.extend_from_slice(b"\r\n\r\n");
                    stream.write_all(&request).await.unwrap();
                    let (got, body) = read_response(&mut stream, &mut buf).await;
                    assert_eq!(got, status);
                    if status == StatusCode::OK {
                        assert_eq!(body, DATA_BODY.as_bytes());
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

/// Reads one HTTP/1.1 response (a `content-length` body) from `stream` into `buf`: its status
/// and body.
async fn read_response<'b>(stream: &mut TcpStream, buf: &'b mut Vec<u8>) -> (StatusCode, &'b [u8]) {
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(len * 2, 0);
        }
        let n = stream.read(&mut buf[len..]).await.unwrap();
        assert!(n > 0, "the server closed the connection");
        len += n;
        let Some(end) = buf[..len].windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = std::str::from_utf8(&buf[..end]).unwrap();
        let length: usize = head
            .split("\r\n")
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().unwrap())
            })
            .unwrap_or(0);
        if len >= end + 4 + length {
            assert_eq!(len, end + 4 + length, "one response at a time");
            let status = StatusCode::from_bytes(&buf[9..12]).unwrap();
            return (status, &buf[end + 4..len]);
        }
    }
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
    _stdout: Option<BufReader<ChildStdout>>,
    /// The demo binary's log (its address line read), kept open.
    _stderr: Option<BufReader<ChildStderr>>,
    /// The demo binary's policy file, removed on drop.
    policy: Option<std::path::PathBuf>,
}

impl Server {
    fn spawn(side: Side, users: u64) -> Self {
        let cpus = std::env::var("BENCH_SERVER_CPUS").unwrap_or_else(|_| "0".into());
        if side == Side::Demo {
            return Self::spawn_demo(&cpus);
        }
        let exe = std::env::current_exe().unwrap();
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
            _stdout: Some(stdout),
            _stderr: None,
            policy: None,
        }
    }

    /// The `distlimit-demo` binary (built by `cargo bench` with this bench), run as users run
    /// it: its own `main`, runtime, logging and serving stack, on [`DEMO_POLICIES`].
    fn spawn_demo(cpus: &str) -> Self {
        let exe = env!("CARGO_BIN_EXE_distlimit-demo");
        let policy =
            std::env::temp_dir().join(format!("distlimit-bench-{}.toml", std::process::id()));
        std::fs::write(&policy, DEMO_POLICIES).unwrap();
        let mut command = if cpus.is_empty() {
            Command::new(exe)
        } else {
            let mut taskset = Command::new("taskset");
            taskset.arg("-c").arg(cpus).arg(exe);
            taskset
        };
        let mut child = command
            .args(["--listen", "127.0.0.1:0", "--policy"])
            .arg(&policy)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn distlimit-demo");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let addr = loop {
            let mut line = String::new();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "distlimit-demo ended"
            );
            if let Some((_, addr)) = line.trim().split_once("listening on http://") {
                break addr.parse().unwrap();
            }
        };
        Self {
            side: Side::Demo,
            child,
            addr,
            _stdout: None,
            _stderr: Some(stderr),
            policy: Some(policy),
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
        // Closing stdin ends the bench's own servers; the demo binary is killed. Either is our
        // own child, waited for by PID.
        if self.side == Side::Demo {
            let _ = self.child.kill();
        }
        drop(self.child.stdin.take());
        let _ = self.child.wait();
        if let Some(policy) = &self.policy {
            let _ = std::fs::remove_file(policy);
        }
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
    if let Ok(target) = std::env::var("BENCH_TARGET") {
        // Only the client, against a server started elsewhere (the demo binary under
        // callgrind, say), expecting `BENCH_STATUS` (200): one round of `BENCH_REQUESTS`.
        let addr: SocketAddr = target.parse().expect("BENCH_TARGET is an address");
        let seed = knob("BENCH_SEED", 1);
        let status = StatusCode::from_u16(u16::try_from(knob("BENCH_STATUS", 200)).unwrap());
        let (n, elapsed) = runtime(1).block_on(round(addr, &load, status.unwrap(), seed));
        println!("{n} requests in {elapsed:.2?}");
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
            "{} connections, {} users, {} requests or {:?} per round, {rounds} sets of rounds, server CPUs: {}",
            load.connections,
            load.users,
            load.requests,
            load.bound,
            std::env::var("BENCH_SERVER_CPUS").unwrap_or_else(|_| "0".into())
        );
        println!(
            "round  {:>20}  {:>20}  {:>20}  {:>20}  {:>20}  {:>20}  {:>20}  capacity allow/axum  deny/axum",
            "axum req/s, µs/req",
            "bare req/s, µs/req",
            "pass req/s, µs/req",
            "allow req/s, µs/req",
            "deny req/s, µs/req",
            "bare429 req/s, µs/req",
            "demo req/s, µs/req"
        );
        // Per side: requests per second and µs of server CPU per request, one per round.
        let mut rates: [Vec<f64>; 7] = Default::default();
        let mut cpus: [Vec<f64>; 7] = Default::default();
        // (name, side, baseline): throughput and CPU ratios, one per set of rounds.
        let pairs = [
            ("demo/axum", Side::Demo, Side::Axum),
            ("allow/axum", Side::Allow, Side::Axum),
            ("deny/axum", Side::Deny, Side::Axum),
            ("demo/allow", Side::Demo, Side::Allow),
            ("bare/axum", Side::Bare, Side::Axum),
            ("pass/axum", Side::Pass, Side::Axum),
            ("allow/bare", Side::Allow, Side::Bare),
            ("deny/bare", Side::Deny, Side::Bare),
            ("deny/bare429", Side::Deny, Side::Bare429),
            ("bare429/bare", Side::Bare429, Side::Bare),
        ];
        let mut rate_ratios: [Vec<f64>; 10] = Default::default();
        let mut cpu_ratios: [Vec<f64>; 10] = Default::default();
        let index = |side: Side| SIDES.iter().position(|s| *s == side).unwrap();
        for r in 0..rounds {
            let mut rate = [0.0; 7];
            let mut cpu = [0.0; 7];
            for k in 0..SIDES.len() {
                // Rotated, so each side goes first, second, third and last alike.
                let i = (k + usize::try_from(r).unwrap()) % SIDES.len();
                let server = &servers[i];
                let before = server.cpu();
                let (n, elapsed) =
                    round(server.addr, &load, server.side.status(), (r + 1) * 7919).await;
                let used = server.cpu() - before;
                rate[i] = n as f64 / elapsed.as_secs_f64();
                cpu[i] = used.as_secs_f64() * 1e6 / n as f64;
            }
            print!("{r:>5}");
            for i in 0..SIDES.len() {
                print!("  {:>12.0} {:>7.2}", rate[i], cpu[i]);
            }
            let (allow, deny) = (index(Side::Allow), index(Side::Deny));
            println!("  {:>19.3}  {:>9.3}", cpu[0] / cpu[allow], cpu[0] / cpu[deny]);
            for i in 0..SIDES.len() {
                rates[i].push(rate[i]);
                cpus[i].push(cpu[i]);
            }
            for (k, (_, side, base)) in pairs.iter().enumerate() {
                rate_ratios[k].push(rate[index(*side)] / rate[index(*base)]);
                cpu_ratios[k].push(cpu[index(*side)] / cpu[index(*base)]);
            }
        }
        let rates = rates.map(median);
        let cpus = cpus.map(median);
        print!("median req/s:");
        for (i, side) in SIDES.iter().enumerate() {
            print!(" {} {:.0};", side.name(), rates[i]);
        }
        print!(" µs server CPU per request:");
        for (i, side) in SIDES.iter().enumerate() {
            print!(" {} {:.2}", side.name(), cpus[i]);
        }
        println!();
        for (k, (name, side, base)) in pairs.into_iter().enumerate() {
            let ratio = median(rate_ratios[k].clone());
            let cpu_ratio = median(cpu_ratios[k].clone());
            let extra = cpus[index(side)] - cpus[index(base)];
            println!(
                "median {name}: capacity {:.3} (server CPU per request {cpu_ratio:.3}, {extra:+.2} µs per request), client-paced throughput {ratio:.3}",
                1.0 / cpu_ratio
            );
        }
    });
}

/// `BENCH_SIDE=bare|pass|allow|deny`: one server and its client in this process, for profiling one
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
