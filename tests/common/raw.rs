//! A raw HTTP/1.1 connection, for the byte-level cases only (path and header spellings a client
//! library would normalise or refuse, request smuggling, connection reuse and close): requests
//! written byte for byte, responses parsed by Content-Length, chunked encoding or connection
//! close. Ordinary requests use `http::Client` (a real client crate).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::http::Response;

pub struct RawConn {
    addr: SocketAddr,
    reader: Option<BufReader<TcpStream>>,
}

impl RawConn {
    pub fn connect(addr: SocketAddr) -> RawConn {
        RawConn { addr, reader: None }
    }

    fn stream(&mut self) -> std::io::Result<&mut BufReader<TcpStream>> {
        if self.reader.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            s.set_nodelay(true)?;
            self.reader = Some(BufReader::new(s));
        }
        Ok(self.reader.as_mut().expect("just set"))
    }

    /// The local port of the current connection (to tell whether it was reused).
    pub fn local_port(&mut self) -> Option<u16> {
        self.reader
            .as_ref()
            .and_then(|r| r.get_ref().local_addr().ok())
            .map(|a| a.port())
    }

    pub fn is_connected(&self) -> bool {
        self.reader.is_some()
    }

    pub fn request(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Response> {
        let mut req = format!("{method} {target} HTTP/1.1\r\nHost: gateway.test\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if !body.is_empty() || method == "POST" || method == "PUT" {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        self.send_raw(&bytes, method == "HEAD")
    }

    pub fn get(&mut self, target: &str, headers: &[(&str, &str)]) -> std::io::Result<Response> {
        self.request("GET", target, headers, b"")
    }

    /// Sends raw bytes and reads one response.
    pub fn send_raw(&mut self, bytes: &[u8], head: bool) -> std::io::Result<Response> {
        let r = self.stream()?;
        r.get_mut().write_all(bytes)?;
        let result = read_response(r, head);
        match &result {
            Ok(resp)
                if resp
                    .header("connection")
                    .is_some_and(|v| v.eq_ignore_ascii_case("close")) =>
            {
                self.reader = None;
            }
            Err(_) => self.reader = None,
            _ => {}
        }
        result
    }

    /// True when the server has closed this connection (reads EOF without blocking long).
    pub fn server_closed(&mut self) -> bool {
        let Some(r) = self.reader.as_mut() else {
            return true;
        };
        let _ = r
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(200)));
        let mut buf = [0u8; 1];
        let closed = matches!(r.get_mut().read(&mut buf), Ok(0));
        let _ = r.get_ref().set_read_timeout(Some(Duration::from_secs(10)));
        closed
    }
}

fn read_line(r: &mut impl BufRead) -> std::io::Result<String> {
    let mut line = String::new();
    let n = r.read_line(&mut line)?;
    if n == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

pub fn read_response(r: &mut BufReader<TcpStream>, head: bool) -> std::io::Result<Response> {
    loop {
        let resp = read_one(r, head)?;
        // Interim answers (100 Continue, 103) come before the real one.
        if !(100..200).contains(&resp.status) || resp.status == 101 {
            return Ok(resp);
        }
    }
}

fn read_one(r: &mut BufReader<TcpStream>, head: bool) -> std::io::Result<Response> {
    let status_line = read_line(r)?;
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {status_line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let line = read_line(r)?;
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let mut resp = Response {
        status,
        headers,
        body: Vec::new(),
    };
    if head || status == 204 || status == 304 || (100..200).contains(&status) {
        return Ok(resp);
    }
    if let Some(len) = resp.header("content-length") {
        let len: usize = len.parse().map_err(std::io::Error::other)?;
        let mut body = vec![0; len];
        r.read_exact(&mut body)?;
        resp.body = body;
    } else if resp
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let size = read_line(r)?;
            let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
                .map_err(std::io::Error::other)?;
            if size == 0 {
                read_line(r)?;
                break;
            }
            let mut chunk = vec![0; size];
            r.read_exact(&mut chunk)?;
            resp.body.extend_from_slice(&chunk);
            read_line(r)?;
        }
    } else {
        r.read_to_end(&mut resp.body)?;
        resp.headers.push(("connection".into(), "close".into()));
    }
    Ok(resp)
}
