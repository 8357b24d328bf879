//! The public listener's connections, wrapped around Pingora's HTTP proxy app:
//!
//! - at most `max_connections` connections are served at once. One beyond takes the place of the
//!   connection that has waited longest on its own client (`table.rs`: silent since it connected,
//!   idle between requests, or stalled sending a body or reading an answer), or, when every
//!   connection is busy with the backend, is closed at once (a clean close, nothing read) instead
//!   of holding memory;
//! - each connection is bounded in time ([`ClientStream`], `stream.rs`): its first request's
//!   header, the idle time between requests, and the waits on the client during a request; a
//!   header too large is answered 431 as it arrives (`header.rs`); what the request hooks, the
//!   stream and the table share of a connection is `shared.rs`.
//!
//! Pingora's HTTP app serves all requests of a keep-alive connection inside one `process_new`
//! call. This wrapper does its work before that call and hands back the app's own future, so
//! the connection's task polls the app directly: a wrapping future would be one more level on
//! every wake-up of every request. The connection's place in the count and the table lives in
//! its stream, so it is given back when the socket is dropped, however the connection ends.

mod header;
mod shared;
mod stream;
mod table;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use prometheus::{IntCounter, IntGauge};

pub use stream::{Bounds, ClientStream, Counted, Ended};
use table::Table;

use crate::metrics::Metrics;

pub struct ConnectionLimit<A> {
    inner: Arc<A>,
    max_connections: usize,
    bounds: Bounds,
    open: Arc<OpenCount>,
    table: Arc<Table>,
    refused_max: IntCounter,
}

/// The listener's count of open connections and its metrics.
struct OpenCount {
    count: AtomicUsize,
    gauge: IntGauge,
    first_byte_late: IntCounter,
    headers_too_large: IntCounter,
    client_stalled: IntCounter,
    evicted: IntCounter,
}

/// One open connection, counted until it is dropped.
struct Open(Arc<OpenCount>);

impl Open {
    /// Counts a new connection; the count with it.
    fn take(count: &Arc<OpenCount>) -> (Open, usize) {
        let open = count.count.fetch_add(1, Ordering::AcqRel) + 1;
        count.gauge.set(open as i64);
        (Open(count.clone()), open)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let left = self.0.count.fetch_sub(1, Ordering::AcqRel) - 1;
        self.0.gauge.set(left as i64);
    }
}

impl Counted for Open {
    fn ended(&self, why: Ended) {
        let c = &self.0;
        match why {
            Ended::FirstByteLate => c.first_byte_late.inc(),
            Ended::HeadersTooLarge => c.headers_too_large.inc(),
            Ended::ClientStalled => c.client_stalled.inc(),
            Ended::Evicted => c.evicted.inc(),
        }
    }
}

impl<A> ConnectionLimit<A> {
    pub fn new(
        inner: A,
        max_connections: usize,
        bounds: Bounds,
        metrics: Metrics,
    ) -> ConnectionLimit<A> {
        let refused = &metrics.refused_connections;
        let max_connections = max_connections.max(1);
        ConnectionLimit {
            inner: Arc::new(inner),
            max_connections,
            bounds,
            open: Arc::new(OpenCount {
                count: AtomicUsize::new(0),
                gauge: metrics.connections.clone(),
                first_byte_late: refused.with_label_values(&["first_byte_timeout"]),
                headers_too_large: refused.with_label_values(&["headers_too_large"]),
                client_stalled: refused.with_label_values(&["client_stalled"]),
                evicted: refused.with_label_values(&["evicted"]),
            }),
            // Room for the connections evicted but not yet dropped (their tasks end them at
            // their next wake-up).
            table: Arc::new(Table::new(max_connections + slack(max_connections))),
            refused_max: refused.with_label_values(&["max_connections"]),
        }
    }

    /// The stream to serve, bounded and counted; `None` refuses the connection (closed unread).
    fn admit(&self, stream: Stream) -> Option<Stream> {
        if (*stream).as_any().is::<ClientStream>() {
            // Handed back by the app for another round: already counted and bounded.
            return Some(stream);
        }
        let (counted, open) = Open::take(&self.open);
        if open > self.max_connections
            && (open > self.max_connections + slack(self.max_connections)
                || !self.table.evict_one())
        {
            self.refused_max.inc();
            return None;
        }
        Some(Box::new(ClientStream::new(
            stream,
            self.bounds,
            &self.table,
            Some(Box::new(counted)),
        )))
    }
}

/// How many connections beyond `max_connections` may be open while evicted ones wind down.
fn slack(max_connections: usize) -> usize {
    max_connections / 16 + 8
}

/// `ServerApp` by hand (the trait is `async_trait`'s): `process_new` returns the app's future
/// itself instead of a future that awaits it.
impl<A> ServerApp for ConnectionLimit<A>
where
    A: ServerApp + Send + Sync + 'static,
{
    fn process_new<'life0, 'life1, 'async_trait>(
        self: &'life0 Arc<Self>,
        stream: Stream,
        shutdown: &'life1 ShutdownWatch,
    ) -> Pin<Box<dyn Future<Output = Option<Stream>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        match self.admit(stream) {
            Some(stream) => self.inner.process_new(stream, shutdown),
            None => Box::pin(std::future::ready(None)),
        }
    }

    fn cleanup<'life0, 'async_trait>(
        &'life0 self,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        self.inner.cleanup()
    }
}
