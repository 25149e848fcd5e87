//! The decision policy: whether a request on a route passes, with what outcome, and which
//! decision its response headers describe. No Pingora here: the proxy asks, then writes.
//!
//! In order: the route's allowlist (bypassed), the buckets the request draws (a missing key may
//! refuse it), the enforced limits (through the deny cache when the store is shared) beside the
//! shadow ones, and the route's `on_redis_error` when the store cannot answer. The deny cache
//! stays here rather than behind the `Limiter` trait: it reads the clock the gate is given and
//! counts its hits per route, and neither is the store's business.

use crate::clock::Clock;
use crate::config::FailMode;
use crate::deny_cache::{Consult, DenyCache};
use crate::draw::{draws, Draw, Draws, RequestFacts};
use crate::held::{Held, LeaseIds};
use crate::key_budget::KeyBudget;
use crate::limiter::memory::MemoryLimiter;
use crate::limiter::{Decision, Limiter, LimiterError};
use crate::metrics::Outcome;
use crate::plan::RoutePlan;
use http::HeaderMap;
use std::net::IpAddr;
use std::sync::Arc;

pub struct Gate<L, C> {
    limiter: Arc<L>,
    /// Names each admitted request's concurrency leases.
    lease_ids: LeaseIds,
    /// Only in front of a shared store: the in-memory store answers as fast as the cache would.
    deny_cache: Option<Arc<DenyCache>>,
    /// Decides for `on_redis_error: local` routes while the store fails.
    fallback: MemoryLimiter<C>,
    clock: C,
    /// `new_keys_per_client`, when set.
    key_budget: Option<Arc<KeyBudget>>,
}

/// A request as the gate needs it: canonical (`canonical`), its client found (`client`).
pub struct Asking<'a> {
    /// `None` when the connection has no IP peer.
    pub client: Option<IpAddr>,
    pub method: &'a str,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
    /// What the request reserves of each limit (`usage::request::reservations`); empty: nothing.
    pub reserved: &'a [u64],
}

/// How a request was decided, before anything is written.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Proxy it; with the decision (and the route's index of each of its limits) for the
    /// response headers when the state is known.
    Pass(Outcome, Option<(Decision, Vec<usize>)>),
    /// Answer with the route's deny response, with this decision's headers.
    Reject(Outcome, Decision, Vec<usize>),
    /// Answer with the route's deny response: limit `i`'s key is missing and it says `deny`.
    MissingKey(usize),
    /// Answer 503: the store failed and the route fails closed.
    Unavailable,
}

impl Verdict {
    /// The `decision` label it is counted under.
    pub fn outcome(&self) -> Outcome {
        match self {
            Verdict::Pass(o, _) | Verdict::Reject(o, _, _) => *o,
            Verdict::MissingKey(_) => Outcome::Rejected,
            Verdict::Unavailable => Outcome::FailClosed,
        }
    }
}

impl<L: Limiter, C: Clock + Clone> Gate<L, C> {
    pub fn new(
        limiter: Arc<L>,
        deny_cache: Option<Arc<DenyCache>>,
        fallback: MemoryLimiter<C>,
        clock: C,
    ) -> Gate<L, C> {
        Gate {
            limiter,
            lease_ids: LeaseIds::new(),
            deny_cache,
            fallback,
            clock,
            key_budget: None,
        }
    }

    /// Bounds the keys each client address creates through parts it chooses (`key_budget`).
    pub fn with_key_budget(mut self, budget: Option<Arc<KeyBudget>>) -> Self {
        self.key_budget = budget;
        self
    }

    /// Decides `request` on `route`. An admitted request may hold concurrency leases: they are
    /// the caller's to `release` when the request ends.
    pub async fn admit(&self, route: &RoutePlan, request: &Asking<'_>) -> (Verdict, Held) {
        let mut held = Held::default();
        if allowlisted(route, request.client, request.headers) {
            return (Verdict::Pass(Outcome::Bypassed, None), held);
        }
        // Formatted only for routes whose keys read it.
        let client_ip = match request.client {
            Some(ip) if route.keys_on_client_ip() || self.key_budget.is_some() => {
                let mut text = Vec::with_capacity(39);
                crate::text::ip(&mut text, ip);
                // ASCII digits, dots, colons and hex letters only.
                String::from_utf8(text).unwrap_or_default()
            }
            _ => String::new(),
        };
        let facts = RequestFacts {
            client_ip: &client_ip,
            method: request.method,
            path: request.path,
            query: request.query,
            headers: request.headers,
            reserved: request.reserved,
            key_budget: self.key_budget.as_deref(),
        };
        let (mut enforced, mut shadow) = match draws(route, &facts) {
            Draws::Buckets { enforced, shadow } => (enforced, shadow),
            Draws::MissingKey(i) => return (Verdict::MissingKey(i), held),
        };
        if enforced.leases() || shadow.leases() {
            let id = self.lease_ids.next();
            (enforced.lease, shadow.lease) = (id, id);
        }
        let (verdict, shadow_rejects) =
            tokio::join!(self.decide(route, &enforced), self.shadow(route, &shadow));
        self.rank(route, &enforced, &verdict);
        let (shadow_rejects, shadow_admits) = shadow_rejects;
        if shadow_admits {
            held.lease(route, &shadow, false);
            if matches!(verdict, Decided::Pass(..)) {
                held.owe(route, &shadow, false, false);
            }
        }
        let local = match &verdict {
            Decided::Pass(Outcome::Allowed, Some(_)) => Some(false),
            Decided::Pass(Outcome::LocalFallback, Some(_)) => Some(true),
            _ => None,
        };
        if let Some(local) = local {
            held.lease(route, &enforced, local);
            held.owe(route, &enforced, local, true);
        }
        let verdict = match verdict {
            Decided::Pass(Outcome::Allowed, decision) if shadow_rejects => Verdict::Pass(
                Outcome::ShadowRejected,
                decision.map(|d| (d, enforced.limits)),
            ),
            Decided::Pass(outcome, decision) => {
                Verdict::Pass(outcome, decision.map(|d| (d, enforced.limits)))
            }
            Decided::Reject(outcome, decision) => {
                Verdict::Reject(outcome, decision, enforced.limits)
            }
            Decided::Unavailable => Verdict::Unavailable,
        };
        (verdict, held)
    }

    /// Counts the key in the route's most refused keys (`top`): the key of the limit that refused
    /// it, or, admitted, its keys if they are being tracked.
    fn rank(&self, route: &RoutePlan, draw: &Draw, verdict: &Decided) {
        let top = &route.counters.top;
        match verdict {
            Decided::Reject(_, decision) => {
                let key = decision.binding().and_then(|i| draw.keys.get(i));
                if let Some(key) = key {
                    top.refused(key, self.clock.now_us());
                }
            }
            Decided::Pass(Outcome::Allowed, Some(_)) => {
                let now = self.clock.now_us();
                for key in &draw.keys {
                    top.allowed(key, now);
                }
            }
            _ => {}
        }
    }

    /// The enforced limits' answer: from the deny cache, or the store, or the route's
    /// `on_redis_error` when the store fails.
    async fn decide(&self, route: &RoutePlan, draw: &Draw) -> Decided {
        if draw.is_empty() {
            return Decided::Pass(Outcome::Allowed, None);
        }
        // A limit that refunds can gain tokens through another proxy, which a remembered denial
        // would not see: such a route always asks the store.
        let Some(cache) = self.deny_cache.as_ref().filter(|_| !route.refunds) else {
            let result = self.limiter.check(&draw.buckets()).await;
            self.forget_leases(draw, &result);
            return self.verdict(route, draw, result);
        };
        let now = || self.clock.now_us();
        let refresh = match cache.consult(&draw.keys, &draw.params, now).await {
            Consult::Denied(d) => {
                route.counters.deny_cache_hit();
                return Decided::Reject(Outcome::Rejected, d);
            }
            Consult::StoreFailed(e) => return self.verdict(route, draw, Err(e)),
            Consult::Ask(refresh) => refresh,
        };
        let result = self.limiter.check(&draw.buckets()).await;
        self.forget_leases(draw, &result);
        match (&result, refresh) {
            (Ok(d), refresh) => cache.note(&draw.keys, &draw.params, d, now(), refresh),
            (Err(e), Some(refresh)) => refresh.failed(e.clone()),
            (Err(_), None) => {}
        }
        self.verdict(route, draw, result)
    }

    /// What the store's answer (or failure) means for this route.
    fn verdict(
        &self,
        route: &RoutePlan,
        draw: &Draw,
        result: Result<Decision, LimiterError>,
    ) -> Decided {
        match result {
            Ok(d) if d.allowed => Decided::Pass(Outcome::Allowed, Some(d)),
            Ok(d) => Decided::Reject(Outcome::Rejected, d),
            Err(e) => {
                // Per-request detail stays at debug: an outage would otherwise flood the log, and
                // the error counter and the breaker's warning already say it is happening.
                log::debug!("route {}: rate-limit store failed: {e}", route.name);
                route.counters.store_failed(e.cause());
                match route.on_redis_error {
                    FailMode::Open => Decided::Pass(Outcome::FailOpen, None),
                    FailMode::Closed => Decided::Unavailable,
                    FailMode::Local => match self.fallback.decide(&draw.local_buckets()) {
                        Ok(d) if d.allowed => Decided::Pass(Outcome::LocalFallback, Some(d)),
                        Ok(d) => Decided::Reject(Outcome::LocalRejected, d),
                        Err(_) => Decided::Pass(Outcome::FailOpen, None),
                    },
                }
            }
        }
    }

    /// Whether the shadow limits would have rejected the request (unknown counts as no), and
    /// whether they admitted it (a shadow concurrency limit counts requests in flight and a
    /// shadow charge charges like enforced ones, so their leases and charges are settled alike).
    async fn shadow(&self, route: &RoutePlan, draw: &Draw) -> (bool, bool) {
        if draw.is_empty() {
            return (false, false);
        }
        let result = self.limiter.check(&draw.buckets()).await;
        self.forget_leases(draw, &result);
        match result {
            Ok(d) => (!d.allowed, d.allowed),
            Err(e) => {
                log::debug!("route {}: shadow limits not decided: {e}", route.name);
                (false, false)
            }
        }
    }
}

/// The enforced limits' answer, before the shadow ones and the limits' indexes join it.
enum Decided {
    Pass(Outcome, Option<Decision>),
    Reject(Outcome, Decision),
    Unavailable,
}

/// The route's allowlist: a client address in one of its blocks, or a header with its value.
fn allowlisted(route: &RoutePlan, client: Option<IpAddr>, headers: &HeaderMap) -> bool {
    let allow = &route.allow;
    client.is_some_and(|ip| allow.cidrs.iter().any(|c| c.contains(ip)))
        || allow.headers.iter().any(|(name, value)| {
            headers
                .get_all(name.as_str())
                .iter()
                .any(|v| v.as_bytes() == value.as_bytes())
        })
}

mod after;
#[cfg(test)]
mod tests;
