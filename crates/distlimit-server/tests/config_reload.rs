//! Reloads of files the configuration loader must refuse without losing the running limits:
//! a ConfigMap whose files point nowhere, and a file nested deep enough to stall the parser.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;
use distlimit_test::replace_file;

use std::time::Duration;

use distlimit_server::Reload;
use support::binary::Binary;
use support::*;

#[cfg(unix)]
#[tokio::test]
async fn a_configmap_whose_data_vanished_keeps_the_running_limits() {
    // Laid out as Kubernetes mounts a ConfigMap: config.yaml -> ..data/config.yaml,
    // ..data -> ..v1.
    let root = tempfile::tempdir().unwrap();
    let version = |name: &str, rpu: u32| {
        let dir = root.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("config.yaml"), limit_of(rpu)).unwrap();
        let tmp = root.path().join("..data_tmp");
        std::os::unix::fs::symlink(name, &tmp).unwrap();
        std::fs::rename(&tmp, root.path().join("..data")).unwrap();
    };
    version("..v1", 10);
    std::os::unix::fs::symlink("..data/config.yaml", root.path().join("config.yaml")).unwrap();
    let mut server = Running::with_config(root.path(), &[]).await;
    assert_eq!(configured_limit(&server).await, Some(10));

    // The target is gone: the link dangles. This used to load a config without domains.
    std::fs::remove_dir_all(root.path().join("..v1")).unwrap();
    let Reload::Rejected { error } = server.next_reload().await else {
        panic!("a dangling link was applied");
    };
    assert!(
        error.contains("config.yaml") && error.contains("missing file"),
        "{error}"
    );
    assert_eq!(configured_limit(&server).await, Some(10));

    version("..v2", 20);
    assert_eq!(
        server.next_reload().await,
        Reload::Applied { generation: 1 }
    );
    assert_eq!(configured_limit(&server).await, Some(20));
    server.stop().await;
}

#[tokio::test]
async fn a_deeply_nested_file_is_refused_without_holding_back_the_next_edit() {
    let dir = config_dir(&limit_of(10));
    let file = dir.path().join("config.yaml");
    let mut server = Running::with_config(dir.path(), &[]).await;
    assert_eq!(configured_limit(&server).await, Some(10));

    // 200 KB of nested flow sequences: 56 s of parsing before it was refused.
    let deep = format!(
        "domain: d\ndescriptors: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    replace_file(&file, deep).unwrap();
    let Reload::Rejected { error } = server.next_reload().await else {
        panic!("a deep file was applied");
    };
    assert!(
        error.contains("config.yaml:2:") && error.contains("nested deeper than"),
        "{error}"
    );
    assert_eq!(configured_limit(&server).await, Some(10));

    replace_file(&file, limit_of(30)).unwrap();
    assert_eq!(
        server.next_reload().await,
        Reload::Applied { generation: 1 }
    );
    assert_eq!(configured_limit(&server).await, Some(30));
    server.stop().await;
}

/// Each distinct refusal is logged with its reason, past the log throttle's burst (5 lines per
/// call site per 10 s): an operator fixing a file sees why each try was refused.
#[test]
fn every_distinct_refusal_is_logged_past_the_log_throttle() {
    let dir = config_dir(&limit_of(10));
    let mut server = Binary::with_config(dir.path(), &[]);
    for i in 0..8 {
        let bad = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: fortnight{i}, requests_per_unit: 1 }}\n"
        );
        replace_file(&dir.path().join("config.yaml"), bad).unwrap();
        let line = server.wait_for_line(&format!("fortnight{i}"), Duration::from_secs(5));
        assert!(line.contains("ERROR") && line.contains("refused"), "{line}");
    }
    assert_eq!(server.count("were not logged"), 0, "{}", server.log());
}
