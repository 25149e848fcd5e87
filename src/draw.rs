//! Which buckets one request draws from: each limit's key parts read from the request, the
//! limit's `on_missing_key` policy applied, and the limits split into the enforced ones and the
//! shadow ones (evaluated and counted, never enforced).

use crate::config::{KeySource, MissingKey};
use crate::key::Identity;
use crate::key_budget::KeyBudget;
use crate::limiter::{Bucket, BucketParams};
use crate::plan::RoutePlan;
use http::HeaderMap;

/// What a request says about its client, in canonical form (`canonical`).
pub struct RequestFacts<'a> {
    pub client_ip: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    /// As sent, without the `?`.
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
    /// What the request reserves of each of the route's limits beside its cost (`reserve`), by
    /// the limit's index; empty when none does.
    pub reserved: &'a [u64],
    /// `new_keys_per_client`, when set (`client_ip` is then always filled in).
    pub key_budget: Option<&'a KeyBudget>,
}

impl RequestFacts<'_> {
    fn part(&self, source: &KeySource) -> Identity<'_> {
        fn value(v: Option<&[u8]>) -> Identity<'_> {
            match v {
                Some(v) if !v.is_empty() => Identity::Value(v),
                _ => Identity::Missing,
            }
        }
        match source {
            KeySource::ClientIp => value(Some(self.client_ip.as_bytes())),
            KeySource::Header(name) => value(self.headers.get(name.as_str()).map(|v| v.as_bytes())),
            KeySource::Query(name) => value(query_param(self.query, name)),
            KeySource::Path => value(Some(self.path.as_bytes())),
            KeySource::Method => value(Some(self.method.as_bytes())),
            KeySource::Route => Identity::Route,
        }
    }
}

/// The raw (still percent-encoded) value of the first `name=` parameter.
fn query_param<'q>(query: Option<&'q str>, name: &str) -> Option<&'q [u8]> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v.as_bytes())
    })
}

/// The buckets of one kind (enforced or shadow) a request draws from.
#[derive(Default)]
pub struct Draw {
    pub keys: Vec<String>,
    pub params: Vec<BucketParams>,
    /// `on_redis_error: local`'s share of each limit.
    pub local: Vec<BucketParams>,
    /// The route's index of each limit drawn.
    pub limits: Vec<usize>,
    /// This request's lease id, which its concurrency limits' buckets carry to the store (the
    /// params above keep the plan's, so that the deny cache sees one limit per limit).
    pub lease: u64,
}

impl Draw {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether a concurrency limit is among these buckets.
    pub fn leases(&self) -> bool {
        self.params.iter().any(BucketParams::is_lease)
    }

    pub fn buckets(&self) -> Vec<Bucket<'_>> {
        zip(&self.keys, &self.params, self.lease)
    }

    pub fn local_buckets(&self) -> Vec<Bucket<'_>> {
        zip(&self.keys, &self.local, self.lease)
    }
}

fn zip<'a>(keys: &'a [String], params: &[BucketParams], lease: u64) -> Vec<Bucket<'a>> {
    keys.iter()
        .zip(params)
        .map(|(key, params)| Bucket {
            key,
            params: params.with_lease(lease),
        })
        .collect()
}

/// What a request draws: both kinds of buckets, or the limit whose missing key refuses it.
pub enum Draws {
    Buckets { enforced: Draw, shadow: Draw },
    MissingKey(usize),
}

pub fn draws(route: &RoutePlan, facts: &RequestFacts<'_>) -> Draws {
    let mut enforced = Draw::default();
    let mut shadow = Draw::default();
    let mut parts = Vec::with_capacity(2);
    for (i, limit) in route.limits.iter().enumerate() {
        parts.clear();
        parts.extend(limit.key.iter().map(|s| facts.part(s)));
        if parts.contains(&Identity::Missing) {
            match limit.on_missing_key {
                MissingKey::Shared => {}
                MissingKey::Skip => continue,
                MissingKey::Deny => return Draws::MissingKey(i),
            }
        }
        let draw = if limit.shadow {
            &mut shadow
        } else {
            &mut enforced
        };
        let reserved = facts.reserved.get(i).copied().unwrap_or(0);
        let (mut params, mut local) = (limit.params, limit.local);
        if reserved > 0 {
            // Validation keeps cost + reserve_max within the capacity; a proxy's local share
            // may be smaller, and takes what it can.
            params.cost += reserved;
            local.cost = (local.cost + reserved).min(local.capacity.max(local.cost));
        }
        let mut key = route.keys.key(i, &parts);
        if let Some(budget) = facts.key_budget {
            let chosen = |(p, s): (&Identity<'_>, &KeySource)| {
                matches!(p, Identity::Value(_)) && s.client_chosen()
            };
            if parts.iter().zip(&limit.key).any(chosen) && !budget.admit(facts.client_ip, &key) {
                for (p, s) in parts.iter_mut().zip(&limit.key) {
                    if s.client_chosen() {
                        *p = Identity::Overflow(facts.client_ip.as_bytes());
                    }
                }
                key = route.keys.key(i, &parts);
            }
        }
        draw.keys.push(key);
        draw.params.push(params);
        draw.local.push(local);
        draw.limits.push(i);
    }
    Draws::Buckets { enforced, shadow }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_found_by_exact_name() {
        assert_eq!(
            query_param(Some("a=1&key=x%20y&b"), "key"),
            Some(&b"x%20y"[..])
        );
        assert_eq!(query_param(Some("akey=1"), "key"), None);
        assert_eq!(query_param(Some("b&key"), "key"), Some(&b""[..]));
        assert_eq!(query_param(None, "key"), None);
    }
}
