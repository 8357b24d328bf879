//! Script calls pipelined on a connection per thread.
//!
//! fred runs one connection as one task and flushes every `EVALSHA` on its own: each call from a
//! proxy worker crosses to that task's thread and back, and costs a write of its own. Here every
//! thread that calls a script (each proxy worker runs its own single-threaded runtime) gets its
//! own connection, driven by two tasks on that thread: a writer that sends every call queued
//! since its last write in one `write`, and a reader that answers the calls in order from
//! whatever the socket delivers. Replies come back in the order of the calls (RESP), so a call
//! that gave up (its deadline passed) still has its reply read and dropped.
//!
//! Only scripts go this way; everything else (start-up, `SCRIPT LOAD`, operator commands) stays
//! on fred. A single server (`redis://`) has one `Pipes`; a cluster has one per node
//! (`cluster.rs`), and a call redirected with `ASK` goes out as `ASKING` + the call in one write,
//! whose first reply the reader drops.
//!
//! Failure handling: a refused connect fails the call at once and the thread does not retry for
//! `RETRY_AFTER`; a broken connection fails its pending calls and the next call reconnects;
//! `reconnect()` (asked for by the breaker) makes every thread open a new connection on its
//! next call. Deadlines are the caller's (`RedisStore` wraps every call in its timeout).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use fred::prelude::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

/// A connection to Redis: plain TCP, or TLS over it.
enum Conn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// How long a thread whose connect failed fails its calls at once before trying again.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// The longest reply accepted (the queue scripts answer a few dozen bytes; stats a few hundred).
const MAX_REPLY: usize = 16 * 1024 * 1024;

/// Why a pipelined call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PipeError {
    /// No connection (refused, broken, or the thread is waiting before it tries again).
    Unavailable(String),
    /// Redis answered with an error reply (`NOSCRIPT ...`, `OOM ...`, `BUSY ...`).
    Redis(String),
}

type Reply = Result<Value, PipeError>;

struct Call {
    frame: Vec<u8>,
    /// Replies to drop before the call's own (1 after an `ASKING` prefix).
    skip: u8,
    reply: oneshot::Sender<Reply>,
}

/// A reply slot as the reader sees it.
type Slot = (u8, oneshot::Sender<Reply>);

/// Where and how to connect, shared by every thread's connection of one store.
pub struct Pipes {
    id: u64,
    /// `host:port`; a Sentinel's primary moves (`retarget`).
    addr: parking_lot::RwLock<Arc<str>>,
    /// `AUTH` (and `SELECT`) frames sent first on every connection.
    hello: Vec<u8>,
    hello_replies: usize,
    connect_timeout: Duration,
    generation: AtomicU64,
    /// For `rediss…` URLs: fred's rustls connector (the system's roots or `SSL_CERT_FILE`); the
    /// server's certificate must name the host.
    tls: Option<TlsConnector>,
    /// What the store's connections tell it, shared by all of them (`Wire`).
    wire: Arc<Wire>,
}

/// What the connections of one store report to it, shared by all of them.
#[derive(Debug, Default)]
pub struct Wire {
    /// When a reply last arrived on any connection (epoch ms): replies to calls whose callers
    /// gave up count too, so a Redis that answers late (the gateway is overloaded) is told from
    /// one that answers nothing (down).
    pub heard: AtomicU64,
    /// When a connection last broke or failed to open (epoch ms; 0: never). Whatever answers
    /// after that may be another server (a restart from a snapshot, a failover to a replica that
    /// missed writes) holding less than this replica saw: new tokens wait until the replica
    /// has learned of any rollback (`StoreGuard::issue_held`).
    pub broke: AtomicU64,
}

impl std::fmt::Debug for Pipes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipes")
            .field("addr", &*self.addr.read())
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// A thread's connection to one store.
struct Local {
    calls: mpsc::UnboundedSender<Call>,
    generation: u64,
    /// Set by the reader when the connection broke: the next call opens a new one.
    broken: Arc<AtomicBool>,
}

/// A thread whose last connect failed, and when.
struct Down {
    at: Instant,
    generation: u64,
    error: String,
}

thread_local! {
    static LOCAL: RefCell<HashMap<u64, Local>> = RefCell::new(HashMap::new());
    static DOWN: RefCell<HashMap<u64, Down>> = RefCell::new(HashMap::new());
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Pipes {
    /// Connections to the server of a single-server `config`.
    pub fn for_config(config: &fred::types::config::Config) -> Pipes {
        let addr = hosts(config).into_iter().next().unwrap_or_default();
        Pipes::new(addr, config)
    }

    /// Connections to `addr` (`host:port`), authenticated and on the database of `config`.
    pub fn new(addr: String, config: &fred::types::config::Config) -> Pipes {
        let mut hello = Vec::new();
        let mut hello_replies = 0;
        if let Some(password) = &config.password {
            match &config.username {
                Some(user) => encode(&mut hello, &[b"AUTH", user.as_bytes(), password.as_bytes()]),
                None => encode(&mut hello, &[b"AUTH", password.as_bytes()]),
            }
            hello_replies += 1;
        }
        if let Some(db) = config.database.filter(|db| *db != 0) {
            encode(&mut hello, &[b"SELECT", db.to_string().as_bytes()]);
            hello_replies += 1;
        }
        let tls = config.tls.as_ref().map(|t| {
            let fred::types::config::TlsConnector::Rustls(connector) = &t.connector;
            connector.clone()
        });
        Pipes {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            addr: parking_lot::RwLock::new(Arc::from(addr)),
            hello,
            hello_replies,
            connect_timeout: Duration::from_millis(500),
            generation: AtomicU64::new(0),
            tls,
            wire: Arc::new(Wire::default()),
        }
    }

    /// Shares `wire` with the store and its other connections.
    pub fn with_wire(mut self, wire: Arc<Wire>) -> Pipes {
        self.wire = wire;
        self
    }

    /// Every thread opens a new connection on its next call (the server may be another one
    /// after it: `Wire::broke`).
    pub fn reconnect(&self) {
        self.wire
            .broke
            .fetch_max(crate::clock::now().epoch_ms, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Points the connections at `addr` (a Sentinel's new primary): every thread reconnects
    /// on its next call. Nothing changes when it is the same address.
    pub fn retarget(&self, addr: &str) {
        if *self.addr.read().as_ref() == *addr {
            return;
        }
        *self.addr.write() = Arc::from(addr);
        self.reconnect();
    }

    /// Sends one command (its arguments as RESP bulk strings) on this thread's connection.
    pub async fn call(&self, args: &[&[u8]]) -> Reply {
        self.send(args, false).await
    }

    /// `ASKING` and then the command, back to back on this thread's connection (a cluster node
    /// importing a slot serves the one command after `ASKING` for it).
    pub async fn call_asking(&self, args: &[&[u8]]) -> Reply {
        self.send(args, true).await
    }

    async fn send(&self, args: &[&[u8]], asking: bool) -> Reply {
        let mut frame = Vec::with_capacity(80 + args.iter().map(|a| a.len() + 16).sum::<usize>());
        if asking {
            encode(&mut frame, &[b"ASKING"]);
        }
        encode(&mut frame, args);
        let (tx, rx) = oneshot::channel();
        let mut call = Call {
            frame,
            skip: u8::from(asking),
            reply: tx,
        };
        // A connection found broken is replaced once, then the call fails.
        for _ in 0..2 {
            let sender = self.sender().await?;
            match sender.send(call) {
                Ok(()) => {
                    return rx.await.unwrap_or_else(|_| {
                        Err(PipeError::Unavailable("connection closed".into()))
                    })
                }
                Err(mpsc::error::SendError(back)) => {
                    LOCAL.with(|l| l.borrow_mut().remove(&self.id));
                    call = back;
                }
            }
        }
        Err(PipeError::Unavailable("connection closed".into()))
    }

    /// This thread's connection, opened if there is none (or it is of an older generation).
    async fn sender(&self) -> Result<mpsc::UnboundedSender<Call>, PipeError> {
        let generation = self.generation.load(Ordering::Relaxed);
        let live = LOCAL.with(|l| {
            l.borrow()
                .get(&self.id)
                .filter(|c| {
                    c.generation == generation
                        && !c.calls.is_closed()
                        && !c.broken.load(Ordering::Relaxed)
                })
                .map(|c| c.calls.clone())
        });
        if let Some(calls) = live {
            return Ok(calls);
        }
        let recently_down = DOWN.with(|d| {
            d.borrow()
                .get(&self.id)
                .filter(|d| d.generation == generation && d.at.elapsed() < RETRY_AFTER)
                .map(|d| d.error.clone())
        });
        if let Some(error) = recently_down {
            return Err(PipeError::Unavailable(error));
        }
        // Boxed: connecting (TCP, TLS, AUTH) is rare, and its future is large; inline, every
        // call's future would carry it and be copied whole.
        match Box::pin(self.open()).await {
            Ok((calls, broken)) => {
                DOWN.with(|d| d.borrow_mut().remove(&self.id));
                LOCAL.with(|l| {
                    l.borrow_mut().insert(
                        self.id,
                        Local {
                            calls: calls.clone(),
                            generation,
                            broken,
                        },
                    )
                });
                Ok(calls)
            }
            Err(error) => {
                self.wire
                    .broke
                    .fetch_max(crate::clock::now().epoch_ms, Ordering::Relaxed);
                DOWN.with(|d| {
                    d.borrow_mut().insert(
                        self.id,
                        Down {
                            at: Instant::now(),
                            generation,
                            error: error.clone(),
                        },
                    )
                });
                Err(PipeError::Unavailable(error))
            }
        }
    }

    async fn open(&self) -> Result<(mpsc::UnboundedSender<Call>, Arc<AtomicBool>), String> {
        let addr = self.addr.read().clone();
        let tls = match &self.tls {
            None => None,
            Some(connector) => {
                // TLS was asked for: a host that is no valid server name never gets a plain
                // connection instead.
                let host = addr.rsplit_once(':').map_or(addr.as_ref(), |(h, _)| h);
                match ServerName::try_from(host.to_string()) {
                    Ok(name) => Some((connector, name)),
                    Err(e) => return Err(format!("tls {host}: {e}")),
                }
            }
        };
        let tcp = match tokio::time::timeout(self.connect_timeout, TcpStream::connect(&*addr)).await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(format!("connect {addr}: {e}")),
            Err(_) => return Err(format!("connect {addr}: timed out")),
        };
        let _ = tcp.set_nodelay(true);
        let mut stream = match tls {
            None => Conn::Plain(tcp),
            Some((connector, name)) => {
                let handshake = connector.connect(name, tcp);
                match tokio::time::timeout(self.connect_timeout, handshake).await {
                    Ok(Ok(s)) => Conn::Tls(Box::new(s)),
                    Ok(Err(e)) => return Err(format!("tls {addr}: {e}")),
                    Err(_) => return Err(format!("tls {addr}: timed out")),
                }
            }
        };
        if self.hello_replies > 0 {
            let said = match &mut stream {
                Conn::Plain(s) => self.hello(s).await,
                Conn::Tls(s) => self.hello(s.as_mut()).await,
            };
            said?;
        }
        let (calls_tx, calls_rx) = mpsc::unbounded_channel();
        let (order_tx, order_rx) = mpsc::unbounded_channel();
        let broken = Arc::new(AtomicBool::new(false));
        // Plain TCP splits into owned halves (no lock between them); TLS needs tokio's split.
        match stream {
            Conn::Plain(tcp) => {
                let (read, write) = tcp.into_split();
                tokio::spawn(writer(write, calls_rx, order_tx));
                tokio::spawn(reader(read, order_rx, broken.clone(), self.wire.clone()));
            }
            Conn::Tls(tls) => {
                let (read, write) = tokio::io::split(*tls);
                tokio::spawn(writer(write, calls_rx, order_tx));
                tokio::spawn(reader(read, order_rx, broken.clone(), self.wire.clone()));
            }
        }
        Ok((calls_tx, broken))
    }

    /// `AUTH` / `SELECT` on a new connection, within the connect timeout.
    async fn hello<S: AsyncRead + AsyncWrite + Unpin>(&self, stream: &mut S) -> Result<(), String> {
        let hello = async {
            stream
                .write_all(&self.hello)
                .await
                .map_err(|e| e.to_string())?;
            let mut buf = BytesMut::with_capacity(256);
            for _ in 0..self.hello_replies {
                loop {
                    match parse(&mut buf) {
                        Ok(Some(Ok(_))) => break,
                        Ok(Some(Err(e))) => return Err(e),
                        Ok(None) => {}
                        Err(e) => return Err(e),
                    }
                    if stream.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
                        return Err("connection closed during AUTH/SELECT".to_string());
                    }
                }
            }
            Ok::<(), String>(())
        };
        match tokio::time::timeout(self.connect_timeout, hello).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("redis refused the connection: {e}")),
            Err(_) => Err("AUTH/SELECT timed out".to_string()),
        }
    }
}

/// Sends every call queued since the last write in one write; hands the reply slots to the
/// reader in the same order. A call whose caller stopped waiting (its deadline passed while an
/// earlier write was blocked on a stalled connection) is not sent: it would run late, after the
/// caller answered without it (a degraded answer, a local claim, a registration the fail-open
/// pacer counted as possibly landed until its deadline).
async fn writer<W: AsyncWrite + Unpin>(
    mut socket: W,
    mut calls: mpsc::UnboundedReceiver<Call>,
    order: mpsc::UnboundedSender<Slot>,
) {
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    while let Some(first) = calls.recv().await {
        buf.clear();
        let mut next = Some(first);
        while let Some(call) = next {
            if !call.reply.is_closed() {
                buf.extend_from_slice(&call.frame);
                if order.send((call.skip, call.reply)).is_err() {
                    return; // the reader is gone: the connection is broken
                }
            }
            next = calls.try_recv().ok();
        }
        if buf.is_empty() {
            continue;
        }
        if socket.write_all(&buf).await.is_err() {
            return;
        }
    }
    // Every sender dropped (a newer generation replaced this connection): closing the write
    // side lets Redis close the connection and the reader end.
}

/// Answers the calls in order from the replies on the socket; on a broken connection, fails
/// every call still waiting.
async fn reader<R: AsyncRead + Unpin>(
    mut socket: R,
    mut order: mpsc::UnboundedReceiver<Slot>,
    broken: Arc<AtomicBool>,
    wire: Arc<Wire>,
) {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    // The call whose reply comes next, while replies before its own are being dropped.
    let mut current: Option<Slot> = None;
    let error = loop {
        match parse(&mut buf) {
            Ok(Some(reply)) => {
                let slot = match current.take() {
                    Some(slot) => Some(slot),
                    None => order.recv().await,
                };
                match slot {
                    Some((0, slot)) => {
                        let _ = slot.send(reply.map_err(PipeError::Redis));
                    }
                    // A prefix's reply (`ASKING`'s `OK`): the call's own is next.
                    Some((skip, slot)) => current = Some((skip - 1, slot)),
                    None => break "a reply nobody asked for".to_string(),
                }
                continue;
            }
            Ok(None) => {}
            Err(e) => break e,
        }
        if buf.len() > MAX_REPLY {
            break "reply too large".to_string();
        }
        match socket.read_buf(&mut buf).await {
            Ok(0) => break "connection closed by redis".to_string(),
            Ok(_) => {
                wire.heard
                    .fetch_max(crate::clock::now().epoch_ms, Ordering::Relaxed);
            }
            Err(e) => break e.to_string(),
        }
    };
    broken.store(true, Ordering::Relaxed);
    wire.broke
        .fetch_max(crate::clock::now().epoch_ms, Ordering::Relaxed);
    order.close();
    if let Some((_, slot)) = current {
        let _ = slot.send(Err(PipeError::Unavailable(error.clone())));
    }
    while let Ok((_, slot)) = order.try_recv() {
        let _ = slot.send(Err(PipeError::Unavailable(error.clone())));
    }
}

/// The servers a fred `config` names, as `host:port`.
pub fn hosts(config: &fred::types::config::Config) -> Vec<String> {
    config
        .server
        .hosts()
        .iter()
        .map(|s| format!("{}:{}", s.host, s.port))
        .collect()
}

/// Appends one command as a RESP array of bulk strings.
fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    out.extend_from_slice(args.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for a in args {
        out.push(b'$');
        out.extend_from_slice(a.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Takes one whole RESP2 reply off the front of `buf`: `Ok(None)` while it is incomplete,
/// `Ok(Some(Err(text)))` for an error reply, `Err` when the bytes are not RESP.
fn parse(buf: &mut BytesMut) -> Result<Option<Result<Value, String>>, String> {
    let mut pos = 0;
    match value(buf, &mut pos, 0)? {
        None => Ok(None),
        Some(v) => {
            buf.advance(pos);
            Ok(Some(v))
        }
    }
}

/// Deepest nesting accepted (the scripts answer flat arrays).
const MAX_DEPTH: usize = 8;

fn line<'a>(buf: &'a [u8], pos: &mut usize) -> Option<&'a [u8]> {
    let rest = buf.get(*pos..)?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    let l = &rest[..end];
    *pos += end + 2;
    Some(l)
}

fn number(l: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(l)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| "bad number in reply".to_string())
}

fn value(
    buf: &[u8],
    pos: &mut usize,
    depth: usize,
) -> Result<Option<Result<Value, String>>, String> {
    if depth > MAX_DEPTH {
        return Err("reply nested too deep".into());
    }
    let Some(&kind) = buf.get(*pos) else {
        return Ok(None);
    };
    *pos += 1;
    let Some(l) = line(buf, pos) else {
        return Ok(None);
    };
    match kind {
        b'+' => Ok(Some(Ok(Value::from(
            String::from_utf8_lossy(l).into_owned(),
        )))),
        b'-' => Ok(Some(Err(String::from_utf8_lossy(l).into_owned()))),
        b':' => Ok(Some(Ok(Value::Integer(number(l)?)))),
        b'$' => {
            let n = number(l)?;
            if n < 0 {
                return Ok(Some(Ok(Value::Null)));
            }
            let n = usize::try_from(n).map_err(|_| "bad length".to_string())?;
            if n > MAX_REPLY {
                return Err("bulk string too large".into());
            }
            let Some(body) = buf.get(*pos..*pos + n) else {
                return Ok(None);
            };
            match buf.get(*pos + n..*pos + n + 2) {
                None => return Ok(None),
                Some(b"\r\n") => {}
                Some(_) => return Err("bulk string without CRLF".into()),
            }
            *pos += n + 2;
            Ok(Some(Ok(match std::str::from_utf8(body) {
                Ok(s) => Value::from(s.to_string()),
                Err(_) => Value::Bytes(bytes::Bytes::copy_from_slice(body)),
            })))
        }
        b'*' => {
            let n = number(l)?;
            if n < 0 {
                return Ok(Some(Ok(Value::Null)));
            }
            let n = usize::try_from(n).map_err(|_| "bad length".to_string())?;
            let mut items = Vec::with_capacity(n.min(1024));
            let mut error = None;
            for _ in 0..n {
                match value(buf, pos, depth + 1)? {
                    None => return Ok(None),
                    Some(Ok(v)) => items.push(v),
                    Some(Err(e)) => {
                        error.get_or_insert(e);
                        items.push(Value::Null);
                    }
                }
            }
            Ok(Some(match error {
                Some(e) => Err(e),
                None => Ok(Value::Array(items)),
            }))
        }
        _ => Err(format!("unknown reply type {kind:#x}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(bytes: &[u8]) -> Result<Option<Result<Value, String>>, String> {
        let mut buf = BytesMut::from(bytes);
        parse(&mut buf)
    }

    #[test]
    fn replies_parse_whole_or_not_at_all() {
        let full = b"*3\r\n$7\r\nWAITING\r\n:12\r\n$-1\r\n+OK\r\n";
        let mut buf = BytesMut::from(&full[..]);
        assert_eq!(
            parse(&mut buf),
            Ok(Some(Ok(Value::Array(vec![
                Value::from("WAITING".to_string()),
                Value::Integer(12),
                Value::Null
            ]))))
        );
        assert_eq!(parse(&mut buf), Ok(Some(Ok(Value::from("OK".to_string())))));
        assert!(buf.is_empty());
        // Every prefix of a reply is incomplete, never an error or a wrong value.
        for cut in 0..full.len() - 5 {
            assert_eq!(parse_all(&full[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn error_replies_and_garbage_are_told_apart() {
        assert_eq!(
            parse_all(b"-NOSCRIPT No matching script\r\n"),
            Ok(Some(Err("NOSCRIPT No matching script".into())))
        );
        assert!(parse_all(b"?what\r\n").is_err());
        assert!(parse_all(b"$3\r\nabcXY").is_err());
        assert!(parse_all(b":12a\r\n").is_err());
        let deep = "*1\r\n".repeat(MAX_DEPTH + 2) + ":1\r\n";
        assert!(parse_all(deep.as_bytes()).is_err());
    }

    #[test]
    fn calls_given_up_before_they_are_written_are_not_sent() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
            let (calls_tx, calls_rx) = mpsc::unbounded_channel();
            let (order_tx, mut order_rx) = mpsc::unbounded_channel();
            let call = |cmd: &[u8]| {
                let mut frame = Vec::new();
                encode(&mut frame, &[cmd]);
                let (reply, rx) = oneshot::channel();
                (
                    Call {
                        frame,
                        skip: 0,
                        reply,
                    },
                    rx,
                )
            };
            // Queued while the connection was stalled: the first caller gave up meanwhile.
            let (late, late_rx) = call(b"LATE");
            let (live, _live_rx) = call(b"LIVE");
            drop(late_rx);
            calls_tx.send(late).unwrap();
            calls_tx.send(live).unwrap();
            drop(calls_tx);
            writer(ours, calls_rx, order_tx).await;
            let mut sent = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut theirs, &mut sent)
                .await
                .unwrap();
            assert_eq!(sent, b"*1\r\n$4\r\nLIVE\r\n");
            // One reply slot, for the call that was sent.
            assert!(order_rx.recv().await.is_some());
            assert!(order_rx.recv().await.is_none());
        });
    }

    #[test]
    fn commands_are_resp_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode(&mut out, &[b"EVALSHA", b"ab", b"0"]);
        assert_eq!(out, b"*3\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n0\r\n");
    }
}
