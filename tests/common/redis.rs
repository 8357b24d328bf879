//! A private `redis-server` per test, and `RedisConn`, a fred client for assertions (the tests are
//! synchronous; the client runs on a small runtime of its own).

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use fred::prelude::{Builder, ClientLike, Config, Value};
use fred::types::{ClusterHash, CustomCommand};
use parking_lot::Mutex;

use super::{free_port, wait_until, TempDir};

/// A reply, as the assertions look at it.
#[derive(Debug, Clone, PartialEq)]
pub enum Resp {
    /// A status or bulk string (`OK`, a value, a score).
    Str(String),
    Int(i64),
    Nil,
    Array(Vec<Resp>),
    /// An error reply (`-ERR ...`, `-NOSCRIPT ...`).
    Error(String),
}

impl Resp {
    pub fn as_str(&self) -> Option<String> {
        match self {
            Resp::Str(s) => Some(s.clone()),
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
            Resp::Array(v) => v.clone(),
            other => panic!("not an array: {other:?}"),
        }
    }

    fn from_value(v: Value) -> Resp {
        match v {
            Value::Null => Resp::Nil,
            Value::Integer(i) => Resp::Int(i),
            Value::Boolean(b) => Resp::Int(i64::from(b)),
            Value::Double(d) => Resp::Str(d.to_string()),
            Value::String(s) => Resp::Str(s.to_string()),
            Value::Bytes(b) => Resp::Str(String::from_utf8_lossy(&b).into_owned()),
            Value::Array(a) => Resp::Array(a.into_iter().map(Resp::from_value).collect()),
            Value::Map(m) => Resp::Array(
                m.inner()
                    .into_iter()
                    .flat_map(|(k, v)| [Resp::from_value(Value::from(k)), Resp::from_value(v)])
                    .collect(),
            ),
            Value::Queued => Resp::Str("QUEUED".into()),
        }
    }
}

/// Runs `f` to completion on the client runtime, also from inside another runtime (an async
/// test), where blocking on a runtime directly is not allowed.
fn block_on<F: std::future::Future + Send>(f: F) -> F::Output
where
    F::Output: Send,
{
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|s| {
            s.spawn(|| runtime().block_on(f))
                .join()
                .expect("client thread")
        })
    } else {
        runtime().block_on(f)
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("test-redis-client")
            .enable_all()
            .build()
            .expect("test runtime")
    })
}

/// One fred connection to a test Redis.
pub struct RedisConn {
    client: fred::clients::Client,
}

impl RedisConn {
    pub fn connect(port: u16) -> std::io::Result<RedisConn> {
        let mut config = Config::from_url(&format!("redis://127.0.0.1:{port}"))
            .map_err(std::io::Error::other)?;
        config.fail_fast = true;
        let client = Builder::from_config(config)
            .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(5))
            .with_connection_config(|c| {
                c.connection_timeout = Duration::from_secs(2);
                c.internal_command_timeout = Duration::from_secs(2);
                c.max_command_attempts = 1;
            })
            .build()
            .map_err(std::io::Error::other)?;
        block_on(async {
            // `init` spawns the connection task on this (static) runtime and waits for it.
            match tokio::time::timeout(Duration::from_secs(3), client.init()).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(std::io::Error::other(e)),
                Err(_) => Err(std::io::Error::other("connect timed out")),
            }
        })?;
        Ok(RedisConn { client })
    }

    /// Runs one command. A Redis error reply is `Ok(Resp::Error)`; a transport failure is `Err`.
    pub fn cmd(&self, args: &[&str]) -> std::io::Result<Resp> {
        let (name, rest) = args.split_first().expect("a command");
        let cmd = CustomCommand::new(name.to_string(), ClusterHash::FirstKey, false);
        let args: Vec<Value> = rest.iter().map(|a| Value::from(*a)).collect();
        match block_on(self.client.custom::<Value, _>(cmd, args)) {
            Ok(v) => Ok(Resp::from_value(v)),
            Err(e) => match e.kind() {
                fred::error::ErrorKind::IO
                | fred::error::ErrorKind::Timeout
                | fred::error::ErrorKind::Canceled => Err(std::io::Error::other(e)),
                _ => Ok(Resp::Error(e.details().to_string())),
            },
        }
    }
}

impl Drop for RedisConn {
    fn drop(&mut self) {
        let client = self.client.clone();
        block_on(async move {
            let _ = tokio::time::timeout(Duration::from_millis(500), client.quit()).await;
        });
    }
}

pub struct RedisServer {
    child: Option<Child>,
    /// A connection for `cmd`, opened on first use and dropped with the process.
    conn: Mutex<Option<RedisConn>>,
    pub port: u16,
    pub dir: TempDir,
    persistent: bool,
    /// More `redis-server` arguments (cluster mode, `replicaof`).
    extra: Vec<String>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// With more `redis-server` arguments (`--cluster-enabled yes`, `--replicaof ...`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::start_on(free_port(), extra)
    }

    /// On `port`, with more `redis-server` arguments.
    pub fn start_on(port: u16, extra: &[&str]) -> RedisServer {
        let mut r = RedisServer {
            child: None,
            conn: Mutex::new(None),
            port,
            dir: TempDir::new("redis"),
            persistent: false,
            extra: extra.iter().map(|a| a.to_string()).collect(),
        };
        r.spawn();
        r
    }

    /// With an append-only file fsynced on every write, as production runs it: a restart
    /// keeps every key (scripts are still gone).
    pub fn start_persistent() -> RedisServer {
        let mut r = RedisServer {
            child: None,
            conn: Mutex::new(None),
            port: free_port(),
            dir: TempDir::new("redis"),
            persistent: true,
            extra: Vec::new(),
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
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        self.child = Some(child);
        let port = self.port;
        assert!(
            wait_until(Duration::from_secs(10), || {
                TcpStream::connect(("127.0.0.1", port)).is_ok()
                    && RedisConn::connect(port).is_ok_and(|c| {
                        c.cmd(&["PING"])
                            .is_ok_and(|r| r == Resp::Str("PONG".into()))
                    })
            }),
            "redis-server did not start on {port}"
        );
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs one command (panics on a transport failure; an error reply is `Resp::Error`).
    pub fn cmd(&self, args: &[&str]) -> Resp {
        let mut conn = self.conn.lock();
        if conn.is_none() {
            *conn = Some(RedisConn::connect(self.port).unwrap());
        }
        let result = conn.as_ref().map(|c| c.cmd(args)).expect("just set");
        match result {
            Ok(r) => r,
            Err(e) => {
                *conn = None;
                panic!("redis {args:?}: {e}");
            }
        }
    }

    /// Drops the connection `cmd` uses (a promoted replica's clients were killed by Sentinel).
    pub fn forget_connection(&self) {
        *self.conn.lock() = None;
    }

    /// The process id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn kill(&mut self) {
        *self.conn.lock() = None;
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
