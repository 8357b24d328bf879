//! The test harness: real processes on ephemeral ports, cleaned up on `Drop`.
//!
//! - `RedisServer`: a private `redis-server` (never the machine's 6379) that a test can kill,
//!   pause (SIGSTOP), resume and restart, with a tiny RESP client for assertions.
//! - `Upstream`: a real HTTP/1.1 backend that records every request it receives.
//! - `GatewayProc`: the real `vq-gateway` binary, configured from a `ConfigFile` built in code.
//! - `Client`: an HTTP client crate (`ureq`) for ordinary requests; `RawConn`: a raw HTTP/1.1
//!   connection for byte-level cases (spellings, smuggling, connection reuse and close).
//!
//! Waits poll with deadlines; nothing sleeps for a fixed time to "let things settle".

// The harness drives plain threads and processes, not the gateway: std locks are fine here.
#![allow(
    dead_code,
    unused_imports,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_types
)]

pub mod browser;
pub mod deploy;
pub mod flood;
pub mod http;
pub mod load;
pub mod nginx;
pub mod raw;
pub mod redis;
pub mod relay;
pub mod upstream;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use self::deploy::{RedisCluster, SentinelSet, TestCerts, TlsRedis};
pub use self::http::{Client, Http, Response};
pub use self::raw::RawConn;
pub use self::redis::{RedisServer, Resp};
pub use self::upstream::{Recorded, Upstream};
pub use vq_gateway::config::{
    ConfigFile, FailOpenMode, IdentityMode, JwtAlgorithm, LogFormat, StoreKind, TargetsMode,
    UnregisteredGated,
};

pub const TEST_SECRET: &str = "test-secret-0123456789abcdef-0123456789";

/// Now, in epoch seconds.
pub fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Mints a token straight from its format (docs/api.md#entry-token) with `ring` and `base64`,
/// independent of the gateway code.
pub fn token_for(secret: &str, payload: &str) -> String {
    use base64::Engine as _;
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let mac = ring::hmac::sign(&key, payload.as_bytes());
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!("{}.{}", b64.encode(payload), b64.encode(mac.as_ref()))
}

/// A port that was free a moment ago (bound to port 0, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Holds the tests of one test binary that each run several processes and a load generator on
/// the two cores one at a time: side by side they would measure the machine, not the gateway.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// `(Redis ms, mark)` of every admission step recorded in a target's `advances` list (newest
/// first, as `LRANGE` gives it; "ms:mark:live"), oldest first.
pub fn parse_advances(list: &[Resp]) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = list
        .iter()
        .map(|r| {
            let s = r.as_str().expect("an advance sample");
            let mut parts = s.split(':');
            let (t, m) = (parts.next().expect("ms"), parts.next().expect("ms:mark"));
            (t.parse().expect("ms"), m.parse().expect("mark"))
        })
        .collect();
    v.reverse();
    v
}

/// The value of one Prometheus series in a metrics text: `series` is the name, or the name
/// with its labels, exactly as the gateway renders it (`name{a="b"}`), followed by a space and
/// the value. 0 when absent; a value that does not parse fails the test.
pub fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0, |v| {
            v.trim()
                .parse::<f64>()
                .unwrap_or_else(|e| panic!("{series}: {v:?}: {e}")) as u64
        })
}

/// Polls `f` until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A fresh private directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "vq-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_vq-gateway")
}

/// The rehearsal tools' binary (`benches/sim`, package `vq-sim`). `cargo test` at the workspace
/// root builds it beside the gateway's; a test run that selected the gateway's package alone
/// (`-p vq-gateway`) did not, and is told so.
#[allow(dead_code)]
pub fn sim_bin() -> std::path::PathBuf {
    let path = std::path::Path::new(bin()).with_file_name("vq-sim");
    assert!(
        path.exists(),
        "{} is missing: run the tests from the workspace root without -p (or `cargo build -p vq-sim` first)",
        path.display()
    );
    path
}

/// A config for tests: ephemeral ports, the given upstream, short timeouts, the queue on.
pub fn test_config(upstream: SocketAddr) -> ConfigFile {
    let mut f = ConfigFile::default();
    let listen = free_port();
    let admin = (0..)
        .map(|_| free_port())
        .find(|p| *p != listen)
        .unwrap_or(0);
    f.server.listen = format!("127.0.0.1:{listen}");
    f.server.admin_listen = format!("127.0.0.1:{admin}");
    f.server.grace_period_s = 1;
    f.server.drain_ms = 300;
    f.server.threads = 2;
    f.upstream.address = upstream.to_string();
    f.upstream.connect_timeout_ms = 500;
    f.upstream.read_timeout_ms = 5_000;
    f.flag.enabled = true;
    f
}

/// A running gateway process.
pub struct GatewayProc {
    child: Child,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub dir: TempDir,
    pub config: ConfigFile,
}

impl GatewayProc {
    /// Starts the gateway with the test secret and waits until it reports ready.
    pub fn start(config: ConfigFile) -> GatewayProc {
        GatewayProc::start_with_env(config, &[("VQ_TOKEN_SECRET", TEST_SECRET)])
    }

    pub fn start_with_env(mut config: ConfigFile, env: &[(&str, &str)]) -> GatewayProc {
        // A port picked as free can be taken by a parallel test before the gateway binds it: then
        // the gateway exits at once with "cannot listen", and it is started again on new ports.
        for _ in 0..3 {
            match GatewayProc::try_start(config.clone(), env) {
                Ok(gw) => return gw,
                Err(log) if log.contains("cannot listen on") => {
                    config.server.listen = format!("127.0.0.1:{}", free_port());
                    config.server.admin_listen = format!("127.0.0.1:{}", free_port());
                }
                Err(log) => panic!("gateway exited early:\n{log}"),
            }
        }
        panic!("gateway could not bind free ports three times");
    }

    fn try_start(config: ConfigFile, env: &[(&str, &str)]) -> Result<GatewayProc, String> {
        let dir = TempDir::new("gw");
        let path = dir.0.join("gateway.toml");
        std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
        let log = std::fs::File::create(dir.0.join("gateway.log")).unwrap();
        let mut cmd = Command::new(bin());
        cmd.args(["serve", "--config"])
            .arg(&path)
            .env_remove("VQ_TOKEN_SECRET")
            .env_remove("VQ_TOKEN_SECRET_PREVIOUS")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let mut gw = GatewayProc {
            child,
            listen: config.server.listen.parse().unwrap(),
            admin: config.server.admin_listen.parse().unwrap(),
            dir,
            config,
        };
        let mut exited = None;
        let up = wait_until(Duration::from_secs(15), || {
            if let Ok(Some(status)) = gw.child.try_wait() {
                exited = Some(status);
                return true;
            }
            TcpStream::connect(gw.listen).is_ok()
                && Client::connect(gw.admin)
                    .get("/readyz", &[])
                    .is_ok_and(|r| r.status == 200)
        });
        if let Some(status) = exited {
            return Err(format!("exit {status}: {}", gw.log()));
        }
        assert!(up, "gateway did not come up:\n{}", gw.log());
        Ok(gw)
    }

    /// Spawns the gateway and returns at once, without waiting for it to listen (for start-up
    /// tests). Ports must be free.
    pub fn spawn(config: ConfigFile) -> GatewayProc {
        let dir = TempDir::new("gw");
        let path = dir.0.join("gateway.toml");
        std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
        let log = std::fs::File::create(dir.0.join("gateway.log")).unwrap();
        let child = Command::new(bin())
            .args(["serve", "--config"])
            .arg(&path)
            .env_remove("VQ_TOKEN_SECRET_PREVIOUS")
            .env("VQ_TOKEN_SECRET", TEST_SECRET)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        GatewayProc {
            child,
            listen: config.server.listen.parse().unwrap(),
            admin: config.server.admin_listen.parse().unwrap(),
            dir,
            config,
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.listen)
    }

    /// A raw connection to the public listener, for byte-level cases.
    pub fn raw(&self) -> RawConn {
        RawConn::connect(self.listen)
    }

    pub fn admin_client(&self) -> Client {
        Client::connect(self.admin)
    }

    pub fn metrics(&self) -> String {
        let r = self.admin_client().get("/metrics", &[]).unwrap();
        String::from_utf8(r.body).unwrap()
    }

    /// Everything the process logged so far.
    /// Waits until the replica knows the run-time flag (on an empty Redis a replica waits a few
    /// seconds for others to write it back before creating it: `settings.rs`).
    pub fn wait_flag_known(&self) {
        assert!(
            wait_until(Duration::from_secs(8), || self
                .metrics()
                .lines()
                .any(|l| l == "virtual_queue_flag_known 1")),
            "the flag never became known\n{}",
            self.log()
        );
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("gateway.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Waits for the process to exit, returning its exit code (None when killed by a signal).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<Option<i32>> {
        let mut code = None;
        wait_until(timeout, || match self.child.try_wait() {
            Ok(Some(s)) => {
                code = Some(s.code());
                true
            }
            _ => false,
        });
        code
    }
}

impl Drop for GatewayProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary to completion (for commands expected to exit), with a timeout.
pub fn run_bin(
    args: &[&str],
    env: &[(&str, &str)],
    timeout: Duration,
) -> (Option<i32>, String, String) {
    let dir = TempDir::new("run");
    let out = dir.0.join("out");
    let err = dir.0.join("err");
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .env_remove("VQ_TOKEN_SECRET")
        .env_remove("VQ_TOKEN_SECRET_PREVIOUS")
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut code = None;
    let exited = wait_until(timeout, || match child.try_wait() {
        Ok(Some(s)) => {
            code = s.code();
            true
        }
        _ => false,
    });
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
    }
    (
        code,
        std::fs::read_to_string(out).unwrap_or_default(),
        std::fs::read_to_string(err).unwrap_or_default(),
    )
}
