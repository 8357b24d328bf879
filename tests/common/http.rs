//! The ordinary HTTP client of the tests: `ureq` (a real HTTP/1.1 client crate) with keep-alive,
//! no redirects followed, no proxy from the environment, and every status returned as a response
//! (a 4xx is an answer to assert on, not an error). Byte-level cases use `raw::RawConn`.

use std::net::SocketAddr;
use std::time::Duration;

use ureq::Agent;

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
}

/// What both clients can do, for helpers that serve ordinary and byte-level tests alike.
pub trait Http {
    fn request(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Response>;
}

impl Http for Client {
    fn request(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Response> {
        Client::request(self, method, target, headers, body)
    }
}

impl Http for super::raw::RawConn {
    fn request(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Response> {
        super::raw::RawConn::request(self, method, target, headers, body)
    }
}

/// A client for one listener (gateway, admin port, nginx), reusing its connections.
#[derive(Clone)]
pub struct Client {
    base: String,
    agent: Agent,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let agent: Agent = Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .allow_non_standard_methods(true)
            .proxy(None)
            .timeout_connect(Some(Duration::from_secs(2)))
            .timeout_global(Some(Duration::from_secs(10)))
            .user_agent("vq-gateway-tests")
            .build()
            .into();
        Client {
            base: format!("http://{addr}"),
            agent,
        }
    }

    /// Sends one request; an `Err` is a transport failure (refused, reset, timed out).
    pub fn request(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Response> {
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{target}", self.base));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let with_body = !body.is_empty() || matches!(method, "POST" | "PUT" | "PATCH");
        let result = if with_body {
            let req = req.body(body).map_err(std::io::Error::other)?;
            self.agent.run(req)
        } else {
            let req = req.body(()).map_err(std::io::Error::other)?;
            self.agent.run(req)
        };
        let mut resp = result.map_err(|e| match e {
            ureq::Error::Io(io) => io,
            other => std::io::Error::other(other),
        })?;
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = if method == "HEAD" {
            Vec::new()
        } else {
            resp.body_mut()
                .with_config()
                .limit(64 * 1024 * 1024)
                .read_to_vec()
                .map_err(|e| match e {
                    ureq::Error::Io(io) => io,
                    other => std::io::Error::other(other),
                })?
        };
        Ok(Response {
            status,
            headers,
            body,
        })
    }

    pub fn get(&mut self, target: &str, headers: &[(&str, &str)]) -> std::io::Result<Response> {
        self.request("GET", target, headers, b"")
    }
}
