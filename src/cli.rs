//! The command line (clap): `serve`, `check-config`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "vq-gateway",
    version,
    about = "Virtual waiting room gateway on Pingora"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway: public proxy listener, admin listener and background services.
    Serve {
        /// TOML configuration file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a configuration file, print a short summary and exit (non-zero when invalid).
    CheckConfig {
        #[arg(long, short)]
        config: PathBuf,
    },
}
