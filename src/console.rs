//! The admin API's answers, as JSON: what an operator asks the running proxy when a customer
//! writes "why am I getting 429s?". Read-only here; the admin listener serves them.

use crate::config::{Config, KeySource, Route};
use crate::reload::LastReload;
use serde_json::{json, Value};

/// `GET /v1/routes`: the compiled route table (what `--check` prints), in the order routes are
/// tried, with the running file's hash and the last reload.
pub fn routes(config: &Config, hash: &str, last: &LastReload) -> Value {
    json!({
        "config_hash": hash,
        "last_reload": {
            "at": last.at,
            "result": last.result,
            "error": last.error,
        },
        "store": if config.redis.is_some() { "redis" } else { "memory" },
        "routes": config.routes.iter().map(route).collect::<Vec<_>>(),
    })
}

fn route(r: &Route) -> Value {
    json!({
        "name": r.name,
        "match": {
            "path_prefix": r.path_prefix,
            "host": r.host,
            "methods": r.methods,
        },
        "upstreams": r.upstreams.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "on_redis_error": r.on_redis_error.as_str(),
        "shadow": r.shadow,
        "deny_status": r.deny.status,
        "limits": r.limits.iter().map(|l| json!({
            "name": l.name,
            "capacity": l.capacity,
            "refill": l.refill.to_string(),
            "cost": l.cost,
            "key": l.key.iter().map(key_part).collect::<Vec<_>>(),
            "on_missing_key": l.on_missing_key.as_str(),
            "shadow": l.shadow || r.shadow,
        })).collect::<Vec<_>>(),
    })
}

/// A key part as the config spells it.
fn key_part(k: &KeySource) -> String {
    k.to_string()
}
