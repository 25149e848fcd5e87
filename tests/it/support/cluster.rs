//! Real Redis topologies from the installed binaries: a 3-primary + 3-replica Cluster
//! (`redis-cli --cluster create`) and a primary + replica watched by 3 sentinels. Every process
//! gets its own ephemeral ports and temp dir, and is killed on drop; logs are printed when the test
//! failed.

use super::{free_port, wait_for};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tempfile::TempDir;

/// One redis-server (or sentinel) process on a TCP port.
pub struct Node {
    pub port: u16,
    child: Option<Child>,
    log: PathBuf,
}

impl Node {
    fn spawn(dir: &TempDir, name: &str, args: &[String]) -> Node {
        let port = free_port();
        let log = dir.path().join(format!("{name}-{port}.log"));
        let mut cmd = Command::new("redis-server");
        cmd.args(args.iter().map(|a| a.replace("{port}", &port.to_string())))
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir.path())
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().expect("spawn redis-server");
        let mut node = Node {
            port,
            child: Some(child),
            log,
        };
        wait_for(
            "a redis node to answer PING",
            Duration::from_secs(10),
            || {
                if let Some(status) = node
                    .child
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten())
                {
                    panic!(
                        "redis node {port} exited with {status}:\n{}",
                        node.log_text()
                    );
                }
                node.try_cmd::<String>(&["PING"]).ok()
            },
        );
        node
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn try_cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        let mut c =
            redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(2))?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut c)
    }

    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("redis {} {args:?}: {e}", self.port))
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn is_alive(&self) -> bool {
        self.child.is_some()
    }

    /// `calls` per command from INFO commandstats.
    pub fn commandstats(&self) -> BTreeMap<String, u64> {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(":calls="))
            .filter_map(|(name, rest)| {
                Some((name.to_string(), rest.split(',').next()?.parse().ok()?))
            })
            .collect()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- redis {} log ---\n{}", self.port, self.log_text());
        }
        self.kill();
    }
}

/// A Redis Cluster of three primaries, each with one replica. Nodes notice a dead peer after one
/// second (`cluster-node-timeout`), so a failover takes a couple of seconds.
pub struct Cluster {
    pub nodes: Vec<Node>,
    _dir: TempDir,
}

impl Cluster {
    pub fn start() -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let nodes: Vec<Node> = (0..6)
            .map(|i| {
                // The bus port is chosen too: port + 10000 may be taken, or beyond 65535.
                let bus = free_port().to_string();
                let args = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &bus,
                    "--cluster-node-timeout",
                    "1000",
                    // A replica whose primary just died may always take over: the default refuses
                    // a replica that has been out of touch "too long", measured in node timeouts.
                    "--cluster-replica-validity-factor",
                    "0",
                    "--cluster-config-file",
                    &format!("nodes-{i}-{{port}}.conf"),
                ]
                .map(String::from);
                Node::spawn(&dir, "cluster", &args)
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Cluster { nodes, _dir: dir };
        cluster.wait_healthy();
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.is_alive())
            .map(Node::url)
            .collect()
    }

    /// Every live node agrees the cluster is ok and knows every slot's owner.
    pub fn wait_healthy(&self) {
        wait_for(
            "cluster_state:ok on every node",
            Duration::from_secs(30),
            || self.is_healthy().then_some(()),
        );
    }

    /// Every live node says `cluster_state:ok`.
    pub fn is_healthy(&self) -> bool {
        self.nodes.iter().filter(|n| n.is_alive()).all(|n| {
            n.try_cmd::<String>(&["CLUSTER", "INFO"])
                .is_ok_and(|i| i.contains("cluster_state:ok"))
        })
    }

    /// The node that currently serves `slot` as a primary.
    pub fn primary_of(&self, slot: u16) -> usize {
        let any = self
            .nodes
            .iter()
            .find(|n| n.is_alive())
            .expect("a live node");
        let shards: redis::Value = any.cmd(&["CLUSTER", "SLOTS"]);
        let redis::Value::Array(ranges) = shards else {
            panic!("CLUSTER SLOTS: {shards:?}")
        };
        for range in ranges {
            let redis::Value::Array(r) = range else {
                continue;
            };
            let (
                Some(redis::Value::Int(lo)),
                Some(redis::Value::Int(hi)),
                Some(redis::Value::Array(primary)),
            ) = (r.first(), r.get(1), r.get(2))
            else {
                continue;
            };
            if (*lo..=*hi).contains(&i64::from(slot)) {
                let Some(redis::Value::Int(port)) = primary.get(1) else {
                    continue;
                };
                return self
                    .nodes
                    .iter()
                    .position(|n| i64::from(n.port) == *port)
                    .expect("the primary is one of ours");
            }
        }
        panic!("no primary serves slot {slot}");
    }

    /// Whether node `i` is alive and a primary.
    pub fn primary_of_node(&self, i: usize) -> bool {
        let role = self.nodes[i].try_cmd::<Vec<redis::Value>>(&["ROLE"]);
        let first = role.ok().and_then(|r| r.into_iter().next());
        first.is_some_and(|v| redis::from_redis_value::<String>(v).is_ok_and(|r| r == "master"))
    }

    pub fn node_id(&self, i: usize) -> String {
        let id: String = self.nodes[i].cmd(&["CLUSTER", "MYID"]);
        id
    }

    /// Moves `slot` from its primary to another primary the way `redis-cli --cluster reshard`
    /// does: IMPORTING/MIGRATING, MIGRATE its keys, then SETSLOT NODE everywhere. Clients see ASK
    /// during the move and MOVED after it.
    pub fn move_slot(&self, slot: u16, to: usize) {
        let from = self.primary_of(slot);
        assert_ne!(from, to);
        let (src, dst) = (&self.nodes[from], &self.nodes[to]);
        let (src_id, dst_id) = (self.node_id(from), self.node_id(to));
        let s = slot.to_string();
        let _: () = dst.cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &src_id]);
        let _: () = src.cmd(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst_id]);
        loop {
            let keys: Vec<String> = src.cmd(&["CLUSTER", "GETKEYSINSLOT", &s, "100"]);
            if keys.is_empty() {
                break;
            }
            let port = dst.port.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            let _: String = src.cmd(&args);
        }
        for n in self.nodes.iter().filter(|n| n.is_alive()) {
            // Replicas refuse SETSLOT; primaries must all learn the new owner.
            let _ = n.try_cmd::<()>(&["CLUSTER", "SETSLOT", &s, "NODE", &dst_id]);
        }
    }
}

/// A primary and a replica, watched by three sentinels under the name `mymaster` (quorum 2, down
/// after one second).
pub struct Sentinels {
    pub primary: Node,
    pub replica: Node,
    pub sentinels: Vec<Node>,
    _dir: TempDir,
}

impl Sentinels {
    pub const MASTER: &'static str = "mymaster";

    pub fn start() -> Sentinels {
        let dir = tempfile::tempdir().expect("temp dir");
        let primary = Node::spawn(&dir, "primary", &[]);
        let replica = Node::spawn(
            &dir,
            "replica",
            &["--replicaof".into(), format!("127.0.0.1 {}", primary.port)],
        );
        let sentinels = (0..3)
            .map(|i| {
                let conf = dir.path().join(format!("sentinel-{i}.conf"));
                std::fs::write(
                    &conf,
                    format!(
                        "sentinel monitor {m} 127.0.0.1 {p} 2\nsentinel down-after-milliseconds {m} 1000\n\
                         sentinel failover-timeout {m} 5000\nsentinel parallel-syncs {m} 1\n",
                        m = Self::MASTER,
                        p = primary.port
                    ),
                )
                .expect("sentinel conf");
                Node::spawn(&dir, "sentinel", &[conf.display().to_string(), "--sentinel".into()])
            })
            .collect();
        let s = Sentinels {
            primary,
            replica,
            sentinels,
            _dir: dir,
        };
        wait_for("the replica to sync", Duration::from_secs(20), || {
            s.replica
                .try_cmd::<String>(&["INFO", "replication"])
                .is_ok_and(|i| i.contains("master_link_status:up"))
                .then_some(())
        });
        wait_for(
            "every sentinel to see the replica and each other",
            Duration::from_secs(20),
            || {
                s.sentinels
                    .iter()
                    .all(|n| {
                        n.try_cmd::<Vec<redis::Value>>(&["SENTINEL", "REPLICAS", Self::MASTER])
                            .is_ok_and(|r| !r.is_empty())
                            && n.try_cmd::<Vec<redis::Value>>(&[
                                "SENTINEL",
                                "SENTINELS",
                                Self::MASTER,
                            ])
                            .is_ok_and(|r| r.len() == 2)
                    })
                    .then_some(())
            },
        );
        s
    }

    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Node::url).collect()
    }

    /// The port the sentinels currently name as primary.
    pub fn primary_port(&self) -> Option<u16> {
        let addr: Vec<String> = self.sentinels[0]
            .try_cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", Self::MASTER])
            .ok()?;
        addr.get(1)?.parse().ok()
    }
}
