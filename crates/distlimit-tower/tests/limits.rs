//! Several limits in one layer (`RateLimitLayerBuilder::and`): decided as one all-or-nothing
//! batch, over real HTTP on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use distlimit_core::{Decision, Error, Request, Store};
use distlimit_tower::{KeyExtractor, RateLimitHeaders, RateLimitLayer, RouteTable};
use http::{HeaderName, StatusCode};
use support::{frozen_store, get_path, limiter, serve};

/// The user's header. The shared policies `ip` (3 an hour) and `user` (2 an hour) never refill
/// here.
const USER: HeaderName = HeaderName::from_static("x-user-id");

fn per_ip_and_user<S: Store + 'static>(store: S) -> RateLimitLayer {
    RateLimitLayer::builder(limiter(store), "ip")
        .and("user", KeyExtractor::header(USER))
        .legacy_headers(true)
        .try_build()
        .unwrap()
}

/// A store without `decide_now`: checked in the request's future.
fn awaited()
-> distlimit_test::FaultyStore<distlimit_memory::MemoryStore<distlimit_core::ManualClock>> {
    distlimit_test::FaultyStore::new(frozen_store())
        .with_default(distlimit_test::Fault::Delay(std::time::Duration::ZERO))
}

/// A user over their own limit spends nothing of the address's: another user behind the same
/// address is served; the address's limit then denies, and each 429 names only its limit.
async fn a_denied_user_spends_nothing_of_the_address(layer: RateLimitLayer) {
    let addr = serve(layer).await;
    let alice = [("x-user-id", "alice")];
    for _ in 0..2 {
        assert_eq!(
            get_path(addr, "/api/data", &alice).await.status,
            StatusCode::OK
        );
    }
    for _ in 0..5 {
        let denied = get_path(addr, "/api/data", &alice).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            denied.header("ratelimit"),
            Some(r#""user/hour";r=0;t=2760"#)
        );
        assert_eq!(
            denied.header("ratelimit-policy"),
            Some(r#""user/hour";q=2;w=3600"#)
        );
        assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
        assert_eq!(
            denied.json()["violated-policies"],
            serde_json::json!(["user/hour"])
        );
    }
    // Two of the address's three units spent (alice's admitted requests only).
    let bob = get_path(addr, "/api/data", &[("x-user-id", "bob")]).await;
    assert_eq!(bob.status, StatusCode::OK);
    let carol = get_path(addr, "/api/data", &[("x-user-id", "carol")]).await;
    assert_eq!(carol.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(carol.header("ratelimit"), Some(r#""ip/hour";r=0;t=2760"#));
    assert_eq!(carol.header("retry-after"), Some("2760"));
    assert_eq!(
        carol.json()["violated-policies"],
        serde_json::json!(["ip/hour"])
    );
    // Carol's denial charged her nothing either.
    let layer_limiter_left = get_path(addr, "/api/data", &[("x-user-id", "carol")]).await;
    assert_eq!(
        layer_limiter_left.header("ratelimit"),
        Some(r#""ip/hour";r=0;t=2760"#)
    );
}

#[tokio::test]
async fn a_denied_user_spends_nothing_of_the_address_on_a_store_answering_at_once() {
    a_denied_user_spends_nothing_of_the_address(per_ip_and_user(frozen_store())).await;
}

#[tokio::test]
async fn a_denied_user_spends_nothing_of_the_address_on_an_awaited_store() {
    a_denied_user_spends_nothing_of_the_address(per_ip_and_user(awaited())).await;
}

#[tokio::test]
async fn an_admitted_request_shows_every_limit() {
    let layer = RateLimitLayer::builder(limiter(frozen_store()), "ip")
        .and("user", KeyExtractor::header(USER))
        .headers(RateLimitHeaders::Always)
        .legacy_headers(true)
        .build();
    let addr = serve(layer).await;
    let ok = get_path(addr, "/api/data", &[("x-user-id", "alice")]).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(
        ok.header("ratelimit"),
        Some(r#""ip/hour";r=2;t=2760, "user/hour";r=1;t=2760"#)
    );
    assert_eq!(
        ok.header("ratelimit-policy"),
        Some(r#""ip/hour";q=3;w=3600, "user/hour";q=2;w=3600"#)
    );
    // The legacy trio: the tightest tier.
    assert_eq!(ok.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(ok.header("x-ratelimit-remaining"), Some("1"));
}

#[tokio::test]
async fn each_limit_applies_where_its_selector_names_a_policy() {
    // "user" on /login only: /api/data is limited per address alone.
    let layer = RateLimitLayer::builder(limiter(frozen_store()), "ip")
        .and(
            RouteTable::new().route(None, "/login", "user"),
            KeyExtractor::header(USER),
        )
        .headers(RateLimitHeaders::Always)
        .build();
    let addr = serve(layer).await;
    let data = get_path(addr, "/api/data", &[("x-user-id", "alice")]).await;
    assert_eq!(data.header("ratelimit"), Some(r#""ip/hour";r=2;t=2760"#));
    let login = support::send(
        addr,
        http::Method::POST,
        "/login",
        &[("x-user-id", "alice")],
    )
    .await;
    assert_eq!(login.status, StatusCode::OK);
    assert_eq!(
        login.header("ratelimit"),
        Some(r#""ip/hour";r=1;t=2760, "user/hour";r=1;t=2760"#)
    );
}

#[tokio::test]
async fn a_limit_may_charge_its_own_cost() {
    // Two units per request from the address, the layer's one from the user.
    let layer = RateLimitLayer::builder(limiter(frozen_store()), "user")
        .key(KeyExtractor::header(USER))
        .and_with_cost("ip", KeyExtractor::client_ip(), |_| 2)
        .headers(RateLimitHeaders::Always)
        .build();
    let addr = serve(layer).await;
    let ok = get_path(addr, "/api/data", &[("x-user-id", "alice")]).await;
    assert_eq!(
        ok.header("ratelimit"),
        Some(r#""user/hour";r=1;t=2760, "ip/hour";r=1;t=2760"#)
    );
    // The address has one unit left, this request costs two there: denied by "ip" alone.
    let denied = get_path(addr, "/api/data", &[("x-user-id", "bob")]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.header("ratelimit"), Some(r#""ip/hour";r=1;t=2760"#));
}

/// A store that must be awaited whose first try without waiting (`decide_now`,
/// `decide_all_now`) runs a hook, once.
struct Hooked {
    inner: distlimit_test::FaultyStore<distlimit_memory::MemoryStore<distlimit_core::ManualClock>>,
    hook: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Hooked {
    fn run(&self) {
        if let Some(hook) = self.hook.lock().unwrap().take() {
            hook();
        }
    }
}

#[async_trait::async_trait]
impl Store for Hooked {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        self.inner.decide(request).await
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        self.inner.decide_all(requests).await
    }

    fn decide_now(&self, _: &Request<'_>) -> Option<Result<Decision, Error>> {
        self.run();
        None
    }

    fn decide_all_now(&self, _: &[Request<'_>], _: &mut [Decision]) -> Option<Result<(), Error>> {
        self.run();
        None
    }
}

/// A request the store must be awaited for resolves its policies once, in `call`: when a new
/// set is published between its try without waiting and the await, it is still decided (and
/// answered) under the set it loaded; the next request under the new one.
#[tokio::test]
async fn a_request_on_an_awaited_store_resolves_its_policies_once() {
    for two_limits in [false, true] {
        let store = Hooked {
            inner: awaited(),
            hook: std::sync::Mutex::new(None),
        };
        let limiter = limiter(store);
        let user_limit = r#"name = "hour", algorithm = "fixed_window", limit = 2"#;
        let raised = support::POLICIES.replace(user_limit, &user_limit.replace('2', "5"));
        let raised = distlimit_policy::PolicySet::from_toml_str(&raised).unwrap();
        let swap = std::sync::Arc::clone(&limiter);
        *limiter.store().hook.lock().unwrap() = Some(Box::new(move || {
            swap.replace(raised).unwrap();
        }));
        let mut builder = RateLimitLayer::builder(limiter, "user");
        if two_limits {
            builder = builder.and("ip", KeyExtractor::header(USER));
        }
        let addr = serve(builder.headers(RateLimitHeaders::Always).build()).await;
        let user = [("x-user-id", "alice")];
        for q in [2, 5] {
            let reply = get_path(addr, "/api/data", &user).await;
            assert_eq!(reply.status, StatusCode::OK);
            let policy = reply.header("ratelimit-policy").unwrap();
            assert!(
                policy.contains(&format!(r#""user/hour";q={q};"#)),
                "{policy}"
            );
        }
    }
}
