//! A Sentinel set: one primary, one replica and three sentinels monitoring them as [`SERVICE`].

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use super::{
    ENV_SENTINEL_PRIMARY, ENV_SENTINEL_REPLICA, ENV_SENTINEL_SERVICE, ENV_SENTINEL_URLS, NotReady,
    RedisServer, check_all_running, info_field, wait_until,
};

/// The name the sentinels monitor the primary under (`SENTINEL get-master-addr-by-name`).
pub const SERVICE: &str = "distlimit";

/// Sentinels in the set.
const SENTINELS: usize = 3;

/// Sentinels that must agree the primary is down before a failover (a majority).
const QUORUM: usize = 2;

/// The sentinels' `failover-timeout`.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the whole set may take to be ready, from the first start to the last check.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A primary, its replica and three sentinels, torn down together on drop (the sentinels first,
/// so none of them sees the data nodes go and reacts).
#[derive(Debug)]
pub struct Sentinel {
    sentinels: Vec<RedisServer>,
    /// The primary at startup (a test may fail it over).
    primary: RedisServer,
    /// The replica at startup.
    replica: RedisServer,
}

impl Sentinel {
    /// Starts the primary and its replica, waits until the replica is in sync, then starts three
    /// sentinels and waits until each one names the primary, sees it up, knows the replica as
    /// healthy and sees the two other sentinels, so `SENTINEL failover` works as soon as this
    /// returns.
    ///
    /// The replica is synced before the sentinels start so their first `INFO` of the primary
    /// lists it; otherwise they would learn of it only at the next `INFO`, 10 s later.
    pub fn start(bin: &Path) -> Result<Self, String> {
        Self::start_with(bin, Ok, FAILOVER_TIMEOUT)
    }

    /// As [`start`](Self::start), but the replica replicates from the address `via` returns for
    /// the primary's (a [`Proxy`](crate::Proxy) to it, say, to make the replica lag): `via` is
    /// called once the primary runs. The sentinels still monitor the primary itself.
    ///
    /// Their `failover-timeout` is 60 s here instead of 5 s: a sentinel points a replica that
    /// replicates from another address than the primary's back at the primary once
    /// `failover-timeout` has passed since it learned of the replica, which would bypass the
    /// proxy. (A first failover is not slowed by it.)
    pub fn start_replicating_via(
        bin: &Path,
        via: impl FnOnce(SocketAddr) -> Result<SocketAddr, String>,
    ) -> Result<Self, String> {
        Self::start_with(bin, via, Duration::from_secs(60))
    }

    fn start_with(
        bin: &Path,
        via: impl FnOnce(SocketAddr) -> Result<SocketAddr, String>,
        failover_timeout: Duration,
    ) -> Result<Self, String> {
        let start = Instant::now();
        let primary = RedisServer::spawn(bin, "sentinel primary", |_, _| Ok(Vec::new()))?;
        let primary_port = primary.port();
        let upstream = via(SocketAddr::from((Ipv4Addr::LOCALHOST, primary_port)))?;
        let mut replica = RedisServer::spawn(bin, "sentinel replica", |_, _| {
            Ok([
                "--replicaof".to_owned(),
                upstream.ip().to_string(),
                upstream.port().to_string(),
            ]
            .map(OsString::from)
            .to_vec())
        })?;
        wait_until(READY_TIMEOUT, || {
            check_all_running([&mut replica])?;
            let info = replica.info("replication").map_err(NotReady::new)?;
            match info_field(&info, "master_link_status") {
                Some("up") => Ok(()),
                other => Err(NotReady::new(format!(
                    "replica {}: master_link_status:{}",
                    replica.addr(),
                    other.unwrap_or("(missing)")
                ))),
            }
        })
        .map_err(|n| format!("the replica is {}{}", n.why, replica.log_tail()))?;

        let mut sentinels = Vec::with_capacity(SENTINELS);
        for _ in 0..SENTINELS {
            sentinels.push(RedisServer::spawn(bin, "sentinel", |port, dir| {
                // Sentinel rewrites its config file, so it lives in the sentinel's own dir.
                fs::create_dir_all(dir).map_err(|e| e.to_string())?;
                let config = dir.join("sentinel.conf");
                fs::write(
                    &config,
                    config_file(port, dir, primary_port, failover_timeout),
                )
                .map_err(|e| format!("writing {}: {e}", config.display()))?;
                Ok(vec![config.into_os_string(), OsString::from("--sentinel")])
            })?);
        }
        let mut set = Self {
            primary,
            replica,
            sentinels,
        };
        let left = READY_TIMEOUT.saturating_sub(start.elapsed());
        wait_until(left, || set.check_ready()).map_err(|n| {
            let log = n.server.and_then(|i| set.sentinels.get(i));
            let log = log.map(RedisServer::log_tail).unwrap_or_default();
            format!("the Sentinel set is {}{log}", n.why)
        })?;
        Ok(set)
    }

    /// One look at every sentinel; the first thing missing is the complaint.
    fn check_ready(&mut self) -> Result<(), NotReady> {
        check_all_running([&mut self.primary, &mut self.replica]).map_err(|mut n| {
            n.server = None;
            n
        })?;
        check_all_running(&mut self.sentinels)?;
        for (i, sentinel) in self.sentinels.iter().enumerate() {
            check_sentinel(sentinel, self.primary.port(), self.replica.port())
                .map_err(|why| NotReady::at(i, format!("sentinel {}: {why}", sentinel.addr())))?;
        }
        Ok(())
    }

    /// The primary at startup.
    pub fn primary(&self) -> &RedisServer {
        &self.primary
    }

    /// The replica at startup.
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// The primary at startup, to fault: [`kill`](RedisServer::kill) it (the sentinels promote
    /// the replica once it has been down for `down-after-milliseconds`, 1 s here), then
    /// [`restart`](RedisServer::restart) it (the sentinels make it a replica of the new primary).
    pub fn primary_mut(&mut self) -> &mut RedisServer {
        &mut self.primary
    }

    /// The sentinels.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// `primary ..., replica ..., sentinels ...`, for a startup line.
    pub fn describe(&self) -> String {
        let ports: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| s.port().to_string())
            .collect();
        format!(
            "primary {}, replica {}, sentinels on 127.0.0.1:{} (service `{SERVICE}`)",
            self.primary.addr(),
            self.replica.addr(),
            ports.join(",")
        )
    }

    /// The variables that describe the set to the tests.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let urls: Vec<String> = self.sentinels.iter().map(RedisServer::url).collect();
        vec![
            (ENV_SENTINEL_URLS, urls.join(",")),
            (ENV_SENTINEL_SERVICE, SERVICE.to_owned()),
            (ENV_SENTINEL_PRIMARY, self.primary.addr()),
            (ENV_SENTINEL_REPLICA, self.replica.addr()),
        ]
    }
}

/// The config file of the sentinel on `port`, keeping its state in `dir`, monitoring the primary
/// on `primary_port`.
fn config_file(port: u16, dir: &Path, primary_port: u16, failover_timeout: Duration) -> String {
    // Quoted: a temp dir path may contain spaces.
    let dir = dir.display().to_string();
    let dir = format!("\"{}\"", dir.replace('\\', "\\\\").replace('"', "\\\""));
    format!(
        "port {port}\n\
         bind 127.0.0.1\n\
         dir {dir}\n\
         sentinel monitor {SERVICE} 127.0.0.1 {primary_port} {QUORUM}\n\
         sentinel down-after-milliseconds {SERVICE} 1000\n\
         sentinel failover-timeout {SERVICE} {}\n\
         sentinel parallel-syncs {SERVICE} 1\n",
        failover_timeout.as_millis()
    )
}

/// Whether `sentinel` names `primary` as the primary of [`SERVICE`], sees it up, knows
/// `replica` as a healthy replica, and knows the other sentinels.
fn check_sentinel(sentinel: &RedisServer, primary: u16, replica: u16) -> Result<(), String> {
    let ask = |sub: &str| {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg(sub).arg(SERVICE);
        cmd
    };
    let named: Vec<String> = sentinel.query(&ask("get-master-addr-by-name"))?;
    if named != ["127.0.0.1".to_owned(), primary.to_string()] {
        return Err(format!(
            "get-master-addr-by-name {SERVICE} answers {named:?}, waiting for 127.0.0.1:{primary}"
        ));
    }
    let master: HashMap<String, String> = sentinel.query(&ask("master"))?;
    let flags = master.get("flags").map_or("", String::as_str);
    if flags != "master" {
        return Err(format!("primary flags `{flags}`, waiting for `master`"));
    }
    let others: Vec<redis::Value> = sentinel.query(&ask("sentinels"))?;
    if others.len() != SENTINELS - 1 {
        return Err(format!(
            "knows {} other sentinels, waiting for {}",
            others.len(),
            SENTINELS - 1
        ));
    }
    let replicas: Vec<HashMap<String, String>> = sentinel.query(&ask("replicas"))?;
    let field = |r: &HashMap<String, String>, name: &str| r.get(name).cloned().unwrap_or_default();
    let healthy = replicas.iter().any(|r| {
        field(r, "port") == replica.to_string()
            && field(r, "flags") == "slave"
            && field(r, "master-link-status") == "ok"
    });
    if !healthy {
        return Err(format!(
            "does not list 127.0.0.1:{replica} as a healthy replica yet: {replicas:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_files_monitor_the_primary_and_quote_the_dir() {
        let config = config_file(41001, Path::new("/tmp/a \"b\""), 41000, FAILOVER_TIMEOUT);
        let lines: Vec<&str> = config.lines().collect();
        assert_eq!(
            lines,
            [
                "port 41001",
                "bind 127.0.0.1",
                r#"dir "/tmp/a \"b\"""#,
                "sentinel monitor distlimit 127.0.0.1 41000 2",
                "sentinel down-after-milliseconds distlimit 1000",
                "sentinel failover-timeout distlimit 5000",
                "sentinel parallel-syncs distlimit 1",
            ]
        );
    }
}
