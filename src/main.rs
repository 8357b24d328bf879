//! The process lifecycle: parse the command line, load and validate the configuration (exit 64 on
//! error), set up logging, read the token secret, build the server, run until SIGTERM/SIGINT.

use std::process::ExitCode;

use clap::Parser;
use vq_gateway::cli::{Cli, Command, DrawAction, FlagAction, OnOff, SaleAction, TargetAction};
use vq_gateway::config::Config;
use vq_gateway::ops::{self, FlagSetArgs, OpsError};
use vq_gateway::{logging, server};

/// mimalloc's thread-local pages suit Pingora's many short-lived per-request buffers better than
/// glibc malloc, which showed up high in the proxy's profile under load (`benches/README.md`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `EX_USAGE`: the configuration or environment given to us is unusable.
const EXIT_CONFIG: u8 = 64;
/// `EX_UNAVAILABLE`: the server could not be started (port taken, upstream unresolvable).
const EXIT_START: u8 = 69;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { config } => match Config::load(&config) {
            Ok(c) => {
                println!("{}: OK\n{}", config.display(), c.summary());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: {e}", config.display());
                ExitCode::from(EXIT_CONFIG)
            }
        },
        Command::Flag { action } => flag(action),
        Command::Target { action } => target(action),
        Command::Sale { action } => sale(action),
        Command::Draw {
            action: DrawAction::Verify { file },
        } => match std::fs::read(&file) {
            Ok(bytes) => match vq_gateway::draw::verify_export(&bytes) {
                Ok(summary) => {
                    println!("{summary}");
                    ExitCode::SUCCESS
                }
                Err(why) => {
                    eprintln!("vq-gateway draw verify: {why}");
                    ExitCode::from(1)
                }
            },
            Err(e) => {
                eprintln!("vq-gateway draw verify: {}: {e}", file.display());
                ExitCode::from(EXIT_CONFIG)
            }
        },
        Command::Serve { config } => {
            let config = match Config::load(&config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("vq-gateway: {}: {e}", config.display());
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            logging::init(config.server.log_format);
            let keys = match server::load_keys(&config) {
                Ok(k) => k,
                Err(e) => {
                    eprintln!("vq-gateway: {e}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            tracing::info!(
                listen = %config.server.listen,
                admin = %config.server.admin_listen,
                upstream = %config.upstream.address,
                "starting vq-gateway"
            );
            let built = match server::build(config, keys) {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("vq-gateway: {e}");
                    return ExitCode::from(EXIT_START);
                }
            };
            built.server.run(pingora::server::RunArgs {
                shutdown_signal: Box::new(server::DrainThenStop::new(built.state.clone())),
            });
            tracing::info!("vq-gateway stopped");
            ExitCode::SUCCESS
        }
    }
}

fn flag(action: FlagAction) -> ExitCode {
    let (path, change) = match &action {
        FlagAction::Show { config } => (config, None),
        FlagAction::Set {
            config,
            enabled,
            rollout,
            target,
        } => (
            config,
            Some(FlagSetArgs {
                enabled: enabled.map(|e| e == OnOff::On),
                rollout: *rollout,
                target: target.clone(),
            }),
        ),
    };
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vq-gateway: {}: {e}", path.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let result = match change {
        None => ops::show(&config),
        Some(change) => ops::set(&config, &change),
    };
    report(result)
}

fn target(action: TargetAction) -> ExitCode {
    let (path, change) = match &action {
        TargetAction::Add { config, target } => (config, Some((target.as_str(), true))),
        TargetAction::Remove { config, target } => (config, Some((target.as_str(), false))),
        TargetAction::List { config } => (config, None),
    };
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vq-gateway: {}: {e}", path.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    report(ops::target(&config, change))
}

fn sale(action: SaleAction) -> ExitCode {
    use vq_gateway::ops::SaleCommand;
    let (path, command) = match action {
        SaleAction::Create {
            config,
            target,
            fields,
        } => (config, SaleCommand::Create(target, fields)),
        SaleAction::Set {
            config,
            target,
            fields,
        } => (config, SaleCommand::Set(target, fields)),
        SaleAction::Show { config, target } => (config, SaleCommand::Show(target)),
        SaleAction::List { config } => (config, SaleCommand::List),
        SaleAction::Pause { config, target } => (config, SaleCommand::Pause(target)),
        SaleAction::Resume { config, target } => (config, SaleCommand::Resume(target)),
        SaleAction::Delete { config, target } => (config, SaleCommand::Delete(target)),
    };
    let config = match Config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vq-gateway: {}: {e}", path.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    report(ops::sale(&config, &command))
}

/// Prints an ops command's output, or its error with the exit code it deserves.
fn report(result: Result<String, OpsError>) -> ExitCode {
    match result {
        Ok(out) => {
            println!("{}", out.trim_end());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vq-gateway: {e}");
            let code = match e {
                OpsError::NotRedis | OpsError::Usage(_) => EXIT_CONFIG,
                OpsError::Unreachable(..) | OpsError::Store(_) | OpsError::Missing(..) => {
                    EXIT_START
                }
            };
            ExitCode::from(code)
        }
    }
}
