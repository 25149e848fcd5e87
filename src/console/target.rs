//! Which buckets an admin call is about: the route, its limits, and the store key each would
//! have for key values given as a client sends them; and the account of one bucket once read.

use crate::config::{Allowance, Config, KeySource};
use crate::key::{Identity, KeyPlan};
use crate::limiter::bucket::{peek, report, State};
use crate::limiter::{BucketParams, Inspected};
use crate::plan;
use serde_json::{json, Value};
use std::net::IpAddr;

/// One bucket an admin call is about: a limit of the route, and the store key that the key values
/// in the query make, exactly as a client sending them would make it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub limit: String,
    pub store_key: String,
    pub params: BucketParams,
    /// A bucket's refill rate, as configured.
    pub refill: Option<String>,
    /// A quota's period.
    pub period: Option<&'static str>,
    /// When a key part was not given: the limit's `on_missing_key` (the shared "missing" bucket
    /// is the one shown).
    pub key_missing: Option<&'static str>,
}

/// The route named by `route=` and the buckets of its limits (or of `limit=`'s alone) for the key
/// values given: `key=` for a one-part key, else one parameter per part named as in the config
/// (`client_ip=`, `header:X-Api-Key=`, `query:k=`, `path=`, `method=`, `bearer=` the token alone,
/// `header:x-api-key|bearer=` the value of alternatives). An error is the 400's text.
pub fn targets(config: &Config, query: &str) -> Result<(String, Vec<Target>), String> {
    let params = query_pairs(query);
    let get = |name: &str| find(&params, name).map(|(_, v, _)| v.as_slice());
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
            let given = find(&params, &name)
                .or_else(|| (l.key.len() == 1).then(|| find(&params, "key")).flatten());
            // A query key part is the client's value as sent, percent-encoding and all; so is a
            // path, before it is put in canonical form as the proxy does.
            let value = given.map(|(_, decoded, raw)| match part {
                KeySource::Query(_) | KeySource::Path => raw.as_bytes(),
                _ => decoded.as_slice(),
            });
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
                (KeySource::Path, Some(v)) => {
                    let canonical =
                        crate::canonical::normalize_path(v, config.path_escaped_slashes)
                            .map_err(|why| format!("{name}: {}", why.explain()))?;
                    Some(canonical.as_bytes().to_vec())
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
                secret if secret.is_secret() => Identity::Secret(text),
                _ => Identity::Value(text),
            })
            .collect();
        targets.push(Target {
            limit: l.name.clone(),
            store_key: keys.key(i, &parts),
            params: plan::bucket_params(l, route.upstream_timeouts.read),
            refill: match l.allowance {
                Allowance::Bucket { refill, .. } => Some(refill.to_string()),
                _ => None,
            },
            period: match l.allowance {
                Allowance::Quota { period, .. } => Some(period.as_str()),
                _ => None,
            },
            key_missing: missing.then(|| l.on_missing_key.as_str()),
        });
    }
    Ok((route.name.clone(), targets))
}

/// `GET /v1/buckets`' account of one bucket, read at the store's `now`.
pub fn bucket(target: &Target, read: &Inspected) -> Value {
    let p = &target.params;
    if p.is_lease() {
        // A concurrency limit's key holds leases, not tokens.
        let held = read.leases.unwrap_or(0);
        return json!({
            "limit": target.limit,
            "store_key": target.store_key,
            "exists": read.leases.is_some(),
            "kind": "concurrency",
            "in_flight": held,
            "free": p.capacity.saturating_sub(held),
            "capacity": p.capacity,
            "ttl_ms": read.ttl_ms,
            "key_missing": target.key_missing,
        });
    }
    let cap = p.capacity * p.scale;
    let state = read.state.unwrap_or(State {
        v: cap,
        t: read.now_us,
        scale: p.unit(),
    });
    let now = read.now_us;
    let refilled = peek(now, &[*p], &[state])
        .limits
        .first()
        .map_or(state, |l| l.state(now, p.unit()));
    // As an admitted request would be told: until full, and until the next whole token (a
    // quota's boundary).
    let account = report(now, p, &refilled, true);
    let held = account.held;
    let whole = held / p.scale;
    let (to_full, to_next) = (account.reset_us, account.wait_us);
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
        "period": target.period,
        "cost": p.cost,
        "seconds_to_full": to_full as f64 / 1e6,
        "seconds_to_next_token": to_next as f64 / 1e6,
        "ttl_ms": read.ttl_ms,
        "key_missing": target.key_missing,
    })
}

/// The first pair named `name` (ignoring case).
fn find<'p, 'q>(
    params: &'p [(String, Vec<u8>, &'q str)],
    name: &str,
) -> Option<&'p (String, Vec<u8>, &'q str)> {
    params.iter().find(|(k, _, _)| k.eq_ignore_ascii_case(name))
}

/// `name=value` pairs of a query: the name and the value percent-decoded (`+` stays: API keys
/// carry it), and the value as written.
pub(super) fn query_pairs(query: &str) -> Vec<(String, Vec<u8>, &str)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (
                String::from_utf8_lossy(&percent_decode(k)).into_owned(),
                percent_decode(v),
                v,
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
    fn query_and_path_parts_are_taken_as_a_client_sends_them() {
        let yaml = "listen: \"127.0.0.1:1\"\nroutes:\n  - name: q\n    upstream: \"h:1\"\n    limits:\n      \
                    - { name: byq, capacity: 2, refill: \"1/h\", key: \"query:k\" }\n  \
                    - name: p\n    upstream: \"h:1\"\n    limits: [{ name: byp, capacity: 2, refill: \"1/h\", key: path }]\n";
        let c = Config::parse("t.yaml", yaml).unwrap();
        // The raw value, %20 and all: what the proxy keys a request `?k=a%20b` on.
        let (_, t) = targets(&c, "route=q&query:k=a%20b").unwrap();
        let raw = sha1_smol::Sha1::from("a%20b").digest().to_string();
        assert_eq!(t[0].store_key, format!("rl:{{q:#{raw}}}:byq"));
        // A path in canonical form, as the proxy routes and keys it.
        let (_, t) = targets(&c, "route=p&path=/a/./b/%7Ec").unwrap();
        let (_, same) = targets(&c, "route=p&path=/a/b/~c").unwrap();
        assert_eq!(t[0].store_key, same[0].store_key);
        let canonical = sha1_smol::Sha1::from("/a/b/~c").digest().to_string();
        assert_eq!(t[0].store_key, format!("rl:{{p:#{canonical}}}:byp"));
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
            leases: None,
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
            leases: None,
        };
        assert_eq!(bucket(&t[0], &none)["tokens"], 2);
    }
}
