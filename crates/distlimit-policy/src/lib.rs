#![doc = include_str!("../README.md")]

mod batch;
mod cidr;
mod config;
mod error;
mod limiter;
mod policy;
mod reload;
mod watch;

#[cfg(all(test, distlimit_loom))]
mod tests;

pub use batch::{Answer, Item, Plan};
pub use cidr::{Cidr, CidrError};
pub use config::DEFAULT_IN_FLIGHT_LEASE;
pub use error::{CheckError, Field, PolicyConfigError};
pub use limiter::{Checked, Limiter, Listed, TierVerdict, TierVerdicts, Verdict};
pub use policy::{
    MAX_NAME_LEN, MAX_TIERS, Override, Overrun, Policy, PolicySet, PolicySetBuilder, Scope, Tier,
};
pub use reload::{FileWatcher, Reload, Reloadable, poll_files};
pub use watch::{PolicyFile, watch};
