//! Log output: human-readable text by default, one JSON object per line when configured.
//! `RUST_LOG` overrides the level filter (default `info`). Pingora's `log` records are captured
//! too. Nothing here ever formats a token or a secret: callers log fields, not requests.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
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
