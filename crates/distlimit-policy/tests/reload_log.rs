//! A refused reload is logged at ERROR level, an applied one at INFO.
//!
//! `tracing` caches per call site whether anyone listens. Other tests of this binary hit the same
//! call sites on other threads without a subscriber; one that registers a call site while this
//! test installs its subscriber can cache "nobody listens" for it. The test rebuilds the cache
//! once its subscriber is in place.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use distlimit_memory::MemoryStore;
use distlimit_policy::{Limiter, PolicySet, Reload, watch};

use crate::support;
use support::next;

fn config(name: &str) -> String {
    format!(
        "[[policy]]\nname = \"{name}\"\ntiers = [ {{ name = \"t\", limit = 5, per = \"1h\" }} ]\n"
    )
}

/// Records the level of every event of this crate.
#[derive(Clone, Default)]
struct Levels(Arc<std::sync::Mutex<Vec<tracing::Level>>>);

impl tracing::Subscriber for Levels {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if event.metadata().target().starts_with("distlimit_policy") {
            self.0.lock().unwrap().push(*event.metadata().level());
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test]
async fn a_refused_reload_is_logged_at_error_level() {
    let levels = Levels::default();
    // The test's runtime runs the watcher's task on this thread.
    let _guard = tracing::subscriber::set_default(levels.clone());
    tracing::callsite::rebuild_interest_cache();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, config("api")).unwrap();
    let l = Arc::new(Limiter::new(
        Arc::new(MemoryStore::new()),
        PolicySet::from_toml_str(&config("api")).unwrap(),
    ));
    l.declare("api").unwrap();
    let watcher = watch(&l, &path, Duration::from_millis(5)).unwrap();
    let mut rx = watcher.subscribe();
    assert_eq!(next(&mut rx).await, Reload::Applied { generation: 1 });
    assert_eq!(*levels.0.lock().unwrap(), [tracing::Level::INFO]);

    for text in [
        config("other"),
        String::new(),
        "[[policy]]\nname = ".to_owned(),
    ] {
        std::fs::write(&path, &text).unwrap();
        assert!(matches!(next(&mut rx).await, Reload::Rejected { .. }));
        assert_eq!(
            levels.0.lock().unwrap().last(),
            Some(&tracing::Level::ERROR),
            "{text:?}"
        );
    }
    assert_eq!(levels.0.lock().unwrap().len(), 4);

    // Another version refused for the same reason (the declared "api" missing): neither logged
    // nor reported again.
    std::fs::write(&path, config("other")).unwrap();
    assert!(matches!(next(&mut rx).await, Reload::Rejected { .. }));
    std::fs::write(&path, config("third")).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!rx.has_changed().unwrap());
    assert_eq!(levels.0.lock().unwrap().len(), 5);

    // Fixed: applied and logged at INFO; the same refusal as before is then news again.
    std::fs::write(&path, config("api")).unwrap();
    assert_eq!(next(&mut rx).await, Reload::Applied { generation: 2 });
    std::fs::write(&path, config("other")).unwrap();
    assert!(matches!(next(&mut rx).await, Reload::Rejected { .. }));
    assert_eq!(
        levels.0.lock().unwrap()[4..],
        [
            tracing::Level::ERROR,
            tracing::Level::INFO,
            tracing::Level::ERROR
        ]
    );
}
