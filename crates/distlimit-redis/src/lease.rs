//! Leases on Redis ([`LeaseStore`] for [`RedisStore`]): a lease exchange is one group of the
//! entry script (`lease.lua`): it gives back unspent units and withdraws up to the units wanted
//! in one atomic step, exactly as the reference model
//! ([`Limit::give_back`](distlimit_core::Limit::give_back) then
//! [`Limit::take`](distlimit_core::Limit::take)) does on the key's state, the one
//! [`Store::decide`](distlimit_core::Store::decide) uses.

use async_trait::async_trait;
use distlimit_core::{Error, Grant, LeaseStore, Request};

use crate::RedisStore;
use crate::script::Group;

/// One call per exchange (alone, or packed with other groups by the coalescer), atomic inside
/// Redis; in a Cluster it runs on the key's node. A call whose fate is unknown (a timeout, a
/// lost connection) is never resent: the caller gets the transient error, and units it tried to
/// give back may or may not be back.
#[async_trait]
impl LeaseStore for RedisStore {
    async fn exchange(
        &self,
        request: &Request<'_>,
        give_back: u64,
        want: u64,
    ) -> Result<Grant, Error> {
        // `Group::lease` refuses a limit other than the token bucket and GCRA.
        let key = self.state_key(request.policy(), request.key().as_bytes());
        let time = self.time();
        let group = Group::lease(&key, request.limit(), give_back, want, time)?;
        self.send(group).await?.lease()
    }
}
