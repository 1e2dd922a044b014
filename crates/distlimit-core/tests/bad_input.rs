//! Invalid quotas, keys and batches are typed errors, never panics; errors are classified.

// Test helpers outside #[test] functions may unwrap too: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use distlimit_core::{
    Decision, Error, Key, KeyError, Limit, MAX_BATCH, MAX_KEY_LEN, MAX_SCALED, Quota, QuotaError,
    Request, Store, StoreExt, validate_batch,
};

// ---------------------------------------------------------------------------------------------
// Quotas
// ---------------------------------------------------------------------------------------------

#[test]
fn zero_limit() {
    assert_eq!(Quota::per_second(0), Err(QuotaError::ZeroLimit));
    assert_eq!(Quota::per_minute(0), Err(QuotaError::ZeroLimit));
    assert_eq!(Quota::per_hour(0), Err(QuotaError::ZeroLimit));
    assert_eq!(Quota::per_day(0), Err(QuotaError::ZeroLimit));
    assert_eq!(
        Quota::new(0, Duration::from_secs(1)),
        Err(QuotaError::ZeroLimit)
    );
    assert_eq!(Quota::from_parts(0, 1, 1), Err(QuotaError::ZeroLimit));
    // The limit is checked first.
    assert_eq!(Quota::from_parts(0, 0, 0), Err(QuotaError::ZeroLimit));
}

#[test]
fn zero_period() {
    assert_eq!(Quota::new(1, Duration::ZERO), Err(QuotaError::ZeroPeriod));
    // Periods are whole microseconds: anything shorter is zero.
    assert_eq!(
        Quota::new(1, Duration::from_nanos(999)),
        Err(QuotaError::ZeroPeriod)
    );
    assert_eq!(Quota::from_parts(1, 0, 1), Err(QuotaError::ZeroPeriod));
    assert_eq!(Quota::from_parts(1, 0, 0), Err(QuotaError::ZeroPeriod));
    // One microsecond is enough; the sub-microsecond remainder is dropped.
    let q = Quota::new(1, Duration::from_nanos(1_999)).unwrap();
    assert_eq!(q.period_us(), 1);
    assert_eq!(q.period(), Duration::from_micros(1));
}

#[test]
fn zero_burst() {
    assert_eq!(
        Quota::per_second(10).unwrap().with_burst(0),
        Err(QuotaError::ZeroBurst)
    );
    assert_eq!(Quota::from_parts(1, 1, 0), Err(QuotaError::ZeroBurst));
}

#[test]
fn too_large_limit() {
    // limit × period may be exactly 2^50, not more.
    assert!(Quota::from_parts(MAX_SCALED, 1, 1).is_ok());
    assert!(Quota::from_parts(1, MAX_SCALED, 1).is_ok());
    assert!(Quota::from_parts(1 << 25, 1 << 25, 1).is_ok());
    assert_eq!(
        Quota::from_parts(MAX_SCALED + 1, 1, 1),
        Err(QuotaError::TooLarge {
            what: "limit",
            value: MAX_SCALED + 1,
            period_us: 1
        })
    );
    assert_eq!(
        Quota::from_parts((1 << 25) + 1, 1 << 25, 1),
        Err(QuotaError::TooLarge {
            what: "limit",
            value: (1 << 25) + 1,
            period_us: 1 << 25
        })
    );
    // A product that overflows u64 is still just too large.
    assert_eq!(
        Quota::from_parts(u64::MAX, u64::MAX, 1),
        Err(QuotaError::TooLarge {
            what: "limit",
            value: u64::MAX,
            period_us: u64::MAX
        })
    );
    // A day is 86 400 000 000 µs: at most 13 031 per day.
    let max_per_day = MAX_SCALED / 86_400_000_000;
    assert!(Quota::per_day(max_per_day).is_ok());
    assert!(matches!(
        Quota::per_day(max_per_day + 1),
        Err(QuotaError::TooLarge { what: "limit", .. })
    ));
    let max_per_hour = MAX_SCALED / 3_600_000_000;
    assert!(Quota::per_hour(max_per_hour).is_ok());
    assert!(matches!(
        Quota::per_hour(max_per_hour + 1),
        Err(QuotaError::TooLarge { what: "limit", .. })
    ));
    assert!(Quota::per_second(MAX_SCALED / 1_000_000).is_ok());
    assert!(Quota::per_minute(u64::MAX).is_err());
}

#[test]
fn too_large_burst() {
    let q = Quota::per_second(1).unwrap();
    let max = MAX_SCALED / 1_000_000;
    assert_eq!(q.with_burst(max).unwrap().burst(), max);
    assert_eq!(
        q.with_burst(max + 1),
        Err(QuotaError::TooLarge {
            what: "burst",
            value: max + 1,
            period_us: 1_000_000
        })
    );
    assert_eq!(
        q.with_burst(u64::MAX),
        Err(QuotaError::TooLarge {
            what: "burst",
            value: u64::MAX,
            period_us: 1_000_000
        })
    );
    assert!(matches!(
        Quota::from_parts(1, 1 << 40, 1 << 11),
        Err(QuotaError::TooLarge { what: "burst", .. })
    ));
}

#[test]
fn period_beyond_u64_microseconds() {
    // Duration::MAX is about 1.8 × 10^25 µs: beyond u64, so beyond the exact range.
    assert_eq!(
        Quota::new(1, Duration::MAX),
        Err(QuotaError::TooLarge {
            what: "limit",
            value: 1,
            period_us: u64::MAX
        })
    );
    let just_beyond = Duration::from_micros(u64::MAX) + Duration::from_micros(1);
    assert!(matches!(
        Quota::new(1, just_beyond),
        Err(QuotaError::TooLarge { what: "limit", .. })
    ));
    assert!(matches!(
        Quota::new(1, Duration::from_micros(MAX_SCALED + 1)),
        Err(QuotaError::TooLarge { what: "limit", .. })
    ));
    assert!(Quota::new(1, Duration::from_micros(MAX_SCALED)).is_ok());
}

#[test]
fn quota_accessors_and_defaults() {
    let q = Quota::per_minute(100).unwrap();
    assert_eq!(
        (q.limit(), q.period_us(), q.burst()),
        (100, 60_000_000, 100)
    );
    let q = q.with_burst(10).unwrap();
    assert_eq!(
        (q.limit(), q.period(), q.burst()),
        (100, Duration::from_secs(60), 10)
    );
    assert_eq!(Quota::from_parts(100, 60_000_000, 10), Ok(q));
    assert_eq!(Quota::per_hour(1).unwrap().period_us(), 3_600_000_000);
    assert_eq!(Quota::per_day(1).unwrap().period_us(), 86_400_000_000);
}

#[test]
fn quota_error_messages_name_the_problem() {
    let err = Quota::per_second(1)
        .unwrap()
        .with_burst(u64::MAX)
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("burst") && message.contains("2^50"),
        "{message}"
    );
    assert!(QuotaError::ZeroLimit.to_string().contains("limit"));
    assert!(QuotaError::ZeroPeriod.to_string().contains("period"));
    assert!(QuotaError::ZeroBurst.to_string().contains("burst"));
}

// ---------------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------------

#[test]
fn empty_key() {
    assert_eq!(Key::new(""), Err(KeyError::Empty));
    assert_eq!(Key::new(b""), Err(KeyError::Empty));
    assert_eq!(Key::new(&Vec::<u8>::new()), Err(KeyError::Empty));
}

#[test]
fn too_long_key() {
    let long = vec![b'k'; MAX_KEY_LEN + 1];
    assert_eq!(
        Key::new(&long),
        Err(KeyError::TooLong {
            len: MAX_KEY_LEN + 1,
            max: MAX_KEY_LEN
        })
    );
    let huge = "x".repeat(1 << 20);
    assert_eq!(
        Key::new(&huge),
        Err(KeyError::TooLong {
            len: 1 << 20,
            max: MAX_KEY_LEN
        })
    );
    let message = KeyError::TooLong {
        len: MAX_KEY_LEN + 1,
        max: MAX_KEY_LEN,
    }
    .to_string();
    assert!(
        message.contains("1025") && message.contains("1024"),
        "{message}"
    );
}

#[test]
fn any_bytes_up_to_the_maximum_are_a_key() {
    let exactly_max = vec![0xffu8; MAX_KEY_LEN];
    let utf8_max = "é".repeat(MAX_KEY_LEN / 2); // 2 bytes each
    let keys: [&[u8]; 9] = [
        b"a",
        b"user:{42}",
        b"{",
        b"}{",
        b"\0",
        b"a\0b",
        &[0xff, 0xfe, 0x80],
        "clé-ключ-鍵-🔑".as_bytes(),
        &exactly_max,
    ];
    for bytes in keys.into_iter().chain([utf8_max.as_bytes()]) {
        let key = Key::new(bytes).unwrap();
        assert_eq!(key.as_bytes(), bytes);
        assert_eq!(key.len(), bytes.len());
    }
    // Keys are their bytes: equal only when the bytes are.
    assert_eq!(Key::new("a\0"), Key::new(b"a\0"));
    assert_ne!(Key::new("a\0"), Key::new("a"));
    assert_ne!(Key::new("É"), Key::new("é"));
    // Debug and Display escape what is not printable.
    let key = Key::new(b"a\0\xff{").unwrap();
    assert_eq!(key.to_string(), "a\\x00\\xff{");
    assert_eq!(format!("{key:?}"), "Key(\"a\\x00\\xff{\")");
}

// ---------------------------------------------------------------------------------------------
// Batches
// ---------------------------------------------------------------------------------------------

fn limit() -> Limit {
    Limit::token_bucket(Quota::per_second(10).unwrap())
}

#[test]
fn empty_batch() {
    assert!(matches!(validate_batch(&[]), Err(Error::InvalidRequest(_))));
}

#[test]
fn batch_larger_than_max_batch() {
    let names: Vec<String> = (0..=MAX_BATCH).map(|i| format!("key-{i}")).collect();
    let requests: Vec<Request<'_>> = names
        .iter()
        .map(|n| Request::new(Key::new(n).unwrap(), limit()))
        .collect();
    assert_eq!(requests.len(), MAX_BATCH + 1);
    let err = validate_batch(&requests).unwrap_err();
    assert!(matches!(err, Error::InvalidRequest(_)), "{err:?}");
    assert!(err.is_invalid_input() && !err.is_transient());
    assert!(validate_batch(&requests[..MAX_BATCH]).is_ok());
    assert!(validate_batch(&requests[..1]).is_ok());
}

#[test]
fn duplicate_keys_in_a_batch() {
    let other = Limit::gcra(Quota::per_minute(1).unwrap());
    let a = Request::new(Key::new("alice").unwrap(), limit());
    let b = Request::new(Key::new("bob").unwrap(), limit());
    let a_again = Request::peek(Key::new(b"alice").unwrap(), other).with_cost(7);
    assert!(validate_batch(&[a, b]).is_ok());
    // The same key twice, even under another limit or cost, is rejected...
    for batch in [vec![a, a], vec![a, b, a_again], vec![b, a_again, a]] {
        assert!(matches!(
            validate_batch(&batch),
            Err(Error::InvalidRequest(_))
        ));
    }
    // ...but keys that differ in any byte are different keys.
    let a_nul = Request::new(Key::new("alice\0").unwrap(), limit());
    let a_upper = Request::new(Key::new("Alice").unwrap(), limit());
    assert!(validate_batch(&[a, a_nul, a_upper]).is_ok());
}

#[test]
fn request_accessors() {
    let key = Key::new("k").unwrap();
    let r = Request::new(key, limit());
    assert_eq!((r.key(), *r.limit(), r.cost()), (key, limit(), 1));
    assert_eq!(Request::peek(key, limit()).cost(), 0);
    assert_eq!(r.with_cost(u64::MAX).cost(), u64::MAX);
}

/// A store that counts calls and admits everything.
#[derive(Default)]
struct CountingStore(AtomicUsize);

#[async_trait]
impl Store for CountingStore {
    async fn decide(&self, _request: &Request<'_>) -> Result<Decision, Error> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Decision::allowed(1, 0, Duration::ZERO))
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        validate_batch(requests)?;
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(vec![
            Decision::allowed(1, 0, Duration::ZERO);
            requests.len()
        ])
    }
}

#[tokio::test(flavor = "current_thread")]
async fn store_ext_rejects_invalid_keys_before_the_store() {
    let store = CountingStore::default();
    let err = store.check("", limit()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidKey(KeyError::Empty)), "{err:?}");
    assert!(err.is_invalid_input() && !err.is_transient());
    let long = vec![b'x'; MAX_KEY_LEN + 1];
    assert!(matches!(
        store.check_cost(&long, limit(), 3).await,
        Err(Error::InvalidKey(KeyError::TooLong { .. }))
    ));
    assert!(matches!(
        store.peek(&long, limit()).await,
        Err(Error::InvalidKey(KeyError::TooLong { .. }))
    ));
    assert_eq!(store.0.load(Ordering::SeqCst), 0);

    assert!(store.check(b"\xff{}", limit()).await.unwrap().is_allowed());
    assert!(store.check(&long[..MAX_KEY_LEN], limit()).await.is_ok());
    assert_eq!(store.0.load(Ordering::SeqCst), 2);
    assert!(matches!(
        store.decide_all(&[]).await,
        Err(Error::InvalidRequest(_))
    ));
    assert_eq!(store.0.load(Ordering::SeqCst), 2);
}

// ---------------------------------------------------------------------------------------------
// Error classification
// ---------------------------------------------------------------------------------------------

fn boxed(message: &str) -> distlimit_core::BoxError {
    message.to_owned().into()
}

#[test]
fn transient_errors() {
    let timeout = Error::Timeout {
        store: "redis",
        after: Duration::from_millis(50),
    };
    let unavailable = Error::Unavailable {
        store: "redis",
        source: boxed("connection refused"),
    };
    let backend = Error::Backend {
        store: "redis",
        transient: true,
        source: boxed("LOADING"),
    };
    for err in [timeout, unavailable, backend] {
        assert!(err.is_transient(), "{err:?}");
        assert!(!err.is_invalid_input(), "{err:?}");
    }
}

#[test]
fn permanent_errors() {
    let store_side = [
        Error::Protocol {
            store: "redis",
            message: "WRONGTYPE".into(),
        },
        Error::Config {
            store: "redis",
            message: "NOPERM".into(),
        },
        Error::Backend {
            store: "redis",
            transient: false,
            source: boxed("script error"),
        },
    ];
    for err in store_side {
        assert!(!err.is_transient(), "{err:?}");
        assert!(!err.is_invalid_input(), "{err:?}");
    }
    let caller_side = [
        Error::from(KeyError::Empty),
        Error::from(QuotaError::ZeroLimit),
        Error::InvalidRequest("empty batch"),
    ];
    for err in caller_side {
        assert!(!err.is_transient(), "{err:?}");
        assert!(err.is_invalid_input(), "{err:?}");
    }
}

#[test]
fn error_conversions_and_messages() {
    let err: Error = QuotaError::ZeroBurst.into();
    assert!(matches!(err, Error::InvalidQuota(QuotaError::ZeroBurst)));
    assert_eq!(err.to_string(), QuotaError::ZeroBurst.to_string());
    let err: Error = KeyError::Empty.into();
    assert_eq!(err.to_string(), "invalid key: empty");
    let err = Error::Timeout {
        store: "redis",
        after: Duration::from_millis(50),
    };
    assert!(err.to_string().contains("redis") && err.to_string().contains("50ms"));
    let err = Error::Unavailable {
        store: "memory",
        source: boxed("gone"),
    };
    assert_eq!(err.to_string(), "memory: unavailable: gone");
    assert!(std::error::Error::source(&err).is_some());
}
