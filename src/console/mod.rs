//! The admin API's answers, as JSON: what an operator asks the running proxy when a customer
//! writes "why am I getting 429s?". Read-only here; the admin listener serves them.

mod target;

pub use target::{bucket, targets, Target};

use crate::config::{Allowance, Config, KeySource, Route};
use crate::reload::LastReload;
use serde_json::{json, Value};
use target::query_pairs;

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
        "missing_key_status": r.deny.missing_key_status,
        "deny_format": r.deny.format.describe(),
        "limits": r.limits.iter().map(|l| json!({
            "name": l.name,
            "kind": l.allowance.kind(),
            "capacity": l.allowance.capacity(),
            "refill": match l.allowance {
                Allowance::Bucket { refill, .. } => Some(refill.to_string()),
                _ => None,
            },
            "period": match l.allowance {
                Allowance::Quota { period, .. } => Some(period.as_str()),
                _ => None,
            },
            "cost": l.cost,
            "charge_from_response": l.charge.as_ref().map(|c| c.to_string()),
            "reserve": l.reserve.as_ref().map(|r| r.to_string()),
            "refund_unused": l.charge.as_ref().map(|c| c.refund_unused),
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

/// `GET /v1/status`: what the status page shows, polled: every route's decisions so far by outcome
/// (the page works out rates from two readings), the store (Redis: the breaker, and the decisions'
/// p50 and p99 latency so far), the running config, and each TLS listener's expiry.
pub fn status(
    plan: &crate::plan::Plan,
    config: (&Config, &str, &LastReload),
    metrics: &crate::metrics::Metrics,
    tls: &[(std::net::SocketAddr, i64)],
) -> Value {
    let (config, hash, last) = config;
    let redis = config.redis.as_ref().map(|_| {
        let q = metrics.redis_quantiles(&[0.5, 0.99]);
        let ms = |i: usize| q.as_ref().map(|q| q[i] * 1000.0).filter(|v| v.is_finite());
        json!({ "up": metrics.redis_up(), "p50_ms": ms(0), "p99_ms": ms(1) })
    });
    json!({
        "config_hash": hash,
        "last_reload": { "at": last.at, "result": last.result, "error": last.error },
        "store": if config.redis.is_some() { "redis" } else { "memory" },
        "redis": redis,
        "tls": tls.iter().map(|(addr, left)| json!({
            "listener": addr.to_string(),
            "expires_in_s": left,
        })).collect::<Vec<_>>(),
        "routes": plan.routes.iter().map(|r| {
            let totals: serde_json::Map<String, Value> = r
                .counters
                .totals()
                .map(|(o, n)| (o.as_str().to_string(), json!(n)))
                .collect();
            json!({ "route": r.name, "limited": !r.limits.is_empty(), "decisions": totals })
        }).collect::<Vec<_>>(),
    })
}

/// A store key as the admin API shows it: header and query values (API keys, tokens) masked to
/// their first three and last two characters, so that no client's secret is readable on an
/// unauthenticated endpoint or in the log (a bearer token, and any value of an alternative list
/// holding `bearer`, is hashed in the key already); addresses, paths, methods and hashed values
/// as they are. The layout is `key`'s (`<prefix>:{<route>[:<parts>]}:<limit>[:<parts>]`, parts joined by
/// `|`); a key of another layout is shown masked whole.
pub fn shown_key(route: &crate::plan::RoutePlan, key: &str) -> String {
    let masked = || mask(key);
    let Some((head, rest)) = key.split_once('}') else {
        return masked();
    };
    let rest = rest.strip_prefix(':').unwrap_or(rest);
    let (tag_parts, limit, tail_parts) = match head.split_once('{') {
        Some((_, tag)) => match tag.split_once(':') {
            Some((_, parts)) => (Some(parts), rest, None),
            None => match rest.split_once(':') {
                Some((limit, parts)) => (None, limit, Some(parts)),
                None => (None, rest, None),
            },
        },
        None => return masked(),
    };
    let Some(i) = (0..route.limits.len()).find(|&i| route.headers.limit_name(i) == limit) else {
        return masked();
    };
    let sources = &route.limits[i].key;
    let shown = |parts: &str| -> String {
        parts
            .split('|')
            .zip(sources.iter().filter(|s| **s != KeySource::Route))
            .map(|(part, source)| match source {
                KeySource::Header(_)
                | KeySource::Query(_)
                | KeySource::Bearer
                | KeySource::FirstOf(_) => mask(part),
                _ => part.to_string(),
            })
            .collect::<Vec<_>>()
            .join("|")
    };
    let route_head = &key[..key.find('{').map_or(0, |b| b + 1)];
    match (tag_parts, tail_parts) {
        (Some(parts), _) => {
            let name = &head[route_head.len()..head.len() - parts.len() - 1];
            format!("{route_head}{name}:{}}}:{limit}", shown(parts))
        }
        (None, Some(parts)) => format!("{head}}}:{limit}:{}", shown(parts)),
        (None, None) => key.to_string(),
    }
}

/// `abc…yz` for a value long enough to keep a secret of it; `…` for a short one; a hashed value
/// (`#sha1`) or the missing bucket (`~`) as it is.
fn mask(value: &str) -> String {
    if value.starts_with('#') || value == "~" {
        return value.to_string();
    }
    let chars: Vec<char> = value.chars().collect();
    if chars.len() < 8 {
        return "…".to_string();
    }
    let head: String = chars[..3].iter().collect();
    let tail: String = chars[chars.len() - 2..].iter().collect();
    format!("{head}…{tail}")
}

/// `GET /v1/top`: each route's (or `route=`'s) most refused keys over `window=` (`1m`, `5m`, the
/// default, or `15m`) up to `now_us`. An error is the 400's text.
pub fn top(plan: &crate::plan::Plan, query: &str, now_us: u64) -> Result<Value, String> {
    let params = query_pairs(query);
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _, _)| k == name)
            .map(|(_, v, _)| String::from_utf8_lossy(v).into_owned())
    };
    let window = get("window").unwrap_or_else(|| "5m".into());
    let minutes = match window.as_str() {
        "1m" => 1,
        "5m" => 5,
        "15m" => 15,
        other => return Err(format!("window must be 1m, 5m or 15m, got {other:?}")),
    };
    let only = get("route");
    if let Some(name) = &only {
        if !plan.routes.iter().any(|r| &r.name == name) {
            return Err(format!("no route is named {name:?}"));
        }
    }
    let routes: Vec<Value> = plan
        .routes
        .iter()
        .filter(|r| only.as_ref().is_none_or(|name| &r.name == name))
        .filter(|r| !r.limits.is_empty())
        .map(|r| {
            let (ranked, refusals) = r.counters.top.top(minutes, now_us);
            json!({
                "route": r.name,
                "refusals": refusals,
                "keys": ranked.iter().map(|k| json!({
                    "key": shown_key(r, &k.key),
                    "refused": k.counts.refused,
                    "allowed": k.counts.allowed,
                    "error": k.counts.error,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(json!({ "window": window, "routes": routes }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Plan;

    fn plan() -> Plan {
        let yaml = "listen: \"127.0.0.1:1\"\nroutes:\n  - name: api\n    upstream: \"127.0.0.1:1\"\n    limits:\n      \
                    - { name: pair, capacity: 5, refill: \"1/s\", key: [client_ip, \"header:X-Api-Key\"] }\n      \
                    - { name: all, capacity: 9, refill: \"1/s\", key: route }\n  \
                    - name: one\n    upstream: \"127.0.0.1:1\"\n    limits: [{ name: k, capacity: 2, refill: \"1/h\", key: \"header:X-Api-Key\" }]\n";
        let config = Config::parse("t.yaml", yaml).unwrap();
        let metrics = crate::metrics::Metrics::new(&prometheus::Registry::new(), false).unwrap();
        Plan::compile(&config, &metrics).unwrap()
    }

    #[test]
    fn secrets_in_keys_are_masked_and_addresses_are_not() {
        let p = plan();
        let (api, one) = (&p.routes[0], &p.routes[1]);
        assert_eq!(
            shown_key(api, "rl:{api}:pair:10.0.0.7|sk_live_4f9a8b7c"),
            "rl:{api}:pair:10.0.0.7|sk_…7c"
        );
        assert_eq!(shown_key(api, "rl:{api}:all"), "rl:{api}:all");
        assert_eq!(
            shown_key(one, "rl:{one:sk_live_4f9a8b7c}:k"),
            "rl:{one:sk_…7c}:k"
        );
        assert_eq!(shown_key(one, "rl:{one:short}:k"), "rl:{one:…}:k");
        assert_eq!(shown_key(one, "rl:{one:~}:k"), "rl:{one:~}:k");
        assert_eq!(shown_key(one, "rl:{one:#0a1b}:k"), "rl:{one:#0a1b}:k");
        assert_eq!(shown_key(one, "not a key"), "not…ey");
    }
}
