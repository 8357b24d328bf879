//! The admin listener (keep it private): `/healthz`, `/readyz`, `/metrics`, the sales
//! (`/sales`, `sales.rs`), the flag (`/flag`) and the operator console (`/console`,
//! `console.rs`).
//!
//! `/readyz` answers 200 once the public listener accepts connections and the store's start-up is
//! over (Redis connected with its scripts loaded, or given up on after a short wait). It reports
//! the store's state in its body but never turns not-ready because Redis is down: a load balancer
//! that pulled every replica then would defeat failing open
//! (docs/operations.md#health-and-shutdown).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

pub mod console;
pub mod sales;

use crate::app::AppState;
use crate::settings::FlagWriter;
use crate::store::QueueStore;

pub struct AdminApp {
    state: Arc<AppState>,
    /// The admin writes' credential (`server.admin_token_env`); `None`: writes are refused.
    token: Option<sales::AdminToken>,
    /// Where a flag change is written (Redis' flag document); `None`: the local flag (the
    /// memory store, one process).
    flag: Option<Arc<dyn FlagWriter>>,
}

impl AdminApp {
    pub fn new(state: Arc<AppState>, token: Option<sales::AdminToken>) -> AdminApp {
        AdminApp {
            state,
            token,
            flag: None,
        }
    }

    /// Flag changes go through `writer` (every replica reads what it writes).
    pub fn with_flag_writer(mut self, writer: Arc<dyn FlagWriter>) -> AdminApp {
        self.flag = Some(writer);
        self
    }

    /// The request body, up to `MAX_BODY` bytes (`None`: larger, or the read failed).
    async fn body(session: &mut ServerSession) -> Option<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            match session.read_request_body().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > sales::MAX_BODY {
                        return None;
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => return Some(body),
                Err(_) => return None,
            }
        }
    }

    async fn ready(&self) -> (u16, String) {
        let listen = self.state.config.server.listen;
        let proxy_up = matches!(
            tokio::time::timeout(
                Duration::from_millis(200),
                tokio::net::TcpStream::connect(listen)
            )
            .await,
            Ok(Ok(_))
        );
        let store = match self.state.store.ping().await {
            Ok(()) => "ok",
            Err(_) => "unavailable (failing open)",
        };
        let draining = self
            .state
            .draining
            .load(std::sync::atomic::Ordering::Relaxed);
        let ready = proxy_up && self.state.store.started() && !draining;
        let status = if ready { 200 } else { 503 };
        let body = serde_json::json!({
            "ready": ready,
            "draining": draining,
            "store": self.state.store.kind(),
            "storeState": store,
            "degraded": self.state.store.degraded(),
            "failOpenMode": self.state.config.fail_open.mode.as_str(),
        });
        (status, body.to_string())
    }
}

/// A JSON answer of the sales, flag or console endpoints (204: no body, no length, no type).
fn json(answer: sales::SalesAnswer) -> Response<Vec<u8>> {
    let (status, body) = answer;
    let body = body.map_or_else(Vec::new, |j| j.to_string().into_bytes());
    let mut r = response(status, "application/json", body);
    if status == 204 {
        // No content: no Content-Length either (RFC 9110 §8.6).
        r.headers_mut().remove(http::header::CONTENT_LENGTH);
        r.headers_mut().remove(http::header::CONTENT_TYPE);
    }
    r
}

/// One of the console's embedded files, with headers that keep the page to itself: nothing
/// loaded from elsewhere, no inline script, never framed, never cached across versions.
fn console_file(content_type: &str, body: &str) -> Response<Vec<u8>> {
    let mut r = response(200, content_type, body.as_bytes().to_vec());
    let headers = r.headers_mut();
    for (name, value) in [
        (
            "content-security-policy",
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("cache-control", "no-store"),
    ] {
        headers.insert(
            http::HeaderName::from_static(name),
            http::HeaderValue::from_static(value),
        );
    }
    r
}

/// The client's address, for the audit log.
fn peer(session: &ServerSession) -> String {
    session
        .client_addr()
        .map(|a| a.to_string())
        .unwrap_or_default()
}

/// `since=MS` of a query string (0 when absent or not a number).
fn since(query: Option<&str>) -> u64 {
    query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("since="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn response(status: u16, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    let mut r = Response::new(Vec::new());
    *r.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
    let headers = r.headers_mut();
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        headers.insert(http::header::CONTENT_TYPE, v);
    }
    headers.insert(
        http::header::CONTENT_LENGTH,
        http::HeaderValue::from(body.len()),
    );
    *r.body_mut() = body;
    r
}

/// Whether the admin listener answers a request with this `Host` header (`None`: none sent, as
/// HTTP/1.0 tools do; a browser always sends one): an IP address, `localhost`, or a name of
/// `server.admin_hosts`, with or without a port. A page served under another name that an
/// attacker rebinds to this address (DNS rebinding) is refused.
pub fn host_allowed(host: Option<&[u8]>, names: &[String]) -> bool {
    let Some(host) = host else {
        return true;
    };
    let Ok(host) = std::str::from_utf8(host) else {
        return false;
    };
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        match rest.split_once(']') {
            Some((v6, port)) if port.is_empty() || port.starts_with(':') => {
                return v6.parse::<std::net::Ipv6Addr>().is_ok() && port_ok(port.strip_prefix(':'));
            }
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => {
                if !port_ok(Some(port)) {
                    return false;
                }
                name
            }
            None => host,
        }
    };
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    name.parse::<std::net::Ipv4Addr>().is_ok() || name == "localhost" || names.contains(&name)
}

fn port_ok(port: Option<&str>) -> bool {
    port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let path = session.req_header().uri.path().to_string();
        // Health checks answer whoever asks (orchestrators probe by any name); everything else
        // only to the names this listener is reached by.
        let hosts = session.req_header().headers.get_all(http::header::HOST);
        let mut hosts = hosts.iter();
        let host = hosts.next().map(|h| h.as_bytes());
        let single = hosts.next().is_none();
        if path != "/healthz"
            && path != "/readyz"
            && !(single && host_allowed(host, &self.state.config.server.admin_hosts))
        {
            let _ = session.drain_request_body().await;
            return response(
                421,
                "application/json",
                br#"{"code":"UNKNOWN_HOST","detail":"this admin listener answers its IP addresses, localhost and server.admin_hosts"}"#
                    .to_vec(),
            );
        }
        let flag_write = path == "/flag" && session.req_header().method == http::Method::PUT;
        if flag_write || path == "/sales" || path.starts_with("/sales/") {
            let Some(body) = AdminApp::body(session).await else {
                return json((
                    413,
                    Some(serde_json::json!({
                        "code": "PAYLOAD_TOO_LARGE",
                        "detail": "an admin change is a small JSON object",
                    })),
                ));
            };
            let peer = peer(session);
            let header = session.req_header();
            let authorization = header
                .headers
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes());
            if flag_write {
                let who = match sales::authorize(self.token.as_ref(), authorization) {
                    Ok(who) => who,
                    Err(refused) => return json(refused),
                };
                let writer = self.flag.as_deref();
                return json(console::put_flag(&self.state, writer, &body, &who, &peer).await);
            }
            let request = sales::SalesRequest {
                method: &header.method,
                peer: &peer,
                path: &path,
                authorization,
                body: &body,
            };
            return json(sales::handle(&self.state, self.token.as_ref(), request).await);
        }
        let _ = session.drain_request_body().await;
        let get = session.req_header().method == http::Method::GET;
        match (get, path.as_str()) {
            (true, "/healthz") => response(200, "application/json", br#"{"status":"ok"}"#.to_vec()),
            (true, "/readyz") => {
                let (status, body) = self.ready().await;
                response(status, "application/json", body.into_bytes())
            }
            (true, "/metrics") => response(
                200,
                "text/plain; version=0.0.4",
                self.state.metrics.render(),
            ),
            (true, "/flag") => json((200, Some(console::flag_json(&self.state)))),
            (true, "/console") => console_file("text/html; charset=utf-8", console::PAGE),
            (true, "/console/console.js") => {
                console_file("text/javascript; charset=utf-8", console::SCRIPT)
            }
            (true, "/console/console.css") => {
                console_file("text/css; charset=utf-8", console::STYLE)
            }
            (true, "/console/state") => {
                let since = since(session.req_header().uri.query());
                json(console::state(&self.state, since).await)
            }
            (
                false,
                "/healthz" | "/readyz" | "/metrics" | "/console" | "/console/console.js"
                | "/console/console.css" | "/console/state",
            ) => response(
                405,
                "application/json",
                br#"{"code":"METHOD_NOT_ALLOWED","detail":"use GET"}"#.to_vec(),
            ),
            (false, "/flag") => response(
                405,
                "application/json",
                br#"{"code":"METHOD_NOT_ALLOWED","detail":"GET or PUT"}"#.to_vec(),
            ),
            _ => response(
                404,
                "application/json",
                br#"{"code":"NOT_FOUND","detail":"admin endpoints: /healthz /readyz /metrics /sales /flag /console"}"#
                    .to_vec(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn ip_addresses_localhost_and_configured_names_only() {
        let names = vec!["gateway-1".to_string()];
        for ok in [
            None,
            Some("127.0.0.1"),
            Some("127.0.0.1:9090"),
            Some("10.1.2.3:9090"),
            Some("[::1]:9090"),
            Some("[::1]"),
            Some("localhost:9090"),
            Some("LOCALHOST"),
            Some("gateway-1:9090"),
            Some("Gateway-1."),
        ] {
            assert!(host_allowed(ok.map(str::as_bytes), &names), "{ok:?}");
        }
        for bad in [
            "evil.example",
            "evil.example:9090",
            "127.0.0.1.evil.example",
            "gateway-1.evil.example",
            "localhost.evil",
            "[::1]x",
            "[zz]:1",
            "127.0.0.1:99999x",
            "127.0.0.1:",
            "",
        ] {
            assert!(!host_allowed(Some(bad.as_bytes()), &names), "{bad:?}");
        }
    }
}
