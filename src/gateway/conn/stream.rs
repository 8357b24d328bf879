//! `ClientStream`: a public connection's stream, with every bound that keeps one client from
//! holding a connection slot (and the backend connection behind it) for as long as it likes.
//!
//! - **First request**: its whole header must arrive within `server.first_byte_timeout_ms` of
//!   the accept; **between requests**: the next whole header within `server.keepalive_idle_s` of
//!   the last request's end, however it trickles.
//! - **Header size**: a header with more fields than `server.max_headers`, or more bytes than
//!   `server.max_header_bytes`, is answered 431 as its bytes arrive (`header.rs`).
//! - **During a request**, the time the gateway waits on the client (a request body that does
//!   not come, an answer the client does not read) is bounded: one wait without a byte moving may
//!   last `server.client_stall_ms`, and all of a request's waits together at most
//!   `client_stall_ms` plus the bytes moved at `server.min_client_rate` bytes per second. A body
//!   sent at a byte a second, or an answer read that slowly, ends the connection. Waiting on the
//!   backend is not waiting on the client (the backend's own timeouts bound it).
//! - **Under pressure**: the listener's table (`table.rs`) can evict a connection that is
//!   waiting on its client to make room for a new one.
//!
//! Pingora bounds a keep-alive wait by wrapping every read of a request header in its own
//! timeout: one timer armed and dropped per request. Here each connection holds one timer for all
//! its bounds. The request hooks mark the connection busy when a request starts
//! ([`ClientStream::busy`]), its body complete ([`ClientStream::body_done`]) and idle when the
//! request ends ([`ClientStream::idle_from`]); the wrapper checks a bound only when a read or a
//! write would wait, and moves its timer only when it fires early. So the cost per request is a
//! few atomic stores and a timer poll.
//!
//! The wrapper also holds the connection's place in the listener's count ([`Counted`]) and
//! table, so both fall when the socket is dropped, however the connection ends.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::{SslDigest, TlsRef, ALPN};
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType,
};
use pingora::proxy::Session;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use super::header::{HeaderWatch, Watch};
use super::shared::{Shared, BUSY, FRESH, NOT_WAITING};
use super::table::Table;

/// Why a connection was ended by its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The first request's header did not arrive within the first bound.
    FirstByteLate,
    /// A request header past `max_headers` or `max_header_bytes` (answered 431).
    HeadersTooLarge,
    /// A request waited on its client past the stall or rate bound.
    ClientStalled,
    /// Evicted to make room for a new connection.
    Evicted,
}

/// A connection's place in its listener's count of open connections, given back on drop, and
/// the counters of connections its bounds ended.
pub trait Counted: Send + Sync {
    fn ended(&self, why: Ended);
}

/// The bounds of one listener's connections.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub first: Duration,
    pub idle: Duration,
    pub stall: Duration,
    /// Bytes per second a request's waits on the client earn (`server.min_client_rate`).
    pub min_rate: u64,
    pub max_headers: usize,
    pub max_header_bytes: usize,
}

/// A connection's stream, ended when it breaks one of its bounds.
pub struct ClientStream {
    inner: Stream,
    bounds: Bounds,
    shared: Arc<Shared>,
    /// When the connection was accepted (table clock, ns).
    accepted_ns: u64,
    /// The connection's place in the listener's count, held as long as the socket.
    counted: Option<Box<dyn Counted>>,
    /// The connection's slot in the listener's table.
    slot: Option<(Arc<Table>, u32)>,
    /// The one timer of this connection, set on the first wait that has a bound.
    timer: Option<Armed>,
    header: HeaderWatch,
    /// This request's waits on the client.
    io: Io,
    /// Why the connection ended: every later read ends the stream, every write fails.
    ended: Option<Ended>,
}

/// One request's accounting of its waits on the client.
#[derive(Debug, Clone, Copy, Default)]
struct Io {
    request: u32,
    /// Bytes moved to or from the client since the request first waited on it. (Before that,
    /// bytes may only have filled the socket buffers: they earn no time.)
    bytes: u64,
    waited: bool,
    /// Time spent waiting on the client, the current wait excluded.
    blocked_ns: u64,
    /// When the current wait began.
    waiting_since: Option<u64>,
}

impl ClientStream {
    /// Wraps a stream accepted now.
    pub fn new(
        inner: Stream,
        bounds: Bounds,
        table: &Arc<Table>,
        counted: Option<Box<dyn Counted>>,
    ) -> ClientStream {
        let accepted_ns = table.now_ns();
        let shared = Arc::new(Shared {
            origin: table.origin(),
            idle_since: AtomicU64::new(FRESH),
            stall_since: AtomicU64::new(NOT_WAITING),
            body_done: AtomicBool::new(false),
            requests: AtomicU32::new(0),
            watch_header: AtomicBool::new(true),
            evicted: AtomicBool::new(false),
            waker: parking_lot::Mutex::new(None),
        });
        // A fresh connection waits on its client from the accept.
        shared.stall_since.store(accepted_ns, Ordering::Relaxed);
        let slot = table.insert(&shared).map(|i| (table.clone(), i));
        ClientStream {
            inner,
            bounds,
            shared,
            accepted_ns,
            counted,
            slot,
            timer: None,
            header: HeaderWatch::new(bounds.max_headers, bounds.max_header_bytes),
            io: Io::default(),
            ended: None,
        }
    }

    /// The stream of the connection a request came on, if it has one (HTTP/1 from the public
    /// listener).
    pub fn of(session: &Session) -> Option<&ClientStream> {
        session
            .downstream_session
            .stream()?
            .as_any()
            .downcast_ref::<ClientStream>()
    }

    /// A request started: the idle bounds do not apply until it ends; its waits on the client
    /// are counted afresh.
    pub fn busy(&self) {
        let s = &self.shared;
        s.body_done.store(false, Ordering::Relaxed);
        s.stall_since.store(NOT_WAITING, Ordering::Relaxed);
        // Only this connection's own task writes it: no atomic read-modify-write needed.
        s.requests.store(
            s.requests.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
        s.idle_since.store(BUSY, Ordering::Relaxed);
    }

    /// The request's body is complete, or the connection became a tunnel (an upgrade): a read
    /// that waits from now on is not a wait on the client.
    pub fn body_done(&self) {
        self.shared.body_done.store(true, Ordering::Relaxed);
    }

    /// The request ended at `now`: the connection idles from then.
    pub fn idle_from(&self, now: Instant) {
        let s = &self.shared;
        s.watch_header
            .store(s.body_done.load(Ordering::Relaxed), Ordering::Relaxed);
        let nanos = now.saturating_duration_since(self.shared.origin).as_nanos();
        self.shared
            .stall_since
            .store(NOT_WAITING, Ordering::Relaxed);
        // A connection open for 584 years stays idle from then; nothing else reaches FRESH.
        self.shared.idle_since.store(
            u64::try_from(nanos).map_or(FRESH - 1, |n| n.min(FRESH - 1)),
            Ordering::Relaxed,
        );
    }

    fn end(&mut self, why: Ended) {
        if self.ended.is_none() {
            self.ended = Some(why);
            if let Some(c) = &self.counted {
                c.ended(why);
            }
        }
    }

    /// The end of the bound that applies to a wait beginning now, if one does: for a read, the
    /// idle bounds between requests and the stall bound during one until its body is complete;
    /// for a write (an answer, its last bytes flushed after the request ended included), the
    /// stall bound.
    fn deadline(&mut self, writing: bool) -> Option<u64> {
        let shared = &self.shared;
        let phase = shared.idle_since.load(Ordering::Relaxed);
        if !writing {
            if phase == FRESH {
                return Some(self.accepted_ns.saturating_add(nanos(self.bounds.first)));
            }
            if phase != BUSY {
                return Some(phase.saturating_add(nanos(self.bounds.idle)));
            }
            if shared.body_done.load(Ordering::Relaxed) {
                return None;
            }
        }
        let request = shared.requests.load(Ordering::Relaxed);
        if self.io.request != request {
            self.io = Io {
                request,
                ..Io::default()
            };
        }
        let now = shared.now_ns();
        let since = *self.io.waiting_since.get_or_insert(now);
        self.io.waited = true;
        shared.stall_since.store(since, Ordering::Relaxed);
        let stall = nanos(self.bounds.stall);
        let earned = self
            .io
            .bytes
            .saturating_mul(1_000_000_000)
            .checked_div(self.bounds.min_rate.max(1))
            .unwrap_or(u64::MAX);
        let allowance = stall
            .saturating_add(earned)
            .saturating_sub(self.io.blocked_ns);
        Some(since.saturating_add(stall.min(allowance)))
    }

    /// Bytes moved to or from the client: a wait on it, if there was one, is over.
    fn moved(&mut self, bytes: usize) {
        let request = self.shared.requests.load(Ordering::Relaxed);
        if self.io.request != request {
            self.io = Io {
                request,
                ..Io::default()
            };
        }
        if self.io.waited {
            self.io.bytes = self.io.bytes.saturating_add(bytes as u64);
        }
        if let Some(since) = self.io.waiting_since.take() {
            let now = self.shared.now_ns();
            self.io.blocked_ns = self.io.blocked_ns.saturating_add(now.saturating_sub(since));
            self.shared
                .stall_since
                .store(NOT_WAITING, Ordering::Relaxed);
        }
    }

    /// Whether the wait that is about to begin has passed its bound; arms the timer (with `cx`'s
    /// waker) when it has not.
    fn wait_expired(&mut self, cx: &mut Context<'_>, writing: bool) -> bool {
        self.shared.remember_waker(cx);
        let Some(end_ns) = self.deadline(writing) else {
            return false;
        };
        let end = tokio::time::Instant::from_std(self.shared.origin + Duration::from_nanos(end_ns));
        let timer = &mut self.timer;
        // The common case, once per request: the timer waits, set for this task, and fires no
        // later than this wait's end (if earlier, it is moved when it fires).
        if let Some(t) = timer {
            if !t.sleep.is_elapsed() && t.waker.will_wake(cx.waker()) && t.sleep.deadline() <= end {
                return false;
            }
        }
        let armed = timer.get_or_insert_with(|| Armed {
            sleep: Box::pin(tokio::time::sleep_until(end)),
            waker: cx.waker().clone(),
        });
        if !armed.waker.will_wake(cx.waker()) {
            armed.waker = cx.waker().clone();
        }
        if armed.sleep.deadline() > end {
            // Set for a later end than this wait's (a longer bound of an earlier wait).
            armed.sleep.as_mut().reset(end);
        }
        loop {
            if armed.sleep.as_mut().poll(cx).is_pending() {
                return false;
            }
            // The timer fired. Its deadline may be an earlier wait's: move it to this one's
            // end, unless that has passed too.
            if armed.sleep.deadline() >= end {
                return true;
            }
            armed.sleep.as_mut().reset(end);
        }
    }

    /// Why a read that waited past its bound ends the connection (`None`: an idle keep-alive
    /// connection, which simply closes, as Pingora's own bound does).
    fn read_expiry(&self) -> Option<Ended> {
        match self.shared.idle_since.load(Ordering::Relaxed) {
            FRESH => Some(Ended::FirstByteLate),
            BUSY => Some(Ended::ClientStalled),
            _ => None,
        }
    }

    /// Answers 431 on the socket itself (the header never reaches Pingora) and ends the stream.
    fn refuse_header(&mut self, cx: &mut Context<'_>) {
        let reply = too_large_reply();
        let _ = Pin::new(&mut self.inner).poll_write(cx, reply);
        let _ = Pin::new(&mut self.inner).poll_flush(cx);
        self.end(Ended::HeadersTooLarge);
    }

    fn stalled_error() -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, "the client stalled")
    }
}

/// The 431 answer written on the socket for a header past the limits.
fn too_large_reply() -> &'static [u8] {
    static REPLY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    REPLY.get_or_init(|| {
        let e = crate::error::ApiError::HeadersTooLarge;
        let body = e.body();
        let mut r = format!(
            "HTTP/1.1 {} Request Header Fields Too Large\r\nContent-Type: application/json\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
            e.status(),
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(&body);
        r
    })
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The connection's timer and the waker it was last polled with (it wakes that task).
struct Armed {
    sleep: Pin<Box<Sleep>>,
    waker: Waker,
}

impl Drop for ClientStream {
    fn drop(&mut self) {
        if let Some((table, index)) = self.slot.take() {
            table.remove(index);
        }
    }
}

impl fmt::Debug for ClientStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientStream")
            .field("inner", &self.inner)
            .field("bounds", &self.bounds)
            .field("ended", &self.ended)
            .finish()
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.ended.is_none() && this.shared.evicted.load(Ordering::Acquire) {
            this.end(Ended::Evicted);
        }
        if this.ended.is_some() {
            // End of stream, as if the client had closed: Pingora ends the connection.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        match read {
            Poll::Ready(Ok(())) => {
                let read = buf.filled().len() - before;
                let phase = this.shared.idle_since.load(Ordering::Relaxed);
                if phase == BUSY {
                    this.moved(read);
                } else if this.shared.watch_header.load(Ordering::Relaxed) {
                    if this.header.is_complete() {
                        this.header.reset();
                    }
                    if this.header.feed(&buf.filled()[before..]) == Watch::TooLarge {
                        buf.set_filled(before);
                        this.refuse_header(cx);
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.wait_expired(cx, false) => match this.read_expiry() {
                // A request body that stopped coming: the request fails.
                Some(Ended::ClientStalled) => {
                    this.end(Ended::ClientStalled);
                    Poll::Ready(Err(ClientStream::stalled_error()))
                }
                why => {
                    if let Some(why) = why {
                        this.end(why);
                    } else {
                        this.ended = Some(Ended::ClientStalled);
                    }
                    Poll::Ready(Ok(()))
                }
            },
            other => other,
        }
    }
}

impl ClientStream {
    /// A write's outcome: bytes moved end a wait; a write that waits past its bound fails.
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        w: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match w {
            Poll::Ready(Ok(n)) => {
                self.moved(n);
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.wait_expired(cx, true) => {
                self.end(Ended::ClientStalled);
                Poll::Ready(Err(ClientStream::stalled_error()))
            }
            other => other,
        }
    }

    fn write_refused(&mut self) -> Option<io::Error> {
        if self.ended.is_none() && self.shared.evicted.load(Ordering::Acquire) {
            self.end(Ended::Evicted);
        }
        self.ended
            .map(|_| io::Error::new(io::ErrorKind::ConnectionAborted, "connection ended"))
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(e) = this.write_refused() {
            return Poll::Ready(Err(e));
        }
        let w = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.after_write(cx, w)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(e) = this.write_refused() {
            return Poll::Ready(Err(e));
        }
        let w = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.after_write(cx, w)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(e) = this.write_refused() {
            return Poll::Ready(Err(e));
        }
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Ready(Ok(())) => {
                // What was buffered went out: a wait on the client, if there was one, is over.
                this.moved(0);
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.wait_expired(cx, true) => {
                this.end(Ended::ClientStalled);
                Poll::Ready(Err(ClientStream::stalled_error()))
            }
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for ClientStream {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for ClientStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for ClientStream {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for ClientStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for ClientStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for ClientStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, socket_digest: SocketDigest) {
        self.inner.set_socket_digest(socket_digest)
    }
}

#[async_trait]
impl Peek for ClientStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}
