//! Log output: human-readable text by default, one JSON object per line when configured.
//! `RUST_LOG` overrides the level filter (default `info`). Pingora's `log` records are captured
//! too. Nothing here ever formats a token or a secret: callers log fields, not requests.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Libraries whose debug and trace records print whole requests or Redis commands (headers with
/// `Authorization`, `Cookie`, `X-User-Id`, entry tokens): capped at `info` whatever `RUST_LOG`
/// asks, so no log level ever carries a credential.
const CAPPED: [&str; 9] = [
    "pingora",
    "pingora_core",
    "pingora_proxy",
    "pingora_http",
    "pingora_pool",
    "pingora_error",
    "pingora_timeout",
    "pingora_runtime",
    "fred",
];

pub fn init(format: LogFormat) {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    for target in CAPPED {
        if let Ok(d) = format!("{target}=info").parse() {
            filter = filter.add_directive(d);
        }
    }
    // Colours only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if let Err(e) = result {
        eprintln!("logging already initialised: {e}");
    }
}
