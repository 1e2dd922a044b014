//! The connections a [`RedisStore`](crate::RedisStore) sends its scripts over, per topology, with
//! timeouts, Cluster redirects, Sentinel failover, and the classification of their errors.
//!
//! # What is retried, and why
//!
//! A consuming script whose fate is unknown (its connection broke, or no answer came in time)
//! may have run, so it is never sent again: the caller gets a transient error. Only answers that
//! prove the script did not run lead to another attempt, within the same per-call deadline (which
//! ones, and why not `CLUSTERDOWN`: the crate documentation, "Failures"; `NOSCRIPT` is handled
//! once, by the call itself, in [`script`](crate::script)).
//!
//! redis-rs' own Cluster retries cannot make that distinction (redis 1.8.1,
//! `src/cluster_handling/async_connection/request.rs`, `choose_response`): it resends a request on
//! *every* error whose `RetryMethod` asks for it, and `RedisError::retry_method`
//! (`src/errors/redis_error.rs`) gives an I/O error `Reconnect` when the connection dropped (the
//! request is moved back to the pending queue and resent once the node is reconnected) and
//! `RetryImmediately` for any other I/O error, including the per-node response timeout, which
//! surfaces as an `io::ErrorKind::TimedOut` error (`src/aio/runtime.rs`). So a script that ran and
//! whose answer was lost, or came late, is run again, up to 16 times by default (`DEFAULT_RETRIES`,
//! `src/cluster_handling/client.rs`). Only a caller that stopped waiting ends it: a retry checks
//! whether anyone still awaits the answer, which is why the default setup (an overall timeout equal
//! to the per-node one) rarely resends, while a longer overall timeout does. Measured against the
//! test Cluster with writes paused on the masters for 1 s: a per-node timeout of 100 ms and an
//! overall one of 3 s ran an `INCR` script twice (the caller got "timed out" all the same); with
//! `retries(0)`, once. The server errors, by contrast, are mapped to redirects and waits
//! (`src/errors/server_error.rs`), and those replies prove the command did not run.
//!
//! There is no per-request switch, so the Cluster client is built with `retries(0)` (every error
//! comes back at once; the slot map is still refreshed on `MOVED`, because `choose_response`
//! returns `PollFlushAction::RebuildSlots` whether or not it retries, and requests wait for the
//! refresh, `poll_flush`, `src/cluster_handling/async_connection/mod.rs`), a per-node response
//! timeout equal to the per-call one and no overall timeout (each call has its own deadline here),
//! and the redirects above are followed here. `ASK` is followed the way redis-rs does it
//! (`get_redirected_connection`, same file): `ASKING` then the script, on the named node, in one
//! pipeline.
//!
//! The standalone `ConnectionManager` never resends a command: it returns the error and reconnects
//! in the background (`src/aio/connection_manager.rs`); its reconnection itself is not retried here
//! (`number_of_retries = 0`), so during an outage every call fails fast with a refused connection
//! instead of waiting out a backoff. A failed reconnection stays the manager's answer until a call
//! finds it: that call gets the stored refusal while the manager starts connecting anew
//! (`reconnect_if_io_error`). So a call answered with a refused connection, which proves nothing
//! was sent, is run once more on the same manager, which waits for the new connection: the first
//! call after a restart (a breaker's probe) runs on a live connection instead of failing on the
//! memory of the outage.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use deadpool::managed::{PoolError, RecycleError};
use distlimit_core::{Error, NotSent};
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo,
    Pipeline, RedisError, RedisFuture, ServerErrorKind, TlsMode, Value,
};
use tokio::time::Instant;

use crate::NotDurable;
use crate::config::{Certs, NodeAuth, STORE, config_error, redact_url};
use crate::durable::Durable;
use crate::script::{self, Answer, Call};

/// The most attempts one call makes in a Cluster (redirects and waits), within its deadline.
const MAX_CLUSTER_ATTEMPTS: u32 = 16;

/// The first wait after `TRYAGAIN`, `LOADING` and the like; doubled per attempt.
const CLUSTER_RETRY_WAIT: Duration = Duration::from_millis(5);

/// What a call answers: per group its answer or its own error.
pub(crate) type Answers = Vec<Result<Answer, Error>>;

/// The connections of one store.
pub(crate) enum Backend {
    /// One multiplexed connection that reconnects by itself.
    Manager(ConnectionManager),
    /// A `deadpool` pool of multiplexed connections, each with one call in flight.
    Pool(Pool),
    /// The primary a set of sentinels names, re-resolved after a failure.
    Sentinel(Arc<SentinelBackend>),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

/// Timeouts of one store.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
    /// Durable decisions: `WAIT` after each call that may write.
    pub(crate) durable: Option<Durable>,
}

impl Backend {
    /// Runs `call` within the response timeout.
    ///
    /// The large futures of rare paths (deadpool's checkout, 6.4 KiB; a sentinel lookup) are
    /// boxed where they start: in this future they made it 13 KiB, which every decision of every
    /// mode copied into its own boxed future (14 000 of a Redis-backed server's 91 000
    /// instructions per decision).
    pub(crate) async fn call(&self, call: &Call<'_>, timeouts: Timeouts) -> Result<Answers, Error> {
        let after = timeouts.response;
        match self {
            Backend::Manager(manager) => {
                within(after, async {
                    let mut conn = manager.clone();
                    match call.run(&mut conn, timeouts.durable).await {
                        // Nothing was sent: once more, on the new connection (module docs).
                        Err(e) if refused(&e) => call.run(&mut conn, timeouts.durable).await,
                        result => result,
                    }
                })
                .await
            }
            Backend::Pool(pool) => {
                within(after, async {
                    let mut pooled = Box::pin(pool.get())
                        .await
                        .map_err(|e| not_sent_if_transient(pool_error(e, after)))?;
                    // Broken until the call completes (see `PoolManager`).
                    pooled.broken = true;
                    let result = call.run(&mut pooled.conn, timeouts.durable).await;
                    pooled.broken = matches!(&result, Err(e) if breaks_connection(e));
                    if matches!(&result, Err(e) if lost_connection(e)) {
                        // The server went away: so are the connections opened before this one.
                        pool.manager().lost(pooled.epoch);
                    }
                    result
                })
                .await
            }
            Backend::Sentinel(sentinel) => sentinel.call(call, timeouts).await,
            Backend::Cluster(cluster) => cluster_call(cluster, call, timeouts).await,
        }
    }

    /// Connects to `url` (one server), through a `ConnectionManager` or a pool of `pool_size`.
    pub(crate) async fn standalone(
        url: &str,
        auth: &NodeAuth,
        pool_size: Option<usize>,
        timeouts: Timeouts,
    ) -> Result<Backend, Error> {
        let info = connection_info(url, auth)?;
        let after = timeouts.connect;
        let client = redis::Client::open(info).map_err(|e| classify(e, after))?;
        let backend = match pool_size {
            None => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeouts.connect))
                    .set_response_timeout(None)
                    .set_number_of_retries(0);
                let manager = within(after, async {
                    ConnectionManager::new_with_config(client, config)
                        .await
                        .map_err(|e| classify(e, after))
                })
                .await?;
                Backend::Manager(manager)
            }
            Some(max_size) => {
                let manager = PoolManager {
                    client,
                    config: node_config(timeouts),
                    epoch: AtomicU64::new(0),
                };
                let pool = Pool::builder(manager)
                    .max_size(max_size)
                    .runtime(deadpool::Runtime::Tokio1)
                    .create_timeout(Some(timeouts.connect))
                    .build()
                    .map_err(|e| config_error(format!("cannot build the connection pool: {e}")))?;
                // Connect once now, so a wrong address or password fails here.
                within(after, async {
                    pool.get().await.map(drop).map_err(|e| pool_error(e, after))
                })
                .await?;
                Backend::Pool(pool)
            }
        };
        backend.preload(timeouts).await?;
        Ok(backend)
    }

    /// Resolves the primary of `service` through `sentinels` and connects to it.
    pub(crate) async fn sentinel(
        sentinels: &[String],
        service: &str,
        auth: &NodeAuth,
        timeouts: Timeouts,
    ) -> Result<Backend, Error> {
        let after = timeouts.connect;
        if sentinels.is_empty() {
            return Err(config_error("no sentinel URLs"));
        }
        if auth.certs.is_some() {
            return Err(config_error(
                "custom TLS certificates are not supported with Sentinel yet",
            ));
        }
        let infos = sentinels
            .iter()
            .map(|u| connection_info(u, &NodeAuth::default()))
            .collect::<Result<Vec<_>, Error>>()?;
        // The primary speaks TLS when the sentinels do.
        let tls = infos.iter().find_map(|i| match i.addr() {
            ConnectionAddr::TcpTls { insecure, .. } => Some(if *insecure {
                TlsMode::Insecure
            } else {
                TlsMode::Secure
            }),
            _ => None,
        });
        let redis_info = with_auth(redis::RedisConnectionInfo::default(), auth);
        let mut node = SentinelNodeConnectionInfo::default().set_redis_connection_info(redis_info);
        if let Some(tls) = tls {
            node = node.set_tls_mode(tls);
        }
        // `SentinelClient::build` takes a `String` without redis' TLS feature, a `&str` with it.
        let service_name = String::from(service);
        let client = SentinelClient::build(
            infos.clone(),
            service_name,
            Some(node),
            SentinelServerType::Master,
        )
        .map_err(|e| classify(e, after))?;
        let sentinel = Arc::new(SentinelBackend {
            resolver: tokio::sync::Mutex::new(Resolver { client, last: None }),
            current: Mutex::new(None),
            config: node_config(timeouts),
        });
        within(after, sentinel.connection())
            .await
            .map_err(|e| unknown_service(e, service))?;
        tokio::spawn(watch_primary(
            Arc::downgrade(&sentinel),
            infos,
            service.to_owned(),
            timeouts,
        ));
        let backend = Backend::Sentinel(sentinel);
        backend.preload(timeouts).await?;
        Ok(backend)
    }

    /// Connects to a Cluster through `nodes` (some of its nodes; the others are discovered).
    pub(crate) async fn cluster(
        nodes: &[String],
        auth: &NodeAuth,
        timeouts: Timeouts,
    ) -> Result<Backend, Error> {
        let after = timeouts.connect;
        if nodes.is_empty() {
            return Err(config_error("no cluster node URLs"));
        }
        if auth.db.is_some_and(|db| db != 0) {
            return Err(config_error("a Redis Cluster has only database 0"));
        }
        let infos = nodes
            .iter()
            .map(|u| connection_info(u, auth))
            .collect::<Result<Vec<_>, Error>>()?;
        // The credentials are the nodes' (`connection_info` gave each `auth`'s).
        let builder = ClusterClientBuilder::new(infos)
            // Every error comes back to `cluster_call`, which retries only what did not run.
            .retries(0)
            .connection_timeout(timeouts.connect)
            .response_timeout(timeouts.response)
            .overall_response_timeout(None);
        #[cfg(feature = "tls")]
        let builder = match &auth.certs {
            Some(certs) => builder.certs(tls_certificates(certs)),
            None => builder,
        };
        let client = builder.build().map_err(|e| classify(e, after))?;
        let conn = within(after, async {
            client
                .get_async_connection()
                .await
                .map_err(|e| classify(e, after))
        })
        .await?;
        Ok(Backend::Cluster(conn))
    }

    /// Loads the scripts once, so the first decisions need no `EVAL`; this also checks the
    /// credentials (`NOAUTH`, `WRONGPASS`). A user whom an ACL forbids `SCRIPT LOAD` still
    /// connects (the scripts then load through `EVAL`, or the decisions say `NOPERM`). Not in a
    /// Cluster, where `SCRIPT LOAD` reaches one node only and connecting checked the credentials.
    async fn preload(&self, timeouts: Timeouts) -> Result<(), Error> {
        let after = timeouts.connect;
        let result = match self {
            Backend::Manager(manager) => {
                let mut conn = manager.clone();
                within(after, script::load_scripts(&mut conn)).await
            }
            Backend::Pool(pool) => {
                within(after, async {
                    let mut pooled = pool.get().await.map_err(|e| pool_error(e, after))?;
                    pooled.broken = true;
                    let result = script::load_scripts(&mut pooled.conn).await;
                    pooled.broken = matches!(&result, Err(e) if breaks_connection(e));
                    result
                })
                .await
            }
            Backend::Sentinel(sentinel) => {
                within(after, async {
                    let mut conn = sentinel.connection().await?.conn;
                    script::load_scripts(&mut conn).await
                })
                .await
            }
            Backend::Cluster(_) => Ok(()),
        };
        match result {
            // NOPERM: the ACL forbids `SCRIPT LOAD` (or the scripts): decisions will tell.
            Err(Error::Config { message, .. }) if message.contains("NOPERM") => Ok(()),
            other => other,
        }
    }
}

/// At connect time, sentinels that know no primary by that name mean a wrong service name (at
/// run time the same answer may be a passing state, so it stays transient there).
fn unknown_service(err: Error, service: &str) -> Error {
    let unknown = matches!(&err, Error::Unavailable { .. })
        && redis_source(&err).is_some_and(|e| e.kind() == ErrorKind::MasterNameNotFoundBySentinel);
    if unknown {
        config_error(format!(
            "the sentinels know no primary named \"{}\"",
            service.escape_default()
        ))
    } else {
        err
    }
}

/// The configuration of one connection to a server holding state: connect timeout only, since
/// every call has its own deadline.
fn node_config(timeouts: Timeouts) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeouts.connect))
        .set_response_timeout(None)
}

/// Parses `url`, applies the overrides in `auth`, and readies TLS if it asks for it.
fn connection_info(url: &str, auth: &NodeAuth) -> Result<ConnectionInfo, Error> {
    let info = url.into_connection_info().map_err(|e| {
        config_error(format!(
            "invalid Redis URL \"{}\": {e}",
            redact_url(url).escape_default()
        ))
    })?;
    let redis = with_auth(info.redis_settings().clone(), auth);
    let tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
    if tls {
        install_crypto_provider();
    }
    let info = info.set_redis_settings(redis);
    match &auth.certs {
        None => Ok(info),
        Some(_) if !tls => Err(config_error(
            "TLS certificates are configured, but the URL is not rediss://",
        )),
        Some(certs) => with_certificates(info, certs),
    }
}

/// `redis` with the user, password and database `auth` sets.
fn with_auth(mut redis: redis::RedisConnectionInfo, auth: &NodeAuth) -> redis::RedisConnectionInfo {
    if let Some(user) = &auth.username {
        redis = redis.set_username(user);
    }
    if let Some(password) = &auth.password {
        redis = redis.set_password(password);
    }
    if let Some(db) = auth.db {
        redis = redis.set_db(db);
    }
    redis
}

/// `info` with the certificates in `certs`, checked (parsed) now.
#[cfg(feature = "tls")]
fn with_certificates(info: ConnectionInfo, certs: &Certs) -> Result<ConnectionInfo, Error> {
    let client = redis::Client::build_with_tls(info, tls_certificates(certs))
        .map_err(|e| config_error(format!("invalid TLS certificates: {e}")))?;
    Ok(client.get_connection_info().clone())
}

#[cfg(not(feature = "tls"))]
fn with_certificates(_: ConnectionInfo, _: &Certs) -> Result<ConnectionInfo, Error> {
    Err(config_error("TLS needs the `tls` feature"))
}

#[cfg(feature = "tls")]
fn tls_certificates(certs: &Certs) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: certs
            .client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: certs.root.clone(),
    }
}

/// rustls needs a process-wide crypto provider; install ring's unless the application installed
/// one already.
fn install_crypto_provider() {
    #[cfg(feature = "tls")]
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: any provider will do.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Runs `future` within `after`; running out is an [`Error::Timeout`].
async fn within<T>(
    after: Duration,
    future: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(after, future).await {
        Ok(result) => result.map_err(|e| refine(e, after)),
        Err(_) => Err(timeout(after)),
    }
}

/// The [`Error::Timeout`] of a call that ran out of `after`.
pub(crate) fn timeout(after: Duration) -> Error {
    Error::Timeout {
        store: STORE,
        after,
    }
}

fn pool_error(err: PoolError<RedisError>, after: Duration) -> Error {
    match err {
        PoolError::Backend(e) => classify(e, after),
        PoolError::Timeout(_) => timeout(after),
        PoolError::Closed => Error::Unavailable {
            store: STORE,
            source: "the connection pool is closed".into(),
        },
        other => Error::Backend {
            store: STORE,
            transient: false,
            source: other.to_string().into(),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Pool

pub(crate) type Pool = deadpool::managed::Pool<PoolManager>;

/// Opens the pool's connections, and takes them back without asking the server (no `UNWATCH` +
/// `PING` per checkout as `deadpool-redis`' manager; what that means: the crate documentation,
/// "Connection modes"). A connection is handed out again unless a call on it ended in a way that
/// leaves it in doubt ([`breaks_connection`], or cut short by the deadline). A call that lost its
/// connection also retires every connection opened before it: each carries the epoch it was
/// opened in, a lost connection moves the epoch past its own, and recycling drops older ones.
pub(crate) struct PoolManager {
    client: redis::Client,
    config: AsyncConnectionConfig,
    /// Connections opened in an earlier epoch are replaced at their next checkout.
    epoch: AtomicU64,
}

impl PoolManager {
    /// A connection of `epoch` lost its connection: retire it and every older one.
    fn lost(&self, epoch: u64) {
        self.epoch.fetch_max(epoch + 1, Ordering::Relaxed);
    }
}

/// One pooled connection.
pub(crate) struct Pooled {
    conn: MultiplexedConnection,
    /// A call on it failed with a connection error or did not complete: replace it.
    broken: bool,
    /// The manager's epoch when it was opened.
    epoch: u64,
}

impl deadpool::managed::Manager for PoolManager {
    type Type = Pooled;
    type Error = RedisError;

    async fn create(&self) -> Result<Pooled, RedisError> {
        let epoch = self.epoch.load(Ordering::Relaxed);
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        Ok(Pooled {
            conn,
            broken: false,
            epoch,
        })
    }

    async fn recycle(
        &self,
        pooled: &mut Pooled,
        _: &deadpool::managed::Metrics,
    ) -> deadpool::managed::RecycleResult<RedisError> {
        if pooled.broken {
            Err(RecycleError::message("the connection broke during a call"))
        } else if pooled.epoch < self.epoch.load(Ordering::Relaxed) {
            Err(RecycleError::message(
                "another connection to the server was lost since this one was opened",
            ))
        } else {
            Ok(())
        }
    }
}

/// Whether a call that failed with `err` leaves its connection in doubt: no answer in time, or
/// an I/O error (the connection dropped, or the client cannot tell what the server got). A
/// server's error reply (`BUSY`, `LOADING`, `NOSCRIPT`, …) came over a working connection.
fn breaks_connection(err: &Error) -> bool {
    matches!(err, Error::Timeout { .. })
        || redis_source(err).is_some_and(|e| {
            e.is_io_error()
                || e.is_timeout()
                || e.is_connection_dropped()
                || e.is_unrecoverable_error()
        })
}

/// The Redis error behind a transient `err`, if any (marked [`NotSent`] or not).
fn redis_source(err: &Error) -> Option<&RedisError> {
    let (Error::Unavailable { source, .. } | Error::Backend { source, .. }) = err else {
        return None;
    };
    match source.downcast_ref::<NotSent>() {
        Some(NotSent(inner)) => inner.downcast_ref::<RedisError>(),
        None => source.downcast_ref::<RedisError>(),
    }
}

/// A failure to get a connection, before the script was sent: marked [`NotSent`] unless it is
/// permanent (a bad password stays a configuration error).
fn not_sent_if_transient(err: Error) -> Error {
    if err.is_transient() {
        not_sent(err)
    } else {
        err
    }
}

/// [`not_sent_if_transient`] of a Redis error met while connecting.
fn before_sending(err: RedisError) -> Error {
    not_sent_if_transient(script::map_error(err, &[]))
}

/// `err` marked as never sent ([`Error::is_not_sent`]): an [`Error::Unavailable`] whose source is
/// [`NotSent`]. A [`Error::Backend`] becomes such an `Unavailable` (transient): callers mark only
/// errors that prove no server took the request.
fn not_sent(err: Error) -> Error {
    match err {
        Error::Unavailable { store, source } if !source.is::<NotSent>() => Error::Unavailable {
            store,
            source: Box::new(NotSent(source)),
        },
        Error::Backend { store, source, .. } => Error::Unavailable {
            store,
            source: Box::new(NotSent(source)),
        },
        other => other,
    }
}

/// Whether `err` is a refused connection: nothing was sent.
fn refused(err: &Error) -> bool {
    redis_source(err).is_some_and(RedisError::is_connection_refusal)
}

/// Whether `err` says the connection itself is gone (closed by the server, reset, a broken
/// pipe), as opposed to a slow answer or an error reply.
fn lost_connection(err: &Error) -> bool {
    redis_source(err).is_some_and(|e| {
        e.is_connection_dropped()
            || (e.is_io_error() && !e.is_timeout())
            || e.is_unrecoverable_error()
    })
}

/// Maps a Redis error to a distlimit [`Error`]: [`script`]'s mapping, refined.
pub(crate) fn classify(err: RedisError, after: Duration) -> Error {
    refine(script::map_error(err, &[]), after)
}

/// Completes [`script`]'s classification (which covers what a script's reply can say) with what
/// connecting can say:
///
/// * an I/O timeout → [`Error::Timeout`];
/// * `NOAUTH`, `WRONGPASS`, a failed authentication → [`Error::Config`], and so are
///   `unknown command` replies to the scripting commands (scripting renamed away or disabled),
///   a TLS handshake refused over certificates, and an empty sentinel list;
/// * a refused connection, or sentinels that know no primary for the service →
///   [`Error::Unavailable`] marked [`NotSent`] (nothing was sent: [`Error::is_not_sent`]);
/// * a missing Cluster connection → [`Error::Unavailable`] (during a failover this passes).
pub(crate) fn refine(err: Error, after: Duration) -> Error {
    let Some(e) = redis_source(&err) else {
        return err;
    };
    if e.is_timeout() {
        return timeout(after);
    }
    let config = |what: &str| config_error(format!("{what}: {e}"));
    // A TLS handshake that failed over certificates fails the same way every time. rustls'
    // error travels inside an `io::Error` behind an `Arc`; its text is what is left to read.
    let text = e.to_string();
    if [
        "invalid peer certificate",
        "peer sent no certificates",
        "received fatal alert",
    ]
    .iter()
    .any(|m| text.contains(m))
    {
        return config("TLS handshake failed");
    }
    match e.code() {
        Some("NOAUTH" | "WRONGPASS") => return config("authentication failed"),
        Some("ERR")
            if e.detail().is_some_and(|d| {
                let d = d.to_ascii_lowercase();
                d.contains("unknown command")
                    && (d.contains("eval") || d.contains("script") || d.contains("function"))
            }) =>
        {
            return config("the server does not run Lua scripts");
        }
        _ => {}
    }
    if e.is_connection_refusal() {
        return not_sent(err);
    }
    match e.kind() {
        ErrorKind::AuthenticationFailed => config("authentication failed"),
        ErrorKind::InvalidClientConfig | ErrorKind::EmptySentinelList => {
            config("invalid configuration")
        }
        ErrorKind::MasterNameNotFoundBySentinel | ErrorKind::NoValidReplicasFoundBySentinel => {
            not_sent(err)
        }
        ErrorKind::ClusterConnectionNotFound => match err {
            Error::Unavailable { .. } => err,
            Error::Backend { store, source, .. } => Error::Unavailable { store, source },
            other => other,
        },
        _ => err,
    }
}

// ---------------------------------------------------------------------------------------------
// Cluster

/// What an error proves about the attempt, and how to follow up.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// The script did not run: send it again (the slot map is being refreshed).
    Again,
    /// The slot is being migrated: send it to this node, after `ASKING`.
    Ask { host: String, port: u16 },
    /// The script did not run, but the cluster needs a moment.
    Wait,
}

/// Whether `err` proves the script did not run, and what to do next; `None` when it may have
/// run, or will fail the same way again.
fn did_not_run(err: &Error) -> Option<Next> {
    let e = redis_source(err)?;
    match e.kind() {
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::ReadOnly) => Some(Next::Again),
        ErrorKind::Server(ServerErrorKind::Ask) => {
            let (addr, _slot) = e.redirect_node()?;
            let (host, port) = addr.rsplit_once(':')?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            Some(Next::Ask {
                host: host.to_owned(),
                port: port.parse().ok()?,
            })
        }
        // A slot lost its primary (a crash): the Cluster serves nothing until a replica is
        // promoted, which takes far longer than a call's deadline, so the call fails at once.
        ErrorKind::Server(ServerErrorKind::ClusterDown) => None,
        ErrorKind::Server(
            ServerErrorKind::TryAgain | ServerErrorKind::MasterDown | ServerErrorKind::BusyLoading,
        )
        | ErrorKind::ClusterConnectionNotFound => Some(Next::Wait),
        _ if e.is_connection_refusal() => Some(Next::Wait),
        _ => None,
    }
}

/// Runs `call` on the Cluster, following redirects and waits that prove the script did not run,
/// within `after` in all.
///
/// With durable decisions the script and `WAIT` go as one pipeline, which redis-rs routes by its
/// one keyed command (`route_for_pipeline`: `WAIT` names no slot): to the slot's primary, on
/// one connection, so `WAIT` counts that primary's replicas holding the write.
async fn cluster_call(
    cluster: &ClusterConnection,
    call: &Call<'_>,
    timeouts: Timeouts,
) -> Result<Answers, Error> {
    let after = timeouts.response;
    let deadline = Instant::now() + after;
    let mut conn = cluster.clone();
    let mut ask: Option<SingleNodeRoutingInfo> = None;
    let mut wait = CLUSTER_RETRY_WAIT;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = match ask.take() {
            None => tokio::time::timeout_at(deadline, call.run(&mut conn, timeouts.durable)).await,
            Some(node) => {
                let mut asking = Asking {
                    conn: &mut conn,
                    node,
                };
                tokio::time::timeout_at(deadline, call.run(&mut asking, timeouts.durable)).await
            }
        };
        let err = match result {
            Err(_) => return Err(timeout(after)),
            Ok(Ok(output)) => return Ok(output),
            Ok(Err(err)) => err,
        };
        let next = match did_not_run(&err) {
            Some(next) if attempt < MAX_CLUSTER_ATTEMPTS => next,
            _ => return Err(refine(err, after)),
        };
        match next {
            Next::Again => {}
            Next::Ask { host, port } => ask = Some(SingleNodeRoutingInfo::ByAddress { host, port }),
            Next::Wait => {
                if Instant::now() + wait >= deadline {
                    return Err(refine(err, after));
                }
                tokio::time::sleep(wait).await;
                wait = wait.saturating_mul(2);
            }
        }
    }
}

/// A Cluster connection that sends each command to one node, preceded by `ASKING`: how a
/// command follows an `ASK` redirect during a slot migration.
struct Asking<'a> {
    conn: &'a mut ClusterConnection,
    node: SingleNodeRoutingInfo,
}

impl ConnectionLike for Asking<'_> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut pipeline = Pipeline::with_capacity(1);
            pipeline.add_command(cmd.clone());
            let mut replies = self.req_packed_commands(&pipeline, 0, 1).await?;
            match (replies.pop(), replies.is_empty()) {
                (Some(reply), true) => Ok(reply),
                _ => Err(RedisError::from((
                    ErrorKind::Parse,
                    "expected one reply after ASKING",
                ))),
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let mut with_asking = Pipeline::with_capacity(pipeline.len() + 1);
        with_asking.cmd("ASKING");
        for cmd in pipeline.cmd_iter() {
            with_asking.add_command(cmd.clone());
        }
        let node = self.node.clone();
        Box::pin(async move {
            self.conn
                .route_pipeline(with_asking, offset + 1, count, node)
                .await
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

// ---------------------------------------------------------------------------------------------
// Sentinel

/// The least time between two lookups of the primary through the sentinels (each asks every
/// sentinel `SENTINEL MASTERS` and the primary it names `ROLE`), so a dead primary does not turn
/// every failing call into a lookup. Short, because the first lookup after a promotion is what
/// follows it.
const LOOKUP_INTERVAL: Duration = Duration::from_millis(50);

/// The primary the sentinels name, connected; re-resolved after a transient failure, one lookup
/// at a time and at most one per [`LOOKUP_INTERVAL`] (the crate documentation, "Connection
/// modes").
pub(crate) struct SentinelBackend {
    /// Asks the sentinels; one resolution at a time.
    resolver: tokio::sync::Mutex<Resolver>,
    /// The connection to the primary, unless a failure invalidated it.
    current: Mutex<Option<Current>>,
    config: AsyncConnectionConfig,
}

#[derive(Clone)]
struct Current {
    /// Which connection this is, so a failure invalidates only the connection it happened on.
    id: u64,
    conn: MultiplexedConnection,
    /// The primary's address, as the sentinels named it.
    addr: (String, u16),
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// The sentinels' client and what its last lookup came to.
struct Resolver {
    client: SentinelClient,
    /// When the last resolution ended, and its error if it failed.
    last: Option<(Instant, Option<RedisError>)>,
}

impl SentinelBackend {
    fn current(&self) -> Option<Current> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The connection to the primary, resolving it through the sentinels if there is none.
    async fn connection(&self) -> Result<Current, Error> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        // Single flight: callers arriving during a resolution wait for it here.
        let mut resolver = self.resolver.lock().await;
        // Another call may have resolved it while this one waited.
        if let Some(current) = self.current() {
            return Ok(current);
        }
        if let Some((at, last)) = &resolver.last {
            let next = *at + LOOKUP_INTERVAL;
            match last {
                // The sentinels were just asked and the primary could not be reached: fail with
                // that error (the same classification: a refused connection sent nothing).
                Some(e) if Instant::now() < next => return Err(before_sending(e.clone())),
                // A connection made moments ago already failed: wait out the interval.
                None => tokio::time::sleep_until(next).await,
                Some(_) => {}
            }
        }
        // Boxed: a lookup's future is large, and `call` holds this one on every decision.
        let result = Box::pin(self.resolve(&mut resolver.client)).await;
        resolver.last = Some((Instant::now(), result.as_ref().err().cloned()));
        let current = result.map_err(before_sending)?;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(current.clone());
        Ok(current)
    }

    /// Asks the sentinels for the primary and connects to it.
    async fn resolve(&self, client: &mut SentinelClient) -> Result<Current, RedisError> {
        let client = client.async_get_client().await?;
        let addr = match client.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                (host.clone(), *port)
            }
            _ => (String::new(), 0),
        };
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        Ok(Current {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            conn,
            addr,
        })
    }

    /// Forgets the connection if `stale` says so, so the next call asks the sentinels again.
    fn forget_if(&self, stale: impl FnOnce(&Current) -> bool) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(stale) {
            *current = None;
        }
    }

    async fn call(&self, call: &Call<'_>, timeouts: Timeouts) -> Result<Answers, Error> {
        let mut used = None;
        let result = within(timeouts.response, async {
            let Current { id, mut conn, .. } = self.connection().await?;
            used = Some(id);
            call.run(&mut conn, timeouts.durable).await
        })
        .await;
        // A timeout, a lost connection, `READONLY` from a demoted primary (for the whole call,
        // or for a group of a coalesced one): the next call asks the sentinels where the
        // primary is now.
        // Not for too few replicas acknowledging (durable decisions): the primary answered.
        let moved = |e: &Error| e.is_transient() && NotDurable::of(e).is_none();
        let transient = match &result {
            Err(e) => moved(e),
            Ok(answers) => answers.iter().any(|a| matches!(a, Err(e) if moved(e))),
        };
        if let (true, Some(id)) = (transient, used) {
            self.forget_if(|c| c.id == id);
        }
        result
    }
}

/// How often the sentinels are asked which server is the primary.
const SENTINEL_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Asks the sentinels every [`SENTINEL_POLL_INTERVAL`] which server is the primary, and drops
/// the connection to any other, until the store is dropped.
///
/// Errors alone are not enough to follow a failover: after `SENTINEL FAILOVER`, the old primary
/// went on accepting writes for about ten seconds here, until the sentinels reconfigured it as a
/// replica, while the new one was already promoted. Instances still writing to the old primary
/// would count apart from those on the new one, and their writes would be lost. Polling bounds
/// that window to about a second.
async fn watch_primary(
    backend: Weak<SentinelBackend>,
    sentinels: Vec<ConnectionInfo>,
    service: String,
    timeouts: Timeouts,
) {
    let mut conn: Option<MultiplexedConnection> = None;
    let mut next = 0;
    loop {
        tokio::time::sleep(SENTINEL_POLL_INTERVAL).await;
        let Some(backend) = backend.upgrade() else {
            return;
        };
        if conn.is_none() {
            let info = sentinels[next % sentinels.len()].clone();
            next += 1;
            let connect = async {
                redis::Client::open(info)?
                    .get_multiplexed_async_connection_with_config(&node_config(timeouts))
                    .await
            };
            conn = tokio::time::timeout(timeouts.connect, connect)
                .await
                .ok()
                .and_then(Result::ok);
        }
        let Some(c) = conn.as_mut() else {
            continue;
        };
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("get-master-addr-by-name").arg(&service);
        let ask = cmd.query_async::<Option<(String, u16)>>(c);
        match tokio::time::timeout(timeouts.connect, ask).await {
            Ok(Ok(Some(primary))) => backend.forget_if(|c| c.addr != primary),
            // No answer: ask another sentinel next time.
            _ => conn = None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of what `make` returns, without calling it.
    fn output_size<A, R>(_make: impl FnOnce(A) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    #[test]
    fn a_call_future_stays_small() {
        // See `Backend::call`: every decision moves this future into a box.
        let timeouts = Timeouts {
            connect: Duration::from_secs(1),
            response: Duration::from_secs(1),
            durable: None,
        };
        let size = output_size(
            |(backend, call): (&'static Backend, &'static Call<'static>)| {
                backend.call(call, timeouts)
            },
        );
        assert!(size <= 4096, "Backend::call's future is {size} bytes");
    }

    fn parsed(text: &str) -> Error {
        // A server error as the client parses it from the wire.
        let value = redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap();
        let e = value.extract_error().unwrap_err();
        script::map_error(e, &[])
    }

    #[test]
    fn redirects_and_waits_did_not_run() {
        let ask = Next::Ask {
            host: "127.0.0.1".into(),
            port: 6381,
        };
        for (reply, next) in [
            ("MOVED 3999 127.0.0.1:6381", Some(Next::Again)),
            ("ASK 3999 127.0.0.1:6381", Some(ask)),
            ("CLUSTERDOWN The cluster is down", None),
            ("TRYAGAIN rehashing a slot", Some(Next::Wait)),
            ("MASTERDOWN Link with MASTER is down", Some(Next::Wait)),
            ("LOADING loading the dataset", Some(Next::Wait)),
            ("READONLY a read only replica", Some(Next::Again)),
        ] {
            assert_eq!(did_not_run(&parsed(reply)), next, "{reply}");
        }
    }

    #[test]
    fn only_errors_proving_nothing_was_sent_are_not_sent_or_retried() {
        let after = Duration::from_secs(1);
        let refusal = classify(
            RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
            after,
        );
        assert!(
            refusal.is_not_sent() && refusal.is_transient(),
            "{refusal:?}"
        );
        // Refined again (a deadline wraps a call that refines), it is marked once and still
        // followed as a refusal.
        let refusal = refine(refusal, after);
        assert!(refusal.is_not_sent(), "{refusal:?}");
        assert_eq!(
            refusal.to_string().matches("not sent").count(),
            1,
            "{refusal}"
        );
        assert!(refused(&refusal));
        assert_eq!(did_not_run(&refusal), Some(Next::Wait));
        let no_primary = classify(
            RedisError::from((ErrorKind::MasterNameNotFoundBySentinel, "no master")),
            after,
        );
        assert!(no_primary.is_not_sent(), "{no_primary:?}");
        assert!(matches!(
            unknown_service(no_primary, "svc"),
            Error::Config { .. }
        ));
        // Failing to connect sent nothing, whatever the I/O error; bad credentials stay what
        // they are.
        let reset = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(before_sending(reset).is_not_sent());
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "bad password"));
        assert!(matches!(before_sending(auth), Error::Config { .. }));
        // The script may have run (a lost connection, a timeout): not marked, not retried,
        // transient.
        for kind in [
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::UnexpectedEof,
            std::io::ErrorKind::TimedOut,
        ] {
            let e = script::map_error(RedisError::from(std::io::Error::from(kind)), &[]);
            assert_eq!(did_not_run(&e), None, "{kind:?}");
            let e = refine(e, after);
            assert!(!e.is_not_sent() && e.is_transient(), "{kind:?}: {e:?}");
        }
        assert_eq!(did_not_run(&parsed("BUSY script running")), None);
        assert_eq!(did_not_run(&parsed("DISTLIMIT_CORRUPT x")), None);
        assert_eq!(did_not_run(&timeout(Duration::from_millis(1))), None);
        // A reply came: the command was sent (even when it proves the script did not run).
        for reply in [
            "READONLY You can't write against a read only replica.",
            "MOVED 3999 127.0.0.1:6381",
            "BUSY script running",
        ] {
            let e = refine(parsed(reply), after);
            assert!(!e.is_not_sent(), "{reply}: {e:?}");
        }
    }

    #[test]
    fn errors_are_classified() {
        let timed_out = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        let no_primary = RedisError::from((ErrorKind::MasterNameNotFoundBySentinel, "no master"));
        let bad_config = RedisError::from((ErrorKind::InvalidClientConfig, "bad"));
        for (e, want) in [
            (script::map_error(timed_out, &[]), "timeout"),
            (script::map_error(no_primary, &[]), "unavailable"),
            (script::map_error(bad_config, &[]), "config"),
            (parsed("LOADING loading the dataset"), "unavailable"),
            (parsed("MASTERDOWN Link with MASTER is down"), "unavailable"),
            (parsed("CLUSTERDOWN The cluster is down"), "unavailable"),
            (parsed("TRYAGAIN rehashing a slot"), "unavailable"),
            (parsed("READONLY a read only replica"), "unavailable"),
            (parsed("ERR other"), "permanent"),
        ] {
            let e = refine(e, Duration::from_millis(200));
            let got = match &e {
                Error::Timeout { .. } => "timeout",
                Error::Unavailable { .. } => "unavailable",
                Error::Config { .. } => "config",
                Error::Backend {
                    transient: false, ..
                } => "permanent",
                _ => "other",
            };
            assert_eq!(got, want, "{e:?}");
        }
    }

    #[test]
    fn invalid_urls_are_config_errors() {
        for url in ["redis://", "nonsense"] {
            assert!(
                matches!(
                    connection_info(url, &NodeAuth::default()),
                    Err(Error::Config { .. })
                ),
                "{url}"
            );
        }
        let e = connection_info("redis://user:hunter2@:x", &NodeAuth::default());
        assert!(!format!("{e:?}").contains("hunter2"), "{e:?}");
    }
}
