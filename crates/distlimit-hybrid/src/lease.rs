//! Leases through a hybrid store ([`LeaseStore`] for [`Hybrid`]): closed, an exchange goes to
//! the primary within the time budget, exactly like a decision (its failures count for the
//! breaker the same way); open, or when that call fails, the policy's failure mode answers:
//! the fallback's exchange on this instance's share, a grant of every unit wanted (fail open),
//! or the error (fail closed).
//!
//! Units given back while degraded are dropped, not handed to the fallback: they may have been
//! taken from the primary, and the fallback must not get units it never gave. They stay spent
//! where they were taken: an under-admission, never more than a limit.

use async_trait::async_trait;
use distlimit_core::{Clock, Error, Grant, LeaseStore, Request, Source};

use crate::breaker::Route;
use crate::{FailureMode, Hybrid, Next, ProbeGuard, bump};

impl<P: LeaseStore, F: LeaseStore, C: Clock> Hybrid<P, F, C> {
    /// The failure mode's answer to an exchange the primary cannot take.
    async fn degraded_exchange(
        &self,
        request: &Request<'_>,
        want: u64,
        error: Option<Error>,
    ) -> Result<Grant, Error> {
        match self.failure_mode(request.policy()) {
            FailureMode::Fallback => {
                bump(&self.counters.fallback);
                let share = self.share_of(request)?;
                let grant = self.fallback.exchange(&share, 0, want).await?;
                Ok(Grant {
                    granted: grant.granted,
                    decision: grant.decision.with_source(Source::Fallback),
                })
            }
            FailureMode::FailOpen => {
                bump(&self.counters.failed_open);
                Ok(Grant {
                    granted: want,
                    decision: Self::fail_open(&request.with_cost(want)),
                })
            }
            FailureMode::FailClosed => {
                bump(&self.counters.failed_closed);
                Err(error.unwrap_or_else(|| self.open_error()))
            }
        }
    }
}

#[async_trait]
impl<P: LeaseStore, F: LeaseStore, C: Clock> LeaseStore for Hybrid<P, F, C> {
    async fn exchange(
        &self,
        request: &Request<'_>,
        give_back: u64,
        want: u64,
    ) -> Result<Grant, Error> {
        request.limit().check_lease()?;
        let route = self.route();
        if route == Route::Fallback {
            return self.degraded_exchange(request, want, None).await;
        }
        let mut probe = ProbeGuard::new(self, route);
        match self
            .call(self.primary.exchange(request, give_back, want))
            .await
        {
            Ok(grant) => {
                probe.succeeded(self);
                Ok(grant)
            }
            Err(error) => match self.primary_failed(&mut probe, request.policy(), &error) {
                Next::Degrade => self.degraded_exchange(request, want, Some(error)).await,
                Next::Return => Err(error),
            },
        }
    }
}
