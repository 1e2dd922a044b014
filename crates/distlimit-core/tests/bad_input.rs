//! Invalid quotas, keys and batches are typed errors, never panics; errors are classified.

// Test helpers outside #[test] functions may unwrap too: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use distlimit_core::{
    Decision, Error, Key, KeyError, Limit, MAX_BATCH, MAX_KEY_LEN, MAX_LIMIT, MAX_PERIOD_US,
    MAX_SCALED, Quota, QuotaError, Request, Store, StoreExt, validate_batch,
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
fn too_large_period() {
    // The period may be exactly 2^50 µs (about 35.7 years), not more.
    assert_eq!(MAX_PERIOD_US, 1 << 50);
    assert!(Quota::from_parts(1, MAX_PERIOD_US, 1).is_ok());
    assert!(Quota::new(1, Duration::from_micros(MAX_PERIOD_US)).is_ok());
    assert_eq!(
        Quota::from_parts(1, MAX_PERIOD_US + 1, 1),
        Err(QuotaError::TooLarge {
            what: "period",
            value: MAX_PERIOD_US + 1,
            max: MAX_PERIOD_US
        })
    );
    // Checked before the limit and the burst.
    assert!(matches!(
        Quota::from_parts(u64::MAX, u64::MAX, u64::MAX),
        Err(QuotaError::TooLarge { what: "period", .. })
    ));
    assert!(matches!(
        Quota::new(1, Duration::from_secs(36 * 366 * 86_400)),
        Err(QuotaError::TooLarge { what: "period", .. })
    ));
}

#[test]
fn period_beyond_u64_microseconds() {
    // Duration::MAX is about 1.8 × 10^25 µs: beyond u64, so beyond the exact range.
    assert_eq!(
        Quota::new(1, Duration::MAX),
        Err(QuotaError::TooLarge {
            what: "period",
            value: u64::MAX,
            max: MAX_PERIOD_US
        })
    );
    let just_beyond = Duration::from_micros(u64::MAX) + Duration::from_micros(1);
    assert!(matches!(
        Quota::new(1, just_beyond),
        Err(QuotaError::TooLarge { what: "period", .. })
    ));
}

#[test]
fn too_large_limit() {
    // The limit may be exactly 2^32, not more, whatever the period.
    assert_eq!(MAX_LIMIT, 1 << 32);
    assert!(Quota::from_parts(MAX_LIMIT, 1, 1).is_ok());
    assert!(Quota::from_parts(MAX_LIMIT, MAX_PERIOD_US, 1).is_ok());
    assert!(Quota::per_second(MAX_LIMIT).is_ok());
    assert!(Quota::per_second(4_000_000_000).is_ok());
    for period_us in [1, 1_000_000, MAX_PERIOD_US] {
        assert_eq!(
            Quota::from_parts(MAX_LIMIT + 1, period_us, 1),
            Err(QuotaError::TooLarge {
                what: "limit",
                value: MAX_LIMIT + 1,
                max: MAX_LIMIT
            })
        );
    }
    assert_eq!(
        Quota::per_minute(u64::MAX),
        Err(QuotaError::TooLarge {
            what: "limit",
            value: u64::MAX,
            max: MAX_LIMIT
        })
    );
    // Checked before the burst.
    assert!(matches!(
        Quota::from_parts(u64::MAX, 1, u64::MAX),
        Err(QuotaError::TooLarge { what: "limit", .. })
    ));
}

#[test]
fn too_large_burst() {
    // burst × period / gcd(limit, period) may be exactly 2^52, not more.
    assert_eq!(MAX_SCALED, 1 << 52);
    // One per 2^50 µs: gcd 1, a token is 2^50 units, so at most 4 at once.
    assert!(Quota::from_parts(1, 1 << 50, 4).is_ok());
    assert_eq!(
        Quota::from_parts(1, 1 << 50, 5),
        Err(QuotaError::TooLarge {
            what: "burst",
            value: 5,
            max: 4
        })
    );
    // 2^32 per 2^50 µs: a token is 2^18 units, so up to 2^34 at once.
    assert!(Quota::from_parts(1 << 32, 1 << 50, 1 << 34).is_ok());
    assert_eq!(
        Quota::from_parts(1 << 32, 1 << 50, (1 << 34) + 1),
        Err(QuotaError::TooLarge {
            what: "burst",
            value: (1 << 34) + 1,
            max: 1 << 34
        })
    );
    // A period of 1 µs: a token is one unit, so the burst may be 2^52.
    assert!(Quota::from_parts(1, 1, MAX_SCALED).is_ok());
    assert!(
        Quota::per_second(1_000_000)
            .unwrap()
            .with_burst(MAX_SCALED)
            .is_ok()
    );
    assert!(matches!(
        Quota::from_parts(1, 1, MAX_SCALED + 1),
        Err(QuotaError::TooLarge {
            what: "burst",
            max: MAX_SCALED,
            ..
        })
    ));
    // One per second: a token is 10^6 units.
    let q = Quota::per_second(1).unwrap();
    let max = MAX_SCALED / 1_000_000;
    assert_eq!(q.with_burst(max).unwrap().burst(), max);
    assert_eq!(
        q.with_burst(max + 1),
        Err(QuotaError::TooLarge {
            what: "burst",
            value: max + 1,
            max
        })
    );
    assert_eq!(
        q.with_burst(u64::MAX),
        Err(QuotaError::TooLarge {
            what: "burst",
            value: u64::MAX,
            max
        })
    );
}

#[test]
fn unround_daily_limits_need_a_smaller_burst() {
    // 1 234 567 = 127 × 9 721 shares no factor with 86 400 000 000 = 2^13 × 3^3 × 5^8: a token is
    // 86 400 000 000 units, so the burst may be at most ⌊2^52 / 86 400 000 000⌋ = 52 124.
    assert_eq!(
        Quota::per_day(1_234_567),
        Err(QuotaError::TooLarge {
            what: "burst",
            value: 1_234_567,
            max: 52_124
        })
    );
    let q = Quota::from_parts(1_234_567, 86_400_000_000, 52_124).unwrap();
    assert_eq!(q.refill_units(), (1_234_567, 86_400_000_000));
    assert!(matches!(
        Quota::from_parts(1_234_567, 86_400_000_000, 52_125),
        Err(QuotaError::TooLarge {
            what: "burst",
            max: 52_124,
            ..
        })
    ));
    // A rounder limit fits with its default burst: 1 200 000 divides a day in µs.
    let q = Quota::per_day(1_200_000).unwrap();
    assert_eq!(q.refill_units(), (1, 72_000));
}

#[test]
fn large_round_quotas_fit() {
    // (quota, refill per µs, units per token): burst × units per token ≤ 2^52.
    let cases = [
        (Quota::per_day(100_000), 1, 864_000),
        (Quota::per_day(1_000_000), 1, 86_400),
        (Quota::per_day(10_000_000), 1, 8_640),
        (Quota::per_hour(312_001), 312_001, 3_600_000_000),
        (Quota::per_hour(1_000_000_000), 5, 18),
        (Quota::per_second(4_000_000_000), 4_000, 1),
        (
            Quota::per_second(MAX_LIMIT),
            4_294_967_296 / 64,
            1_000_000 / 64,
        ),
        (Quota::per_minute(60), 1, 1_000_000),
        (Quota::from_parts(1, MAX_PERIOD_US, 1), 1, MAX_PERIOD_US),
    ];
    for (quota, refill, token) in cases {
        let quota = quota.unwrap();
        assert_eq!(quota.refill_units(), (refill, token), "{quota:?}");
        assert!(quota.burst() * token <= MAX_SCALED, "{quota:?}");
        // L' / P' = limit / period exactly.
        assert_eq!(
            u128::from(refill) * u128::from(quota.period_us()),
            u128::from(token) * u128::from(quota.limit())
        );
    }
    let q = Quota::per_day(100_000).unwrap();
    assert_eq!((q.limit(), q.burst()), (100_000, 100_000));
    let q = Quota::per_day(10_000_000).unwrap();
    assert_eq!((q.limit(), q.burst()), (10_000_000, 10_000_000));
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
        message.contains("burst")
            && message.contains(&u64::MAX.to_string())
            && message.contains(&(MAX_SCALED / 1_000_000).to_string())
            && message.contains("2^52")
            && message.contains("smaller burst")
            && message.contains("rounder limit"),
        "{message}"
    );
    let message = Quota::per_second(u64::MAX).unwrap_err().to_string();
    assert!(
        message.contains("limit") && message.contains("4294967296") && message.contains("2^32"),
        "{message}"
    );
    let message = Quota::new(1, Duration::MAX).unwrap_err().to_string();
    assert!(
        message.contains("period") && message.contains("µs") && message.contains("2^50"),
        "{message}"
    );
    let message = QuotaError::TooLarge {
        what: "cost",
        value: 2,
        max: 1,
    }
    .to_string();
    assert!(message.contains("cost of 2 exceeds 1"), "{message}");
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

// ---------------------------------------------------------------------------------------------
// Decisions built by drivers
// ---------------------------------------------------------------------------------------------

/// `Decision::from_micros` keeps the guarantees of `allowed` and `denied` whatever a driver
/// passes, and rebuilds any decision exactly from its accessors.
#[test]
fn decisions_from_micros_keep_their_guarantees() {
    let d = Decision::from_micros(true, 5, 9, 700, 300);
    assert!(d.is_allowed());
    assert_eq!(
        (d.limit(), d.remaining()),
        (5, 5),
        "remaining capped at limit"
    );
    assert_eq!(
        (d.reset_after_us(), d.retry_after_us()),
        (700, 0),
        "no wait when allowed"
    );
    let d = Decision::from_micros(false, 5, 2, 700, 0);
    assert!(d.is_denied());
    assert_eq!(d.retry_after_us(), 1, "a denial always has a wait");
    for original in [
        Decision::allowed(10, 3, Duration::from_micros(1_234)),
        Decision::denied(10, 0, Duration::from_secs(2), Duration::from_millis(5)),
        Decision::denied(7, 7, Duration::ZERO, distlimit_core::NEVER)
            .with_source(distlimit_core::Source::Fallback),
    ] {
        let rebuilt = Decision::from_micros(
            original.is_allowed(),
            original.limit(),
            original.remaining(),
            original.reset_after_us(),
            original.retry_after_us(),
        )
        .with_source(original.source());
        assert_eq!(rebuilt, original);
    }
}
