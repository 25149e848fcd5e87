//! The YAML as written: serde mirrors of the file, private to `config`. Nothing here is trusted;
//! `validate` turns it into the public types or a list of problems.

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub listen: Option<OneOrMany>,
    pub admin: Option<String>,
    pub redis: Option<RawRedis>,
    pub on_redis_error: Option<String>,
    pub shutdown_grace_seconds: Option<u64>,
    pub memory: Option<RawMemory>,
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
pub(super) struct RawMemory {
    pub max_keys: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub name: Option<String>,
    #[serde(rename = "match", default)]
    pub matcher: RawMatch,
    pub upstream: Option<String>,
    pub on_redis_error: Option<String>,
    #[serde(default)]
    pub limits: Vec<RawLimit>,
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
pub(super) struct RawLimit {
    pub name: Option<String>,
    pub capacity: Option<u64>,
    pub refill: Option<String>,
    pub key: Option<String>,
    pub cost: Option<u64>,
}
