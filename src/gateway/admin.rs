//! The admin listener (keep it private): `/healthz`, `/readyz`, `/metrics`, and the sales
//! (`/sales`, `sales.rs`).
//!
//! `/readyz` answers 200 once the public listener accepts connections and the store's start-up is
//! over (Redis connected with its scripts loaded, or given up on after a short wait). It reports
//! the store's state in its body but never turns not-ready because Redis is down: a load balancer
//! that pulled every replica then would defeat failing open (SPEC §7).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::app::AppState;
use crate::store::QueueStore;

pub struct AdminApp {
    state: Arc<AppState>,
    /// The admin writes' credential (`server.admin_token_env`); `None`: writes are refused.
    token: Option<super::sales::AdminToken>,
}

impl AdminApp {
    pub fn new(state: Arc<AppState>, token: Option<super::sales::AdminToken>) -> AdminApp {
        AdminApp { state, token }
    }

    /// The request body, up to `MAX_BODY` bytes (`None`: larger, or the read failed).
    async fn body(session: &mut ServerSession) -> Option<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            match session.read_request_body().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > super::sales::MAX_BODY {
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

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let path = session.req_header().uri.path().to_string();
        if path == "/sales" || path.starts_with("/sales/") {
            let Some(body) = AdminApp::body(session).await else {
                return response(
                    413,
                    "application/json",
                    br#"{"code":"PAYLOAD_TOO_LARGE","detail":"a sale change is a small JSON object"}"#
                        .to_vec(),
                );
            };
            let header = session.req_header();
            let request = super::sales::SalesRequest {
                method: &header.method,
                path: &path,
                authorization: header
                    .headers
                    .get(http::header::AUTHORIZATION)
                    .map(|v| v.as_bytes()),
                body: &body,
            };
            let (status, json) =
                super::sales::handle(&self.state, self.token.as_ref(), request).await;
            let body = json.map_or_else(Vec::new, |j| j.to_string().into_bytes());
            let mut answer = response(status, "application/json", body);
            if status == 204 {
                // No content: no Content-Length either (RFC 9110 §8.6).
                answer.headers_mut().remove(http::header::CONTENT_LENGTH);
                answer.headers_mut().remove(http::header::CONTENT_TYPE);
            }
            return answer;
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
            (false, "/healthz" | "/readyz" | "/metrics") => response(
                405,
                "application/json",
                br#"{"code":"METHOD_NOT_ALLOWED","detail":"use GET"}"#.to_vec(),
            ),
            _ => response(
                404,
                "application/json",
                br#"{"code":"NOT_FOUND","detail":"admin endpoints: /healthz /readyz /metrics /sales"}"#
                    .to_vec(),
            ),
        }
    }
}
