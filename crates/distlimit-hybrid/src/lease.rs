//! Leases through a hybrid store ([`LeaseStore`] for [`Hybrid`]), as the crate documentation's
//! "Leases" says.

use async_trait::async_trait;
use distlimit_core::{Clock, Error, Grant, LeaseStore, Request, Source};

use crate::{FailureMode, Hybrid};

#[async_trait]
impl<P: LeaseStore, F: LeaseStore, C: Clock> LeaseStore for Hybrid<P, F, C> {
    async fn exchange(
        &self,
        request: &Request<'_>,
        give_back: u64,
        want: u64,
    ) -> Result<Grant, Error> {
        request.limit().check_lease()?;
        let primary = || self.primary.exchange(request, give_back, want);
        // Open or failed: the failure mode's answer (the fallback's on this instance's share).
        let degraded = |error| async move {
            let mode = self.failure_mode(request.policy());
            if self.degrade_by(mode, error)? == FailureMode::FailOpen {
                let decision = Self::fail_open(&request.with_cost(want));
                return Ok(Grant {
                    granted: want,
                    decision,
                });
            }
            let grant = self
                .fallback
                .exchange(&self.share_of(request)?, 0, want)
                .await?;
            Ok(Grant {
                granted: grant.granted,
                decision: grant.decision.with_source(Source::Fallback),
            })
        };
        self.guarded(self.route(), request.policy(), primary, degraded)
            .await
    }
}
