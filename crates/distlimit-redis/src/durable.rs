//! Durable decisions ([`RedisStoreBuilder::durable`](crate::RedisStoreBuilder::durable)): a
//! decision that admitted something is answered only once `WAIT` says enough replicas hold its
//! write; else the call's answer is a [`NotDurable`] error (kind `durability`).

use std::time::Duration;

use distlimit_core::{Error, NotDurable};

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
            source: Box::new(NotDurable::new(
                self.replicas,
                u64::try_from(acknowledged).unwrap_or(0),
                self.timeout,
            )),
        }
    }
}

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
        assert_eq!(e.kind(), "durability");
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
