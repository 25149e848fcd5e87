//! Redis failing for real: killed, paused, flushed, restarted. The proxy must keep answering within
//! its budget, follow each route's `on_redis_error`, and be right again once Redis is back.

use crate::scenarios::{Backend, Setup};
use crate::support::redis::RedisServer;
use crate::support::wait_for;
use std::time::{Duration, Instant};

const TIMEOUT_MS: u64 = 300;

/// Two routes on one Redis with a short budget: `open` fails open (the default), `closed` closed.
fn setup() -> Setup {
    let redis = RedisServer::start();
    let routes = "  - name: open
    match: { path_prefix: \"/open\" }
    upstream: \"{upstream}\"
    limits: [{ name: l, capacity: 100, refill: \"1/m\" }]
  - name: closed
    match: { path_prefix: \"/closed\" }
    upstream: \"{upstream}\"
    on_redis_error: closed
    limits: [{ name: l, capacity: 100, refill: \"1/m\" }]
";
    Setup::start_with_timeout(Backend::Redis(redis), routes, TIMEOUT_MS)
}

impl Setup {
    fn redis_ref(&self) -> &RedisServer {
        match &self.backend {
            Backend::Redis(r) => r,
            Backend::Memory => unreachable!("fault tests run on Redis"),
        }
    }

    fn redis(&mut self) -> &mut RedisServer {
        match &mut self.backend {
            Backend::Redis(r) => r,
            Backend::Memory => unreachable!("fault tests run on Redis"),
        }
    }
}

fn timed_get(s: &Setup, path: &str) -> (crate::support::http::Response, Duration) {
    let started = Instant::now();
    let r = s.proxy.get(path, &[]);
    (r, started.elapsed())
}

#[test]
fn redis_killed_fails_open_or_closed_per_route_without_waiting() {
    let mut s = setup();
    assert_eq!(s.proxy.get("/open", &[]).status, 200);
    assert_eq!(s.proxy.get("/closed", &[]).status, 200);
    assert_eq!(s.proxy.admin_get("/readyz").status, 200);

    s.redis().kill();
    let (r, took) = timed_get(&s, "/open");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        !r.has_ratelimit_headers(),
        "a fail-open response knows no state: {r:?}"
    );
    assert!(
        took < Duration::from_millis(TIMEOUT_MS + 1000),
        "took {took:?}"
    );
    let (r, took) = timed_get(&s, "/closed");
    assert_eq!(r.status, 503, "{r:?}");
    assert!(
        took < Duration::from_millis(TIMEOUT_MS + 1000),
        "took {took:?}"
    );

    assert_eq!(
        s.upstream.hits(),
        3,
        "fail-open reaches the upstream, fail-closed does not"
    );
    assert_eq!(s.proxy.decisions("open", "fail_open"), 1);
    assert_eq!(s.proxy.decisions("closed", "fail_closed"), 1);
    assert_eq!(s.proxy.decisions("open", "allowed"), 1);
    let errors = s
        .proxy
        .metric("ratelimit_redis_errors_total{kind=\"connection\"}");
    assert!(
        errors >= 2.0,
        "{errors}\n{}",
        s.proxy.admin_get("/metrics").body
    );
    assert_eq!(
        s.proxy.admin_get("/readyz").status,
        503,
        "a fail-closed route needs Redis"
    );
    assert_eq!(s.proxy.admin_get("/healthz").status, 200);
}

#[test]
fn redis_paused_times_out_within_the_budget_then_recovers() {
    let mut s = setup();
    assert_eq!(s.proxy.get("/open", &[]).status, 200);
    s.redis().pause();
    let (r, took) = timed_get(&s, "/open");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(!r.has_ratelimit_headers());
    // It waited for Redis (a timeout, not a fast failure), and not much longer than the budget.
    assert!(
        took >= Duration::from_millis(TIMEOUT_MS - 5),
        "took {took:?}"
    );
    assert!(
        took < Duration::from_millis(TIMEOUT_MS + 1000),
        "took {took:?}"
    );
    let (r, _) = timed_get(&s, "/closed");
    assert_eq!(r.status, 503);
    assert_eq!(
        s.proxy
            .metric("ratelimit_redis_errors_total{kind=\"timeout\"}"),
        2.0
    );
    assert_eq!(s.proxy.decisions("open", "fail_open"), 1);
    assert_eq!(s.proxy.decisions("closed", "fail_closed"), 1);

    s.redis().resume();
    let r = wait_for(
        "decisions from Redis again",
        Duration::from_secs(10),
        || {
            let r = s.proxy.get("/open", &[]);
            r.has_ratelimit_headers().then_some(r)
        },
    );
    assert_eq!(r.status, 200);
}

/// Requests that queue behind a call Redis does not answer keep their own budget: each is answered
/// `timeout_ms` after it arrived, not after the stuck call's budget plus its own.
#[test]
fn requests_queued_behind_a_stuck_call_keep_their_own_budget() {
    let mut s = setup();
    assert_eq!(s.proxy.get("/open", &[]).status, 200);
    s.redis().pause();
    std::thread::scope(|scope| {
        let first = scope.spawn(|| timed_get(&s, "/open"));
        // The first decision is on its way once the paused Redis holds it unread.
        wait_for(
            "the first call to reach the paused Redis",
            Duration::from_secs(10),
            || (s.redis_ref().waiting() > 0).then_some(()),
        );
        let queued: Vec<_> = (0..2)
            .map(|_| scope.spawn(|| timed_get(&s, "/open")))
            .collect();
        for h in std::iter::once(first).chain(queued) {
            let (r, took) = h.join().unwrap();
            assert_eq!(r.status, 200, "fail-open: {r:?}");
            // Behind the stuck call and then in a call of their own, they would take about
            // twice the budget.
            assert!(
                took < Duration::from_millis(TIMEOUT_MS + TIMEOUT_MS / 2),
                "took {took:?} for a budget of {TIMEOUT_MS} ms"
            );
        }
    });
    s.redis().resume();
}

#[test]
fn script_flush_and_restart_are_invisible_to_the_next_request() {
    let mut s = setup();
    assert_eq!(
        s.proxy.get("/open", &[]).header("x-ratelimit-remaining"),
        Some("99")
    );

    let _: () = s.redis().cmd(&["SCRIPT", "FLUSH"]);
    let r = s.proxy.get("/open", &[]);
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("98"),
        "the script reloaded, state intact: {r:?}"
    );

    s.redis().restart();
    let r = s.proxy.get("/open", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("99"),
        "a fresh Redis, a fresh bucket: {r:?}"
    );
    assert_eq!(
        s.proxy.decisions("open", "fail_open"),
        0,
        "no request failed over the restart"
    );
}

#[test]
fn exactly_one_evalsha_per_decision() {
    let mut s = setup();
    // The first call may load the script (NOSCRIPT, SCRIPT LOAD); count after it.
    assert_eq!(s.proxy.get("/open", &[]).status, 200);
    let _: () = s.redis().cmd(&["CONFIG", "RESETSTAT"]);
    for _ in 0..10 {
        assert_eq!(s.proxy.get("/open", &[]).status, 200);
    }
    let mut stats = s.redis().commandstats();
    assert_eq!(stats.remove("evalsha"), Some(10), "{stats:?}");
    // INFO counts the commands the script runs too: they are inside the one round trip.
    for in_script in ["hmget", "hset", "pexpire", "time"] {
        stats.remove(in_script);
    }
    stats.remove("config|resetstat");
    assert!(
        stats.is_empty(),
        "one round trip per decision and nothing else, but also: {stats:?}"
    );
    assert_eq!(
        s.proxy.metric("ratelimit_redis_duration_seconds_count"),
        11.0
    );
}

/// Something else wrote the client's bucket key (another type, a format this proxy cannot read).
/// The client is limited again at once (not let through on a fail-open route), the key gets a TTL,
/// and the operator hears of it: counted every time, logged once per key per minute.
#[test]
fn a_poisoned_bucket_key_heals_and_is_reported_once() {
    let mut s = setup();
    let key = "rl:{open:127.0.0.1}:l";
    for round in 1..=2 {
        let _: () = s.redis().cmd(&["SET", key, "written by someone else"]);
        let r = s.proxy.get("/open", &[]);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some("99"),
            "round {round}: decided from a full bucket, not failed open: {r:?}"
        );
        let ttl: i64 = s.redis().cmd(&["PTTL", key]);
        assert!(ttl > 0, "round {round}: the key expires again ({ttl})");
        assert_eq!(
            s.proxy.get("/open", &[]).header("x-ratelimit-remaining"),
            Some("98"),
            "round {round}: the bucket counts again"
        );
        assert_eq!(
            s.proxy
                .metric("ratelimit_redis_errors_total{kind=\"bad_state\"}"),
            f64::from(round)
        );
    }
    assert_eq!(s.proxy.decisions("open", "fail_open"), 0);
    let warnings = s
        .proxy
        .stderr()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(key))
        .count();
    assert_eq!(
        warnings,
        1,
        "once per key per minute:\n{}",
        s.proxy.stderr()
    );
}

/// Redis at `maxmemory` with `noeviction` refuses every write a decision needs. Each route follows
/// its `on_redis_error`, every failure is counted as `oom`, and the log says so once, not once per
/// request.
#[test]
fn redis_out_of_memory_is_counted_and_logged_once() {
    let mut s = setup();
    assert_eq!(s.proxy.get("/open", &[]).status, 200);
    let _: () = s
        .redis()
        .cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let _: () = s.redis().cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    for _ in 0..20 {
        let r = s.proxy.get("/open", &[("x-client", "new")]);
        assert_eq!(r.status, 200, "{r:?}");
    }
    assert_eq!(s.proxy.get("/closed", &[]).status, 503);
    assert_eq!(s.proxy.decisions("open", "fail_open"), 20);
    assert_eq!(
        s.proxy.metric("ratelimit_redis_errors_total{kind=\"oom\"}"),
        21.0
    );
    let log = s.proxy.stderr();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("oom"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(
        lines[0].contains("maxmemory"),
        "the line says why: {}",
        lines[0]
    );

    let _: () = s.redis().cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    let r = s.proxy.get("/open", &[]);
    assert!(r.has_ratelimit_headers(), "decided again: {r:?}");
}
