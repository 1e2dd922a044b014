//! A layer declares the policies it names on the limiter, so a policy reload that drops one is
//! refused and the running set kept; `try_build` refuses a policy the set does not define.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use distlimit_memory::MemoryStore;
use distlimit_policy::{Limiter, PolicySet};
use distlimit_tower::{PolicySelector, RateLimitLayer, RouteTable};

fn set(names: &[&str]) -> PolicySet {
    let toml: String = names
        .iter()
        .map(|n| format!("[[policy]]\nname = \"{n}\"\ntiers = [{{ name = \"t\", limit = 5, per = \"1s\" }}]\n"))
        .collect();
    PolicySet::from_toml_str(&toml).unwrap()
}

#[test]
fn a_reload_that_drops_a_policy_a_layer_uses_is_refused() {
    let limiter = Arc::new(Limiter::new(
        Arc::new(MemoryStore::new()),
        set(&["api", "login", "other"]),
    ));
    let routes = RouteTable::new()
        .route(Some(http::Method::POST), "/login", "login")
        .fallback("api");
    let _layer = RateLimitLayer::builder(limiter.clone(), PolicySelector::routes(routes)).build();

    assert!(
        limiter.replace(set(&["api"])).is_err(),
        "login is used by the layer"
    );
    assert!(
        limiter.replace(set(&["login"])).is_err(),
        "api is used by the layer"
    );
    assert!(
        limiter.policies().get("other").is_some(),
        "the running set stays"
    );
    limiter.replace(set(&["api", "login"])).unwrap();
}

#[test]
fn try_build_refuses_a_policy_the_set_does_not_define() {
    let limiter = Arc::new(Limiter::new(Arc::new(MemoryStore::new()), set(&["api"])));
    assert!(
        RateLimitLayer::builder(limiter.clone(), "missing")
            .try_build()
            .is_err()
    );
    assert!(
        RateLimitLayer::builder(limiter.clone(), "api")
            .try_build()
            .is_ok()
    );
    assert!(limiter.replace(set(&["other"])).is_err());
}
