//! The gate on a driven clock, with the in-memory store standing in for Redis.

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

    async fn charge(&self, b: &[Bucket<'_>], amounts: &[i64]) -> Result<Decision, LimiterError> {
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
        reserved: &[],
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
