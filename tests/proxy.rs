//! The foundation: a transparent proxy, local responses that keep the connection, a clear 502
//! when the backend is down, strict configuration and secret handling, graceful shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn passthrough_is_transparent() {
    let up = Upstream::start();
    let gw = GatewayProc::start(test_config(up.addr));
    let mut c = gw.client();

    let body = br#"{"items":[1,2,3],"note":"caf\u00e9 & more"}"#;
    let r = c
        .request(
            "POST",
            "/limited-drops/42/cart?x=1&y=%20z&y=2",
            &[
                ("X-Custom", "a, b"),
                ("X-Custom", "c"),
                ("Content-Type", "application/json"),
            ],
            body,
        )
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-upstream"), Some("recorder"));
    let echo = r.json();
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["target"], "/limited-drops/42/cart?x=1&y=%20z&y=2");
    assert_eq!(echo["bodyLen"], body.len());

    let seen = up.requests();
    assert_eq!(seen.len(), 1);
    let req = &seen[0];
    assert_eq!(req.method, "POST");
    assert_eq!(req.target, "/limited-drops/42/cart?x=1&y=%20z&y=2");
    assert_eq!(req.body, body);
    assert_eq!(req.headers_named("x-custom"), vec!["a, b", "c"]);
    assert_eq!(req.header("content-type"), Some("application/json"));

    // The gateway never compresses: the client's Accept-Encoding reaches the backend as sent and
    // the backend's body comes back as the backend wrote it.
    let r = c
        .request("GET", "/static/x", &[("Accept-Encoding", "gzip, br")], b"")
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(r.json()["method"], "GET");
    let seen = up.requests();
    assert_eq!(seen[1].header("accept-encoding"), Some("gzip, br"));

    // Status codes and other methods pass through as they are.
    for (method, status) in [("GET", 404), ("PUT", 409), ("DELETE", 204), ("PATCH", 500)] {
        let r = c
            .request(
                method,
                "/some/where",
                &[("x-upstream-status", &status.to_string())],
                b"",
            )
            .unwrap();
        assert_eq!(r.status, status, "{method}");
    }
    assert_eq!(up.count(), 6);
}

#[test]
fn dead_backend_answers_502_json_quickly() {
    // A port with nothing listening.
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let gw = GatewayProc::start(test_config(dead));
    let mut c = gw.client();
    let started = Instant::now();
    let r = c.get("/products/1", &[]).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(r.status, 502);
    assert!(r.header("content-length").is_some());
    assert_eq!(r.json()["code"], "UPSTREAM_UNAVAILABLE");
    let counted = wait_until(Duration::from_secs(5), || {
        gw.metrics()
            .contains("vq_gateway_requests_total{route_class=\"proxy\",status=\"502\"} 1")
    });
    assert!(counted, "{}", gw.metrics());
    // One line for the failed request (the access line, with the error), not Pingora's as well.
    assert!(wait_until(Duration::from_secs(5), || gw
        .log()
        .contains("ConnectRefused")));
    assert!(!gw.log().contains("Fail to proxy"), "{}", gw.log());
}

#[test]
fn slow_backend_answers_504_after_the_read_timeout() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.upstream.read_timeout_ms = 300;
    let gw = GatewayProc::start(cfg);
    let started = Instant::now();
    let r = gw
        .client()
        .get("/slow", &[("x-upstream-delay-ms", "3000")])
        .unwrap();
    assert_eq!(r.status, 504);
    assert_eq!(r.json()["code"], "UPSTREAM_TIMEOUT");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn local_responses_keep_the_connection_alive() {
    let up = Upstream::start();
    let gw = GatewayProc::start(test_config(up.addr));
    // Raw: the test watches one connection's port and its close.
    let mut c = gw.raw();
    let mut port = None;
    for i in 0..20 {
        // Errors, successes and a POST with a body: all answered locally.
        let r = match i % 4 {
            0 => c.get("/virtual-queues/limited-drop/1/stats", &[]).unwrap(),
            1 => c.get("/virtual-queues/nope/1/stats", &[]).unwrap(),
            2 => c
                .request(
                    "POST",
                    "/virtual-queues/limited-drop/1/entries",
                    &[("X-User-Id", "7")],
                    b"{\"ignored\":true}",
                )
                .unwrap(),
            _ => c
                .get("/virtual-queues/limited-drop/1/entries/me", &[])
                .unwrap(),
        };
        assert!(
            r.header("content-length").is_some(),
            "{i}: no Content-Length"
        );
        assert_ne!(
            r.header("connection")
                .map(str::to_ascii_lowercase)
                .as_deref(),
            Some("close")
        );
        let p = c.local_port();
        assert!(
            port.is_none() || port == p,
            "connection was not reused at request {i}"
        );
        port = p;
    }
    assert!(!c.server_closed());
    assert_eq!(
        up.count(),
        0,
        "queue API calls must never reach the backend"
    );
}

#[test]
fn admin_endpoints() {
    let up = Upstream::start();
    let gw = GatewayProc::start(test_config(up.addr));
    let mut a = gw.admin_client();
    assert_eq!(a.get("/healthz", &[]).unwrap().status, 200);
    let ready = a.get("/readyz", &[]).unwrap();
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["ready"], true);
    gw.client().get("/x", &[]).unwrap();
    assert!(wait_until(Duration::from_secs(5), || gw
        .metrics()
        .contains("route_class=\"proxy\"")));
    let m = a.get("/metrics", &[]).unwrap();
    assert_eq!(m.status, 200);
    let text = String::from_utf8(m.body).unwrap();
    assert!(
        text.contains("vq_gateway_requests_total{route_class=\"proxy\",status=\"200\"} 1"),
        "{text}"
    );
    assert!(text.contains("vq_gateway_request_duration_seconds_bucket{route_class=\"proxy\""));
    assert!(text.contains("vq_gateway_up 1"));
    assert_eq!(a.get("/nope", &[]).unwrap().status, 404);
    assert_eq!(up.count(), 1);
}

#[test]
fn one_structured_log_line_per_request() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.server.log_format = LogFormat::Json;
    let gw = GatewayProc::start(cfg);
    let mut c = gw.client();
    c.get("/a", &[]).unwrap();
    c.get("/virtual-queues/limited-drop/1/stats", &[]).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || {
            gw.log()
                .lines()
                .filter(|l| l.contains("\"target\":\"access\""))
                .count()
                == 2
        }),
        "{}",
        gw.log()
    );
    for line in gw
        .log()
        .lines()
        .filter(|l| l.contains("\"target\":\"access\""))
    {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v["status"].as_u64().is_some());
        assert!(v["route_class"].as_str().is_some());
        assert!(v["duration_us"].as_u64().is_some());
    }
    assert!(!gw.log().contains(TEST_SECRET));
}

#[test]
fn sigterm_shuts_down_gracefully() {
    let up = Upstream::start();
    let mut gw = GatewayProc::start(test_config(up.addr));
    // A request in flight when SIGTERM arrives still completes.
    let listen = gw.listen;
    let inflight = std::thread::spawn(move || {
        Client::connect(listen)
            .get("/slow", &[("x-upstream-delay-ms", "400")])
            .map(|r| r.status)
    });
    assert!(wait_until(Duration::from_secs(5), || up.count() == 1));
    gw.signal("TERM");
    assert_eq!(inflight.join().unwrap().unwrap(), 200);
    let code = gw
        .wait_exit(Duration::from_secs(10))
        .expect("gateway did not exit after SIGTERM");
    assert_eq!(code, Some(0));
}

/// SIGTERM first drains: for `server.drain_ms` the replica still answers, on old and new
/// connections, but closes each connection after its answer and reports not ready; then it
/// stops accepting and exits.
#[test]
fn sigterm_drains_connections_before_it_stops() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.server.drain_ms = 1500;
    let mut gw = GatewayProc::start(cfg);
    let mut kept = gw.raw();
    let r = kept.get("/a", &[]).unwrap();
    assert_eq!(r.status, 200);
    assert_ne!(r.header("connection"), Some("close"));
    let term = std::time::Instant::now();
    gw.signal("TERM");
    assert!(wait_until(Duration::from_secs(2), || {
        gw.admin_client()
            .get("/readyz", &[])
            .is_ok_and(|r| r.status == 503 && r.json()["draining"] == true)
    }));
    let r = kept.get("/b", &[]).unwrap();
    assert_eq!(
        r.status, 200,
        "an open connection is still served while draining"
    );
    assert_eq!(r.header("connection"), Some("close"));
    assert!(
        kept.server_closed(),
        "the connection is closed after the answer"
    );
    let r = gw.raw().get("/c", &[]).unwrap();
    assert_eq!(
        r.status, 200,
        "a new connection is still served while draining"
    );
    assert_eq!(r.header("connection"), Some("close"));
    assert!(
        term.elapsed() < Duration::from_millis(1500),
        "the drain ended early"
    );
    assert_eq!(gw.wait_exit(Duration::from_secs(10)), Some(Some(0)));
    assert!(term.elapsed() >= Duration::from_millis(1500));
    assert!(std::net::TcpStream::connect(gw.listen).is_err());
}

#[test]
fn taken_port_fails_at_start_with_a_clear_error() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.server.listen = taken.local_addr().unwrap().to_string();
    let dir = TempDir::new("port");
    let path = dir.0.join("g.toml");
    std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
    let started = Instant::now();
    let (code, _, err) = run_bin(
        &["serve", "--config", path.to_str().unwrap()],
        &[("VQ_TOKEN_SECRET", TEST_SECRET)],
        Duration::from_secs(10),
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(code, Some(69), "{err}");
    assert!(
        err.contains("server.listen") && err.contains(&cfg.server.listen),
        "{err}"
    );
}

fn serve_with_secret(secret: Option<&str>) -> (Option<i32>, String) {
    let up = Upstream::start();
    let cfg = test_config(up.addr);
    let dir = TempDir::new("secret");
    let path = dir.0.join("g.toml");
    std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
    let env: Vec<(&str, &str)> = secret.map(|s| ("VQ_TOKEN_SECRET", s)).into_iter().collect();
    let (code, out, err) = run_bin(
        &["serve", "--config", path.to_str().unwrap()],
        &env,
        Duration::from_secs(10),
    );
    (code, out + &err)
}

#[test]
fn serve_refuses_a_missing_or_short_secret() {
    let (code, out) = serve_with_secret(None);
    assert_eq!(code, Some(64), "{out}");
    assert!(out.contains("VQ_TOKEN_SECRET"), "{out}");

    let short = "too-short-secret-31-bytes-long!";
    assert_eq!(short.len(), 31);
    let (code, out) = serve_with_secret(Some(short));
    assert_eq!(code, Some(64), "{out}");
    assert!(
        out.contains("VQ_TOKEN_SECRET") && out.contains("31 bytes"),
        "{out}"
    );
    assert!(
        !out.contains(short),
        "the secret leaked into the output: {out}"
    );
}

#[test]
fn secret_variable_name_is_configurable() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.token.secret_env = "MY_GATEWAY_KEY".into();
    let gw = GatewayProc::start_with_env(cfg, &[("MY_GATEWAY_KEY", TEST_SECRET)]);
    assert_eq!(gw.client().get("/x", &[]).unwrap().status, 200);
    assert!(!gw.log().contains(TEST_SECRET));
}

fn check_config(text: &str) -> (Option<i32>, String) {
    let dir = TempDir::new("check");
    let path = dir.0.join("c.toml");
    std::fs::write(&path, text).unwrap();
    let (code, out, err) = run_bin(
        &["check-config", "--config", path.to_str().unwrap()],
        &[],
        Duration::from_secs(10),
    );
    (code, out + &err)
}

#[test]
fn check_config_names_the_bad_key() {
    let cases = [
        ("[queue]\nbatch_size = 0\n", "queue.batch_size"),
        ("[queue]\ntick_ms = 0\n", "queue.tick_ms"),
        ("[flag]\nrollout_percent = 150\n", "flag.rollout_percent"),
        ("[server]\nlisten = \"localhost\"\n", "server.listen"),
        ("[store]\nbackend = \"mongo\"\n", "store.backend"),
        ("[queue]\nbatchsize = 3\n", "batchsize"),
        ("[queue]\nbatch_size = \"ten\"\n", "batch_size"),
        ("not toml at all [", "TOML"),
    ];
    for (text, key) in cases {
        let (code, out) = check_config(text);
        assert_eq!(code, Some(64), "{text}: {out}");
        assert!(
            out.contains(key),
            "{text}: message does not name {key}: {out}"
        );
    }
    let (code, out, _) = run_bin(
        &["check-config", "--config", "/nonexistent/x.toml"],
        &[],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(64));
    assert!(out.is_empty());
}

#[test]
fn check_config_prints_the_redis_deployment_without_secrets() {
    let ok = [
        (
            "redis://app:pw1@10.0.0.5:6380/2",
            "redis single 10.0.0.5:6380 db 2 user app password ***",
        ),
        (
            "redis-sentinel://:pw2@10.0.0.1:26379?sentinelServiceName=sale&node=10.0.0.2:26379&sentinelPassword=pw3",
            "redis sentinel (service sale) 10.0.0.1:26379, 10.0.0.2:26379 password *** sentinel password ***",
        ),
        (
            "redis-cluster://10.0.0.1:7000?node=10.0.0.2:7000",
            "redis cluster (seed nodes; the rest discovered) 10.0.0.1:7000, 10.0.0.2:7000",
        ),
        ("rediss://10.0.0.5:6380", "redis single 10.0.0.5:6380 tls"),
    ];
    for (url, shown) in ok {
        let (code, out) = check_config(&format!(
            "[store]\nbackend = \"redis\"\nredis_url = \"{url}\"\n"
        ));
        assert_eq!(code, Some(0), "{url}: {out}");
        assert!(out.contains(shown), "{url}: {out}");
        for secret in ["pw1", "pw2", "pw3"] {
            assert!(!out.contains(secret), "{url}: {out}");
        }
    }
    let bad = [
        ("redis://10.0.0.5:6380/x", "nvalid"),
        ("redis-sentinel://10.0.0.1:26379", "service name"),
        ("redis-cluster://10.0.0.1:7000/1", "database 0 only"),
        ("mongodb://10.0.0.1", "must start with"),
    ];
    for (url, why) in bad {
        let (code, out) = check_config(&format!(
            "[store]\nbackend = \"redis\"\nredis_url = \"{url}\"\n"
        ));
        assert_eq!(code, Some(64), "{url}: {out}");
        assert!(
            out.contains("store.redis_url") && out.contains(why),
            "{url}: {out}"
        );
    }
}

#[test]
fn shipped_configs_pass_check_config() {
    for file in [
        "conf/gateway.toml",
        "conf/gateway.prod.toml",
        "docker/gateway.docker.toml",
    ] {
        let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
        let (code, out, err) = run_bin(
            &["check-config", "--config", &path],
            &[],
            Duration::from_secs(10),
        );
        assert_eq!(code, Some(0), "{file}: {err}");
        assert!(out.contains("OK"), "{out}");
    }
}

#[test]
fn help_lists_the_subcommands() {
    let (code, out, _) = run_bin(&["--help"], &[], Duration::from_secs(10));
    assert_eq!(code, Some(0));
    assert!(
        out.contains("serve") && out.contains("check-config"),
        "{out}"
    );
}
