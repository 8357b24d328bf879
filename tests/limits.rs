//! Limits of the public listener: connections at once, a first-byte deadline, header size and
//! count, and logs that never carry a credential at any level.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;

/// Whether the server closed `s` (EOF or reset) within `timeout`.
fn closed_within(s: &mut TcpStream, timeout: Duration) -> bool {
    s.set_read_timeout(Some(timeout)).unwrap();
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
        && {
            // A timeout error is not a close.
            s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
            !matches!(s.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut)
        }
}

#[test]
fn connections_beyond_the_limit_are_closed_and_room_comes_back() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.server.max_connections = 5;
    cfg.server.first_byte_timeout_ms = 20_000;
    let gw = GatewayProc::start(cfg);
    // Five connections, each with a request the backend takes 3 s to answer: busy with the
    // backend, none of them may be evicted.
    let mut busy: Vec<TcpStream> = (0..5)
        .map(|i| {
            let mut s = TcpStream::connect(gw.listen).unwrap();
            s.write_all(
                format!("GET /slow{i} HTTP/1.1\r\nHost: x\r\nx-upstream-delay-ms: 3000\r\n\r\n")
                    .as_bytes(),
            )
            .unwrap();
            s
        })
        .collect();
    assert!(wait_until(Duration::from_secs(3), || up.count() == 5));
    let mut sixth = TcpStream::connect(gw.listen).unwrap();
    sixth
        .write_all(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(
        closed_within(&mut sixth, Duration::from_secs(2)),
        "the sixth connection was served"
    );
    // The five are answered (read whole: what is left unread would look like more to read).
    for s in &mut busy {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 12];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"HTTP/1.1 200");
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut rest = [0u8; 4096];
        while matches!(s.read(&mut rest), Ok(n) if n > 0) {}
    }
    assert!(gw
        .metrics()
        .contains("vq_gateway_connections_refused_total{reason=\"max_connections\"}"));
    assert!(up.requests().iter().all(|r| r.target != "/b"));
    // Now idle (kept alive, waiting on their clients): a new connection takes the place of one.
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(gw.client().get("/d", &[]).unwrap().status, 200);
    let evicted = busy
        .iter_mut()
        .map(|s| closed_within(s, Duration::from_millis(500)))
        .filter(|closed| *closed)
        .count();
    assert_eq!(evicted, 1, "one idle connection made room");
    assert!(gw
        .metrics()
        .contains("vq_gateway_connections_refused_total{reason=\"evicted\"} 1"));
}

#[test]
fn a_silent_connection_is_closed_after_the_first_byte_timeout() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.server.first_byte_timeout_ms = 300;
    let gw = GatewayProc::start(cfg);
    let t = Instant::now();
    let mut s = TcpStream::connect(gw.listen).unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(3)));
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(250), "{took:?}");
    assert!(wait_until(Duration::from_secs(2), || gw
        .metrics()
        .contains(
            "vq_gateway_connections_refused_total{reason=\"first_byte_timeout\"} 1"
        )));
    // A kept-alive connection idles for keepalive_idle_s, not the first-byte timeout.
    let mut c = gw.raw();
    assert_eq!(c.get("/a", &[]).unwrap().status, 200);
    let port = c.local_port();
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(c.get("/b", &[]).unwrap().status, 200);
    assert_eq!(
        c.local_port(),
        port,
        "the idle keep-alive connection was closed"
    );
}

#[test]
fn oversized_or_too_many_headers_get_431_and_reach_nothing() {
    let up = Upstream::start();
    let gw = GatewayProc::start(test_config(up.addr));
    let big = "a".repeat(40 * 1024);
    let r = gw.client().get("/x", &[("X-Big", &big)]).unwrap();
    assert_eq!(r.status, 431);
    assert_eq!(r.json()["code"], "HEADERS_TOO_LARGE");
    let names: Vec<String> = (0..120).map(|i| format!("X-H{i}")).collect();
    let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
    let r = gw.client().get("/y", &many).unwrap();
    assert_eq!(r.status, 431);
    // Past Pingora's own limits (256 fields, a MiB): still 431, answered as the bytes arrive.
    let names300: Vec<String> = (0..300).map(|i| format!("X-H{i}")).collect();
    let many: Vec<(&str, &str)> = names300.iter().map(|n| (n.as_str(), "1")).collect();
    let r = gw.client().get("/y", &many).unwrap();
    assert_eq!(r.status, 431);
    assert_eq!(r.json()["code"], "HEADERS_TOO_LARGE");
    let huge = "b".repeat(1024 * 1024);
    if let Ok(r) = gw.client().get("/z", &[("X-Huge", &huge)]) {
        assert_eq!(r.status, 431);
    }
    assert_eq!(up.count(), 0, "{:?}", up.requests().len());
    // Ordinary requests are unaffected.
    let ok: Vec<(&str, &str)> = names[..40].iter().map(|n| (n.as_str(), "1")).collect();
    assert_eq!(gw.client().get("/ok", &ok).unwrap().status, 200);
}

#[test]
fn no_log_level_carries_a_credential() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.flag.enabled = true;
    let gw = GatewayProc::start_with_env(
        cfg,
        &[("VQ_TOKEN_SECRET", TEST_SECRET), ("RUST_LOG", "trace")],
    );
    let mut c = gw.client();
    let r = c
        .request(
            "POST",
            "/virtual-queues/limited-drop/42/entries",
            &[("X-User-Id", "987654321")],
            b"",
        )
        .unwrap();
    let token = r.json()["entryToken"].as_str().map(String::from);
    let mut headers = vec![
        ("X-User-Id", "987654321"),
        ("Authorization", "Bearer SECRET-AUTH-VALUE"),
        ("Cookie", "session=SECRET-COOKIE-VALUE"),
    ];
    let t = token.clone().unwrap_or_else(|| "SECRET-TOKEN-VALUE".into());
    headers.push(("X-Entry-Token", &t));
    let _ = c.request("POST", "/limited-drops/42/orders", &headers, b"{}");
    let _ = c.request("GET", "/products", &headers, b"");
    assert!(wait_until(Duration::from_secs(3), || gw
        .log()
        .matches("request")
        .count()
        >= 3));
    let log = gw.log();
    for secret in [
        "987654321",
        "SECRET-AUTH-VALUE",
        "SECRET-COOKIE-VALUE",
        t.as_str(),
        TEST_SECRET,
    ] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
}

/// Writes one request on `s` and reads its response head and Content-Length body; the status.
fn exchange(s: &mut TcpStream, target: &str, extra: &str) -> u16 {
    s.write_all(format!("GET {target} HTTP/1.1\r\nHost: x\r\n{extra}\r\n").as_bytes())
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "closed mid-response");
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    head[9..12].parse().unwrap()
}

/// Whether the server ended `s` within `timeout`, reading past anything it sent first.
fn ended_within(s: &mut TcpStream, timeout: Duration) -> bool {
    let until = Instant::now() + timeout;
    let mut b = [0u8; 512];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// Sends a request header on `s` a field at a time, one every `step`, at most `fields` of them,
/// never its end; whether the server ended the connection meanwhile.
fn trickle_header(s: &mut TcpStream, fields: usize, step: Duration) -> bool {
    s.write_all(b"GET /trickled HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    for i in 0..fields {
        if ended_within(s, step) || s.write_all(format!("X-F{i}: v\r\n").as_bytes()).is_err() {
            return true;
        }
    }
    false
}

/// How long `s` stays open from now, asserting that the gateway ends it within `limit`.
fn open_for(s: &mut TcpStream, limit: Duration) -> Duration {
    let t = Instant::now();
    assert!(ended_within(s, limit), "the idle connection stayed open");
    t.elapsed()
}

/// Asserts that `took` lies in `low_ms..=high_ms` (a bound the gateway keeps, with the slack of
/// shared cores), naming `what` took that long.
fn assert_took(took: Duration, low_ms: u64, high_ms: u64, what: &str) {
    assert!(
        took >= Duration::from_millis(low_ms) && took <= Duration::from_millis(high_ms),
        "{what} after {took:?}, not within {low_ms}..={high_ms} ms"
    );
}

#[test]
fn a_kept_alive_connection_is_closed_once_idle_for_keepalive_idle_s_after_its_last_request() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.server.keepalive_idle_s = 1;
    let gw = GatewayProc::start(cfg);
    let mut s = TcpStream::connect(gw.listen).unwrap();
    // Requests 0.7 s apart keep it open past 1 s in all: the bound counts from the last
    // request's end, for proxied and locally answered requests alike.
    assert_eq!(exchange(&mut s, "/a", ""), 200);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(exchange(&mut s, "/b", ""), 200);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        exchange(&mut s, "/virtual-queues/limited-drop/42/stats", ""),
        200
    );
    let took = open_for(&mut s, Duration::from_secs(3));
    assert_took(took, 850, 2500, "closed idle");
    assert_eq!(up.count(), 2);
}

#[test]
fn the_idle_bound_spares_a_slow_request_and_ends_a_trickled_header() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.server.keepalive_idle_s = 1;
    let gw = GatewayProc::start(cfg);
    let mut s = TcpStream::connect(gw.listen).unwrap();
    // A request in progress is not idle, however long the backend takes.
    assert_eq!(
        exchange(&mut s, "/slow", "x-upstream-delay-ms: 1600\r\n"),
        200
    );
    // The next request's header, sent a field at a time: every read brings a byte, but the
    // whole header does not arrive within the bound, so the connection ends.
    let t = Instant::now();
    let ended = trickle_header(&mut s, 16, Duration::from_millis(250));
    let took = t.elapsed();
    assert!(ended, "a header trickled for {took:?} kept the connection");
    assert_took(took, 850, 2500, "the trickled header ended");
    let seen: Vec<String> = up.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(seen, vec!["/slow".to_string()]);
}

#[test]
fn a_first_request_header_trickled_past_the_first_byte_timeout_ends_the_connection() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.server.first_byte_timeout_ms = 800;
    let gw = GatewayProc::start(cfg);
    let mut s = TcpStream::connect(gw.listen).unwrap();
    let t = Instant::now();
    // Every read brings bytes, but the whole first header does not arrive within the bound.
    let ended = trickle_header(&mut s, 20, Duration::from_millis(200));
    let took = t.elapsed();
    assert!(
        ended,
        "a first header trickled for {took:?} kept the connection"
    );
    assert_took(took, 700, 2500, "the trickled first header ended");
    assert_eq!(up.count(), 0);
    assert!(gw
        .metrics()
        .contains("vq_gateway_connections_refused_total{reason=\"first_byte_timeout\"} 1"));
    // A first header that arrives in time is served, and its connection then idles for
    // keepalive_idle_s.
    let mut c = gw.raw();
    assert_eq!(c.get("/a", &[]).unwrap().status, 200);
    let port = c.local_port();
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(c.get("/b", &[]).unwrap().status, 200);
    assert_eq!(c.local_port(), port, "the kept-alive connection was closed");
}

#[test]
fn a_longer_first_request_bound_does_not_stretch_the_keep_alive_bound() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.server.first_byte_timeout_ms = 6_000;
    cfg.server.keepalive_idle_s = 1;
    let gw = GatewayProc::start(cfg);
    let mut s = TcpStream::connect(gw.listen).unwrap();
    // The gateway waits for the first request (its bound, 6 s, armed) before it comes.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(exchange(&mut s, "/a", ""), 200);
    // Then the connection idles: the keep-alive bound (1 s) ends it, not the first one.
    let took = open_for(&mut s, Duration::from_secs(4));
    assert_took(took, 850, 2500, "closed idle");
}
