//! The conformance checks that batch several identities, on the Cluster: their keys live in
//! several slots, so each batch is decided slot by slot with refunds (see the crate
//! documentation, "Batches across Cluster slots"), and must still be all-or-nothing, atomic
//! under concurrency and opaque to key bytes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

macro_rules! checks {
    ($($name:ident => $check:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let clock = distlimit_test::new_clock();
                let Some(store) = support::cluster_store(clock.clone(), stringify!($name)).await
                else {
                    return;
                };
                let store = std::sync::Arc::new(store);
                distlimit_test::$check(&store, &clock).await;
            }
        )*
    };
}

checks! {
    key_bytes_are_opaque => check_key_bytes_are_opaque,
    decide_all_is_all_or_nothing => check_decide_all_is_all_or_nothing,
    concurrent_batches_are_atomic => check_concurrent_batches_are_atomic,
}
