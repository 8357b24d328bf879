//! The framework's ceiling, for `benches/run.sh`: a bare Pingora HTTP proxy with the gateway's
//! server settings (worker threads, one single-threaded runtime per thread), allocator, upstream
//! peer options and, when asked, keep-alive idle bound, and nothing else: no routing, no gate, no
//! logging, no metrics.
//!
//! `cargo bench --bench bare_proxy -- LISTEN UPSTREAM [THREADS] [KEEPALIVE_IDLE_S] [MODULES]`
//! (runs until killed). `KEEPALIVE_IDLE_S` > 0 bounds how long a keep-alive connection may wait
//! for its next request, as the gateway's `server.keepalive_idle_s` does (Pingora then arms a
//! timer for every wait); 0, the default, keeps Pingora's default for HTTP/1.1: no bound.
//! `MODULES` is `default` (Pingora's default downstream modules: a disabled response compression
//! module) or `none` (none, as the gateway runs).

use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;

/// The gateway's allocator (`src/main.rs`): the ceiling is the framework with the same process
/// settings, so the comparison measures the gateway's own work, not the allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Bare {
    upstream: SocketAddr,
    keepalive_idle_s: u64,
    default_modules: bool,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    fn init_downstream_modules(&self, modules: &mut pingora::modules::http::HttpModules) {
        if self.default_modules {
            modules.add_module(
                pingora::modules::http::compression::ResponseCompressionBuilder::enable(0),
            );
        }
    }

    async fn early_request_filter(&self, session: &mut Session, _ctx: &mut ()) -> Result<()> {
        // As the gateway does: bound the idle wait of a connection Pingora keeps alive.
        if self.keepalive_idle_s > 0 && session.get_keepalive().is_some() {
            session.set_keepalive(Some(self.keepalive_idle_s));
        }
        Ok(())
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        // The gateway's defaults (upstream.connect_timeout_ms, read/write timeouts).
        let mut peer = HttpPeer::new(self.upstream, false, String::new());
        peer.options.connection_timeout = Some(Duration::from_millis(1000));
        peer.options.total_connection_timeout = Some(Duration::from_millis(1000));
        peer.options.read_timeout = Some(Duration::from_secs(30));
        peer.options.write_timeout = Some(Duration::from_secs(30));
        Ok(Box::new(peer))
    }
}

fn main() {
    // `cargo bench` appends `--bench`; everything else is positional.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let (Some(listen), Some(upstream)) = (args.first(), args.get(1)) else {
        eprintln!("usage: bare_proxy LISTEN UPSTREAM [THREADS] [KEEPALIVE_IDLE_S] [MODULES]");
        std::process::exit(64);
    };
    let Ok(upstream) = upstream.parse::<SocketAddr>() else {
        eprintln!("bare_proxy: UPSTREAM must be ip:port, not {upstream}");
        std::process::exit(64);
    };
    let threads = match args.get(2).map(|t| t.parse::<usize>()) {
        None => 1,
        Some(Ok(t)) if t > 0 => t,
        Some(_) => {
            eprintln!("bare_proxy: THREADS must be a positive number");
            std::process::exit(64);
        }
    };
    let keepalive_idle_s = match args.get(3).map(|t| t.parse::<u64>()) {
        None => 0,
        Some(Ok(s)) => s,
        Some(Err(_)) => {
            eprintln!("bare_proxy: KEEPALIVE_IDLE_S must be a number of seconds");
            std::process::exit(64);
        }
    };
    let default_modules = match args.get(4).map(String::as_str) {
        None | Some("default") => true,
        Some("none") => false,
        Some(other) => {
            eprintln!("bare_proxy: MODULES must be `default` or `none`, not {other}");
            std::process::exit(64);
        }
    };
    let mut conf = ServerConf {
        threads,
        work_stealing: false,
        pid_file: format!("/tmp/vq-bare-proxy-{}.pid", std::process::id()),
        upgrade_sock: format!("/tmp/vq-bare-proxy-{}.sock", std::process::id()),
        // A bench process: stop at once on SIGTERM (Pingora's default grace is a minute).
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    conf.max_retries = 1;
    let mut server = Server::new_with_opt_and_conf(None, conf);
    let mut proxy = pingora::proxy::http_proxy_service(
        &server.configuration,
        Bare {
            upstream,
            keepalive_idle_s,
            default_modules,
        },
    );
    proxy.add_tcp(listen);
    server.add_service(proxy);
    server.bootstrap();
    server.run_forever();
}
