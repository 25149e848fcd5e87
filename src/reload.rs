//! Hot reload: SIGHUP, or a change of the config file on disk, swaps in new routes and limits
//! without touching a connection.
//!
//! A new config is validated whole before anything changes; an invalid one is refused with the same
//! messages as `--check` and the running config stays. Settings that live in sockets or
//! connections (listen, admin, redis, shutdown grace, memory store) cannot change live: a reload
//! keeps their running values and says which ones need a restart. A TLS listener's certificate is
//! the exception: on the same sockets, a renewed pair is put in place for new connections. Buckets
//! are untouched, so a limit whose key is unchanged keeps its state (see `lua/token_bucket.lua` for
//! a changed limit).

use crate::config::{Config, ConfigError};
use crate::metrics::Metrics;
use crate::plan::{Plan, PlanError};
use crate::tls::Resolvers;
use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The routes every request reads, swapped whole on reload.
pub type LivePlan = Arc<ArcSwap<Plan>>;

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// What a successful reload did.
#[derive(Debug, PartialEq, Eq)]
pub struct Applied {
    pub hash: String,
    pub routes: usize,
    /// Settings that differ in the file but keep their running values until a restart.
    pub needs_restart: Vec<&'static str>,
    /// What the new config does that is valid but likely a mistake.
    pub warnings: Vec<crate::config::Problem>,
}

pub struct Reloader {
    path: PathBuf,
    plan: LivePlan,
    metrics: Metrics,
    /// Where a renewed certificate of a TLS listener is put in place.
    resolvers: Resolvers,
    /// The config the live plan was compiled from, and the hash of its file.
    running: Mutex<(Config, String)>,
    /// What the last load of the file did.
    last: Mutex<LastReload>,
}

/// The last load of the config file: the start, or a reload applied or refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastReload {
    /// Unix seconds.
    pub at: i64,
    /// "start", "success" or "failure".
    pub result: &'static str,
    /// Why a refused reload was refused.
    pub error: Option<String>,
}

impl Reloader {
    pub fn new(
        path: &Path,
        config: Config,
        plan: LivePlan,
        metrics: Metrics,
        resolvers: Resolvers,
    ) -> Reloader {
        let hash = file_hash(path).unwrap_or_default();
        metrics.config_running(&hash);
        Reloader {
            path: path.to_path_buf(),
            plan,
            metrics,
            resolvers,
            running: Mutex::new((config, hash)),
            last: Mutex::new(LastReload {
                at: crate::tls::unix_now(),
                result: "start",
                error: None,
            }),
        }
    }

    /// The running config, its file's hash, and what the last load did: for the admin API.
    pub fn snapshot(&self) -> (Config, String, LastReload) {
        let (config, hash) = self.lock().clone();
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        (config, hash, last)
    }

    /// The hash of the config that is running.
    pub fn running_hash(&self) -> String {
        self.lock().1.clone()
    }

    /// One hash of the config file, of every TLS listener's certificate and key files, and of the
    /// CA files upstreams are verified with: what the watcher compares, so that a renewed
    /// certificate is picked up like an edited config.
    fn watched_hash(&self) -> Option<String> {
        let files: Vec<PathBuf> = {
            let running = self.lock();
            let listeners = running
                .0
                .listen
                .iter()
                .filter_map(|l| l.tls.as_ref())
                .flat_map(|t| &t.certs)
                .flat_map(|c| [c.cert_file.clone(), c.key_file.clone()]);
            let cas = running
                .0
                .routes
                .iter()
                .filter_map(|r| r.upstream_tls.ca.as_ref())
                .map(|ca| ca.file.clone());
            listeners.chain(cas).collect()
        };
        let mut sha = sha1_smol::Sha1::from(std::fs::read(&self.path).ok()?);
        for file in files {
            // An unreadable file hashes as empty: its reload is tried, and refused, once.
            sha.update(&std::fs::read(file).unwrap_or_default());
        }
        Some(sha.digest().to_string())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Config, String)> {
        // The guarded data is replaced whole, never left half-written.
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads and validates the file, then swaps it in; on any problem nothing changes.
    pub fn reload(&self) -> Result<Applied, ReloadError> {
        let result = self.try_reload();
        self.metrics.config_reload(result.is_ok());
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = LastReload {
            at: crate::tls::unix_now(),
            result: if result.is_ok() { "success" } else { "failure" },
            error: result.as_ref().err().map(ToString::to_string),
        };
        result
    }

    fn try_reload(&self) -> Result<Applied, ReloadError> {
        let mut new = Config::load(&self.path)?;
        let hash = file_hash(&self.path).unwrap_or_default();
        let mut running = self.lock();
        let old = &running.0;
        let mut needs_restart = Vec::new();
        // Certificates change in place wherever a listener keeps its address and protocols, even
        // while another change to `listen` waits for a restart; the sockets are the running ones.
        let http2 = |l: &crate::config::Listener| l.tls.as_ref().map(|t| t.http2);
        let mut listen = old.listen.clone();
        let mut renewed = Vec::new();
        for (i, o) in old.listen.iter().enumerate() {
            let same = new
                .listen
                .iter()
                .find(|n| n.addr == o.addr && n.h2c == o.h2c && http2(n) == http2(o));
            if let Some(n) = same.filter(|n| n.tls != o.tls) {
                listen[i].tls.clone_from(&n.tls);
                renewed.push(i);
            }
        }
        if listen != new.listen {
            needs_restart.push("listen");
        }
        if new.admin != old.admin
            || new.admin_token_env != old.admin_token_env
            || new.admin_allowed_hosts != old.admin_allowed_hosts
        {
            needs_restart.push("admin");
        }
        if new.redis != old.redis {
            needs_restart.push("redis");
        }
        if new.shutdown_grace != old.shutdown_grace {
            needs_restart.push("shutdown_grace_seconds");
        }
        if new.memory != old.memory {
            needs_restart.push("memory");
        }
        if new.downstream != old.downstream {
            needs_restart.push("downstream");
        }
        new.listen = listen;
        new.admin = old.admin;
        new.admin_token_env.clone_from(&old.admin_token_env);
        new.admin_allowed_hosts.clone_from(&old.admin_allowed_hosts);
        new.redis.clone_from(&old.redis);
        new.shutdown_grace = old.shutdown_grace;
        new.memory = old.memory;
        new.downstream = old.downstream;

        let plan = Plan::compile(&new, &self.metrics)?;
        self.plan.store(Arc::new(plan));
        for l in renewed.into_iter().map(|i| &new.listen[i]) {
            let tls = l.tls.as_ref().expect("renewed listeners are TLS");
            self.resolvers.install(l.addr, tls);
            let now = crate::tls::unix_now();
            let served: Vec<String> = tls.certs.iter().map(|c| c.served.describe(now)).collect();
            log::info!(
                "listen {}: TLS certificate reloaded, {}",
                l.addr,
                served.join("; ")
            );
        }
        self.metrics.config_running(&hash);
        let applied = Applied {
            hash: hash.clone(),
            routes: new.routes.len(),
            needs_restart,
            warnings: new.warnings.clone(),
        };
        *running = (new, hash);
        Ok(applied)
    }

    /// Reloads and says what happened in the log, one line (or one block of problems).
    pub fn reload_and_log(&self, why: &str) {
        match self.reload() {
            Ok(a) => {
                log::info!(
                    "{why}: config reloaded ({} routes, hash {})",
                    a.routes,
                    a.hash
                );
                for warning in &a.warnings {
                    log::warn!("{why}: {warning}");
                }
                if !a.needs_restart.is_empty() {
                    log::warn!(
                        "{why}: changed settings that need a restart to apply, still running the old values: {}",
                        a.needs_restart.join(", ")
                    );
                }
            }
            Err(e) => {
                log::error!("{why}: config reload refused, the previous config keeps running:\n{e}")
            }
        }
    }
}

/// The first 12 hex digits of the file's SHA-1: enough to tell configs apart on a dashboard.
pub fn file_hash(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    let mut hex = sha1_smol::Sha1::from(bytes).digest().to_string();
    hex.truncate(12);
    Some(hex)
}

/// Reloads on SIGHUP at once, and on a change of the file once its content has been the same for
/// two polls in a row, so an editor's half-written save is never read.
pub struct Watcher {
    reloader: Arc<Reloader>,
    poll: Duration,
}

impl Watcher {
    pub fn new(reloader: Arc<Reloader>, poll: Duration) -> Watcher {
        Watcher { reloader, poll }
    }
}

#[async_trait]
impl BackgroundService for Watcher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangup = match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                log::warn!("cannot watch SIGHUP, reloads follow the file only: {e}");
                None
            }
        };
        let watched = || self.reloader.watched_hash();
        let mut previous_poll = watched();
        // A refused file is tried once, not at every poll.
        let mut last_tried = previous_poll.clone();
        let mut ticker = tokio::time::interval(self.poll);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                Some(()) = async { hangup.as_mut()?.recv().await } => {
                    self.reloader.reload_and_log("SIGHUP");
                    last_tried = watched();
                }
                _ = ticker.tick() => {
                    let now = watched();
                    if now.is_some() && now == previous_poll && now != last_tried {
                        self.reloader.reload_and_log("config or certificate file changed");
                        last_tried = now.clone();
                    }
                    previous_poll = now;
                }
            }
        }
    }
}
