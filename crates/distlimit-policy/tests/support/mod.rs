//! Helpers shared by the integration tests of the hot reload.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::time::Duration;

use distlimit_policy::Reload;
use tokio::sync::watch::Receiver;

/// The next reload status the watcher reports (within 20 s, or the test fails).
pub(crate) async fn next(rx: &mut Receiver<Reload>) -> Reload {
    tokio::time::timeout(Duration::from_secs(20), rx.changed())
        .await
        .expect("no reload status within 20 s")
        .unwrap();
    rx.borrow_and_update().clone()
}
