//! The features that fit the proxy to a real edge, end to end through the binary: client identity
//! behind trusted proxies, composite / query / path / method keys and their missing-key policy,
//! shadow limits, allowlists, the deny response, and upstream pools.

use crate::scenarios::{Backend, Setup};
use crate::support::free_port;
use crate::support::redis::RedisServer;

fn redis() -> Backend {
    Backend::Redis(RedisServer::start())
}

/// `top` before the routes, e.g. `trusted_proxies`.
fn setup(top: &str, routes: &str) -> Setup {
    let backend = redis();
    let top = format!("{top}{}", backend.section(2000));
    Setup::start_with_config(backend, routes, &top)
}

const PER_CLIENT: &str = "  - name: api
    upstream: \"{upstream}\"
    limits: [{ name: burst, capacity: 2, refill: \"1/h\" }]
";

#[test]
fn a_spoofed_forwarded_for_gets_no_new_bucket() {
    let s = setup("trusted_proxies: [\"127.0.0.1/32\"]\n", PER_CLIENT);
    // Our balancer (the test, at 127.0.0.1) appended what it saw: 203.0.113.5. The client wrote
    // the rest, and changes it at will.
    for forged in ["1.1.1.1", "2.2.2.2"] {
        let xff = format!("{forged}, 203.0.113.5");
        assert_eq!(s.proxy.get("/", &[("X-Forwarded-For", &xff)]).status, 200);
    }
    let r = s
        .proxy
        .get("/", &[("X-Forwarded-For", "9.9.9.9, 203.0.113.5")]);
    assert_eq!(r.status, 429, "the same client, whatever it prepends");
    assert_eq!(
        s.proxy
            .get("/", &[("X-Forwarded-For", "203.0.113.6")])
            .status,
        200,
        "another client"
    );

    // What the upstream was told about the last request it got.
    assert_eq!(
        s.upstream.last_header("x-forwarded-for"),
        ["203.0.113.6, 127.0.0.1"]
    );
    assert_eq!(s.upstream.last_header("x-forwarded-proto"), ["http"]);
    assert_eq!(s.upstream.last_header("x-forwarded-host"), ["test.local"]);
    assert_eq!(
        s.upstream.last_header("host"),
        ["test.local"],
        "Host goes through unchanged"
    );
}

#[test]
fn without_trusted_proxies_the_peer_is_the_client() {
    let s = setup("", PER_CLIENT);
    for forged in ["1.1.1.1", "2.2.2.2"] {
        assert_eq!(s.proxy.get("/", &[("X-Forwarded-For", forged)]).status, 200);
    }
    assert_eq!(
        s.proxy.get("/", &[("X-Forwarded-For", "3.3.3.3")]).status,
        429
    );
    // An untrusted peer's claims are passed on, with the peer appended, and its proto and host
    // claims are replaced by what the proxy saw.
    let r = s.proxy.get(
        "/",
        &[("X-Forwarded-Proto", "https"), ("X-Forwarded-Host", "evil")],
    );
    assert_eq!(r.status, 429);
    assert_eq!(
        s.upstream.last_header("x-forwarded-for"),
        ["2.2.2.2, 127.0.0.1"]
    );
}

#[test]
fn ipv6_clients_are_grouped_by_prefix() {
    let s = setup(
        "trusted_proxies: [\"127.0.0.1\"]\nclient_ipv6_prefix: 64\n",
        PER_CLIENT,
    );
    assert_eq!(
        s.proxy
            .get("/", &[("X-Forwarded-For", "2001:db8:1:2::1")])
            .status,
        200
    );
    assert_eq!(
        s.proxy
            .get("/", &[("X-Forwarded-For", "2001:db8:1:2:ffff::9")])
            .status,
        200
    );
    assert_eq!(
        s.proxy
            .get("/", &[("X-Forwarded-For", "2001:db8:1:2::77")])
            .status,
        429,
        "one /64, one bucket"
    );
    assert_eq!(
        s.proxy
            .get("/", &[("X-Forwarded-For", "2001:db8:1:3::1")])
            .status,
        200
    );
}

#[test]
fn composite_query_path_and_method_keys_separate_clients() {
    let routes = "  - name: composite
    match: { path_prefix: \"/c\" }
    upstream: \"{upstream}\"
    limits: [{ name: k, capacity: 1, refill: \"1/h\", key: [client_ip, \"header:X-Api-Key\"] }]
  - name: token
    match: { path_prefix: \"/t\" }
    upstream: \"{upstream}\"
    limits: [{ name: k, capacity: 1, refill: \"1/h\", key: \"query:token\", on_missing_key: deny }]
  - name: by_path
    match: { path_prefix: \"/p\" }
    upstream: \"{upstream}\"
    limits: [{ name: k, capacity: 1, refill: \"1/h\", key: [method, path] }]
  - name: optional
    match: { path_prefix: \"/o\" }
    upstream: \"{upstream}\"
    limits: [{ name: k, capacity: 1, refill: \"1/h\", key: \"header:X-User\", on_missing_key: skip }]
";
    let s = setup("", routes);
    let p = &s.proxy;
    assert_eq!(p.get("/c", &[("X-Api-Key", "a")]).status, 200);
    assert_eq!(p.get("/c", &[("X-Api-Key", "a")]).status, 429);
    assert_eq!(
        p.get("/c", &[("X-Api-Key", "b")]).status,
        200,
        "same address, another key"
    );

    assert_eq!(p.get("/t?token=x", &[]).status, 200);
    assert_eq!(p.get("/t?other=1&token=x", &[]).status, 429);
    assert_eq!(p.get("/t?token=y", &[]).status, 200);
    let r = p.get("/t", &[]);
    assert_eq!(
        r.status, 401,
        "deny: no token, no entry, and not a rate limit"
    );
    assert_eq!(
        r.body,
        "401 Unauthorized: limit \"k\" of route \"token\" needs a key this request does not carry\n"
    );
    assert!(!r.has_ratelimit_headers());
    assert_eq!(
        r.header("www-authenticate"),
        None,
        "the key is no bearer token"
    );

    assert_eq!(p.get("/p/a", &[]).status, 200);
    assert_eq!(p.get("/p/a", &[]).status, 429);
    assert_eq!(p.get("/p/b", &[]).status, 200);
    let post = crate::support::http::request(p.addr, "POST", "/p/a", &[("Content-Length", "0")]);
    assert_eq!(post.status, 200, "another method, another bucket");

    for _ in 0..3 {
        let r = p.get("/o", &[]);
        assert_eq!(
            r.status, 200,
            "skip: without the header the limit does not apply"
        );
        assert!(!r.has_ratelimit_headers());
    }
    assert_eq!(p.get("/o", &[("X-User", "u")]).status, 200);
    assert_eq!(p.get("/o", &[("X-User", "u")]).status, 429);
}

#[test]
fn shadow_limits_count_and_never_reject() {
    let routes = "  - name: trial
    match: { path_prefix: \"/trial\" }
    upstream: \"{upstream}\"
    shadow: true
    limits: [{ name: new_limit, capacity: 1, refill: \"1/h\" }]
  - name: mixed
    match: { path_prefix: \"/mixed\" }
    upstream: \"{upstream}\"
    limits:
      - { name: enforced, capacity: 10, refill: \"1/h\" }
      - { name: candidate, capacity: 1, refill: \"1/h\", shadow: true }
";
    let s = setup("", routes);
    for _ in 0..3 {
        let r = s.proxy.get("/trial", &[]);
        assert_eq!(r.status, 200);
        assert!(
            !r.has_ratelimit_headers(),
            "clients never see a shadow limit: {r:?}"
        );
    }
    assert_eq!(s.proxy.decisions("trial", "allowed"), 1);
    assert_eq!(s.proxy.decisions("trial", "shadow_rejected"), 2);

    for left in ["9", "8"] {
        let r = s.proxy.get("/mixed", &[]);
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(left),
            "the enforced limit decides"
        );
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("\"enforced\";q=10;w=36000")
        );
    }
    assert_eq!(s.proxy.decisions("mixed", "shadow_rejected"), 1);
    assert_eq!(s.upstream.hits(), 5);
}

#[test]
fn allowlisted_addresses_and_headers_bypass_the_limits() {
    let routes = "  - name: internal
    match: { path_prefix: \"/internal\" }
    upstream: \"{upstream}\"
    allow: { cidrs: [\"127.0.0.0/8\"] }
    limits: [{ name: l, capacity: 1, refill: \"1/h\" }]
  - name: partners
    match: { path_prefix: \"/partners\" }
    upstream: \"{upstream}\"
    allow: { headers: { X-Partner-Token: \"s3cret\" } }
    limits: [{ name: l, capacity: 1, refill: \"1/h\" }]
";
    let s = setup("", routes);
    for _ in 0..3 {
        let r = s.proxy.get("/internal", &[]);
        assert_eq!(r.status, 200);
        assert!(!r.has_ratelimit_headers());
    }
    assert_eq!(s.proxy.decisions("internal", "bypassed"), 3);
    for _ in 0..3 {
        assert_eq!(
            s.proxy
                .get("/partners", &[("X-Partner-Token", "s3cret")])
                .status,
            200
        );
    }
    assert_eq!(
        s.proxy
            .get("/partners", &[("X-Partner-Token", "guess")])
            .status,
        200
    );
    assert_eq!(
        s.proxy
            .get("/partners", &[("X-Partner-Token", "guess")])
            .status,
        429
    );
    assert_eq!(s.proxy.decisions("partners", "bypassed"), 3);
}

#[test]
fn deny_responses_follow_the_route_problem_json_included() {
    let routes = "  - name: json
    match: { path_prefix: \"/json\" }
    upstream: \"{upstream}\"
    deny: { format: problem_json }
    limits: [{ name: burst, capacity: 1, refill: \"1/m\" }]
  - name: custom
    match: { path_prefix: \"/custom\" }
    upstream: \"{upstream}\"
    deny: { status: 503, body: \"<h1>slow down</h1>\", content_type: \"text/html\" }
    limits: [{ name: burst, capacity: 1, refill: \"1/m\" }]
";
    let s = setup("", routes);
    assert_eq!(s.proxy.get("/json", &[]).status, 200);
    let r = s.proxy.get("/json", &[]);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.header("retry-after"), Some("60"));
    // serde_yaml reads JSON: the body must be a valid document with the draft's fields.
    let problem: serde_yaml::Value =
        serde_yaml::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body));
    assert_eq!(
        problem["type"].as_str(),
        Some("https://iana.org/assignments/http-problem-types#quota-exceeded")
    );
    assert_eq!(problem["status"].as_u64(), Some(429));
    assert_eq!(problem["violated-policies"][0].as_str(), Some("burst"));
    assert!(
        problem["title"].as_str().is_some()
            && problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains("retry in 60 s"))
    );
    assert_eq!(r.body.matches('{').count(), r.body.matches('}').count());

    assert_eq!(s.proxy.get("/custom", &[]).status, 200);
    let r = s.proxy.get("/custom", &[]);
    assert_eq!(
        (r.status, r.header("content-type"), r.body.as_str()),
        (503, Some("text/html"), "<h1>slow down</h1>")
    );
    assert_eq!(
        r.header("retry-after"),
        Some("60"),
        "the headers still say when to come back"
    );
}

#[test]
fn a_dead_upstream_in_a_pool_is_skipped_and_all_dead_is_a_quick_502() {
    let dead = format!("127.0.0.1:{}", free_port());
    let routes = format!(
        "  - name: pool
    match: {{ path_prefix: \"/pool\" }}
    upstream: [\"{dead}\", \"{{upstream}}\"]
    limits: [{{ name: l, capacity: 1000, refill: \"1/s\" }}]
  - name: gone
    match: {{ path_prefix: \"/gone\" }}
    upstream: [\"{dead}\"]
  - name: slow
    match: {{ path_prefix: \"/slow\" }}
    upstream: \"{{upstream}}\"
    read_timeout_ms: 200
"
    );
    let s = setup("", &routes);
    for _ in 0..10 {
        let r = s.proxy.get("/pool", &[]);
        assert_eq!(r.status, 200, "{r:?}");
        assert!(r.has_ratelimit_headers());
    }
    assert_eq!(s.upstream.hits(), 10);
    assert_eq!(
        s.proxy.decisions("pool", "allowed"),
        10,
        "a retry on the next upstream is not a second decision"
    );

    let r = s.proxy.get("/gone", &[]);
    assert_eq!(r.status, 502, "{r:?}");
    let r = s.proxy.get("/slow", &[]);
    assert_eq!(r.status, 504, "{r:?}");
    let class = |route: &str, class: &str| {
        s.proxy.metric(&format!(
            "ratelimit_responses_total{{class=\"{class}\",route=\"{route}\"}}"
        ))
    };
    assert_eq!(class("pool", "2xx"), 10.0);
    assert_eq!(class("gone", "5xx"), 1.0);
    assert_eq!(class("slow", "5xx"), 1.0);
}

/// An upstream that answers 503 to everything, counting what it is asked.
fn failing_upstream() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = asked.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf);
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = stream.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    (addr, asked)
}

#[test]
fn an_upstream_failing_its_health_check_gets_no_traffic() {
    let (sick, asked) = failing_upstream();
    let routes = format!(
        "  - name: pool
    upstream: [\"{sick}\", \"{{upstream}}\"]
    health_check: {{ path: /healthz, interval_ms: 100 }}
"
    );
    let s = setup("", &routes);
    // The checker marks a round's results before it probes again: a second probe means the
    // first one's 503 has taken the upstream out (the first alone may still be in flight).
    crate::support::wait_for(
        "a second health probe of the failing upstream",
        std::time::Duration::from_secs(10),
        || (asked.load(std::sync::atomic::Ordering::SeqCst) >= 2).then_some(()),
    );
    // Round robin alone would send every other request to the 503.
    for _ in 0..10 {
        let r = s.proxy.get("/", &[]);
        assert_eq!((r.status, r.body.as_str()), (200, "hello from upstream\n"));
    }
}
