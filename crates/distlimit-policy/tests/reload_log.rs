//! A refused reload is logged at ERROR level, an applied one at INFO.
//!
//! `tracing` caches per call site whether anyone listens, computed on the thread that first hits
//! it. Other tests of this binary hit the same call sites on other threads, so a subscriber set
//! for this thread alone can be cached as "nobody listens". The test installs a process-wide
//! subscriber instead, and keeps the events that name its own file.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use distlimit_test::replace_file;
use std::path::Path;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use distlimit_memory::MemoryStore;
use distlimit_policy::{Limiter, PolicySet, Reload, watch};
use tracing::Level;

use crate::support;
use support::next;

fn config(name: &str) -> String {
    format!(
        "[[policy]]\nname = \"{name}\"\ntiers = [ {{ name = \"t\", limit = 5, per = \"1h\" }} ]\n"
    )
}

/// The level and message of every event of this crate, from every thread of this binary.
static EVENTS: Mutex<Vec<(Level, String)>> = Mutex::new(Vec::new());

/// The process's subscriber: enabled for every call site, whichever thread registers it first.
struct Record;

impl tracing::Subscriber for Record {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, _: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0 += &format!("{value:?} ");
            }
        }
        if event.metadata().target().starts_with("distlimit_policy") {
            let mut message = Message(String::new());
            event.record(&mut message);
            let level = *event.metadata().level();
            EVENTS.lock().unwrap().push((level, message.0));
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The levels of the events that name `path`, in order.
fn levels(path: &Path) -> Vec<Level> {
    let path = path.display().to_string();
    let events = EVENTS.lock().unwrap();
    events
        .iter()
        .filter(|(_, m)| m.contains(&path))
        .map(|(l, _)| *l)
        .collect()
}

#[tokio::test]
async fn a_refused_reload_is_logged_at_error_level() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| tracing::subscriber::set_global_default(Record).unwrap());
    tracing::callsite::rebuild_interest_cache();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    replace_file(&path, config("api")).unwrap();
    let l = Arc::new(Limiter::new(
        Arc::new(MemoryStore::new()),
        PolicySet::from_toml_str(&config("api")).unwrap(),
    ));
    l.declare("api").unwrap();
    let watcher = watch(&l, &path, Duration::from_millis(5)).unwrap();
    let mut rx = watcher.subscribe();
    assert_eq!(next(&mut rx).await, Reload::Applied { generation: 1 });
    assert_eq!(levels(&path), [Level::INFO]);

    for text in [
        config("other"),
        String::new(),
        "[[policy]]\nname = ".to_owned(),
    ] {
        replace_file(&path, &text).unwrap();
        assert!(matches!(next(&mut rx).await, Reload::Rejected { .. }));
        assert_eq!(levels(&path).last(), Some(&Level::ERROR), "{text:?}");
    }
    assert_eq!(levels(&path).len(), 4);

    // Another version refused for the same reason (the declared "api" missing): neither logged
    // nor reported again.
    replace_file(&path, config("other")).unwrap();
    assert!(matches!(next(&mut rx).await, Reload::Rejected { .. }));
    replace_file(&path, config("third")).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!rx.has_changed().unwrap());
    assert_eq!(levels(&path).len(), 5);

    // Fixed: applied and logged at INFO; the same refusal as before is then news again.
    replace_file(&path, config("api")).unwrap();
    assert_eq!(next(&mut rx).await, Reload::Applied { generation: 2 });
    replace_file(&path, config("other")).unwrap();
    assert!(matches!(next(&mut rx).await, Reload::Rejected { .. }));
    assert_eq!(
        levels(&path)[4..],
        [Level::ERROR, Level::INFO, Level::ERROR]
    );
}
