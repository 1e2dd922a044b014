//! A Sentinel set: one primary, one replica and three sentinels monitoring them as [`SERVICE`].

use std::ffi::OsString;
use std::fs;
use std::time::{Duration, Instant};

use super::resp::{self, Value};
use super::{
    Binaries, ENV_SENTINEL_PRIMARY, ENV_SENTINEL_REPLICA, ENV_SENTINEL_SERVICE, ENV_SENTINEL_URLS,
    NotReady, RedisServer, check_all_running, wait_until,
};
use crate::Result;

/// The name the sentinels monitor the primary under (`SENTINEL get-master-addr-by-name`).
pub(crate) const SERVICE: &str = "distlimit";

/// Sentinels in the set.
const SENTINELS: usize = 3;

/// Sentinels that must agree the primary is down before a failover.
const QUORUM: usize = 2;

// A quorum of at most half the sentinels could let two sides of a split fail over at once.
const _: () = assert!(QUORUM > SENTINELS / 2 && QUORUM <= SENTINELS);

/// How long the whole set may take to be ready, from the first start to the last check.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The Sentinel set, torn down together on drop.
#[derive(Debug)]
pub(crate) struct Sentinel {
    /// The primary at startup (a test may fail it over).
    primary: RedisServer,
    /// The replica at startup.
    replica: RedisServer,
    /// The sentinels.
    sentinels: Vec<RedisServer>,
}

impl Sentinel {
    /// Starts the primary and its replica, waits until the replica is in sync, then starts three
    /// sentinels and waits until each one names the primary, knows the replica, and sees the
    /// two other sentinels, so `SENTINEL failover` works as soon as this returns.
    ///
    /// The replica is synced before the sentinels start so their first `INFO` of the primary
    /// lists it; otherwise they would learn of it only at the next `INFO`, 10 s later.
    pub(crate) fn start(bins: &Binaries) -> Result<Sentinel> {
        let start = Instant::now();
        let primary = RedisServer::start(&bins.server, "sentinel primary", &[])?;
        let primary_port = primary.port();
        let mut replica = RedisServer::start(
            &bins.server,
            "sentinel replica",
            &["--replicaof", "127.0.0.1", &primary_port.to_string()],
        )?;
        wait_until(READY_TIMEOUT, || {
            replica.check_running().map_err(|why| NotReady {
                why,
                server: None,
                fatal: true,
            })?;
            replica_in_sync(replica.port())
                .map_err(|why| NotReady::new(format!("replica {}: {why}", replica.addr())))
        })
        .map_err(|not_ready| format!("the replica is {}{}", not_ready.why, replica.log_tail()))?;

        let mut sentinels = Vec::with_capacity(SENTINELS);
        for _ in 0..SENTINELS {
            sentinels.push(RedisServer::start_with(
                &bins.server,
                "sentinel",
                |port, dir| {
                    // Sentinel rewrites its config file (its ID, the replicas and sentinels it
                    // found), so the file lives in the sentinel's own writable temp dir.
                    let config = dir.join("sentinel.conf");
                    fs::write(
                        &config,
                        config_file(port, &dir.display().to_string(), primary_port),
                    )?;
                    Ok(vec![config.into_os_string(), OsString::from("--sentinel")])
                },
            )?);
        }
        let mut set = Sentinel {
            primary,
            replica,
            sentinels,
        };
        let left = READY_TIMEOUT.saturating_sub(start.elapsed());
        wait_until(left, || set.check_ready()).map_err(|not_ready| {
            let log = not_ready
                .server
                .and_then(|i| set.sentinels.get(i))
                .map(RedisServer::log_tail)
                .unwrap_or_default();
            format!("the Sentinel set is {}{log}", not_ready.why)
        })?;
        Ok(set)
    }

    /// One look at every sentinel; the first thing missing is the complaint, blaming that
    /// sentinel (by its index in `sentinels`).
    fn check_ready(&mut self) -> Result<(), NotReady> {
        for server in [&mut self.primary, &mut self.replica] {
            server.check_running().map_err(|why| NotReady {
                why,
                server: None,
                fatal: true,
            })?;
        }
        check_all_running(&mut self.sentinels)?;
        for (i, sentinel) in self.sentinels.iter().enumerate() {
            check_sentinel(sentinel.port(), self.primary.port(), self.replica.port())
                .map_err(|why| NotReady::at(i, format!("sentinel {}: {why}", sentinel.addr())))?;
        }
        Ok(())
    }

    /// `primary ..., replica ..., sentinels ...`, for the startup line.
    pub(crate) fn describe(&self) -> String {
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
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        let urls: Vec<String> = self.sentinels.iter().map(RedisServer::url).collect();
        vec![
            (ENV_SENTINEL_URLS, urls.join(",")),
            (ENV_SENTINEL_SERVICE, SERVICE.to_owned()),
            (ENV_SENTINEL_PRIMARY, self.primary.addr()),
            (ENV_SENTINEL_REPLICA, self.replica.addr()),
        ]
    }

    /// Every server: sentinels first, so none of them sees the data nodes go and reacts.
    pub(crate) fn servers_mut(&mut self) -> impl Iterator<Item = &mut RedisServer> {
        self.sentinels
            .iter_mut()
            .chain([&mut self.primary, &mut self.replica])
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        // Signal every server first, so the waits in their drops overlap.
        for server in self.servers_mut() {
            server.kill();
        }
    }
}

/// The config file of the sentinel on `port`, keeping its state in `dir`, monitoring the primary
/// on `primary_port`.
fn config_file(port: u16, dir: &str, primary_port: u16) -> String {
    // `dir` is quoted: a temp dir path may contain spaces.
    let dir = format!("\"{}\"", dir.replace('\\', "\\\\").replace('"', "\\\""));
    format!(
        "port {port}\n\
         bind 127.0.0.1\n\
         dir {dir}\n\
         sentinel monitor {SERVICE} 127.0.0.1 {primary_port} {QUORUM}\n\
         sentinel down-after-milliseconds {SERVICE} 1000\n\
         sentinel failover-timeout {SERVICE} 5000\n\
         sentinel parallel-syncs {SERVICE} 1\n"
    )
}

/// Whether the replica on `port` has finished its initial sync (`master_link_status:up`).
fn replica_in_sync(port: u16) -> Result<(), String> {
    let info = resp::call_text(port, &["INFO", "replication"]).map_err(|e| format!("INFO: {e}"))?;
    match resp::info_field(&info, "master_link_status") {
        Some("up") => Ok(()),
        other => Err(format!(
            "master_link_status:{}",
            other.unwrap_or("(missing)")
        )),
    }
}

/// Whether the sentinel on `port` names `primary` as the primary of [`SERVICE`], sees it up,
/// knows `replica` as a healthy replica, and knows the other sentinels.
fn check_sentinel(port: u16, primary: u16, replica: u16) -> Result<(), String> {
    let call =
        |args: &[&str]| resp::call(port, args).map_err(|err| format!("{}: {err}", args.join(" ")));

    let addr = call(&["SENTINEL", "get-master-addr-by-name", SERVICE])?;
    let named: Vec<String> = addr
        .array()
        .unwrap_or_default()
        .iter()
        .filter_map(|v| v.text().map(|t| t.into_owned()))
        .collect();
    if named != ["127.0.0.1".to_owned(), primary.to_string()] {
        return Err(format!(
            "get-master-addr-by-name {SERVICE} answers {addr:?}, waiting for 127.0.0.1:{primary}"
        ));
    }

    let master = call(&["SENTINEL", "master", SERVICE])?;
    let flags = master.field("flags").unwrap_or_default();
    if flags != "master" {
        return Err(format!("primary flags `{flags}`, waiting for `master`"));
    }

    let others = call(&["SENTINEL", "sentinels", SERVICE])?;
    let known = others.array().map_or(0, <[Value]>::len);
    if known != SENTINELS - 1 {
        return Err(format!(
            "knows {known} other sentinels, waiting for {}",
            SENTINELS - 1
        ));
    }

    let replicas = call(&["SENTINEL", "replicas", SERVICE])?;
    let healthy = replicas.array().unwrap_or_default().iter().any(|r| {
        r.field("port") == Some(replica.to_string())
            && r.field("flags").as_deref() == Some("slave")
            && r.field("master-link-status").as_deref() == Some("ok")
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
        let config = config_file(41001, "/tmp/a \"b\"", 41000);
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
