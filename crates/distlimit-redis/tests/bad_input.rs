//! Bad input and bad servers: each a clear, typed error, within its timeout, never a panic.
//!
//! Servers: the shared ones from `cargo xtask test` (see `support`), and private `redis-server`s
//! for what would disturb other tests (ACL users, paused or crippled servers).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::Read;
use std::net::TcpListener;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use distlimit_core::{Error, Key, KeyError, Limit, MAX_KEY_LEN, Quota, Request, Store, StoreExt};
use distlimit_redis::{Mode, RedisStore, hash_slot};
use distlimit_test::server::free_port;
use support::RedisServer;

/// Tests that pause or count commands on the shared Cluster run one at a time.
static CLUSTER: LazyLock<tokio::sync::Mutex<()>> = LazyLock::new(Default::default);

fn limit() -> Limit {
    Limit::token_bucket(Quota::per_hour(10).unwrap())
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// What the error says, for the assertions' messages.
fn kind(result: &Result<impl std::fmt::Debug, Error>) -> String {
    format!("{result:?}")
}

// ---------------------------------------------------------------------------------------------
// Unreachable and silent servers

#[tokio::test]
async fn unreachable_server_is_a_transient_error_within_the_connect_timeout() {
    let connect_timeout = Duration::from_millis(500);
    let port = free_port().unwrap(); // nothing listens there
    let url = format!("redis://127.0.0.1:{port}");
    let builders = [
        ("standalone", RedisStore::builder(&url)),
        ("pool", RedisStore::builder(&url).pool(4)),
        ("sentinel", RedisStore::sentinel([url.clone()], "distlimit")),
        ("cluster", RedisStore::cluster([url.clone()])),
        (
            "sentinel URL",
            RedisStore::builder(format!("redis+sentinel://127.0.0.1:{port}/svc")),
        ),
        (
            "cluster URL",
            RedisStore::builder(format!("redis+cluster://127.0.0.1:{port}")),
        ),
    ];
    for (what, builder) in builders {
        let start = Instant::now();
        let result = builder.connect_timeout(connect_timeout).connect().await;
        let elapsed = start.elapsed();
        match &result {
            Err(e @ (Error::Unavailable { .. } | Error::Timeout { .. })) => {
                assert!(e.is_transient(), "{what}: {e:?}");
                // A refused connection sent nothing. redis-rs' Cluster client folds its
                // refused initial connections into one error of another kind: not marked.
                if !what.starts_with("cluster") {
                    assert!(e.is_not_sent(), "{what}: {e:?}");
                }
            }
            other => panic!("{what}: expected a transient error, got {}", kind(other)),
        }
        // No tight timing: only that the connect timeout bounds it.
        assert!(
            elapsed < connect_timeout + Duration::from_secs(1),
            "{what}: took {elapsed:?}"
        );
    }
}

#[tokio::test]
async fn a_server_that_never_answers_is_a_timeout() {
    // Accepts connections and never says a word.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
            if held.len() > 16 {
                break;
            }
        }
        // Keep them open until the test binary exits.
        let mut sink = [0u8; 64];
        for mut s in held {
            let _ = s.read(&mut sink);
        }
    });
    let connect_timeout = Duration::from_millis(300);
    let start = Instant::now();
    let result = RedisStore::builder(format!("redis://127.0.0.1:{port}"))
        .connect_timeout(connect_timeout)
        .connect()
        .await;
    let elapsed = start.elapsed();
    assert!(
        matches!(result, Err(Error::Timeout { .. })),
        "expected Error::Timeout, got {}",
        kind(&result)
    );
    assert!(
        elapsed < connect_timeout + Duration::from_secs(1),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn a_paused_server_times_out_and_the_script_is_not_sent_again() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let response_timeout = Duration::from_millis(100);
    let store = RedisStore::builder(server.url())
        .response_timeout(response_timeout)
        .connect()
        .await
        .unwrap();
    let mut admin = raw(&server.url()).await;
    let () = redis::cmd("CLIENT")
        .arg(&["PAUSE", "400", "ALL"][..])
        .query_async(&mut admin)
        .await
        .unwrap();
    let start = Instant::now();
    let result = store.check("paused", limit()).await;
    let elapsed = start.elapsed();
    match &result {
        Err(e @ Error::Timeout { after, .. }) => {
            assert!(e.is_transient());
            assert_eq!(*after, response_timeout);
        }
        other => panic!("expected Error::Timeout, got {}", kind(other)),
    }
    assert!(
        elapsed < response_timeout + Duration::from_secs(1),
        "{elapsed:?}"
    );
    // The script was on its way: it runs when the pause ends, once. This is why a timed-out
    // consuming script is never resent.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let peek = store.peek("paused", limit()).await.unwrap();
    assert_eq!(peek.remaining(), 9, "charged exactly once: {peek:?}");
}

#[tokio::test]
async fn a_paused_cluster_times_out_and_the_script_is_not_sent_again() {
    let Some(urls) = support::cluster_urls() else {
        return;
    };
    let _serial = CLUSTER.lock().await;
    let response_timeout = Duration::from_millis(100);
    let store = RedisStore::cluster(urls.clone())
        .prefix(support::unique_prefix("paused-cluster"))
        .response_timeout(response_timeout)
        .connect()
        .await
        .unwrap();
    // Warm up the slot map and connections.
    store.peek("warm-up", limit()).await.unwrap();
    let mut masters = Vec::new();
    for url in &urls {
        let mut conn = raw(url).await;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await.unwrap();
        if matches!(&role[0], redis::Value::BulkString(r) if r == b"master") {
            masters.push(conn);
        }
    }
    assert_eq!(masters.len(), 3);
    for conn in &mut masters {
        // Cached everywhere, so the paused `EVALSHA` is the whole call (no `NOSCRIPT`).
        distlimit_redis::test_hook::load_scripts(conn)
            .await
            .unwrap();
    }
    for conn in &mut masters {
        let () = redis::cmd("CLIENT")
            .arg(&["PAUSE", "400", "WRITE"][..])
            .query_async(conn)
            .await
            .unwrap();
    }
    let result = store.check("paused", limit()).await;
    assert!(
        matches!(result, Err(Error::Timeout { .. })),
        "expected Error::Timeout, got {}",
        kind(&result)
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let peek = store.peek("paused", limit()).await.unwrap();
    assert_eq!(
        peek.remaining(),
        9,
        "ran exactly once, never resent by the cluster client: {peek:?}"
    );
}

#[tokio::test]
async fn a_restarted_server_fails_calls_fast_then_is_reconnected() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let mux = RedisStore::builder(&url).connect().await.unwrap();
    let pool = RedisStore::builder(&url).pool(2).connect().await.unwrap();
    for store in [&mux, &pool] {
        assert!(store.check("k", limit()).await.unwrap().is_allowed());
    }
    server.kill();
    for store in [&mux, &pool] {
        for _ in 0..3 {
            let start = Instant::now();
            let result = store.check("k", limit()).await;
            assert!(
                matches!(&result, Err(e) if e.is_transient()),
                "{:?}: expected a transient error, got {}",
                store.mode(),
                kind(&result)
            );
            // Refused at once: no backoff to wait out (the response timeout is 200 ms).
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "{:?}",
                start.elapsed()
            );
        }
    }
    server.restart().unwrap(); // on the same port
    for store in [&mux, &pool] {
        let start = Instant::now();
        loop {
            match store.check("k", limit()).await {
                Ok(d) => {
                    assert!(d.is_allowed());
                    break;
                }
                Err(e) => {
                    assert!(e.is_transient(), "{e:?}");
                    assert!(
                        start.elapsed() < Duration::from_secs(5),
                        "{:?}: not reconnected: {e:?}",
                        store.mode()
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
}

/// TLS: needs the `tls` feature (on by default).
#[cfg(feature = "tls")]
mod tls {
    use super::*;

    /// Runs `openssl` with `args` in `dir`.
    fn openssl(dir: &std::path::Path, args: &[&str]) -> bool {
        std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// A test CA (`ca.pem`), a server certificate for 127.0.0.1 (`server.pem`, `server.key`) and a
    /// client certificate (`client.pem`, `client.key`) made by the `openssl` command in `dir`.
    fn certificates(dir: &std::path::Path) -> bool {
        std::fs::write(
            dir.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        let made = openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=distlimit test CA",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
            ],
        ) && ["server", "client"].iter().all(|name| {
            openssl(
                dir,
                &[
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-subj",
                    &format!("/CN={name}"),
                    "-keyout",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.csr"),
                ],
            ) && openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "1",
                    "-extfile",
                    "san.ext",
                    "-out",
                    &format!("{name}.pem"),
                ],
            )
        });
        if !made {
            assert!(
                !support::required(),
                "the `openssl` command is needed for the TLS test"
            );
            eprintln!("note: skipped: no `openssl` command to make test certificates");
        }
        made
    }

    #[tokio::test]
    async fn tls_with_a_private_ca_client_certificates_and_acl_credentials() {
        /// Removed on drop, a failed test included.
        struct TempDir(std::path::PathBuf);
        impl Drop for TempDir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let temp =
            TempDir(std::env::temp_dir().join(format!("distlimit-tls-{}", std::process::id())));
        let dir = temp.0.clone();
        std::fs::create_dir_all(&dir).unwrap();
        if !certificates(&dir) {
            return;
        }
        let file = |name: &str| dir.join(name).display().to_string();
        let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
        let tls_port = free_port().unwrap().to_string();
        let Some(server) = RedisServer::start_with(&[
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &file("server.pem"),
            "--tls-key-file",
            &file("server.key"),
            "--tls-ca-cert-file",
            &file("ca.pem"),
            "--tls-auth-clients",
            "yes",
        ]) else {
            return;
        };
        let mut admin = raw(&server.url()).await;
        let () = redis::cmd("ACL")
            .arg(&["SETUSER", "app", "on", ">s3cret", "~*", "+@all"][..])
            .query_async(&mut admin)
            .await
            .unwrap();
        let url = format!("rediss://app:s3cret@127.0.0.1:{tls_port}");
        for pool in [false, true] {
            let builder = RedisStore::builder(&url)
                .tls_root_certificate(read("ca.pem"))
                .tls_client_certificate(read("client.pem"), read("client.key"));
            let builder = if pool { builder.pool(2) } else { builder };
            let store = builder.connect().await.unwrap();
            assert!(store.check("tls", limit()).await.unwrap().is_allowed());
        }
        // Without the CA the server's certificate is not trusted: a permanent error.
        let result = RedisStore::connect(&url).await;
        assert!(
            matches!(&result, Err(Error::Config { .. })),
            "expected Error::Config, got {}",
            kind(&result)
        );
        // Certificates with a plain-text URL, or garbage for a certificate: configuration errors.
        for builder in [
            RedisStore::builder(server.url()).tls_root_certificate(read("ca.pem")),
            RedisStore::builder(&url).tls_root_certificate(b"not a certificate".to_vec()),
        ] {
            let result = builder.connect().await;
            assert!(
                matches!(&result, Err(Error::Config { .. })),
                "expected Error::Config, got {}",
                kind(&result)
            );
        }
        drop(server);
    }
}

// ---------------------------------------------------------------------------------------------
// Invalid configuration

#[tokio::test]
async fn invalid_urls_and_options_are_config_errors() {
    let urls = [
        "",
        "not a url",
        "localhost:6379",
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:notaport",
        "redis://[::1",
        "redis+sentinel://127.0.0.1:26379",
        "redis+sentinel://127.0.0.1:26379/",
        "redis+sentinel://127.0.0.1:26379/svc/notadb",
        "redis+sentinel://,127.0.0.1:26379/svc",
        "redis+sentinel://127.0.0.1:26379/%zz",
        "redis+cluster://127.0.0.1:1,,127.0.0.1:2",
        "redis+cluster://127.0.0.1:1/5",
    ];
    for url in urls {
        let result = RedisStore::connect(url).await;
        assert!(
            matches!(result, Err(Error::Config { .. })),
            "{url:?}: expected Error::Config, got {}",
            kind(&result)
        );
    }
    let url = "redis://127.0.0.1:1";
    let builders = [
        (
            "a prefix with a brace",
            RedisStore::builder(url).prefix("a{b"),
        ),
        ("a pool of 0", RedisStore::builder(url).pool(0)),
        (
            "a pool on a Cluster",
            RedisStore::cluster(["redis://127.0.0.1:1"]).pool(2),
        ),
        (
            "no sentinels",
            RedisStore::sentinel(Vec::<String>::new(), "svc"),
        ),
        (
            "no cluster nodes",
            RedisStore::cluster(Vec::<String>::new()),
        ),
        (
            "a sentinel URL that is none",
            RedisStore::sentinel(["127.0.0.1:26379"], "svc"),
        ),
        (
            "a cluster database",
            RedisStore::cluster(["redis://127.0.0.1:1"]).database(3),
        ),
        (
            "a zero timeout",
            RedisStore::builder(url).response_timeout(Duration::ZERO),
        ),
    ];
    for (what, builder) in builders {
        let result = builder.connect().await;
        assert!(
            matches!(result, Err(Error::Config { .. })),
            "{what}: expected Error::Config, got {}",
            kind(&result)
        );
    }
}

#[tokio::test]
async fn an_unknown_sentinel_service_is_a_config_error() {
    let Some((urls, _service)) = support::sentinel() else {
        return;
    };
    let result = RedisStore::sentinel(urls, "no-such-service")
        .connect()
        .await;
    assert!(
        matches!(&result, Err(Error::Config { message, .. }) if message.contains("no-such-service")),
        "expected Error::Config, got {}",
        kind(&result)
    );
}

#[tokio::test]
async fn acl_user_without_evalsha_is_a_config_error() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let mut admin = raw(&server.url()).await;
    let () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", "limited", "on", ">pw", "~*", "+@all", "-evalsha", "-eval",
            ][..],
        )
        .query_async(&mut admin)
        .await
        .unwrap();
    let port = server.port();
    let store = RedisStore::connect(&format!("redis://limited:pw@127.0.0.1:{port}"))
        .await
        .unwrap();
    let result = store.check("k", limit()).await;
    match &result {
        Err(e @ Error::Config { message, .. }) => {
            assert!(!e.is_transient());
            assert!(message.contains("NOPERM"), "{message}");
        }
        other => panic!("expected Error::Config, got {}", kind(other)),
    }
    // The same user through the pool.
    let store = RedisStore::builder(format!("redis://limited:pw@127.0.0.1:{port}"))
        .pool(2)
        .connect()
        .await
        .unwrap();
    let result = store.check("k", limit()).await;
    assert!(
        matches!(result, Err(Error::Config { .. })),
        "{}",
        kind(&result)
    );
}

#[tokio::test]
async fn wrong_or_missing_credentials_are_config_errors() {
    let Some(server) = RedisServer::start_with(&["--requirepass", "right"]) else {
        return;
    };
    let port = server.port();
    let cases = [
        (
            "a wrong password",
            format!("redis://:wrong@127.0.0.1:{port}"),
        ),
        (
            "an unknown user",
            format!("redis://nobody:right@127.0.0.1:{port}"),
        ),
        ("no password", format!("redis://127.0.0.1:{port}")),
    ];
    for (what, url) in cases {
        for pool in [false, true] {
            let builder = RedisStore::builder(&url);
            let builder = if pool { builder.pool(2) } else { builder };
            let result = builder.connect().await;
            assert!(
                matches!(result, Err(Error::Config { .. })),
                "{what} (pool: {pool}): expected Error::Config, got {}",
                kind(&result)
            );
        }
    }
    let store = RedisStore::connect(&format!("redis://:right@127.0.0.1:{port}"))
        .await
        .unwrap();
    assert!(store.check("k", limit()).await.unwrap().is_allowed());
    // Credentials from the builder override the URL's.
    let store = RedisStore::builder(format!("redis://:wrong@127.0.0.1:{port}"))
        .node_auth(None, "right")
        .connect()
        .await
        .unwrap();
    assert!(store.check("k", limit()).await.unwrap().is_allowed());
}

#[tokio::test]
async fn scripting_disabled_is_a_config_error() {
    let Some(server) = RedisServer::start_with(&[
        "--rename-command",
        "EVALSHA",
        "",
        "--rename-command",
        "EVAL",
        "",
    ]) else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let result = store.check("k", limit()).await;
    assert!(
        matches!(&result, Err(Error::Config { message, .. }) if message.contains("Lua")),
        "expected Error::Config, got {}",
        kind(&result)
    );
}

// ---------------------------------------------------------------------------------------------
// Bad data at a key

#[tokio::test]
async fn another_value_at_a_key_is_a_protocol_error_and_is_left_alone() {
    let Some(url) = support::standalone_url() else {
        return;
    };
    let store = RedisStore::builder(&url)
        .prefix(support::unique_prefix("bad-value"))
        .connect()
        .await
        .unwrap();
    let mut conn = raw(&url).await;
    let string_key = store.redis_key("", Key::new("a string").unwrap());
    let list_key = store.redis_key("", Key::new("a list").unwrap());
    let () = redis::cmd("SET")
        .arg(&string_key)
        .arg("not a bucket")
        .query_async(&mut conn)
        .await
        .unwrap();
    let () = redis::cmd("RPUSH")
        .arg(&list_key)
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    for algorithm in distlimit_core::Algorithm::ALL {
        let limit = Limit::new(algorithm, Quota::per_hour(10).unwrap());
        for (key, what) in [("a string", "corrupt"), ("a list", "WRONGTYPE")] {
            for cost in [0, 1, 11] {
                let result = store.check_cost(key, limit, cost).await;
                match &result {
                    Err(e @ Error::BadState { message, .. }) => {
                        assert!(!e.is_transient());
                        assert!(message.contains(what), "{algorithm} {key}: {message}");
                    }
                    other => panic!(
                        "{algorithm}, {key}, cost {cost}: expected Error::BadState, got {}",
                        kind(other)
                    ),
                }
            }
            // In a batch too.
            let k = Key::new(key).unwrap();
            let other = Key::new("fresh").unwrap();
            let result = store
                .decide_all(&[Request::new(other, limit), Request::new(k, limit)])
                .await;
            assert!(
                matches!(result, Err(Error::BadState { .. })),
                "{}",
                kind(&result)
            );
        }
    }
    let value: Vec<u8> = redis::cmd("GET")
        .arg(&string_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(value, b"not a bucket", "left as it was");
    let fresh = store.peek("fresh", limit()).await.unwrap();
    assert_eq!(fresh.remaining(), 10, "a failed batch charges nothing");
}

// ---------------------------------------------------------------------------------------------
// Keys

#[tokio::test]
async fn oversized_identities_are_refused_and_the_longest_works() {
    assert!(matches!(
        Key::new(vec![b'k'; MAX_KEY_LEN + 1].as_slice()),
        Err(KeyError::TooLong { len, max }) if len == MAX_KEY_LEN + 1 && max == MAX_KEY_LEN
    ));
    let Some(url) = support::standalone_url() else {
        return;
    };
    for hash in [false, true] {
        let store = RedisStore::builder(&url)
            .prefix(support::unique_prefix("long"))
            .hash_identities(hash)
            .connect()
            .await
            .unwrap();
        let too_long = vec![b'}'; MAX_KEY_LEN + 1];
        let result = store.check(&too_long, limit()).await;
        assert!(
            matches!(result, Err(Error::InvalidKey(KeyError::TooLong { .. }))),
            "{}",
            kind(&result)
        );
        // The longest key, all of it escaped (three bytes a byte in the Redis key).
        for byte in [b'x', b'{', b'%'] {
            let longest = vec![byte; MAX_KEY_LEN];
            let d = store.check_cost(&longest, limit(), 3).await.unwrap();
            assert!(d.is_allowed() && d.remaining() == 7, "{d:?}");
            let k = Key::new(&longest).unwrap();
            let batch = [
                Request::new(k, limit()),
                Request::new(k, limit()).with_policy("p").unwrap(),
            ];
            assert!(store.decide_all(&batch).await.is_ok());
        }
    }
}

#[tokio::test]
async fn tricky_identities_land_where_the_layout_says() {
    let Some(url) = support::standalone_url() else {
        return;
    };
    let store = RedisStore::builder(&url)
        .prefix(support::unique_prefix("tricky"))
        .connect()
        .await
        .unwrap();
    let mut conn = raw(&url).await;
    let ids: [&[u8]; 7] = [
        b"user:{42}",
        b"}{",
        b"a\0b",
        "é😀".as_bytes(),
        b"\xff\xfe",
        b"%7B",
        b"{",
    ];
    for (i, id) in ids.iter().enumerate() {
        let key = Key::new(id).unwrap();
        let request = Request::new(key, limit()).with_cost(i as u64 + 1);
        let d = store.decide(&request).await.unwrap();
        assert_eq!(d.remaining(), 10 - (i as u64 + 1));
        let redis_key = store.redis_key("", key);
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&redis_key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            ttl > 0,
            "{key:?} at {}: PTTL {ttl}",
            redis_key.escape_ascii()
        );
    }
}

#[tokio::test]
async fn cluster_slots_agree_with_the_server() {
    let Some(urls) = support::cluster_urls() else {
        return;
    };
    let store = RedisStore::cluster(urls.clone()).connect().await.unwrap();
    assert_eq!(store.mode(), Mode::Cluster);
    let mut conn = raw(&urls[0]).await;
    for id in [&b"user:{42}"[..], b"}{", b"a\0b", b"\xff", b"{}", b"%"] {
        let key = Key::new(id).unwrap();
        for policy in ["", "second", "{day}"] {
            let redis_key = store.redis_key(policy, key);
            let slot: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&redis_key)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(slot, hash_slot(&redis_key));
            assert_eq!(slot, store.layout().slot(key), "{key:?} {policy:?}");
        }
    }
}
