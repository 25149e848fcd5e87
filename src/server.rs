//! Builds Pingora's `Server` from a validated config: the proxy service, the admin service, the
//! config watcher, and the store behind them. Knows how the pieces are wired, not how a request is
//! handled.

use crate::admin::Admin;
use crate::clock::{Clock, SystemClock};
use crate::config::{ClockSource, Config};
use crate::deny_cache::DenyCache;
use crate::health::HealthChecker;
use crate::limiter::memory::MemoryLimiter;
use crate::limiter::redis::{RedisLimiter, Security};
use crate::limiter::{Limiter, LimiterError};
use crate::metrics::Metrics;
use crate::plan::{Plan, PlanError};
use crate::proxy::RateLimitProxy;
use crate::reload::{LivePlan, Reloader, Watcher};
use arc_swap::ArcSwap;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How often the config file is checked for changes.
const WATCH_INTERVAL: Duration = Duration::from_millis(500);

/// Process-level choices that are not part of the routes config.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Take the listening sockets over from a running instance (zero-downtime upgrade).
    pub upgrade: bool,
    /// Where the old and the new instance hand the sockets over.
    pub upgrade_sock: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("redis: {0}")]
    Store(#[from] LimiterError),
    #[error("redis.password_env names {0}, which is not set in the environment")]
    Password(String),
    #[error("redis.tls_ca_file: cannot read {0}")]
    CaFile(String),
}

/// Denials remembered at most (see `deny_cache`).
const DENY_CACHE_ENTRIES: usize = 100_000;

/// Starts serving `config`, read from `path` (watched for reloads); returns only if the server
/// could not be built.
pub fn run(config: Config, path: &Path, options: RunOptions) -> Result<(), StartError> {
    let registry = prometheus::default_registry().clone();
    let metrics = Metrics::new(&registry)?;
    let plan: LivePlan = Arc::new(ArcSwap::from_pointee(Plan::compile(&config, &metrics)?));
    let parts = Parts {
        reloader: Arc::new(Reloader::new(
            path,
            config.clone(),
            plan.clone(),
            metrics.clone(),
        )),
        plan,
        registry,
        options,
    };
    match &config.redis {
        Some(redis) => {
            let clock: Option<Box<dyn Clock>> = match redis.clock {
                ClockSource::Redis => None,
                ClockSource::Proxy => Some(Box::new(SystemClock)),
            };
            let security = Security {
                password: match &redis.password_env {
                    Some(name) => {
                        Some(std::env::var(name).map_err(|_| StartError::Password(name.clone()))?)
                    }
                    None => None,
                },
                ca_pem: match &redis.tls_ca_file {
                    Some(path) => Some(
                        std::fs::read(path)
                            .map_err(|e| StartError::CaFile(format!("{}: {e}", path.display())))?,
                    ),
                    None => None,
                },
            };
            let limiter =
                RedisLimiter::connect(&redis.target, security, redis.timeout, clock, metrics)?;
            serve(&config, parts, Arc::new(limiter))
        }
        None => {
            log::warn!("no `redis:` section: limits are kept in this process's memory and hold per proxy, not across a fleet");
            let limiter = MemoryLimiter::new(SystemClock, config.memory.max_keys);
            serve(&config, parts, Arc::new(limiter))
        }
    }
}

struct Parts {
    plan: LivePlan,
    reloader: Arc<Reloader>,
    registry: prometheus::Registry,
    options: RunOptions,
}

fn serve<L: Limiter>(config: &Config, parts: Parts, limiter: Arc<L>) -> Result<(), StartError> {
    let conf = ServerConf {
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        // Pingora stops accepting at SIGTERM, lets in-flight requests run for the grace period,
        // then gives its runtimes a last second to wind down.
        grace_period_seconds: Some(config.shutdown_grace.as_secs()),
        graceful_shutdown_timeout_seconds: Some(1),
        upgrade_sock: parts.options.upgrade_sock.display().to_string(),
        ..ServerConf::default()
    };
    let opt = Opt {
        upgrade: parts.options.upgrade,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();

    let deny_cache = config
        .redis
        .as_ref()
        .map(|redis| DenyCache::new(DENY_CACHE_ENTRIES, redis.timeout));
    let fallback = MemoryLimiter::new(SystemClock, config.memory.max_keys);
    let mut proxy = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        RateLimitProxy::new(parts.plan.clone(), limiter.clone(), deny_cache, fallback),
        "ratelimit-proxy",
    );
    for addr in &config.listen {
        proxy.add_tcp(&addr.to_string());
    }
    let mut admin = Service::new(
        "admin".to_string(),
        Admin::new(parts.registry, limiter, parts.plan.clone()),
    );
    admin.add_tcp(&config.admin.to_string());
    admin.threads = Some(1);
    let watcher = background_service(
        "config watcher",
        Watcher::new(parts.reloader, WATCH_INTERVAL),
    );
    let health = background_service("health checks", HealthChecker::new(parts.plan.clone()));

    log::info!(
        "proxy listening on {:?}, admin on {} ({} routes)",
        config.listen,
        config.admin,
        config.routes.len()
    );
    server.add_service(proxy);
    server.add_service(admin);
    server.add_service(watcher);
    server.add_service(health);
    server.run_forever()
}
