//! Leases on Redis ([`LeaseStore`] for [`RedisStore`]): a lease exchange is one group of the
//! entry script (`lease.lua`), as the crate documentation's "Leases" says.

use async_trait::async_trait;
use distlimit_core::{Error, Grant, LeaseStore, Request};

use crate::RedisStore;
use crate::script::Group;

/// One call per exchange (alone, or packed with other groups by the coalescer), on the key's
/// node in a Cluster; a call whose fate is unknown is never resent, and the units it tried to
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
