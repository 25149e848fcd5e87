//! The YAML as written: serde mirrors of the file, private to `config`. Nothing here is trusted;
//! `validate` turns it into the public types or a list of problems.

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    /// An address, a `{ address, tls }` entry, or a list of either: read entry by entry.
    pub listen: Option<serde_yaml::Value>,
    /// An address, or `{ address, token_env }`.
    pub admin: Option<serde_yaml::Value>,
    pub redis: Option<RawRedis>,
    pub on_redis_error: Option<String>,
    pub shutdown_grace_seconds: Option<u64>,
    pub memory: Option<RawMemory>,
    pub new_keys_per_client: Option<String>,
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    pub client_ipv6_prefix: Option<u8>,
    pub path_escaped_slashes: Option<String>,
    pub downstream: Option<RawDownstream>,
    /// Routes stay untyped here so that one bad route cannot hide the problems of the others:
    /// each is deserialized on its own.
    #[serde(default)]
    pub routes: Vec<serde_yaml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// `admin` written as a map.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    pub address: Option<String>,
    pub token_env: Option<String>,
    pub allowed_hosts: Option<Vec<String>>,
}

/// A `listen` entry written as a map.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListener {
    pub address: Option<String>,
    pub tls: Option<RawTls>,
    pub http2: Option<bool>,
    pub h2c: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub certificates: Option<Vec<RawCertificate>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCertificate {
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRedis {
    pub url: Option<String>,
    pub cluster: Option<Vec<String>>,
    pub sentinel: Option<RawSentinel>,
    pub password_env: Option<String>,
    pub tls_ca_file: Option<String>,
    pub fleet_size: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub key_prefix: Option<String>,
    pub clock: Option<String>,
    pub state_format: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSentinel {
    pub master: Option<String>,
    #[serde(default)]
    pub nodes: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDownstream {
    pub header_timeout_ms: Option<u64>,
    pub idle_timeout_ms: Option<u64>,
    pub body_timeout_ms: Option<u64>,
    pub request_body_timeout_ms: Option<u64>,
    pub max_connections: Option<u64>,
    pub max_requests_in_flight: Option<u64>,
    pub max_requests_per_connection: Option<u64>,
    pub max_concurrent_streams: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMemory {
    pub max_keys: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub name: Option<String>,
    #[serde(rename = "match", default)]
    pub matcher: RawMatch,
    pub upstream: Option<OneOrMany>,
    pub upstream_tls: Option<RawUpstreamTls>,
    pub connect_timeout_ms: Option<u64>,
    pub read_timeout_ms: Option<u64>,
    pub health_check: Option<RawHealthCheck>,
    pub on_redis_error: Option<String>,
    pub shadow: Option<bool>,
    pub preserve_raw_path: Option<bool>,
    pub allow: Option<RawAllow>,
    pub deny: Option<RawDeny>,
    pub stream_usage: Option<String>,
    #[serde(default)]
    pub limits: Vec<RawLimit>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstreamTls {
    pub sni: Option<String>,
    pub ca_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMatch {
    pub path_prefix: Option<String>,
    pub host: Option<String>,
    pub methods: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealthCheck {
    pub path: Option<String>,
    pub interval_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAllow {
    #[serde(default)]
    pub cidrs: Vec<String>,
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDeny {
    pub status: Option<u16>,
    pub missing_key_status: Option<u16>,
    pub body: Option<String>,
    pub content_type: Option<String>,
    pub format: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimit {
    pub name: Option<String>,
    pub capacity: Option<u64>,
    pub refill: Option<String>,
    pub quota: Option<RawQuota>,
    pub concurrency: Option<u64>,
    pub lease_ms: Option<u64>,
    /// One source, or `{ sum: [...] }`: read by `validate`, which names what is wrong.
    pub charge_from_response: Option<serde_yaml::Value>,
    pub refund_unused: Option<bool>,
    pub reserve: Option<OneOrMany>,
    pub reserve_default: Option<u64>,
    pub reserve_max: Option<u64>,
    pub key: Option<OneOrMany>,
    pub on_missing_key: Option<String>,
    pub on_duplicate_key_header: Option<String>,
    pub shadow: Option<bool>,
    pub cost: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQuota {
    pub amount: Option<u64>,
    pub period: Option<String>,
}
