//! Real nginx running the shipped nginx-lb configuration (`docker/nginx.conf`), with its
//! addresses replaced by local ports: `gateway-K:8080` by the K-th given gateway (cycling when
//! fewer are given), the auth service by `auth`, the listener by a free local port.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, wait_until, TempDir};

/// How many replicas the shipped configuration names (`gateway-1` … `gateway-N`).
pub const SHIPPED_REPLICAS: usize = 3;

pub struct Nginx {
    child: Child,
    pub addr: SocketAddr,
    dir: TempDir,
}

impl Drop for Nginx {
    /// SIGTERM to the master, which stops its workers; SIGKILL (which would orphan the workers,
    /// still holding the port) only if it has not exited within 5 s.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let stopped = wait_until(Duration::from_secs(5), || {
            matches!(self.child.try_wait(), Ok(Some(_)))
        });
        if !stopped {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

pub fn shipped_config() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docker/nginx.conf")).unwrap()
}

impl Nginx {
    pub fn start(gateways: &[SocketAddr], auth: SocketAddr) -> Nginx {
        assert!(!gateways.is_empty());
        let shipped = shipped_config();
        let port = free_port();
        let mut conf = shipped
            .replace("server auth:8081;", &format!("server {auth};"))
            .replace("listen 80;", &format!("listen 127.0.0.1:{port};"))
            .replace("worker_processes auto;", "worker_processes 1;");
        for k in 1..=SHIPPED_REPLICAS {
            let name = format!("gateway-{k}:8080");
            assert!(conf.contains(&name), "docker/nginx.conf names no {name}");
            conf = conf.replace(&name, &gateways[(k - 1) % gateways.len()].to_string());
        }
        assert!(!conf.contains("gateway-"), "a replica left unmapped");
        Nginx::run(&conf, port)
    }

    /// Runs nginx on the configuration `conf`, which listens on `127.0.0.1:port`.
    pub fn run(conf: &str, port: u16) -> Nginx {
        let dir = TempDir::new("nginx");
        let path = dir.0.join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        // Debian installs it in /usr/sbin, which a non-root PATH may not hold.
        let bin = ["/usr/sbin/nginx", "/usr/local/sbin/nginx"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or("nginx");
        let child = Command::new(bin)
            .arg("-c")
            .arg(&path)
            .arg("-p")
            .arg(&dir.0)
            .arg("-e")
            .arg(dir.0.join("error.log"))
            .arg("-g")
            .arg(format!(
                "daemon off; pid {};",
                dir.0.join("nginx.pid").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx must be installed (apt-get install nginx-light)");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let nginx = Nginx { child, addr, dir };
        assert!(
            wait_until(Duration::from_secs(10), || std::net::TcpStream::connect(
                addr
            )
            .is_ok()),
            "nginx did not start: {}",
            nginx.error_log()
        );
        nginx
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("error.log")).unwrap_or_default()
    }
}
