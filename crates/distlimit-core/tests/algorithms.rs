//! Property tests of the reference algorithms: every rule documented in
//! `distlimit_core::algorithm`, checked for every algorithm in [`Algorithm::ALL`].
//!
//! Each case drives [`Limit::decide`] with a manual time over a random sequence of steps (time
//! advances including zero advances, window boundaries and occasional backwards jumps; costs
//! including peeks, the capacity and costs above it), and checks at every step:
//!
//! 1. the admitted-cost bound of the algorithm (on the monotone prefix of the sequence);
//! 2. a denied request changes no state;
//! 3. a peek changes no state and is allowed iff `remaining ≥ 1`;
//! 4. a cost above the capacity is denied with `retry_after == NEVER`, state unchanged;
//! 5. `retry_after` is exact: allowed at `t + r`, still denied at `t + r − 1`;
//! 6. splitting a request at one instant (`a + b` vs `a` then `b`) ends in the same state;
//! 7. `remaining` is that of a peek right after, at most the capacity, and `evaluate` agrees with
//!    `decide`;
//! 8. from `State::expires_at` on, the state decides exactly like a fresh one;
//! 9. nothing panics, whatever the state, time, cost or (valid) quota;
//! 10. `Decision::most_restrictive` folds decisions as documented.
//!
//! Also: a backwards jump refills nothing, `reset_after` is exact, and for times below 2^52 every
//! number of a state or decision, and every product the algorithms compute (`burst × P'`,
//! `prev × w`, `limit × steps`, window ends), stays below 2^53 (the Lua scripts must compute the
//! same numbers in doubles); `Quota::from_parts` accepts exactly the documented bounds.

// Test helpers outside #[test] functions may unwrap too: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use distlimit_core::algorithm::{FixedWindow, Gcra, SlidingLog, SlidingWindow, TokenBucket};
use distlimit_core::{
    Algorithm, Decision, Limit, MAX_LIMIT, MAX_PERIOD_US, MAX_SCALED, NEVER, Quota, QuotaError,
    State, WINDOW_STEPS,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// 2^53: every number a Lua double holds exactly is below it.
const LUA_EXACT: u64 = 1 << 53;

// ---------------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------------

/// How the clock moves before a step, relative to the quota's period.
#[derive(Clone, Copy, Debug)]
enum Advance {
    /// Same instant.
    Zero,
    /// 1 to 3 µs.
    Tiny(u64),
    /// `period × k / 32`, `k` in `0..=48`.
    Fraction(u64),
    /// Anything up to three periods.
    Upto3Periods(u64),
    /// The next aligned window start, −1, 0 or +1 µs.
    Boundary(i8),
    /// Backwards by 1 µs to two periods.
    Back(u64),
}

impl Advance {
    fn apply(self, now: u64, period: u64) -> u64 {
        match self {
            Advance::Zero => now,
            Advance::Tiny(us) => now.saturating_add(us),
            Advance::Fraction(k) => now.saturating_add(period.saturating_mul(k) / 32),
            Advance::Upto3Periods(raw) => {
                now.saturating_add(raw % period.saturating_mul(3).saturating_add(1))
            }
            Advance::Boundary(delta) => {
                let next = (now / period).saturating_add(1).saturating_mul(period);
                next.saturating_add_signed(i64::from(delta)).max(now)
            }
            Advance::Back(raw) => now.saturating_sub(1 + raw % period.saturating_mul(2).max(1)),
        }
    }
}

/// The cost of a step, relative to the limit's capacity.
#[derive(Clone, Copy, Debug)]
enum Cost {
    Peek,
    One,
    /// `1..=capacity`.
    Some(u64),
    Capacity,
    /// `capacity + 1 ..= capacity + 3`.
    AboveCapacity(u64),
    /// Far above any capacity, up to `u64::MAX`.
    Huge(u64),
}

impl Cost {
    fn resolve(self, capacity: u64) -> u64 {
        match self {
            Cost::Peek => 0,
            Cost::One => 1,
            Cost::Some(raw) => 1 + raw % capacity,
            Cost::Capacity => capacity,
            Cost::AboveCapacity(raw) => capacity + 1 + raw % 3,
            Cost::Huge(raw) => raw | (1 << 63),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Step {
    advance: Advance,
    cost: Cost,
    /// Where to split the cost for the equal-time splitting check.
    split: u64,
    /// A later time offset for the expiry check.
    later: u64,
}

fn advance_strategy(backwards: bool) -> BoxedStrategy<Advance> {
    let back_weight = if backwards { 1 } else { 0 };
    prop_oneof![
        4 => Just(Advance::Zero),
        2 => (1..=3u64).prop_map(Advance::Tiny),
        6 => (0..=48u64).prop_map(Advance::Fraction),
        2 => any::<u64>().prop_map(Advance::Upto3Periods),
        2 => (-1..=1i8).prop_map(Advance::Boundary),
        back_weight => any::<u64>().prop_map(Advance::Back),
    ]
    .boxed()
}

fn cost_strategy() -> impl Strategy<Value = Cost> {
    prop_oneof![
        2 => Just(Cost::Peek),
        4 => Just(Cost::One),
        6 => any::<u64>().prop_map(Cost::Some),
        1 => Just(Cost::Capacity),
        1 => any::<u64>().prop_map(Cost::AboveCapacity),
        1 => any::<u64>().prop_map(Cost::Huge),
    ]
}

fn steps_strategy() -> impl Strategy<Value = Vec<Step>> {
    // A quarter of the sequences never go backwards, so the bounds are checked on whole runs.
    prop_oneof![1 => Just(false), 3 => Just(true)].prop_flat_map(|backwards| {
        prop::collection::vec(
            (
                advance_strategy(backwards),
                cost_strategy(),
                any::<u64>(),
                any::<u64>(),
            )
                .prop_map(|(advance, cost, split, later)| Step {
                    advance,
                    cost,
                    split,
                    later,
                }),
            1..=64,
        )
    })
}

/// Valid quotas with small limits: limit and burst `1..=50`, period `1..=10_000_000` µs.
fn small_quota() -> impl Strategy<Value = Quota> {
    let period = prop_oneof![
        2 => 1..=16u64,
        2 => 1..=2_000u64,
        4 => 1..=10_000_000u64,
        1 => Just(1_000_000u64),
        1 => Just(10_000_000u64),
    ];
    let burst = prop_oneof![1 => Just(None), 2 => (1..=50u64).prop_map(Some)];
    (1..=50u64, period, burst).prop_map(|(limit, period, burst)| {
        Quota::from_parts(limit, period, burst.unwrap_or(limit)).expect("a valid quota")
    })
}

/// The greatest common divisor, independently of the crate's.
fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The largest burst `limit` per `period_us` allows: `⌊2^52 / (period / gcd(limit, period))⌋`.
fn max_burst(limit: u64, period_us: u64) -> u64 {
    MAX_SCALED / (period_us / gcd(limit, period_us))
}

/// Valid quotas at the extremes: limit, burst and period 1; limit 2^32; period 2^50; burst × P'
/// at its maximum (exactly 2^52 when P' is a power of two, as for power-of-two limits and
/// periods), with P' = period / gcd(limit, period).
fn extreme_quota() -> impl Strategy<Value = Quota> {
    let period = prop_oneof![
        Just(1u64),
        Just(2),
        Just(3),
        Just(1_000_000),
        Just((1 << 20) - 1),
        Just(1 << 20),
        Just((1 << 20) + 1),
        Just(1 << 25),
        Just(3_600_000_000),
        Just(86_400_000_000),
        Just(MAX_PERIOD_US / 7),
        Just(MAX_PERIOD_US - 1),
        Just(MAX_PERIOD_US),
        1..=MAX_PERIOD_US,
    ];
    (period, 0..6u8, any::<u64>(), 0..4u8, any::<u64>()).prop_map(
        |(period, limit_kind, limit_raw, burst_kind, burst_raw)| {
            let limit = match limit_kind {
                0 => 1,
                1 => MAX_LIMIT,
                // A power of two: P' is a power of two for power-of-two periods.
                2 => 1 << (limit_raw % 33),
                // A divisor of the period (when it fits): P' = 1.
                3 => period.min(MAX_LIMIT),
                _ => 1 + limit_raw % MAX_LIMIT,
            };
            let max = max_burst(limit, period);
            let burst = match burst_kind {
                0 => 1,
                1 => max,
                2 => limit.min(max),
                _ => 1 + burst_raw % max,
            };
            Quota::from_parts(limit, period, burst).expect("a valid quota")
        },
    )
}

fn start_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(0u64),
        1 => 0..=100_000_000u64,
        6 => 0..=(1u64 << 51),
        // Just below 2^52 (the year 2112), the largest time the exact range is checked at.
        1 => ((1u64 << 52) - (1 << 36))..(1u64 << 52),
    ]
}

// ---------------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------------

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).expect("fits in u64")
}

/// A peek changes nothing, agrees with `evaluate`, and is allowed iff `remaining ≥ 1`.
fn check_peek(limit: &Limit, state: &State, now: u64) -> Result<Decision, TestCaseError> {
    let evaluated = limit.evaluate(Some(state), now, 0);
    let mut after = state.clone();
    let peek = limit.decide(&mut after, now, 0);
    prop_assert_eq!(&after, state, "a peek changed the state");
    prop_assert_eq!(peek, evaluated, "evaluate and decide disagree on a peek");
    prop_assert_eq!(
        peek.is_allowed(),
        peek.remaining() >= 1,
        "peek allowed iff remaining >= 1: {:?}",
        peek
    );
    prop_assert!(
        peek.remaining() <= peek.limit(),
        "remaining above limit: {:?}",
        peek
    );
    prop_assert_eq!(peek.limit(), limit.capacity());
    Ok(peek)
}

/// `retry_after` of a denial at `now` is exact: allowed at `now + r`, denied at `now + r − 1`.
fn check_retry(
    limit: &Limit,
    before: &State,
    now: u64,
    cost: u64,
    decision: &Decision,
) -> Result<(), TestCaseError> {
    prop_assert!(
        !decision.is_never(),
        "NEVER for a cost within capacity: {:?}",
        decision
    );
    let r = micros(decision.retry_after());
    prop_assert!(r >= 1, "a denial with retry_after 0: {:?}", decision);
    let Some(at) = now.checked_add(r) else {
        return Err(TestCaseError::fail(format!(
            "retry_after {r} overflows from {now}"
        )));
    };
    let mut state = before.clone();
    let retried = limit.decide(&mut state, at, cost);
    prop_assert!(
        retried.is_allowed(),
        "denied at {now} with retry_after {r}, but cost {cost} still denied at {at}: {:?}, state {:?}",
        retried,
        before
    );
    if r > 1 {
        let mut state = before.clone();
        let early = limit.decide(&mut state, at - 1, cost);
        prop_assert!(
            early.is_denied(),
            "denied at {now} with retry_after {r}, but cost {cost} already allowed at {}: state {:?}",
            at - 1,
            before
        );
    }
    Ok(())
}

/// `reset_after` is exact: full capacity at `now + reset_after`, not a microsecond earlier.
fn check_reset(
    limit: &Limit,
    state: &State,
    now: u64,
    decision: &Decision,
) -> Result<(), TestCaseError> {
    let r = micros(decision.reset_after());
    let capacity = limit.capacity();
    let at = now.saturating_add(r);
    let full = limit.evaluate(Some(state), at, 0);
    prop_assert_eq!(
        full.remaining(),
        capacity,
        "not full at now {} + reset_after {}: state {:?}",
        now,
        r,
        state
    );
    if r > 0 {
        let early = limit.evaluate(Some(state), at - 1, 0);
        prop_assert!(
            early.remaining() < capacity,
            "already full a microsecond before now {} + reset_after {}: state {:?}",
            now,
            r,
            state
        );
    }
    Ok(())
}

/// `a + b` at one instant is the same as `a` then `b` (both at least 1).
fn check_split(
    limit: &Limit,
    state: &State,
    now: u64,
    cost: u64,
    split: u64,
) -> Result<(), TestCaseError> {
    if cost < 2 || cost > limit.capacity() {
        return Ok(());
    }
    let a = 1 + split % (cost - 1);
    let b = cost - a;
    let mut whole = state.clone();
    let together = limit.decide(&mut whole, now, cost);
    let mut parts = state.clone();
    let first = limit.decide(&mut parts, now, a);
    let second = limit.decide(&mut parts, now, b);
    if together.is_allowed() {
        prop_assert!(
            first.is_allowed() && second.is_allowed(),
            "{} allowed at once but not {} then {}",
            cost,
            a,
            b
        );
    }
    if first.is_allowed() && second.is_allowed() {
        prop_assert!(
            together.is_allowed(),
            "{} then {} allowed but not {}",
            a,
            b,
            cost
        );
        prop_assert_eq!(
            &whole,
            &parts,
            "{} vs {} + {} end in different states",
            cost,
            a,
            b
        );
        prop_assert_eq!(
            together,
            second,
            "{} vs {} + {} answer differently",
            cost,
            a,
            b
        );
    }
    Ok(())
}

/// From `expires_at` on, the state decides exactly like a fresh one, now and later.
fn check_expiry(limit: &Limit, state: &State, cost: u64, later: u64) -> Result<(), TestCaseError> {
    let expires = state.expires_at(limit.quota());
    let period = limit.quota().period_us();
    let fresh = State::fresh(limit.algorithm());
    let offset = later % period.saturating_mul(3).saturating_add(1);
    for t in [expires, expires.saturating_add(offset)] {
        for c in [0, cost] {
            let mut old = state.clone();
            let mut new = fresh.clone();
            let d_old = limit.decide(&mut old, t, c);
            let d_new = limit.decide(&mut new, t, c);
            prop_assert_eq!(
                d_old,
                d_new,
                "state {:?} expired at {} but decides cost {} at {} unlike a fresh one",
                state,
                expires,
                c,
                t
            );
            // And the states it leaves behind keep deciding alike.
            let t2 = t.saturating_add(1 + later % period.saturating_add(1));
            for c2 in [0, 1, cost] {
                prop_assert_eq!(
                    limit.evaluate(Some(&old), t2, c2),
                    limit.evaluate(Some(&new), t2, c2),
                    "state {:?} expired at {}: after cost {} at {}, cost {} at {} differs",
                    state,
                    expires,
                    c,
                    t,
                    c2,
                    t2
                );
            }
        }
    }
    Ok(())
}

/// Every number stored or answered fits a Lua double exactly, and so does every intermediate
/// value the algorithm computes: checked through the quota's products and the state's bounds
/// they follow from (times below 2^52: `latest` is the latest time seen so far).
fn check_lua_range(
    limit: &Limit,
    state: &State,
    decision: &Decision,
    latest: u64,
) -> Result<(), TestCaseError> {
    let q = limit.quota();
    let wide = u128::from;
    let max_scaled = wide(MAX_SCALED);
    let period = q.period_us();
    let (rate, token) = q.refill_units();
    let (gr, steps) = q.window_granule();
    // The quota: the bounds and the derived numbers every algorithm scales by.
    prop_assert!(period <= MAX_PERIOD_US && q.limit() <= MAX_LIMIT);
    let g = gcd(q.limit(), period);
    prop_assert_eq!((rate, token), (q.limit() / g, period / g));
    let capacity_units = wide(q.burst()) * wide(token);
    prop_assert!(capacity_units <= max_scaled, "burst × P' above 2^52");
    let emission = period.div_ceil(q.limit());
    prop_assert!(
        wide(q.burst()) * wide(emission) <= max_scaled,
        "burst × T above 2^52"
    );
    prop_assert_eq!(gr, period.div_ceil(WINDOW_STEPS));
    prop_assert!(steps <= WINDOW_STEPS && (steps - 1) * gr < period && period <= steps * gr);
    prop_assert!(
        wide(q.limit()) * wide(steps) <= max_scaled,
        "limit × steps above 2^52"
    );

    // The state: its numbers, and the bounds that keep each algorithm's intermediates small.
    let mut numbers: Vec<u128> = vec![wide(state.expires_at(q))];
    match state {
        State::TokenBucket(s) => {
            prop_assert!(
                wide(s.deficit) <= capacity_units,
                "deficit above capacity: {:?}",
                s
            );
            // A refill `elapsed × L'` is only computed for elapsed < ⌈deficit / L'⌉, so it stays
            // below the deficit; the capacity `burst × P'` is the largest product.
            numbers.extend([wide(s.deficit), wide(s.last_us), capacity_units]);
        }
        State::Gcra(s) => {
            prop_assert!(
                wide(s.tat_us) <= wide(latest) + wide(q.burst()) * wide(emission),
                "tat beyond latest + burst × T: {:?}",
                s
            );
            numbers.push(wide(s.tat_us));
        }
        State::FixedWindow(s) => {
            prop_assert!(s.count <= q.limit(), "count above the limit: {:?}", s);
            numbers.extend([wide(s.start_us) + wide(period), wide(s.count)]);
        }
        State::SlidingWindow(s) => {
            prop_assert!(
                s.previous <= q.limit() && s.current <= q.limit(),
                "counts above the limit: {:?}",
                s
            );
            // prev × w with w ≤ steps, and limit × steps, are the largest products.
            numbers.extend([
                wide(s.start_us) + 2 * wide(period),
                wide(s.previous) * wide(steps),
                wide(q.limit()) * wide(steps),
            ]);
        }
        State::SlidingLog(s) => {
            let sum: u128 = s.entries().map(|(_, c)| wide(c)).sum();
            prop_assert!(sum <= wide(q.limit()), "log above the limit: {:?}", s);
            for (t, c) in s.entries() {
                numbers.extend([wide(t) + wide(period), wide(c)]);
            }
        }
        other => return Err(TestCaseError::fail(format!("unknown state {other:?}"))),
    }
    for n in numbers {
        prop_assert!(
            n < wide(LUA_EXACT),
            "state number {} ≥ 2^53 in {:?}",
            n,
            state
        );
    }
    let mut answered = vec![
        decision.limit(),
        decision.remaining(),
        micros(decision.reset_after()),
    ];
    if !decision.is_never() {
        answered.push(micros(decision.retry_after()));
    }
    for n in answered {
        prop_assert!(
            n < LUA_EXACT,
            "decision number {} ≥ 2^53 in {:?}",
            n,
            decision
        );
    }
    Ok(())
}

/// The admitted-cost bound of the algorithm's table row, over a monotone run of admissions
/// `(instant, cost)`.
fn check_bounds(limit: &Limit, admitted: &[(u64, u64)]) -> Result<(), TestCaseError> {
    let q = limit.quota();
    let period = u128::from(q.period_us());
    let lim = u128::from(q.limit());
    let burst = u128::from(q.burst());
    let emission = period.div_ceil(lim);
    for (i, &(t_first, _)) in admitted.iter().enumerate() {
        let mut sum = 0u128;
        for &(t_last, cost) in &admitted[i..] {
            sum += u128::from(cost);
            let d = u128::from(t_last - t_first);
            let (bound, what) = match limit.algorithm() {
                Algorithm::TokenBucket => (burst + d * lim / period, "burst + ⌊d·limit/period⌋"),
                Algorithm::Gcra => (burst + d / emission, "burst + ⌊d/T⌋"),
                Algorithm::SlidingLog if d < period => (lim, "limit within (t − period, t]"),
                Algorithm::FixedWindow | Algorithm::SlidingWindow if d <= period => {
                    (2 * lim, "2 × limit within one period")
                }
                _ => continue,
            };
            prop_assert!(
                sum <= bound,
                "{}: admitted {} in [{}, {}] (d = {}), bound {} = {}; admissions {:?}",
                limit.algorithm(),
                sum,
                t_first,
                t_last,
                d,
                what,
                bound,
                admitted
            );
        }
    }
    if matches!(
        limit.algorithm(),
        Algorithm::FixedWindow | Algorithm::SlidingWindow
    ) {
        let mut per_window: BTreeMap<u64, u128> = BTreeMap::new();
        for &(t, cost) in admitted {
            *per_window.entry(t / q.period_us()).or_default() += u128::from(cost);
        }
        for (window, sum) in per_window {
            prop_assert!(
                sum <= lim,
                "{}: admitted {} in aligned window {} (limit {}); admissions {:?}",
                limit.algorithm(),
                sum,
                window,
                lim,
                admitted
            );
        }
    }
    Ok(())
}

/// Runs one sequence of steps and checks every rule at every step.
fn check_sequence(
    algorithm: Algorithm,
    quota: Quota,
    start: u64,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let limit = Limit::new(algorithm, quota);
    let capacity = limit.capacity();
    let period = quota.period_us();
    let mut state = State::fresh(algorithm);
    let mut now = start;
    let mut monotone = true;
    let mut latest = now;
    let mut admitted: Vec<(u64, u64)> = Vec::new();

    for step in steps {
        let previous = now;
        now = step.advance.apply(now, period);
        let cost = step.cost.resolve(capacity);
        latest = latest.max(now);

        if now < previous {
            // A backwards jump refills nothing.
            let before = limit.evaluate(Some(&state), previous, 0);
            let after = limit.evaluate(Some(&state), now, 0);
            prop_assert!(
                after.remaining() <= before.remaining(),
                "going back from {} to {} raised remaining from {} to {}: state {:?}",
                previous,
                now,
                before.remaining(),
                after.remaining(),
                state
            );
            monotone = false;
        }

        let peek = check_peek(&limit, &state, now)?;
        check_split(&limit, &state, now, cost, step.split)?;
        check_expiry(&limit, &state, cost, step.later)?;

        let before = state.clone();
        let evaluated = limit.evaluate(Some(&state), now, cost);
        prop_assert_eq!(&state, &before, "evaluate changed the state");
        let decision = limit.decide(&mut state, now, cost);
        prop_assert_eq!(decision, evaluated, "evaluate and decide disagree");
        prop_assert_eq!(decision.limit(), capacity);
        prop_assert!(
            decision.remaining() <= decision.limit(),
            "remaining above limit: {:?}",
            decision
        );

        if cost > capacity {
            prop_assert!(
                decision.is_denied(),
                "cost {} > capacity {} allowed",
                cost,
                capacity
            );
            prop_assert!(decision.is_never());
            prop_assert_eq!(decision.retry_after(), NEVER);
        }

        if decision.is_allowed() {
            prop_assert_eq!(decision.retry_after(), Duration::ZERO);
            prop_assert_eq!(
                Some(decision.remaining()),
                peek.remaining().checked_sub(cost),
                "remaining after cost {} vs peek before {:?}",
                cost,
                peek
            );
            let after = limit.evaluate(Some(&state), now, 0);
            prop_assert_eq!(
                after.remaining(),
                decision.remaining(),
                "remaining {:?} differs from a peek right after {:?}",
                decision,
                after
            );
            if cost == 0 {
                prop_assert_eq!(&state, &before, "a peek changed the state");
            } else {
                // Stores derive the expiry (memory sweep, Redis TTL) from the decision itself.
                prop_assert_eq!(
                    state.expires_at(&quota),
                    now.saturating_add(decision.reset_after_us()),
                    "expires_at differs from now + reset_after after {:?}",
                    decision
                );
                if monotone {
                    admitted.push((now, cost));
                }
            }
        } else {
            prop_assert_eq!(&state, &before, "a denied request changed the state");
            prop_assert_eq!(decision.remaining(), peek.remaining());
            if cost <= capacity {
                check_retry(&limit, &before, now, cost, &decision)?;
            }
        }

        check_reset(&limit, &state, now, &decision)?;
        // Times below 2^52 and a valid quota keep every number below 2^53.
        if latest < 1 << 52 {
            check_lua_range(&limit, &state, &decision, latest)?;
        }
    }
    check_bounds(&limit, &admitted)
}

// ---------------------------------------------------------------------------------------------
// Arbitrary states
// ---------------------------------------------------------------------------------------------

fn wild_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(u64::MAX - 1),
        Just(MAX_SCALED),
        Just(MAX_LIMIT),
        Just(MAX_PERIOD_US),
        0..=LUA_EXACT,
        (u64::MAX - (1 << 20))..=u64::MAX,
        any::<u64>(),
    ]
}

#[derive(Clone, Debug)]
struct WildFields {
    a: u64,
    b: u64,
    c: u64,
    entries: Vec<(u64, u64)>,
}

fn wild_fields() -> impl Strategy<Value = WildFields> {
    (
        wild_u64(),
        wild_u64(),
        wild_u64(),
        prop::collection::vec((wild_u64(), wild_u64()), 0..8),
    )
        .prop_map(|(a, b, c, entries)| WildFields { a, b, c, entries })
}

fn wild_state(algorithm: Algorithm, f: &WildFields) -> State {
    match algorithm {
        Algorithm::TokenBucket => State::TokenBucket(TokenBucket {
            deficit: f.a,
            last_us: f.b,
        }),
        Algorithm::Gcra => State::Gcra(Gcra { tat_us: f.a }),
        Algorithm::FixedWindow => State::FixedWindow(FixedWindow {
            start_us: f.a,
            count: f.b,
        }),
        Algorithm::SlidingLog => State::SlidingLog(SlidingLog::from_entries(f.entries.clone())),
        Algorithm::SlidingWindow => State::SlidingWindow(SlidingWindow {
            start_us: f.a,
            previous: f.b,
            current: f.c,
        }),
        other => State::fresh(other),
    }
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Properties 1–8 on sequences of requests with small quotas.
    #[test]
    fn every_rule_holds_on_random_sequences(
        quota in small_quota(),
        start in start_strategy(),
        steps in steps_strategy(),
    ) {
        for algorithm in Algorithm::ALL {
            check_sequence(algorithm, quota, start, &steps)?;
        }
    }

    /// Properties 1–8 again at the extremes of valid quotas (limit, burst or period 1, limit 2^32,
    /// period 2^50, burst × P' of exactly 2^52) and with huge costs.
    #[test]
    fn every_rule_holds_at_extreme_quotas(
        quota in extreme_quota(),
        start in start_strategy(),
        steps in steps_strategy(),
    ) {
        for algorithm in Algorithm::ALL {
            check_sequence(algorithm, quota, start, &steps)?;
        }
    }

    /// Property 9: any state, however nonsensical, any time and any cost: no panic, and the
    /// structural rules still hold.
    #[test]
    fn nothing_panics_on_arbitrary_states(
        quota in prop_oneof![small_quota(), extreme_quota()],
        fields in wild_fields(),
        ops in prop::collection::vec((wild_u64(), wild_u64()), 1..8),
    ) {
        for algorithm in Algorithm::ALL {
            let limit = Limit::new(algorithm, quota);
            let capacity = limit.capacity();
            let mut state = wild_state(algorithm, &fields);
            for &(now, cost) in &ops {
                let _ = state.expires_at(&quota);
                let _ = limit.evaluate(None, now, cost);
                let before = state.clone();
                let evaluated = limit.evaluate(Some(&state), now, cost);
                let decision = limit.decide(&mut state, now, cost);
                prop_assert_eq!(decision, evaluated);
                prop_assert!(decision.remaining() <= decision.limit());
                prop_assert_eq!(decision.limit(), capacity);
                if cost > capacity {
                    prop_assert!(decision.is_denied() && decision.is_never());
                }
                if decision.is_denied() || cost == 0 {
                    prop_assert_eq!(&state, &before);
                }
                if decision.is_denied() && cost <= capacity {
                    // (A nonsensical state may ask to wait until the end of time, so this
                    // retry_after may saturate to NEVER; it is never zero.)
                    prop_assert!(decision.retry_after() > Duration::ZERO);
                }
                let peek = limit.evaluate(Some(&state), now, 0);
                prop_assert_eq!(peek.is_allowed(), peek.remaining() >= 1);
                let _ = state.expires_at(&quota);
            }
        }
    }

    /// `Quota::from_parts` accepts exactly the documented bounds (period ≤ 2^50, limit ≤ 2^32,
    /// burst × P' ≤ 2^52), reports the first one broken with the largest value allowed, and
    /// derives the token bucket's and the sliding window's scales as documented.
    #[test]
    fn quota_bounds_are_exactly_the_documented_ones(
        limit in prop_oneof![
            Just(0u64), Just(1), Just(MAX_LIMIT), Just(MAX_LIMIT + 1), 1..=1_000u64,
            1..=MAX_LIMIT, any::<u64>(),
        ],
        period in prop_oneof![
            Just(0u64), Just(1), Just(MAX_PERIOD_US), Just(MAX_PERIOD_US + 1), 1..=1_000_000u64,
            Just(86_400_000_000), 1..=MAX_PERIOD_US, any::<u64>(),
        ],
        burst_kind in 0..5u8,
        burst_raw in any::<u64>(),
    ) {
        let valid_parts = limit >= 1 && (1..=MAX_PERIOD_US).contains(&period) && limit <= MAX_LIMIT;
        let max = if valid_parts { max_burst(limit, period) } else { MAX_SCALED };
        let burst = match burst_kind {
            0 => burst_raw,
            1 => 1 + burst_raw % max,
            2 => max - 1,
            3 => max,
            _ => max + 1,
        };
        let expected = if limit == 0 {
            Err(QuotaError::ZeroLimit)
        } else if period == 0 {
            Err(QuotaError::ZeroPeriod)
        } else if burst == 0 {
            Err(QuotaError::ZeroBurst)
        } else if period > MAX_PERIOD_US {
            Err(QuotaError::TooLarge { what: "period", value: period, max: MAX_PERIOD_US })
        } else if limit > MAX_LIMIT {
            Err(QuotaError::TooLarge { what: "limit", value: limit, max: MAX_LIMIT })
        } else if burst > max {
            Err(QuotaError::TooLarge { what: "burst", value: burst, max })
        } else {
            Ok((limit, period, burst))
        };
        let quota = Quota::from_parts(limit, period, burst);
        prop_assert_eq!(
            quota.map(|q| (q.limit(), q.period_us(), q.burst())),
            expected,
            "from_parts({}, {}, {})",
            limit,
            period,
            burst
        );
        if let Ok(q) = quota {
            let g = gcd(limit, period);
            let (rate, token) = q.refill_units();
            prop_assert_eq!((rate, token), (limit / g, period / g));
            // burst × P' ≤ 2^52, and `max` is the largest burst for which it holds.
            prop_assert!(u128::from(burst) * u128::from(token) <= u128::from(MAX_SCALED));
            prop_assert!(u128::from(max + 1) * u128::from(token) > u128::from(MAX_SCALED));
            let (gr, steps) = q.window_granule();
            prop_assert_eq!(gr, period.div_ceil(WINDOW_STEPS));
            prop_assert_eq!(steps, period.div_ceil(gr));
            prop_assert!(steps <= WINDOW_STEPS);
            prop_assert!(period > WINDOW_STEPS || (gr, steps) == (1, period));
            prop_assert!(period <= WINDOW_STEPS || steps > WINDOW_STEPS / 2);
            prop_assert_eq!(q.with_burst(burst), Ok(q));
        }
    }

    /// A state of another algorithm, or none, stands for a fresh key.
    #[test]
    fn foreign_or_missing_state_is_fresh(
        quota in small_quota(),
        fields in wild_fields(),
        now in wild_u64(),
        cost in 0..=60u64,
    ) {
        for algorithm in Algorithm::ALL {
            let limit = Limit::new(algorithm, quota);
            let fresh = State::fresh(algorithm);
            let expected = limit.evaluate(Some(&fresh), now, cost);
            prop_assert_eq!(limit.evaluate(None, now, cost), expected);
            for other in Algorithm::ALL.into_iter().filter(|&a| a != algorithm) {
                let original = wild_state(other, &fields);
                let mut foreign = original.clone();
                prop_assert_eq!(limit.evaluate(Some(&foreign), now, cost), expected);
                prop_assert_eq!(limit.decide(&mut foreign, now, cost), expected);
                if expected.is_allowed() && cost > 0 {
                    // Replaced by this algorithm's state, charged as a fresh key.
                    prop_assert_eq!(foreign.algorithm(), algorithm);
                    let mut charged = fresh.clone();
                    limit.decide(&mut charged, now, cost);
                    prop_assert_eq!(foreign, charged);
                } else {
                    // Peeks and denials leave it as it was.
                    prop_assert_eq!(foreign, original);
                }
            }
        }
    }

    /// Property 10: `Decision::most_restrictive`.
    #[test]
    fn most_restrictive_folds_decisions(decisions in prop::collection::vec(decision_strategy(), 0..8)) {
        let folded = Decision::most_restrictive(&decisions);
        let Some(first) = decisions.first() else {
            prop_assert!(folded.is_none());
            return Ok(());
        };
        let folded = folded.expect("some for a non-empty input");
        prop_assert_eq!(folded.is_allowed(), decisions.iter().all(Decision::is_allowed));
        let min_remaining = decisions.iter().map(Decision::remaining).min().unwrap_or_default();
        prop_assert_eq!(folded.remaining(), min_remaining);
        prop_assert!(
            decisions
                .iter()
                .any(|d| d.remaining() == min_remaining && d.limit() == folded.limit()),
            "limit {} is not that of a decision with the smallest remaining",
            folded.limit()
        );
        let max_retry = decisions.iter().map(Decision::retry_after).max().unwrap_or_default();
        let max_reset = decisions.iter().map(Decision::reset_after).max().unwrap_or_default();
        prop_assert_eq!(folded.retry_after(), max_retry);
        prop_assert_eq!(folded.reset_after(), max_reset);
        prop_assert_eq!(folded.is_never(), decisions.iter().any(Decision::is_never));
        if decisions.len() == 1 {
            prop_assert_eq!(folded, *first);
        }
        // The order of the inputs does not matter (except which limit wins a tie).
        let reversed: Vec<Decision> = decisions.iter().rev().copied().collect();
        let back = Decision::most_restrictive(&reversed).expect("non-empty");
        prop_assert_eq!(back.is_allowed(), folded.is_allowed());
        prop_assert_eq!(back.remaining(), folded.remaining());
        prop_assert_eq!(back.retry_after(), folded.retry_after());
        prop_assert_eq!(back.reset_after(), folded.reset_after());
        // Folding a decision with itself changes nothing.
        prop_assert_eq!(Decision::most_restrictive([first, first]), Some(*first));
    }
}

fn decision_strategy() -> impl Strategy<Value = Decision> {
    let retry = prop_oneof![
        1 => Just(NEVER),
        1 => Just(Duration::ZERO),
        6 => (0..=10_000_000u64).prop_map(Duration::from_micros),
    ];
    (
        any::<bool>(),
        0..=20u64,
        0..=20u64,
        (0..=10_000_000u64).prop_map(Duration::from_micros),
        retry,
    )
        .prop_map(|(allowed, limit, remaining, reset, retry)| {
            let remaining = remaining.min(limit);
            if allowed {
                Decision::allowed(limit, remaining, reset)
            } else {
                Decision::denied(limit, remaining, reset, retry)
            }
        })
}
