//! Builds Pingora's `Server` from a validated config: the proxy service, the admin service, the
//! config watcher, and the store behind them. Knows how the pieces are wired, not how a request is
//! handled.

use crate::admin::{Admin, AdminParts, HostCheck};
use crate::bind::{bind, per_address, BindError, Bound, Group, PreBound};
use crate::clock::{Clock, SystemClock};
use crate::config::{ClockSource, Config, Listener, RedisSettings, RedisTarget};
use crate::deny_cache::DenyCache;
use crate::downstream::Connections;
use crate::drain::Drain;
use crate::gate::Gate;
use crate::health::HealthChecker;
use crate::limiter::memory::MemoryLimiter;
use crate::limiter::redis::{
    Cluster, RedisLimiter, RedisOptions, Security, Sentinel, Standalone, Topology,
};
use crate::limiter::{Limiter, LimiterError};
use crate::metrics::Metrics;
use crate::plan::{Plan, PlanError};
use crate::proxy::RateLimitProxy;
use crate::reload::{LivePlan, Reloader, Watcher};
use crate::tls::Resolvers;
use arc_swap::ArcSwap;
use pingora::listeners::tls::TlsSettings;
use pingora::proxy::HttpProxy;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{RunArgs, Server};
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
    #[error("admin.token_env names {0}, which is not set (or empty) in the environment")]
    AdminToken(String),
    #[error("redis.tls_ca_file: cannot read {0}")]
    CaFile(String),
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("tls: {0}")]
    Tls(String),
}

/// Denials remembered at most (see `deny_cache`).
const DENY_CACHE_ENTRIES: usize = 100_000;

/// Starts serving `config`, read from `path` (watched for reloads); returns only if the server
/// could not be built.
pub fn run(config: Config, path: &Path, options: RunOptions) -> Result<(), StartError> {
    // Every socket first: a taken port stops the start here, before anything else runs or is
    // logged. An upgrade takes the running instance's sockets instead.
    let workers = workers();
    let cleartext = config.listen.iter().filter(|l| l.tls.is_none()).count();
    // TLS listeners have one socket, served by all threads (see `serve`); so has the admin one.
    let per_address = per_address(workers, cleartext, config.listen.len() - cleartext + 1);
    let sockets = if options.upgrade {
        Sockets::default()
    } else {
        let mut proxy = Vec::new();
        for listener in &config.listen {
            let sockets = if listener.tls.is_some() {
                1
            } else {
                per_address
            };
            proxy.extend(bind(listener.addr, "proxy", sockets)?);
        }
        Sockets {
            proxy,
            admin: bind(config.admin, "admin", 1)?,
        }
    };
    let registry = prometheus::default_registry().clone();
    let metrics = Metrics::new(&registry, config.redis.is_some())?;
    let plan: LivePlan = Arc::new(ArcSwap::from_pointee(Plan::compile(&config, &metrics)?));
    let resolvers = Resolvers::new(&config.listen);
    registry.register(Box::new(resolvers.clone()))?;
    let admin_token = match &config.admin_token_env {
        Some(name) => Some(
            std::env::var(name)
                .ok()
                // A file read into the variable brings its newline.
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
                .ok_or_else(|| StartError::AdminToken(name.clone()))?,
        ),
        None => None,
    };
    let parts = Parts {
        admin_token,
        reloader: Arc::new(Reloader::new(
            path,
            config.clone(),
            plan.clone(),
            metrics.clone(),
            resolvers.clone(),
        )),
        resolvers,
        plan,
        registry,
        metrics: metrics.clone(),
        options,
        sockets,
        workers,
        per_address,
    };
    match &config.redis {
        Some(redis) => {
            let clock: Option<Box<dyn Clock>> = match redis.clock {
                ClockSource::Redis => None,
                ClockSource::Proxy => Some(Box::new(SystemClock)),
            };
            let topology = redis_topology(redis)?;
            let options = RedisOptions {
                timeout: redis.timeout,
                clock,
                format: redis.state_format,
                metrics,
            };
            let limiter = Arc::new(RedisLimiter::new(topology, options));
            serve(&config, parts, limiter.clone(), Some(limiter))
        }
        None => {
            log::warn!("no `redis:` section: limits are kept in this process's memory and hold per proxy, not across a fleet");
            let limiter = MemoryLimiter::new(SystemClock, config.memory.max_keys);
            serve(&config, parts, Arc::new(limiter), None)
        }
    }
}

/// The configured Redis (one server, a Cluster, or a Sentinel-watched primary), with the password
/// and CA the config points at; nothing is connected yet.
pub fn redis_topology(redis: &RedisSettings) -> Result<Box<dyn Topology>, StartError> {
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
    Ok(match &redis.target {
        RedisTarget::Standalone(url) => Box::new(Standalone::new(url, &security, redis.timeout)?),
        RedisTarget::Cluster(nodes) => Box::new(Cluster::new(nodes, &security, redis.timeout)?),
        RedisTarget::Sentinel { master, nodes } => {
            Box::new(Sentinel::new(master, nodes, security, redis.timeout)?)
        }
    })
}

struct Parts {
    plan: LivePlan,
    /// Each TLS listener's certificate, which reloads replace.
    resolvers: Resolvers,
    reloader: Arc<Reloader>,
    registry: prometheus::Registry,
    metrics: Metrics,
    options: RunOptions,
    sockets: Sockets,
    /// The admin API's token, read from `admin.token_env` at start.
    admin_token: Option<String>,
    /// Worker threads: a cleartext proxy service each (see `serve`).
    workers: usize,
    /// Sockets on each cleartext address (`bind::per_address`).
    per_address: usize,
}

/// Listening sockets bound before the server starts (none in an upgrade).
#[derive(Default)]
struct Sockets {
    proxy: Vec<Bound>,
    admin: Vec<Bound>,
}

/// Worker threads, one per CPU.
fn workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// A listener Pingora could not build panics inside its service's thread while the rest of the
/// process serves on. Every socket is bound by `bind`, before the start or as an upgrade adds
/// it, but should Pingora fail to build a listener on one, that must stop the process too.
fn exit_on_listener_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if text.starts_with("Failed to build listeners") {
            eprintln!("error: cannot start: {text}");
            std::process::exit(1);
        }
        default(info);
    }));
}

/// One worker's proxy, with its own upstream pool.
fn worker_app<L: Limiter>(
    conf: &Arc<ServerConf>,
    config: &Config,
    proxy: RateLimitProxy<L>,
) -> HttpProxy<RateLimitProxy<L>> {
    let mut proxy = pingora::proxy::http_proxy(conf, proxy);
    // HTTP/2 connections (ALPN h2 or h2c) are Pingora's: bound their streams, and close them when
    // idle as an HTTP/1.1 keep-alive is (its HTTP/2 server has no idle timeout of its own).
    let mut h2 = pingora::protocols::http::v2::server::default_h2_options();
    h2.max_concurrent_streams(config.downstream.max_concurrent_streams);
    proxy.h2_options = Some(h2);
    let mut options = pingora::apps::HttpServerOptions::default();
    options.h2_idle_timeout = Some(config.downstream.idle_timeout);
    proxy.server_options = Some(options);
    proxy
}

/// `listener`'s address on `service`: cleartext, or TLS with the certificates its resolver serves.
fn add_listener<A>(
    service: &mut Service<A>,
    listener: &Listener,
    resolvers: &Resolvers,
) -> Result<(), StartError> {
    let addr = listener.addr.to_string();
    match &listener.tls {
        None => service.add_tcp(&addr),
        Some(tls) => {
            // ALPN h2 (unless `http2: false`) is handed to Pingora's HTTP/2 server by
            // `downstream`. The pair was read and matched when the config was loaded; the
            // resolver serves it until a reload puts another in its place.
            let mut settings =
                TlsSettings::intermediate("", "").map_err(|e| StartError::Tls(e.to_string()))?;
            if tls.http2 {
                settings.enable_h2();
            }
            let resolver = resolvers.get(listener.addr);
            settings.set_cert_resolver(resolver.expect("a resolver per TLS listener"));
            service.add_tls_with_settings(&addr, None, settings);
        }
    }
    Ok(())
}

/// Reads Redis's `maxmemory-policy` once the server runs (a Redis handle must be made inside a
/// Pingora runtime) and warns when it can evict the proxy's keys.
struct EvictionCheck(Arc<RedisLimiter>);

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for EvictionCheck {
    async fn start(&self, _shutdown: pingora::server::ShutdownWatch) {
        self.0.check_eviction().await;
    }
}

/// `redis`: the Redis store, whose eviction policy is checked at start.
fn serve<L: Limiter>(
    config: &Config,
    parts: Parts,
    limiter: Arc<L>,
    redis: Option<Arc<RedisLimiter>>,
) -> Result<(), StartError> {
    exit_on_listener_panic();
    let (downstream, warning) = crate::downstream::fit_to_fds(config.downstream);
    if let Some(warning) = warning {
        log::warn!("{warning}");
    }
    let conf = ServerConf {
        threads: parts.workers,
        // A runtime per thread: a request's tasks, and the Redis connection it made on its
        // thread (`limiter::redis::standalone`), stay on that thread, so a decision's round trip
        // wakes no other thread.
        work_stealing: false,
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
        .map(|redis| Arc::new(DenyCache::new(DENY_CACHE_ENTRIES, redis.timeout)));
    let fallback = MemoryLimiter::new(SystemClock, config.memory.max_keys);
    let gate = Arc::new(
        Gate::new(limiter.clone(), deny_cache.clone(), fallback, SystemClock).with_key_budget(
            config
                .new_keys_per_client
                .map(|b| Arc::new(crate::key_budget::KeyBudget::new(b))),
        ),
    );
    // One single-threaded service per worker thread, each on its own `SO_REUSEPORT` socket
    // (`bind`) with its own upstream pool: a connection, the upstream connection it borrows and
    // that connection's idle watch stay on one thread. With one service of N threads, Pingora
    // parks each idle upstream connection's watch on a random thread, and reusing it wakes that
    // thread. The services share everything else: plan, store, fallback, connection budget.
    //
    // TLS listeners stay in one service of N threads: Pingora gives each service its own TLS
    // acceptor and session cache, and a client that resumes its session must find it whichever
    // thread's socket the kernel hands its next connection to.
    let mut clients = Connections::new((), downstream, parts.metrics.clone()).with_h2c(
        config
            .listen
            .iter()
            .filter(|l| l.h2c)
            .map(|l| l.addr)
            .collect(),
    );
    // Before any service shares `clients`: they must all know the handshakes under way.
    let tls_gate = clients.tls_gate();
    let fresh = Arc::new(std::sync::Mutex::new(parts.sockets.proxy));
    let (tls, cleartext): (Vec<&Listener>, Vec<&Listener>) =
        config.listen.iter().partition(|l| l.tls.is_some());
    // (listeners, services, threads each, sockets per address)
    let kinds = [
        (cleartext, parts.workers, 1, parts.per_address),
        (tls, 1, parts.workers, 1),
    ];
    for (listeners, services, threads, sockets) in kinds {
        if listeners.is_empty() {
            continue;
        }
        let tls = listeners.iter().any(|l| l.tls.is_some());
        let group = Group {
            addrs: listeners.iter().map(|l| l.addr).collect(),
            what: "proxy",
            sockets,
            fresh: fresh.clone(),
        };
        for worker in 0..services {
            let app = worker_app(
                &server.configuration,
                config,
                RateLimitProxy::new(parts.plan.clone(), gate.clone(), parts.metrics.clone()),
            );
            let mut proxy = Service::new("ratelimit-proxy".to_string(), clients.sharing(app));
            proxy.threads = Some(threads);
            for listener in &listeners {
                add_listener(&mut proxy, listener, &parts.resolvers)?;
            }
            if let Some(gate) = tls_gate.clone().filter(|_| tls) {
                proxy.endpoints().set_pre_tls_callback(Arc::new(gate));
            }
            server.add_service(PreBound::new(proxy, worker, group.clone()));
        }
    }
    let drain = Drain::new(clients.open_count());
    let mut admin = Service::new(
        "admin".to_string(),
        Connections::admin(
            Admin::new(
                limiter,
                AdminParts {
                    registry: parts.registry,
                    metrics: parts.metrics.clone(),
                    resolvers: parts.resolvers.clone(),
                    plan: parts.plan.clone(),
                    reloader: parts.reloader.clone(),
                    deny_cache,
                    token: parts.admin_token,
                    hosts: HostCheck::new(config.admin, &config.admin_allowed_hosts),
                },
            ),
            downstream,
            crate::admin::security_header_lines(),
        ),
    );
    admin.add_tcp(&config.admin.to_string());
    admin.threads = Some(1);
    let watcher = background_service(
        "config watcher",
        Watcher::new(parts.reloader, WATCH_INTERVAL),
    );
    let health = background_service("health checks", HealthChecker::new(parts.plan.clone()));

    let listening: Vec<String> = config
        .listen
        .iter()
        .map(|l| match &l.tls {
            None if l.h2c => format!("{} (HTTP/1.1 and h2c)", l.addr),
            None => l.addr.to_string(),
            Some(tls) => {
                let names: Vec<&str> = tls
                    .certs
                    .iter()
                    .flat_map(|c| &c.served.names)
                    .map(String::as_str)
                    .collect();
                format!("{} (TLS for {})", l.addr, names.join(", "))
            }
        })
        .collect();
    log::info!(
        "proxy listening on {}, admin on {} ({} routes)",
        listening.join(", "),
        config.admin,
        config.routes.len()
    );
    let admin_group = Group {
        addrs: vec![config.admin],
        what: "admin",
        sockets: 1,
        fresh: Arc::new(std::sync::Mutex::new(parts.sockets.admin)),
    };
    server.add_service(PreBound::new(admin, 0, admin_group));
    server.add_service(watcher);
    server.add_service(health);
    if let Some(redis) = redis {
        server.add_service(background_service(
            "redis eviction check",
            EvictionCheck(redis),
        ));
    }
    server.run(RunArgs {
        shutdown_signal: Box::new(drain),
    });
    std::process::exit(0)
}
