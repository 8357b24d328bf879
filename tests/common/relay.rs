//! A TCP relay between one gateway and Redis that a test can cut: the network partition of one
//! replica from a Redis the other replicas still reach. While cut, the relay forwards nothing in
//! either direction and holds what it read (a partition delays packets, TCP delivers them once it
//! heals); connections stay open and new ones are accepted, as through a black hole. It can also
//! delay what it forwards (`slow`): a Redis that answers, late.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub struct Relay {
    pub port: u16,
    cut: Arc<AtomicBool>,
    delay_ms: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<JoinHandle<()>>,
}

impl Relay {
    /// Relays 127.0.0.1:<free port> to `to`.
    pub fn start(to: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let streams = Arc::new(Mutex::new(Vec::new()));
        let accept = {
            let (cut, stop, streams) = (cut.clone(), stop.clone(), streams.clone());
            let delay_ms = delay_ms.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((client, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    let Ok(server) = TcpStream::connect(to) else {
                        continue;
                    };
                    client.set_nonblocking(false).unwrap();
                    for s in [&client, &server] {
                        s.set_nodelay(true).unwrap();
                        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                        streams.lock().unwrap().push(s.try_clone().unwrap());
                    }
                    pipe(&client, &server, &cut, &stop, &delay_ms);
                    pipe(&server, &client, &cut, &stop, &delay_ms);
                }
            })
        };
        Relay {
            port,
            cut,
            delay_ms,
            stop,
            streams,
            accept: Some(accept),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Stops forwarding, in both directions, on every connection.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
    }

    /// Forwards again, what was held first.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::Relaxed);
    }

    /// Holds everything it forwards for `ms` first (0: no delay).
    pub fn slow(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::Relaxed);
    }
}

/// Copies `from` to `to` on a thread of its own, holding what it read while `cut` is set.
fn pipe(
    from: &TcpStream,
    to: &TcpStream,
    cut: &Arc<AtomicBool>,
    stop: &Arc<AtomicBool>,
    delay_ms: &Arc<AtomicU64>,
) {
    let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
    let (cut, stop, delay_ms) = (cut.clone(), stop.clone(), delay_ms.clone());
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while !stop.load(Ordering::Relaxed) {
            if cut.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            let n = match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(_) => break,
            };
            // Read just before a cut: held until the heal, like a delayed segment.
            while cut.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(2));
            }
            let delay = delay_ms.load(Ordering::Relaxed);
            if delay > 0 {
                std::thread::sleep(Duration::from_millis(delay));
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for s in self.streams.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}
