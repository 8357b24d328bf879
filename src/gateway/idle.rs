//! The idle bounds of the public listener, kept per connection instead of per request: a new
//! connection must deliver its first request's header within `server.first_byte_timeout_ms`, and
//! a kept-alive one the next request's header within `server.keepalive_idle_s` of the last
//! request's end.
//!
//! Pingora bounds a keep-alive wait by wrapping every read of a request header in its own
//! timeout: one timer armed and dropped per request (about 2,000 instructions, measured). Here
//! each connection's stream is wrapped in an [`IdleBound`] that holds one timer for the whole
//! connection. The request hooks mark the connection busy when a request starts
//! ([`IdleBound::busy`]) and idle when it ends ([`IdleBound::idle_from`]); the wrapper checks
//! the bound only when a read would wait while the connection is idle, and moves its timer only
//! when the timer fires early (a request came and went since it was set). So the cost per request
//! is two atomic stores and a timer poll.
//!
//! The bound: from the accept, the first request's header must arrive in full within the first
//! bound; once a request ended, the next request's header must arrive in full within the idle
//! time; otherwise the connection is closed (a clean end of stream, so Pingora closes it as a
//! client that went away). While a request is in progress no bound applies, as with Pingora's
//! own: the upstream and body timeouts cover that time.
//!
//! The wrapper also holds the connection's place in the listener's count ([`Counted`]), so the
//! count falls when the socket is dropped, however the connection ends.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// `idle_since` while a request is in progress.
const BUSY: u64 = u64::MAX;
/// `idle_since` from the accept until the first request starts: the first bound applies.
const FRESH: u64 = u64::MAX - 1;

/// A connection's place in its listener's count of open connections, given back on drop; and
/// the counter of connections closed because their first request did not arrive in time.
pub trait Counted: Send + Sync {
    /// The first request's header did not arrive within the first bound.
    fn first_request_late(&self);
}

/// A connection's stream, closed when it idles between requests for longer than the bound.
pub struct IdleBound {
    inner: Stream,
    /// When the connection was accepted; `idle_since` counts nanoseconds from here.
    origin: Instant,
    /// How long the first request's header may take to arrive, from `origin`.
    first: Duration,
    idle: Duration,
    /// Nanoseconds from `origin` to the end of the last request, or [`BUSY`] or [`FRESH`].
    idle_since: AtomicU64,
    /// The connection's place in the listener's count, held as long as the socket.
    counted: Option<Box<dyn Counted>>,
    /// The one timer of this connection, set on the first idle wait.
    timer: Option<Armed>,
    /// The bound was reached: every later read ends the stream.
    expired: bool,
}

impl IdleBound {
    /// Wraps a stream accepted now: its first request's header must arrive within `first`, each
    /// later one within `idle` of the previous request's end. `counted` is dropped with it.
    pub fn new(
        inner: Stream,
        first: Duration,
        idle: Duration,
        counted: Option<Box<dyn Counted>>,
    ) -> IdleBound {
        IdleBound {
            inner,
            origin: Instant::now(),
            first,
            idle,
            idle_since: AtomicU64::new(FRESH),
            counted,
            timer: None,
            expired: false,
        }
    }

    /// The bound of the connection a request came on, if it has one (HTTP/1 from the public
    /// listener).
    pub fn of(session: &Session) -> Option<&IdleBound> {
        session
            .downstream_session
            .stream()?
            .as_any()
            .downcast_ref::<IdleBound>()
    }

    /// A request started: the bound does not apply until it ends.
    pub fn busy(&self) {
        self.idle_since.store(BUSY, Ordering::Relaxed);
    }

    /// The request ended at `now`: the connection idles from then.
    pub fn idle_from(&self, now: Instant) {
        let nanos = now.saturating_duration_since(self.origin).as_nanos();
        // A connection open for 584 years stays idle from then; nothing else reaches FRESH.
        self.idle_since.store(
            u64::try_from(nanos).map_or(FRESH - 1, |n| n.min(FRESH - 1)),
            Ordering::Relaxed,
        );
    }

    /// Whether the connection has idled past the bound. Called when a read would wait; arms
    /// the timer (with `cx`'s waker) when it has not.
    fn idled_out(&mut self, cx: &mut Context<'_>) -> bool {
        let since = self.idle_since.load(Ordering::Relaxed);
        if since == BUSY {
            return false;
        }
        let IdleBound {
            origin,
            first,
            idle,
            timer,
            ..
        } = self;
        let end = tokio::time::Instant::from_std(if since == FRESH {
            *origin + *first
        } else {
            *origin + Duration::from_nanos(since) + *idle
        });
        // The common case, once per request: the timer waits, set for this task, and fires no
        // later than this wait's end (if earlier, it is moved when it fires).
        if let Some(t) = timer {
            if !t.sleep.is_elapsed() && t.waker.will_wake(cx.waker()) && t.sleep.deadline() <= end {
                return false;
            }
        }
        let t = timer.get_or_insert_with(|| Armed {
            sleep: Box::pin(tokio::time::sleep_until(end)),
            waker: cx.waker().clone(),
        });
        if !t.waker.will_wake(cx.waker()) {
            t.waker = cx.waker().clone();
        }
        if t.sleep.deadline() > end {
            // Set for a later end than this wait's: the first request's bound, longer than the
            // keep-alive one and armed while the connection waited for its first request.
            t.sleep.as_mut().reset(end);
        }
        loop {
            if t.sleep.as_mut().poll(cx).is_pending() {
                return false;
            }
            // The timer fired. Its deadline may be an earlier idle period's: move it to this
            // one's end, unless that has passed too.
            if t.sleep.deadline() >= end {
                return true;
            }
            t.sleep.as_mut().reset(end);
        }
    }
}

/// The connection's timer and the waker it was last polled with (it wakes that task).
struct Armed {
    sleep: Pin<Box<Sleep>>,
    waker: Waker,
}

impl fmt::Debug for IdleBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdleBound")
            .field("inner", &self.inner)
            .field("first", &self.first)
            .field("idle", &self.idle)
            .field("expired", &self.expired)
            .finish()
    }
}

impl AsyncRead for IdleBound {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.expired {
            return Poll::Ready(Ok(()));
        }
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if read.is_pending() && this.idled_out(cx) {
            // End of stream, as if the client had closed: Pingora ends the connection.
            this.expired = true;
            if this.idle_since.load(Ordering::Relaxed) == FRESH {
                if let Some(c) = &this.counted {
                    c.first_request_late();
                }
            }
            return Poll::Ready(Ok(()));
        }
        read
    }
}

impl AsyncWrite for IdleBound {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for IdleBound {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for IdleBound {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for IdleBound {
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

impl GetTimingDigest for IdleBound {
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

impl GetProxyDigest for IdleBound {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for IdleBound {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, socket_digest: SocketDigest) {
        self.inner.set_socket_digest(socket_digest)
    }
}

#[async_trait]
impl Peek for IdleBound {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}
