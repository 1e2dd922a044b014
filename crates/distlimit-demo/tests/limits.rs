//! The demo binary's two limits on `/api/data` (per client IP, per user) are one decision: a
//! request denied by one charges neither.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use http::StatusCode;
use support::{DemoProcess, Http, unique};

/// Per user a burst of 5, per client IP a burst of 50, both refilled at one token an hour: no
/// refill while the test runs.
const POLICY: &str = r#"
[[policy]]
name = "api"
tiers = [{ name = "burst", algorithm = "token_bucket", limit = 1, per = "1h", burst = 5 }]

[[policy]]
name = "api-ip"
tiers = [{ name = "client", algorithm = "token_bucket", limit = 1, per = "1h", burst = 50 }]
"#;

/// One greedy user behind a shared address (a NAT) spends only their own limit: after user A's
/// 100 requests (5 admitted, 95 denied by A's limit), user B behind the same address is served,
/// and the address's limit is spent by admitted requests only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_over_their_limit_does_not_spend_the_address_limit() {
    let dir = std::env::temp_dir().join(unique("distlimit-demo-limits"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("policy.toml");
    std::fs::write(&path, POLICY).unwrap();
    let demo = DemoProcess::start(&["--policy", path.to_str().unwrap()]);
    let http = Http::new();

    let mut admitted = 0;
    for i in 0..100 {
        let reply = http.get(demo.addr, "/api/data", Some("user-a")).await;
        match reply.status {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                // Denied by A's own limit, and named so.
                let ratelimit = reply.headers["ratelimit"].to_str().unwrap();
                assert!(
                    ratelimit.starts_with(r#""api/burst";r=0;t="#),
                    "{i}: {ratelimit}"
                );
            }
            other => panic!("request {i}: {other}"),
        }
    }
    assert_eq!(admitted, 5);

    let b = http.get(demo.addr, "/api/data", Some("user-b")).await;
    assert_eq!(
        b.status,
        StatusCode::OK,
        "user B behind the same address: {:?}",
        b.headers
    );
    // 6 of the address's 50 spent: 44 more users are served, the next one is denied by the
    // address's limit.
    for n in 0..44 {
        let user = format!("user-{n}");
        let reply = http.get(demo.addr, "/api/data", Some(&user)).await;
        assert_eq!(reply.status, StatusCode::OK, "{user}");
    }
    let over = http.get(demo.addr, "/api/data", Some("user-last")).await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
    let ratelimit = over.headers["ratelimit"].to_str().unwrap();
    assert!(
        ratelimit.starts_with(r#""api-ip/client";r=0;t="#),
        "{ratelimit}"
    );
    drop(demo);
    let _ = std::fs::remove_dir_all(&dir);
}
