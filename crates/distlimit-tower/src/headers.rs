//! Rate-limit response headers: the IETF `RateLimit` and `RateLimit-Policy` structured fields
//! (draft-ietf-httpapi-ratelimit-headers-10/-11), `Retry-After`, and the legacy `X-RateLimit-*`.
//!
//! ```text
//! RateLimit-Policy: "api/second";q=10;w=1, "api/day";q=1000;w=86400
//! RateLimit: "api/second";r=0;t=1, "api/day";r=958;t=86400
//! Retry-After: 1
//! ```
//!
//! Each tier of the checked policy is one item named `"<policy>/<tier>"`. `q` is the limit
//! enforced (on a hybrid store's fallback, this instance's share, except for a token bucket or
//! GCRA whose burst differs from its limit) and `w` the period in seconds (rounded up). `r` is what remains (in a denial, which
//! charges no tier, what remains without this request); `t` is the seconds until
//! more quota is available: for a denied tier its exact retry time, for an admitted one the time
//! until it is back to full capacity, both rounded up (a 300 ms wait is `1`, never `0`), and
//! omitted for a request that can never pass. Shadow-mode tiers are not shown to clients.

use std::time::Duration;

use distlimit_core::Decision;
use distlimit_policy::{Listed, Verdict};
use http::HeaderMap;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};

/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// Legacy `X-RateLimit-Limit`: the capacity of the most restrictive tier.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Legacy `X-RateLimit-Remaining`: what remains of the most restrictive tier.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Legacy `X-RateLimit-Reset`: seconds until the most restrictive tier is back to full capacity.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Which responses carry the rate-limit headers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RateLimitHeaders {
    /// Only denials (the default): `Retry-After`, `RateLimit`, `RateLimit-Policy`.
    #[default]
    Denied,
    /// Every checked response; allowed ones get `RateLimit` and `RateLimit-Policy` too.
    Always,
    /// Denials get `Retry-After` only.
    Never,
}

/// Seconds to wait, rounded up: 300 ms is 1, 1 s is 1, 1.000001 s is 2.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// What the headers of one checked request hold, computed once from the verdict so the verdict
/// (which pins a policy snapshot) can be dropped before the inner service runs.
#[derive(Debug, Default)]
pub(crate) struct Computed {
    pub(crate) ratelimit: Option<HeaderValue>,
    pub(crate) policy: Option<HeaderValue>,
    pub(crate) legacy: Option<[HeaderValue; 3]>,
    /// The wait of a denial (at least 1 µs); `None` when allowed or when it can never pass.
    pub(crate) retry_after: Option<Duration>,
    /// The tiers that denied (the policy, for a deny-listed key), as the items of the problem
    /// body's `violated-policies` array: JSON strings separated by commas.
    pub(crate) violated: String,
}

impl Computed {
    /// The headers for `verdict`; `full` adds `RateLimit`/`RateLimit-Policy`, `legacy` the
    /// `X-RateLimit-*` trio.
    pub(crate) fn new(verdict: &Verdict, full: bool, legacy: bool) -> Self {
        let denied = !verdict.is_allowed();
        let mut out = Self::default();
        if denied {
            out.retry_after = retry_after(verdict);
            if verdict.listed() == Some(Listed::Deny) {
                push_json_string(&mut out.violated, &[verdict.policy()]);
            }
        }
        let policy = verdict.policy();
        // One allocation each: a tier's items are its two names and a few numbers.
        let capacity = if full {
            verdict
                .tiers()
                .map(|t| policy.len() + t.name().len() + 48)
                .sum()
        } else {
            0
        };
        let mut rl = String::with_capacity(capacity);
        let mut rp = String::with_capacity(capacity);
        let mut restrictive: Option<Decision> = None;
        for tier in verdict.tiers().filter(|t| !t.is_shadow()) {
            let d = tier.decision();
            if denied && d.is_denied() {
                if !out.violated.is_empty() {
                    out.violated.push(',');
                }
                push_json_string(&mut out.violated, &[policy, "/", tier.name()]);
            }
            if restrictive.is_none_or(|r| d.remaining() < r.remaining()) {
                restrictive = Some(*d);
            }
            if !full {
                continue;
            }
            for s in [&mut rl, &mut rp] {
                if !s.is_empty() {
                    s.push_str(", ");
                }
                push_sf_string(s, policy, tier.name());
            }
            // What is enforced: the decision's capacity, which on a hybrid store's fallback is
            // this instance's share. Where capacity and limit differ (a token bucket or GCRA
            // with its own burst), the share's limit is not in the decision: the policy's.
            let q = if tier.burst() == tier.limit() {
                d.limit()
            } else {
                tier.limit()
            };
            rp.push_str(";q=");
            push_u64(&mut rp, q);
            rp.push_str(";w=");
            push_u64(&mut rp, ceil_secs(tier.period()).max(1));
            // In a denial nothing was charged: the store answers the tiers that would have
            // admitted as peeks (`Store::decide_all`), their state as it is.
            rl.push_str(";r=");
            push_u64(&mut rl, d.remaining());
            let t = if d.is_denied() {
                (!d.is_never()).then(|| ceil_secs(d.retry_after()))
            } else {
                Some(ceil_secs(d.reset_after()))
            };
            if let Some(t) = t {
                rl.push_str(";t=");
                push_u64(&mut rl, t);
            }
        }
        if full && !rl.is_empty() {
            out.ratelimit = HeaderValue::try_from(rl).ok();
            out.policy = HeaderValue::try_from(rp).ok();
        }
        if legacy && let Some(d) = restrictive {
            out.legacy = Some([
                HeaderValue::from(d.limit()),
                HeaderValue::from(d.remaining()),
                HeaderValue::from(ceil_secs(d.reset_after())),
            ]);
        }
        out
    }

    /// `Retry-After` in seconds, rounded up.
    pub(crate) fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after.map(ceil_secs)
    }

    /// Adds the computed headers to `headers`.
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        if let Some(secs) = self.retry_after_secs() {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(v) = self.ratelimit {
            headers.insert(RATELIMIT, v);
        }
        if let Some(v) = self.policy {
            headers.insert(RATELIMIT_POLICY, v);
        }
        if let Some([limit, remaining, reset]) = self.legacy {
            headers.insert(X_RATELIMIT_LIMIT, limit);
            headers.insert(X_RATELIMIT_REMAINING, remaining);
            headers.insert(X_RATELIMIT_RESET, reset);
        }
    }
}

/// The wait of a denial over its enforced tiers (shadow tiers never block); `None` when it can
/// never pass.
fn retry_after(verdict: &Verdict) -> Option<Duration> {
    let mut wait = Duration::ZERO;
    let mut any = false;
    for tier in verdict.tiers().filter(|t| !t.is_shadow()) {
        let d = tier.decision();
        if d.is_denied() {
            if d.is_never() {
                return None;
            }
            any = true;
            wait = wait.max(d.retry_after());
        }
    }
    let d = verdict.decision();
    if !any {
        // A listed key (no tiers) or a verdict without per-tier detail: the combined decision.
        if d.is_never() {
            return None;
        }
        wait = d.retry_after();
    }
    Some(wait.max(Duration::from_micros(1)))
}

/// Appends `parts`, concatenated, as a JSON string escaped as serde_json escapes: `"`, `\\`
/// and control characters; anything else as it is.
pub(crate) fn push_json_string(out: &mut String, parts: &[&str]) {
    out.reserve(parts.iter().map(|p| p.len()).sum::<usize>() + 2);
    out.push('"');
    for part in parts {
        // Unescaped runs are copied whole (an escaped byte is ASCII, never inside a UTF-8
        // sequence, so the runs are whole characters).
        let mut run = 0;
        for (i, b) in part.bytes().enumerate() {
            let escaped = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0x08 => "\\b",
                0x0c => "\\f",
                0..0x20 => "",
                _ => continue,
            };
            out.push_str(&part[run..i]);
            run = i + 1;
            if escaped.is_empty() {
                out.push_str("\\u00");
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0xf)]));
            } else {
                out.push_str(escaped);
            }
        }
        out.push_str(&part[run..]);
    }
    out.push('"');
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends `n` in decimal.
pub(crate) fn push_u64(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Appends `"<policy>/<tier>"` as a structured-field String: printable ASCII only, `"` and `\`
/// escaped, anything else replaced by `?`.
fn push_sf_string(out: &mut String, policy: &str, tier: &str) {
    out.push('"');
    for part in [policy, "/", tier] {
        // Names are nearly always plain: copied whole.
        if part
            .bytes()
            .all(|b| matches!(b, b' '..=b'~') && b != b'"' && b != b'\\')
        {
            out.push_str(part);
            continue;
        }
        for c in part.chars() {
            match c {
                '"' | '\\' => {
                    out.push('\\');
                    out.push(c);
                }
                ' '..='~' => out.push(c),
                _ => out.push('?'),
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use distlimit_core::{Algorithm, Limit, ManualClock, Quota};
    use distlimit_memory::MemoryStore;
    use distlimit_policy::{Limiter, Policy, PolicySet, Tier};

    use super::*;

    #[test]
    fn ceil_secs_never_rounds_a_wait_to_zero() {
        assert_eq!(ceil_secs(Duration::from_millis(300)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(1)), 1);
        assert_eq!(ceil_secs(Duration::from_micros(1_000_001)), 2);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
    }

    #[test]
    fn sf_strings_are_escaped() {
        let mut s = String::new();
        push_sf_string(&mut s, "a\"b\\c", "é d");
        assert_eq!(s, r#""a\"b\\c/? d""#);
    }

    fn limiter(
        policies: impl IntoIterator<Item = Policy>,
    ) -> (Limiter<MemoryStore<ManualClock>>, ManualClock) {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let set = PolicySet::new(policies).unwrap();
        (Limiter::new(Arc::new(store), set), clock)
    }

    fn tb(limit: u64, period: Duration) -> Limit {
        Limit::token_bucket(Quota::new(limit, period).unwrap())
    }

    fn text(v: &Option<HeaderValue>) -> &str {
        v.as_ref().map_or("", |v| v.to_str().unwrap())
    }

    #[tokio::test]
    async fn headers_follow_the_draft() {
        let (limiter, _clock) = limiter([Policy::new("api")
            .tier(Tier::new("second", tb(2, Duration::from_millis(600))))
            .tier(Tier::new(
                "day",
                Limit::fixed_window(Quota::per_day(1000).unwrap()),
            ))]);
        let v = limiter.check("api", b"k").await.unwrap();
        let c = Computed::new(&v, true, true);
        assert_eq!(
            text(&c.policy),
            r#""api/second";q=2;w=1, "api/day";q=1000;w=86400"#
        );
        assert!(text(&c.ratelimit).starts_with(r#""api/second";r=1;t=1, "api/day";r=999;t="#));
        assert_eq!(c.retry_after, None);
        let legacy = c.legacy.clone().unwrap();
        assert_eq!(
            legacy.map(|v| v.to_str().unwrap().to_owned()),
            ["2", "1", "1"]
        );

        limiter.check("api", b"k").await.unwrap();
        let v = limiter.check("api", b"k").await.unwrap();
        assert!(!v.is_allowed());
        // The second tier refills one unit every 300 ms: Retry-After rounds up to 1.
        let c = Computed::new(&v, false, false);
        assert_eq!(c.retry_after, Some(Duration::from_millis(300)));
        assert_eq!(c.retry_after_secs(), Some(1));
        assert_eq!(c.violated, r#""api/second""#);
        assert!(c.ratelimit.is_none() && c.policy.is_none() && c.legacy.is_none());
        let c = Computed::new(&v, true, false);
        let rl = text(&c.ratelimit);
        assert!(
            rl.starts_with(r#""api/second";r=0;t=1, "api/day";r=998;t="#),
            "{rl}"
        );
        let mut headers = HeaderMap::new();
        c.apply(&mut headers);
        assert_eq!(headers[RETRY_AFTER], "1");
        assert!(headers.contains_key(RATELIMIT) && headers.contains_key(RATELIMIT_POLICY));
    }

    /// In a denial, a tier that did not deny reports its state as it is (nothing was charged):
    /// `r` and `t` without this request, for every algorithm.
    #[tokio::test]
    async fn tiers_that_did_not_deny_report_their_uncharged_state() {
        let quota = Quota::new(10, Duration::from_secs(100)).unwrap();
        // (algorithm, `r;t` of tier `a` at 10 s, at 20 s, at 100 s) after two units at 0 s.
        let cases = [
            (Algorithm::TokenBucket, "r=9;t=10", "r=10;t=0", "r=10;t=0"),
            (Algorithm::Gcra, "r=9;t=10", "r=10;t=0", "r=10;t=0"),
            (Algorithm::FixedWindow, "r=8;t=90", "r=8;t=80", "r=10;t=0"),
            (Algorithm::SlidingLog, "r=8;t=90", "r=8;t=80", "r=10;t=0"),
            (
                Algorithm::SlidingWindow,
                "r=8;t=190",
                "r=8;t=180",
                "r=8;t=100",
            ),
        ];
        for (algorithm, at_10, at_20, at_100) in cases {
            let (limiter, clock) = limiter([Policy::new("p")
                .tier(Tier::new("deny", tb(2, Duration::from_secs(3600))))
                .tier(Tier::new("a", Limit::new(algorithm, quota)))]);
            for _ in 0..2 {
                assert!(limiter.check("p", b"k").await.unwrap().is_allowed());
            }
            for (advance, want) in [(10, at_10), (10, at_20), (80, at_100)] {
                clock.advance(Duration::from_secs(advance));
                let v = limiter.check("p", b"k").await.unwrap();
                assert!(!v.is_allowed(), "{algorithm}");
                let c = Computed::new(&v, true, false);
                let rl = text(&c.ratelimit);
                let (deny, a) = rl.split_once(", ").unwrap();
                assert!(deny.starts_with(r#""p/deny";r=0;t="#), "{algorithm}: {rl}");
                assert_eq!(a, format!(r#""p/a";{want}"#), "{algorithm}");
                assert_eq!(c.violated, r#""p/deny""#, "{algorithm}");
            }
        }
    }

    #[tokio::test]
    async fn shadow_tiers_and_deny_lists() {
        let (limiter, _clock) = limiter([
            Policy::new("shadow")
                .tier(Tier::new("s", tb(1, Duration::from_secs(1))))
                .shadow(true),
            Policy::new("listed")
                .tier(Tier::new("s", tb(1, Duration::from_secs(1))))
                .deny("blocked"),
        ]);
        limiter.check("shadow", b"k").await.unwrap();
        let v = limiter.check("shadow", b"k").await.unwrap();
        assert!(v.is_allowed());
        let c = Computed::new(&v, true, true);
        assert!(c.ratelimit.is_none() && c.legacy.is_none() && c.retry_after.is_none());

        let v = limiter.check("listed", b"blocked").await.unwrap();
        assert!(!v.is_allowed());
        let c = Computed::new(&v, true, true);
        assert_eq!(c.retry_after, None);
        assert_eq!(c.violated, r#""listed""#);
        assert!(c.ratelimit.is_none());
    }
}
