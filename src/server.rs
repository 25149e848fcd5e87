//! Builds Pingora's `Server` from a validated config: the proxy service, the admin service, and the
//! store behind them. Knows how the pieces are wired, not how a request is handled.

use crate::admin::Admin;
use crate::clock::{Clock, SystemClock};
use crate::config::{ClockSource, Config};
use crate::limiter::memory::MemoryLimiter;
use crate::limiter::redis::RedisLimiter;
use crate::limiter::{Limiter, LimiterError};
use crate::metrics::Metrics;
use crate::plan::{Plan, PlanError};
use crate::proxy::RateLimitProxy;
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::services::listening::Service;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("redis: {0}")]
    Store(#[from] LimiterError),
}

/// Starts serving `config`; returns only if the server could not be built.
pub fn run(config: Config) -> Result<(), StartError> {
    let registry = prometheus::default_registry().clone();
    let metrics = Metrics::new(&registry)?;
    let plan = Arc::new(Plan::compile(&config, &metrics)?);
    match &config.redis {
        Some(redis) => {
            let clock: Option<Box<dyn Clock>> = match redis.clock {
                ClockSource::Redis => None,
                ClockSource::Proxy => Some(Box::new(SystemClock)),
            };
            let limiter = RedisLimiter::new(&redis.url, redis.timeout, clock, metrics)?;
            serve(&config, plan, Arc::new(limiter), registry)
        }
        None => {
            log::warn!("no `redis:` section: limits are kept in this process's memory and hold per proxy, not across a fleet");
            serve(
                &config,
                plan,
                Arc::new(MemoryLimiter::new(SystemClock)),
                registry,
            )
        }
    }
}

fn serve<L: Limiter>(
    config: &Config,
    plan: Arc<Plan>,
    limiter: Arc<L>,
    registry: prometheus::Registry,
) -> Result<(), StartError> {
    let conf = ServerConf {
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        // Pingora stops accepting at SIGTERM, lets in-flight requests run for the grace period,
        // then gives its runtimes a last second to wind down.
        grace_period_seconds: Some(config.shutdown_grace.as_secs()),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let needs_store = plan.needs_store();
    let mut proxy = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        RateLimitProxy::new(plan, limiter.clone()),
        "ratelimit-proxy",
    );
    for addr in &config.listen {
        proxy.add_tcp(&addr.to_string());
    }
    let mut admin = Service::new(
        "admin".to_string(),
        Admin::new(registry, limiter, needs_store),
    );
    admin.add_tcp(&config.admin.to_string());
    admin.threads = Some(1);

    log::info!(
        "proxy listening on {:?}, admin on {} ({} routes)",
        config.listen,
        config.admin,
        config.routes.len()
    );
    server.add_service(proxy);
    server.add_service(admin);
    server.run_forever()
}
