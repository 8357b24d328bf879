//! The deployment ops will run, on this machine: real nginx on the shipped `docker/nginx.conf`
//! in front of three gateway processes on one real Redis, the recording backend behind them, and
//! `vq-sim simulate` playing a sale start through nginx for both target types. Mid-sale one
//! gateway is killed (SIGKILL: nginx routes around it), another is restarted (SIGTERM, then a
//! new process on its port: a rolling deploy) and Redis is paused for 200 ms.
//!
//! What must hold, read from the simulator's report and the backend's own record: purchases
//! reaching the backend stay within the admission budget per tick window; every user who kept
//! polling is admitted and buys exactly once; nothing reaches the backend without a token; no
//! 5xx but for a purchase inside the replica killed with SIGKILL; admission in order.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::load::epoch_ms;
use common::nginx::Nginx;
use common::*;
use serde_json::Value;
use vq_sim::backend::Record;

const TICK_MS: u64 = 500;
const BATCH: u64 = 20;
const REPLICAS: u64 = 3;

/// `vq-sim record-backend` on a free port.
struct RecordBackend {
    child: Child,
    addr: SocketAddr,
}

impl RecordBackend {
    fn start() -> RecordBackend {
        let mut child = Command::new(sim_bin())
            .args(["record-backend", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("record-backend listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .parse()
            .unwrap();
        RecordBackend { child, addr }
    }

    fn record(&self) -> Record {
        let r = Client::connect(self.addr).get("/_record", &[]).unwrap();
        serde_json::from_slice(&r.body).unwrap()
    }
}

impl Drop for RecordBackend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn gateway_config(redis: &RedisServer, backend: SocketAddr) -> ConfigFile {
    let mut cfg = test_config(backend);
    cfg.server.threads = 1;
    cfg.store.backend = StoreKind::Redis;
    cfg.store.redis_url = redis.url();
    cfg.queue.tick_ms = TICK_MS;
    cfg.queue.batch_size = BATCH;
    cfg.queue.heartbeat_timeout_s = 9;
    cfg
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn a_sale_through_nginx_and_three_gateways_survives_a_kill_a_rolling_restart_and_a_redis_pause() {
    let _serial = serial();
    let redis = RedisServer::start();
    let backend = RecordBackend::start();
    let auth = Upstream::start();
    let cfg = gateway_config(&redis, backend.addr);
    let mut gws: Vec<GatewayProc> = (0..REPLICAS)
        .map(|_| {
            let mut c = cfg.clone();
            c.server.listen = format!("127.0.0.1:{}", free_port());
            c.server.admin_listen = format!("127.0.0.1:{}", free_port());
            GatewayProc::start(c)
        })
        .collect();
    let addrs: Vec<SocketAddr> = gws.iter().map(|g| g.listen).collect();
    let lb = Nginx::start(&addrs, auth.addr);
    // A new deployment on an empty Redis: the replicas wait for a write-back that does not come,
    // then create the flag from their file; the sale starts once they know it.
    for gw in &gws {
        gw.wait_flag_known();
    }

    let out = TempDir::new("sim");
    let url = format!("http://{}", lb.addr);
    let record_url = format!("http://{}/_record", backend.addr);
    let out_dir = out.0.to_string_lossy().into_owned();
    let sim = Command::new(sim_bin())
        .args([
            "simulate",
            "--url",
            &url,
            "--sale",
            "limited-drop:7",
            "--sale",
            "ticketing-event:8",
            "--spike-rate",
            "150",
            "--spike-s",
            "4",
            "--tail-rate",
            "10",
            "--tail-s",
            "4",
            "--abandon",
            "0.05",
            "--leave",
            "0.05",
            "--cheat",
            "0.03",
            "--identity",
            "cookie:session",
            "--batch",
            "20",
            "--tick-ms",
            "500",
            "--heartbeat-timeout-s",
            "9",
            "--connections",
            "64",
            "--max-duration-s",
            "60",
            "--backend-record",
            &record_url,
            "--out",
            &out_dir,
            "--first-user",
            "1000",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let at = |ms: u64| {
        let due = started + Duration::from_millis(ms);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
    };

    at(2000);
    let killed_at = epoch_ms();
    gws[1].signal("KILL");
    at(4000);
    // A rolling deploy of replica 3: stop it gracefully, start a new process on its port.
    let restarted_config = gws[2].config.clone();
    let restart_began = epoch_ms();
    gws[2].signal("TERM");
    assert!(gws[2].wait_exit(Duration::from_secs(10)).is_some());
    gws[2] = GatewayProc::spawn(restarted_config);
    assert!(wait_until(Duration::from_secs(10), || {
        gws[2].client().get("/healthz", &[]).is_ok()
    }));
    let restart_done = epoch_ms();
    at(6000);
    redis.pause();
    std::thread::sleep(Duration::from_millis(200));
    redis.resume();

    let output = sim.wait_with_output().unwrap();
    let summary = String::from_utf8_lossy(&output.stdout);
    eprintln!("{summary}");
    assert!(
        output.status.success(),
        "simulate failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.0.join("report.json")).unwrap()).unwrap();
    assert!(std::fs::metadata(out.0.join("chart.svg")).unwrap().len() > 1000);
    let started_at = u(&report["startedAtMs"]);
    // Report times are milliseconds since the simulator's start (signed: it may start late).
    let rel = |ms: u64| ms as i64 - started_at as i64;
    let (kill, restart) = (rel(killed_at), (rel(restart_began), rel(restart_done)));

    // Errors: only a purchase inside the killed replica when it died may have failed (nginx does
    // not send a POST that reached one replica to another: a purchase is not idempotent), so
    // only one within a second of the kill: in flight when it came, or written by nginx onto a
    // kept-alive connection in the moment before the dead process's sockets were closed (one
    // CI run had one 4 ms after the recorded kill). How many depends on where the kill fell:
    // the users admitted in one tick poll and buy together, so at most one tick's admissions
    // of both sales (7 in another CI run). The restarted replica drained first
    // (`server.drain_ms`): nothing failed there.
    let errors = &report["errors"];
    let samples = errors["samples"].as_array().unwrap();
    let excused: Vec<&Value> = samples
        .iter()
        .filter(|e| {
            let at = u(&e["atMs"]) as i64;
            let in_flight = (kill - 1000..=kill + 1000).contains(&at);
            e["op"] == "purchase" && e["status"] == 502 && in_flight
        })
        .collect();
    assert!(
        excused.len() as u64 <= 2 * BATCH && samples.len() == excused.len(),
        "errors other than purchases in flight on a dying replica (killed at {kill} ms, \
         restarted {restart:?} ms): {samples:?}"
    );
    assert_eq!(u(&errors["noAnswer"]), 0);

    // Every user who kept polling bought, once; cheaters got nowhere.
    let users = &report["users"];
    assert!(u(&users["arrived"]) >= 600, "{users}");
    assert!(
        u(&users["abandoned"]) > 0 && u(&users["left"]) > 0,
        "{users}"
    );
    assert!(
        u(&users["stayedWithoutPurchase"]) <= excused.len() as u64,
        "users who kept polling but did not buy: {users}"
    );
    assert!(u(&report["bypassAttempts"]) > 0);
    assert_eq!(u(&report["bypassPassed"]), 0);
    assert_eq!(u(&report["fifoInversions"]), 0, "admitted out of order");

    // The backend's own record: once per user, only users who held a token.
    let record = backend.record();
    assert!(record.duplicates.is_empty(), "{:?}", record.duplicates);
    assert_eq!(record.unidentified, 0);
    let b = &report["backend"];
    assert_eq!(b["source"], "record-backend");
    assert_eq!(u(&b["withoutToken"]), 0);
    assert_eq!(u(&b["purchases"]), record.purchases.len() as u64);
    assert!(u(&b["purchases"]) + excused.len() as u64 >= u(&users["purchased"]));
    // Within the budget: in any window of n ticks at most (n + 2 + lag) batches (the replicas'
    // paced shares are floored: together at most a batch).
    let lag = u(&b["lagTicks"]);
    assert!(lag <= 8, "the simulator lagged {lag} ticks");
    for sale in b["perSale"].as_array().unwrap() {
        assert!(u(&sale["purchases"]) > 0, "{sale}");
        let per_ticks = sale["maxPerTicks"].as_array().unwrap();
        for (i, max) in per_ticks.iter().enumerate() {
            let n = i as u64 + 1;
            let bound = (n + 2 + lag) * BATCH;
            assert!(u(max) <= bound, "{sale}: {max} in {n} ticks, bound {bound}");
        }
        // Over 10 ticks the backend's rate is the budget's: one batch of slack for the tick
        // boundaries, one per tick the buyers lagged, and each replica's paced share for the
        // tick Redis was paused.
        let ten = u(&per_ticks[9]);
        let bound = (10 + 1 + lag) * BATCH + REPLICAS * (BATCH / REPLICAS);
        assert!(
            ten <= bound,
            "{sale}: {ten} purchases in 10 ticks, budget {}",
            10 * BATCH
        );
    }
    // nginx met the killed replica (a refused connection) and routed around it.
    let log = lb.error_log();
    assert!(
        log.contains("Connection refused") || log.contains("prematurely closed"),
        "nginx never met the killed replica:\n{log}"
    );
}

/// `simulate` against an https URL (TLS terminated by nginx in front of one gateway): it checks
/// the certificate against the CAs it is told to trust (`SSL_CERT_FILE`). Trusting the right CA,
/// the sale runs; trusting another, no request gets an answer, and the report says so.
#[test]
fn simulate_speaks_https_and_trusts_only_the_given_certificates() {
    let certs = TestCerts::new();
    let other = TestCerts::new();
    let backend = RecordBackend::start();
    let mut cfg = test_config(backend.addr);
    cfg.queue.tick_ms = 200;
    cfg.queue.batch_size = 50;
    let gw = GatewayProc::start(cfg);
    let port = free_port();
    let conf = format!(
        r#"worker_processes 1;
events {{}}
http {{
    access_log off;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {};
        ssl_certificate_key {};
        location / {{
            proxy_pass http://{};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"#,
        certs.cert.display(),
        certs.key.display(),
        gw.listen
    );
    let _tls = Nginx::run(&conf, port);
    let simulate = |ca: &std::path::Path, first_user: &str| -> Value {
        let out = TempDir::new("sim-tls");
        let status = Command::new(sim_bin())
            .args([
                "simulate",
                "--url",
                &format!("https://127.0.0.1:{port}"),
                "--spike-rate",
                "20",
                "--spike-s",
                "1",
                "--tail-rate",
                "0",
                "--tail-s",
                "0",
                "--abandon",
                "0",
                "--leave",
                "0",
                "--cheat",
                "0",
                "--batch",
                "50",
                "--tick-ms",
                "200",
                "--max-duration-s",
                "4",
                "--first-user",
                first_user,
                "--out",
            ])
            .arg(&out.0)
            .env("SSL_CERT_FILE", ca)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        serde_json::from_slice(&std::fs::read(out.0.join("report.json")).unwrap()).unwrap()
    };
    let trusted = simulate(&certs.ca, "5000");
    assert_eq!(
        u(&trusted["users"]["purchased"]),
        20,
        "{}",
        trusted["users"]
    );
    assert_eq!(u(&trusted["errors"]["noAnswer"]), 0);
    assert_eq!(backend.record().purchases.len(), 20);

    let untrusted = simulate(&other.ca, "6000");
    assert_eq!(
        u(&untrusted["users"]["admitted"]),
        0,
        "{}",
        untrusted["users"]
    );
    let enters = u(&untrusted["endpoints"]["enter"]["count"]);
    assert!(enters >= 20);
    assert_eq!(u(&untrusted["errors"]["noAnswer"]), enters);
    assert_eq!(
        backend.record().purchases.len(),
        20,
        "nothing more reached the backend"
    );
}
