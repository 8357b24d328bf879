//! The shipped nginx-lb configuration (`docker/nginx.conf`), run with real nginx in front of two
//! gateway processes, with its addresses replaced by local ports: the user id comes from the
//! auth service only, a client's own `X-User-Id` never reaches the gateway, and purchases are not
//! retried on another replica.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

struct Nginx {
    child: Child,
    pub addr: std::net::SocketAddr,
    _dir: TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts nginx on `docker/nginx.conf` with `gateway-1/2` and `auth` pointed at local ports.
fn nginx(gateways: [std::net::SocketAddr; 2], auth: std::net::SocketAddr) -> Nginx {
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docker/nginx.conf")).unwrap();
    let port = free_port();
    let conf = shipped
        .replace("gateway-1:8080", &gateways[0].to_string())
        .replace("gateway-2:8080", &gateways[1].to_string())
        .replace("server auth:8081;", &format!("server {auth};"))
        .replace("listen 80;", &format!("listen 127.0.0.1:{port};"))
        .replace("worker_processes auto;", "worker_processes 1;");
    assert_ne!(conf, shipped);
    let dir = TempDir::new("nginx");
    let path = dir.0.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    // Debian installs it in /usr/sbin, which a non-root PATH may not hold.
    let bin = ["/usr/sbin/nginx", "/usr/local/sbin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("nginx");
    let child = Command::new(bin)
        .arg("-c")
        .arg(&path)
        .arg("-p")
        .arg(&dir.0)
        .arg("-e")
        .arg(dir.0.join("error.log"))
        .arg("-g")
        .arg(format!(
            "daemon off; pid {};",
            dir.0.join("nginx.pid").display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nginx must be installed (apt-get install nginx-light)");
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || std::net::TcpStream::connect(
            addr
        )
        .is_ok()),
        "nginx did not start: {}",
        std::fs::read_to_string(dir.0.join("error.log")).unwrap_or_default()
    );
    Nginx {
        child,
        addr,
        _dir: dir,
    }
}

#[test]
fn the_user_id_comes_from_the_session_only() {
    let backend = Upstream::start();
    let auth = Upstream::start();
    let redis = RedisServer::start();
    let mut cfg = test_config(backend.addr);
    cfg.store.backend = StoreKind::Redis;
    cfg.store.redis_url = redis.url();
    let gws = [GatewayProc::start(cfg.clone()), GatewayProc::start(cfg)];
    let lb = nginx([gws[0].listen, gws[1].listen], auth.addr);
    let mut c = Client::connect(lb.addr);
    // A session for user 1001; the client claims to be 5.
    let r = c
        .request(
            "POST",
            "/virtual-queues/limited-drop/42/entries",
            &[("Cookie", "session=1001"), ("X-User-Id", "5")],
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["status"], "WAITING");
    let r = c
        .request(
            "GET",
            "/virtual-queues/limited-drop/42/entries/me",
            &[("Cookie", "session=1001")],
            b"",
        )
        .unwrap();
    assert_eq!(r.json()["position"], 1, "the same user: the session's");
    // Polling "as the victim" by header alone: the header never arrives.
    let r = c
        .request(
            "GET",
            "/virtual-queues/limited-drop/42/entries/me",
            &[("X-User-Id", "1001")],
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 400, "no session, no user");
    // The backend sees the session's id, never the client's.
    let r = c
        .request(
            "GET",
            "/profile",
            &[("Cookie", "session=77"), ("X-User-Id", "5")],
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 200);
    let r = c
        .request("GET", "/public", &[("X-User-Id", "5")], b"")
        .unwrap();
    assert_eq!(r.status, 200);
    let seen = backend.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].headers_named("x-user-id"), vec!["77"]);
    assert!(seen[1].headers_named("x-user-id").is_empty());
    // A rejected session goes nowhere.
    let r = c
        .request("GET", "/profile", &[("Cookie", "session=reject")], b"")
        .unwrap();
    assert_eq!(r.status, 401);
    assert_eq!(backend.count(), 2);
}

#[test]
fn a_failed_purchase_is_answered_not_sent_again() {
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docker/nginx.conf")).unwrap();
    let retry = shipped
        .lines()
        .find(|l| l.trim_start().starts_with("proxy_next_upstream "))
        .unwrap();
    assert!(!retry.contains("non_idempotent"), "{retry}");
    let backend = Upstream::start();
    let auth = Upstream::start();
    let mut cfg = test_config(backend.addr);
    cfg.flag.enabled = false;
    let gws = [GatewayProc::start(cfg.clone()), GatewayProc::start(cfg)];
    let lb = nginx([gws[0].listen, gws[1].listen], auth.addr);
    // The backend fails after receiving the purchase: nginx hands that answer back and does not
    // send the POST to the other replica.
    let r = Client::connect(lb.addr)
        .request(
            "POST",
            "/limited-drops/42/orders",
            &[("Cookie", "session=9"), ("x-upstream-status", "500")],
            b"{}",
        )
        .unwrap();
    assert_eq!(r.status, 500);
    let posts = backend
        .requests()
        .iter()
        .filter(|r| r.method == "POST")
        .count();
    assert_eq!(posts, 1, "the purchase reached the backend twice");
}
