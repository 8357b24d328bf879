//! Connection limits of the public listener, wrapped around Pingora's HTTP proxy app:
//!
//! - at most `max_connections` connections are served at once; one beyond is closed at once
//!   (a clean close, nothing read) instead of holding memory (each keep-alive connection costs
//!   buffers; 3,000 idle ones were 284 MB);
//! - a new connection must send its first byte within `first_byte_timeout` (an idle socket
//!   opened and left is closed; Pingora's own per-read timeout covers the rest of the header);
//! - a kept-alive connection idles at most `keepalive_idle` between requests ([`IdleBound`]).
//!
//! Pingora's HTTP app serves all requests of a keep-alive connection inside one `process_new`
//! call, so the calls in flight are the open connections.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;

use super::idle::IdleBound;
use crate::metrics::Metrics;

pub struct ConnectionLimit<A> {
    inner: Arc<A>,
    max_connections: usize,
    first_byte_timeout: Duration,
    keepalive_idle: Duration,
    open: AtomicUsize,
    metrics: Metrics,
}

impl<A> ConnectionLimit<A> {
    pub fn new(
        inner: A,
        max_connections: usize,
        first_byte_timeout: Duration,
        keepalive_idle: Duration,
        metrics: Metrics,
    ) -> ConnectionLimit<A> {
        ConnectionLimit {
            inner: Arc::new(inner),
            max_connections: max_connections.max(1),
            first_byte_timeout,
            keepalive_idle,
            open: AtomicUsize::new(0),
            metrics,
        }
    }

    fn refuse(&self, reason: &str) -> Option<Stream> {
        self.metrics
            .refused_connections
            .with_label_values(&[reason])
            .inc();
        None
    }
}

/// One open connection, counted until its call ends, however it ends.
struct Open<'a, A>(&'a ConnectionLimit<A>);

impl<A> Drop for Open<'_, A> {
    fn drop(&mut self) {
        let left = self.0.open.fetch_sub(1, Ordering::AcqRel) - 1;
        self.0.metrics.connections.set(left as i64);
    }
}

#[async_trait]
impl<A> ServerApp for ConnectionLimit<A>
where
    A: ServerApp + Send + Sync + 'static,
{
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let open = self.open.fetch_add(1, Ordering::AcqRel) + 1;
        let _counted = Open(self.as_ref());
        self.metrics.connections.set(open as i64);
        if open > self.max_connections {
            return self.refuse("max_connections");
        }
        let mut first = [0u8; 1];
        match tokio::time::timeout(self.first_byte_timeout, stream.try_peek(&mut first)).await {
            // Data arrived, or this stream cannot peek (then Pingora's read timeout applies).
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return None,
            Err(_) => return self.refuse("first_byte_timeout"),
        }
        // Pingora's HTTP app serves every request of a keep-alive connection inside this call,
        // so one call is one connection.
        let stream: Stream = Box::new(IdleBound::new(stream, self.keepalive_idle));
        self.inner.process_new(stream, shutdown).await
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await
    }
}
