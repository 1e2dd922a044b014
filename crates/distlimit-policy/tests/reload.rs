//! Hot reload of a real file: edits are applied, bad versions and missing files keep the
//! running set, an edit that keeps the size and modification time is still seen, and polling
//! ends with the limiter.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlimit_core::ManualClock;
use distlimit_memory::MemoryStore;
use std::error::Error;

use distlimit_policy::{Field, Limiter, PolicySet, Reload, watch};

mod support;
use support::next;

fn config(limit: u64) -> String {
    format!(
        "[[policy]]\nname = \"api\"\ntiers = [ {{ name = \"t\", limit = {limit}, per = \"1h\" }} ]\n"
    )
}

fn limit_of(limiter: &Limiter<MemoryStore<ManualClock>>) -> u64 {
    limiter.policies().get("api").unwrap().tiers()[0]
        .quota()
        .limit()
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[tokio::test]
async fn edits_are_applied_and_bad_versions_kept_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    write(&path, &config(1));
    let store = MemoryStore::builder()
        .clock(ManualClock::new(1_700_000_000_000_000))
        .build();
    let limiter = Arc::new(Limiter::new(
        Arc::new(store),
        PolicySet::from_toml_file(&path).unwrap(),
    ));
    let watcher = watch(&limiter, &path, Duration::from_millis(5)).unwrap();
    let mut rx = watcher.subscribe();
    assert_eq!(next(&mut rx).await, Reload::Applied { generation: 1 });
    assert!(limiter.check("api", b"k").await.unwrap().is_allowed());
    assert!(!limiter.check("api", b"k").await.unwrap().is_allowed());

    // Raised: the unit the key spent carries over: one of the new two passes, then it is
    // denied (a fresh key has 2).
    write(&path, &config(2));
    assert_eq!(next(&mut rx).await, Reload::Applied { generation: 2 });
    assert_eq!(limit_of(&limiter), 2);
    assert!(limiter.check("api", b"k").await.unwrap().is_allowed());
    assert!(!limiter.check("api", b"k").await.unwrap().is_allowed());
    assert_eq!(
        limiter
            .peek("api", b"new")
            .await
            .unwrap()
            .decision()
            .remaining(),
        2
    );

    // A bad version is reported and changes nothing.
    write(&path, &config(0));
    let Reload::Rejected { error } = next(&mut rx).await else {
        panic!("not rejected")
    };
    assert_eq!(
        error.to_string(),
        r#"policy "api", tier "t": limit: must be at least 1"#
    );
    assert_eq!(watcher.last_error(), Some(error));
    assert_eq!(limit_of(&limiter), 2);

    // Fixed: applied, the error is gone.
    write(&path, &config(3));
    assert_eq!(next(&mut rx).await, Reload::Applied { generation: 3 });
    assert_eq!(watcher.last_error(), None);
    assert_eq!(watcher.status(), Reload::Applied { generation: 3 });
    assert_eq!(limit_of(&limiter), 3);

    // The file disappears: reported once, the set stays; it comes back: applied again.
    std::fs::remove_file(&path).unwrap();
    let Reload::Rejected { error } = next(&mut rx).await else {
        panic!("not rejected")
    };
    assert_eq!(error.field(), Field::File);
    assert_eq!(limit_of(&limiter), 3);
    write(&path, &config(3));
    assert_eq!(next(&mut rx).await, Reload::Applied { generation: 4 });

    // Same size, same modification time, other content: still seen.
    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
    write(&path, &config(7));
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    assert_eq!(next(&mut rx).await, Reload::Applied { generation: 5 });
    assert_eq!(limit_of(&limiter), 7);
}

#[tokio::test]
async fn polling_ends_with_the_limiter() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    write(&path, &config(1));
    let limiter = Arc::new(Limiter::new(
        Arc::new(MemoryStore::new()),
        PolicySet::from_toml_file(&path).unwrap(),
    ));
    let watcher = watch(&limiter, &path, Duration::from_millis(5)).unwrap();
    let mut rx = watcher.subscribe();
    assert_eq!(next(&mut rx).await, Reload::Applied { generation: 1 });
    drop(limiter);
    let started = Instant::now();
    while !watcher.is_finished() && started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(watcher.is_finished());
}

#[test]
fn watch_outside_a_runtime_is_an_error() {
    let limiter = Arc::new(Limiter::new(
        Arc::new(MemoryStore::new()),
        PolicySet::default(),
    ));
    let e = watch(&limiter, "/nonexistent", Duration::from_secs(1)).unwrap_err();
    assert_eq!(e.field(), Field::Runtime);
}

#[test]
fn reading_a_missing_file_names_it() {
    let e = PolicySet::from_toml_file("/nonexistent/limits.toml").unwrap_err();
    assert_eq!(e.field(), Field::File);
    assert_eq!(e.to_string(), "file: cannot read /nonexistent/limits.toml");
    let cause = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
    assert_eq!(
        cause.map(std::io::Error::kind),
        Some(std::io::ErrorKind::NotFound)
    );
}
