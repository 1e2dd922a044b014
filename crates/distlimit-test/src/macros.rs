//! [`conformance_tests!`](crate::conformance_tests): one test per check, from one list of checks.

/// Expands to a module with one `#[test]` per conformance check, each running the check on a
/// fresh multi-threaded Tokio runtime with a fresh [`ManualClock`](distlimit_core::ManualClock)
/// (from [`new_clock`](crate::new_clock)) and a fresh store built by `factory` from it.
///
/// * `conformance_tests!(factory)` names the module `conformance`;
/// * `conformance_tests!(name, factory)` names it `name`, for several stores in one file.
///
/// `factory` is any expression callable as `Fn(ManualClock) -> impl Future<Output = S>` where
/// `S: Store + 'static`: a closure `|clock| async move { .. }` or the path of an async function.
/// It is evaluated inside the generated module, which imports everything from the enclosing
/// module (`use super::*`), so use it at module level (in a test file, or a
/// `#[cfg(test)] mod tests`). The test names are those of [`CHECKS`](crate::CHECKS); a failure
/// names the check and the contract rule broken.
///
/// The generated tests need no Tokio of their own in the calling crate; the factory's future
/// runs on the test's Tokio runtime, so it may connect to a server.
///
/// ```
/// use distlimit_core::ManualClock;
/// # use distlimit_core::{Decision, Error, Request, Store};
/// # struct RedisStore;
/// # impl RedisStore {
/// #     async fn connect_with_clock(_url: &str, _clock: ManualClock) -> Result<Self, Error> { Ok(RedisStore) }
/// # }
/// # #[async_trait::async_trait]
/// # impl Store for RedisStore {
/// #     async fn decide(&self, _: &Request<'_>) -> Result<Decision, Error> { todo!() }
/// #     async fn decide_all(&self, _: &[Request<'_>]) -> Result<Vec<Decision>, Error> { todo!() }
/// # }
///
/// async fn store(clock: ManualClock) -> RedisStore {
///     RedisStore::connect_with_clock("redis://127.0.0.1/", clock)
///         .await
///         .expect("a Redis server for the conformance tests")
/// }
///
/// // redis::fresh_key_admits_capacity, redis::retry_after_is_exact, ...
/// distlimit_test::conformance_tests!(redis, store);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($module:ident, $factory:expr $(,)?) => {
        $crate::__for_each_check!(__conformance_module { $module, $factory });
    };
    ($factory:expr $(,)?) => {
        $crate::conformance_tests!(conformance, $factory);
    };
}

/// Calls `$crate::$callback! { { args } name => check_fn, ... }` with every check, in order:
/// the one list the macro, [`run_all`](crate::run_all) and [`CHECKS`](crate::CHECKS) share.
#[doc(hidden)]
#[macro_export]
macro_rules! __for_each_check {
    ($callback:ident { $($args:tt)* }) => {
        $crate::$callback! {
            { $($args)* }
            fresh_key_admits_capacity => check_fresh_key_admits_capacity,
            retry_after_is_exact => check_retry_after_is_exact,
            matches_reference_model => check_matches_reference_model,
            peek_changes_nothing => check_peek_changes_nothing,
            cost_above_capacity_is_never => check_cost_above_capacity_is_never,
            denied_request_is_not_charged => check_denied_request_is_not_charged,
            keys_are_independent => check_keys_are_independent,
            key_bytes_are_opaque => check_key_bytes_are_opaque,
            decide_all_is_all_or_nothing => check_decide_all_is_all_or_nothing,
            decide_all_rejects_invalid_batches => check_decide_all_rejects_invalid_batches,
            limit_change_follows_model => check_limit_change_follows_model,
            clock_going_backwards_follows_model => check_clock_going_backwards_follows_model,
            idle_key_decides_as_fresh => check_idle_key_decides_as_fresh,
            concurrent_requests_admit_exactly_limit => check_concurrent_requests_admit_exactly_limit,
            concurrent_batches_are_atomic => check_concurrent_batches_are_atomic,
            store_ext_validates_keys => check_store_ext_validates_keys,
            policies_are_independent => check_policies_are_independent,
            settling_follows_model => check_settling_follows_model,
        }
    };
}

/// The test module of [`conformance_tests!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_module {
    ({ $module:ident, $factory:expr } $($name:ident => $check:ident,)*) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            $(
                #[test]
                fn $name() {
                    $crate::__private::block_on(async {
                        let factory = $crate::__private::factory($factory);
                        let (store, clock) = $crate::__private::setup(&factory).await;
                        $crate::$check(&store, &clock).await;
                    });
                }
            )*
        }
    };
}

/// The body of [`run_all`](crate::run_all).
#[doc(hidden)]
#[macro_export]
macro_rules! __run_all_body {
    ({ $factory:ident } $($name:ident => $check:ident,)*) => {
        $({
            let (store, clock) = $crate::__private::setup(&$factory).await;
            $crate::$check(&store, &clock).await;
        })*
    };
}

/// The names for [`CHECKS`](crate::CHECKS).
#[doc(hidden)]
#[macro_export]
macro_rules! __check_names {
    ({} $($name:ident => $check:ident,)*) => {
        [$(stringify!($name)),*]
    };
}

/// Expands to a module (`permit_conformance`, or the name given first) with one `#[test]` per
/// check of the [`PermitStore`](distlimit_core::PermitStore) contract ([`PERMIT_CHECKS`](crate::PERMIT_CHECKS)),
/// each on a fresh runtime, clock and store, as [`conformance_tests!`](crate::conformance_tests)
/// does. The store must implement `PermitStore` and `Store` (one check makes sure a key's
/// permits and its rate state live apart).
///
/// ```
/// use distlimit_core::ManualClock;
/// # use distlimit_core::{Decision, Error, Request, Store};
/// # use distlimit_core::{PermitDecision, PermitId, PermitRequest, PermitStore};
/// # struct MyStore;
/// # #[async_trait::async_trait]
/// # impl Store for MyStore {
/// #     async fn decide(&self, _: &Request<'_>) -> Result<Decision, Error> { todo!() }
/// #     async fn decide_all(&self, _: &[Request<'_>]) -> Result<Vec<Decision>, Error> { todo!() }
/// # }
/// # #[async_trait::async_trait]
/// # impl PermitStore for MyStore {
/// #     async fn acquire(&self, _: &PermitRequest<'_>) -> Result<PermitDecision, Error> { todo!() }
/// #     async fn release(&self, _: &PermitRequest<'_>, _: PermitId) -> Result<bool, Error> { todo!() }
/// #     async fn renew(&self, _: &PermitRequest<'_>, _: PermitId) -> Result<bool, Error> { todo!() }
/// # }
/// async fn store(_clock: ManualClock) -> MyStore { MyStore }
///
/// distlimit_test::permit_conformance_tests!(store);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! permit_conformance_tests {
    ($module:ident, $factory:expr $(,)?) => {
        $crate::__for_each_permit_check!(__conformance_module { $module, $factory });
    };
    ($factory:expr $(,)?) => {
        $crate::permit_conformance_tests!(permit_conformance, $factory);
    };
}

/// The one list of permit checks, as [`__for_each_check`] for the store checks.
#[doc(hidden)]
#[macro_export]
macro_rules! __for_each_permit_check {
    ($callback:ident { $($args:tt)* }) => {
        $crate::$callback! {
            { $($args)* }
            fresh_key_admits_max => check_permit_fresh_key_admits_max,
            release_frees_one_place => check_permit_release_frees_one_place,
            expires_after_lease => check_permit_expires_after_lease,
            renew_extends_lease => check_permit_renew_extends_lease,
            keys_and_states_are_independent => check_permit_keys_and_states_are_independent,
            concurrent_acquires_admit_exactly_max => check_permit_concurrent_acquires_admit_exactly_max,
            matches_model => check_permit_matches_model,
        }
    };
}
