//! A private `redis-server` per test, and a minimal synchronous RESP client for assertions.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, wait_until, TempDir};

#[derive(Debug, Clone, PartialEq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

impl Resp {
    pub fn as_str(&self) -> Option<String> {
        match self {
            Resp::Simple(s) => Some(s.clone()),
            Resp::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Resp::Int(i) => Some(i.to_string()),
            _ => None,
        }
    }

    pub fn as_int(&self) -> i64 {
        match self {
            Resp::Int(i) => *i,
            other => other
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("not an integer: {other:?}")),
        }
    }

    pub fn as_vec(&self) -> Vec<Resp> {
        match self {
            Resp::Array(Some(v)) => v.clone(),
            other => panic!("not an array: {other:?}"),
        }
    }
}

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: TempDir,
    persistent: bool,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        let mut r = RedisServer {
            child: None,
            port: free_port(),
            dir: TempDir::new("redis"),
            persistent: false,
        };
        r.spawn();
        r
    }

    /// With an append-only file fsynced on every write, as production runs it: a restart
    /// keeps every key (scripts are still gone).
    pub fn start_persistent() -> RedisServer {
        let mut r = RedisServer {
            child: None,
            port: free_port(),
            dir: TempDir::new("redis"),
            persistent: true,
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                if self.persistent { "yes" } else { "no" },
                "--appendfsync",
                "always",
                "--dir",
            ])
            .arg(&self.dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        self.child = Some(child);
        let port = self.port;
        assert!(
            wait_until(Duration::from_secs(10), || {
                TcpStream::connect(("127.0.0.1", port)).is_ok_and(|s| {
                    let mut c = RespConn::new(s);
                    c.cmd(&["PING"])
                        .is_ok_and(|r| r == Resp::Simple("PONG".into()))
                })
            }),
            "redis-server did not start on {port}"
        );
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs one command on a fresh connection.
    pub fn cmd(&self, args: &[&str]) -> Resp {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        RespConn::new(s).cmd(args).unwrap()
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, empty (no persistence): keys and the script cache are gone.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([&format!("-{sig}"), &c.id().to_string()])
                .status();
        }
    }

    pub fn pause(&self) {
        self.signal("STOP");
    }

    pub fn resume(&self) {
        self.signal("CONT");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}

pub struct RespConn {
    r: BufReader<TcpStream>,
}

impl RespConn {
    pub fn new(s: TcpStream) -> RespConn {
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        RespConn {
            r: BufReader::new(s),
        }
    }

    pub fn cmd(&mut self, args: &[&str]) -> std::io::Result<Resp> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        self.r.get_mut().write_all(&out)?;
        read_resp(&mut self.r)
    }
}

fn read_resp(r: &mut BufReader<TcpStream>) -> std::io::Result<Resp> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "closed",
        ));
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(1);
    let bad = || std::io::Error::other(format!("bad RESP line {line:?}"));
    Ok(match kind {
        "+" => Resp::Simple(rest.to_string()),
        "-" => Resp::Error(rest.to_string()),
        ":" => Resp::Int(rest.parse().map_err(|_| bad())?),
        "$" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            if n < 0 {
                Resp::Bulk(None)
            } else {
                let mut b = vec![0; n as usize + 2];
                r.read_exact(&mut b)?;
                b.truncate(n as usize);
                Resp::Bulk(Some(b))
            }
        }
        "*" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            if n < 0 {
                Resp::Array(None)
            } else {
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(read_resp(r)?);
                }
                Resp::Array(Some(v))
            }
        }
        _ => return Err(bad()),
    })
}
