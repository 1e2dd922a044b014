//! Hot reload of the configuration path: edits, a ConfigMap-style symbolic link swap, and bad
//! files that keep the running configuration.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;
use distlimit_test::replace_file;

use std::path::Path;

use clap::Parser;
use distlimit_server::{Args, RateLimitConfigError, Reload, Server, StartError};
use support::*;

#[tokio::test]
async fn an_edited_file_is_applied_and_a_bad_one_keeps_the_running_config() {
    let dir = config_dir(&limit_of(10));
    let file = dir.path().join("config.yaml");
    let mut server = Running::with_config(dir.path(), &[]).await;
    assert_eq!(configured_limit(&server).await, Some(10));

    replace_file(&file, limit_of(20)).unwrap();
    assert_eq!(
        server.next_reload().await,
        Reload::Applied { generation: 1 }
    );
    assert_eq!(configured_limit(&server).await, Some(20));

    let bad_files = [
        (
            "domain: d\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
            ":5:",
            "unknown unit",
        ),
        (
            "domain: d\ndescriptors:\n  - kye: user\n",
            ":3:",
            "unknown field `kye`",
        ),
        ("domain: d\ndescriptors: [\n", ":", "config.yaml"),
        (
            "domain: d\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 99999999999 }\n",
            ":4:",
            "requests_per_unit",
        ),
    ];
    for (yaml, line, expected) in bad_files {
        replace_file(&file, yaml).unwrap();
        let Reload::Rejected { error } = server.next_reload().await else {
            panic!("{yaml} was applied");
        };
        assert!(error.contains("config.yaml"), "{error}");
        assert!(error.contains(line), "{yaml}: {error}");
        assert!(error.contains(expected), "{yaml}: {error}");
        assert_eq!(
            configured_limit(&server).await,
            Some(20),
            "kept after {yaml}"
        );
    }
    // A second file of the same domain is refused too.
    replace_file(&file, limit_of(30)).unwrap();
    assert_eq!(
        server.next_reload().await,
        Reload::Applied { generation: 2 }
    );
    replace_file(&dir.path().join("other.yml"), limit_of(40)).unwrap();
    let Reload::Rejected { error } = server.next_reload().await else {
        panic!("a duplicate domain was applied");
    };
    assert!(error.contains("defined by both"), "{error}");
    assert_eq!(configured_limit(&server).await, Some(30));
    // Removing it applies again; dot files and other extensions are ignored.
    std::fs::remove_file(dir.path().join("other.yml")).unwrap();
    replace_file(&dir.path().join(".hidden.yaml"), "not: [valid").unwrap();
    replace_file(&dir.path().join("notes.txt"), "not yaml").unwrap();
    assert_eq!(
        server.next_reload().await,
        Reload::Applied { generation: 3 }
    );
    assert_eq!(configured_limit(&server).await, Some(30));
    server.stop().await;
}

/// Lays out `root` as Kubernetes mounts a ConfigMap: `config.yaml -> ..data/config.yaml`,
/// `..data -> <version>`.
#[cfg(unix)]
fn configmap_version(root: &Path, version: &str, yaml: &str) {
    let dir = root.join(version);
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("config.yaml"), yaml).unwrap();
    let tmp = root.join("..data_tmp");
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, root.join("..data")).unwrap();
    let link = root.join("config.yaml");
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink("..data/config.yaml", &link).unwrap();
    }
}

#[cfg(unix)]
#[tokio::test]
async fn a_configmap_swapped_by_symbolic_link_is_applied() {
    let root = tempfile::tempdir().unwrap();
    configmap_version(root.path(), "..v1", &limit_of(10));
    let mut server = Running::with_config(root.path(), &[]).await;
    assert_eq!(configured_limit(&server).await, Some(10));
    configmap_version(root.path(), "..v2", &limit_of(50));
    assert_eq!(
        server.next_reload().await,
        Reload::Applied { generation: 1 }
    );
    assert_eq!(configured_limit(&server).await, Some(50));
    configmap_version(root.path(), "..v3", "domain: d\ndescriptors: 7\n");
    assert!(matches!(
        server.next_reload().await,
        Reload::Rejected { .. }
    ));
    assert_eq!(configured_limit(&server).await, Some(50));
    server.stop().await;
}

#[tokio::test]
async fn a_bad_file_at_start_is_a_clear_error() {
    let dir = config_dir(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: { unit: second }\n    extra: 1\n",
    );
    let path = dir.path().join("config.yaml");
    let args = Args::parse_from(["distlimit-server", "--config", path.to_str().unwrap()]);
    let error = Server::build(&args).await.unwrap_err();
    let StartError::Config(RateLimitConfigError::Invalid {
        file,
        line,
        message,
    }) = &error
    else {
        panic!("{error}");
    };
    assert_eq!(file, &path);
    assert_eq!(*line, Some(5), "{error}");
    assert!(message.contains("unknown field `extra`"), "{error}");
    let missing = Args::parse_from(["distlimit-server", "--config", "/nonexistent/rls"]);
    let error = Server::build(&missing).await.unwrap_err();
    assert!(error.to_string().contains("/nonexistent/rls"), "{error}");
}
