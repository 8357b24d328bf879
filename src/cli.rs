//! The command line (clap): `serve`, `check-config`, `flag show|set`, `target add|remove|list`,
//! `sale create|set|show|list|pause|resume|delete`, `draw verify`.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

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
    /// Show or change the runtime queue flag in Redis (every instance follows within 3 s).
    Flag {
        #[command(subcommand)]
        action: FlagAction,
    },
    /// Register sales that may have a queue (`queue.targets = "registered"`), in Redis.
    Target {
        #[command(subcommand)]
        action: TargetAction,
    },
    /// Create, change, pause, resume, show or delete sales: each sale's own budget, tick,
    /// capacity and heartbeat timeout, in Redis (every replica follows at its next tick).
    Sale {
        #[command(subcommand)]
        action: SaleAction,
    },
    /// Check a sale's draw: `draw verify FILE`, FILE being the admin export
    /// (`GET /sales/{type}/{id}/draw`): the seed matches the commitment, and the order follows
    /// from the seed and the entrants (exit 0), or not (exit 1).
    Draw {
        #[command(subcommand)]
        action: DrawAction,
    },
}

#[derive(Debug, Subcommand)]
pub enum TargetAction {
    /// Register a sale, e.g. LIMITED_DROP:42 (every instance follows within 2 s).
    Add {
        #[arg(long, short)]
        config: PathBuf,
        target: String,
    },
    /// Unregister a sale.
    Remove {
        #[arg(long, short)]
        config: PathBuf,
        target: String,
    },
    /// List the registered sales (the file's and Redis').
    List {
        #[arg(long, short)]
        config: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum DrawAction {
    Verify { file: PathBuf },
}

#[derive(Debug, Subcommand)]
pub enum SaleAction {
    /// Create a sale, e.g. `sale create -c gw.toml LIMITED_DROP:42 batchSize=50 tickMs=1000`
    /// (fields: batchSize, tickMs, maxCapacity, heartbeatTimeoutS, state; the file's `[queue]`
    /// for those not given). Refused if the sale exists.
    Create {
        #[arg(long, short)]
        config: PathBuf,
        target: String,
        fields: Vec<String>,
    },
    /// Change fields of an existing sale (field=value ...).
    Set {
        #[arg(long, short)]
        config: PathBuf,
        target: String,
        fields: Vec<String>,
    },
    /// Show a sale with its live figures.
    Show {
        #[arg(long, short)]
        config: PathBuf,
        target: String,
    },
    /// List the sales.
    List {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Stop admitting (users keep their places).
    Pause {
        #[arg(long, short)]
        config: PathBuf,
        target: String,
    },
    /// Admit again.
    Resume {
        #[arg(long, short)]
        config: PathBuf,
        target: String,
    },
    /// Delete a sale, its queue and its registration.
    Delete {
        #[arg(long, short)]
        config: PathBuf,
        target: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Debug, Subcommand)]
pub enum FlagAction {
    /// Print the TOML defaults, the runtime overrides and the effective state.
    Show {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Turn the queue on or off, globally or for one target, and set the rollout percentage.
    Set {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long)]
        enabled: Option<OnOff>,
        /// Percentage of users (by stable bucket) who go through the queue, 0..=100. Global.
        #[arg(long)]
        rollout: Option<u8>,
        /// Apply --enabled to one target only, e.g. LIMITED_DROP:42.
        #[arg(long)]
        target: Option<String>,
    },
}
