//! The binary's edge: arguments, logging, config, and the only place errors become exit codes.

use anyhow::Context;
use clap::Parser;
use ratelimit_proxy::config::Config;
use std::path::PathBuf;
use std::process::ExitCode;

/// A reverse proxy that enforces distributed token-bucket rate limits kept in Redis.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// The routes and limits (YAML).
    #[arg(long, value_name = "PATH")]
    config: PathBuf,
    /// Validate the config, list every problem, and exit: 0 when valid.
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    let config = match Config::load(&cli.config) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if cli.check {
        println!(
            "{}: ok ({} routes)",
            cli.config.display(),
            config.routes.len()
        );
        return ExitCode::SUCCESS;
    }
    match ratelimit_proxy::server::run(config).context("cannot start") {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
