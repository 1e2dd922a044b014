//! One limit across regions (`RegionStore`), on real processes: three regions on loopback, each
//! its own `redis-server`, with two instances each (tokio tasks of this test, each with its own
//! stores and connections). Region 0 is home: its Redis holds the global budget. Regions 1 and
//! 2 reach home through a `Proxy` adding 40 ms each way; their decisions go to their own
//! Redis only.
//!
//! * `capped_limit_is_never_exceeded`: a limit that does not refill during the test, every
//!   instance asking for more than all of it at once: admitted in all ≤ the limit (and the
//!   same load on per-region stores admits three times it: the check can fail);
//! * `twice_the_limit_for_ten_seconds`: 1 000 per second (burst 500), twice that offered at a
//!   steady pace for 10 s: admitted ≤ the algorithm's bound over the run, under-admission ≤ 5 %;
//! * `home_cut_off_for_five_seconds`: the same load for 9 s with both links to home cut for 5 s
//!   of it: no error reaches a caller (while a plain store through the same link errors), the
//!   bound still holds, and the far regions admit again after the link is back;
//! * `home_unreachable_denies_or_fails_open_as_configured`: home cut off before a far region
//!   leased anything: with `HomeUnreachable::Deny` nothing is admitted there, with `Allow`
//!   nearly everything; no error either way;
//! * `unused_units_go_home_after_the_horizon`: a region's pool left holding units when its key
//!   goes quiet sends them home at the sweep, and another region spends them;
//! * `a_denied_batch_charges_no_pool`: batches over two keys, one of which has a single unit:
//!   one batch passes, and the denied ones leave the other key's units in its pool;
//! * `coalesced_pool_steps_admit_exactly_the_limit`: 64 tasks of one instance on one key, their
//!   steps coalesced into shared calls: exactly the capped limit admitted;
//! * `a_new_key_is_served_at_once`: the first request of each of ten new keys in a far region
//!   is admitted (it waits for its pool's first refill), and a key's limit still holds;
//! * `settling_holds_across_regions`: a report past the limit in one far region is debt that
//!   denies the key in both far regions for the debt's refill time; a give-back returns units
//!   a region can spend at once, while home has none;
//! * `conformance_on_redis_time_home_up`: the conformance suite's rules that hold on Redis'
//!   time (the suite's `ManualClock` does not drive the pools, and a pool answers from leased
//!   units, so the checks comparing each decision with the model's do not apply): never above
//!   the limit, sequential or concurrent; costs above the capacity never; peeks and denied
//!   batches charge nothing; typed errors for invalid keys and batches; reports are debt, and
//!   the window algorithms refuse settling, typed;
//! * `conformance_home_down_denies_or_fails_open_marked`: home killed: `Deny` denies (no
//!   error), `Allow` admits marked `Source::FailOpen`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlimit_core::{Error, Key, Limit, Quota, Request, Settle, Source, Store, StoreExt};
use distlimit_redis::{HomeUnreachable, RedisStore, RegionBuilder, RegionStore};
use distlimit_test::Proxy;
use distlimit_test::server::RedisServer;

const REGIONS: usize = 3;
const INSTANCES: usize = 2;
const ONE_WAY: Duration = Duration::from_millis(40);

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Three regions: their servers (0 is home) and the links from regions 1 and 2 to home.
struct Regions {
    servers: Vec<RedisServer>,
    links: Vec<Option<Proxy>>,
}

impl Regions {
    async fn start() -> Self {
        let servers: Vec<RedisServer> = (0..REGIONS)
            .map(|_| RedisServer::start().expect("these tests need redis-server"))
            .collect();
        let home = servers[0].addr().parse().unwrap();
        let mut links = vec![None];
        for _ in 1..REGIONS {
            links.push(Some(Proxy::with_delay(home, ONE_WAY).unwrap()));
        }
        Self { servers, links }
    }

    /// The home store as region `region` reaches it.
    async fn home(&self, region: usize, prefix: &str) -> RedisStore {
        let url = match &self.links[region] {
            Some(link) => link.redis_url(),
            None => self.servers[0].url(),
        };
        RedisStore::builder(url)
            .prefix(prefix)
            .connect_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500))
            .connect()
            .await
            .unwrap()
    }

    /// The region's own Redis, for one instance.
    async fn local(&self, region: usize, prefix: &str) -> RedisStore {
        RedisStore::builder(self.servers[region].url())
            .prefix(prefix)
            .response_timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap()
    }

    /// Two instances per region, each with its own connections.
    async fn instances(&self, prefix: &str) -> Vec<(usize, RegionStore<RedisStore>)> {
        let mut out = Vec::new();
        for region in 0..REGIONS {
            for _ in 0..INSTANCES {
                let store = RegionBuilder::default()
                    .claim_timeout(Duration::from_secs(1))
                    .build(
                        self.home(region, prefix).await,
                        self.local(region, prefix).await,
                    );
                out.push((region, store));
            }
        }
        out
    }

    fn cut(&self) {
        self.links.iter().flatten().for_each(Proxy::partition);
    }

    fn restore(&self) {
        self.links.iter().flatten().for_each(Proxy::heal);
    }
}

/// What one instance did.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    region: usize,
    offered: u64,
    admitted: u64,
    errors: u64,
    /// Admitted after `late_us`.
    late: u64,
    last_us: u64,
}

/// Every store offers `rate` requests per second on one key at a steady pace from `start_us`
/// for `secs` (bounded in count and time).
async fn offer<S: Store + 'static>(
    stores: Vec<(usize, S)>,
    limit: Limit,
    rate: u64,
    start_us: u64,
    secs: u64,
    late_us: u64,
) -> Vec<Tally> {
    let tasks: Vec<_> = stores
        .into_iter()
        .map(|(region, store)| {
            tokio::spawn(async move {
                let key = Key::new("tenant-7").unwrap();
                let request = Request::new(key, limit).with_policy("global").unwrap();
                let end_us = start_us + secs * 1_000_000;
                let most = rate * secs;
                let mut t = Tally {
                    region,
                    ..Tally::default()
                };
                tokio::time::sleep(Duration::from_micros(start_us.saturating_sub(now_us()))).await;
                let mut tick = tokio::time::interval(Duration::from_millis(1));
                loop {
                    tick.tick().await;
                    let now = now_us();
                    if now >= end_us || t.offered >= most {
                        break;
                    }
                    let due = ((now - start_us) * rate / 1_000_000).min(most);
                    while t.offered < due {
                        t.offered += 1;
                        match store.decide(&request).await {
                            Ok(d) if d.is_allowed() => {
                                t.admitted += 1;
                                if now_us() >= late_us {
                                    t.late += 1;
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                t.errors += 1;
                                eprintln!("region {region}: {e}");
                            }
                        }
                        t.last_us = now_us();
                    }
                }
                t
            })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

fn sum(tallies: &[Tally], f: impl Fn(&Tally) -> u64) -> u64 {
    tallies.iter().map(f).sum()
}

/// The token bucket's bound from a fresh key over `elapsed_us`.
fn bound(limit: &Limit, elapsed_us: u64) -> u64 {
    let q = limit.quota();
    q.burst() + elapsed_us * q.limit() / q.period_us()
}

fn prefix(test: &str) -> String {
    let prefix = String::from_utf8(distlimit_test::unique_prefix(test)).unwrap();
    prefix.trim_end_matches(':').to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capped_limit_is_never_exceeded() {
    let regions = Regions::start().await;
    // 300 a day: no unit refills during the test.
    let limit = Limit::token_bucket(Quota::per_day(300).unwrap());
    let start_us = now_us() + 300_000;
    // Each of the six instances offers 200 in 2 s: 1 200 in all, four times the limit.
    let tallies = offer(
        regions.instances(&prefix("capped")).await,
        limit,
        100,
        start_us,
        2,
        u64::MAX,
    )
    .await;
    let admitted = sum(&tallies, |t| t.admitted);
    println!("capped: admitted {admitted} of 300, tallies {tallies:?}");
    assert_eq!(sum(&tallies, |t| t.errors), 0);
    assert!(admitted <= 300, "over-admission: {admitted} > 300");
    assert!(
        admitted >= 150,
        "the far regions' units never arrived: {admitted}"
    );

    // Without regions: each region limits alone on its own Redis, and the sum is three limits.
    let mut alone = Vec::new();
    for region in 0..REGIONS {
        for _ in 0..INSTANCES {
            alone.push((region, regions.local(region, &prefix("alone")).await));
        }
    }
    let tallies = offer(alone, limit, 100, now_us() + 100_000, 2, u64::MAX).await;
    let admitted = sum(&tallies, |t| t.admitted);
    assert!(admitted > 300, "per-region limits admitted {admitted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twice_the_limit_for_ten_seconds() {
    let regions = Regions::start().await;
    let limit = Limit::token_bucket(Quota::per_second(1_000).unwrap().with_burst(500).unwrap());
    let start_us = now_us() + 500_000;
    let stores = regions.instances(&prefix("twice")).await;
    let probe: Vec<_> = stores.iter().map(|(_, s)| s.clone()).collect();
    // 2 000 per second in all: 333 per instance.
    let tallies = offer(stores, limit, 333, start_us, 10, u64::MAX).await;
    let admitted = sum(&tallies, |t| t.admitted);
    let end_us = tallies.iter().map(|t| t.last_us).max().unwrap();
    let bound = bound(&limit, end_us - start_us);
    let under = bound.saturating_sub(admitted);
    let refills: u64 = probe.iter().map(|s| s.stats().refills).sum();
    let per_region: Vec<u64> = (0..REGIONS)
        .map(|r| sum(&tallies, |t| if t.region == r { t.admitted } else { 0 }))
        .collect();
    println!(
        "twice: offered {}, admitted {admitted} {per_region:?}, bound {bound}, under {under} \
         ({:.2} %), {refills} refills",
        sum(&tallies, |t| t.offered),
        100.0 * under as f64 / bound as f64
    );
    assert_eq!(sum(&tallies, |t| t.errors), 0);
    assert!(admitted <= bound, "over-admission: {admitted} > {bound}");
    assert!(
        under * 20 <= bound,
        "under-admission {under} above 5 % of {bound}"
    );
    assert!(
        per_region.iter().all(|&a| a > 0),
        "a region admitted nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn home_cut_off_for_five_seconds() {
    let regions = Arc::new(Regions::start().await);
    let limit = Limit::token_bucket(Quota::per_second(1_000).unwrap().with_burst(500).unwrap());
    let pre = prefix("cut");
    let start_us = now_us() + 500_000;
    let stores = regions.instances(&pre).await;
    // Without regions, a far instance deciding at home sees the cut.
    let plain = regions.home(1, &pre).await;
    let cuts = Arc::new(AtomicU64::new(0));
    let cutter = {
        let (regions, cuts, plain) = (regions.clone(), cuts.clone(), plain.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(start_us + 2_000_000 - now_us())).await;
            regions.cut();
            let request = Request::new(Key::new("other").unwrap(), limit);
            if plain.decide(&request).await.is_err() {
                cuts.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_micros(start_us + 7_000_000 - now_us())).await;
            regions.restore();
        })
    };
    // 9 s: 2 before the cut, 5 cut, 2 after; "late" is the last second.
    let tallies = offer(stores, limit, 333, start_us, 9, start_us + 8_000_000).await;
    cutter.await.unwrap();
    let admitted = sum(&tallies, |t| t.admitted);
    let end_us = tallies.iter().map(|t| t.last_us).max().unwrap();
    let bound = bound(&limit, end_us - start_us);
    let late_far = sum(&tallies, |t| if t.region > 0 { t.late } else { 0 });
    println!(
        "cut: admitted {admitted}, bound {bound}, far regions in the last second {late_far}, \
         tallies {tallies:?}"
    );
    assert_eq!(
        cuts.load(Ordering::Relaxed),
        1,
        "the plain store did not see the cut"
    );
    assert_eq!(sum(&tallies, |t| t.errors), 0, "an error reached a caller");
    assert!(admitted <= bound, "over-admission: {admitted} > {bound}");
    assert!(late_far > 0, "the far regions did not recover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn home_unreachable_denies_or_fails_open_as_configured() {
    let regions = Regions::start().await;
    let pre = prefix("unreachable");
    let limit = Limit::token_bucket(Quota::per_second(100).unwrap());
    let mut stores = Vec::new();
    for answer in [HomeUnreachable::Deny, HomeUnreachable::Allow] {
        let home = RedisStore::builder(regions.links[1].as_ref().unwrap().redis_url())
            .prefix(&pre)
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_millis(200))
            .connect()
            .await
            .unwrap();
        let store = RegionBuilder::default()
            .claim_timeout(Duration::from_millis(300))
            .retry_after_failure(Duration::from_millis(100))
            .home_unreachable(answer)
            .build(home, regions.local(1, &pre).await);
        stores.push(store);
    }
    // Cut before any unit was leased: the open connections close, new ones hang.
    regions.cut();
    let key = Key::new("tenant-7").unwrap();
    let (deny, allow) = (&stores[0], &stores[1]);
    let (mut denied_admitted, mut open_admitted, mut errors) = (0, 0, 0);
    // 1.5 s, a request every 5 ms on each: nothing is leased, and home never answers.
    for _ in 0..300 {
        for (store, admitted, policy) in [
            (deny, &mut denied_admitted, "deny"),
            (allow, &mut open_admitted, "allow"),
        ] {
            let request = Request::new(key, limit).with_policy(policy).unwrap();
            match store.decide(&request).await {
                Ok(d) if d.is_allowed() => *admitted += 1,
                Ok(d) => assert!(d.retry_after() > Duration::ZERO),
                Err(e) => {
                    errors += 1;
                    eprintln!("{policy}: {e}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "unreachable: deny admitted {denied_admitted}, allow admitted {open_admitted}, {:?}",
        allow.stats()
    );
    assert_eq!(errors, 0, "an error reached a caller");
    assert_eq!(denied_admitted, 0, "admitted with nothing leased");
    assert!(deny.stats().refill_failures > 0);
    assert!(open_admitted > 200, "fail open admitted {open_admitted}");
    assert_eq!(allow.stats().failed_open, open_admitted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_batch_charges_no_pool() {
    let regions = Regions::start().await;
    let pre = prefix("batch");
    // In the home region (no delay): its pools fill within a round trip on loopback.
    let store =
        RegionBuilder::default().build(regions.home(0, &pre).await, regions.local(0, &pre).await);
    let key = Key::new("tenant-7").unwrap();
    let three = Limit::token_bucket(Quota::per_day(3).unwrap());
    let one = Limit::token_bucket(Quota::per_day(1).unwrap());
    let a = Request::new(key, three).with_policy("a").unwrap();
    let b = Request::new(key, one).with_policy("b").unwrap();
    // Every batch asks for a unit of both; `b` has one in all, so at most one batch passes and
    // the denied ones must leave `a`'s units in its pool.
    let mut batches = 0;
    for _ in 0..40 {
        let decisions = store.decide_all(&[a, b]).await.unwrap();
        let passed = decisions.iter().all(|d| d.is_allowed());
        assert!(passed || decisions.iter().any(|d| d.is_denied()));
        batches += u64::from(passed);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut alone = 0;
    for _ in 0..40 {
        alone += u64::from(store.decide(&a).await.unwrap().is_allowed());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("batch: {batches} batches admitted, then {alone} of `a` alone");
    assert_eq!(
        batches, 1,
        "one batch passes once both pools have their units"
    );
    assert_eq!(batches + alone, 3, "a denied batch kept units of `a`");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_units_go_home_after_the_horizon() {
    let regions = Regions::start().await;
    let pre = prefix("sweep");
    let near = RegionBuilder::default()
        .horizon(Duration::from_millis(100))
        .build(regions.home(0, &pre).await, regions.local(0, &pre).await);
    let far =
        RegionBuilder::default().build(regions.home(1, &pre).await, regions.local(1, &pre).await);
    let limit = Limit::token_bucket(Quota::per_day(60).unwrap());
    let request = Request::new(Key::new("tenant-7").unwrap(), limit);
    // The near region refills ahead of a demand of about 1 000 per second: its pool holds units
    // it does not spend when the key goes quiet.
    let mut near_admitted = 0;
    for _ in 0..30 {
        near_admitted += u64::from(near.decide(&request).await.unwrap().is_allowed());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    // The key went quiet in the near region: the sweep sends its pool home.
    near.sweep().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stats = near.stats();
    let peek = near
        .decide(&Request::peek(request.key(), limit))
        .await
        .unwrap();
    println!("sweep: near admitted {near_admitted}, {stats:?}, pool after {peek:?}");
    assert!(stats.returned_home > 0, "nothing went home: {stats:?}");
    assert_eq!(stats.from_home, near_admitted + stats.returned_home);
    // The far region gets every unit the near one did not spend.
    let mut far_admitted = 0;
    for _ in 0..80 {
        far_admitted += u64::from(far.decide(&request).await.unwrap().is_allowed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("sweep: far admitted {far_admitted}");
    assert_eq!(
        near_admitted + far_admitted,
        60,
        "units parked in the near region"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_pool_steps_admit_exactly_the_limit() {
    let regions = Regions::start().await;
    let pre = prefix("coalesced");
    // One instance, 64 tasks at once on one key: its steps queue and go out coalesced, many
    // groups of op 6 in one call (the general path of the script).
    let store =
        RegionBuilder::default().build(regions.home(1, &pre).await, regions.local(1, &pre).await);
    let limit = Limit::token_bucket(Quota::per_day(500).unwrap());
    let before = regions.servers[1].command_calls("evalsha").unwrap();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let request = Request::new(Key::new("tenant-7").unwrap(), limit);
                let mut admitted = 0u64;
                // 1.5 s at most, 100 decisions at most per task.
                for _ in 0..100 {
                    admitted += u64::from(store.decide(&request).await.unwrap().is_allowed());
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    let calls = regions.servers[1].command_calls("evalsha").unwrap() - before;
    println!("coalesced: admitted {admitted} of 500 in 6 400 decisions, {calls} calls");
    assert_eq!(admitted, 500, "every unit spent once, none parked");
    assert!(calls < 6_400, "no step was coalesced: {calls} calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_key_is_served_at_once() {
    let regions = Regions::start().await;
    let pre = prefix("new-key");
    let far =
        RegionBuilder::default().build(regions.home(1, &pre).await, regions.local(1, &pre).await);
    let limit = Limit::token_bucket(Quota::per_day(3).unwrap());
    for user in 0..10 {
        let name = format!("user-{user}");
        let request = Request::new(Key::new(&name).unwrap(), limit);
        let first = far.decide(&request).await.unwrap();
        assert!(first.is_allowed(), "{name}'s first request: {first:?}");
        let mut admitted = 1;
        for _ in 0..6 {
            admitted += u64::from(far.decide(&request).await.unwrap().is_allowed());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(admitted <= 3, "{name}: {admitted} admitted of 3");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settling_holds_across_regions() {
    let regions = Regions::start().await;
    let pre = prefix("settle");
    let one =
        RegionBuilder::default().build(regions.home(1, &pre).await, regions.local(1, &pre).await);
    let two =
        RegionBuilder::default().build(regions.home(2, &pre).await, regions.local(2, &pre).await);
    // 10 per minute: a unit every 6 s. Reserve 1, then report 15 more: 6 units of debt.
    let limit = Limit::token_bucket(Quota::per_minute(10).unwrap());
    let request = Request::new(Key::new("debtor").unwrap(), limit);
    assert!(one.decide(&request).await.unwrap().is_allowed());
    let after = one
        .settle(Settle::Report(request.with_cost(15)))
        .await
        .unwrap();
    assert!(after.is_denied(), "{after:?}");
    for (name, region) in [("the reporting region", &one), ("another region", &two)] {
        let next = region.decide(&request).await.unwrap();
        let retry = next.retry_after();
        assert!(next.is_denied(), "{name}: {next:?}");
        // 6 units of debt and one to spend: 7 × 6 s, less the time the test took.
        assert!(
            retry > Duration::from_secs(35) && retry <= Duration::from_secs(42),
            "{name}: retry after {retry:?}"
        );
    }
    // A give-back returns units to the region, spendable there while home has none.
    let capped = Limit::token_bucket(Quota::per_day(10).unwrap());
    let spender = Request::new(Key::new("spender").unwrap(), capped);
    assert!(
        one.decide(&spender.with_cost(10))
            .await
            .unwrap()
            .is_allowed()
    );
    assert!(two.decide(&spender).await.unwrap().is_denied());
    let back = one
        .settle(Settle::GiveBack(spender.with_cost(4)))
        .await
        .unwrap();
    assert!(back.is_allowed(), "{back:?}");
    assert!(
        one.decide(&spender.with_cost(4))
            .await
            .unwrap()
            .is_allowed()
    );
    assert!(one.decide(&spender).await.unwrap().is_denied());
}

/// The standalone Redis (`DISTLIMIT_REDIS_URL`), or a private one outside `cargo xtask test`.
fn standalone() -> (String, Option<RedisServer>) {
    match std::env::var(distlimit_test::server::ENV_URL) {
        Ok(url) if !url.trim().is_empty() => (url.trim().to_owned(), None),
        _ => {
            assert!(
                !distlimit_test::server::required(),
                "DISTLIMIT_REDIS_URL is not set"
            );
            let own = RedisServer::start().expect("a redis-server binary");
            (own.url(), Some(own))
        }
    }
}

async fn connect(url: String, prefix: &str) -> RedisStore {
    RedisStore::builder(url)
        .prefix(prefix)
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap()
}

/// A region store on the standalone Redis: with home up, in the home region (home and region on
/// one server, under prefixes of their own); with home down, its home a private server killed
/// once connected. Returns the servers to keep alive.
async fn region(
    home_up: bool,
    answer: HomeUnreachable,
) -> (RegionStore<RedisStore>, Vec<RedisServer>) {
    let (url, own) = standalone();
    let pre = prefix("conformance");
    let mut servers: Vec<RedisServer> = own.into_iter().collect();
    let home = if home_up {
        connect(url.clone(), &format!("{pre}-home")).await
    } else {
        let mut home = RedisServer::start().expect("a redis-server binary");
        let store = connect(home.url(), &pre).await;
        tokio::task::block_in_place(|| home.kill());
        servers.push(home);
        store
    };
    let store = RegionBuilder::default()
        .claim_timeout(Duration::from_millis(300))
        .home_unreachable(answer)
        .build(home, connect(url, &pre).await);
    (store, servers)
}

/// A limit that does not refill during a test.
fn hourly(n: u64) -> Limit {
    Limit::token_bucket(Quota::per_hour(n).unwrap())
}

/// The conformance suite's rules a region store can be held to on Redis' time (the suite's
/// `ManualClock` does not drive its pools, and a pool answers from units leased from home, so
/// the checks comparing each decision with the model's do not apply, as for token leases):
/// decisions never admit more than the limit, sequential or concurrent, at most the capacity per
/// key (keys and policies independent); a cost above the capacity is never admitted; peeks
/// charge nothing; a batch with a request that cannot pass charges nothing; invalid keys and
/// batches are typed errors; a report past the limit is debt, and the window algorithms refuse
/// settling, typed. Home up, in the home region.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_redis_time_home_up() {
    let (store, _servers) = region(true, HomeUnreachable::Deny).await;
    let store = Arc::new(store);
    let k = |name: &'static str| Key::new(name).unwrap();

    // Sequential and concurrent decisions: never above the capacity, and not nothing.
    let mut admitted = 0;
    for _ in 0..30 {
        admitted += u64::from(
            store
                .decide(&Request::new(k("seq"), hourly(10)))
                .await
                .unwrap()
                .is_allowed(),
        );
    }
    assert!((1..=10).contains(&admitted), "sequential: {admitted} of 10");
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .decide(&Request::new(Key::new("par").unwrap(), hourly(10)))
                    .await
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += u64::from(task.await.unwrap().unwrap().is_allowed());
    }
    assert!(admitted <= 10, "concurrent: {admitted} of 10");
    // Another key, another policy: untouched by the first.
    let other = store
        .decide(&Request::new(k("other"), hourly(10)))
        .await
        .unwrap();
    assert!(other.is_allowed(), "{other:?}");
    let policy = Request::new(k("seq"), hourly(10))
        .with_policy("another")
        .unwrap();
    assert!(store.decide(&policy).await.unwrap().is_allowed());

    // A cost above the capacity: never, and nothing charged.
    let never = store
        .decide(&Request::new(k("big"), hourly(5)).with_cost(6))
        .await
        .unwrap();
    assert!(!never.is_allowed() && never.is_never(), "{never:?}");

    // Peeks charge nothing: the same answer twice, and the key still admits.
    let peek = Request::new(k("peeked"), hourly(3)).with_cost(0);
    let first = store.decide(&peek).await.unwrap();
    assert_eq!(store.decide(&peek).await.unwrap(), first);
    assert!(
        store
            .decide(&Request::new(k("peeked"), hourly(3)))
            .await
            .unwrap()
            .is_allowed()
    );

    // A batch with a request that cannot pass charges nothing: its other key still has all 2.
    let batch = [
        Request::new(k("batch-a"), hourly(2)),
        Request::new(k("batch-b"), hourly(2)).with_cost(3),
    ];
    let denied = store.decide_all(&batch).await.unwrap();
    assert!(denied.iter().any(|d| !d.is_allowed()), "{denied:?}");
    let mut admitted = 0;
    for _ in 0..4 {
        admitted += u64::from(store.decide(&batch[0]).await.unwrap().is_allowed());
    }
    assert_eq!(admitted, 2, "the denied batch charged its other key");

    // Invalid batches and keys: typed errors.
    let empty = store.decide_all(&[]).await;
    assert!(matches!(empty, Err(Error::InvalidRequest(_))), "{empty:?}");
    let duplicate = store.decide_all(&[batch[0], batch[0]]).await;
    assert!(
        matches!(duplicate, Err(Error::InvalidRequest(_))),
        "{duplicate:?}"
    );
    let bad = store.check("", hourly(1)).await;
    assert!(matches!(bad, Err(Error::InvalidKey(_))), "{bad:?}");

    // Settling: a report of 7 on a fresh key of 5 is debt; the window algorithms refuse it.
    let request = Request::new(k("probe"), Limit::gcra(Quota::per_second(5).unwrap()));
    let report = store
        .settle(Settle::Report(request.with_cost(7)))
        .await
        .unwrap();
    assert!(report.is_denied(), "{report:?}");
    let after = store.decide(&request).await.unwrap();
    assert!(!after.is_allowed(), "a key in debt admitted: {after:?}");
    let windows = Limit::fixed_window(Quota::per_second(5).unwrap());
    let refused = store
        .settle(Settle::Report(Request::new(request.key(), windows)))
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidRequest(_))),
        "{refused:?}"
    );
}

/// Home down (killed): with `HomeUnreachable::Deny` a request its pool cannot pay is denied,
/// never admitted, and never an error; with `Allow` it is admitted marked `Source::FailOpen`
/// (unchecked, never passed off as the limit's answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_home_down_denies_or_fails_open_marked() {
    for answer in [HomeUnreachable::Deny, HomeUnreachable::Allow] {
        let (store, _servers) = region(false, answer).await;
        let request = Request::new(Key::new("down").unwrap(), hourly(10));
        let other = Request::new(Key::new("down-b").unwrap(), hourly(10));
        let mut decisions = vec![store.decide(&request).await.unwrap()];
        decisions.extend(store.decide_all(&[request, other]).await.unwrap());
        for d in decisions {
            match answer {
                HomeUnreachable::Deny => assert!(!d.is_allowed(), "{answer:?}: {d:?}"),
                _ => assert!(
                    d.is_allowed() && d.source() == Source::FailOpen,
                    "{answer:?}: {d:?}"
                ),
            }
        }
        // A report with home down: debt kept in the region, or a typed error; never an admission.
        match store.settle(Settle::Report(request.with_cost(3))).await {
            Ok(d) => assert!(!d.is_allowed() || d.source() == Source::FailOpen, "{d:?}"),
            Err(e) => assert!(e.is_transient(), "{e:?}"),
        }
    }
}
