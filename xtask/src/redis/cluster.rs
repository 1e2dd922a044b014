//! A 6-node Redis Cluster (3 primaries, 3 replicas) on loopback ports.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use super::resp::{self, Value};
use super::{Binaries, NotReady, RedisServer, check_all_running, output_within, wait_until};
use crate::Result;

/// Nodes in the cluster.
const NODES: usize = 6;

/// Replicas per primary (`--cluster-replicas`), so `NODES / (REPLICAS + 1)` primaries.
const REPLICAS: usize = 1;

/// Hash slots of a Redis Cluster; all must be served.
const SLOTS: &str = "16384";

/// `--cluster-node-timeout` in milliseconds: how long a node may be unreachable before it counts
/// as failing. Short, so failover tests do not wait long; long enough that a busy machine does
/// not trigger failovers by itself.
const NODE_TIMEOUT_MS: &str = "2000";

/// How long `redis-cli --cluster create` may take.
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the cluster may take to be usable after `create`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The cluster: its nodes, torn down together on drop.
#[derive(Debug)]
pub(crate) struct Cluster {
    /// All nodes, in the order given to `--cluster create` (which makes the first three the
    /// primaries, though failovers in the tests may change that).
    nodes: Vec<RedisServer>,
}

impl Cluster {
    /// Starts six nodes, joins them with `redis-cli --cluster create`, and waits until the
    /// cluster is usable: every node reports `cluster_state:ok` and knows all six nodes, every
    /// replica's link to its primary is up, and a write succeeds on every primary.
    ///
    /// One node reporting `ok` is not enough: the first commands would still see `CLUSTERDOWN`.
    pub(crate) fn start(bins: &Binaries) -> Result<Cluster> {
        let mut nodes = Vec::with_capacity(NODES);
        for _ in 0..NODES {
            nodes.push(RedisServer::start_with(
                &bins.server,
                "cluster node",
                |port, _| {
                    Ok([
                        "--cluster-enabled",
                        "yes",
                        // Relative to `--dir`, the node's own temp dir.
                        "--cluster-config-file",
                        &format!("nodes-{port}.conf"),
                        "--cluster-node-timeout",
                        NODE_TIMEOUT_MS,
                    ]
                    .map(Into::into)
                    .to_vec())
                },
            )?);
        }
        let mut cluster = Cluster { nodes };
        cluster.create(bins)?;
        cluster.wait_ready()?;
        Ok(cluster)
    }

    /// `redis-cli --cluster create <all nodes> --cluster-replicas 1 --cluster-yes`.
    fn create(&self, bins: &Binaries) -> Result<()> {
        let mut command = Command::new(&bins.cli);
        command
            .args(["--cluster", "create"])
            .args(self.nodes.iter().map(RedisServer::addr))
            .args(["--cluster-replicas", &REPLICAS.to_string(), "--cluster-yes"]);
        let (status, output) = output_within(command, &["redis", "--cluster"], CREATE_TIMEOUT)?;
        let failure = match status {
            Some(status) if status.success() => return Ok(()),
            Some(status) => format!("failed ({status})"),
            None => format!("did not finish within {}s", CREATE_TIMEOUT.as_secs()),
        };
        let mut message = format!(
            "`{} --cluster create ...` {failure}; its output:\n{}",
            bins.cli.display(),
            super::indent(&super::tail(&output, super::LOG_TAIL_LINES))
        );
        if let Some(node) = self.nodes.first() {
            message.push_str(&node.log_tail());
        }
        Err(message.into())
    }

    /// Waits (at most [`READY_TIMEOUT`]) until [`check_ready`](Cluster::check_ready) passes.
    fn wait_ready(&mut self) -> Result<()> {
        wait_until(READY_TIMEOUT, || self.check_ready()).map_err(|not_ready| {
            let log = not_ready
                .server
                .and_then(|i| self.nodes.get(i))
                .map(RedisServer::log_tail)
                .unwrap_or_default();
            format!("the cluster is {}{log}", not_ready.why).into()
        })
    }

    /// One look at every node, then probe writes; the first thing missing is the complaint.
    fn check_ready(&mut self) -> Result<(), NotReady> {
        check_all_running(&mut self.nodes)?;
        let mut primaries = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let port = node.port();
            let at = |why: String| NotReady::at(i, format!("node {}: {why}", node.addr()));
            let info = resp::call_text(port, &["CLUSTER", "INFO"])
                .map_err(|err| at(format!("CLUSTER INFO: {err}")))?;
            for (field, wanted) in [
                ("cluster_state", "ok"),
                ("cluster_slots_ok", SLOTS),
                ("cluster_known_nodes", &NODES.to_string()),
            ] {
                let value = resp::info_field(&info, field).unwrap_or("(missing)");
                if value != wanted {
                    return Err(at(format!("{field}:{value}, waiting for {wanted}")));
                }
            }
            let replication = resp::call_text(port, &["INFO", "replication"])
                .map_err(|err| at(format!("INFO replication: {err}")))?;
            match resp::info_field(&replication, "role") {
                Some("master") => primaries.push(port),
                Some("slave") => {
                    let link = resp::info_field(&replication, "master_link_status");
                    if link != Some("up") {
                        return Err(at(format!(
                            "replica with master_link_status:{}",
                            link.unwrap_or("(missing)")
                        )));
                    }
                }
                role => return Err(at(format!("role:{}", role.unwrap_or("(missing)")))),
            }
        }
        let wanted = NODES / (REPLICAS + 1);
        if primaries.len() != wanted {
            return Err(NotReady::new(format!(
                "{} primaries ({primaries:?}), waiting for {wanted}",
                primaries.len()
            )));
        }
        self.probe_writes(primaries.len())
    }

    /// Writes (then deletes) keys through the first node, following `MOVED`, until every one of
    /// the `primaries` has accepted a write.
    fn probe_writes(&self, primaries: usize) -> Result<(), NotReady> {
        let entry = self.nodes.first().map_or(0, RedisServer::port);
        let mut accepted = BTreeSet::new();
        // Each key lands on a primary at random (by its hash slot); 256 keys miss one of three
        // primaries with probability about 3 * (2/3)^256, i.e. never.
        for i in 0..256 {
            if accepted.len() == primaries {
                return Ok(());
            }
            let key = format!("{{xtask-probe-{i}}}");
            accepted.insert(set_through_cluster(entry, &key).map_err(NotReady::new)?);
        }
        Err(NotReady::new(format!(
            "only the primaries on ports {accepted:?} accepted probe writes"
        )))
    }

    /// `127.0.0.1:p1,...,p6 (3 primaries, 3 replicas)`, for the startup line.
    pub(crate) fn describe(&self) -> String {
        let ports: Vec<String> = self.nodes.iter().map(|n| n.port().to_string()).collect();
        format!(
            "{} nodes on 127.0.0.1:{} ({} primaries with {REPLICAS} replica each)",
            self.nodes.len(),
            ports.join(","),
            NODES / (REPLICAS + 1)
        )
    }

    /// `redis://127.0.0.1:p1,redis://127.0.0.1:p2,...`: every node, for [`super::ENV_CLUSTER_URLS`].
    pub(crate) fn urls(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(RedisServer::url).collect();
        urls.join(",")
    }

    /// Every node.
    pub(crate) fn servers_mut(&mut self) -> impl Iterator<Item = &mut RedisServer> {
        self.nodes.iter_mut()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Signal every node first, so the waits in the nodes' drops overlap.
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

/// `SET key 1 PX 60000` sent to 127.0.0.1:`port`, following up to 3 `MOVED` redirects; returns
/// the port of the node that stored it, after deleting the key there again. The expiry removes
/// the key even if the `DEL` is lost.
fn set_through_cluster(mut port: u16, key: &str) -> Result<u16, String> {
    for _ in 0..4 {
        match resp::call(port, &["SET", key, "1", "PX", "60000"]) {
            Ok(Value::Simple(ok)) if ok == "OK" => {
                let _ = resp::call(port, &["DEL", key]);
                return Ok(port);
            }
            Ok(Value::Error(err)) => match resp::redirect_port(&err) {
                Some(next) => port = next,
                None => return Err(format!("probe write SET {key} on port {port}: {err}")),
            },
            Ok(other) => return Err(format!("probe write SET {key} on port {port}: {other:?}")),
            Err(err) => return Err(format!("probe write SET {key} on port {port}: {err}")),
        }
    }
    Err(format!("probe write SET {key}: too many redirects"))
}
