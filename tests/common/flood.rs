//! A flood of keep-alive HTTP/1.1 connections from one test process: thousands of connections on
//! a small tokio runtime, each sending the same kind of request again as soon as its answer is
//! read. For overload tests, where a thread per connection would exhaust the test process first.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Counts of what the flood saw.
#[derive(Debug, Default)]
pub struct FloodCounts {
    pub answers: AtomicU64,
    /// Answers with a status of 500 or more.
    pub errors: AtomicU64,
    /// Connections that failed (refused, reset, closed) and were opened again.
    pub reconnects: AtomicU64,
}

pub struct Flood {
    stop: Arc<AtomicBool>,
    pub counts: Arc<FloodCounts>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    /// `connections` connections to `addr`, each sending `request(i, n)` (connection `i`, its
    /// `n`-th request: the whole raw request, ending with an empty line) back to back.
    pub fn start(
        addr: SocketAddr,
        connections: usize,
        request: impl Fn(usize, u64) -> String + Send + Sync + 'static,
    ) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(FloodCounts::default());
        let request = Arc::new(request);
        let (s, c) = (stop.clone(), counts.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let tasks: Vec<_> = (0..connections)
                    .map(|i| {
                        let (s, c, request) = (s.clone(), c.clone(), request.clone());
                        tokio::spawn(async move { connection(addr, i, &s, &c, &*request).await })
                    })
                    .collect();
                for t in tasks {
                    let _ = t.await;
                }
            });
        });
        Flood {
            stop,
            counts,
            thread: Some(thread),
        }
    }

    pub fn answers(&self) -> u64 {
        self.counts.answers.load(Ordering::Relaxed)
    }

    pub fn stop(mut self) -> Arc<FloodCounts> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.counts.clone()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn connection(
    addr: SocketAddr,
    i: usize,
    stop: &AtomicBool,
    counts: &FloodCounts,
    request: &(dyn Fn(usize, u64) -> String + Send + Sync),
) {
    let mut n = 0u64;
    let mut buf = vec![0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) {
        let Ok(Ok(mut sock)) =
            tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
                .await
        else {
            counts.reconnects.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let _ = sock.set_nodelay(true);
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            if sock.write_all(request(i, n).as_bytes()).await.is_err() {
                break;
            }
            match tokio::time::timeout(Duration::from_secs(5), read_answer(&mut sock, &mut buf))
                .await
            {
                Ok(Some(status)) => {
                    counts.answers.fetch_add(1, Ordering::Relaxed);
                    if status >= 500 {
                        counts.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => break,
            }
        }
        counts.reconnects.fetch_add(1, Ordering::Relaxed);
    }
}

/// Reads one answer (header and a `Content-Length` body); its status.
async fn read_answer(sock: &mut tokio::net::TcpStream, buf: &mut [u8]) -> Option<u16> {
    let mut have = 0;
    loop {
        if have == buf.len() {
            return None;
        }
        let n = sock.read(&mut buf[have..]).await.ok()?;
        if n == 0 {
            return None;
        }
        have += n;
        let Some(end) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = std::str::from_utf8(&buf[..end]).ok()?;
        let status: u16 = head.split(' ').nth(1)?.parse().ok()?;
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        let mut body = have - (end + 4);
        while body < length {
            let n = sock.read(&mut buf[..]).await.ok()?;
            if n == 0 {
                return None;
            }
            body += n;
        }
        return Some(status);
    }
}
