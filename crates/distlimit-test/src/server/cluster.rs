//! A 6-node Redis Cluster (3 primaries, 3 replicas) on loopback ports.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::{NotReady, RedisServer, check_all_running, info_field, tool_bin, wait_until};

/// Nodes in the cluster.
const NODES: usize = 6;
/// Replicas per primary (`--cluster-replicas`).
const REPLICAS: usize = 1;
/// Hash slots of a Redis Cluster; all must be served.
const SLOTS: &str = "16384";
/// `--cluster-node-timeout` in milliseconds: short, so failover tests do not wait long; long
/// enough that a busy machine does not trigger failovers by itself.
const NODE_TIMEOUT_MS: &str = "2000";
/// How long `redis-cli --cluster create` may take.
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the cluster may take to be usable after `create`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The cluster's nodes, torn down together on drop.
#[derive(Debug)]
pub struct Cluster {
    /// In the order given to `--cluster create` (the first three start as primaries).
    nodes: Vec<RedisServer>,
}

impl Cluster {
    /// Starts six nodes, joins them with `redis-cli --cluster create` (`redis-cli` next to `bin`,
    /// else on the `PATH`), and waits until the cluster is usable: every node reports
    /// `cluster_state:ok` with all slots and all six nodes known, every replica's link to its
    /// primary is up, and a write succeeds on every primary.
    ///
    /// One node reporting `ok` is not enough: the first commands would still see `CLUSTERDOWN`.
    pub fn start(bin: &Path) -> Result<Self, String> {
        let cli = tool_bin(bin, "redis-cli").ok_or_else(|| {
            format!(
                "`redis-cli` is neither next to {} nor on the PATH; it comes with Redis (the \
                 Debian/Ubuntu package is `redis-tools`, a dependency of `redis-server`)",
                bin.display()
            )
        })?;
        let mut nodes = Vec::with_capacity(NODES);
        for _ in 0..NODES {
            nodes.push(RedisServer::spawn(bin, "cluster node", |port, _| {
                Ok([
                    "--cluster-enabled",
                    "yes",
                    // Relative to `--dir`, the node's own directory.
                    "--cluster-config-file",
                    &format!("nodes-{port}.conf"),
                    "--cluster-node-timeout",
                    NODE_TIMEOUT_MS,
                ]
                .map(OsString::from)
                .to_vec())
            })?);
        }
        let mut cluster = Self { nodes };
        cluster.create(&cli)?;
        wait_until(READY_TIMEOUT, || cluster.check_ready()).map_err(|n| {
            let log = n.server.and_then(|i| cluster.nodes.get(i));
            let log = log.map(RedisServer::log_tail).unwrap_or_default();
            format!("the cluster is {}{log}", n.why)
        })?;
        Ok(cluster)
    }

    /// `redis-cli --cluster create <all nodes> --cluster-replicas 1 --cluster-yes`, killed (by
    /// its PID) if it takes longer than [`CREATE_TIMEOUT`].
    fn create(&self, cli: &Path) -> Result<(), String> {
        let mut child = Command::new(cli)
            .args(["--cluster", "create"])
            .args(self.nodes.iter().map(RedisServer::addr))
            .args(["--cluster-replicas", &REPLICAS.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("could not start {}: {e}", cli.display()))?;
        // Read on a thread, so a full pipe can never block the child while we wait on it.
        let stdout = child.stdout.take();
        let reader = thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut out) = stdout {
                let _ = out.read_to_string(&mut text);
            }
            text
        });
        let deadline = Instant::now() + CREATE_TIMEOUT;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let output = reader.join().unwrap_or_default();
        let failure = match status {
            Some(status) if status.success() => return Ok(()),
            Some(status) => format!("failed ({status})"),
            None => format!("did not finish within {CREATE_TIMEOUT:?}"),
        };
        let log = self
            .nodes
            .first()
            .map(RedisServer::log_tail)
            .unwrap_or_default();
        Err(format!(
            "`{} --cluster create ...` {failure}; its output:\n{output}{log}",
            cli.display()
        ))
    }

    /// One look at every node, then probe writes; the first thing missing is the complaint.
    fn check_ready(&mut self) -> Result<(), NotReady> {
        check_all_running(&mut self.nodes)?;
        let mut primaries = 0;
        for (i, node) in self.nodes.iter().enumerate() {
            let at = |why: String| NotReady::at(i, format!("node {}: {why}", node.addr()));
            let info: String = node.query(redis::cmd("CLUSTER").arg("INFO")).map_err(at)?;
            for (field, wanted) in [
                ("cluster_state", "ok"),
                ("cluster_slots_ok", SLOTS),
                ("cluster_known_nodes", &NODES.to_string()),
            ] {
                let value = info_field(&info, field).unwrap_or("(missing)");
                if value != wanted {
                    return Err(at(format!("{field}:{value}, waiting for {wanted}")));
                }
            }
            let replication = node.info("replication").map_err(at)?;
            match info_field(&replication, "role") {
                Some("master") => primaries += 1,
                Some("slave") => match info_field(&replication, "master_link_status") {
                    Some("up") => {}
                    link => {
                        let link = link.unwrap_or("(missing)");
                        return Err(at(format!("replica with master_link_status:{link}")));
                    }
                },
                role => return Err(at(format!("role:{}", role.unwrap_or("(missing)")))),
            }
        }
        let wanted = NODES / (REPLICAS + 1);
        if primaries != wanted {
            return Err(NotReady::new(format!(
                "{primaries} primaries, waiting for {wanted}"
            )));
        }
        // Probe writes (then deletes) through the first node, following `MOVED`, until every
        // primary has accepted one.
        let mut accepted = BTreeSet::new();
        // Each key lands on a primary by its hash slot; 256 keys miss one of three primaries
        // with probability about 3 * (2/3)^256, i.e. never.
        for i in 0..256 {
            if accepted.len() == primaries {
                return Ok(());
            }
            let key = format!("{{distlimit-probe-{i}}}");
            accepted.insert(self.set_through_cluster(&key).map_err(NotReady::new)?);
        }
        Err(NotReady::new(format!(
            "only the primaries on ports {accepted:?} accepted probe writes"
        )))
    }

    /// `SET key 1 PX 60000` through the first node, following up to 3 `MOVED` redirects;
    /// returns the port of the node that stored it, after deleting the key there again (the
    /// expiry removes it if the `DEL` is lost).
    fn set_through_cluster(&self, key: &str) -> Result<u16, String> {
        let mut port = self.nodes.first().map_or(0, RedisServer::port);
        for _ in 0..4 {
            let node = self.nodes.iter().find(|n| n.port() == port);
            let node = node.ok_or_else(|| format!("redirected to an unknown port {port}"))?;
            let mut conn = node.connection()?;
            let set = redis::cmd("SET")
                .arg(&[key, "1", "PX", "60000"])
                .query::<()>(&mut conn);
            match set {
                Ok(()) => {
                    let _ = redis::cmd("DEL").arg(key).query::<i64>(&mut conn);
                    return Ok(port);
                }
                Err(e) => {
                    // `MOVED <slot> 127.0.0.1:<port>`.
                    let next = e.redirect_node().and_then(|(addr, _)| {
                        addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok())
                    });
                    match next {
                        Some(next) => port = next,
                        None => return Err(format!("probe write SET {key} on port {port}: {e}")),
                    }
                }
            }
        }
        Err(format!("probe write SET {key}: too many redirects"))
    }

    /// The nodes, in the order of `--cluster create`.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes, to fault: a [`kill`](RedisServer::kill)ed primary is replaced by its replica
    /// after `cluster-node-timeout` (2 s here); a [`restart`](RedisServer::restart)ed node
    /// keeps its node id (its `nodes-<port>.conf` stays in its directory) and rejoins, a killed
    /// primary as a replica of the one that replaced it.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// The index in [`nodes`](Self::nodes) of the primary serving `slot`, and of its replicas,
    /// as the first node that answers sees them (`CLUSTER NODES`; nodes flagged `fail` left out,
    /// nodes only suspected, `fail?`, kept).
    pub fn shard_of(&self, slot: u16) -> Result<(usize, Vec<usize>), String> {
        let mut last = String::from("no node is running");
        for node in self.nodes.iter().filter(|n| n.pid().is_some()) {
            match node.query::<String>(redis::cmd("CLUSTER").arg("NODES")) {
                Ok(text) => {
                    let ports: Vec<u16> = self.nodes.iter().map(RedisServer::port).collect();
                    return parse_shard(&text, slot, &ports);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// `6 nodes on 127.0.0.1:p1,...,p6 (3 primaries with 1 replica each)`.
    pub fn describe(&self) -> String {
        let ports: Vec<String> = self.nodes.iter().map(|n| n.port().to_string()).collect();
        format!(
            "{} nodes on 127.0.0.1:{} ({} primaries with {REPLICAS} replica each)",
            self.nodes.len(),
            ports.join(","),
            NODES / (REPLICAS + 1)
        )
    }

    /// `redis://127.0.0.1:p1,redis://127.0.0.1:p2,...`: every node.
    pub fn urls(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(RedisServer::url).collect();
        urls.join(",")
    }
}

/// [`Cluster::shard_of`] from the text of `CLUSTER NODES`, nodes named by their index in
/// `ports`.
fn parse_shard(text: &str, slot: u16, ports: &[u16]) -> Result<(usize, Vec<usize>), String> {
    // `<id> <ip:port@bus> <flags> <primary id or -> <ping> <pong> <epoch> <link> <slots>...`
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| {
            f.len() >= 8
                && !f[2]
                    .split(',')
                    .any(|flag| flag == "fail" || flag == "noaddr")
        })
        .collect();
    let index = |fields: &[&str]| {
        let port = fields[1]
            .split('@')
            .next()
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(_, p)| p.parse::<u16>().ok());
        ports.iter().position(|&p| Some(p) == port)
    };
    let serves = |fields: &[&str]| {
        fields[8..].iter().any(|range| {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
        })
    };
    let primary = lines
        .iter()
        .find(|f| f[2].split(',').any(|flag| flag == "master") && serves(f))
        .ok_or_else(|| format!("no running primary serves slot {slot}:\n{text}"))?;
    let primary_index = index(primary).ok_or_else(|| format!("unknown node {}", primary[1]))?;
    let replicas = lines
        .iter()
        .filter(|f| f[3] == primary[0])
        .filter_map(|f| index(f))
        .collect();
    Ok((primary_index, replicas))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `CLUSTER NODES` of a 6-node Cluster whose first primary failed over to its replica
    /// (ports 7000 to 7005; 7000 failed, 7003 took over, 7004 only suspected).
    const NODES_TEXT: &str = "\
a0 127.0.0.1:7000@17000 master,fail - 0 0 1 disconnected
b1 127.0.0.1:7001@17001 myself,master - 0 0 2 connected 5461-10922
c2 127.0.0.1:7002@17002 master - 0 0 3 connected 10923-16383
d3 127.0.0.1:7003@17003 master - 0 0 7 connected 0-5460
e4 127.0.0.1:7004@17004 slave,fail? b1 0 0 2 connected
f5 127.0.0.1:7005@17005 slave c2 0 0 3 connected
";

    #[test]
    fn shards_follow_the_slots_and_leave_failed_nodes_out() {
        let ports = [7000, 7001, 7002, 7003, 7004, 7005];
        assert_eq!(parse_shard(NODES_TEXT, 0, &ports), Ok((3, vec![])));
        assert_eq!(parse_shard(NODES_TEXT, 5461, &ports), Ok((1, vec![4])));
        assert_eq!(parse_shard(NODES_TEXT, 16383, &ports), Ok((2, vec![5])));
        assert!(parse_shard(NODES_TEXT, 0, &ports[1..3]).is_err());
        assert!(parse_shard("", 0, &ports).is_err());
    }
}
