//! Rate-limit response headers: the IETF `RateLimit` and `RateLimit-Policy` structured fields
//! (draft-ietf-httpapi-ratelimit-headers-10/-11), `Retry-After`, and the legacy `X-RateLimit-*`,
//! one item per tier named `"<policy>/<tier>"` (the crate documentation's "Headers" says what
//! each value means).

use std::time::Duration;

use bytes::Bytes;
use distlimit_policy::{TierVerdict, Verdict};
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

/// The rate-limit headers of one checked request (and a denial's problem document), rendered
/// once from the verdict so the verdict (which pins a policy snapshot) can be dropped before the
/// inner service runs.
///
/// Every value is written into one buffer and handed out as a slice of it: one allocation for
/// all of a denial's dynamic bytes, where a `String` per value cost two allocations each (dhat,
/// `tests/alloc.rs`).
#[derive(Debug, Default)]
pub(crate) struct Computed {
    /// The values below, one after the other.
    text: Bytes,
    retry_after_secs: Span,
    ratelimit: Span,
    policy: Span,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    legacy: [Span; 3],
    /// A denial's problem document (RFC 9457); unused by a gRPC answer.
    problem: Span,
    /// The wait of a denial (at least 1 µs); `None` when allowed or when it can never pass.
    pub(crate) retry_after: Option<Duration>,
}

/// Where a value lies in [`Computed::text`]; empty when the value is absent.
#[derive(Clone, Copy, Debug, Default)]
struct Span {
    start: u32,
    end: u32,
}

/// Writes values one after the other into a buffer, noting where each lies.
struct Writer(String);

impl Writer {
    /// The span of what `write` appends.
    fn span(&mut self, write: impl FnOnce(&mut String)) -> Span {
        let start = self.0.len();
        write(&mut self.0);
        let at = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Span {
            start: at(start),
            end: at(self.0.len()),
        }
    }
}

impl Computed {
    /// The headers for the verdicts of one request's limits; `full` adds `RateLimit`/
    /// `RateLimit-Policy`, `legacy` the `X-RateLimit-*` trio. A denial also gets `Retry-After`
    /// and its problem document.
    ///
    /// When any verdict denied, only the verdicts that denied are shown: the limit that denied
    /// is what the client must wait for (the others were charged nothing).
    pub(crate) fn new(verdicts: &[Verdict], full: bool, legacy: bool) -> Self {
        let denied = verdicts.iter().any(|v| !v.is_allowed());
        let shown = Shown { verdicts, denied };
        // One allocation: a tier's items are its two names and a few numbers, the problem
        // document a few constants and the denying tiers' names.
        let per_tier: usize = shown
            .tiers()
            .map(|(policy, t)| 2 * (policy.len() + t.name().len()) + 96)
            .sum();
        let mut w = Writer(String::with_capacity(
            per_tier + if denied { 256 } else { 64 },
        ));
        let mut out = Self::default();
        if denied {
            out.retry_after = retry_after(shown);
            if let Some(secs) = out.retry_after_secs() {
                out.retry_after_secs = w.span(|s| push_u64(s, secs));
            }
        }
        if full {
            out.ratelimit = w.span(|s| push_ratelimit(s, shown));
            out.policy = w.span(|s| push_ratelimit_policy(s, shown));
        }
        let tightest = || {
            shown
                .tiers()
                .map(|(_, t)| *t.decision())
                .min_by_key(|d| d.remaining())
        };
        if legacy && let Some(d) = tightest() {
            let values = [d.limit(), d.remaining(), ceil_secs(d.reset_after())];
            out.legacy = values.map(|n| w.span(|s| push_u64(s, n)));
        }
        if denied {
            let retry_after = out.retry_after_secs();
            out.problem =
                w.span(|s| crate::response::push_denial_problem(s, shown.verdicts(), retry_after));
        }
        out.text = Bytes::from(w.0);
        out
    }

    /// `Retry-After` in seconds, rounded up.
    pub(crate) fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after.map(ceil_secs)
    }

    /// The bytes at `span`, `None` when absent.
    fn slice(&self, span: Span) -> Option<Bytes> {
        let range = usize::try_from(span.start).ok()?..usize::try_from(span.end).ok()?;
        let in_text = range.end <= self.text.len();
        (!range.is_empty() && in_text).then(|| self.text.slice(range))
    }

    /// The header value at `span`, `None` when absent. (Written from digits and escaped
    /// printable names only, so always a valid header value.)
    fn value(&self, span: Span) -> Option<HeaderValue> {
        HeaderValue::from_maybe_shared(self.slice(span)?).ok()
    }

    /// A denial's problem document (empty when allowed).
    pub(crate) fn problem(&self) -> Bytes {
        self.slice(self.problem).unwrap_or_default()
    }

    /// Adds the computed headers to `headers`.
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        let names = [
            (RETRY_AFTER, self.retry_after_secs),
            (RATELIMIT, self.ratelimit),
            (RATELIMIT_POLICY, self.policy),
            (X_RATELIMIT_LIMIT, self.legacy[0]),
            (X_RATELIMIT_REMAINING, self.legacy[1]),
            (X_RATELIMIT_RESET, self.legacy[2]),
        ];
        for (name, span) in names {
            if let Some(value) = self.value(span) {
                headers.insert(name, value);
            }
        }
    }
}

/// The verdicts a request's headers show: all of them when it was admitted, the ones that
/// denied it when it was denied.
#[derive(Clone, Copy)]
struct Shown<'v> {
    verdicts: &'v [Verdict],
    denied: bool,
}

impl<'v> Shown<'v> {
    /// The verdicts shown.
    fn verdicts(self) -> impl Iterator<Item = &'v Verdict> + Clone {
        self.verdicts
            .iter()
            .filter(move |v| !self.denied || !v.is_allowed())
    }

    /// The tiers shown (shadow-mode tiers never are), with their policy's name.
    fn tiers(self) -> impl Iterator<Item = (&'v str, TierVerdict<'v>)> + Clone {
        self.verdicts().flat_map(|v| {
            v.tiers()
                .filter(|t| !t.is_shadow())
                .map(move |t| (v.policy(), t))
        })
    }
}

/// Appends `RateLimit`'s items: per tier, what remains (`r`) and when more is available (`t`).
fn push_ratelimit(s: &mut String, shown: Shown<'_>) {
    for (i, (policy, tier)) in shown.tiers().enumerate() {
        let d = tier.decision();
        if i > 0 {
            s.push_str(", ");
        }
        // In a denial nothing was charged: the store answers the tiers that would have
        // admitted as peeks (`Store::decide_all`), their state as it is.
        let t = if d.is_denied() {
            (!d.is_never()).then(|| d.retry_after())
        } else {
            Some(d.reset_after())
        };
        push_ratelimit_item(s, &[policy, "/", tier.name()], d.remaining(), t);
    }
}

/// Appends `RateLimit-Policy`'s items: per tier, the quota enforced (`q`) and its window (`w`).
fn push_ratelimit_policy(s: &mut String, shown: Shown<'_>) {
    for (i, (policy, tier)) in shown.tiers().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        // What is enforced: the decision's capacity, which on a hybrid store's fallback is
        // this instance's share. Where capacity and limit differ (a token bucket or GCRA
        // with its own burst), the share's limit is not in the decision: the policy's.
        let q = if tier.burst() == tier.limit() {
            tier.decision().limit()
        } else {
            tier.limit()
        };
        push_ratelimit_policy_item(s, &[policy, "/", tier.name()], q, tier.period());
    }
}

/// The wait of a denial over the enforced tiers of the verdicts that denied (shadow tiers
/// never block), or a verdict's combined decision when none of its tiers denied (a listed
/// key): the longest, at least 1 µs; `None` when one can never pass.
fn retry_after(shown: Shown<'_>) -> Option<Duration> {
    let mut wait = Duration::from_micros(1);
    for verdict in shown.verdicts() {
        let tiers = verdict.tiers().filter(|t| !t.is_shadow());
        let mut denied = tiers
            .map(|t| t.decision())
            .filter(|d| d.is_denied())
            .peekable();
        let combined = denied.peek().is_none().then(|| verdict.decision());
        for d in denied.chain(combined) {
            if d.is_never() {
                return None;
            }
            wait = wait.max(d.retry_after());
        }
    }
    Some(wait)
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

/// Appends one item of a `RateLimit` field: `"<name>";r=<remaining>;t=<reset>`, the name
/// being `name`'s parts concatenated ([`push_sf_string`]), `reset` rounded up to whole seconds
/// ([`ceil_secs`]) and left out when `None` (a request that can never pass).
///
/// Items of one field are separated by `", "`. This and [`push_ratelimit_policy_item`] are the
/// workspace's one writer of these fields, for any server that sends them (no HTTP types
/// involved):
///
/// ```
/// use std::time::Duration;
/// use distlimit_tower::headers::{push_ratelimit_item, push_ratelimit_policy_item};
///
/// let mut ratelimit = String::new();
/// push_ratelimit_item(&mut ratelimit, &["api", "/", "minute"], 0, Some(Duration::from_millis(1500)));
/// assert_eq!(ratelimit, r#""api/minute";r=0;t=2"#);
/// let mut policy = String::new();
/// push_ratelimit_policy_item(&mut policy, &["per_user/minute"], 100, Duration::from_secs(60));
/// assert_eq!(policy, r#""per_user/minute";q=100;w=60"#);
/// ```
pub fn push_ratelimit_item(
    out: &mut String,
    name: &[&str],
    remaining: u64,
    reset: Option<Duration>,
) {
    push_sf_string(out, name);
    out.push_str(";r=");
    push_u64(out, remaining);
    if let Some(reset) = reset {
        out.push_str(";t=");
        push_u64(out, ceil_secs(reset));
    }
}

/// Appends one item of a `RateLimit-Policy` field: `"<name>";q=<quota>;w=<window>`, the window
/// in seconds rounded up and at least 1 (see [`push_ratelimit_item`]).
pub fn push_ratelimit_policy_item(out: &mut String, name: &[&str], quota: u64, window: Duration) {
    push_sf_string(out, name);
    out.push_str(";q=");
    push_u64(out, quota);
    out.push_str(";w=");
    push_u64(out, ceil_secs(window).max(1));
}

/// Appends `parts`, concatenated, as a structured-field String (RFC 9651 §3.3.3): quoted, `"`
/// and `\` escaped, and every character outside printable ASCII (which a String cannot hold)
/// replaced by `?`.
pub fn push_sf_string(out: &mut String, parts: &[&str]) {
    out.push('"');
    for part in parts {
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
        push_sf_string(&mut s, &["a\"b\\c", "/", "é d"]);
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

    /// The value at `span`, "" when absent.
    fn text(c: &Computed, span: Span) -> &str {
        std::str::from_utf8(&c.text[span.start as usize..span.end as usize]).unwrap()
    }

    /// The problem document's `violated-policies` items.
    fn violated(c: &Computed) -> &str {
        let problem = std::str::from_utf8(&c.text[c.problem.start as usize..]).unwrap();
        let (_, items) = problem.split_once(r#""violated-policies":["#).unwrap();
        items.strip_suffix("]}").unwrap()
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
                let c = Computed::new(std::slice::from_ref(&v), true, false);
                let rl = text(&c, c.ratelimit);
                let (deny, a) = rl.split_once(", ").unwrap();
                assert!(deny.starts_with(r#""p/deny";r=0;t="#), "{algorithm}: {rl}");
                assert_eq!(a, format!(r#""p/a";{want}"#), "{algorithm}");
                assert_eq!(violated(&c), r#""p/deny""#, "{algorithm}");
            }
        }
    }

    #[tokio::test]
    async fn shadow_tiers_are_not_shown() {
        let (limiter, _clock) = limiter([Policy::new("shadow")
            .tier(Tier::new("s", tb(1, Duration::from_secs(1))))
            .shadow(true)]);
        limiter.check("shadow", b"k").await.unwrap();
        let v = limiter.check("shadow", b"k").await.unwrap();
        assert!(v.is_allowed());
        let c = Computed::new(std::slice::from_ref(&v), true, true);
        assert!(text(&c, c.ratelimit).is_empty() && text(&c, c.legacy[0]).is_empty());
        assert!(c.retry_after.is_none() && c.text.is_empty());
    }
}
