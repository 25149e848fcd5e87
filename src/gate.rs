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
use crate::config::UsageSource;
use crate::deny_cache::{Consult, DenyCache};
use crate::draw::{draws, Draw, Draws, RequestFacts};
use crate::held::{Held, Lease, LeaseIds};
use crate::limiter::bucket::clamp_charge;
use crate::limiter::memory::MemoryLimiter;
use crate::limiter::{Bucket, BucketParams, Decision, LimitState, Limiter, LimiterError};
use crate::metrics::Outcome;
use crate::plan::RoutePlan;
use http::HeaderMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

pub struct Gate<L, C> {
    limiter: Arc<L>,
    /// Names each admitted request's concurrency leases.
    lease_ids: LeaseIds,
    /// Only in front of a shared store: the in-memory store answers as fast as the cache would.
    deny_cache: Option<Arc<DenyCache>>,
    /// Decides for `on_redis_error: local` routes while the store fails.
    fallback: MemoryLimiter<C>,
    clock: C,
}

/// A request as the gate needs it: canonical (`canonical`), its client found (`client`).
pub struct Asking<'a> {
    /// `None` when the connection has no IP peer.
    pub client: Option<IpAddr>,
    pub method: &'a str,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
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
        }
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
            Some(ip) if route.keys_on_client_ip() => {
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

    /// Charges what `used` reports for each charge still owed whose source it can tell
    /// (`used(source)`: `Some(Some(n))` used n, `Some(None)` did not say, `None` not known yet).
    /// Returns the enforced limits' buckets after their charges (the route's limit index, its
    /// state), for the response headers when they have not gone out yet.
    pub async fn settle(
        &self,
        held: &mut Held,
        used: impl Fn(&UsageSource) -> Option<Option<u64>>,
    ) -> Vec<(usize, LimitState)> {
        let mut after = Vec::new();
        for owed in held.owed.iter_mut().filter(|o| !o.settled) {
            let Some(reported) = used(&owed.charge.from) else {
                continue;
            };
            owed.settled = true;
            let Some(amount) = owed.amount(reported) else {
                continue;
            };
            let amount = clamp_charge(&owed.params, amount);
            let bucket = [Bucket {
                key: &owed.key,
                params: owed.params,
            }];
            let charged = match owed.local {
                true => self.fallback.charge_now(&bucket, &[amount]),
                false => self.limiter.charge(&bucket, &[amount]).await,
            };
            match charged {
                Ok(d) => {
                    // Only enforced limits are answered from the cache.
                    if let (Some(cache), false, true) =
                        (&self.deny_cache, owed.local, owed.enforced)
                    {
                        let keys = [owed.key.clone()];
                        cache.note(&keys, &[owed.params], &d, self.clock.now_us(), None);
                    }
                    if let (true, Some(&state)) = (owed.enforced, d.limits.first()) {
                        after.push((owed.limit, state));
                    }
                }
                // The up-front cost stands; the store's error counter says why.
                Err(e) => log::debug!("usage of {} not charged: {e}", owed.key),
            }
        }
        after
    }

    /// A decision that failed after reaching the store (a timeout, a dropped connection) may
    /// have taken its leases there all the same: they are given back, in the background and at
    /// best (whatever is left expires after `lease_ms`).
    fn forget_leases(&self, draw: &Draw, result: &Result<Decision, LimiterError>) {
        let reached = matches!(result, Err(e) if !matches!(e, LimiterError::Unavailable));
        if !(reached && draw.leases()) {
            return;
        }
        let leases: Vec<(String, BucketParams)> = draw
            .buckets()
            .iter()
            .filter(|b| b.params.is_lease())
            .map(|b| (b.key.to_string(), b.params))
            .collect();
        let limiter = self.limiter.clone();
        tokio::spawn(async move {
            let buckets: Vec<Bucket<'_>> = leases
                .iter()
                .map(|(key, params)| Bucket {
                    key,
                    params: *params,
                })
                .collect();
            let _ = limiter.release(&buckets).await;
        });
    }

    /// While a request holding leases is still in flight (its body moving), renews them once a
    /// third of their `lease_ms` has passed since they were taken or last renewed: a stream may
    /// run for longer than a lease lasts. The store's part is returned to run in the background.
    pub fn renewal(&self, held: &mut Held) -> Option<impl Future<Output = ()> + Send + 'static> {
        if !held.renewal_due(Instant::now()) {
            return None;
        }
        let local: Vec<Bucket<'_>> = held.local.iter().map(Lease::bucket).collect();
        self.fallback.renew_now(&local);
        let leases: Vec<(String, BucketParams)> = held.store.iter().map(Lease::owned).collect();
        let limiter = self.limiter.clone();
        (!leases.is_empty()).then_some(async move {
            let buckets: Vec<Bucket<'_>> = leases
                .iter()
                .map(|(key, params)| Bucket {
                    key,
                    params: *params,
                })
                .collect();
            if let Err(e) = limiter.renew(&buckets).await {
                log::debug!("leases not renewed (they expire after lease_ms): {e}");
            }
        })
    }

    /// Ends the leases a request held (`admit`): called when its response is done, or when it
    /// was aborted or its client went away. A store that cannot be told lets them expire.
    pub async fn release(&self, held: &mut Held) {
        let (store, local) = (
            std::mem::take(&mut held.store),
            std::mem::take(&mut held.local),
        );
        let held = Held {
            store,
            local,
            ..Held::default()
        };
        if !held.store.is_empty() {
            let buckets: Vec<Bucket<'_>> = held.store.iter().map(Lease::bucket).collect();
            if let Err(e) = self.limiter.release(&buckets).await {
                log::debug!("leases not released (they expire by themselves): {e}");
            }
        }
        let local: Vec<Bucket<'_>> = held.local.iter().map(Lease::bucket).collect();
        self.fallback.give_back(&local);
        for lease in held.store.iter().chain(&held.local) {
            if let Some(gauge) = &lease.gauge {
                gauge.dec();
            }
        }
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
            Consult::StoreFailed => {
                return self.verdict(route, draw, Err(LimiterError::Unavailable))
            }
            Consult::Ask(refresh) => refresh,
        };
        let result = self.limiter.check(&draw.buckets()).await;
        self.forget_leases(draw, &result);
        match (&result, refresh) {
            (Ok(d), refresh) => cache.note(&draw.keys, &draw.params, d, now(), refresh),
            (Err(_), Some(refresh)) => refresh.failed(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::config::Config;
    use crate::limiter::Bucket;
    use crate::metrics::Metrics;
    use crate::plan::Plan;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    const T0: u64 = 1_800_000_000_000_000;

    type Clocked = Arc<ManualClock>;

    /// A store that cannot be reached.
    struct Down;

    impl Limiter for Down {
        async fn check(&self, _: &[Bucket<'_>]) -> Result<Decision, LimiterError> {
            Err(LimiterError::Connection("refused".into()))
        }

        async fn ping(&self) -> Result<(), LimiterError> {
            Err(LimiterError::Connection("refused".into()))
        }

        async fn release(&self, _: &[Bucket<'_>]) -> Result<(), LimiterError> {
            Err(LimiterError::Connection("refused".into()))
        }

        async fn renew(&self, _: &[Bucket<'_>]) -> Result<(), LimiterError> {
            Err(LimiterError::Connection("refused".into()))
        }

        async fn charge(&self, _: &[Bucket<'_>], _: &[i64]) -> Result<Decision, LimiterError> {
            Err(LimiterError::Connection("refused".into()))
        }
    }

    /// The in-memory store, counting the calls that reach it.
    struct Counted {
        store: MemoryLimiter<Clocked>,
        calls: AtomicUsize,
    }

    impl Limiter for Counted {
        async fn check(&self, buckets: &[Bucket<'_>]) -> Result<Decision, LimiterError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.store.check(buckets).await
        }

        async fn ping(&self) -> Result<(), LimiterError> {
            Ok(())
        }

        async fn release(&self, leases: &[Bucket<'_>]) -> Result<(), LimiterError> {
            self.store.release(leases).await
        }

        async fn renew(&self, leases: &[Bucket<'_>]) -> Result<(), LimiterError> {
            self.store.renew(leases).await
        }

        async fn charge(
            &self,
            b: &[Bucket<'_>],
            amounts: &[i64],
        ) -> Result<Decision, LimiterError> {
            self.store.charge(b, amounts).await
        }
    }

    /// One route, `r`, whose fields (YAML, indented as a route's) are `route`; two proxies share
    /// the store.
    fn plan(route: &str) -> Plan {
        let yaml = format!(
            "listen: \"127.0.0.1:1\"\nredis: {{ url: \"redis://127.0.0.1:1\", fleet_size: 2 }}\nroutes:\n  - name: r\n    upstream: \"127.0.0.1:2\"\n{route}"
        );
        let config = Config::parse("t.yaml", &yaml).unwrap();
        Plan::compile(
            &config,
            &Metrics::new(&prometheus::Registry::new(), true).unwrap(),
        )
        .unwrap()
    }

    /// A gate in front of `store`, made on the gate's own clock; with a deny cache if `cached`.
    fn gate<L: Limiter>(
        store: impl FnOnce(&Clocked) -> L,
        cached: bool,
    ) -> (Gate<L, Clocked>, Clocked) {
        let clock = Arc::new(ManualClock::new(T0));
        let cache = cached.then(|| Arc::new(DenyCache::new(100, Duration::from_millis(50))));
        let fallback = MemoryLimiter::new(clock.clone(), 1000);
        let gate = Gate::new(Arc::new(store(&clock)), cache, fallback, clock.clone());
        (gate, clock)
    }

    fn memory(clock: &Clocked) -> MemoryLimiter<Clocked> {
        MemoryLimiter::new(clock.clone(), 1000)
    }

    fn ask<'a>(headers: &'a HeaderMap, client: &str) -> Asking<'a> {
        Asking {
            client: Some(client.parse().unwrap()),
            method: "GET",
            path: "/x",
            query: None,
            headers,
        }
    }

    const TWO: &str = "    limits: [{ name: l, capacity: 2, refill: \"1/s\" }]\n";

    #[tokio::test]
    async fn admits_to_capacity_then_rejects_and_refills_by_the_clock() {
        let plan = plan(TWO);
        let (g, clock) = gate(memory, false);
        let h = HeaderMap::new();
        let route = &plan.routes[0];
        let mut outcomes = Vec::new();
        for _ in 0..3 {
            outcomes.push(g.admit(route, &ask(&h, "10.0.0.1")).await.0.outcome());
        }
        assert_eq!(
            outcomes,
            [Outcome::Allowed, Outcome::Allowed, Outcome::Rejected]
        );
        clock.advance_us(1_000_000);
        assert_eq!(
            g.admit(route, &ask(&h, "10.0.0.1")).await.0.outcome(),
            Outcome::Allowed
        );
        assert_eq!(
            g.admit(route, &ask(&h, "10.0.0.2")).await.0.outcome(),
            Outcome::Allowed,
            "another client, another bucket"
        );
    }

    #[tokio::test]
    async fn a_failing_store_follows_each_on_redis_error_mode() {
        let h = HeaderMap::new();
        for (mode, want) in [
            ("open", vec![Outcome::FailOpen; 3]),
            ("closed", vec![Outcome::FailClosed; 3]),
            // Two proxies share the limit: this one's share of capacity 2 is 1.
            (
                "local",
                vec![
                    Outcome::LocalFallback,
                    Outcome::LocalRejected,
                    Outcome::LocalRejected,
                ],
            ),
        ] {
            let plan = plan(&format!("    on_redis_error: {mode}\n{TWO}"));
            let (g, _) = gate(|_| Down, false);
            let mut got = Vec::new();
            for _ in 0..3 {
                got.push(
                    g.admit(&plan.routes[0], &ask(&h, "10.0.0.1"))
                        .await
                        .0
                        .outcome(),
                );
            }
            assert_eq!(got, want, "{mode}");
        }
    }

    #[tokio::test]
    async fn shadow_limits_count_and_never_reject() {
        let plan = plan("    limits: [{ name: l, capacity: 1, refill: \"1/m\", shadow: true }]\n");
        let (g, _) = gate(memory, false);
        let h = HeaderMap::new();
        let route = &plan.routes[0];
        assert_eq!(
            g.admit(route, &ask(&h, "10.0.0.1")).await.0,
            Verdict::Pass(Outcome::Allowed, None)
        );
        assert_eq!(
            g.admit(route, &ask(&h, "10.0.0.1")).await.0,
            Verdict::Pass(Outcome::ShadowRejected, None),
            "proxied, without headers: clients never see a shadow limit"
        );
    }

    #[tokio::test]
    async fn the_allowlist_skips_the_limits() {
        let plan = plan(&format!(
            "    allow: {{ cidrs: [\"10.1.0.0/16\"], headers: {{ X-Internal: \"s3cret\" }} }}\n{TWO}"
        ));
        let (g, _) = gate(|_| Down, false);
        let route = &plan.routes[0];
        let mut h = HeaderMap::new();
        assert_eq!(
            g.admit(route, &ask(&h, "10.1.2.3")).await.0.outcome(),
            Outcome::Bypassed
        );
        h.insert("x-internal", "s3cret".parse().unwrap());
        assert_eq!(
            g.admit(route, &ask(&h, "192.0.2.1")).await.0.outcome(),
            Outcome::Bypassed
        );
        h.insert("x-internal", "guess".parse().unwrap());
        assert_eq!(
            g.admit(route, &ask(&h, "192.0.2.1")).await.0.outcome(),
            Outcome::FailOpen,
            "not allowlisted: the store is asked (and is down)"
        );
    }

    #[tokio::test]
    async fn a_missing_key_follows_on_missing_key() {
        let h = HeaderMap::new();
        for (policy, want) in [
            ("deny", Verdict::MissingKey(0)),
            ("skip", Verdict::Pass(Outcome::Allowed, None)),
        ] {
            let plan = plan(&format!(
                "    limits: [{{ name: l, capacity: 2, refill: \"1/s\", key: \"header:X-Key\", on_missing_key: {policy} }}]\n"
            ));
            let (g, _) = gate(memory, false);
            assert_eq!(
                g.admit(&plan.routes[0], &ask(&h, "10.0.0.1")).await.0,
                want,
                "{policy}"
            );
        }
    }

    #[tokio::test]
    async fn a_denial_is_repeated_from_the_cache_until_the_token_is_back() {
        let plan = plan("    limits: [{ name: l, capacity: 1, refill: \"1/s\" }]\n");
        let store = |clock: &Clocked| Counted {
            store: memory(clock),
            calls: AtomicUsize::new(0),
        };
        let (g, clock) = gate(store, true);
        let h = HeaderMap::new();
        let route = &plan.routes[0];
        assert_eq!(
            g.admit(route, &ask(&h, "10.0.0.1")).await.0.outcome(),
            Outcome::Allowed
        );
        for (waited, wait_us) in [(0, 1_000_000), (400_000, 600_000)] {
            clock.advance_us(waited);
            let (verdict, _) = g.admit(route, &ask(&h, "10.0.0.1")).await;
            let Verdict::Reject(Outcome::Rejected, d, _) = verdict else {
                panic!("denied until the token is back: {verdict:?}");
            };
            assert_eq!(d.limits[0].wait_us, wait_us, "counting down");
        }
        assert_eq!(
            g.limiter.calls.load(Ordering::SeqCst),
            1,
            "the store was asked once"
        );
        clock.advance_us(600_000);
        assert_eq!(
            g.admit(route, &ask(&h, "10.0.0.1")).await.0.outcome(),
            Outcome::Allowed
        );
        assert_eq!(g.limiter.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_failing_store_behind_the_cache_follows_the_route_mode() {
        let plan = plan(&format!("    on_redis_error: closed\n{TWO}"));
        let (g, _) = gate(|_| Down, true);
        let h = HeaderMap::new();
        assert_eq!(
            g.admit(&plan.routes[0], &ask(&h, "10.0.0.1")).await.0,
            Verdict::Unavailable
        );
    }
}
