//! One key's lease, as plain data: the units this instance holds, when the lease ends, and how
//! large the next one should be. [`Leased`](crate::Leased) keeps one per (policy, key) under a
//! mutex; everything here is synchronous and never waits.

use distlimit_core::{Decision, Grant, Limit};

/// What a request may do with the key's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Local {
    /// Spent from the lease: admitted.
    Spent(Decision),
    /// The store said nothing is available before `denied_until`: denied without asking.
    Denied(Decision),
    /// The lease cannot pay: ask the store.
    Ask,
}

/// One key's lease.
#[derive(Clone, Debug, Default)]
pub(crate) struct Account {
    /// The limit the units were taken under.
    pub(crate) limit: Option<Limit>,
    /// Units held, withdrawn from the store and not spent.
    units: u64,
    /// Units of an ended lease, to give back at the next store call.
    pending: u64,
    /// When the lease ends (µs): its units then go back.
    expires_us: u64,
    /// When the lease was last refilled, and the units spent since: the local rate.
    taken_at_us: u64,
    spent_since_take: u64,
    /// The size of the last request to the store (0: never asked).
    last_want: u64,
    /// Until when the store has nothing for this key (µs).
    denied_until_us: u64,
    /// When the key is full again, as the store said at the last take.
    reset_at_us: u64,
    /// The units the store had left after the last take.
    store_remaining: u64,
    /// The last time a request used the lease.
    pub(crate) used_us: u64,
}

impl Account {
    /// Units held now (ended leases' units included until they go back).
    pub(crate) fn held(&self) -> u64 {
        self.units + self.pending
    }

    /// Ends the lease if it expired or belongs to another limit: its units become pending.
    fn expire(&mut self, limit: &Limit, now: u64) {
        if self.limit != Some(*limit) || now >= self.expires_us {
            self.pending += self.units;
            self.units = 0;
            if self.limit != Some(*limit) {
                *self = Account {
                    pending: self.pending,
                    ..Account::default()
                };
                self.limit = Some(*limit);
            }
        }
    }

    /// Spends `cost` units of the lease at `now` if it can pay, or says why not.
    pub(crate) fn spend(&mut self, limit: &Limit, now: u64, cost: u64) -> Local {
        self.used_us = now;
        self.expire(limit, now);
        if self.units >= cost {
            self.units -= cost;
            self.spent_since_take += cost;
            return Local::Spent(Decision::allowed(
                limit.capacity(),
                self.remaining(),
                std::time::Duration::from_micros(self.reset_at_us.saturating_sub(now)),
            ));
        }
        if now < self.denied_until_us {
            return Local::Denied(self.denial(limit, now, self.denied_until_us - now));
        }
        Local::Ask
    }

    /// Spends up to `cost` held units at `now` for a report (usage charged whatever is left):
    /// the units this instance already withdrew pay first. Returns the units spent; the rest
    /// goes to the store.
    pub(crate) fn drain(&mut self, limit: &Limit, now: u64, cost: u64) -> u64 {
        self.used_us = now;
        self.expire(limit, now);
        let spent = self.units.min(cost);
        self.units -= spent;
        self.spent_since_take += spent;
        spent
    }

    /// Puts back `cost` units a request spent from this lease under `limit` when another part
    /// of its batch denied it: the units are this instance's again, so the batch charged
    /// nothing. They return to the lease while it runs under `limit` (an ended lease hands them
    /// to the store at its next call, as any unspent unit); under another limit, they are
    /// pending, as an ended lease's.
    pub(crate) fn unspend(&mut self, limit: &Limit, cost: u64) {
        self.spent_since_take = self.spent_since_take.saturating_sub(cost);
        if self.limit == Some(*limit) {
            self.units += cost;
        } else {
            self.pending += cost;
        }
    }

    /// What this instance can admit now as far as it knows: its units, and what the store had
    /// left at the last take (capped at the capacity by `Decision`).
    fn remaining(&self) -> u64 {
        self.units.saturating_add(self.store_remaining)
    }

    fn denial(&self, limit: &Limit, now: u64, retry_us: u64) -> Decision {
        Decision::from_micros(
            false,
            limit.capacity(),
            self.remaining(),
            self.reset_at_us.saturating_sub(now),
            retry_us,
        )
    }

    /// The store call a request of `cost` needs at `now`: the units to give back (no longer
    /// held once this returns) and the units to ask for.
    ///
    /// The size follows the local rate: what was spent since the last take, over the time since,
    /// times the horizon; at most twice the last size, at least `cost`, at most the capacity.
    /// A key seen for the first time asks for `cost`.
    pub(crate) fn begin(
        &mut self,
        limit: &Limit,
        now: u64,
        cost: u64,
        horizon_us: u64,
    ) -> (u64, u64) {
        let capacity = limit.capacity();
        let k = if self.last_want == 0 {
            cost
        } else {
            let elapsed = now.saturating_sub(self.taken_at_us).max(1);
            let rate = u128::from(self.spent_since_take) * u128::from(horizon_us);
            let estimate = u64::try_from(rate.div_ceil(u128::from(elapsed))).unwrap_or(u64::MAX);
            estimate.min(self.last_want.saturating_mul(2))
        };
        let k = k.max(cost).min(capacity);
        let want = k
            .saturating_sub(self.units)
            .max(cost.saturating_sub(self.units));
        let back = std::mem::take(&mut self.pending);
        (back, want)
    }

    /// Applies the store's `grant` for a request of `cost` asked at `now`, and decides it: spent
    /// from the refilled lease, or denied.
    pub(crate) fn granted(
        &mut self,
        limit: &Limit,
        now: u64,
        cost: u64,
        want: u64,
        grant: Grant,
        horizon_us: u64,
    ) -> Decision {
        self.expire(limit, now);
        self.units += grant.granted;
        self.expires_us = now.saturating_add(horizon_us);
        self.taken_at_us = now;
        self.spent_since_take = 0;
        self.last_want = want.max(1);
        self.reset_at_us = now.saturating_add(grant.decision.reset_after_us());
        self.store_remaining = grant.decision.remaining();
        if grant.granted == 0 {
            // Nothing available: the store's exact wait for one unit.
            self.denied_until_us = now.saturating_add(grant.decision.retry_after_us());
        }
        match self.spend(limit, now, cost) {
            Local::Spent(decision) | Local::Denied(decision) => decision,
            Local::Ask => {
                // Fewer units than `cost` were available: a wait of the missing units at the
                // limit's rate, an estimate (other instances may take them first).
                let missing = cost - self.units;
                let retry = missing.saturating_mul(limit.quota().emission_interval_us());
                self.denial(limit, now, retry)
            }
        }
    }

    /// Takes the units of an ended lease for a give-back by the sweep (0 if it has not ended).
    pub(crate) fn sweep(&mut self, now: u64) -> u64 {
        if let Some(limit) = self.limit
            && now >= self.expires_us
        {
            self.expire(&limit, now);
        }
        std::mem::take(&mut self.pending)
    }
}
