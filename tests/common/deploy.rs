//! Real Redis deployments for tests, on free ports: a 3-master Redis Cluster, and a primary with a
//! replica under three Sentinels.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::redis::{RedisServer, Resp};
use super::{free_port, wait_until, TempDir};

/// Three `redis-server --cluster-enabled yes` masters joined by `redis-cli --cluster create`.
/// `cluster-require-full-coverage no`: while one master is down, the other two keep serving
/// their slots.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

const CLUSTER_ARGS: [&str; 12] = [
    // Every command goes to the slow log with its arguments: tests read it back to check that
    // each script call's keys share one slot.
    "--slowlog-log-slower-than",
    "0",
    "--slowlog-max-len",
    "1000000",
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "1000",
    "--cluster-require-full-coverage",
    "no",
];

/// A free port for a cluster node: its cluster bus listens on port + 10000, which must exist
/// and be free too (the kernel's ephemeral ports reach 60999).
fn cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port <= 55_535 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(&[])
    }

    /// With an append-only file on every node: a restarted master comes back with its keys.
    pub fn start_persistent() -> RedisCluster {
        RedisCluster::start_with(&["--appendonly", "yes", "--appendfsync", "everysec"])
    }

    fn start_with(more: &[&str]) -> RedisCluster {
        let args: Vec<&str> = CLUSTER_ARGS.iter().chain(more).copied().collect();
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_on(cluster_port(), &args))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli must be installed (apt-get install redis-tools)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok();
        cluster
    }

    /// Until every running node reports `cluster_state:ok` and knows all three masters.
    pub fn wait_ok(&self) {
        assert!(
            wait_until(Duration::from_secs(20), || self.nodes.iter().all(|n| {
                n.pid().is_none() || {
                    let info = n.cmd(&["CLUSTER", "INFO"]).as_str().unwrap_or_default();
                    info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
                }
            })),
            "the cluster did not reach cluster_state:ok"
        );
    }

    pub fn url(&self) -> String {
        let mut url = format!("redis-cluster://127.0.0.1:{}", self.nodes[0].port);
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            url.push(if i == 1 { '?' } else { '&' });
            url.push_str(&format!("node=127.0.0.1:{}", n.port));
        }
        url
    }

    /// The hash slot of `key` (asked of a node: the server's own CRC16).
    pub fn keyslot(&self, key: &str) -> i64 {
        self.any_node().cmd(&["CLUSTER", "KEYSLOT", key]).as_int()
    }

    /// Which node (index) serves `slot`.
    pub fn owner(&self, slot: i64) -> usize {
        let slots = self.any_node().cmd(&["CLUSTER", "SLOTS"]).as_vec();
        for range in slots {
            let r = range.as_vec();
            let (lo, hi) = (r[0].as_int(), r[1].as_int());
            if (lo..=hi).contains(&slot) {
                let port = r[2].as_vec()[1].as_int();
                return self
                    .nodes
                    .iter()
                    .position(|n| i64::from(n.port) == port)
                    .expect("a node of ours");
            }
        }
        panic!("slot {slot} is not served");
    }

    /// The node id of node `i`.
    pub fn node_id(&self, i: usize) -> String {
        self.nodes[i]
            .cmd(&["CLUSTER", "MYID"])
            .as_str()
            .expect("an id")
    }

    /// The lowest slot node `i` serves.
    pub fn first_slot(&self, i: usize) -> i64 {
        let port = i64::from(self.nodes[i].port);
        let slots = self.any_node().cmd(&["CLUSTER", "SLOTS"]).as_vec();
        slots
            .iter()
            .map(|range| range.as_vec())
            .filter(|r| r[2].as_vec()[1].as_int() == port)
            .map(|r| r[0].as_int())
            .min()
            .expect("node serves slots")
    }

    /// Every script call (`EVALSHA`/`EVAL`) the nodes ran, from their slow logs: (node, keys).
    pub fn script_calls(&self) -> Vec<(usize, Vec<String>)> {
        let mut calls = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.pid().is_none() {
                continue;
            }
            for entry in n.cmd(&["SLOWLOG", "GET", "-1"]).as_vec() {
                let args: Vec<String> = entry.as_vec()[3]
                    .as_vec()
                    .iter()
                    .map(|a| a.as_str().unwrap_or_default())
                    .collect();
                let name = args.first().map(|a| a.to_ascii_uppercase());
                if !matches!(name.as_deref(), Some("EVALSHA" | "EVAL")) {
                    continue;
                }
                let nkeys: usize = args[2].parse().expect("numkeys");
                // The slow log keeps 32 arguments at most; the last one then says how many more.
                let keys: Vec<String> = args
                    .iter()
                    .skip(3)
                    .take(nkeys)
                    .filter(|k| !k.starts_with("... ("))
                    .cloned()
                    .collect();
                calls.push((i, keys));
            }
        }
        calls
    }

    fn any_node(&self) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.pid().is_some())
            .expect("a running node")
    }
}

/// A primary, a replica of it, and three Sentinels watching it as `vq` (quorum 2, a primary is
/// down after 500 ms without answers).
pub struct SentinelSet {
    pub primary: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<Sentinel>,
}

pub struct Sentinel {
    child: Child,
    pub port: u16,
    _dir: TempDir,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub const SENTINEL_SERVICE: &str = "vq";

/// A sentinel's `INFO sentinel` text, if it answers.
fn sentinel_info(port: u16) -> Option<String> {
    let conn = super::redis::RedisConn::connect(port).ok()?;
    conn.cmd(&["INFO", "sentinel"]).ok()?.as_str()
}

impl SentinelSet {
    pub fn start() -> SentinelSet {
        let primary = RedisServer::start();
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
        // The replica in sync before any sentinel starts: a sentinel learns of replicas from the
        // primary's INFO, which it reads only every 10 s, so a replica that connects just after
        // the first read stays unknown that long.
        let replica_synced = || {
            replica
                .cmd(&["INFO", "replication"])
                .as_str()
                .is_some_and(|i| i.contains("master_link_status:up"))
        };
        assert!(
            wait_until(Duration::from_secs(20), replica_synced),
            "the replica did not sync"
        );
        let sentinels = (0..3)
            .map(|_| {
                let port = free_port();
                let dir = TempDir::new("sentinel");
                let conf = dir.0.join("sentinel.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {} 2\nsentinel down-after-milliseconds {SENTINEL_SERVICE} 500\nsentinel failover-timeout {SENTINEL_SERVICE} 2000\nsentinel parallel-syncs {SENTINEL_SERVICE} 1\n",
                        dir.0.display(),
                        primary.port
                    ),
                )
                .unwrap();
                let child = Command::new("redis-server")
                    .arg(&conf)
                    .arg("--sentinel")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("redis-server must be installed");
                Sentinel {
                    child,
                    port,
                    _dir: dir,
                }
            })
            .collect();
        let set = SentinelSet {
            primary,
            replica,
            sentinels,
        };
        // Ready when the replica is in sync and every sentinel knows the other two and the replica
        // (hellos every 2 s, the primary's INFO every 10 s). 40 s once ran out in the full suite
        // on 2 cores (many Redis processes starting at once); waiting longer costs nothing when
        // they settle sooner, and the failure now says what each sentinel saw.
        let settled = wait_until(Duration::from_secs(90), || {
            let synced = set
                .replica
                .cmd(&["INFO", "replication"])
                .as_str()
                .is_some_and(|i| i.contains("master_link_status:up"));
            synced
                && set.sentinels.iter().all(|s| {
                    sentinel_info(s.port)
                        .is_some_and(|i| i.contains("slaves=1") && i.contains("sentinels=3"))
                })
        });
        if !settled {
            let seen: Vec<String> = set
                .sentinels
                .iter()
                .map(|s| {
                    sentinel_info(s.port).map_or_else(
                        || "no answer".to_string(),
                        |i| i.lines().last().unwrap_or("").to_string(),
                    )
                })
                .collect();
            panic!("the sentinels did not settle in 90 s: {seen:?}");
        }
        set
    }

    pub fn url(&self) -> String {
        let mut url = format!(
            "redis-sentinel://127.0.0.1:{}?sentinelServiceName={SENTINEL_SERVICE}",
            self.sentinels[0].port
        );
        for s in &self.sentinels[1..] {
            url.push_str(&format!("&node=127.0.0.1:{}", s.port));
        }
        url
    }

    /// The primary's port as the sentinels name it now.
    pub fn primary_port(&self) -> Option<u16> {
        let conn = super::redis::RedisConn::connect(self.sentinels[0].port).ok()?;
        let reply = conn
            .cmd(&["SENTINEL", "get-master-addr-by-name", SENTINEL_SERVICE])
            .ok()?;
        match reply {
            Resp::Array(v) if v.len() == 2 => v[1].as_str()?.parse().ok(),
            _ => None,
        }
    }
}

/// A Redis that speaks TLS on `tls_port` (its certificate signed by a private CA, for
/// `127.0.0.1`) and plain TCP on `port` for the test's own inspection.
pub struct TlsRedis {
    pub redis: RedisServer,
    pub tls_port: u16,
    /// The CA's certificate (PEM): what a client must trust.
    pub ca: std::path::PathBuf,
    _certs: TestCerts,
}

/// A private CA and a server certificate for `127.0.0.1` signed by it (openssl, P-256).
pub struct TestCerts {
    /// The CA's certificate (PEM): what a client must trust.
    pub ca: std::path::PathBuf,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    _dir: TempDir,
}

impl TestCerts {
    pub fn new() -> TestCerts {
        let certs = TempDir::new("tls");
        let d = |f: &str| certs.0.join(f).to_string_lossy().into_owned();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .stdin(Stdio::null())
                .output()
                .expect("openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca_args = vec!["req", "-x509", "-days", "2", "-subj", "/CN=vq test CA"];
        ca_args.extend(ec);
        let (ca_key, ca, key, csr, cert, ext) = (
            d("ca.key"),
            d("ca.pem"),
            d("server.key"),
            d("server.csr"),
            d("server.pem"),
            d("ext.cnf"),
        );
        ca_args.extend(["-keyout", &ca_key, "-out", &ca]);
        openssl(&ca_args);
        let mut req = vec!["req", "-subj", "/CN=127.0.0.1"];
        req.extend(ec);
        req.extend(["-keyout", &key, "-out", &csr]);
        openssl(&req);
        std::fs::write(&ext, "subjectAltName=IP:127.0.0.1\n").unwrap();
        openssl(&[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            &csr,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &cert,
            "-extfile",
            &ext,
        ]);
        TestCerts {
            ca: certs.0.join("ca.pem"),
            cert: certs.0.join("server.pem"),
            key: certs.0.join("server.key"),
            _dir: certs,
        }
    }
}

impl TlsRedis {
    pub fn start() -> TlsRedis {
        let certs = TestCerts::new();
        let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
        let (cert, key, ca) = (path(&certs.cert), path(&certs.key), path(&certs.ca));
        let tls_port = free_port();
        let port_s = tls_port.to_string();
        let redis = RedisServer::start_with(&[
            "--tls-port",
            &port_s,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
        ]);
        TlsRedis {
            redis,
            tls_port,
            ca: certs.ca.clone(),
            _certs: certs,
        }
    }

    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }
}
