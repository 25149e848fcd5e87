//! A Redis outage that costs nothing: the circuit breaker stops calling a dead Redis, the deny
//! cache answers exhausted clients without a round trip, and `on_redis_error: local` keeps
//! enforcing limits in process while Redis is away.

use crate::scenarios::{Backend, Setup};
use crate::support::redis::RedisServer;
use crate::support::wait_for;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

fn redis_of(s: &mut Setup) -> &mut RedisServer {
    match &mut s.backend {
        Backend::Redis(r) => r,
        Backend::Memory => unreachable!("these tests run on Redis"),
    }
}

fn timeouts(s: &Setup) -> f64 {
    s.proxy
        .metric("ratelimit_redis_errors_total{kind=\"timeout\"}")
}

#[test]
fn the_breaker_stops_calling_a_paused_redis_and_closes_when_it_answers_again() {
    let routes = "  - name: api\n    upstream: \"{upstream}\"\n    limits: [{ name: l, capacity: 1000, refill: \"1/m\" }]\n";
    let mut s = Setup::start_with_timeout(Backend::Redis(RedisServer::start()), routes, 200);
    assert_eq!(s.proxy.get("/", &[]).status, 200);
    assert_eq!(s.proxy.metric("ratelimit_redis_up"), 1.0);

    redis_of(&mut s).pause();
    // Three timeouts in a row open the breaker.
    for _ in 0..3 {
        assert_eq!(s.proxy.get("/", &[]).status, 200);
    }
    assert_eq!(timeouts(&s), 3.0);
    assert_eq!(s.proxy.metric("ratelimit_redis_up"), 0.0);
    assert_eq!(
        s.proxy
            .metric("ratelimit_redis_breaker_transitions_total{state=\"open\"}"),
        1.0
    );
    // While it is open, requests pass without a call: no new timeout is counted. (A probe may
    // go out after the 100 ms cool-down; it fails alone and doubles the cool-down.)
    for _ in 0..20 {
        let r = s.proxy.get("/", &[]);
        assert_eq!(r.status, 200);
        assert!(!r.has_ratelimit_headers());
    }
    let probes = s
        .proxy
        .metric("ratelimit_redis_breaker_transitions_total{state=\"half_open\"}");
    assert_eq!(
        timeouts(&s),
        3.0 + probes,
        "only probes reach a Redis known to be down"
    );
    assert!(probes <= 3.0, "{probes} probes in 20 quick requests");
    assert_eq!(s.proxy.decisions("api", "fail_open"), 23);

    redis_of(&mut s).resume();
    let r = wait_for(
        "a probe to close the breaker",
        Duration::from_secs(15),
        || {
            let r = s.proxy.get("/", &[]);
            r.has_ratelimit_headers().then_some(r)
        },
    );
    assert_eq!(r.status, 200);
    assert_eq!(s.proxy.metric("ratelimit_redis_up"), 1.0);
    assert_eq!(
        s.proxy
            .metric("ratelimit_redis_breaker_transitions_total{state=\"closed\"}"),
        1.0
    );
}

#[test]
fn an_exhausted_client_costs_no_evalsha_until_its_retry_instant() {
    let limit = "{ name: burst, capacity: 2, refill: \"1/m\" }";
    let routes = format!("  - name: api\n    upstream: \"{{upstream}}\"\n    limits: [{limit}]\n");
    let mut s = Setup::start(Backend::Redis(RedisServer::start()), &routes);
    assert_eq!(s.proxy.get("/", &[]).status, 200);
    // The admission that takes the last token already says the next request is denied.
    assert_eq!(s.proxy.get("/", &[]).status, 200);
    let _: () = redis_of(&mut s).cmd(&["CONFIG", "RESETSTAT"]);

    let mut retry_after = Vec::new();
    for _ in 0..20 {
        let r = s.proxy.get("/", &[]);
        assert_eq!(r.status, 429, "{r:?}");
        assert_eq!(
            r.header("ratelimit"),
            Some(format!("\"burst\";r=0;t={}", r.header("retry-after").unwrap()).as_str())
        );
        retry_after.push(r.header("retry-after").unwrap().parse::<u64>().unwrap());
    }
    assert!(
        retry_after.windows(2).all(|w| w[1] <= w[0]),
        "counts down: {retry_after:?}"
    );
    assert!(retry_after.iter().all(|&s| (1..=60).contains(&s)));
    let stats = redis_of(&mut s).commandstats();
    assert_eq!(
        stats.get("evalsha"),
        None,
        "no call for any denial: {stats:?}"
    );
    assert_eq!(
        s.proxy
            .metric("ratelimit_deny_cache_hits_total{route=\"api\"}"),
        20.0
    );
    assert_eq!(s.proxy.decisions("api", "rejected"), 20);
    assert_eq!(s.upstream.hits(), 2);

    // A reload that changes the limit invalidates the cached denial: the next request asks Redis,
    // which has refilled the faster bucket by now.
    let faster = routes.replace("refill: \"1/m\"", "refill: \"1000/s\"");
    let yaml = format!(
        "listen: \"{{listen}}\"\nadmin: \"{{admin}}\"\n{}routes:\n{}",
        s.backend.section(2000),
        faster.replace("{upstream}", &s.upstream.addr.to_string())
    );
    s.proxy.rewrite_config(&yaml);
    s.proxy.signal("-HUP");
    wait_for("the reload", Duration::from_secs(10), || {
        (s.proxy
            .metric("ratelimit_config_reloads_total{result=\"success\"}")
            >= 1.0)
            .then_some(())
    });
    let r = s.proxy.get("/", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(redis_of(&mut s).commandstats().get("evalsha"), Some(&1));
}

/// When a remembered denial runs out, the connections waiting on it must not all ask Redis at
/// once: one asks, the others take its answer.
#[test]
fn a_hot_key_costs_one_evalsha_per_token_however_many_connections_hammer_it() {
    let limit = "{ name: hot, capacity: 1, refill: \"20/s\" }";
    let routes = format!("  - name: api\n    upstream: \"{{upstream}}\"\n    limits: [{limit}]\n");
    let mut s = Setup::start(Backend::Redis(RedisServer::start()), &routes);
    assert_eq!(s.proxy.get("/", &[]).status, 200);
    let _: () = redis_of(&mut s).cmd(&["CONFIG", "RESETSTAT"]);

    // 16 connections at a time until a few tokens have come and gone (one every 50 ms).
    let (admitted, denied, sent) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|scope| {
        for _ in 0..16 {
            scope.spawn(|| {
                while admitted.load(Relaxed) < 5 && sent.fetch_add(1, Relaxed) < 20_000 {
                    match s.proxy.get("/", &[]).status {
                        200 => admitted.fetch_add(1, Relaxed),
                        429 => denied.fetch_add(1, Relaxed),
                        other => panic!("status {other}"),
                    };
                }
            });
        }
    });
    let (admitted, denied) = (admitted.into_inner(), denied.into_inner());
    assert!(
        admitted >= 5,
        "ran over several tokens: {admitted} admitted"
    );
    let calls = redis_of(&mut s)
        .commandstats()
        .get("evalsha")
        .copied()
        .unwrap_or(0);
    assert!(
        calls <= admitted + 1,
        "{calls} EVALSHA for {admitted} admitted and {denied} denied requests"
    );
    assert!(denied > 10 * calls, "{denied} denied, {calls} calls");
}

#[test]
fn local_fallback_keeps_limiting_while_redis_is_down() {
    let routes = "  - name: api
    upstream: \"{upstream}\"
    on_redis_error: local
    limits: [{ name: burst, capacity: 4, refill: \"1/m\" }]
";
    let backend = Backend::Redis(RedisServer::start());
    // Two proxies in the fleet: each enforces half of the limit alone.
    let top = format!("{}  fleet_size: 2\n", backend.section(500));
    let mut s = Setup::start_with_config(backend, routes, &top);
    assert_eq!(
        s.proxy.get("/", &[]).header("x-ratelimit-remaining"),
        Some("3")
    );

    redis_of(&mut s).kill();
    let r = s.proxy.get("/", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("1"),
        "a local bucket of 4 / 2 tokens"
    );
    assert_eq!(s.proxy.get("/", &[]).status, 200);
    let r = s.proxy.get("/", &[]);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(
        r.header("retry-after"),
        Some("120"),
        "2 tokens a minute across 2 proxies: 1 per 2 min here"
    );
    assert_eq!(s.proxy.decisions("api", "local_fallback"), 2);
    assert_eq!(s.proxy.decisions("api", "local_rejected"), 1);
    assert_eq!(s.proxy.decisions("api", "fail_open"), 0);
    assert_eq!(s.upstream.hits(), 3);
}
