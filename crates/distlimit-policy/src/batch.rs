//! The one all-or-nothing batch every check goes through: [`Item`]s in, one [`Answer`] per item
//! out ([`Limiter::decide_batch`](crate::Limiter::decide_batch), where its guarantee and its one
//! limit are documented).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlimit_core::{
    Decision, Error, Key, MAX_BATCH, NEVER, Observer, Outcome, Request, Settle, SettleKind, Store,
};
use smallvec::{SmallVec, smallvec};

use crate::limiter::{Listed, Verdict};
use crate::policy::{Applied, GLOBAL_KEY, Rule, Tier};
use crate::{CheckError, PolicySet, Scope};

/// One item of a batch: a check of a named policy, a store request of the caller's own, or
/// an item that is never admitted.
///
/// ```
/// use distlimit_core::{Key, Limit, Quota, Request};
/// use distlimit_policy::Item;
///
/// let limit = Limit::fixed_window(Quota::per_minute(5)?);
/// let items = [
///     Item::policy("per_user", b"alice", 1),
///     Item::request(Request::new(Key::new("10.0.0.1")?, limit).with_policy("per_ip")?),
///     Item::deny().shadow(true),
/// ];
/// assert!(items[2].is_shadow());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Item<'a> {
    kind: ItemKind<'a>,
    shadow: bool,
}

#[derive(Clone, Copy, Debug)]
enum ItemKind<'a> {
    Policy {
        policy: &'a str,
        key: &'a [u8],
        cost: u64,
        settle: Option<SettleKind>,
    },
    Request(Request<'a>),
    Deny,
}

impl<'a> Item<'a> {
    /// `cost` units for `key` on every tier of `policy` (a policy of the limiter's set; its
    /// shadow mode, lists and overrides apply).
    pub fn policy(policy: &'a str, key: &'a [u8], cost: u64) -> Self {
        let settle = None;
        ItemKind::Policy {
            policy,
            key,
            cost,
            settle,
        }
        .into()
    }

    /// The same policy item settling instead: a report (`cost` charged on every tier even past
    /// the limit, as debt) or a give-back (`cost` units returned), for usage known only after
    /// the response (see [`Limiter::settle`](crate::Limiter::settle)), through
    /// [`Store::settle_all`]. A batch holds either decisions or settling items, never both
    /// ([`Error::InvalidRequest`]). No effect on other items.
    #[must_use]
    pub fn settling(mut self, kind: SettleKind) -> Self {
        if let ItemKind::Policy { settle, .. } = &mut self.kind {
            *settle = Some(kind);
        }
        self
    }

    /// A store request of the caller's own: its state name, key, limit and cost as given.
    pub fn request(request: Request<'a>) -> Self {
        ItemKind::Request(request).into()
    }

    /// An item never admitted (a limit of zero): it denies the batch without asking the store.
    pub fn deny() -> Self {
        ItemKind::Deny.into()
    }

    /// The same item in shadow mode or not: decided apart, after the others, charged nothing
    /// once the batch is denied, and its denial denies nothing. A policy item is in shadow mode
    /// when this says so or its policy (or the key's override) does.
    #[must_use]
    pub fn shadow(self, shadow: bool) -> Self {
        Self { shadow, ..self }
    }

    /// Whether the item was set in shadow mode by [`shadow`](Self::shadow).
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }
}

impl<'a> From<ItemKind<'a>> for Item<'a> {
    fn from(kind: ItemKind<'a>) -> Self {
        Self {
            kind,
            shadow: false,
        }
    }
}

/// The answer to one [`Item`].
#[derive(Clone, Debug)]
pub struct Answer(AnswerKind);

#[derive(Clone, Debug)]
enum AnswerKind {
    /// A policy item's: its verdict holds the outcome and the decision.
    Verdict(Verdict),
    /// A request or deny item's.
    Store {
        outcome: Outcome,
        decision: Decision,
    },
}

impl Answer {
    /// Allowed, denied, or denied in shadow mode (let through).
    pub fn outcome(&self) -> Outcome {
        match &self.0 {
            AnswerKind::Verdict(verdict) => verdict.outcome(),
            AnswerKind::Store { outcome, .. } => *outcome,
        }
    }

    /// Whether this item lets the request through: `false` only for [`Outcome::Denied`].
    pub fn is_allowed(&self) -> bool {
        self.outcome() != Outcome::Denied
    }

    /// The decision: a policy item's most restrictive tier, a request item's store decision
    /// (what it alone would be answered), or, for a [`deny`](Item::deny) item, a denial with
    /// `retry_after` = [`NEVER`].
    pub fn decision(&self) -> &Decision {
        match &self.0 {
            AnswerKind::Verdict(verdict) => verdict.decision(),
            AnswerKind::Store { decision, .. } => decision,
        }
    }

    /// A policy item's verdict (its tiers, list, override); `None` for the other items.
    pub fn verdict(&self) -> Option<&Verdict> {
        match &self.0 {
            AnswerKind::Verdict(verdict) => Some(verdict),
            AnswerKind::Store { .. } => None,
        }
    }

    /// The verdict of a policy item, owned.
    #[inline]
    pub fn into_verdict(self) -> Option<Verdict> {
        match self.0 {
            AnswerKind::Verdict(verdict) => Some(verdict),
            AnswerKind::Store { .. } => None,
        }
    }

    fn of_store(decision: Decision, shadow: bool) -> Self {
        Self(AnswerKind::Store {
            outcome: outcome(decision.is_allowed(), shadow),
            decision,
        })
    }

    #[inline]
    fn of_verdict(verdict: Verdict) -> Self {
        Self(AnswerKind::Verdict(verdict))
    }
}

/// The outcome of a decision that was `allowed` or not, in shadow mode or not.
pub(crate) fn outcome(allowed: bool, shadow: bool) -> Outcome {
    match (allowed, shadow) {
        (true, _) => Outcome::Allowed,
        (false, false) => Outcome::Denied,
        (false, true) => Outcome::ShadowDenied,
    }
}

/// The answer of something never admitted (a deny-listed key, a zero limit).
pub(crate) fn never() -> Decision {
    Decision::denied(0, 0, Duration::ZERO, NEVER)
}

/// An item with its policy looked up once, in the set the batch loaded.
#[derive(Clone, Copy)]
pub(crate) struct Resolved<'s, 'a> {
    kind: ResolvedKind<'s, 'a>,
    shadow: bool,
}

#[derive(Clone, Copy)]
enum ResolvedKind<'s, 'a> {
    Policy {
        applied: &'s Arc<Applied>,
        listed: Option<Listed>,
        /// Validated once, here: the tiers' requests take it as it is.
        key: Key<'a>,
        cost: u64,
        settle: Option<SettleKind>,
    },
    /// Borrowed from its item: a resolved item stays small.
    Request(&'a Request<'a>),
    Deny,
}

impl<'s, 'a> Resolved<'s, 'a> {
    /// Looks `item`'s policy up in `set` and validates its requests (nothing fails later).
    #[inline]
    pub(crate) fn new(set: &'s PolicySet, item: &'a Item<'a>) -> Result<Self, CheckError> {
        let kind = match &item.kind {
            &ItemKind::Policy {
                policy,
                key,
                cost,
                settle,
            } => return Self::of_policy(set, policy, key, cost, settle, item.shadow),
            ItemKind::Request(request) => ResolvedKind::Request(request),
            ItemKind::Deny => ResolvedKind::Deny,
        };
        Ok(Self {
            kind,
            shadow: item.shadow,
        })
    }

    /// A policy item ([`Item::policy`], settling when `settle` says so, in shadow mode when
    /// `shadow`), resolved without building the item.
    #[inline]
    pub(crate) fn of_policy(
        set: &'s PolicySet,
        policy: &str,
        key: &'a [u8],
        cost: u64,
        settle: Option<SettleKind>,
        shadow: bool,
    ) -> Result<Self, CheckError> {
        let Some(found) = set.get(policy) else {
            return Err(CheckError::UnknownPolicy(policy.to_owned()));
        };
        let key = Key::new(key).map_err(Error::from)?;
        let rule = found.rule(key.as_bytes());
        let listed = match rule {
            Some(Rule::Allow) => Some(Listed::Allow),
            Some(Rule::Deny) => Some(Listed::Deny),
            Some(Rule::Override(_)) | None => None,
        };
        let applied = found.applied(rule);
        Ok(Self {
            kind: ResolvedKind::Policy {
                applied,
                listed,
                key,
                cost,
                settle,
            },
            shadow: shadow || applied.shadow,
        })
    }

    /// The policy's name, for a policy item.
    fn policy(&self) -> Option<&str> {
        match &self.kind {
            ResolvedKind::Policy { applied, .. } => Some(&applied.policy),
            _ => None,
        }
    }

    /// Denies the batch without the store: a deny item or a deny-listed key, not in shadow mode.
    fn denies(&self) -> bool {
        !self.shadow
            && matches!(
                self.kind,
                ResolvedKind::Deny
                    | ResolvedKind::Policy {
                        listed: Some(Listed::Deny),
                        ..
                    }
            )
    }

    /// The number of store requests.
    #[inline]
    fn len(&self) -> usize {
        match &self.kind {
            ResolvedKind::Policy {
                listed: None,
                applied,
                ..
            } => applied.tiers.len(),
            ResolvedKind::Request(_) => 1,
            _ => 0,
        }
    }

    /// How a settling policy item settles (`None`: it is decided).
    fn settles(&self) -> Option<SettleKind> {
        match self.kind {
            ResolvedKind::Policy { settle, .. } => settle,
            _ => None,
        }
    }

    /// The store requests, each charging nothing when `peek`.
    fn requests(&self, peek: bool) -> impl Iterator<Item = Request<'_>> + '_ {
        let (tiers, key, cost, own) = match &self.kind {
            ResolvedKind::Policy {
                listed: None,
                applied,
                key,
                cost,
                ..
            } => (&applied.tiers[..], Some(*key), *cost, None),
            ResolvedKind::Request(request) => (&[][..], None, 0, Some(**request)),
            _ => (&[][..], None, 0, None),
        };
        let requests = key
            .into_iter()
            .flat_map(move |key| tiers.iter().map(move |tier| tier_request(tier, key, cost)))
            .chain(own);
        requests.map(move |r| if peek { r.with_cost(0) } else { r })
    }

    /// The answer from the decisions of [`requests`](Self::requests), in order (owned when the
    /// caller can give them: a verdict keeps them without a copy).
    #[inline]
    fn answer(&self, decisions: Cow<'_, [Decision]>) -> Answer {
        match &self.kind {
            ResolvedKind::Policy {
                applied,
                listed: Some(listed),
                ..
            } => Answer::of_verdict(Verdict::of_listed(applied, *listed, self.shadow)),
            ResolvedKind::Policy { applied, .. } => {
                let verdict = match &*decisions {
                    [one] => Verdict::new(applied, *one, Vec::new(), self.shadow),
                    all => {
                        let decision = Decision::most_restrictive(all).unwrap_or_else(never);
                        Verdict::new(applied, decision, decisions.into_owned(), self.shadow)
                    }
                };
                Answer::of_verdict(verdict)
            }
            ResolvedKind::Request(_) => Answer::of_store(
                decisions.first().copied().unwrap_or_else(never),
                self.shadow,
            ),
            ResolvedKind::Deny => Answer::of_store(never(), self.shadow),
        }
    }
}

/// Policy checks with their policies resolved once, in the set their check loaded: what
/// [`Limiter::check_all_now`](crate::Limiter::check_all_now) returns when the store must be
/// awaited, decided with [`Limiter::decide_plan`](crate::Limiter::decide_plan) without looking
/// a policy up again. It owns what it holds (each check's tiers as resolved, its list, its
/// key), so a future can keep it.
pub struct Plan(Vec<Planned>);

/// A policy check of a [`Plan`]: a [`Resolved`] policy item, owned.
struct Planned {
    applied: Arc<Applied>,
    listed: Option<Listed>,
    key: Box<[u8]>,
    cost: u64,
    shadow: bool,
}

impl Plan {
    /// The plan of `items`' decided policy items (all that `check_all_now` resolves).
    pub(crate) fn new(items: &[Resolved<'_, '_>]) -> Self {
        let planned = |item: &Resolved<'_, '_>| match item.kind {
            ResolvedKind::Policy {
                applied,
                listed,
                key,
                cost,
                settle: None,
            } => Some(Planned {
                applied: Arc::clone(applied),
                listed,
                key: key.as_bytes().into(),
                cost,
                shadow: item.shadow,
            }),
            _ => None,
        };
        Self(items.iter().filter_map(planned).collect())
    }

    /// Its items, borrowing the plan: no policy looked up again.
    pub(crate) fn resolved(&self) -> Result<SmallVec<[Resolved<'_, '_>; INLINE]>, Error> {
        let resolved = self.0.iter().map(|p| {
            let kind = ResolvedKind::Policy {
                applied: &p.applied,
                listed: p.listed,
                key: Key::new(&*p.key)?,
                cost: p.cost,
                settle: None,
            };
            Ok::<_, Error>(Resolved {
                kind,
                shadow: p.shadow,
            })
        });
        resolved.collect()
    }
}

/// The store request of `tier` for `key` (validated by [`Resolved::new`]).
#[inline]
pub(crate) fn tier_request<'a>(tier: &'a Tier, key: Key<'a>, cost: u64) -> Request<'a> {
    let key = match tier.scope() {
        Scope::Key => key,
        // `GLOBAL_KEY` is one byte, a valid key: never the fallback (folded away).
        Scope::Global => Key::new(GLOBAL_KEY).unwrap_or(key),
    };
    let request = Request::new(key, *tier.limit()).with_cost(cost);
    match tier.state() {
        Some(state) => request.with_state(state),
        None => request,
    }
}

/// What decides a batch: the store and whom to report to.
pub(crate) struct Engine<'l, S: ?Sized> {
    pub(crate) store: &'l S,
    pub(crate) observer: Option<&'l Arc<dyn Observer>>,
    pub(crate) started: Option<Instant>,
}

impl<S: Store + ?Sized> Engine<'_, S> {
    /// Decides `items` without waiting when the store can: when the store answers their
    /// requests at once ([`Store::decide_now`] for one, [`Store::decide_all_now`] for several;
    /// the memory store does, without allocating up to [`INLINE`] requests). `None` (nothing
    /// charged) otherwise, and for what [`decide`](Self::decide) does in several store calls
    /// (more than [`MAX_BATCH`] requests, items in shadow mode asking the store beside
    /// others). Each answer goes to `out` with its item's index, in the order `decide` gives
    /// them.
    pub(crate) fn decide_now(
        &self,
        items: &[Resolved<'_, '_>],
        mut out: impl FnMut(usize, Answer),
    ) -> Option<Result<(), CheckError>> {
        if items.iter().any(|item| item.settles().is_some()) {
            return None;
        }
        if let [item] = items
            && item.len() <= 1
        {
            return Some(self.decide_one_now(item)?.map(|answer| out(0, answer)));
        }
        let enforced: usize = items.iter().filter(|i| !i.shadow).map(Resolved::len).sum();
        let mut in_shadow = items.iter().filter(|i| i.shadow && i.len() > 0);
        // The items whose requests go to the store: those not in shadow mode, or else the one
        // in shadow mode that asks (as `decide` would ask it, after an empty batch).
        let (shadow, count) = match (enforced, in_shadow.next(), in_shadow.next()) {
            (_, None, _) => (false, enforced),
            (0, Some(one), None) => (true, one.len()),
            _ => return None,
        };
        if count > MAX_BATCH {
            return None;
        }
        let asks = |item: &Resolved<'_, '_>| item.shadow == shadow;
        let denied = items.iter().any(Resolved::denies);
        let mut requests: SmallVec<[Request<'_>; INLINE]> = SmallVec::new();
        for item in items.iter().filter(|item| asks(item)) {
            for request in item.requests(denied) {
                requests.push(request);
            }
        }
        let mut decisions: SmallVec<[Decision; INLINE]> = smallvec![never(); requests.len()];
        let decided = match (&requests[..], &mut decisions[..]) {
            ([], _) => Ok(()),
            ([request], [decision]) => self.store.decide_now(request)?.map(|d| *decision = d),
            (requests, decisions) => self.decide_all_now(requests, decisions)?,
        };
        if let Err(e) = decided {
            let askers: SmallVec<[Resolved<'_, '_>; INLINE]> =
                items.iter().filter(|item| asks(item)).copied().collect();
            return Some(Err(self.failed(&askers, e)));
        }
        let mut rest = &decisions[..];
        // One clock read for the batch: its items were decided together.
        let latency = self.latency();
        let enforced_first = items.iter().enumerate().filter(|(_, item)| !item.shadow);
        let in_shadow = items.iter().enumerate().filter(|(_, item)| item.shadow);
        for (i, item) in enforced_first.chain(in_shadow) {
            let own = match asks(item) {
                true => {
                    let (own, next) = rest.split_at(item.len().min(rest.len()));
                    rest = next;
                    own
                }
                false => &[],
            };
            let answer = item.answer(Cow::Borrowed(own));
            self.report_at(item, &answer, latency);
            out(i, answer);
        }
        Some(Ok(()))
    }

    /// [`decide_now`](Self::decide_now) of a batch of one item (a check): its one request,
    /// if any, straight to the store's `decide_now`.
    #[inline]
    pub(crate) fn decide_one_now(
        &self,
        item: &Resolved<'_, '_>,
    ) -> Option<Result<Answer, CheckError>> {
        let request = match (&item.kind, item.len()) {
            (_, 0) => None,
            (
                ResolvedKind::Policy {
                    applied,
                    key,
                    cost,
                    settle: None,
                    ..
                },
                1,
            ) => Some(tier_request(applied.tiers.first()?, *key, *cost)),
            (ResolvedKind::Request(request), _) => Some(**request),
            _ => return None,
        };
        let answer = match request.map(|request| self.store.decide_now(&request)) {
            None => item.answer(Cow::Borrowed(&[])),
            Some(decided) => match decided? {
                Ok(d) => item.answer(Cow::Borrowed(&[d])),
                Err(e) => return Some(Err(self.failed(std::slice::from_ref(item), e))),
            },
        };
        self.report(item, &answer);
        Some(Ok(answer))
    }

    /// Decides `items`, all-or-nothing (see the [module docs](self)); each answer goes to `out`
    /// with its item's index.
    pub(crate) async fn decide(
        &self,
        items: &[Resolved<'_, '_>],
        mut out: impl FnMut(usize, Answer),
    ) -> Result<(), CheckError> {
        if items.iter().any(|item| item.settles().is_some()) {
            return self.settle(items, out).await;
        }
        let mut denied = items.iter().any(Resolved::denies);
        let enforced = |item: &&Resolved<'_, '_>| !item.shadow;
        let count: usize = items.iter().filter(enforced).map(Resolved::len).sum();
        let mut decisions: SmallVec<[Decision; 1]> = match count {
            0 => SmallVec::new(),
            // The one request decided on its own, not through `ask`: a smaller future on every
            // single-policy check that waits (Redis), about 140 instructions (callgrind).
            1 => {
                let mut requests = items.iter().filter(enforced);
                let Some(request) = requests.find_map(|item| item.requests(denied).next()) else {
                    return Err(MISMATCH.into());
                };
                let decision = self.store.decide(&request).await;
                smallvec![decision.map_err(|e| self.failed(items, e))?]
            }
            _ => {
                let mut all = Vec::new();
                let mut start = 0;
                while start < items.len() {
                    // Whole items, as many as fit in MAX_BATCH (an item alone when larger).
                    let mut end = start;
                    let mut len = 0;
                    while let Some(item) = items.get(end) {
                        let more = if item.shadow { 0 } else { item.len() };
                        if len > 0 && len + more > MAX_BATCH {
                            break;
                        }
                        len += more;
                        end += 1;
                    }
                    let chunk = items.get(start..end).unwrap_or_default();
                    start = end;
                    if len == 0 {
                        continue;
                    }
                    let requests: Vec<Request<'_>> = chunk
                        .iter()
                        .filter(enforced)
                        .flat_map(|item| item.requests(denied))
                        .collect();
                    let answered = self
                        .decide_all(requests)
                        .await
                        .map_err(|e| self.failed(items, e))?;
                    denied |= answered.iter().any(Decision::is_denied);
                    if all.is_empty() {
                        all = answered;
                    } else {
                        all.extend(answered);
                    }
                }
                SmallVec::from_vec(all)
            }
        };
        denied |= decisions.iter().any(Decision::is_denied);
        // One item asked the store (a policy of several tiers): its verdict keeps the store's
        // `Vec` of decisions.
        let askers = items
            .iter()
            .filter(enforced)
            .filter(|i| i.len() > 0)
            .count();
        let mut owned =
            (count > 1 && askers == 1).then(|| std::mem::take(&mut decisions).into_vec());
        let mut rest = &decisions[..];
        for (i, item) in items.iter().enumerate().filter(|(_, item)| !item.shadow) {
            let answer = match owned.take_if(|_| item.len() > 0) {
                Some(all) => item.answer(Cow::Owned(all)),
                None => {
                    let (own, next) = rest.split_at(item.len().min(rest.len()));
                    rest = next;
                    item.answer(Cow::Borrowed(own))
                }
            };
            self.report(item, &answer);
            out(i, answer);
        }
        // Shadow mode: each apart, after the rest, charging nothing once the batch is denied.
        for (i, item) in items.iter().enumerate().filter(|(_, item)| item.shadow) {
            let decisions = match item.len() {
                0 => SmallVec::new(),
                _ => (self.ask(item.requests(denied)).await)
                    .map_err(|e| self.failed(std::slice::from_ref(item), e))?,
            };
            // Several: the verdict keeps the store's `Vec`.
            let answer = match decisions.spilled() {
                true => item.answer(Cow::Owned(decisions.into_vec())),
                false => item.answer(Cow::Borrowed(&decisions)),
            };
            self.report(item, &answer);
            out(i, answer);
        }
        Ok(())
    }

    /// The decisions of `requests` (at least one): one `decide` for one, one
    /// [`decide_all`](Self::decide_all) for several.
    async fn ask<'r>(
        &self,
        mut requests: impl Iterator<Item = Request<'r>>,
    ) -> Result<SmallVec<[Decision; 1]>, Error> {
        let first = requests.next().ok_or(MISMATCH)?;
        let Some(second) = requests.next() else {
            return Ok(smallvec![self.store.decide(&first).await?]);
        };
        let all = [first, second].into_iter().chain(requests).collect();
        Ok(SmallVec::from_vec(self.decide_all(all).await?))
    }

    /// Settles `items` (policy items that all settle; else an [`Error::InvalidRequest`]):
    /// every one applied (allow- and deny-listed keys charge nothing), each answered by the
    /// peeks after it.
    async fn settle(
        &self,
        items: &[Resolved<'_, '_>],
        mut out: impl FnMut(usize, Answer),
    ) -> Result<(), CheckError> {
        let mut settles = Vec::new();
        for item in items {
            let Some(kind) = item.settles() else {
                let mixed =
                    Error::InvalidRequest("a batch mixes decisions with reports or give-backs");
                return Err(self.failed(items, mixed));
            };
            settles.extend(item.requests(false).map(|r| kind.of(r)));
        }
        let decisions = self
            .settle_all(&settles)
            .await
            .map_err(|e| self.failed(items, e))?;
        let mut rest = &decisions[..];
        for (i, item) in items.iter().enumerate() {
            let (own, next) = rest.split_at(item.len().min(rest.len()));
            rest = next;
            let answer = item.answer(Cow::Borrowed(own));
            self.report(item, &answer);
            out(i, answer);
        }
        Ok(())
    }

    /// `settle_all` in batches of [`MAX_BATCH`], settles of one kind on the same state and key
    /// merged into one costing the sum; one decision per settle, in order.
    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        let mut merged: Vec<Settle<'_>> = Vec::with_capacity(settles.len());
        let mut slots = Vec::with_capacity(settles.len());
        for s in settles {
            let (r, same) = (s.request(), |m: &Settle<'_>| m.is_report() == s.is_report());
            let at = merged.iter().position(|m| {
                same(m) && m.request().key() == r.key() && m.request().policy() == r.policy()
            });
            slots.push(at.unwrap_or(merged.len()));
            match at.and_then(|at| merged.get_mut(at)) {
                Some(m) => {
                    let cost = m.request().cost().saturating_add(r.cost());
                    *m = m.with_request(m.request().with_cost(cost));
                }
                None => merged.push(*s),
            }
        }
        let mut answered = Vec::with_capacity(merged.len());
        for chunk in merged.chunks(MAX_BATCH) {
            answered.extend(self.store.settle_all(chunk).await?);
        }
        // Each settle is answered with its merged settle's decision.
        slots
            .iter()
            .map(|&slot| answered.get(slot).copied().ok_or(MISMATCH))
            .collect()
    }

    /// One `decide_all`, with requests on the same state and key merged into one costing the
    /// sum; one decision per request of `requests`, in order.
    async fn decide_all(&self, requests: Vec<Request<'_>>) -> Result<Vec<Decision>, Error> {
        if !twice(&requests) {
            let decisions = self.store.decide_all(&requests).await?;
            return match decisions.len() == requests.len() {
                true => Ok(decisions),
                false => Err(MISMATCH),
            };
        }
        let (merged, slots) = distlimit_core::merge_batch(&requests);
        let answered = self.store.decide_all(&merged).await?;
        let mut decisions = vec![never(); slots.len()];
        answer_merged(&requests, &merged, &answered, &slots, &mut decisions)?;
        Ok(decisions)
    }

    /// [`decide_all`](Self::decide_all) without waiting, into `decisions` (as long as
    /// `requests`): [`Store::decide_all_now`], `None` when the store must be awaited.
    fn decide_all_now(
        &self,
        requests: &[Request<'_>],
        decisions: &mut [Decision],
    ) -> Option<Result<(), Error>> {
        if !twice(requests) {
            return self.store.decide_all_now(requests, decisions);
        }
        let (merged, slots) = distlimit_core::merge_batch(requests);
        let mut answered = vec![never(); merged.len()];
        if let Err(e) = self.store.decide_all_now(&merged, &mut answered)? {
            return Some(Err(e));
        }
        Some(answer_merged(
            requests, &merged, &answered, &slots, decisions,
        ))
    }

    /// Reports a policy item's answer to the observer, as a check timed until now.
    #[inline]
    fn report(&self, item: &Resolved<'_, '_>, answer: &Answer) {
        self.report_at(item, answer, self.latency());
    }

    /// The time since the batch started, when there is an observer to report it to.
    #[inline]
    fn latency(&self) -> Option<Duration> {
        self.observer
            .and(self.started)
            .map(|started| started.elapsed())
    }

    /// Reports a policy item's answer to the observer with `latency`, the time its batch took
    /// (read once for the items decided together).
    #[inline]
    fn report_at(&self, item: &Resolved<'_, '_>, answer: &Answer, latency: Option<Duration>) {
        if let (Some(observer), Some(latency), ResolvedKind::Policy { applied, .. }) =
            (self.observer, latency, &item.kind)
        {
            let (outcome, decision) = (answer.outcome(), answer.decision());
            (applied.observed).report(observer, &applied.policy, outcome, decision, latency);
        }
    }

    /// Reports a failed batch for each of its policy items and returns the error.
    fn failed(&self, items: &[Resolved<'_, '_>], error: Error) -> CheckError {
        let error = CheckError::from(error);
        if let (Some(observer), CheckError::Store(e)) = (self.observer, &error)
            && !e.is_invalid_input()
        {
            for policy in items.iter().filter_map(Resolved::policy) {
                observer.on_store_error(<crate::Limiter>::STORE_LABEL, policy, e);
            }
        }
        error
    }
}

/// The most items, and store requests, a batch holds without allocating (on a store that
/// answers at once, the memory store).
pub(crate) const INLINE: usize = 8;

/// Whether two of `requests` are on the same state and key (then they are merged first).
fn twice(requests: &[Request<'_>]) -> bool {
    requests.iter().enumerate().any(|(i, a)| {
        requests[..i]
            .iter()
            .any(|b| a.key() == b.key() && a.policy() == b.policy())
    })
}

/// Fills `decisions`, one per request of a merged batch, from the decisions of the merged
/// requests (`slots` says which answers which). Duplicates are answered one after another, as
/// envoyproxy/ratelimit answers a descriptor repeated in one request: each after the hits of
/// those before it. Admitted, each gets what was left after its own hit (19, then 18, of 20);
/// denied (nothing charged), those that fit are admitted as their peek after the earlier ones,
/// the rest denied with the merged request's wait.
fn answer_merged(
    requests: &[Request<'_>],
    merged: &[Request<'_>],
    answered: &[Decision],
    slots: &[usize],
    decisions: &mut [Decision],
) -> Result<(), Error> {
    if decisions.len() != slots.len() || requests.len() != slots.len() {
        return Err(MISMATCH);
    }
    let admitted = answered.iter().all(Decision::is_allowed);
    // The units of each merged request given to its duplicates answered so far.
    let mut spent = vec![0_u64; merged.len()];
    for ((decision, &slot), request) in decisions.iter_mut().zip(slots).zip(requests) {
        let (Some(&d), Some(m), Some(spent)) =
            (answered.get(slot), merged.get(slot), spent.get_mut(slot))
        else {
            return Err(MISMATCH);
        };
        let before = *spent;
        *spent = spent.saturating_add(request.cost());
        if before == 0 && *spent == m.cost() {
            *decision = d; // alone on its state and key
            continue;
        }
        // The units available before the batch: an admitted decision's remaining was charged.
        let available = d
            .remaining()
            .saturating_add(if admitted { m.cost() } else { 0 });
        let fits = d.is_allowed() || (*spent <= available && *spent < m.cost());
        let left = available.saturating_sub(if admitted { *spent } else { before });
        let (reset, retry) = (d.reset_after_us(), d.retry_after_us());
        *decision =
            Decision::from_micros(fits, d.limit(), left, reset, retry).with_source(d.source());
    }
    Ok(())
}

/// The error of decisions that do not match the requests they answer.
pub(crate) const MISMATCH: Error =
    Error::InvalidRequest("the store answered another number of decisions");
