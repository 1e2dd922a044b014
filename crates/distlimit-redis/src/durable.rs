//! Durable decisions ([`RedisStoreBuilder::durable`](crate::RedisStoreBuilder::durable)): a
//! decision that admitted something is answered only once `WAIT` says enough replicas hold its
//! write; else the call's answer is a [`NotDurable`] error.

use std::fmt;
use std::time::Duration;

use distlimit_core::Error;

use crate::config::STORE;

/// How many replicas must hold a call's write before its admissions are answered, and how long
/// `WAIT` may wait for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Durable {
    /// `WAIT`'s `numreplicas` (at least 1).
    pub(crate) replicas: u32,
    /// `WAIT`'s timeout (above zero; whole milliseconds, rounded up, on the wire).
    pub(crate) timeout: Duration,
}

impl Durable {
    /// `WAIT`'s timeout argument in milliseconds: at least 1 (0 would wait forever).
    pub(crate) fn timeout_ms(self) -> u64 {
        let ms = self.timeout.as_micros().div_ceil(1000).max(1);
        u64::try_from(ms).unwrap_or(u64::MAX)
    }

    /// The error of a call whose write `acknowledged` replicas (as `WAIT` answered) hold.
    pub(crate) fn shortfall(self, acknowledged: i64) -> Error {
        Error::Unavailable {
            store: STORE,
            source: Box::new(NotDurable {
                replicas: self.replicas,
                acknowledged: u64::try_from(acknowledged).unwrap_or(0),
                timeout: self.timeout,
            }),
        }
    }
}

/// The source of the [`Error::Unavailable`] a durable store
/// ([`RedisStoreBuilder::durable`](crate::RedisStoreBuilder::durable)) answers for a decision
/// that admitted (units charged, or a lease granted) when fewer replicas than required
/// acknowledged its write within the `WAIT` timeout.
///
/// The write is on the primary, and may or may not survive a failover: the caller was not
/// admitted by the store, and a hybrid store's failure mode answers instead (fallback, fail
/// open, fail closed). The units stay charged (an under-admission until they refill). The
/// error is transient and not [`NotSent`](distlimit_core::NotSent); find it with
/// [`NotDurable::of`].
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// The [`NotDurable`] behind `error`, if it is one.
    pub fn of(error: &Error) -> Option<&NotDurable> {
        match error {
            Error::Unavailable { source, .. } => source.downcast_ref::<NotDurable>(),
            _ => None,
        }
    }
}

impl fmt::Display for NotDurable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "not durable: {} of {} replicas acknowledged the write within {:?}",
            self.acknowledged, self.replicas, self.timeout
        )
    }
}

impl std::error::Error for NotDurable {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shortfall_is_a_typed_transient_error() {
        let durable = Durable {
            replicas: 2,
            timeout: Duration::from_micros(1500),
        };
        assert_eq!(durable.timeout_ms(), 2);
        let e = durable.shortfall(1);
        assert!(e.is_transient() && !e.is_not_sent(), "{e:?}");
        let not = NotDurable::of(&e).unwrap();
        assert_eq!((not.replicas, not.acknowledged), (2, 1));
        assert!(e.to_string().contains("1 of 2 replicas"), "{e}");
        let tiny = Durable {
            replicas: 1,
            timeout: Duration::from_nanos(1),
        };
        assert_eq!(tiny.timeout_ms(), 1);
        assert!(NotDurable::of(&Error::InvalidRequest("x")).is_none());
    }
}
