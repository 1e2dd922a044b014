//! Concurrency permits through a hybrid store ([`PermitStore`] for [`Hybrid`]): closed, an
//! acquire goes to the primary within the time budget, exactly like a decision (its failures
//! count for the breaker the same way); open, or when that call fails, the policy's failure
//! mode answers: the fallback's acquire on this instance's share of `max_in_flight` (divided
//! by the instance count, rounded down, at least 1), a permit granted unchecked (fail open), or
//! the error (fail closed).
//!
//! A release or renew goes to the primary unless the breaker is open, then, when the primary
//! does not hold the permit (or failed), to the fallback: a permit is given back where it was
//! taken. A primary permit whose release cannot reach the primary expires there after its
//! lease (an under-admission of at most those permits, for at most one lease); a primary
//! permit that cannot be renewed while the primary is down may expire before its request ends.
//! A permit granted by fail-open is [`FAIL_OPEN_PERMIT`], which no store holds.

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
