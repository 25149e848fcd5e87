//! The operator's YAML, turned into validated types.
//!
//! Parsing is strict (unknown keys are errors) and exhaustive: every problem in the file is reported
//! at once, each naming file, line, route and field, so an operator fixes a config in one pass. The
//! serde layer (`raw`) stays private; the rest of the crate only sees types that are already valid.

mod error;
mod locate;
mod rate;
mod raw;
mod validate;

pub use error::{ConfigError, Problem};
pub use rate::{Rate, EXACT_LIMIT};

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// Where the proxy listens by default for `/metrics`, `/healthz` and `/readyz`.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9090";

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen: Vec<SocketAddr>,
    pub admin: SocketAddr,
    /// `None`: limits are kept in process memory (per proxy, not shared).
    pub redis: Option<RedisSettings>,
    /// How long SIGTERM lets in-flight requests finish.
    pub shutdown_grace: Duration,
    /// The in-memory store's bounds (used when `redis` is `None`).
    pub memory: MemorySettings,
    pub routes: Vec<Route>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RedisSettings {
    pub target: RedisTarget,
    /// The name of an environment variable holding the password, so it stays out of the file.
    pub password_env: Option<String>,
    /// PEM file of the CA that signed the Redis servers' certificates (`rediss://`), when it is
    /// not in the system's trust store. Read at start.
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// How many proxies share the limits: `on_redis_error: local` divides them by it.
    pub fleet_size: u64,
    /// The whole budget of one decision, queueing and reconnecting included.
    pub timeout: Duration,
    pub key_prefix: String,
    pub clock: ClockSource,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySettings {
    /// Buckets tracked at most; see `limiter::memory` for what happens at the cap.
    pub max_keys: usize,
}

/// Default for `memory.max_keys`: about 100 MB of buckets.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// Where the buckets live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (or a primary behind a fixed address).
    Standalone(String),
    /// Redis Cluster, from any of these seed nodes.
    Cluster(Vec<String>),
    /// The primary that these sentinels name `master`, followed across failovers.
    Sentinel { master: String, nodes: Vec<String> },
}

/// Whose clock a bucket refills by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockSource {
    /// Redis `TIME`: one clock for the whole fleet, so skew between proxies cannot over-admit.
    Redis,
    /// The proxy's own clock: skew between proxies can over-admit by at most refill × skew.
    Proxy,
}

/// What a route does when the store cannot answer within its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailMode {
    /// Let the request through and count it as `fail_open`.
    Open,
    /// Answer 503 and count it as `fail_closed`.
    Closed,
    /// Decide with an in-process bucket (limits divided by `redis.fleet_size`), counted as
    /// `local_fallback` or `local_rejected`.
    Local,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub name: String,
    pub path_prefix: String,
    /// Lower-case, without a port.
    pub host: Option<String>,
    /// Upper-case method names; `None` matches every method.
    pub methods: Option<Vec<String>>,
    pub upstream: Upstream,
    pub on_redis_error: FailMode,
    pub limits: Vec<Limit>,
}

/// `host:port`, resolved when the server starts (not by `--check`, which may run where the
/// upstream's name means nothing, e.g. outside a compose network).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub host: String,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    pub name: String,
    pub capacity: u64,
    pub refill: Rate,
    pub key: KeySource,
    pub cost: u64,
}

/// What identifies a client for one limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The peer address of the connection.
    ClientIp,
    /// A request header, by lower-case name. Absent or empty → the limit's shared "missing" bucket.
    Header(String),
    /// One bucket shared by every client of the route.
    Route,
}

impl Config {
    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        Config::parse(&file, &text)
    }

    /// Validates `text`; `file` is only used to label problems.
    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
        validate::validate(file, text)
    }
}
