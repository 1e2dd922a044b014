//! Hot reload of a real file: edits are applied, bad versions and missing files keep the
//! running set, an edit that keeps the size and modification time is still seen, and polling
//! ends with the limiter.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use distlimit_test::replace_file;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlimit_core::ManualClock;
use distlimit_memory::MemoryStore;
use std::error::Error;

use distlimit_policy::{Field, FileWatcher, Limiter, PolicySet, Reload, watch};
use tokio::sync::watch::Receiver;

use crate::support;
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
    replace_file(path, text).unwrap();
}

/// A limiter with the set of `path`, the watcher of `path` (every 5 ms) and its events, after
/// its first look applied the file.
async fn watched(path: &Path) -> (Arc<Limiter<MemoryStore>>, FileWatcher, Receiver<Reload>) {
    let limiter = Arc::new(Limiter::new(
        Arc::new(MemoryStore::new()),
        PolicySet::from_toml_file(path).unwrap(),
    ));
    let watcher = watch(&limiter, path, Duration::from_millis(5)).unwrap();
    let mut rx = watcher.subscribe();
    assert_eq!(next(&mut rx).await, Reload::Applied { generation: 1 });
    (limiter, watcher, rx)
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

/// A Kubernetes ConfigMap volume: `limits.toml` links to `..data/limits.toml`, and an update
/// swaps the `..data` link to a new directory at once.
#[cfg(unix)]
#[tokio::test]
async fn a_swapped_symbolic_link_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2) = (dir.path().join("v1"), dir.path().join("v2"));
    std::fs::create_dir(&v1).unwrap();
    std::fs::create_dir(&v2).unwrap();
    write(&v1.join("limits.toml"), &config(1));
    write(&v2.join("limits.toml"), &config(2));
    let data = dir.path().join("..data");
    std::os::unix::fs::symlink(&v1, &data).unwrap();
    let path = dir.path().join("limits.toml");
    std::os::unix::fs::symlink("..data/limits.toml", &path).unwrap();
    let (limiter, _watcher, mut rx) = watched(&path).await;
    // The swap: a new link renamed over the old one, as the kubelet does.
    let swap = dir.path().join("..data_tmp");
    std::os::unix::fs::symlink(&v2, &swap).unwrap();
    std::fs::rename(&swap, &data).unwrap();
    assert_eq!(next(&mut rx).await, Reload::Applied { generation: 2 });
    assert_eq!(
        limiter.policies().get("api").unwrap().tiers()[0]
            .quota()
            .limit(),
        2
    );
}

#[tokio::test]
async fn polling_ends_with_the_limiter() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    write(&path, &config(1));
    let (limiter, watcher, _rx) = watched(&path).await;
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
