//! The demo service in process, over real loopback TCP: the limit, its headers, per-user keys,
//! `/metrics`, and the policy file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;
use distlimit_test::replace_file;

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use distlimit_core::ManualClock;
use distlimit_demo::PolicyReload as Reload;
use distlimit_demo::{
    Args, DATA_BODY, DEFAULT_POLICIES, Demo, ServeConfig, StartError, api_limits, limiter, router,
    serve,
};
use distlimit_memory::MemoryStore;
use distlimit_metrics::Metrics;
use distlimit_policy::PolicySet;
use distlimit_tower::TrustedProxies;
use http::StatusCode;
use support::Http;
use support::openmetrics::parse;
use tokio::net::TcpListener;

/// The default service on a memory store whose clock only moves when told: no refill during the
/// test, however slow the machine.
async fn start_frozen() -> (std::net::SocketAddr, Metrics) {
    let metrics = Metrics::new();
    let store = MemoryStore::with_clock(ManualClock::new(1_700_000_000_000_000));
    let policies = PolicySet::from_toml_str(DEFAULT_POLICIES).unwrap();
    let limiter = limiter(Arc::new(store), policies, &metrics);
    let app = router(
        Some(api_limits(limiter, TrustedProxies::none())),
        metrics.clone(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        listener,
        app,
        ServeConfig::default(),
        std::future::pending(),
    ));
    (addr, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_gets_100_then_429_with_headers_and_users_are_separate() {
    let (addr, _) = start_frozen().await;
    let http = Http::new();

    for i in 0..100 {
        let reply = http.get(addr, "/api/data", Some("alice")).await;
        assert_eq!(reply.status, StatusCode::OK, "request {i}");
        assert_eq!(reply.body, DATA_BODY);
        assert_eq!(reply.headers["content-type"], "application/json");
    }
    let denied = http.get(addr, "/api/data", Some("alice")).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    // 60 per minute: the next token in exactly one second.
    assert_eq!(denied.headers["retry-after"], "1");
    assert_eq!(denied.headers["content-type"], "application/problem+json");
    // 60 per 60 s (the burst of 100 is not part of the header's quota).
    assert_eq!(
        denied.headers["ratelimit-policy"],
        r#""api/burst";q=60;w=60"#
    );
    assert!(
        denied.headers["ratelimit"]
            .to_str()
            .unwrap()
            .starts_with(r#""api/burst";r=0;t="#),
        "{:?}",
        denied.headers["ratelimit"]
    );
    assert!(denied.body.contains("429"), "{}", denied.body);

    // Another user has a bucket of their own.
    let bob = http.get(addr, "/api/data", Some("bob")).await;
    assert_eq!(bob.status, StatusCode::OK);
    // Without the header, the client IP is the key: a bucket of its own too.
    for i in 0..100 {
        let reply = http.get(addr, "/api/data", None).await;
        assert_eq!(reply.status, StatusCode::OK, "anonymous request {i}");
    }
    let anonymous = http.get(addr, "/api/data", None).await;
    assert_eq!(anonymous.status, StatusCode::TOO_MANY_REQUESTS);
    // Neither exhausted bucket touches bob's.
    assert_eq!(
        http.get(addr, "/api/data", Some("bob")).await.status,
        StatusCode::OK
    );
    // /metrics and /healthz are not limited.
    for _ in 0..3 {
        assert_eq!(
            http.get(addr, "/metrics", Some("alice")).await.status,
            StatusCode::OK
        );
        assert_eq!(
            http.get(addr, "/healthz", None).await.status,
            StatusCode::OK
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_is_valid_openmetrics_with_the_decisions() {
    let (addr, _) = start_frozen().await;
    let http = Http::new();
    for _ in 0..105 {
        http.get(addr, "/api/data", Some("carol")).await;
    }
    for _ in 0..3 {
        http.get(addr, "/api/data", Some("dave")).await;
    }

    let reply = http.get(addr, "/metrics", None).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.headers["content-type"],
        distlimit_metrics::CONTENT_TYPE
    );
    let exposition = parse(&reply.body).unwrap_or_else(|e| panic!("{e}\n{}", reply.body));

    let decisions = |outcome| {
        exposition.value(
            "distlimit_decisions_total",
            &[
                ("policy", "api"),
                ("outcome", outcome),
                ("source", "primary"),
            ],
        )
    };
    assert_eq!(decisions("allowed"), Some(103.0));
    assert_eq!(decisions("denied"), Some(5.0));
    let api = [("policy", "api")];
    assert_eq!(
        exposition.value("distlimit_decision_duration_seconds_count", &api),
        Some(108.0)
    );
    // carol's 81st to 100th requests left fewer than 20 tokens of 100.
    assert_eq!(
        exposition.value("distlimit_near_limit_total", &api),
        Some(20.0)
    );
    // No key in any label.
    assert!(!reply.body.contains("carol") && !reply.body.contains("dave"));
    // On the memory store there is no breaker and no store error: families without series
    // are left out of the exposition.
    let families: Vec<&str> = exposition.families.keys().map(String::as_str).collect();
    assert_eq!(
        families,
        [
            "distlimit_decision_duration_seconds",
            "distlimit_decisions",
            "distlimit_near_limit"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_file_is_applied_and_hot_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    let policy = |burst: u64| {
        format!(
            "[[policy]]\nname = \"api\"\ntiers = [{{ name = \"burst\", limit = 1, per = \"1h\", burst = {burst} }}]\n{IP_POLICY_TOML}"
        )
    };
    replace_file(&path, policy(2)).unwrap();
    let args = Args::parse_from([
        "distlimit-demo",
        "--listen",
        "127.0.0.1:0",
        "--policy",
        path.to_str().unwrap(),
    ]);
    let demo = Demo::build(&args).await.unwrap();
    let mut reloads = demo.policy_reloads().unwrap();
    let listener = TcpListener::bind(args.listen).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(demo.serve(listener, std::future::pending()));
    let http = Http::new();
    // The watcher reads the file once at start.
    next_reload(&mut reloads, |r| {
        matches!(r, Reload::Applied { generation: 1 })
    })
    .await;

    for _ in 0..2 {
        assert_eq!(
            http.get(addr, "/api/data", Some("erin")).await.status,
            StatusCode::OK
        );
    }
    let denied = http.get(addr, "/api/data", Some("erin")).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        denied.headers["ratelimit-policy"],
        r#""api/burst";q=1;w=3600"#
    );

    // A bigger burst: erin's 2 spent tokens stay spent, 3 more are there.
    replace_file(&path, policy(5)).unwrap();
    next_reload(&mut reloads, |r| {
        matches!(r, Reload::Applied { generation: 2 })
    })
    .await;
    for _ in 0..3 {
        assert_eq!(
            http.get(addr, "/api/data", Some("erin")).await.status,
            StatusCode::OK
        );
    }
    assert_eq!(
        http.get(addr, "/api/data", Some("erin")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    // A broken file is rejected: the running policy stays.
    replace_file(
        &path,
        format!(
            "[[policy]]\nname = \"api\"\ntiers = [{{ name = \"burst\", limit = 0, per = \"1s\" }}]\n{IP_POLICY_TOML}"
        ),
    ).unwrap();
    next_reload(&mut reloads, |r| matches!(r, Reload::Rejected { .. })).await;
    for _ in 0..5 {
        assert_eq!(
            http.get(addr, "/api/data", Some("frank")).await.status,
            StatusCode::OK
        );
    }
    assert_eq!(
        http.get(addr, "/api/data", Some("frank")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    // A valid file without the policy the route uses is refused too: /api/data keeps answering.
    replace_file(&path, IP_POLICY_TOML).unwrap();
    next_reload(&mut reloads, |r| matches!(r, Reload::Rejected { .. })).await;
    assert_eq!(
        http.get(addr, "/api/data", Some("grace")).await.status,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_no_handler_serves_spend_nothing() {
    let (addr, _) = start_frozen().await;
    let http = Http::new();
    for _ in 0..20 {
        let post = http
            .send(http::Method::POST, addr, "/api/data", Some("gina"))
            .await;
        assert_eq!(post.status, StatusCode::METHOD_NOT_ALLOWED);
        let missing = http.get(addr, "/api/nothing", Some("gina")).await;
        assert_eq!(missing.status, StatusCode::NOT_FOUND);
    }
    // gina's 100 tokens are all there.
    for i in 0..100 {
        let reply = http.get(addr, "/api/data", Some("gina")).await;
        assert_eq!(reply.status, StatusCode::OK, "request {i}");
    }
    assert_eq!(
        http.get(addr, "/api/data", Some("gina")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Once denied, a wrong method is still a 405, not a 429.
    let post = http
        .send(http::Method::POST, addr, "/api/data", Some("gina"))
        .await;
    assert_eq!(post.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_mint_users_past_its_ip_limit() {
    let (addr, _) = start_frozen().await;
    let http = Http::new();
    // A new X-User-ID on every request: each user has 100 tokens, but the client's IP has 1 000.
    for i in 0..1000 {
        let reply = http
            .get(addr, "/api/data", Some(&format!("minted-{i}")))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "request {i}");
    }
    let denied = http.get(addr, "/api/data", Some("minted-next")).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        denied.headers["ratelimit-policy"],
        r#""api-ip/client";q=600;w=60"#
    );
    assert_eq!(denied.headers["retry-after"], "1");
}

/// Waits, at most 30 s, for a reload event matching `wanted`.
async fn next_reload(
    reloads: &mut tokio::sync::watch::Receiver<Reload>,
    wanted: impl Fn(&Reload) -> bool,
) {
    let found = tokio::time::timeout(Duration::from_secs(30), reloads.wait_for(|r| wanted(r)))
        .await
        .map(|r| r.map(|reload| reload.clone()));
    match found {
        Ok(Ok(_)) => {}
        other => panic!("no such reload: {other:?}, last {:?}", *reloads.borrow()),
    }
}

/// The per-client-IP policy, generous enough for any test that is not about it.
const IP_POLICY_TOML: &str = "\n[[policy]]\nname = \"api-ip\"\ntiers = [{ name = \"client\", limit = 1000, per = \"1s\", burst = 100000 }]\n";

#[tokio::test]
async fn a_policy_file_without_the_api_policies_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    let other =
        "[[policy]]\nname = \"other\"\ntiers = [{ name = \"t\", limit = 1, per = \"1s\" }]\n";
    let api = "[[policy]]\nname = \"api\"\ntiers = [{ name = \"t\", limit = 1, per = \"1s\" }]\n";
    for (file, missing) in [
        (other.to_owned(), "api"),
        (format!("{other}{IP_POLICY_TOML}"), "api"),
        (api.to_owned(), "api-ip"),
    ] {
        replace_file(&path, &file).unwrap();
        let args = Args::parse_from(["distlimit-demo", "--policy", path.to_str().unwrap()]);
        match Demo::build(&args).await {
            Err(error @ StartError::MissingPolicy(name)) => {
                assert_eq!(name, missing);
                assert_eq!(
                    error.to_string(),
                    format!(
                        "policy: the file must define the policy \"{missing}\" that /api/data uses"
                    )
                );
            }
            other => panic!("{file}: {other:?}"),
        }
    }
    let args = Args::parse_from(["distlimit-demo", "--policy", "/nonexistent/policy.toml"]);
    assert!(matches!(
        Demo::build(&args).await,
        Err(StartError::Policy(_))
    ));
}

#[test]
fn the_command_line_has_the_seed_defaults() {
    let args = Args::default();
    assert_eq!(args.listen.to_string(), "127.0.0.1:3000");
    assert_eq!(args.store.redis, None);
    assert_eq!(args.policy, None);
    assert_eq!(args.store.instances, 1);
    assert!(Args::try_parse_from(["distlimit-demo", "--instances", "0"]).is_err());
    assert!(Args::try_parse_from(["distlimit-demo", "--trusted-proxy", "10.0.0.0/33"]).is_err());
    let args = Args::parse_from(["distlimit-demo", "--trusted-proxy", "10.0.0.0/8"]);
    assert_eq!(args.trusted_proxies.len(), 1);
}
