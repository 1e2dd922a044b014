//! [`RedisStore`]: the [`Store`] contract on Redis, one Lua script per decision.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use distlimit_core::{
    Clock, Decision, Error, Key, Request, Settle, Store, validate_batch, validate_settles,
};

use crate::coalesce::Coalescer;
use crate::config::{DEFAULT_COALESCE_IN_FLIGHT, RedisStoreBuilder, Topology};
use crate::connection::{Backend, Timeouts};
use crate::layout::{KeyBuf, KeyLayout, hash_slot};
use crate::script::{Answer, Batch, Call, Group, ScriptRequest, TimeSource, only, protocol};

/// How a [`RedisStore`] reaches Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// One server over one multiplexed `ConnectionManager` connection that reconnects by itself.
    Standalone,
    /// One server over a `deadpool` pool of multiplexed connections ([`RedisStoreBuilder::pool`]).
    Pool,
    /// The primary that a set of sentinels names, followed across failovers.
    Sentinel,
    /// A Redis Cluster.
    Cluster,
}

/// The [`Store`] contract on Redis: every decision is one Lua script, atomic inside Redis,
/// shared by every instance of a service that uses the same server and prefix.
///
/// Made by [`RedisStore::connect`] from a URL, or configured through [`RedisStore::builder`],
/// [`RedisStore::sentinel`] and [`RedisStore::cluster`]. Cloning is cheap: clones share the
/// connections. See the [crate documentation](crate) for the key layout, time source, failure
/// classification and connection modes.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Arc<Backend>,
    /// Coalesces script calls; `None` when off (`coalesce(false)`); in a Cluster the coalescer
    /// keys its slots by hash slot.
    coalescer: Option<Arc<Coalescer>>,
    layout: KeyLayout,
    clock: Option<Arc<dyn Clock>>,
    timeouts: Timeouts,
    mode: Mode,
    permit_ids: crate::permits::PermitIds,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("mode", &self.inner.mode)
            .field("layout", &self.inner.layout)
            .field("client_clock", &self.inner.clock.is_some())
            .field("connect_timeout", &self.inner.timeouts.connect)
            .field("response_timeout", &self.inner.timeouts.response)
            .field("durable", &self.inner.timeouts.durable)
            .field("coalescer", &self.inner.coalescer)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects with the default options to the Redis the URL names:
    ///
    /// * `redis://[[user]:password@]host[:port][/db]`: one server (`rediss://` for TLS, see
    ///   [`RedisStoreBuilder::tls_root_certificate`] for a private CA;
    ///   `unix:///path/to/redis.sock` for a Unix socket);
    /// * `redis+sentinel://[[user]:password@]host:port[,host:port…]/service[/db]`: the primary
    ///   the sentinels at these addresses name for `service`; the credentials and database are
    ///   the primary's (`rediss+sentinel://` for TLS to the sentinels and the primary);
    /// * `redis+cluster://[[user]:password@]host:port[,host:port…]`: a Cluster, through any of
    ///   its nodes (`rediss+cluster://` for TLS).
    ///
    /// Errors as [`RedisStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::builder(url).connect().await
    }

    /// A builder for a store at `url` (any URL [`connect`](Self::connect) takes).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Topology::Url(url.into()))
    }

    /// A builder for the primary that the sentinels at `sentinel_urls` (`redis://host:port`,
    /// with the sentinels' own credentials if they need any) name for `service_name`. Give the
    /// primary's credentials with [`RedisStoreBuilder::node_auth`]. The primary speaks TLS when
    /// the sentinel URLs are `rediss://`.
    pub fn sentinel(
        sentinel_urls: impl IntoIterator<Item = impl Into<String>>,
        service_name: impl Into<String>,
    ) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Topology::Sentinel {
            sentinels: sentinel_urls.into_iter().map(Into::into).collect(),
            service: service_name.into(),
            auth: Default::default(),
        })
    }

    /// A builder for the Redis Cluster that `node_urls` (`redis://host:port`, some or all of
    /// its nodes, with one set of credentials) belong to.
    pub fn cluster(node_urls: impl IntoIterator<Item = impl Into<String>>) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Topology::Cluster(
            node_urls.into_iter().map(Into::into).collect(),
        ))
    }

    pub(crate) async fn open(
        builder: RedisStoreBuilder,
        topology: Topology,
        layout: KeyLayout,
    ) -> Result<Self, Error> {
        let timeouts = Timeouts {
            connect: builder.connect_timeout,
            response: builder.response_timeout,
            durable: builder.durable,
        };
        let mut auth = builder.auth.clone();
        let (backend, mode) = match &topology {
            Topology::Standalone(url) | Topology::Url(url) => (
                Backend::standalone(url, &auth, builder.pool_size, timeouts).await?,
                if builder.pool_size.is_some() {
                    Mode::Pool
                } else {
                    Mode::Standalone
                },
            ),
            Topology::Sentinel {
                sentinels,
                service,
                auth: from_url,
            } => {
                // The builder's settings win over the URL's.
                auth.username = auth.username.or_else(|| from_url.username.clone());
                auth.password = auth.password.or_else(|| from_url.password.clone());
                auth.db = auth.db.or(from_url.db);
                (
                    Backend::sentinel(sentinels, service, &auth, timeouts).await?,
                    Mode::Sentinel,
                )
            }
            Topology::Cluster(nodes) => (
                Backend::cluster(nodes, &auth, timeouts).await?,
                Mode::Cluster,
            ),
        };
        let backend = Arc::new(backend);
        let coalescer = builder.coalesce.then(|| {
            let in_flight = builder
                .coalesce_in_flight
                .or(builder.pool_size)
                .unwrap_or(DEFAULT_COALESCE_IN_FLIGHT);
            Coalescer::new(
                Arc::clone(&backend),
                timeouts,
                in_flight,
                builder.observer.clone(),
            )
        });
        Ok(Self {
            inner: Arc::new(Inner {
                backend,
                coalescer,
                layout,
                clock: builder.clock,
                timeouts,
                mode,
                permit_ids: crate::permits::PermitIds::default(),
            }),
        })
    }

    /// How this store reaches Redis.
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// How this store names its keys.
    pub fn layout(&self) -> &KeyLayout {
        &self.inner.layout
    }

    /// The Redis key holding the state of `key` under `policy` (see [`KeyLayout`]).
    pub fn redis_key(&self, policy: &str, key: Key<'_>) -> Vec<u8> {
        self.inner.layout.redis_key(policy, key)
    }

    /// Sends `group`: at once, a call of its own, when coalescing is off or a call slot is
    /// free; else in the next coalesced call of its hash slot. The same encoding either way.
    pub(crate) async fn send(&self, group: Group) -> Result<Answer, Error> {
        let inner = &*self.inner;
        // The call slot this call holds until it is answered, when coalescing.
        let mut _held = None;
        if let Some(coalescer) = &inner.coalescer {
            let slot = self.coalescing_slot(group.first_key());
            match coalescer.slot(slot) {
                Some(held) => _held = Some(held),
                None => return coalescer.queued(slot, group).await,
            }
        }
        only(
            inner
                .backend
                .call(&Call::new(vec![&group]), inner.timeouts)
                .await?,
        )
    }

    /// The Redis key of the state of `key` under `policy`, built in place (see [`KeyLayout`]).
    pub(crate) fn state_key(&self, policy: &str, key: &[u8]) -> KeyBuf {
        self.inner.layout.key_buf(policy.as_bytes(), key)
    }

    /// Where permit ids come from.
    pub(crate) fn permit_ids(&self) -> &crate::permits::PermitIds {
        &self.inner.permit_ids
    }

    /// Where the scripts read the time: Redis' `TIME`, or the configured client clock now.
    pub(crate) fn time(&self) -> TimeSource {
        match &self.inner.clock {
            Some(clock) => TimeSource::Client(clock.now_us()),
            None => TimeSource::Server,
        }
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn decide(&self, request: &Request<'_>) -> Result<Decision, Error> {
        let key = self.state_key(request.policy(), request.key().as_bytes());
        let group = Group::single(&key, request.limit(), request.cost(), self.time())?;
        self.send(group).await?.decision()
    }

    async fn decide_all(&self, requests: &[Request<'_>]) -> Result<Vec<Decision>, Error> {
        validate_batch(requests)?;
        let mut buf = KeyBuf::new();
        let script_requests = self.script_requests(requests.iter(), &mut buf);
        if self.inner.mode == Mode::Cluster {
            let slot = hash_slot(script_requests[0].redis_key);
            if script_requests
                .iter()
                .any(|r| hash_slot(r.redis_key) != slot)
            {
                return self.decide_across_slots(&script_requests).await;
            }
        }
        let group = Group::batch(&script_requests, self.time(), Batch::Commit)?;
        self.send(group).await?.decisions()
    }

    /// One call, or in a Cluster one per hash slot (in the order the slots first appear;
    /// nothing to undo, every settle is applied). A call that fails fails the batch; calls
    /// before it stay applied.
    async fn settle_all(&self, settles: &[Settle<'_>]) -> Result<Vec<Decision>, Error> {
        validate_settles(settles)?;
        let requests = settles.iter().map(Settle::request);
        let mut buf = KeyBuf::new();
        let script_requests = self.script_requests(requests, &mut buf);
        let mut out = vec![None; settles.len()];
        for at in by_slot(&script_requests, |key| self.coalescing_slot(key)) {
            let group: Vec<ScriptRequest<'_>> = at.iter().map(|&i| script_requests[i]).collect();
            let reports: Vec<bool> = at.iter().map(|&i| settles[i].is_report()).collect();
            let answer = self
                .send(Group::settle(&group, &reports, self.time())?)
                .await?
                .decisions()?;
            place(&mut out, &at, answer);
        }
        answered(out)
    }
}

impl RedisStore {
    /// The script requests of `requests`, their Redis keys written one after the other in `buf`.
    fn script_requests<'b, 'r, 'a: 'r>(
        &self,
        requests: impl Iterator<Item = &'r Request<'a>> + Clone,
        buf: &'b mut KeyBuf,
    ) -> Vec<ScriptRequest<'b>> {
        let layout = &self.inner.layout;
        let len = requests
            .clone()
            .map(|r| layout.prefix().len() + r.key().len() + r.policy().len() + 8);
        buf.reserve(len.sum());
        let mut ends = Vec::new();
        for r in requests.clone() {
            layout.write(r.policy().as_bytes(), r.key().as_bytes(), buf);
            ends.push(buf.len());
        }
        let buf: &'b [u8] = buf;
        let mut start = 0;
        ends.into_iter()
            .zip(requests)
            .map(|(end, r)| {
                let key = &buf[start..end];
                start = end;
                ScriptRequest::new(key, *r.limit(), r.cost())
            })
            .collect()
    }

    /// Which calls may be coalesced with a call on `redis_key`: those on its hash slot in a
    /// Cluster (a script's keys must share one), any on one server.
    fn coalescing_slot(&self, redis_key: &[u8]) -> u16 {
        if self.inner.mode == Mode::Cluster {
            hash_slot(redis_key)
        } else {
            0
        }
    }

    /// A Cluster batch whose keys live in several slots (a global tier next to a key's tiers):
    /// one all-or-nothing call per slot, in the order the slots first appear in the batch;
    /// once a group denies, the groups before it are given their units back and the rest are
    /// only evaluated. See the crate documentation, "Batches across Cluster slots".
    async fn decide_across_slots(
        &self,
        requests: &[ScriptRequest<'_>],
    ) -> Result<Vec<Decision>, Error> {
        // Per slot: the positions of its requests in the batch, and the requests.
        let groups: Vec<(Vec<usize>, Vec<ScriptRequest<'_>>)> = by_slot(requests, hash_slot)
            .into_iter()
            .map(|at| (at.clone(), at.iter().map(|&i| requests[i]).collect()))
            .collect();
        // The groups charged (their index), and the time each was charged at.
        let mut charged: Vec<(usize, u64)> = Vec::new();
        let mut decisions: Vec<Option<Decision>> = vec![None; requests.len()];
        let mut denied = false;
        for (g, (at, group)) in groups.iter().enumerate() {
            let op = if denied {
                Batch::Evaluate
            } else {
                Batch::CommitTimed
            };
            let result = async {
                self.send(Group::batch(group, self.time(), op)?)
                    .await?
                    .charged()
            };
            match result.await {
                Ok((answers, when)) => {
                    match (op, when) {
                        (Batch::CommitTimed, Some(when)) => charged.push((g, when)),
                        (Batch::CommitTimed, None) => denied = true,
                        _ => {}
                    }
                    place(&mut decisions, at, answers);
                }
                Err(e) => {
                    // The request was not admitted: give back what earlier groups took.
                    self.refund(&groups, &charged).await;
                    return Err(e);
                }
            }
        }
        if denied {
            self.refund(&groups, &charged).await;
            // Nothing was charged in the end: a refunded group reports its states as they are now
            // (a peek), as a denied batch does everywhere. If that read fails, the charged
            // answers stand: the batch is denied either way.
            for &(g, _) in &charged {
                let (at, group) = &groups[g];
                let peeks = async {
                    let peek = Group::batch(group, self.time(), Batch::Evaluate)?;
                    self.send(peek).await?.decisions()
                };
                if let Ok(peeks) = peeks.await {
                    place(&mut decisions, at, peeks);
                }
            }
        }
        answered(decisions)
    }

    /// Gives back the units of the `charged` groups. A refund that fails leaves the units spent
    /// (an under-admission until they refill), never an over-admission.
    async fn refund(
        &self,
        groups: &[(Vec<usize>, Vec<ScriptRequest<'_>>)],
        charged: &[(usize, u64)],
    ) {
        for &(g, at) in charged {
            if let Ok(group) = Group::refund(&groups[g].1, at, self.time()) {
                let _ = self.send(group).await;
            }
        }
    }
}

/// Puts `answers` at the positions `at` of `decisions`.
fn place(decisions: &mut [Option<Decision>], at: &[usize], answers: Vec<Decision>) {
    for (&i, answer) in at.iter().zip(answers) {
        decisions[i] = Some(answer);
    }
}

/// Every decision of a batch decided in groups, or a protocol error if a group answered too few.
fn answered(decisions: Vec<Option<Decision>>) -> Result<Vec<Decision>, Error> {
    let all = decisions.into_iter().collect::<Option<Vec<_>>>();
    all.ok_or_else(|| protocol("a group answered fewer decisions than requests".to_owned()))
}

/// The positions of `requests` grouped by the slot `slot_of` gives their Redis keys, the groups
/// in the order their slots first appear.
fn by_slot(requests: &[ScriptRequest<'_>], slot_of: impl Fn(&[u8]) -> u16) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        let slot = slot_of(r.redis_key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}
