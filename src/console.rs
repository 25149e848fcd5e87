//! The admin API's answers, as JSON: what an operator asks the running proxy when a customer
//! writes "why am I getting 429s?". Read-only here; the admin listener serves them.

use crate::config::{Config, KeySource, Route};
use crate::key::{Identity, KeyPlan};
use crate::limiter::bucket::{peek, State};
use crate::limiter::{BucketParams, Inspected};
use crate::reload::LastReload;
use serde_json::{json, Value};
use std::net::IpAddr;

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

/// `GET /v1/top`: each route's (or `route=`'s) most refused keys over `window=` (`1m`, `5m`, the
/// default, or `15m`) up to `now_us`. An error is the 400's text.
pub fn top(plan: &crate::plan::Plan, query: &str, now_us: u64) -> Result<Value, String> {
    let params = query_pairs(query);
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
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
                    "key": k.key,
                    "refused": k.counts.refused,
                    "allowed": k.counts.allowed,
                    "error": k.counts.error,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(json!({ "window": window, "routes": routes }))
}

/// One bucket an admin call is about: a limit of the route, and the store key that the key values
/// in the query make, exactly as a client sending them would make it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub limit: String,
    pub store_key: String,
    pub params: BucketParams,
    pub refill: String,
    /// When a key part was not given: the limit's `on_missing_key` (the shared "missing" bucket
    /// is the one shown).
    pub key_missing: Option<&'static str>,
}

/// The route named by `route=` and the buckets of its limits (or of `limit=`'s alone) for the key
/// values given: `key=` for a one-part key, else one parameter per part named as in the config
/// (`client_ip=`, `header:X-Api-Key=`, `query:k=`, `path=`, `method=`). An error is the 400's text.
pub fn targets(config: &Config, query: &str) -> Result<(String, Vec<Target>), String> {
    let params = query_pairs(query);
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    };
    let route_name = get("route")
        .and_then(|v| std::str::from_utf8(v).ok())
        .ok_or("route= is required: the name of a route")?;
    let route = config
        .routes
        .iter()
        .find(|r| r.name == route_name)
        .ok_or_else(|| format!("no route is named {route_name:?}"))?;
    let only = get("limit").and_then(|v| std::str::from_utf8(v).ok());
    if let Some(name) = only {
        if !route.limits.iter().any(|l| l.name == name) {
            return Err(format!("route {route_name:?} has no limit named {name:?}"));
        }
    }
    let prefix = config
        .redis
        .as_ref()
        .map_or("rl", |r| r.key_prefix.as_str());
    let keys = KeyPlan::new(prefix, route);
    let mut targets = Vec::new();
    for (i, l) in route.limits.iter().enumerate() {
        if only.is_some_and(|name| name != l.name) {
            continue;
        }
        let mut texts: Vec<Vec<u8>> = Vec::new();
        let mut missing = false;
        for part in &l.key {
            let name = part.to_string();
            let value = get(&name).or_else(|| (l.key.len() == 1).then(|| get("key")).flatten());
            let text = match (part, value) {
                (KeySource::Route, _) => None,
                (_, None) | (_, Some([])) => {
                    missing = true;
                    None
                }
                (KeySource::ClientIp, Some(v)) => {
                    let ip: IpAddr = std::str::from_utf8(v)
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .ok_or_else(|| format!("{name}: not an IP address"))?;
                    let mut out = Vec::with_capacity(39);
                    crate::text::ip(&mut out, config.client.client(ip, std::iter::empty()));
                    Some(out)
                }
                (_, Some(v)) => Some(v.to_vec()),
            };
            texts.push(text.unwrap_or_default());
        }
        let parts: Vec<Identity<'_>> = l
            .key
            .iter()
            .zip(&texts)
            .map(|(part, text)| match part {
                KeySource::Route => Identity::Route,
                _ if text.is_empty() => Identity::Missing,
                _ => Identity::Value(text),
            })
            .collect();
        targets.push(Target {
            limit: l.name.clone(),
            store_key: keys.key(i, &parts),
            params: BucketParams {
                capacity: l.capacity,
                scale: l.refill.scale(),
                num: l.refill.num(),
                cost: l.cost,
            },
            refill: l.refill.to_string(),
            key_missing: missing.then(|| l.on_missing_key.as_str()),
        });
    }
    Ok((route.name.clone(), targets))
}

/// `GET /v1/buckets`' account of one bucket, read at the store's `now`.
pub fn bucket(target: &Target, read: &Inspected) -> Value {
    let p = &target.params;
    let cap = p.capacity * p.scale;
    let state = read.state.unwrap_or(State {
        v: cap,
        t: read.now_us,
        scale: p.scale,
    });
    let held = peek(read.now_us, &[*p], &[state])
        .limits
        .first()
        .map_or(cap, |l| l.held);
    let whole = held / p.scale;
    let to_full = cap.saturating_sub(held).div_ceil(p.num);
    let to_next = if held < cap {
        ((whole + 1) * p.scale - held).div_ceil(p.num)
    } else {
        0
    };
    json!({
        "limit": target.limit,
        "store_key": target.store_key,
        "exists": read.state.is_some(),
        "tokens": whole,
        "tokens_exact": held as f64 / p.scale as f64,
        "units": held,
        "units_per_token": p.scale,
        "capacity": p.capacity,
        "refill": target.refill,
        "cost": p.cost,
        "seconds_to_full": to_full as f64 / 1e6,
        "seconds_to_next_token": to_next as f64 / 1e6,
        "ttl_ms": read.ttl_ms,
        "key_missing": target.key_missing,
    })
}

/// `name=value` pairs of a query, percent-decoded (`+` stays: API keys carry it).
fn query_pairs(query: &str) -> Vec<(String, Vec<u8>)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (
                String::from_utf8_lossy(&percent_decode(k)).into_owned(),
                percent_decode(v),
            )
        })
        .collect()
}

fn percent_decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let yaml = "listen: \"127.0.0.1:1\"\nclient_ipv6_prefix: 64\nroutes:\n  - name: api\n    upstream: \"h:1\"\n    limits:\n      \
                    - { name: pair, capacity: 5, refill: \"1/s\", key: [client_ip, \"header:X-Api-Key\"] }\n      \
                    - { name: all, capacity: 100, refill: \"10/s\", key: route }\n  \
                    - name: one\n    upstream: \"h:1\"\n    limits: [{ name: k, capacity: 2, refill: \"1/h\", key: \"header:X-Api-Key\" }]\n";
        Config::parse("t.yaml", yaml).unwrap()
    }

    #[test]
    fn store_keys_are_the_ones_a_client_makes() {
        let c = config();
        let (route, t) = targets(&c, "route=api&client_ip=10.0.0.7&header:x-api-key=abc").unwrap();
        assert_eq!(route, "api");
        assert_eq!(t[0].store_key, "rl:{api}:pair:10.0.0.7|abc");
        assert_eq!(t[1].store_key, "rl:{api}:all");
        assert_eq!(t[0].key_missing, None);
        let (_, t) = targets(&c, "route=one&key=a%2Bb%20c").unwrap();
        assert_eq!(
            t[0].store_key,
            "rl:{one:#".to_string() + &sha1_smol::Sha1::from("a+b c").digest().to_string() + "}:k"
        );
        let (_, t) = targets(&c, "route=one&key=abc").unwrap();
        assert_eq!(t[0].store_key, "rl:{one:abc}:k");
        // An IPv6 client is grouped by its prefix, as the proxy groups it.
        let (_, t) = targets(
            &c,
            "route=api&limit=pair&client_ip=2001:db8::1&header:X-Api-Key=k",
        )
        .unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].store_key, "rl:{api}:pair:2001:db8::|k");
        let (_, t) = targets(&c, "route=one").unwrap();
        assert_eq!(t[0].store_key, "rl:{one:~}:k");
        assert_eq!(t[0].key_missing, Some("shared"));
    }

    #[test]
    fn bad_queries_say_what_is_wrong() {
        let c = config();
        assert!(targets(&c, "").unwrap_err().contains("route= is required"));
        assert!(targets(&c, "route=nope").unwrap_err().contains("no route"));
        assert!(targets(&c, "route=api&limit=x")
            .unwrap_err()
            .contains("no limit"));
        assert!(targets(&c, "route=api&client_ip=nope")
            .unwrap_err()
            .contains("not an IP"));
    }

    #[test]
    fn a_bucket_is_told_in_tokens_and_seconds() {
        let c = config();
        let (_, t) = targets(&c, "route=one&key=abc").unwrap();
        let p = t[0].params;
        let read = Inspected {
            state: Some(State {
                v: p.scale / 2,
                t: 1_000_000,
                scale: p.scale,
            }),
            now_us: 1_000_000,
            ttl_ms: Some(5_400_000),
        };
        let v = bucket(&t[0], &read);
        assert_eq!(v["tokens"], 0);
        assert_eq!(v["tokens_exact"], 0.5);
        assert_eq!(v["seconds_to_full"], 5400.0);
        assert_eq!(v["seconds_to_next_token"], 1800.0);
        assert_eq!(v["exists"], true);
        let none = Inspected {
            state: None,
            now_us: 1,
            ttl_ms: None,
        };
        assert_eq!(bucket(&t[0], &none)["tokens"], 2);
    }
}
