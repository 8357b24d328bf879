//! Redis memory per waiting user: starts a private `redis-server`, enters N distinct users into
//! one target through the real `RedisStore` (enter.lua), polls each once (the heartbeat path),
//! and reports the growth of `used_memory` divided by N, with the per-key breakdown.
//!
//! `cargo bench --bench redis_memory [-- N]` (default N = 100000).

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vq_gateway::queue::{QueueTarget, TargetType};
use vq_gateway::store::liveness::Liveness;
use vq_gateway::store::{Now, QueueStore, RedisStore, TokenCandidate};

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// One command over RESP, answered as text (enough for INFO and MEMORY USAGE).
fn redis(port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes())?;
    let mut r = BufReader::new(s);
    let mut first = String::new();
    r.read_line(&mut first)?;
    match first.as_bytes().first() {
        Some(b'$') => {
            let n: usize = first[1..].trim().parse().unwrap_or(0);
            let mut body = vec![0; n + 2];
            std::io::Read::read_exact(&mut r, &mut body)?;
            Ok(String::from_utf8_lossy(&body[..n]).into_owned())
        }
        _ => Ok(first[1..].trim().to_string()),
    }
}

fn used_memory(port: u16) -> std::io::Result<u64> {
    let info = redis(port, &["INFO", "memory"])?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100_000);
    let port = free_port()?;
    let dir = std::env::temp_dir().join(format!("vq-mem-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
        ])
        .arg(&dir)
        .stdout(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis(port, &["PING"]).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }

    let store = Arc::new(RedisStore::new(
        &format!("redis://127.0.0.1:{port}"),
        Duration::from_secs(5),
    )?);
    store.connect(Duration::from_secs(2)).await;
    while store.ping().await.is_err() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let target = QueueTarget::new(TargetType::LimitedDrop, 42);
    let now = Now {
        epoch_ms: 1_800_000_000_000,
    };
    // One user first, so the fixed per-target keys are not counted per user.
    store.enter(target, 1, now).await?;
    let before = used_memory(port)?;
    let started = Instant::now();
    let chunk = 2_000u64;
    let mut user = 2u64;
    while user <= n + 1 {
        let end = (user + chunk).min(n + 2);
        let calls = (user..end).map(|u| {
            let store = store.clone();
            tokio::spawn(async move {
                store.enter(target, u, now).await?;
                let c = TokenCandidate {
                    token: "unused".into(),
                    expires_at: 1_800_000_300,
                };
                store.poll(target, u, now, &|| Some(c.clone())).await
            })
        });
        for h in calls.collect::<Vec<_>>() {
            h.await??;
        }
        user = end;
    }
    let took = started.elapsed();
    let after = used_memory(port)?;
    let per_user = (after.saturating_sub(before)) as f64 / n as f64;
    println!(
        "{n} waiting users entered and polled once in {took:.2?} ({:.0} enter+poll pairs/s)",
        n as f64 / took.as_secs_f64()
    );
    println!(
        "used_memory grew by {} bytes: {per_user:.1} bytes per waiting user",
        after - before
    );
    // The heartbeat bitmap of the window the enters and polls fell in (as many windows stay
    // alive as a sweep reads: see src/store/liveness.rs).
    let liveness = Liveness::default();
    let window = format!(
        "alive:{}:{}",
        liveness.window_ms(),
        liveness.window(now.epoch_ms)
    );
    for key in ["waiting", "queued", window.as_str(), "seqtime"] {
        let k = format!("queue:{{LIMITED_DROP:42}}:{key}");
        let bytes: f64 = redis(port, &["MEMORY", "USAGE", &k, "SAMPLES", "0"])?
            .parse()
            .unwrap_or(0.0);
        println!("  {k}: {:.1} bytes per user", bytes / (n + 1) as f64);
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
