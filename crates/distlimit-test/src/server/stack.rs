//! [`Stack`]: the setups the Redis tests need, started together, and the variables that say
//! where they are.

use std::path::{Path, PathBuf};
use std::thread;
use std::time::Instant;

use super::{
    Cluster, ENV_CLI_BIN, ENV_CLUSTER_URLS, ENV_REQUIRE, ENV_SERVER_BIN, ENV_URL, RedisServer,
    Sentinel, tool_bin,
};

/// Which setups a [`Stack`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setups {
    /// One standalone server ([`ENV_URL`]).
    pub standalone: bool,
    /// A primary, a replica and three sentinels ([`Sentinel`]).
    pub sentinel: bool,
    /// Six cluster nodes ([`Cluster`]).
    pub cluster: bool,
}

impl Setups {
    /// All three: what `cargo xtask test` and `redis-up` start.
    pub const ALL: Self = Self {
        standalone: true,
        sentinel: true,
        cluster: true,
    };

    /// The Cluster alone: what `cargo xtask test-cluster` starts.
    pub const CLUSTER: Self = Self {
        standalone: false,
        sentinel: false,
        cluster: true,
    };
}

/// Running setups, stopped together on drop (sentinels before the servers they watch).
#[derive(Debug)]
pub struct Stack {
    bin: PathBuf,
    sentinel: Option<Sentinel>,
    standalone: Option<RedisServer>,
    cluster: Option<Cluster>,
    /// One line per setup: what it is and how long it took to be ready.
    started: Vec<String>,
}

impl Stack {
    /// Starts `setups` with the `redis-server` at `bin` (`redis-cli` next to it, else on the
    /// `PATH`). The Sentinel set and the Cluster start in parallel, since both mostly wait for
    /// gossip. An error names the setup that failed; what did start is stopped again.
    pub fn start(setups: Setups, bin: &Path) -> Result<Self, String> {
        let (standalone, sentinel, cluster) = thread::scope(|scope| {
            let sentinel = setups.sentinel.then(|| {
                scope.spawn(|| timed("sentinel", Sentinel::describe, || Sentinel::start(bin)))
            });
            let cluster = setups.cluster.then(|| {
                scope.spawn(|| timed("cluster", Cluster::describe, || Cluster::start(bin)))
            });
            let standalone = setups.standalone.then(|| {
                timed("standalone", RedisServer::name, || {
                    RedisServer::spawn(bin, "standalone", |_, _| Ok(Vec::new()))
                })
            });
            (standalone, join(sentinel), join(cluster))
        });
        // On an error, whatever did start is dropped here, which stops it.
        let mut started = Vec::new();
        let standalone = take(standalone, &mut started);
        let sentinel = take(sentinel, &mut started);
        let cluster = take(cluster, &mut started);
        Ok(Self {
            bin: bin.to_owned(),
            standalone: standalone?,
            sentinel: sentinel?,
            cluster: cluster?,
            started,
        })
    }

    /// One line per setup: its servers and how long it took to be ready.
    pub fn describe(&self) -> &[String] {
        &self.started
    }

    /// How many servers run.
    pub fn server_count(&self) -> usize {
        usize::from(self.standalone.is_some())
            // The sentinels, the primary and the replica.
            + self.sentinel.as_ref().map_or(0, |s| s.sentinels().len() + 2)
            + self.cluster.as_ref().map_or(0, |c| c.nodes().len())
    }

    /// The variables that tell the tests where the servers are, `DISTLIMIT_REQUIRE_REDIS=1`
    /// and the binaries included.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut vars = vec![
            (ENV_REQUIRE, "1".to_owned()),
            (ENV_SERVER_BIN, self.bin.display().to_string()),
        ];
        if let Some(cli) = tool_bin(&self.bin, "redis-cli") {
            vars.push((ENV_CLI_BIN, cli.display().to_string()));
        }
        if let Some(server) = &self.standalone {
            vars.push((ENV_URL, server.url()));
        }
        if let Some(sentinel) = &self.sentinel {
            vars.extend(sentinel.env());
        }
        if let Some(cluster) = &self.cluster {
            vars.push((ENV_CLUSTER_URLS, cluster.urls()));
        }
        vars.into_iter()
            .map(|(key, value)| (key.to_owned(), value))
            .collect()
    }
}

/// The result of a setup thread.
fn join<T>(handle: Option<thread::ScopedJoinHandle<'_, Setup<T>>>) -> Option<Setup<T>> {
    handle.map(|h| {
        h.join()
            .unwrap_or_else(|_| Err("the setup thread panicked".to_owned()))
    })
}

/// A started setup with its description line, or why it did not start.
type Setup<T> = Result<(T, String), String>;

/// The setup of `result`, its line added to `started`.
fn take<T>(result: Option<Setup<T>>, started: &mut Vec<String>) -> Result<Option<T>, String> {
    result
        .map(|setup| {
            let (setup, line) = setup?;
            started.push(line);
            Ok(setup)
        })
        .transpose()
}

/// Runs `start` for the setup `name`; on success also a line with what it started (`describe`)
/// and how long it took, on failure the error prefixed with the setup's name.
fn timed<T>(
    name: &str,
    describe: fn(&T) -> String,
    start: impl FnOnce() -> Result<T, String>,
) -> Setup<T> {
    let began = Instant::now();
    match start() {
        Ok(setup) => {
            let line = format!("{name}: {} up in {:.1?}", describe(&setup), began.elapsed());
            Ok((setup, line))
        }
        Err(why) => Err(format!(
            "starting the Redis {name} setup failed after {:.1?}: {why}",
            began.elapsed()
        )),
    }
}
