//! `vq-sim simulate …` and `vq-sim record-backend …`: the command line of the rehearsal tools.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use vq_sim::{backend, SimArgs, SimError};

/// `EX_USAGE`: the arguments given are unusable.
const EXIT_USAGE: u8 = 64;
/// `EX_UNAVAILABLE`: the run could not be started or its results not written.
const EXIT_START: u8 = 69;

#[derive(Debug, Parser)]
#[command(
    name = "vq-sim",
    version,
    about = "Rehearse a sale start against vq-gateway"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Rehearse a sale start against a gateway or load balancer URL: spike, polls, purchases;
    /// writes report.json and chart.svg and prints a summary.
    Simulate(Box<SimArgs>),
    /// A stand-in backend for rehearsals: records purchases on the default gated routes, refuses
    /// a second purchase by the same user (409), answers `GET /_record`.
    RecordBackend {
        /// Address to listen on (port 0: any free port; the bound address is printed).
        #[arg(long, default_value = "127.0.0.1:8081")]
        listen: SocketAddr,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Simulate(args) => match vq_sim::run(*args) {
            Ok(report) => {
                print!("{}", report.summary());
                ExitCode::SUCCESS
            }
            Err(e @ SimError::Usage(_)) => {
                eprintln!("vq-sim simulate: {e}");
                ExitCode::from(EXIT_USAGE)
            }
            Err(e) => {
                eprintln!("vq-sim simulate: {e}");
                ExitCode::from(EXIT_START)
            }
        },
        Command::RecordBackend { listen } => record_backend(listen),
    }
}

fn record_backend(listen: SocketAddr) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("vq-sim record-backend: {e}");
            return ExitCode::from(EXIT_START);
        }
    };
    match runtime.block_on(backend::serve(listen)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vq-sim record-backend: cannot listen on {listen}: {e}");
            ExitCode::from(EXIT_START)
        }
    }
}
