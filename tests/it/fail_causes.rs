//! Every decision that follows `on_redis_error` is counted with its cause, and the circuit breaker
//! tells a slow Redis from a slow proxy: a paused Redis is a `timeout`, a proxy that was not
//! running when its requests' budgets ran out (SIGSTOP on the real process, as a starved box does
//! to it) is `proxy_late`, which the breaker does not count.

use crate::scenarios::{Backend, Setup};
use crate::support::redis::RedisServer;
use crate::support::wait_for;
use std::time::Duration;

const BUDGET_MS: u64 = 300;

fn setup() -> Setup {
    let routes = "  - name: api\n    upstream: \"{upstream}\"\n    limits: [{ name: l, capacity: 1000, refill: \"1/m\" }]\n";
    Setup::start_with_timeout(Backend::Redis(RedisServer::start()), routes, BUDGET_MS)
}

fn redis(s: &Setup) -> &RedisServer {
    match &s.backend {
        Backend::Redis(r) => r,
        Backend::Memory => unreachable!(),
    }
}

fn cause(s: &Setup, cause: &str) -> u64 {
    s.proxy.metric(&format!(
        "ratelimit_store_failures_total{{cause=\"{cause}\",route=\"api\"}}"
    )) as u64
}

#[test]
fn a_paused_redis_is_a_timeout_and_every_fail_open_has_its_cause() {
    let s = setup();
    assert_eq!(s.proxy.get("/", &[]).status, 200);
    redis(&s).pause();
    for _ in 0..8 {
        assert_eq!(s.proxy.get("/", &[]).status, 200);
    }
    redis(&s).resume();
    let fail_open = s.proxy.decisions("api", "fail_open");
    assert_eq!(fail_open, 8);
    assert!(
        cause(&s, "timeout") >= 3,
        "{}",
        s.proxy.admin_get("/metrics").body
    );
    assert!(
        cause(&s, "breaker_open") >= 1,
        "three timeouts open the breaker"
    );
    assert_eq!(cause(&s, "proxy_late"), 0);
    assert_eq!(
        cause(&s, "timeout") + cause(&s, "breaker_open"),
        fail_open,
        "{}",
        s.proxy.admin_get("/metrics").body
    );
}

#[test]
fn a_stopped_proxy_is_late_not_redis_and_the_breaker_stays_closed() {
    let s = setup();
    // Every worker thread has its connection and batch driver.
    for _ in 0..8 {
        assert_eq!(s.proxy.get("/", &[]).status, 200);
    }
    let r = redis(&s);
    r.pause();
    let statuses = std::thread::scope(|scope| {
        // A first wave puts a call out on the workers; a second queues behind those calls.
        let mut clients: Vec<_> = (0..2)
            .map(|_| scope.spawn(|| s.proxy.get("/", &[]).status))
            .collect();
        wait_for("a call at the paused Redis", Duration::from_secs(5), || {
            (r.waiting() > 0).then_some(())
        });
        clients.extend((0..8).map(|_| scope.spawn(|| s.proxy.get("/", &[]).status)));
        wait_for("every request in the proxy", Duration::from_secs(5), || {
            (s.proxy.metric("ratelimit_connections_open") >= 10.0).then_some(())
        });
        // The proxy stops running (as a starved process does) before any budget ran out; Redis
        // answers meanwhile, and the proxy resumes well past every budget.
        s.proxy.signal("-STOP");
        r.resume();
        std::thread::sleep(Duration::from_millis(3 * BUDGET_MS));
        s.proxy.signal("-CONT");
        clients
            .into_iter()
            .map(|c| c.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let metrics = s.proxy.admin_get("/metrics").body;
    assert_eq!(
        s.proxy
            .metric("ratelimit_redis_errors_total{kind=\"timeout\"}"),
        0.0,
        "Redis answered; the proxy was late\n{metrics}"
    );
    assert!(cause(&s, "proxy_late") >= 1, "{metrics}");
    assert_eq!(
        s.proxy
            .metric("ratelimit_redis_breaker_transitions_total{state=\"open\"}"),
        0.0
    );
    assert_eq!(s.proxy.metric("ratelimit_redis_up"), 1.0);
    assert_eq!(
        cause(&s, "proxy_late"),
        s.proxy.decisions("api", "fail_open"),
        "{metrics}"
    );
    assert!(s.proxy.stderr().contains("while the proxy itself ran late"));
}
