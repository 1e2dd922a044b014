//! Declared policies: a set without one is refused by `replace` and by the hot reload, which
//! keep the running set; an empty or half-written file is refused on reload like at start.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use distlimit_test::replace_file;
use std::sync::Arc;
use std::time::Duration;

use distlimit_memory::MemoryStore;
use distlimit_policy::{Field, Limiter, PolicySet, Reload, watch};

use crate::support;
use support::next;

fn config(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("[[policy]]\nname = \"{n}\"\ntiers = [ {{ name = \"t\", limit = 5, per = \"1h\" }} ]\n"))
        .collect()
}

fn limiter(names: &[&str]) -> Arc<Limiter<MemoryStore>> {
    let set = PolicySet::from_toml_str(&config(names)).unwrap();
    Arc::new(Limiter::new(Arc::new(MemoryStore::new()), set))
}

#[test]
fn declaring_an_undefined_policy_is_an_error() {
    let l = limiter(&["api"]);
    let e = l.declare("search").unwrap_err();
    assert_eq!((e.field(), e.policy()), (Field::Policy, Some("search")));
    assert!(l.declared().is_empty());
    l.declare("api").unwrap();
    l.declare("api").unwrap();
    assert_eq!(l.declared(), ["api"]);
}

#[tokio::test]
async fn replace_refuses_a_set_without_a_declared_policy_and_keeps_the_running_one() {
    let l = limiter(&["api", "login"]);
    l.declare("api").unwrap();
    let running = l.policies();
    let e = l
        .replace(PolicySet::from_toml_str(&config(&["login"])).unwrap())
        .unwrap_err();
    assert_eq!((e.field(), e.policy()), (Field::Policy, Some("api")));
    assert!(Arc::ptr_eq(&l.policies(), &running));
    assert!(l.check("api", b"k").await.unwrap().is_allowed());
    // An undeclared policy may go.
    l.replace(PolicySet::from_toml_str(&config(&["api"])).unwrap())
        .unwrap();
    assert!(l.policies().get("login").is_none());
}

#[tokio::test]
async fn a_reload_without_a_declared_policy_or_with_an_empty_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    replace_file(&path, config(&["api", "login"])).unwrap();
    let l = limiter(&["api", "login"]);
    l.declare("api").unwrap();
    let watcher = watch(&l, &path, Duration::from_millis(5)).unwrap();
    let mut rx = watcher.subscribe();
    assert_eq!(next(&mut rx).await, Reload::Applied { generation: 1 });
    let running = l.policies();

    replace_file(&path, config(&["login"])).unwrap();
    let Reload::Rejected { error } = next(&mut rx).await else {
        panic!("a set without the declared policy was applied")
    };
    assert_eq!(
        (error.field(), error.policy()),
        (Field::Policy, Some("api"))
    );
    assert!(Arc::ptr_eq(&l.policies(), &running));

    // Empty, then half-written (cut inside a policy, then after a complete one without "api").
    let whole = config(&["api", "login"]);
    for text in ["", &whole[..whole.len() / 3], &config(&["login"])[..]] {
        replace_file(&path, text).unwrap();
        let Reload::Rejected { error } = next(&mut rx).await else {
            panic!("{text:?} was applied")
        };
        assert!(
            matches!(error.field(), Field::Policy | Field::Toml),
            "{error}"
        );
        assert!(Arc::ptr_eq(&l.policies(), &running));
    }
    assert!(l.check("api", b"k").await.unwrap().is_allowed());

    replace_file(&path, config(&["api"])).unwrap();
    assert_eq!(next(&mut rx).await, Reload::Applied { generation: 2 });
}
