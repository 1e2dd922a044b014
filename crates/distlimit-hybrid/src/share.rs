//! [`Share`]: this instance's share of a global limit, enforced on the fallback.

use std::cell::RefCell;

use distlimit_core::{Limit, Quota};

/// Scales limits by `1 / instances` for the fallback.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Share {
    instances: u64,
}

/// The last share scaled on a thread: the instance count, the global limit, its share.
struct Scaled {
    instances: u64,
    global: Limit,
    share: Limit,
}

thread_local! {
    /// The last limit scaled on this thread: a service applies a few limits over and over, so
    /// the open path rarely rebuilds a quota (which divides for a gcd). Compared in place: a
    /// hit copies out only the share.
    static LAST: RefCell<Option<Scaled>> = const { RefCell::new(None) };
}

impl Share {
    pub(crate) fn new(instances: u64) -> Self {
        Self {
            instances: instances.max(1),
        }
    }

    /// `limit`'s `max_in_flight` divided by the instance count, rounded down, at least 1.
    pub(crate) fn scale_permits(
        self,
        limit: &distlimit_core::PermitLimit,
    ) -> distlimit_core::PermitLimit {
        let max = (u64::from(limit.max_in_flight()) / self.instances).max(1);
        let max = u32::try_from(max).unwrap_or(limit.max_in_flight());
        distlimit_core::PermitLimit::new(max, limit.lease()).unwrap_or(*limit)
    }

    /// Whether limits stay as they are (one instance).
    #[inline]
    pub(crate) fn is_whole(self) -> bool {
        self.instances == 1
    }

    /// `limit` with its limit and burst divided by the instance count, rounded down, at least 1;
    /// the period and the algorithm unchanged.
    #[inline]
    pub(crate) fn scale(self, limit: &Limit) -> Limit {
        if self.is_whole() {
            return *limit;
        }
        let hit = LAST.with_borrow(|last| match last {
            Some(last) if last.instances == self.instances && last.global == *limit => {
                Some(last.share)
            }
            _ => None,
        });
        if let Some(share) = hit {
            return share;
        }
        let share = self.compute(limit);
        LAST.set(Some(Scaled {
            instances: self.instances,
            global: *limit,
            share,
        }));
        share
    }

    fn compute(self, limit: &Limit) -> Limit {
        let q = limit.quota();
        let part = |v: u64| (v / self.instances).max(1);
        // A smaller limit and burst over the same period always make a valid quota; keep the
        // global limit should that ever change.
        Quota::from_parts(part(q.limit()), q.period_us(), part(q.burst()))
            .map_or(*limit, |quota| Limit::new(limit.algorithm(), quota))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divides_limit_and_burst_rounding_down_to_at_least_one() {
        let global = Limit::token_bucket(Quota::per_minute(100).unwrap().with_burst(10).unwrap());
        let share = Share::new(4).scale(&global);
        assert_eq!(share.quota().limit(), 25);
        assert_eq!(share.quota().burst(), 2);
        assert_eq!(share.quota().period_us(), 60_000_000);
        assert_eq!(share.algorithm(), global.algorithm());
        // Cached, and keyed by the instance count too.
        assert_eq!(Share::new(4).scale(&global), share);
        let tiny = Share::new(1000).scale(&global);
        assert_eq!((tiny.quota().limit(), tiny.quota().burst()), (1, 1));
        assert_eq!(Share::new(1).scale(&global), global);
        let window = Limit::fixed_window(Quota::per_second(9).unwrap());
        assert_eq!(Share::new(3).scale(&window).capacity(), 3);
    }
}
