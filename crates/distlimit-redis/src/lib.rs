//! distlimit-redis: distlimit's Redis store, every decision one atomic Lua script.
//!
//! [`RedisStore`] implements the [`Store`](distlimit_core::Store) contract on standalone Redis,
//! Sentinel and Cluster: one limit enforced across every instance of a service, with no races
//! between them. Each decision is one round trip running one script (`EVALSHA`, falling back to
//! `EVAL` when the server lost its script cache); the scripts, in [`script`], decide exactly as
//! the reference model [`Limit::decide`](distlimit_core::Limit::decide) does.
//!
//! # Example
//!
//! ```no_run
//! use distlimit_core::{Limit, Quota, StoreExt};
//! use distlimit_redis::RedisStore;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let limit = Limit::gcra(Quota::per_minute(60)?.with_burst(10)?);
//!
//! let decision = store.check("user:42", limit).await?;
//! if decision.is_denied() {
//!     println!("slow down: retry in {:?}", decision.retry_after());
//! }
//! # Ok(()) }
//! ```
//!
//! # Key layout (a storage format)
//!
//! The state of key `k` under policy `p` lives at `<prefix>:{<identity>}:<policy>` (see
//! [`KeyLayout`]):
//!
//! * `prefix`: [`DEFAULT_PREFIX`] (`distlimit`) unless [`RedisStoreBuilder::prefix`] says
//!   otherwise; no braces.
//! * `identity`: `k` with `%`, `{` and `}` escaped as `%25`, `%7B` and `%7D` (every other byte,
//!   NUL and invalid UTF-8 included, as it is), or with [`RedisStoreBuilder::hash_identities`]
//!   the lowercase hex SHA-256 of `k`, so no personal data appears in key names.
//! * `policy`: the [policy name](distlimit_core::Request::policy), escaped the same way.
//!
//! The braces make the identity the Redis Cluster hash tag: all policies of one identity share
//! a slot (a batch over them is one script on one node), different identities spread over the
//! masters, and no key bytes can break the tag or make two pairs collide. The value is the
//! script's state encoding ([`script`], "State encoding"), with a TTL after which the key would
//! decide as a fresh one. Changing the layout or the encoding orphans existing state.
//!
//! # Time
//!
//! By default the scripts read Redis' `TIME`
//! ([`TimeSource::Server`](script::TimeSource::Server)): every instance is judged by one clock,
//! so instances with skewed clocks cannot over-admit. [`RedisStoreBuilder::client_clock`]
//! passes a [`Clock`](distlimit_core::Clock)'s reading instead, read on every call: for
//! deterministic tests (the conformance suite runs this way), not for production.
//!
//! # Failures
//!
//! A denial is an `Ok(decision)`; an `Err` means the store could not decide, classified by
//! [`Error::is_transient`](distlimit_core::Error::is_transient) for circuit breakers:
//!
//! | error | when | transient |
//! |---|---|---|
//! | [`Error::Timeout`](distlimit_core::Error::Timeout) | no answer within the response timeout (default 200 ms) or connect timeout (default 1 s) | yes |
//! | [`Error::Unavailable`](distlimit_core::Error::Unavailable) | connection refused or lost, `LOADING`, `MASTERDOWN`, `CLUSTERDOWN`, `TRYAGAIN`, `READONLY` (a failover in progress), no primary known to the sentinels | yes |
//! | [`Error::Backend`](distlimit_core::Error::Backend) | `BUSY` (transient); any other server error (permanent) | either |
//! | [`Error::Config`](distlimit_core::Error::Config) | invalid URL or option, `NOAUTH`, `WRONGPASS`, `NOPERM` (an ACL forbids `EVALSHA` or the keys), scripting disabled, a TLS certificate refused | no |
//! | [`Error::BadState`](distlimit_core::Error::BadState) | a value at a key of the request that is not a valid state: another Redis type (`WRONGTYPE`), garbage, an empty string, a wrong tag or length | no |
//! | [`Error::Protocol`](distlimit_core::Error::Protocol) | a malformed reply (of another type or length, or contradicting itself) | no |
//! | [`Error::InvalidRequest`](distlimit_core::Error::InvalidRequest) | an invalid batch; in a Cluster, a batch over several identities | no |
//!
//! A consuming script that timed out or lost its connection may have run, so it is never sent
//! again: the caller gets the transient error. Only replies that prove the script did not run
//! (`NOSCRIPT`, `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`, `READONLY`,
//! a refused connection) are followed by another attempt, in a Cluster, within the same
//! deadline. redis-rs' own Cluster retries are switched off for this reason: they resend a
//! request after a dropped connection or a per-node timeout.
//!
//! # A bad value at a key
//!
//! A value at a distlimit key that no script wrote (a list or a hash, an empty string, garbage,
//! a state with a wrong tag or length) is an [`Error::BadState`](distlimit_core::Error::BadState)
//! of the requests on that key, alone or in a batch, and of nothing else: other keys decide as
//! usual on the same connection, and a circuit breaker does not count it against the store. The
//! message names the key.
//!
//! The value is never replaced or deleted by the store: every request on that key, peeks and
//! consuming ones alike, answers `BadState` and writes nothing (a batch containing the key
//! charges none of its requests), until the value expires or an operator deletes it (`DEL`);
//! the key then decides as a fresh one. This is the safer choice: the value may belong to
//! another application sharing the keyspace, whose data a rate limiter must not destroy; and
//! taking an unreadable value for a fresh state would hand out a full quota to whoever can make
//! the value unreadable. The request's failure mode (open or closed, in a hybrid store) answers
//! it meanwhile. A well-formed state of *another* algorithm is not a bad value: it counts as
//! fresh and is replaced by the next admitted request (a policy whose algorithm changed).
//!
//! # Connection modes
//!
//! | mode | made by | connections | failover |
//! |---|---|---|---|
//! | [`Mode::Standalone`] (default) | `redis://`, `rediss://`, `unix://` URL | one multiplexed connection (`ConnectionManager`), any number of calls in flight, pipelined | reconnects in the background after a lost connection; the failed call is not resent; a call that finds the last reconnection refused waits for a new one and runs on it |
//! | [`Mode::Pool`] | [`RedisStoreBuilder::pool`]`(max_size)` | a `deadpool` pool: one call in flight per connection, at most `max_size` connections | a connection whose call failed with a connection error or timed out is replaced at its next checkout, and a lost connection retires every connection opened before it; the failed call is not resent |
//! | [`Mode::Sentinel`] | [`RedisStore::sentinel`], `redis+sentinel://` URL | one multiplexed connection to the primary the sentinels name | the primary is looked up again through the sentinels after any transient error, and whenever the sentinels (asked every second) name another one |
//! | [`Mode::Cluster`] | [`RedisStore::cluster`], `redis+cluster://` URL | redis-rs' `cluster_async`: one multiplexed connection per node | `MOVED`/`ASK` followed, slot map refreshed; batches must be one identity's policies |
//!
//! The multiplexed default suits most services: one TCP connection carries every concurrent
//! call, and Redis runs one script at a time anyway. The pool spreads calls over several TCP
//! connections (useful with Redis I/O threads, or to bound the calls in flight). A checkout
//! sends nothing to the server (no `PING`: one round trip per decision, as in the multiplexed
//! mode); instead a connection whose call lost its connection or timed out is dropped and
//! replaced by a new one. A connection the server closed while it sat idle (a restart,
//! `timeout`, `CLIENT KILL`) is found out by the next call on it, which fails with a transient
//! error; that failure also retires the pool's older connections, so one call, not one per
//! pooled connection, pays for a restart.
//!
//! After Redis is killed and restarted, the first call that reaches it again (a hybrid store's
//! half-open probe, typically) runs on a fresh connection, in both modes (`tests/reconnect.rs`:
//! a SIGKILL and restart under a steady trickle of requests through a hybrid store; the breaker
//! closes at the first probe after the restart).
//!
//! Every mode supports TLS (`rediss://`; a private CA and client certificates through
//! [`RedisStoreBuilder::tls_root_certificate`] and [`RedisStoreBuilder::tls_client_certificate`],
//! except with Sentinel) and ACL users (`redis://user:password@host`). Each call
//! has a response timeout ([`DEFAULT_RESPONSE_TIMEOUT`], 200 ms) covering the connection wait,
//! redirects and the script; connecting has its own ([`DEFAULT_CONNECT_TIMEOUT`], 1 s).
//!
//! # Feature flags
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `tls` | yes | `rediss://` URLs: TLS through rustls with the *ring* provider (installed as the process default unless the application installed one), trusting the operating system's root certificates; no OpenSSL |
//! | `tls-webpki-roots` | no | trust Mozilla's root certificates compiled into the binary (the `webpki-roots` crate) instead of the operating system's |
//! | `tls-insecure` | no | accept `rediss://host/#insecure` URLs, which skip certificate verification: for development only |

mod config;
mod connection;
mod layout;
pub mod script;
mod store;

pub use config::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT, RedisStoreBuilder};
pub use layout::{CLUSTER_SLOTS, DEFAULT_PREFIX, KeyLayout, MAX_PREFIX_LEN, hash_slot};
pub use store::{Mode, RedisStore};
