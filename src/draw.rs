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
            // Trimmed as HTTP/1.1's parser trims (HTTP/2 values with whitespace around them are
            // refused before this): one value, one bucket, whatever the protocol.
            KeySource::Header(name) => value(
                self.headers
                    .get(name.as_str())
                    .map(|v| crate::canonical::trim_ows(v.as_bytes())),
            ),
            KeySource::Query(name) => value(query_param(self.query, name)),
            KeySource::Path => value(Some(self.path.as_bytes())),
            KeySource::Method => value(Some(self.method.as_bytes())),
            KeySource::Bearer => match bearer_token(self.headers) {
                Some(token) => Identity::Secret(token),
                None => Identity::Missing,
            },
            KeySource::FirstOf(alternatives) => {
                let found = alternatives.iter().find_map(|a| match self.part(a) {
                    Identity::Value(v) | Identity::Secret(v) => Some(v),
                    Identity::Missing | Identity::Route | Identity::Overflow(_) => None,
                });
                match found {
                    // The same secret sent either way (`x-api-key` or `Bearer`) is one key.
                    Some(v) if source.is_secret() => Identity::Secret(v),
                    Some(v) => Identity::Value(v),
                    None => Identity::Missing,
                }
            }
            KeySource::Route => Identity::Route,
        }
    }
}

/// The token of the request's `Authorization: Bearer <token>` (RFC 9110 §11.6.2, RFC 6750 §2.1):
/// the scheme in any case, then spaces (or tabs), then one token; whitespace around the whole is
/// trimmed. Anything else has no bearer token: no such header, two of them (which one would the
/// upstream read?), another scheme, no token, or a token followed by more words.
pub fn bearer_token(headers: &HeaderMap) -> Option<&[u8]> {
    let mut all = headers.get_all(http::header::AUTHORIZATION).iter();
    let (value, None) = (all.next()?, all.next()) else {
        return None;
    };
    let blank = |b: &u8| matches!(b, b' ' | b'\t');
    let v = value.as_bytes().trim_ascii();
    let gap = v.iter().position(blank)?;
    let (scheme, rest) = v.split_at(gap);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = rest.trim_ascii_start();
    (!token.is_empty() && !token.iter().any(blank)).then_some(token)
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
                matches!(p, Identity::Value(_) | Identity::Secret(_)) && s.client_chosen()
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

    fn authorization(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                http::header::AUTHORIZATION,
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_bearer_token_is_read_as_the_rfcs_spell_it() {
        for (values, want) in [
            (&["Bearer sk-abc_1.2~+/="][..], Some("sk-abc_1.2~+/=")),
            (&["bearer  tok"], Some("tok")),
            (&["BEARER\ttok"], Some("tok")),
            (&["  Bearer tok  "], Some("tok")),
            (&["Bearer"], None),
            (&["Bearer "], None),
            (&["Bearertok"], None),
            (&["Basic dXNlcjpwYXNz"], None),
            (&["Bearer tok extra"], None),
            (&["Bearer a", "Bearer b"], None),
            (&["Bearer a", "Bearer a"], None),
            (&[], None),
        ] {
            let h = authorization(values);
            assert_eq!(bearer_token(&h), want.map(str::as_bytes), "{values:?}");
        }
    }

    #[test]
    fn alternatives_take_the_first_present_and_hash_a_secret_either_way() {
        fn facts(headers: &HeaderMap) -> RequestFacts<'_> {
            RequestFacts {
                client_ip: "10.0.0.1",
                method: "GET",
                path: "/",
                query: None,
                headers,
                reserved: &[],
                key_budget: None,
            }
        }
        let mut headers = authorization(&["Bearer sk-1"]);
        let key = |text: &str| text.parse::<KeySource>().unwrap();
        let f = facts(&headers);
        assert_eq!(
            f.part(&key("header:x-api-key|bearer")),
            Identity::Secret(b"sk-1")
        );
        assert_eq!(f.part(&key("bearer")), Identity::Secret(b"sk-1"));
        assert_eq!(
            f.part(&key("header:x-api-key|client_ip")),
            Identity::Value(b"10.0.0.1")
        );
        headers.insert("x-api-key", http::HeaderValue::from_static("sk-1"));
        let f = facts(&headers);
        assert_eq!(
            f.part(&key("header:x-api-key|bearer")),
            Identity::Secret(b"sk-1")
        );
        assert_eq!(
            f.part(&key("header:x-api-key|query:k")),
            Identity::Value(b"sk-1")
        );
        let none = HeaderMap::new();
        assert_eq!(
            facts(&none).part(&key("header:x-api-key|bearer")),
            Identity::Missing
        );
    }

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
