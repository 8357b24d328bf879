//! Connection limits of the public listener, wrapped around Pingora's HTTP proxy app:
//!
//! - at most `max_connections` connections are served at once; one beyond is closed at once
//!   (a clean close, nothing read) instead of holding memory (each keep-alive connection costs
//!   buffers; 3,000 idle ones were 284 MB);
//! - a new connection must send its first byte within `first_byte_timeout` (an idle socket
//!   opened and left is closed; Pingora's own per-read timeout covers the rest of the header).
//!
//! A keep-alive connection comes back to `process_new` for each request; it is recognised by its
//! socket id, counted once and timed only when new.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::{Stream, UniqueIDType};
use pingora::server::ShutdownWatch;

use crate::metrics::Metrics;

pub struct ConnectionLimit<A> {
    inner: Arc<A>,
    max_connections: usize,
    first_byte_timeout: Duration,
    /// Connections being served (by their socket id): a keep-alive connection comes back to
    /// `process_new` for each request and must not be counted, or timed, twice.
    live: Mutex<HashSet<UniqueIDType>>,
    metrics: Metrics,
}

impl<A> ConnectionLimit<A> {
    pub fn new(
        inner: A,
        max_connections: usize,
        first_byte_timeout: Duration,
        metrics: Metrics,
    ) -> ConnectionLimit<A> {
        ConnectionLimit {
            inner: Arc::new(inner),
            max_connections: max_connections.max(1),
            first_byte_timeout,
            live: Mutex::new(HashSet::new()),
            metrics,
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashSet<UniqueIDType>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn refuse(&self, reason: &str) -> Option<Stream> {
        self.metrics
            .refused_connections
            .with_label_values(&[reason])
            .inc();
        None
    }
}

/// Forgets a connection when its call ends without handing it back for reuse, however it ends
/// (a dropped future included).
struct Live<'a, A> {
    limit: &'a ConnectionLimit<A>,
    id: UniqueIDType,
    reused: bool,
}

impl<A> Drop for Live<'_, A> {
    fn drop(&mut self) {
        if !self.reused {
            let mut live = self.limit.live();
            live.remove(&self.id);
            self.limit.metrics.connections.set(live.len() as i64);
        }
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
        let id = stream.id();
        let fresh = {
            let mut live = self.live();
            if live.contains(&id) {
                false
            } else if live.len() >= self.max_connections {
                drop(live);
                return self.refuse("max_connections");
            } else {
                live.insert(id);
                self.metrics.connections.set(live.len() as i64);
                true
            }
        };
        let mut guard = Live {
            limit: self.as_ref(),
            id,
            reused: false,
        };
        if fresh {
            let mut first = [0u8; 1];
            match tokio::time::timeout(self.first_byte_timeout, stream.try_peek(&mut first)).await {
                // Data arrived, or this stream cannot peek (then Pingora's read timeout applies).
                Ok(Ok(_)) => {}
                Ok(Err(_)) => return None,
                Err(_) => return self.refuse("first_byte_timeout"),
            }
        }
        let out = self.inner.process_new(stream, shutdown).await;
        guard.reused = out.is_some();
        out
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await
    }
}
