//! [`Error`]: why a store could not decide.

use std::time::Duration;

use crate::{KeyError, PermitError, QuotaError};

/// A boxed error from a store's backend.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a store failed to decide. A denial is not an error: it is an `Ok(`[`Decision`](crate::Decision)`)`.
///
/// [`is_transient`](Error::is_transient) tells a circuit breaker whether trying again later (or
/// on another store) may succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key was empty or too long.
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    /// The quota was invalid.
    #[error(transparent)]
    InvalidQuota(#[from] QuotaError),
    /// A concurrency limit or a permit id was invalid.
    #[error(transparent)]
    InvalidPermit(#[from] PermitError),
    /// The request as a whole was invalid (for example an empty batch, or a key twice in one batch).
    #[error("invalid request: {0}")]
    InvalidRequest(&'static str),
    /// The store did not answer in time. A consuming request that timed out may still have been
    /// applied, so it must not be retried blindly.
    #[error("{store}: no answer within {after:?}")]
    Timeout {
        /// The store's name.
        store: &'static str,
        /// The time budget that ran out.
        after: Duration,
    },
    /// The store could not be reached (connection refused or lost, failover in progress).
    /// A `source` of type [`NotSent`] proves the request never reached the store
    /// ([`is_not_sent`](Error::is_not_sent)); any other may have been applied.
    #[error("{store}: unavailable: {source}")]
    Unavailable {
        /// The store's name.
        store: &'static str,
        /// The underlying error.
        source: BoxError,
    },
    /// The store answered something that is not a valid answer (a wrong type at the key, a
    /// malformed reply).
    #[error("{store}: invalid reply: {message}")]
    Protocol {
        /// The store's name.
        store: &'static str,
        /// What was wrong.
        message: String,
    },
    /// The state stored for this request's key is not a valid state of its algorithm (another
    /// client wrote the key, or it holds another type). An error of this request only: the
    /// store itself answered, so a circuit breaker must not count it against the store.
    #[error("{store}: invalid stored state: {message}")]
    BadState {
        /// The store's name.
        store: &'static str,
        /// What was wrong with the stored value.
        message: String,
    },
    /// The store is misconfigured (bad URL, wrong credentials, scripting disabled).
    #[error("{store}: configuration: {message}")]
    Config {
        /// The store's name.
        store: &'static str,
        /// What was wrong.
        message: String,
    },
    /// The store does not implement this operation (a store or wrapper without
    /// [`Store::settle_all`](crate::Store::settle_all), say): it changed nothing. Not transient.
    #[error("the store does not support {0}")]
    Unsupported(&'static str),
    /// Any other backend failure, with its own transient/permanent classification.
    #[error("{store}: {source}")]
    Backend {
        /// The store's name.
        store: &'static str,
        /// Whether trying again later may succeed.
        transient: bool,
        /// The underlying error.
        source: BoxError,
    },
}

impl Error {
    /// Whether trying again later, or failing over to another store, may succeed: timeouts and
    /// lost connections are transient; invalid input, invalid replies and bad configuration are not.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Timeout { .. } | Error::Unavailable { .. } => true,
            Error::Backend { transient, .. } => *transient,
            Error::InvalidKey(_)
            | Error::InvalidQuota(_)
            | Error::InvalidPermit(_)
            | Error::InvalidRequest(_)
            | Error::Protocol { .. }
            | Error::BadState { .. }
            | Error::Config { .. }
            | Error::Unsupported(_) => false,
        }
    }

    /// Whether the request certainly never reached the store (an [`Error::Unavailable`] whose
    /// source is [`NotSent`]: a refused connection, no server to send it to), so it was not
    /// applied and sending it again cannot apply it twice. `false` says nothing either way: a
    /// timeout or a lost connection leaves unknown whether a consuming request was applied.
    pub fn is_not_sent(&self) -> bool {
        matches!(self, Error::Unavailable { source, .. } if source.is::<NotSent>())
    }

    /// Whether the error is the caller's fault (bad key, quota or request) rather than the store's.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Error::InvalidKey(_)
                | Error::InvalidQuota(_)
                | Error::InvalidPermit(_)
                | Error::InvalidRequest(_)
        )
    }

    /// A stable lowercase name of the variant, for metric labels and logs: `invalid_key`,
    /// `invalid_quota`, `invalid_permit`, `invalid_request`, `timeout`, `unavailable`, `protocol`, `bad_state`,
    /// `config`, `unsupported`, `backend`; and `durability` for an [`Error::Unavailable`] whose
    /// source is [`NotDurable`] (the store answered, its replicas did not acknowledge).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Unavailable { source, .. } if source.is::<NotDurable>() => "durability",
            Error::InvalidKey(_) => "invalid_key",
            Error::InvalidQuota(_) => "invalid_quota",
            Error::InvalidPermit(_) => "invalid_permit",
            Error::InvalidRequest(_) => "invalid_request",
            Error::Timeout { .. } => "timeout",
            Error::Unavailable { .. } => "unavailable",
            Error::Protocol { .. } => "protocol",
            Error::BadState { .. } => "bad_state",
            Error::Config { .. } => "config",
            Error::Unsupported(_) => "unsupported",
            Error::Backend { .. } => "backend",
        }
    }
}

/// The source of an [`Error::Unavailable`] whose request never reached the store (a refused
/// connection, no server known to send it to): see [`Error::is_not_sent`]. It wraps the
/// backend's own error.
#[derive(Debug, thiserror::Error)]
#[error("not sent: {0}")]
pub struct NotSent(#[source] pub BoxError);

/// The source of the [`Error::Unavailable`] a durable store (`distlimit_redis`'
/// `RedisStoreBuilder::durable`) answers for a decision that admitted (units charged, or a
/// lease granted) when fewer replicas than required acknowledged its write within the `WAIT`
/// timeout: the store is up, its replicas are short ([`Error::kind`] `durability`).
///
/// The write is on the primary, and may or may not survive a failover: the caller was not
/// admitted by the store, and a hybrid store's failure mode answers instead (fallback, fail
/// open, fail closed). The units stay charged (an under-admission until they refill). The
/// error is transient and not [`NotSent`]; find it with [`NotDurable::of`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "not durable: {acknowledged} of {replicas} replicas acknowledged the write within {timeout:?}"
)]
#[non_exhaustive]
pub struct NotDurable {
    /// The replicas required.
    pub replicas: u32,
    /// The replicas that acknowledged the write within the timeout (fewer than required).
    pub acknowledged: u64,
    /// How long `WAIT` waited.
    pub timeout: Duration,
}

impl NotDurable {
    /// `acknowledged` of `replicas` replicas acknowledged within `timeout`.
    pub fn new(replicas: u32, acknowledged: u64, timeout: Duration) -> Self {
        Self {
            replicas,
            acknowledged,
            timeout,
        }
    }

    /// The [`NotDurable`] behind `error`, if it is one.
    pub fn of(error: &Error) -> Option<&NotDurable> {
        match error {
            Error::Unavailable { source, .. } => source.downcast_ref::<NotDurable>(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unavailable_store_with_a_not_sent_source_is_not_sent() {
        let refused = Error::Unavailable {
            store: "s",
            source: Box::new(NotSent("connection refused".into())),
        };
        assert!(refused.is_not_sent() && refused.is_transient());
        assert_eq!(refused.kind(), "unavailable");
        assert_eq!(
            refused.to_string(),
            "s: unavailable: not sent: connection refused"
        );
        let lost = Error::Unavailable {
            store: "s",
            source: "connection reset".into(),
        };
        assert!(!lost.is_not_sent());
        let timeout = Error::Timeout {
            store: "s",
            after: Duration::from_millis(1),
        };
        assert!(!timeout.is_not_sent());
    }
}
