//! The only place that builds store keys.
//!
//! A key is `<prefix>:{<tag>}:<limit>[:<value>]`. Every key of one decision shares the `{tag}` so
//! the Lua script can touch them all in one Redis Cluster slot. When every limit of a route keys on
//! the same client identity, the tag carries that identity and routes spread across the cluster;
//! when they differ (say per-client and route-wide), the tag can only be the route.
//!
//! Client-supplied values are bounded: short values of a safe alphabet stay readable in
//! `redis-cli`, anything else (long, binary, braces that would break the tag) becomes a SHA-1. A
//! value that is absent or empty maps to `~`, the limit's shared "missing" bucket; neither `~` nor
//! the `#` of a hashed value can be a raw value, so no client can aim at those buckets. A secret
//! (a bearer token, or whatever an alternative list holding `bearer` found) is hashed whatever it
//! looks like: no store key, log line or admin answer carries it as sent.

use crate::config::{Allowance, KeySource, Route};

/// Raw values longer than this are hashed.
const MAX_RAW: usize = 64;

/// What one part of a limit's key yields for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity<'a> {
    Value(&'a [u8]),
    /// A credential: stored as its SHA-1 always, even when short and of the safe alphabet.
    Secret(&'a [u8]),
    Missing,
    /// The route-wide bucket: no per-client part.
    Route,
    /// A part the client chose, counted on its address (`key_budget`): `!` and the address,
    /// which no value can spell (`!` is never kept raw).
    Overflow(&'a [u8]),
}

/// The key layout of one route, computed once at config load.
#[derive(Debug, Clone)]
pub struct KeyPlan {
    /// `<prefix>:{<route>` — the tag is still open.
    head: String,
    /// Every limit keys on the same per-client parts: their values go into the tag.
    value_in_tag: bool,
    limits: Vec<String>,
}

impl KeyPlan {
    pub fn new(prefix: &str, route: &Route) -> KeyPlan {
        let first = route.limits.first().map(|l| &l.key);
        let value_in_tag = first.is_some_and(|k| k.as_slice() != [KeySource::Route])
            && route.limits.iter().all(|l| Some(&l.key) == first);
        KeyPlan {
            head: format!("{prefix}:{{{}", route.name),
            value_in_tag,
            // A quota's and a concurrency limit's keys are their own (`monthly@quota`,
            // `inflight@inflight`): state carries over a reload that keeps a limit's name and
            // kind, never into a limit of another kind (or another type of Redis key).
            limits: route
                .limits
                .iter()
                .map(|l| match l.allowance {
                    Allowance::Bucket { .. } => l.name.clone(),
                    Allowance::Quota { .. } => format!("{}@quota", l.name),
                    Allowance::Concurrency { .. } => format!("{}@inflight", l.name),
                })
                .collect(),
        }
    }

    /// The key of limit `i` for a request whose key parts for that limit are `parts` (one per
    /// part of the limit's key, in order; `[Identity::Route]` for a route-wide limit).
    pub fn key(&self, i: usize, parts: &[Identity<'_>]) -> String {
        let limit = &self.limits[i];
        let mut key = String::with_capacity(self.head.len() + limit.len() + MAX_RAW + 4);
        key.push_str(&self.head);
        if self.value_in_tag {
            key.push(':');
            push_parts(&mut key, parts);
            key.push_str("}:");
            key.push_str(limit);
        } else {
            key.push_str("}:");
            key.push_str(limit);
            if parts != [Identity::Route] {
                key.push(':');
                push_parts(&mut key, parts);
            }
        }
        key
    }
}

/// Parts joined by `|`, which no encoded part contains.
fn push_parts(key: &mut String, parts: &[Identity<'_>]) {
    for (n, part) in parts.iter().enumerate() {
        if n > 0 {
            key.push('|');
        }
        push_value(key, *part);
    }
}

fn push_value(key: &mut String, id: Identity<'_>) {
    match id {
        Identity::Value(v) if !v.is_empty() => {
            let raw_ok = v.len() <= MAX_RAW
                && v.iter().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-' | b'/')
                });
            if raw_ok {
                // The alphabet is ASCII, so this is valid UTF-8.
                key.push_str(std::str::from_utf8(v).unwrap_or_default());
            } else {
                push_hash(key, v);
            }
        }
        Identity::Secret(v) if !v.is_empty() => push_hash(key, v),
        Identity::Overflow(client) => {
            key.push('!');
            // An address as `text::ip` writes it: hex digits, dots and colons.
            key.push_str(std::str::from_utf8(client).unwrap_or_default());
        }
        Identity::Value(_) | Identity::Secret(_) | Identity::Missing | Identity::Route => {
            key.push('~')
        }
    }
}

/// `#<sha1 of v in hex>`.
fn push_hash(key: &mut String, v: &[u8]) {
    key.push('#');
    key.push_str(&sha1_smol::Sha1::from(v).digest().to_string());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn route(limits: &str) -> Route {
        let yaml = format!("listen: \"127.0.0.1:1\"\nroutes:\n  - name: api\n    upstream: \"h:1\"\n    limits: {limits}\n");
        Config::parse("t.yaml", &yaml).unwrap().routes.remove(0)
    }

    #[test]
    fn same_source_puts_the_client_in_the_tag() {
        let plan = KeyPlan::new(
            "rl",
            &route("[{name: s, capacity: 1, refill: 1/s}, {name: m, capacity: 1, refill: 1/m}]"),
        );
        assert_eq!(
            plan.key(0, &[Identity::Value(b"10.0.0.1")]),
            "rl:{api:10.0.0.1}:s"
        );
        assert_eq!(
            plan.key(1, &[Identity::Value(b"10.0.0.1")]),
            "rl:{api:10.0.0.1}:m"
        );
        assert_eq!(plan.key(0, &[Identity::Value(b"::1")]), "rl:{api:::1}:s");
    }

    #[test]
    fn mixed_sources_share_the_route_tag() {
        let plan = KeyPlan::new("rl", &route("[{name: ip, capacity: 1, refill: 1/s}, {name: all, capacity: 1, refill: 1/s, key: route}]"));
        assert_eq!(
            plan.key(0, &[Identity::Value(b"10.0.0.1")]),
            "rl:{api}:ip:10.0.0.1"
        );
        assert_eq!(plan.key(1, &[Identity::Route]), "rl:{api}:all");
    }

    #[test]
    fn hostile_values_are_bounded_and_cannot_break_the_tag() {
        let plan = KeyPlan::new(
            "rl",
            &route("[{name: k, capacity: 1, refill: 1/s, key: \"header:X-Api-Key\"}]"),
        );
        let long = vec![b'a'; 10_000];
        let k = plan.key(0, &[Identity::Value(&long)]);
        assert!(k.len() < 80, "{k}");
        let k = plan.key(0, &[Identity::Value(b"x}{y\xff\0")]);
        assert!(
            k.starts_with("rl:{api:#") && k.ends_with("}:k") && k.matches('{').count() == 1,
            "{k}"
        );
        assert_eq!(plan.key(0, &[Identity::Missing]), "rl:{api:~}:k");
        assert_eq!(plan.key(0, &[Identity::Value(b"")]), "rl:{api:~}:k");
        assert_ne!(plan.key(0, &[Identity::Value(b"~")]), "rl:{api:~}:k");
        assert_eq!(
            plan.key(0, &[Identity::Overflow(b"10.0.0.7")]),
            "rl:{api:!10.0.0.7}:k"
        );
        assert_ne!(
            plan.key(0, &[Identity::Value(b"!10.0.0.7")]),
            "rl:{api:!10.0.0.7}:k"
        );
    }

    #[test]
    fn composite_keys_join_their_parts() {
        let plan = KeyPlan::new(
            "rl",
            &route("[{name: k, capacity: 1, refill: 1/s, key: [client_ip, \"header:X-Api-Key\"]}]"),
        );
        let both = plan.key(0, &[Identity::Value(b"10.0.0.1"), Identity::Value(b"abc")]);
        assert_eq!(both, "rl:{api:10.0.0.1|abc}:k");
        assert_eq!(
            plan.key(0, &[Identity::Value(b"10.0.0.1"), Identity::Missing]),
            "rl:{api:10.0.0.1|~}:k"
        );
        assert_eq!(plan.key(0, &[Identity::Value(b"/a/b")]), "rl:{api:/a/b}:k");
    }

    #[test]
    fn a_secret_is_hashed_however_plain_it_looks() {
        let plan = KeyPlan::new(
            "rl",
            &route("[{name: k, capacity: 1, refill: 1/s, key: bearer}]"),
        );
        let sha = sha1_smol::Sha1::from("sk1").digest().to_string();
        assert_eq!(
            plan.key(0, &[Identity::Secret(b"sk1")]),
            format!("rl:{{api:#{sha}}}:k")
        );
        assert_eq!(plan.key(0, &[Identity::Value(b"sk1")]), "rl:{api:sk1}:k");
        assert_eq!(plan.key(0, &[Identity::Secret(b"")]), "rl:{api:~}:k");
    }

    #[test]
    fn a_quota_keeps_keys_of_its_own() {
        let plan = KeyPlan::new(
            "rl",
            &route("[{name: m, quota: {amount: 5, period: month}, key: \"header:X-Api-Key\"}]"),
        );
        assert_eq!(
            plan.key(0, &[Identity::Value(b"sk_1")]),
            "rl:{api:sk_1}:m@quota"
        );
    }
}
