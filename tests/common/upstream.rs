//! A real HTTP/1.1 backend that records what it receives.
//!
//! It answers 200 with a small JSON echo by default. A test steers it per request with headers:
//! `x-upstream-status: 409` answers that status, `x-upstream-delay-ms: 800` answers late,
//! `x-upstream-size: 8000000` answers a body of that many bytes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// The request target exactly as received.
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// When the request head arrived (epoch ms).
    pub at_ms: u64,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn headers_named(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

pub struct Upstream {
    pub addr: SocketAddr,
    requests: Arc<Mutex<Vec<Recorded>>>,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (reqs, stopping) = (requests.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let reqs = reqs.clone();
                std::thread::spawn(move || serve(conn, reqs));
            }
        });
        Upstream {
            addr,
            requests,
            stop,
        }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    pub fn clear(&self) {
        self.requests.lock().unwrap().clear();
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(conn: TcpStream, requests: Arc<Mutex<Vec<Recorded>>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(conn);
    loop {
        let Some(req) = read_request(&mut reader) else {
            return;
        };
        requests.lock().unwrap().push(req.clone());
        if req.header("x-upstream-continue").is_some() {
            // An interim answer first, as a servlet container does when it reads the body.
            if reader
                .get_mut()
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .is_err()
            {
                return;
            }
        }
        // (An auth service's subrequest carries the client's headers too: the delay is the
        // backend's only.)
        if let Some(ms) = req
            .header("x-upstream-delay-ms")
            .and_then(|v| v.parse().ok())
            .filter(|_| !req.target.starts_with("/session"))
        {
            std::thread::sleep(Duration::from_millis(ms));
        }
        let mut status: u16 = req
            .header("x-upstream-status")
            .and_then(|v| v.parse().ok())
            .unwrap_or(200);
        // An auth service (nginx's auth_request): the session cookie names the user;
        // `session=reject` is turned away, no cookie is an anonymous 200.
        let mut auth = String::new();
        if req.target.starts_with("/session") {
            // The client's own test headers are for the backend, not the auth service.
            status = 200;
            let session = req.header("cookie").and_then(|c| {
                c.split(';')
                    .find_map(|p| p.trim().strip_prefix("session=").map(str::to_string))
            });
            match session.as_deref() {
                Some("reject") => status = 401,
                Some(user) => auth = format!("X-User-Id: {user}\r\n"),
                None => {}
            }
        }
        let body = serde_json::json!({
            "method": req.method,
            "target": req.target,
            "bodyLen": req.body.len(),
        })
        .to_string();
        let close = req
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        // 204 and 304 carry no body; 101 switches the connection (the recorder then keeps
        // reading requests from it, as a backend that mis-handles an upgrade would).
        let body = if matches!(status, 101 | 204 | 304) {
            String::new()
        } else if let Some(size) = req.header("x-upstream-size").and_then(|v| v.parse().ok()) {
            "x".repeat(size)
        } else {
            body
        };
        let framing = match status {
            101 => "Upgrade: websocket\r\nConnection: Upgrade\r\n".to_string(),
            204 | 304 => String::new(),
            _ => format!("Content-Length: {}\r\n", body.len()),
        };
        let resp = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nX-Upstream: recorder\r\n{auth}{framing}{}\r\n{body}",
            if close { "Connection: close\r\n" } else { "" }
        );
        if reader.get_mut().write_all(resp.as_bytes()).is_err() || close {
            return;
        }
    }
}

fn read_request(r: &mut BufReader<TcpStream>) -> Option<Recorded> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.trim_end().splitn(3, ' ');
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let mut req = Recorded {
        method,
        target,
        headers,
        body: Vec::new(),
        at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
    };
    if let Some(len) = req
        .header("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        let mut body = vec![0; len];
        r.read_exact(&mut body).ok()?;
        req.body = body;
    } else if req
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            req.body.extend_from_slice(&chunk[..size]);
        }
    }
    Some(req)
}
