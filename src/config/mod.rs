//! The operator's YAML, turned into validated types.
//!
//! Parsing is strict (unknown keys are errors) and exhaustive: every problem in the file is reported
//! at once, each naming file, line, route and field, so an operator fixes a config in one pass. The
//! serde layer (`raw`) stays private; the rest of the crate only sees types that are already valid.

mod depth;
mod error;
mod locate;
mod rate;
mod raw;
mod usage;
mod validate;

pub use error::{ConfigError, Problem};
pub use rate::{Rate, EXACT_LIMIT};
pub use usage::{Charge, Reserve, Term, UsageSource};

pub use crate::calendar::Period;
pub use crate::canonical::EscapedSlashes;
pub use crate::client::{Cidr, ClientIdentity};
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// Where the proxy listens by default for `/metrics`, `/healthz` and `/readyz`.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9090";

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen: Vec<Listener>,
    pub admin: SocketAddr,
    /// The environment variable holding the admin API's token: mutating calls need it, and are
    /// refused while none is set.
    pub admin_token_env: Option<String>,
    /// Names the admin also answers under besides its own address and localhost
    /// (`admin.allowed_hosts`), canonical: lowercase, `name` (any port) or `name:port`. A Host
    /// check, against DNS rebinding: a page of another origin cannot read the admin API.
    pub admin_allowed_hosts: Vec<String>,
    /// `None`: limits are kept in process memory (per proxy, not shared).
    pub redis: Option<RedisSettings>,
    /// How long SIGTERM lets in-flight requests finish.
    pub shutdown_grace: Duration,
    /// The in-memory store's bounds (used when `redis` is `None`).
    pub memory: MemorySettings,
    /// What one client address may make the store hold through keys it chooses (`key_budget`);
    /// `None`: unbounded (`off`, the default).
    pub new_keys_per_client: Option<NewKeyBudget>,
    /// How `client_ip` is found behind load balancers.
    pub client: ClientIdentity,
    /// What an escaped `/` or `\` in a request path gets.
    pub path_escaped_slashes: EscapedSlashes,
    /// Limits on what one client connection may hold.
    pub downstream: Downstream,
    pub routes: Vec<Route>,
    /// What is valid but likely a mistake: `--check`, the start and every reload say it.
    pub warnings: Vec<Problem>,
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
    pub state_format: StateFormat,
}

/// How long a client may take and how much it may hold; nginx's and Envoy's defaults in mind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Downstream {
    /// The whole request head must arrive within this (counted from the first byte, or from the
    /// connection's start for its first request): slowloris.
    pub header_timeout: Duration,
    /// A kept-alive connection with no request in flight is closed after this.
    pub idle_timeout: Duration,
    /// The longest wait between two reads of a request body; on HTTP/2, the longest a stream
    /// whose request is still open may go without a frame.
    pub body_timeout: Duration,
    /// The whole request body must arrive within this of the end of its head: a per-read
    /// deadline alone lets one byte every `body_timeout` hold a request for ever.
    pub request_body_timeout: Duration,
    /// Per process; beyond it new connections are closed at accept (TLS ones before their
    /// handshake).
    pub max_connections: usize,
    /// Per process: requests being served at once, HTTP/2 streams included. Each may hold an
    /// upstream connection, so this and `max_connections` together are what the file
    /// descriptors must cover; beyond it a request is answered 503.
    pub max_requests_in_flight: usize,
    pub max_requests_per_connection: u32,
    /// Requests in flight at once on one HTTP/2 connection (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub max_concurrent_streams: u32,
}

impl Default for Downstream {
    fn default() -> Downstream {
        Downstream {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(60),
            request_body_timeout: Duration::from_secs(300),
            max_connections: 10_000,
            // As many as connections: one upstream connection for each client connection is
            // what `downstream::fds_needed` has always counted.
            max_requests_in_flight: 10_000,
            max_requests_per_connection: 10_000,
            max_concurrent_streams: 100,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySettings {
    /// Buckets tracked at most; see `limiter::memory` for what happens at the cap.
    pub max_keys: usize,
}

/// `new_keys_per_client: "<count>/<unit>"`: at most `count` keys a client has not used within
/// the last `window_us` per `window_us` (see `key_budget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewKeyBudget {
    pub count: u64,
    pub window_us: u64,
}

impl NewKeyBudget {
    /// Parses `"<count>/<s|m|h|d>"`, a whole count of 1 to 1000000.
    pub fn parse(text: &str) -> Result<NewKeyBudget, String> {
        let bad = || {
            format!(
                "must be \"off\" or \"<count>/<s|m|h|d>\" with a whole count of 1 to 1000000, got {text:?}"
            )
        };
        let (count, unit) = text.split_once('/').ok_or_else(bad)?;
        let count: u64 = count.trim().parse().map_err(|_| bad())?;
        let window_us = match unit.trim() {
            "s" => 1_000_000,
            "m" => 60_000_000,
            "h" => 3_600_000_000,
            "d" => 86_400_000_000,
            _ => return Err(bad()),
        };
        if !(1..=1_000_000).contains(&count) {
            return Err(bad());
        }
        Ok(NewKeyBudget { count, window_us })
    }
}

/// Default for `memory.max_keys`: about 100 MB of buckets.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// One address the proxy serves on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub addr: SocketAddr,
    /// `None`: cleartext HTTP/1.1.
    pub tls: Option<TlsListener>,
    /// Cleartext HTTP/2 with prior knowledge beside HTTP/1.1 (gRPC inside a trusted network);
    /// never on TLS, where ALPN chooses.
    pub h2c: bool,
}

/// A TLS listener: its certificates, each read and found to belong with its key when the config
/// was loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsListener {
    /// Offer HTTP/2 by ALPN (h2, then http/1.1); `false`: HTTP/1.1 only.
    pub http2: bool,
    /// Chosen by the name a client asks for (SNI); the first serves a client that names none, or
    /// one that no certificate carries.
    pub certs: Vec<TlsCert>,
}

/// One certificate (chain) and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsCert {
    pub cert_file: std::path::PathBuf,
    pub key_file: std::path::PathBuf,
    /// What the certificate serves, as it was when the config was loaded.
    pub served: crate::tls::Served,
    /// The chain and key read then.
    pub pair: crate::tls::Pair,
}

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

words! {
    /// Whose clock a bucket refills by.
    pub enum ClockSource {
        /// Redis `TIME`: one clock for the whole fleet, so skew between proxies cannot over-admit.
        Redis = "redis",
        /// The proxy's own clock: skew between proxies can over-admit by at most refill × skew.
        Proxy = "proxy",
    }
}

words! {
    /// How buckets are stored in Redis (`lua/token_bucket.lua`, "State"). Every proxy of this
    /// version reads all three; what differs is what it writes.
    pub enum StateFormat {
        /// A hash of `v`, `t`, `s`: what every version reads, so a fleet that still runs proxies
        /// of an earlier version keeps one bucket per client.
        Hash = "hash",
        /// One 24-byte string, read by one `MGET` per call and written by `SET … PX`: less Redis
        /// CPU and memory per decision, but proxies of versions before it would read such a key
        /// as foreign and reset it, so it is for fleets where every proxy reads it.
        Packed = "packed",
        /// Packed, plus the instant the key's expiry covers (32 bytes), so that most writes keep
        /// the expiry instead of setting it again: less Redis CPU still. Proxies of versions
        /// before it, `packed` ones included, would reset such a key, so it too is for fleets
        /// where every proxy reads it.
        PackedTtl = "packed_ttl",
    }
}

words! {
    /// What a route does when the store cannot answer within its budget.
    pub enum FailMode {
        /// Let the request through and count it as `fail_open`.
        Open = "open",
        /// Answer 503 and count it as `fail_closed`.
        Closed = "closed",
        /// Decide with an in-process bucket (limits divided by `redis.fleet_size`), counted as
        /// `local_fallback` or `local_rejected`.
        Local = "local",
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub name: String,
    pub path_prefix: String,
    /// Lower-case, without a port.
    pub host: Option<String>,
    /// Upper-case method names; `None` matches every method.
    pub methods: Option<Vec<String>>,
    /// One or more, taken in turn; a failing one is skipped for a while.
    pub upstreams: Vec<Upstream>,
    pub upstream_tls: UpstreamTls,
    pub upstream_timeouts: UpstreamTimeouts,
    pub health_check: Option<HealthCheck>,
    pub on_redis_error: FailMode,
    /// Every limit of the route is evaluated and counted, never enforced.
    pub shadow: bool,
    /// The upstream gets the request target exactly as the client sent it, not its canonical
    /// form (routing and keys use the canonical form either way).
    pub preserve_raw_path: bool,
    pub allow: Allow,
    pub deny: DenyResponse,
    /// `stream_usage: request`: an OpenAI-style streaming request is asked to report its usage
    /// (`stream_options.include_usage`), so that its stream can be charged.
    pub stream_usage: bool,
    pub limits: Vec<Limit>,
}

/// `[scheme://]host:port`, resolved when the server starts (not by `--check`, which may run where
/// the upstream's name means nothing, e.g. outside a compose network).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub scheme: UpstreamScheme,
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for Upstream {
    /// As it would be written: no scheme for HTTP/1.1, an IPv6 address in brackets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.scheme != UpstreamScheme::Http {
            write!(f, "{}://", self.scheme)?;
        }
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

words! {
    /// How the proxy speaks to an upstream, chosen by the scheme written before it.
    pub enum UpstreamScheme {
        /// Cleartext HTTP/1.1 (no scheme, or `http://`).
        Http = "http",
        /// TLS, with HTTP/2 or HTTP/1.1 as ALPN settles.
        Https = "https",
        /// Cleartext HTTP/2 with prior knowledge: gRPC backends.
        H2c = "h2c",
    }
}

/// How a route's `https://` upstreams are verified: the name their certificate must carry (and
/// the SNI sent), and the CAs trusted for it instead of the system's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UpstreamTls {
    pub sni: Option<String>,
    pub ca: Option<CaBundle>,
}

/// A CA file, read and parsed when the config was loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaBundle {
    pub file: std::path::PathBuf,
    pub certs: Vec<rustls::pki_types::CertificateDer<'static>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamTimeouts {
    pub connect: Duration,
    pub read: Duration,
}

/// An active check: `GET path` on every upstream of the route each `interval`; anything but a
/// 2xx or 3xx marks it down until it answers again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    pub path: String,
    pub interval: Duration,
}

/// Requests that skip the limits altogether, counted as `bypassed`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allow {
    pub cidrs: Vec<Cidr>,
    /// Lower-case header name and the exact value it must carry.
    pub headers: Vec<(String, String)>,
}

impl Allow {
    pub fn is_empty(&self) -> bool {
        self.cidrs.is_empty() && self.headers.is_empty()
    }
}

/// What a rejected client gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenyResponse {
    /// A request a limit refused (waiting will help).
    pub status: u16,
    /// A request refused because a limit with `on_missing_key: deny` found no key (a 4xx: it is
    /// the client's credentials that are wanting, not its pace).
    pub missing_key_status: u16,
    pub format: DenyFormat,
}

/// `deny.missing_key_status` when the config leaves it out.
pub const DEFAULT_MISSING_KEY_STATUS: u16 = 401;

words! {
    /// The words of `deny.format`.
    pub enum DenyFormatName {
        Text = "text",
        ProblemJson = "problem_json",
        OpenAi = "openai",
        Anthropic = "anthropic",
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenyFormat {
    /// A short plain-text reason naming the limit.
    Text,
    /// Exactly this body, with this content type.
    Custom { body: String, content_type: String },
    /// `application/problem+json` with the IETF `quota-exceeded` problem type and
    /// `violated-policies`.
    ProblemJson,
    /// The error object of OpenAI's API, which its SDKs read (`rate_limit_exceeded`,
    /// `insufficient_quota`, `missing_api_key`), with `retry-after-ms`.
    OpenAi,
    /// The error object of Anthropic's API (`rate_limit_error`, `authentication_error`), with
    /// `retry-after-ms`.
    Anthropic,
}

impl DenyFormat {
    /// The word `--check` shows.
    pub fn describe(&self) -> &'static str {
        match self {
            DenyFormat::Text => DenyFormatName::Text.as_str(),
            DenyFormat::Custom { .. } => "custom body",
            DenyFormat::ProblemJson => DenyFormatName::ProblemJson.as_str(),
            DenyFormat::OpenAi => DenyFormatName::OpenAi.as_str(),
            DenyFormat::Anthropic => DenyFormatName::Anthropic.as_str(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    pub name: String,
    pub allowance: Allowance,
    /// The parts of the client's identity, in order; `[Route]` alone is one bucket for all.
    pub key: Vec<KeySource>,
    pub on_missing_key: MissingKey,
    pub on_duplicate_key_header: DuplicateKeyHeader,
    /// Evaluated and counted, never enforced.
    pub shadow: bool,
    /// Reserved up front: a request needs at least this much to be admitted.
    pub cost: u64,
    /// Where the response reports what the request used, charged beyond `cost` after it.
    pub charge: Option<Charge>,
    /// What a request reserves from its own body beside `cost`, settled by the usage charged.
    pub reserve: Option<Reserve>,
}

/// How much a limit lets through, and how it comes back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Allowance {
    /// A token bucket: `capacity` tokens (the burst), refilled continuously at `refill`.
    Bucket { capacity: u64, refill: Rate },
    /// `amount` per calendar period, whole again at each of its UTC boundaries.
    Quota { amount: u64, period: Period },
    /// At most `max` requests of one key in flight at once, fleet-wide. A lease a proxy never
    /// released (it died) expires after `lease_ms`; `None`: the route's read timeout + 5 s.
    Concurrency { max: u64, lease_ms: Option<u64> },
}

impl Allowance {
    /// The most one key can spend at once: the `q` of `RateLimit-Policy`.
    pub fn capacity(&self) -> u64 {
        match *self {
            Allowance::Bucket { capacity, .. } => capacity,
            Allowance::Quota { amount, .. } => amount,
            Allowance::Concurrency { max, .. } => max,
        }
    }

    /// The word `--check` and the admin API use for the kind of limit.
    pub fn kind(&self) -> &'static str {
        match self {
            Allowance::Bucket { .. } => "bucket",
            Allowance::Quota { .. } => "quota",
            Allowance::Concurrency { .. } => "concurrency",
        }
    }

    /// The window of `RateLimit-Policy` at `now_us`, in seconds: the time to refill an empty
    /// bucket, or the length of the quota's period (a month's varies). A concurrency limit has
    /// none.
    pub fn window_secs(&self, now_us: u64) -> Option<u64> {
        match *self {
            Allowance::Bucket { capacity, refill } => {
                Some(refill.fill_us(capacity).div_ceil(1_000_000))
            }
            Allowance::Quota { period, .. } => Some(period.length_secs(now_us)),
            Allowance::Concurrency { .. } => None,
        }
    }
}

impl fmt::Display for Allowance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Allowance::Bucket { capacity, refill } => {
                write!(f, "{capacity} tokens, refill {refill}")
            }
            Allowance::Quota { amount, period } => {
                write!(f, "quota {amount} per {} (UTC)", period.as_str())
            }
            Allowance::Concurrency { max, lease_ms } => {
                write!(f, "concurrency {max} in flight")?;
                match lease_ms {
                    Some(ms) => write!(f, " (leases expire after {ms} ms)"),
                    None => write!(f, " (leases expire after the read timeout + 5 s)"),
                }
            }
        }
    }
}

words! {
    /// What a limit keyed on a header does with a request that carries that header more than once.
    #[derive(Default)]
    pub enum DuplicateKeyHeader {
        /// Refused with 400: otherwise a client rotates buckets in the first value while the upstream
        /// reads another.
        #[default]
        Reject = "reject",
        /// The first value is the key.
        First = "first",
    }
}

/// What identifies a client for one limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The client address (see `ClientIdentity`).
    ClientIp,
    /// A request header, by lower-case name.
    Header(String),
    /// A query-string parameter, by name.
    Query(String),
    /// The request path (without the query).
    Path,
    /// The request method.
    Method,
    /// The token of the request's one `Authorization: Bearer <token>` header: a secret, so its
    /// value is always stored hashed.
    Bearer,
    /// Alternatives, written joined by `|`: the first one the request carries is the value (a
    /// secret, hashed, when any of them is `Bearer`: the same secret sent either way is one key).
    FirstOf(Vec<KeySource>),
    /// One bucket shared by every client of the route.
    Route,
}

impl KeySource {
    /// Whether the client chooses the value freely, so that it can invent new keys at will
    /// (bounded by `new_keys_per_client`).
    pub fn client_chosen(&self) -> bool {
        match self {
            KeySource::Header(_)
            | KeySource::Query(_)
            | KeySource::Path
            | KeySource::Method
            | KeySource::Bearer => true,
            KeySource::FirstOf(alternatives) => alternatives.iter().any(KeySource::client_chosen),
            KeySource::ClientIp | KeySource::Route => false,
        }
    }
}

impl KeySource {
    /// How each source is written in a limit's `key`.
    pub const FORMS: [&str; 7] = [
        "client_ip",
        "route",
        "path",
        "method",
        "bearer",
        "header:<Name>",
        "query:<name>",
    ];

    /// Whether its value is a credential: never stored, shown or logged as sent.
    pub fn is_secret(&self) -> bool {
        match self {
            KeySource::Bearer => true,
            KeySource::FirstOf(alternatives) => alternatives.iter().any(KeySource::is_secret),
            _ => false,
        }
    }

    /// Whether it reads the client address (alone or as an alternative).
    pub fn reads_client_ip(&self) -> bool {
        match self {
            KeySource::ClientIp => true,
            KeySource::FirstOf(alternatives) => alternatives.contains(&KeySource::ClientIp),
            _ => false,
        }
    }

    /// The request headers it reads by name (`header:` parts, alone or as alternatives).
    pub fn headers(&self) -> impl Iterator<Item = &str> {
        let alternatives = match self {
            KeySource::FirstOf(alternatives) => alternatives.as_slice(),
            one => std::slice::from_ref(one),
        };
        alternatives.iter().filter_map(|s| match s {
            KeySource::Header(name) => Some(name.as_str()),
            _ => None,
        })
    }

    /// One part, no alternatives.
    fn one(part: &str) -> Option<KeySource> {
        match part {
            "client_ip" => Some(KeySource::ClientIp),
            "route" => Some(KeySource::Route),
            "path" => Some(KeySource::Path),
            "method" => Some(KeySource::Method),
            "bearer" => Some(KeySource::Bearer),
            other => match other.split_once(':') {
                Some(("header", h)) if http::HeaderName::from_bytes(h.as_bytes()).is_ok() => {
                    Some(KeySource::Header(h.to_ascii_lowercase()))
                }
                Some(("query", q)) if !q.is_empty() => Some(KeySource::Query(q.to_string())),
                _ => None,
            },
        }
    }
}

impl std::str::FromStr for KeySource {
    type Err = String;

    /// One part, or alternatives joined by `|` (`"header:x-api-key|bearer"`).
    fn from_str(text: &str) -> Result<KeySource, String> {
        let forms = |but: &str| {
            let forms: Vec<&str> = KeySource::FORMS.into_iter().filter(|f| *f != but).collect();
            let (last, rest) = forms.split_last().expect("forms");
            format!("{} or {last}", rest.join(", "))
        };
        if !text.contains('|') {
            return KeySource::one(text)
                .ok_or_else(|| format!("must be {}, got {text:?}", forms("")));
        }
        let mut alternatives: Vec<KeySource> = Vec::new();
        for part in text.split('|') {
            let source = match part {
                "" => {
                    return Err(format!(
                        "{text:?} has an empty alternative: write key parts joined by |, the first \
                         one present wins, e.g. \"header:x-api-key|bearer\""
                    ))
                }
                "route" => {
                    return Err(format!(
                        "{text:?}: `route` cannot be an alternative: it is one bucket for every \
                         client and never missing, so nothing after it would be tried"
                    ))
                }
                part => KeySource::one(part).ok_or_else(|| {
                    format!(
                        "{text:?}: each alternative must be {}, got {part:?}",
                        forms("route")
                    )
                })?,
            };
            if alternatives.contains(&source) {
                return Err(format!("{text:?} names {part} twice"));
            }
            alternatives.push(source);
        }
        Ok(KeySource::FirstOf(alternatives))
    }
}

impl std::fmt::Display for KeySource {
    /// As the config writes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySource::ClientIp => f.write_str("client_ip"),
            KeySource::Header(h) => write!(f, "header:{h}"),
            KeySource::Query(q) => write!(f, "query:{q}"),
            KeySource::Path => f.write_str("path"),
            KeySource::Method => f.write_str("method"),
            KeySource::Bearer => f.write_str("bearer"),
            KeySource::FirstOf(alternatives) => {
                for (i, a) in alternatives.iter().enumerate() {
                    if i > 0 {
                        f.write_str("|")?;
                    }
                    write!(f, "{a}")?;
                }
                Ok(())
            }
            KeySource::Route => f.write_str("route"),
        }
    }
}

words! {
    /// What a limit does with a request whose key part is absent or empty.
    pub enum MissingKey {
        /// Count it in the limit's one shared "missing" bucket.
        Shared = "shared",
        /// The limit does not apply to it.
        Skip = "skip",
        /// Refuse it with the route's deny response.
        Deny = "deny",
    }
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
