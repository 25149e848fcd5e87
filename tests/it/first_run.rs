//! What a new user meets first: the metrics of the mode they run, the shipped examples limiting
//! what the README's curl lines send, and a stop that does not keep them waiting.

use crate::support::proxy::Proxy;
use crate::support::upstream::Upstream;

/// An in-memory proxy exports no Redis metrics (a `ratelimit_redis_up 1` would tell a dashboard
/// about a Redis that is not there); its decisions and connections are there as always.
#[test]
fn an_in_memory_proxy_exports_only_what_applies() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&format!(
        "listen: \"{{listen}}\"\nadmin: \"{{admin}}\"\nroutes:\n  - name: api\n    upstream: \"{}\"\n    \
         limits: [{{ name: l, capacity: 5, refill: \"1/s\" }}]\n",
        upstream.addr
    ));
    assert_eq!(proxy.get("/x", &[]).status, 200);
    let text = proxy.admin_get("/metrics").body;
    for absent in [
        "ratelimit_redis_up",
        "ratelimit_redis_duration_seconds",
        "ratelimit_redis_errors_total",
        "ratelimit_redis_batch_size",
        "ratelimit_redis_breaker_transitions_total",
        "ratelimit_deny_cache_hits_total",
    ] {
        assert!(!text.contains(absent), "{absent} in:\n{text}");
    }
    assert!(text.contains("ratelimit_decisions_total{decision=\"allowed\",route=\"api\"} 1"));
    assert!(text.contains("ratelimit_connections_open"));
}

/// SIGTERM with nothing in flight exits at once, not after `shutdown_grace_seconds`; a kept-alive
/// connection between requests does not hold it (it is closed), while a request in flight still
/// finishes (`cli::sigterm_lets_the_request_in_flight_finish_then_exits_cleanly`).
#[test]
fn sigterm_with_nothing_in_flight_does_not_wait_the_grace_period() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let upstream = Upstream::start();
    let mut proxy = Proxy::start(&format!(
        "listen: \"{{listen}}\"\nadmin: \"{{admin}}\"\nshutdown_grace_seconds: 60\nroutes:\n  \
         - {{ name: api, upstream: \"{}\" }}\n",
        upstream.addr
    ));
    // One request on a connection that stays open, idle, afterwards.
    let mut idle = std::net::TcpStream::connect(proxy.addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    idle.write_all(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    let mut answer = [0u8; 512];
    let n = idle.read(&mut answer).unwrap();
    assert!(answer[..n].starts_with(b"HTTP/1.1 200"));

    let began = Instant::now();
    let status = proxy.terminate(Duration::from_secs(30));
    assert!(status.success(), "{status}");
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "waited {:?} of a 60 s grace period with nothing in flight",
        began.elapsed()
    );
    assert!(proxy.stderr().contains("no client connection left"));
}

/// The quick start's config limits what a new user sends: every method on `/api/`, curl -I and PUT
/// too (that keyless requests are not pooled in one bucket, `--check` shows: `cli`).
#[test]
fn the_quick_start_config_limits_every_method() {
    let upstream = Upstream::start();
    let yaml = std::fs::read_to_string("config/routes.yaml")
        .unwrap()
        .replace("127.0.0.1:8080", "{listen}")
        .replace("127.0.0.1:9090", "{admin}")
        .replace("127.0.0.1:8000", &upstream.addr.to_string());
    let proxy = Proxy::start(&yaml);
    let methods = ["HEAD", "PUT", "GET", "POST", "DELETE", "HEAD"];
    let statuses: Vec<u16> = methods
        .iter()
        .map(|m| crate::support::http::request(proxy.addr, m, "/api/hello", &[]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429], "{methods:?}");
    assert_eq!(proxy.decisions("api", "rejected"), 1);
}

/// The Redis example limits `curl localhost:8080/api/hello` (no Host rule hiding the route) and
/// listens on this host only.
#[test]
fn the_redis_example_limits_what_the_readme_sends() {
    let out = crate::support::proxy::check("config/routes-redis.yaml");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("api: any method any host /api/* -> 127.0.0.1:8000"),
        "{text}"
    );
    let yaml = std::fs::read_to_string("config/routes-redis.yaml").unwrap();
    assert!(yaml.contains("listen: [\"127.0.0.1:8080\"]"));
}
