//! Concurrency permits through a hybrid store ([`PermitStore`] for [`Hybrid`]), as the crate
//! documentation's "Concurrency permits" says. A primary permit that cannot be renewed while the
//! primary is down may expire before its request ends.

use async_trait::async_trait;
use distlimit_core::{Clock, Error, PermitDecision, PermitId, PermitRequest, PermitStore, Store};

use crate::breaker::Route;
use crate::{FailureMode, Hybrid};

/// The id of a permit granted unchecked by [`FailureMode::FailOpen`]: no store holds it, and
/// releasing or renewing it answers `false`.
pub const FAIL_OPEN_PERMIT: PermitId = PermitId::wrapping(u64::MAX);

impl<P: PermitStore + Store, F: PermitStore + Store, C: Clock> Hybrid<P, F, C> {
    /// A release (`renew == false`) or renew of `permit`: the primary first unless open, then
    /// the fallback.
    async fn give_back_or_renew(
        &self,
        request: &PermitRequest<'_>,
        permit: PermitId,
        renew: bool,
    ) -> Result<bool, Error> {
        if permit == FAIL_OPEN_PERMIT {
            return Ok(false);
        }
        if self.route() != Route::Fallback {
            let call = async {
                if renew {
                    self.primary.renew(request, permit).await
                } else {
                    self.primary.release(request, permit).await
                }
            };
            match self.call(call).await {
                Ok(true) => return Ok(true),
                Ok(false) => {}
                Err(error) if error.is_invalid_input() => return Err(error),
                Err(error) => {
                    self.observer
                        .on_store_error(self.name, request.policy(), &error);
                }
            }
        }
        if renew {
            self.fallback.renew(request, permit).await
        } else {
            self.fallback.release(request, permit).await
        }
    }
}

#[async_trait]
impl<P: PermitStore + Store, F: PermitStore + Store, C: Clock> PermitStore for Hybrid<P, F, C> {
    async fn acquire(&self, request: &PermitRequest<'_>) -> Result<PermitDecision, Error> {
        let primary = || self.primary.acquire(request);
        // Open or failed: the failure mode's answer (the fallback's on this instance's share).
        let degraded = |error| async move {
            let mode = self.failure_mode_of(request.state());
            if self.degrade_by(mode, error)? == FailureMode::FailOpen {
                let max = request.limit().max_in_flight();
                return Ok(PermitDecision::acquired(FAIL_OPEN_PERMIT, 0, max, 0));
            }
            let limit = self.share.scale_permits(request.limit());
            let share = PermitRequest::new(request.key(), limit).with_policy(request.policy())?;
            self.fallback.acquire(&share).await
        };
        self.guarded(self.route(), request.policy(), primary, degraded)
            .await
    }

    async fn release(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        self.give_back_or_renew(request, permit, false).await
    }

    async fn renew(&self, request: &PermitRequest<'_>, permit: PermitId) -> Result<bool, Error> {
        self.give_back_or_renew(request, permit, true).await
    }
}
