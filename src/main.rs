//! The binary's edge: arguments, logging, config, and the only place errors become exit codes.

use anyhow::Context;
use clap::Parser;
use ratelimit_proxy::config::Config;
use ratelimit_proxy::server::RunOptions;
use std::path::PathBuf;
use std::process::ExitCode;

/// Every proxied request allocates a few dozen small, short-lived buffers (most of them Pingora's
/// header maps); glibc's allocator spent about a quarter of the proxy's user-space instructions
/// on them under load, mimalloc's thread-local free lists a fraction of that.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A reverse proxy that enforces distributed token-bucket rate limits kept in Redis.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// The routes and limits (YAML).
    #[arg(long, value_name = "PATH")]
    config: PathBuf,
    /// Validate the config and exit: 0 and the compiled route table when valid, otherwise every
    /// problem on stderr.
    #[arg(long)]
    check: bool,
    /// With --check: also connect to the configured Redis and check what would fail at run time
    /// (reachable, authenticated, the ACL, the script, the clock); exit 2 if anything does.
    #[arg(long, requires = "check")]
    redis: bool,
    /// Take the listening sockets over from the running instance, which gets SIGQUIT next
    /// (zero-downtime upgrade; see the README).
    #[arg(long)]
    upgrade: bool,
    /// The socket the running and the upgrading instance hand the listeners over on.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/tmp/ratelimit-proxy-upgrade.sock"
    )]
    upgrade_sock: PathBuf,
}

/// `--check --redis`: one line per check against the configured Redis; 2 if any failed.
fn check_redis(config: &Config) -> ExitCode {
    let Some(redis) = &config.redis else {
        eprintln!("--redis: the config has no redis: section (its buckets are in memory)");
        return ExitCode::from(2);
    };
    let topology = match ratelimit_proxy::server::redis_topology(redis) {
        Ok(topology) => topology,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("redis: cannot start a runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let leases = config.routes.iter().flat_map(|r| &r.limits).any(|l| {
        matches!(
            l.allowance,
            ratelimit_proxy::config::Allowance::Concurrency { .. }
        )
    });
    let lines = runtime.block_on(ratelimit_proxy::preflight::check(redis, &*topology, leases));
    for line in &lines {
        println!("{line}");
    }
    if lines.iter().all(|l| l.result.is_ok()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

fn main() -> ExitCode {
    ratelimit_proxy::logging::init();
    let cli = Cli::parse();
    let config = match Config::load(&cli.config) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    for warning in &config.warnings {
        if cli.check {
            eprintln!("warning: {warning}");
        } else {
            log::warn!("{warning}");
        }
    }
    if cli.check {
        println!(
            "{}: ok ({} routes)",
            cli.config.display(),
            config.routes.len()
        );
        print!("{}", ratelimit_proxy::explain::route_table(&config));
        if cli.redis {
            return check_redis(&config);
        }
        return ExitCode::SUCCESS;
    }
    let options = RunOptions {
        upgrade: cli.upgrade,
        upgrade_sock: cli.upgrade_sock,
    };
    match ratelimit_proxy::server::run(config, &cli.config, options).context("cannot start") {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
