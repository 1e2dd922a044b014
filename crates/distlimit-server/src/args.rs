//! The command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::http::HeaderName;
use clap::Parser;
use distlimit_serve::ServeArgs;
use distlimit_serve::store::StoreArgs;

use crate::answer::{self, HeaderNames, ResponseSettings};

/// The rate-limit service's command line (`distlimit-server --help`).
#[derive(Clone, Debug, Parser)]
#[command(name = "distlimit-server", version, about, args_override_self = true)]
pub struct Args {
    /// envoyproxy/ratelimit's YAML configuration: a file, or a directory whose `.yaml`/`.yml`
    /// files are read (dot files skipped). Reloaded when it changes. Without it, no domain is
    /// configured and every descriptor is answered OK.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Address of the gRPC server (Envoy's RLS v3 and grpc.health.v1).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081")]
    pub grpc: SocketAddr,

    /// Address of the HTTP server (POST /v1/check, /metrics, /ready).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub http: SocketAddr,

    /// The store's flags ([`StoreArgs`], shared with the demo).
    #[command(flatten)]
    pub store: StoreArgs,

    /// Add the rate-limit headers to every answer: `RateLimit` and `RateLimit-Policy`, and the
    /// `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` trio (names set by
    /// `--limit-header`, `--remaining-header`, `--reset-header`).
    #[arg(long)]
    pub response_headers: bool,

    /// The name of the header carrying the limit, with `--response-headers`
    /// (envoyproxy/ratelimit's `LIMIT_LIMIT_HEADER`). Sent in lower case.
    #[arg(long, value_name = "NAME", default_value = "RateLimit-Limit", value_parser = answer::parse_header_name)]
    pub limit_header: HeaderName,

    /// The name of the header carrying what is left, with `--response-headers`
    /// (`LIMIT_REMAINING_HEADER`). Sent in lower case.
    #[arg(long, value_name = "NAME", default_value = "RateLimit-Remaining", value_parser = answer::parse_header_name)]
    pub remaining_header: HeaderName,

    /// The name of the header carrying the seconds to the window's reset, with
    /// `--response-headers` (`LIMIT_RESET_HEADER`). Sent in lower case.
    #[arg(long, value_name = "NAME", default_value = "RateLimit-Reset", value_parser = answer::parse_header_name)]
    pub reset_header: HeaderName,

    /// Fill the gRPC response's `dynamic_metadata` (envoyproxy/ratelimit's
    /// `RESPONSE_DYNAMIC_METADATA`): the request's domain, descriptors and `hits_addend`, and
    /// the YAML `metadata` of the descriptors that passed (see `distlimit_server::answer`).
    #[arg(long)]
    pub response_dynamic_metadata: bool,

    /// envoyproxy/ratelimit's global shadow mode: descriptors are decided, counted and
    /// answered as usual, but the request is never answered over the limit.
    #[arg(long)]
    pub shadow_mode: bool,

    /// envoyproxy/ratelimit's global quota mode: every descriptor of a YAML rule (or of none) is
    /// in `quota_mode`; the request is over the limit only when all of them are (or a TOML
    /// policy denies it).
    #[arg(long)]
    pub quota_mode: bool,

    /// How often the configuration path is read for changes, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..))]
    pub reload_interval_ms: u64,

    /// The serving limits of each port ([`ServeArgs`], shared with the demo); the gRPC port's
    /// idle timeout is `--grpc-idle-timeout-ms`.
    #[command(flatten)]
    pub serve: ServeArgs,

    /// Envoy's rate limit quota service (`--rlqs-*`).
    #[command(flatten)]
    pub quota: crate::rlqs::QuotaArgs,

    /// A gRPC connection with no request in progress, and none started or ended, for this long
    /// is closed, in milliseconds. The default, 65 minutes, is above the 1 hour after which
    /// Envoy closes its own idle upstream connections, so that Envoy closes first: a close from
    /// this side can cross a request Envoy has just sent on the connection.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_GRPC_IDLE_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub grpc_idle_timeout_ms: u64,

    /// Time limit of one request, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_ms: u64,

    /// Serve both ports over TLS with this certificate chain (PEM: the server's certificate
    /// first, then intermediates). Needs `--tls-key`. Re-read every `--reload-interval-ms`:
    /// new connections get a changed certificate, open ones keep theirs.
    #[arg(long, value_name = "PATH", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of `--tls-cert` (PEM: PKCS#8, PKCS#1 or SEC1). Needs `--tls-cert`.
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Mutual TLS: clients must present a certificate issued by a certificate of this PEM file.
    /// Needs `--tls-cert` and `--tls-key`.
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
}

/// Default of `--grpc-idle-timeout-ms`: 65 minutes.
pub const DEFAULT_GRPC_IDLE_TIMEOUT_MS: u64 = 65 * 60 * 1000;

impl Args {
    /// The reload poll interval.
    pub fn reload_interval(&self) -> Duration {
        Duration::from_millis(self.reload_interval_ms)
    }

    /// The time limit of one request.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// The serving limits of the gRPC port: those of the HTTP port (`serve`'s) with the gRPC
    /// idle timeout.
    pub fn grpc_serve_config(&self) -> distlimit_serve::ServeConfig {
        distlimit_serve::ServeConfig {
            idle_timeout: Duration::from_millis(self.grpc_idle_timeout_ms),
            ..self.serve.serve_config()
        }
    }

    /// The TLS files of both ports, if `--tls-cert` and `--tls-key` are given.
    pub fn tls_files(&self) -> Option<distlimit_serve::TlsFiles> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert_chain), Some(private_key)) => Some(distlimit_serve::TlsFiles {
                cert_chain: cert_chain.clone(),
                private_key: private_key.clone(),
                client_ca: self.tls_client_ca.clone(),
            }),
            _ => None,
        }
    }

    /// How answers are completed: the headers (with `--response-headers`) under their names,
    /// the dynamic metadata.
    pub fn response_settings(&self) -> ResponseSettings {
        ResponseSettings {
            headers: self.response_headers.then(|| HeaderNames {
                limit: self.limit_header.clone(),
                remaining: self.remaining_header.clone(),
                reset: self.reset_header.clone(),
            }),
            dynamic_metadata: self.response_dynamic_metadata,
        }
    }

    /// The command line `args` (the program name first) over the settings envoyproxy/ratelimit
    /// reads from its environment (through `env`, [`std::env::var`] in the binary), so that
    /// an existing deployment's variables keep working: a flag given on the command line wins
    /// over its variable. The crate documentation ("From envoyproxy/ratelimit") lists the
    /// variables and their flags. A group is used only when one of its variables is set
    /// (`--grpc` from `GRPC_HOST` or `GRPC_PORT`, `--config` from `RUNTIME_ROOT` or
    /// `RUNTIME_SUBDIRECTORY`), `--redis` only when `BACKEND_TYPE` is unset or `redis`.
    ///
    /// # Errors
    ///
    /// A variable the server cannot use (a port that is no number, a header name that HTTP
    /// does not allow), or the command line's errors (`clap`'s, which print the help or the
    /// version too).
    pub fn from_env_and_args<I, T>(
        env: impl Fn(&str) -> Option<String>,
        args: I,
    ) -> Result<Result<Self, clap::Error>, EnvError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut args = args.into_iter().map(Into::into);
        let program = args.next().unwrap_or_else(|| "distlimit-server".into());
        let mut argv = vec![program];
        argv.extend(env_flags(&env)?.into_iter().map(Into::into));
        argv.extend(args);
        Ok(Self::try_parse_from(argv))
    }
}

impl Default for Args {
    /// The defaults, as if run without flags.
    fn default() -> Self {
        Self::parse_from(["distlimit-server"])
    }
}

/// An envoyproxy/ratelimit environment variable with a value the server cannot use.
#[derive(Debug, thiserror::Error)]
#[error("environment variable {name}={value:?}: {why}")]
pub struct EnvError {
    /// The variable.
    pub name: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// The flags of envoyproxy/ratelimit's environment variables (see
/// [`Args::from_env_and_args`]).
fn env_flags(env: &impl Fn(&str) -> Option<String>) -> Result<Vec<String>, EnvError> {
    let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let truthy = |name: &'static str| -> Result<bool, EnvError> {
        match var(name).map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("false" | "0" | "f" | "no") => Ok(false),
            Some("true" | "1" | "t" | "yes") => Ok(true),
            Some(_) => Err(EnvError {
                name,
                value: var(name).unwrap_or_default(),
                why: "expected true or false",
            }),
        }
    };
    let mut flags = Vec::new();
    for (flag, host, port, default) in [
        ("--grpc", "GRPC_HOST", "GRPC_PORT", "8081"),
        ("--http", "HOST", "PORT", "8080"),
    ] {
        if var(host).is_none() && var(port).is_none() {
            continue;
        }
        let port_value = var(port).unwrap_or_else(|| default.to_owned());
        if port_value.trim().parse::<u16>().is_err() {
            return Err(EnvError {
                name: port,
                value: port_value,
                why: "expected a port number, 0 to 65535",
            });
        }
        let host = var(host).unwrap_or_else(|| "0.0.0.0".to_owned());
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host
        };
        flags.extend([flag.to_owned(), format!("{host}:{}", port_value.trim())]);
    }
    if var("RUNTIME_ROOT").is_some() || var("RUNTIME_SUBDIRECTORY").is_some() {
        let mut path = PathBuf::from(
            var("RUNTIME_ROOT").unwrap_or_else(|| "/srv/runtime_data/current".into()),
        );
        if let Some(sub) = var("RUNTIME_SUBDIRECTORY") {
            path.push(sub);
        }
        path.push(var("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".into()));
        flags.extend(["--config".to_owned(), path.display().to_string()]);
    }
    let redis_backend = var("BACKEND_TYPE").is_none_or(|b| b.eq_ignore_ascii_case("redis"));
    if let (Some(url), true) = (var("REDIS_URL"), redis_backend) {
        let url = redis_url(&var, &url, truthy("REDIS_TLS")?)?;
        flags.extend(["--redis".to_owned(), url]);
    }
    for (name, flag) in [
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "--response-headers"),
        ("SHADOW_MODE", "--shadow-mode"),
        ("QUOTA_MODE", "--quota-mode"),
        ("RESPONSE_DYNAMIC_METADATA", "--response-dynamic-metadata"),
    ] {
        if truthy(name)? {
            flags.push(flag.to_owned());
        }
    }
    for (name, flag) in [
        ("LIMIT_LIMIT_HEADER", "--limit-header"),
        ("LIMIT_REMAINING_HEADER", "--remaining-header"),
        ("LIMIT_RESET_HEADER", "--reset-header"),
    ] {
        if let Some(value) = env(name) {
            if answer::parse_header_name(&value).is_err() {
                return Err(EnvError {
                    name,
                    value,
                    why: "expected an HTTP header name (a token: letters, digits and !#$%&'*+-.^_`|~)",
                });
            }
            flags.extend([flag.to_owned(), value]);
        }
    }
    if truthy("GRPC_SERVER_USE_TLS")? {
        for (name, flag) in [
            ("GRPC_SERVER_TLS_CERT", "--tls-cert"),
            ("GRPC_SERVER_TLS_KEY", "--tls-key"),
            ("GRPC_CLIENT_TLS_CACERT", "--tls-client-ca"),
        ] {
            if let Some(path) = var(name) {
                flags.extend([flag.to_owned(), path]);
            }
        }
    }
    Ok(flags)
}

/// `--redis` from envoyproxy/ratelimit's `REDIS_URL` (no scheme) and its companions.
fn redis_url(
    var: &impl Fn(&str) -> Option<String>,
    url: &str,
    tls: bool,
) -> Result<String, EnvError> {
    let url = url.trim();
    if url.contains("://") {
        return Ok(url.to_owned());
    }
    let bad = |name: &'static str, value: String, why: &'static str| EnvError { name, value, why };
    // `user:password` or `password`, each percent-encoded.
    let auth = var("REDIS_AUTH").map(|auth| match auth.split_once(':') {
        Some((user, password)) => (Some(percent_encode(user)), percent_encode(password)),
        None => (None, percent_encode(&auth)),
    });
    let userinfo = auth.as_ref().map_or_else(String::new, |(user, password)| {
        format!("{}:{password}@", user.as_deref().unwrap_or_default())
    });
    let scheme = if tls { "rediss" } else { "redis" };
    let socket = var("REDIS_SOCKET_TYPE").unwrap_or_else(|| "unix".into());
    let kind = var("REDIS_TYPE").unwrap_or_else(|| "SINGLE".into());
    match kind.to_ascii_uppercase().as_str() {
        "SINGLE" => match socket.to_ascii_lowercase().as_str() {
            "tcp" => Ok(format!("{scheme}://{userinfo}{url}")),
            "unix" => {
                let query = match auth {
                    Some((Some(user), password)) => format!("?user={user}&pass={password}"),
                    Some((None, password)) => format!("?pass={password}"),
                    None => String::new(),
                };
                Ok(format!("unix://{url}{query}"))
            }
            _ => Err(bad("REDIS_SOCKET_TYPE", socket, "expected tcp or unix")),
        },
        "SENTINEL" => match url.split_once(',') {
            Some((service, hosts)) if !service.is_empty() && !hosts.is_empty() => Ok(format!(
                "{scheme}+sentinel://{userinfo}{hosts}/{}",
                percent_encode(service)
            )),
            _ => Err(bad(
                "REDIS_URL",
                url.to_owned(),
                "REDIS_TYPE=SENTINEL expects name,host:port[,host:port…]",
            )),
        },
        "CLUSTER" => Ok(format!("{scheme}+cluster://{userinfo}{url}")),
        _ => Err(bad(
            "REDIS_TYPE",
            kind,
            "expected SINGLE, SENTINEL or CLUSTER",
        )),
    }
}

/// `text` with every byte but the URL's unreserved ones percent-encoded.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The command line `args` over the variables `env`: the arguments, or the variable refused.
    fn env_and_args(env: &[(&str, &str)], args: &[&str]) -> Result<Args, EnvError> {
        let env = |name: &str| {
            env.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        };
        let argv = std::iter::once("distlimit-server").chain(args.iter().copied());
        Args::from_env_and_args(env, argv).map(Result::unwrap)
    }

    fn parse(env: &[(&str, &str)], args: &[&str]) -> Args {
        env_and_args(env, args).unwrap()
    }

    #[test]
    fn envoyproxy_variables_set_the_flags_and_the_command_line_wins() {
        let args = parse(
            &[
                ("GRPC_PORT", "9081"),
                ("HOST", "127.0.0.1"),
                ("PORT", "9080"),
                ("RUNTIME_ROOT", "/data"),
                ("RUNTIME_SUBDIRECTORY", "ratelimit"),
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "redis.local:6379"),
                ("REDIS_AUTH", "p@ss"),
                ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
                ("QUOTA_MODE", "true"),
            ],
            &[],
        );
        assert_eq!(args.grpc, "0.0.0.0:9081".parse().unwrap());
        assert_eq!(args.http, "127.0.0.1:9080".parse().unwrap());
        assert_eq!(args.config, Some(PathBuf::from("/data/ratelimit/config")));
        assert_eq!(
            args.store.redis.as_deref(),
            Some("redis://:p%40ss@redis.local:6379")
        );
        assert!(args.response_headers);
        assert!(args.quota_mode && !args.shadow_mode);
        assert!(parse(&[("SHADOW_MODE", "1")], &[]).shadow_mode);
        let args = parse(&[("GRPC_PORT", "9081")], &["--grpc", "127.0.0.1:1"]);
        assert_eq!(args.grpc, "127.0.0.1:1".parse().unwrap());
        // Nothing set: the flags' defaults.
        assert_eq!(parse(&[], &[]).grpc, Args::default().grpc);
    }

    #[test]
    fn redis_topologies_and_sockets() {
        let url = |env: &[(&str, &str)]| parse(env, &[]).store.redis.unwrap();
        assert_eq!(
            url(&[("REDIS_URL", "/var/run/redis.sock"), ("REDIS_AUTH", "u:p")]),
            "unix:///var/run/redis.sock?user=u&pass=p"
        );
        assert_eq!(
            url(&[
                ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
                ("REDIS_TYPE", "sentinel"),
                ("REDIS_TLS", "true"),
            ]),
            "rediss+sentinel://s1:26379,s2:26379/mymaster"
        );
        assert_eq!(
            url(&[("REDIS_URL", "a:7000,b:7001"), ("REDIS_TYPE", "CLUSTER")]),
            "redis+cluster://a:7000,b:7001"
        );
        assert_eq!(
            url(&[("REDIS_URL", "redis://x:1"), ("REDIS_SOCKET_TYPE", "udp")]),
            "redis://x:1"
        );
        let memcache = parse(&[("REDIS_URL", "x:1"), ("BACKEND_TYPE", "memcache")], &[]);
        assert_eq!(memcache.store.redis, None);
    }

    #[test]
    fn the_shared_flags_are_bounded_as_in_the_demo() {
        let parse = |flags: &[&str]| {
            Args::try_parse_from(std::iter::once("distlimit-server").chain(flags.iter().copied()))
        };
        // Range-checked here too now (the demo's ranges): 1 to 60000.
        assert!(parse(&["--redis-budget-ms", "0"]).is_err());
        assert!(parse(&["--redis-budget-ms", "60001"]).is_err());
        assert!(parse(&["--instances", "10001"]).is_err());
        assert!(parse(&["--shutdown-timeout-ms", "0"]).is_err());
        // u64 in both binaries (the demo's was u32).
        let args = parse(&["--max-connections", "5000000000"]).unwrap();
        assert_eq!(args.serve.max_connections, 5_000_000_000);
        // Durable decisions: only with --redis, at least 1 replica; the timeout only with them.
        assert_eq!(args.store.redis_durable(), None);
        let durable = parse(&["--redis", "redis://x:1", "--redis-durable-replicas", "2"]).unwrap();
        assert_eq!(
            durable.store.redis_durable(),
            Some((2, std::time::Duration::from_millis(40)))
        );
        assert!(parse(&["--redis-durable-replicas", "1"]).is_err());
        assert!(parse(&["--redis", "redis://x:1", "--redis-durable-replicas", "0"]).is_err());
        assert!(parse(&["--redis", "redis://x:1", "--redis-durable-timeout-ms", "10"]).is_err());
    }

    #[test]
    fn unusable_variables_are_named() {
        let refused = |env: &[(&str, &str)]| env_and_args(env, &[]).unwrap_err();
        assert_eq!(refused(&[("GRPC_PORT", "http")]).name, "GRPC_PORT");
        let socket = refused(&[("REDIS_URL", "x:1"), ("REDIS_SOCKET_TYPE", "udp")]);
        assert_eq!(socket.name, "REDIS_SOCKET_TYPE");
        let error = refused(&[("LIMIT_RESET_HEADER", "Reset: now")]);
        assert_eq!(error.name, "LIMIT_RESET_HEADER");
        assert!(error.to_string().contains("Reset: now"), "{error}");
        // The same name as a flag: clap's error.
        let flag = ["distlimit-server", "--limit-header", "a b"];
        assert!(Args::from_env_and_args(|_| None, flag).unwrap().is_err());
    }

    #[test]
    fn header_names_and_dynamic_metadata_from_the_variables() {
        let defaults = parse(&[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")], &[]);
        let settings = defaults.response_settings();
        assert_eq!(settings.headers, Some(HeaderNames::default()));
        assert!(!settings.dynamic_metadata);
        let args = parse(
            &[
                ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
                ("LIMIT_LIMIT_HEADER", "X-RateLimit-Limit"),
                ("LIMIT_REMAINING_HEADER", "x-left"),
                ("RESPONSE_DYNAMIC_METADATA", "true"),
            ],
            &["--reset-header", "X-Reset"],
        );
        let settings = args.response_settings();
        let names = settings.headers.unwrap();
        assert_eq!(names.limit.as_str(), "x-ratelimit-limit");
        assert_eq!(names.remaining.as_str(), "x-left");
        assert_eq!(names.reset.as_str(), "x-reset");
        assert!(settings.dynamic_metadata);
        // Names without LIMIT_RESPONSE_HEADERS_ENABLED: no headers, as in envoyproxy.
        let off = parse(&[("LIMIT_LIMIT_HEADER", "X-L")], &[]);
        assert_eq!(off.response_settings().headers, None);
    }
}
