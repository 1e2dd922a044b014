//! [`RedisStoreBuilder`]: how a [`RedisStore`](crate::RedisStore) connects, from a URL or a builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use distlimit_core::{Clock, Error};

use crate::RedisObserver;
use crate::durable::Durable;
use crate::layout::{DEFAULT_PREFIX, KeyLayout};
use crate::store::RedisStore;

/// How long connecting may take unless
/// [`connect_timeout`](RedisStoreBuilder::connect_timeout) says otherwise: 1 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long one decision may take unless
/// [`response_timeout`](RedisStoreBuilder::response_timeout) says otherwise: 200 ms.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(200);

/// The most script calls in flight on one multiplexed connection (per hash slot in a Cluster)
/// with coalescing on, unless [`coalesce_in_flight`](RedisStoreBuilder::coalesce_in_flight) says
/// otherwise: one call being decided while the next one fills.
pub const DEFAULT_COALESCE_IN_FLIGHT: usize = 2;

pub(crate) const STORE: &str = "redis";

pub(crate) fn config_error(message: impl Into<String>) -> Error {
    Error::Config {
        store: STORE,
        message: message.into(),
    }
}

/// Where the Redis servers are.
#[derive(Clone, Debug)]
pub(crate) enum Topology {
    /// One server (`redis://`, `rediss://`, `unix://`).
    Standalone(String),
    /// Sentinels monitoring a primary under a service name.
    Sentinel {
        sentinels: Vec<String>,
        service: String,
        /// The primary's credentials and database, from a `redis+sentinel://` URL.
        auth: NodeAuth,
    },
    /// Some nodes of a Redis Cluster.
    Cluster(Vec<String>),
    /// A URL not parsed yet (parsed, with its errors, by `connect`).
    Url(String),
}

/// Credentials for the servers that hold the state (not the sentinels).
#[derive(Clone, Default)]
pub(crate) struct NodeAuth {
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: Option<i64>,
    /// PEM certificates for TLS: a root to trust instead of the system's, a client identity.
    pub(crate) certs: Option<Certs>,
}

/// PEM certificates for TLS connections.
#[derive(Clone, Default)]
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub(crate) struct Certs {
    pub(crate) root: Option<Vec<u8>>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for NodeAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeAuth")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("db", &self.db)
            .field("custom_tls_certificates", &self.certs.is_some())
            .finish()
    }
}

/// Configures and connects a [`RedisStore`]; made by [`RedisStore::builder`],
/// [`RedisStore::sentinel`] or [`RedisStore::cluster`].
///
/// Nothing is checked until [`connect`](Self::connect): an invalid URL, prefix or option is an
/// [`Error::Config`] from there, never a panic.
///
/// ```no_run
/// use std::time::Duration;
/// use distlimit_redis::RedisStore;
///
/// # #[tokio::main] async fn main() -> Result<(), distlimit_core::Error> {
/// let store = RedisStore::builder("rediss://limiter:secret@redis.internal:6380/0")
///     .prefix("api-rl")
///     .hash_identities(true)
///     .connect_timeout(Duration::from_millis(500))
///     .response_timeout(Duration::from_millis(50))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a builder does nothing until `connect` is awaited"]
pub struct RedisStoreBuilder {
    pub(crate) topology: Topology,
    pub(crate) prefix: Vec<u8>,
    pub(crate) hash_identities: bool,
    pub(crate) pool_size: Option<usize>,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) auth: NodeAuth,
    pub(crate) coalesce: bool,
    pub(crate) coalesce_in_flight: Option<usize>,
    pub(crate) observer: Option<Arc<dyn RedisObserver>>,
    pub(crate) durable: Option<Durable>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("topology", &redact(&self.topology))
            .field("prefix", &self.prefix.escape_ascii().to_string())
            .field("hash_identities", &self.hash_identities)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("client_clock", &self.clock.is_some())
            .field("auth", &self.auth)
            .field("coalesce", &self.coalesce)
            .field("coalesce_in_flight", &self.coalesce_in_flight)
            .field("observer", &self.observer.is_some())
            .field("durable", &self.durable)
            .finish()
    }
}

/// `url` with its credentials hidden.
pub(crate) fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}<credentials>{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// The topology with passwords in URLs hidden.
fn redact(topology: &Topology) -> String {
    let urls = |urls: &[String]| {
        let urls: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
        urls.join(",")
    };
    match topology {
        Topology::Standalone(u) | Topology::Url(u) => redact_url(u),
        Topology::Sentinel {
            sentinels, service, ..
        } => format!("sentinel {service} via {}", urls(sentinels)),
        Topology::Cluster(nodes) => format!("cluster {}", urls(nodes)),
    }
}

impl RedisStoreBuilder {
    pub(crate) fn new(topology: Topology) -> Self {
        Self {
            topology,
            prefix: DEFAULT_PREFIX.as_bytes().to_vec(),
            hash_identities: false,
            pool_size: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            clock: None,
            auth: NodeAuth::default(),
            coalesce: true,
            coalesce_in_flight: None,
            observer: None,
            durable: None,
        }
    }

    /// Durable decisions (off by default): a decision that admits (charges units, or grants a
    /// lease) is answered only once `replicas` replicas acknowledge its write (`WAIT` right after
    /// the script), else, after `timeout`, with an [`Error::Unavailable`] whose source is a
    /// [`NotDurable`](crate::NotDurable); see the [crate documentation](crate#durable-decisions).
    /// [`connect`](Self::connect) answers an [`Error::Config`] for 0 replicas, a zero timeout, or
    /// a timeout not below the [`response_timeout`](Self::response_timeout) (the call's deadline
    /// must leave room for `WAIT`).
    pub fn durable(mut self, replicas: u32, timeout: Duration) -> Self {
        self.durable = Some(Durable { replicas, timeout });
        self
    }

    /// Coalesce script calls (on by default): when every call slot is taken (see
    /// [`coalesce_in_flight`](Self::coalesce_in_flight)), the decisions waiting for one are sent
    /// as one script call that decides each exactly as a call of its own would, in arrival order.
    /// A decision that finds a free slot is sent at once, alone, so nothing waits at low load.
    /// In a Cluster, per hash slot. See the [crate documentation](crate#coalesced-script-calls).
    pub fn coalesce(mut self, on: bool) -> Self {
        self.coalesce = on;
        self
    }

    /// With coalescing on: the most script calls in flight at once (at least 1; per hash slot in
    /// a Cluster; default [`DEFAULT_COALESCE_IN_FLIGHT`], or the pool size with
    /// [`pool`](Self::pool)). Fewer calls in flight make larger coalesced calls.
    pub fn coalesce_in_flight(mut self, calls: usize) -> Self {
        self.coalesce_in_flight = Some(calls);
        self
    }

    /// Reports coalesced calls' sizes and the calls in flight and waiting
    /// ([`RedisObserver::on_coalesced`], [`RedisObserver::on_connections`]) to `observer`, for example
    /// `distlimit-metrics`' `Metrics`.
    pub fn observer(mut self, observer: Arc<dyn RedisObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The prefix of every Redis key (default [`DEFAULT_PREFIX`](crate::DEFAULT_PREFIX)): any
    /// bytes but `{` and `}`, at most [`MAX_PREFIX_LEN`](crate::MAX_PREFIX_LEN). Stores with
    /// different prefixes never share state. See [`KeyLayout`].
    pub fn prefix(mut self, prefix: impl AsRef<[u8]>) -> Self {
        self.prefix = prefix.as_ref().to_vec();
        self
    }

    /// Name each identity by the hex SHA-256 of its key instead of the (escaped) key itself, so
    /// no personal data appears in Redis key names. Off by default. See [`KeyLayout`].
    pub fn hash_identities(mut self, on: bool) -> Self {
        self.hash_identities = on;
        self
    }

    /// Standalone only: send decisions over a `deadpool` pool of at most `max_size`
    /// connections, one call in flight on each, instead of one multiplexed, auto-reconnecting `ConnectionManager`. See the
    /// [crate documentation](crate#connection-modes) for when that helps. A size of 0, or a pool
    /// with Sentinel or Cluster, is an [`Error::Config`].
    pub fn pool(mut self, max_size: usize) -> Self {
        self.pool_size = Some(max_size);
        self
    }

    /// How long connecting may take (default [`DEFAULT_CONNECT_TIMEOUT`]): each TCP (and TLS)
    /// connection attempt, and [`connect`](Self::connect) as a whole. Running out is an
    /// [`Error::Timeout`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one decision may take, from the call to the answer, including waiting for a
    /// connection and following Cluster redirects (default [`DEFAULT_RESPONSE_TIMEOUT`]).
    /// Running out is an [`Error::Timeout`]; the script may still have run then, and it is not
    /// sent again.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Judge requests by `clock` instead of Redis' `TIME`: the time is read from it for every
    /// call and passed to the script, instead of the script reading `TIME`.
    /// Meant for deterministic tests (with a [`ManualClock`](distlimit_core::ManualClock)); in
    /// production, clients with skewed clocks would over-admit.
    pub fn client_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The user (`None`: the URL's, else the default user) and password for the servers holding
    /// the state, overriding the URLs' credentials. With Sentinel this is how the primary's credentials are
    /// given: the sentinel URLs' credentials are the sentinels' own.
    pub fn node_auth(mut self, username: Option<&str>, password: &str) -> Self {
        self.auth.username = username.map(str::to_owned);
        self.auth.password = Some(password.to_owned());
        self
    }

    /// Trust the certificate authority `pem` (PEM-encoded) for `rediss://` connections, instead
    /// of the system's root certificates (standalone, pool and Cluster; with Sentinel an
    /// [`Error::Config`]). The URL must be `rediss://`.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.auth.certs.get_or_insert_with(Default::default).root = Some(pem.into());
        self
    }

    /// Present this client certificate and key (PEM-encoded) on `rediss://` connections, for
    /// servers that require client certificates (`tls-auth-clients yes`); standalone, pool and
    /// Cluster.
    #[cfg(feature = "tls")]
    pub fn tls_client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.auth.certs.get_or_insert_with(Default::default).client =
            Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// The database number on the servers holding the state (Sentinel and standalone; a Cluster
    /// has only database 0), overriding the URL's.
    pub fn database(mut self, db: i64) -> Self {
        self.auth.db = Some(db);
        self
    }

    /// Checks the configuration, connects, and returns the store.
    ///
    /// Errors: an [`Error::Config`] for an invalid URL, prefix or option, rejected credentials
    /// or an unknown Sentinel service; an [`Error::Unavailable`] when no server answers (a
    /// refused connection); an [`Error::Timeout`] after the connect timeout.
    pub async fn connect(self) -> Result<RedisStore, Error> {
        let layout = KeyLayout::new(&self.prefix, self.hash_identities)?;
        if self.pool_size == Some(0) {
            return Err(config_error("a pool of 0 connections"));
        }
        if self.connect_timeout.is_zero() || self.response_timeout.is_zero() {
            return Err(config_error("a timeout of zero"));
        }
        let topology = match &self.topology {
            Topology::Url(url) => parse_url(url)?,
            other => other.clone(),
        };
        if let Some(durable) = self.durable {
            if durable.replicas == 0 {
                return Err(config_error("durable decisions need at least 1 replica"));
            }
            if durable.timeout.is_zero() || durable.timeout >= self.response_timeout {
                return Err(config_error(format!(
                    "the durable decisions' WAIT timeout ({:?}) must be above zero and below \
                     the response timeout ({:?})",
                    durable.timeout, self.response_timeout
                )));
            }
        }
        if self.pool_size.is_some() && !matches!(topology, Topology::Standalone(_)) {
            return Err(config_error(
                "a connection pool is available for a standalone server only",
            ));
        }
        RedisStore::open(self, topology, layout).await
    }
}

/// Parses a store URL: `redis://`, `rediss://`, `unix://`, `redis+unix://` as they are (one
/// server), or the multi-host forms `redis+sentinel://` and `redis+cluster://` (and `rediss+…`).
pub(crate) fn parse_url(url: &str) -> Result<Topology, Error> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(config_error(format!(
            "invalid Redis URL \"{}\": no scheme",
            url.escape_default()
        )));
    };
    // The scheme of the nodes' URLs, and whether they are sentinels (else Cluster nodes).
    let (base, sentinel) = match scheme.to_ascii_lowercase().as_str() {
        "redis" | "rediss" | "unix" | "redis+unix" | "valkey" | "valkeys" => {
            return Ok(Topology::Standalone(url.to_owned()));
        }
        "redis+sentinel" => ("redis", true),
        "rediss+sentinel" => ("rediss", true),
        "redis+cluster" => ("redis", false),
        "rediss+cluster" => ("rediss", false),
        other => {
            return Err(config_error(format!(
                "invalid Redis URL: unknown scheme \"{}\" (expected redis, rediss, unix, \
                 redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster)",
                other.escape_default()
            )));
        }
    };
    let bad = |why: &str| config_error(format!("invalid {scheme} URL: {why}"));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (path, fragment) = path
        .split_once('#')
        .map_or((path, None), |(p, f)| (p, Some(f)));
    let (userinfo, hosts) = authority
        .rsplit_once('@')
        .map_or((None, authority), |(u, h)| (Some(u), h));
    let hosts: Vec<&str> = hosts.split(',').collect();
    if hosts.iter().any(|h| h.is_empty()) {
        return Err(bad("expected host:port[,host:port…]"));
    }
    if hosts.iter().any(|h| h.contains(['/', '?', '#', ' '])) {
        return Err(bad("a host contains an invalid character"));
    }
    let suffix = fragment.map(|f| format!("/#{f}")).unwrap_or_default();
    if sentinel {
        // redis+sentinel://[user[:password]@]host:port[,…]/service[/db]
        let mut parts = path.split('/');
        let service = parts.next().unwrap_or_default();
        if service.is_empty() {
            return Err(bad("no service name: expected …/service[/db]"));
        }
        let decode = |s: &str| percent_decode(s).ok_or_else(|| bad("bad percent-escape"));
        let service = decode(service)?;
        let db = parts.next().filter(|db| !db.is_empty());
        let db = db
            .map(str::parse::<i64>)
            .transpose()
            .map_err(|_| bad("the database is no number"))?;
        if parts.next().is_some_and(|p| !p.is_empty()) {
            return Err(bad("a path after the database"));
        }
        // The URL's credentials and database are the primary's (the sentinels get none).
        let mut auth = NodeAuth {
            db,
            ..NodeAuth::default()
        };
        if let Some(userinfo) = userinfo {
            let (user, password) = userinfo
                .split_once(':')
                .map_or((userinfo, None), |(u, p)| (u, Some(p)));
            if !user.is_empty() {
                auth.username = Some(decode(user)?);
            }
            auth.password = password.map(decode).transpose()?;
        }
        Ok(Topology::Sentinel {
            sentinels: hosts
                .iter()
                .map(|h| format!("{base}://{h}{suffix}"))
                .collect(),
            service,
            auth,
        })
    } else {
        // redis+cluster://[user[:password]@]host:port[,…]
        if !path.is_empty() && path != "0" {
            return Err(bad("a cluster has only database 0"));
        }
        let cred = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        Ok(Topology::Cluster(
            hosts
                .iter()
                .map(|h| format!("{base}://{cred}{h}{suffix}"))
                .collect(),
        ))
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_urls_pass_through() {
        for url in [
            "redis://127.0.0.1:6379",
            "rediss://u:p@host:6380/2",
            "unix:///tmp/redis.sock",
        ] {
            assert!(matches!(parse_url(url), Ok(Topology::Standalone(u)) if u == url));
        }
    }

    #[test]
    fn sentinel_urls() {
        let Ok(Topology::Sentinel {
            sentinels,
            service,
            auth,
        }) = parse_url("redis+sentinel://h1:26379,h2:26380/my%20service")
        else {
            panic!()
        };
        assert_eq!(service, "my service");
        assert_eq!(sentinels, ["redis://h1:26379", "redis://h2:26380"]);
        assert!(auth.username.is_none() && auth.password.is_none() && auth.db.is_none());

        let Ok(Topology::Sentinel {
            sentinels,
            service,
            auth,
        }) = parse_url("rediss+sentinel://user:p%40ss@h1:1,h2:2/svc/3")
        else {
            panic!()
        };
        assert_eq!(service, "svc");
        assert_eq!(sentinels, ["rediss://h1:1", "rediss://h2:2"]);
        assert_eq!(auth.username.as_deref(), Some("user"));
        assert_eq!(auth.password.as_deref(), Some("p@ss"));
        assert_eq!(auth.db, Some(3));
    }

    #[test]
    fn cluster_urls() {
        let Ok(Topology::Cluster(nodes)) = parse_url("redis+cluster://:pw@a:1,b:2,[::1]:3") else {
            panic!()
        };
        assert_eq!(
            nodes,
            ["redis://:pw@a:1", "redis://:pw@b:2", "redis://:pw@[::1]:3"]
        );
    }

    #[test]
    fn debug_output_hides_passwords() {
        let b = RedisStoreBuilder::new(Topology::Url("redis://u:secret@h:1".into()))
            .node_auth(Some("u"), "secret2");
        let shown = format!("{b:?}");
        assert!(!shown.contains("secret"), "{shown}");
    }
}
