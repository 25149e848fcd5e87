//! The compiled route table in words, for `--check`: what will apply to which request, in the
//! order routes are tried, so an operator can see it before a request does.

use crate::config::{Config, KeySource, MissingKey, Route};
use std::fmt::Write;

pub fn route_table(config: &Config) -> String {
    let mut out = String::new();
    let now = crate::tls::unix_now();
    for l in &config.listen {
        if let Some(tls) = &l.tls {
            for c in &tls.certs {
                let _ = writeln!(out, "listen {}: TLS {}", l.addr, c.served.describe(now));
            }
        }
    }
    out.push_str("routes, tried in this order (first match wins):\n");
    for (n, r) in config.routes.iter().enumerate() {
        let _ = writeln!(out, "{:>3}. {}", n + 1, describe(r));
        if r.limits.is_empty() {
            let _ = writeln!(out, "       no limits: proxied as is");
        }
        for l in &r.limits {
            let key: Vec<String> = l.key.iter().map(key_name).collect();
            let missing = match l.on_missing_key {
                MissingKey::Shared => "shared bucket",
                MissingKey::Skip => "limit skipped",
                MissingKey::Deny => "refused",
            };
            let _ = writeln!(
                out,
                "       limit {}: {}, cost {}{}, per {}{}{}",
                l.name,
                l.allowance,
                l.cost,
                match &l.charge {
                    Some(c) => format!(
                        " up front{}, then what the response reports in {}{}",
                        match &l.reserve {
                            Some(r) => format!(" plus what the request reserves in {r}"),
                            None => String::new(),
                        },
                        c,
                        if c.refund_unused {
                            " (unused refunded)"
                        } else {
                            ""
                        }
                    ),
                    None => String::new(),
                },
                key.join(" + "),
                if l.key == [KeySource::Route] {
                    String::new()
                } else {
                    format!(" (key missing: {missing})")
                },
                if l.shadow || r.shadow {
                    ", shadow (counted, never enforced)"
                } else {
                    ""
                },
            );
        }
        if !r.allow.is_empty() {
            let cidrs = r.allow.cidrs.len();
            let headers: Vec<&str> = r.allow.headers.iter().map(|(h, _)| h.as_str()).collect();
            let _ = writeln!(
                out,
                "       bypass: {cidrs} address block(s), headers [{}]",
                headers.join(", ")
            );
        }
    }
    out
}

fn describe(r: &Route) -> String {
    let methods = r
        .methods
        .as_ref()
        .map_or("any method".to_string(), |m| m.join(","));
    let host = r.host.as_deref().unwrap_or("any host");
    let upstreams: Vec<String> = r.upstreams.iter().map(|u| u.to_string()).collect();
    let on_error = r.on_redis_error;
    let deny = r.deny.format.describe();
    // A missing key's status only matters where a limit refuses a request without one.
    let missing = if r
        .limits
        .iter()
        .any(|l| l.on_missing_key == MissingKey::Deny)
    {
        format!(", missing key {}", r.deny.missing_key_status)
    } else {
        String::new()
    };
    let stream_usage = match r.stream_usage {
        true => " | a stream is asked for its usage",
        false => "",
    };
    format!(
        "{}: {methods} {host} {}* -> {} | on_redis_error {on_error} | deny {} {deny}{missing}{stream_usage}",
        r.name,
        r.path_prefix,
        upstreams.join(", "),
        r.deny.status
    )
}

fn key_name(k: &KeySource) -> String {
    match k {
        KeySource::Route => "route (one bucket for all)".into(),
        KeySource::Bearer => "bearer (the Authorization: Bearer token, hashed)".into(),
        KeySource::FirstOf(alternatives) => {
            let each: Vec<String> = alternatives.iter().map(ToString::to_string).collect();
            format!(
                "the first present of {}{}",
                each.join(" | "),
                if k.is_secret() {
                    " (hashed: it can be the Authorization: Bearer token)"
                } else {
                    ""
                }
            )
        }
        other => other.to_string(),
    }
}
