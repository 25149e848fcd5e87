//! A limit that cannot be walked around: every spelling of a request that an attacker could use to
//! reach `/login` past its limit, sent through the real binary to a recording upstream. For each:
//! the status, the route it was counted on, and exactly what the upstream received.
//!
//! The layout is `config/routes-redis.yaml`'s: a limited `/login`, a host-ruled API, and a
//! catch-all route to the same upstream, where every spelling that missed `/login` used to land.

use crate::scenarios::{Backend, Setup};
use crate::support::http::{send_raw, Response};
use crate::support::proxy::Proxy;

pub(crate) const ROUTES: &str = "  - name: login
    match: { path_prefix: \"/login\" }
    upstream: \"{upstream}\"
    limits: [{ name: per_user, capacity: 3, refill: \"1/m\", key: \"header:X-User\" }]
  - name: api
    match: { path_prefix: \"/api/\", host: \"api.example.com\" }
    upstream: \"{upstream}\"
  - name: raw
    match: { path_prefix: \"/raw/\" }
    preserve_raw_path: true
    upstream: \"{upstream}\"
  - name: default
    upstream: \"{upstream}\"
";

pub(crate) const ROUTE_NAMES: [&str; 4] = ["login", "api", "raw", "default"];

/// Every response the proxy wrote, per route (`ratelimit_responses_total`).
pub(crate) fn served(proxy: &Proxy) -> Vec<u64> {
    ROUTE_NAMES
        .iter()
        .map(|r| {
            ["2xx", "4xx", "5xx"]
                .iter()
                .map(|c| {
                    proxy.metric(&format!(
                        "ratelimit_responses_total{{class=\"{c}\",route=\"{r}\"}}"
                    )) as u64
                })
                .sum()
        })
        .collect()
}

/// What one request did: its status, the route that answered it (none when refused before
/// routing), and what the upstream received (target and Host), if it was forwarded.
#[derive(Debug, PartialEq)]
struct Seen {
    status: u16,
    route: Option<&'static str>,
    upstream: Option<(String, String)>,
}

fn send(s: &Setup, raw: &str) -> (Seen, Response) {
    let before_routes = served(&s.proxy);
    let before_hits = s.upstream.hits();
    let r = send_raw(s.proxy.addr, raw.as_bytes()).unwrap_or_else(|e| panic!("{raw:?}: {e}"));
    let after = served(&s.proxy);
    let routes: Vec<&'static str> = ROUTE_NAMES
        .iter()
        .zip(before_routes.iter().zip(&after))
        .filter(|(_, (b, a))| a > b)
        .map(|(name, _)| *name)
        .collect();
    assert!(routes.len() <= 1, "{raw:?} counted on {routes:?}");
    let upstream = (s.upstream.hits() > before_hits).then(|| {
        let target = s.upstream.targets().last().cloned().unwrap_or_default();
        let host = s.upstream.last_header("host").join(" | ");
        (target, host)
    });
    let seen = Seen {
        status: r.status,
        route: routes.first().copied(),
        upstream,
    };
    (seen, r)
}

fn get(target: &str, headers: &str) -> String {
    format!("GET {target} HTTP/1.1\r\n{headers}Connection: close\r\n\r\n")
}

fn forwarded(status: u16, route: &'static str, target: &str, host: &str) -> Seen {
    Seen {
        status,
        route: Some(route),
        upstream: Some((target.into(), host.into())),
    }
}

fn refused() -> Seen {
    Seen {
        status: 400,
        route: None,
        upstream: None,
    }
}

#[test]
fn every_spelling_of_a_path_is_counted_where_it_is_served() {
    let s = Setup::start(Backend::Memory, ROUTES);
    let user = "Host: test.local\r\nX-User: u1\r\n";
    let h = "test.local";
    let cases: Vec<(String, Seen)> = vec![
        // Spellings of /login: counted on login, and the upstream sees /login.
        (get("//login", user), forwarded(200, "login", "/login", h)),
        (get("/./login", user), forwarded(200, "login", "/login", h)),
        (get("/x/../login", user), forwarded(200, "login", "/login", h)),
        (get("/%6cogin", "Host: test.local\r\nX-User: u2\r\n"), forwarded(200, "login", "/login", h)),
        (get("/%2e/login", "Host: test.local\r\nX-User: u2\r\n"), forwarded(200, "login", "/login", h)),
        (get("/api/../login", "Host: api.example.com\r\nX-User: u3\r\n"), forwarded(200, "login", "/login", "api.example.com")),
        (get("/login?q=%2F&x=//y", "Host: test.local\r\nX-User: u3\r\n"), forwarded(200, "login", "/login?q=%2F&x=//y", h)),
        // Absolute form: the host comes from the target, the upstream gets origin form.
        (get("http://x.example//login", "Host: x.example\r\nX-User: u4\r\n"), forwarded(200, "login", "/login", "x.example")),
        (
            get("HTTP://x.example.:80", "X-User: u4\r\n"),
            forwarded(200, "default", "/", "x.example:80"),
        ),
        (
            get("HTTP://x.example.:80", "X-User: u4\r\n"),
            forwarded(200, "default", "/", "x.example:80"),
        ),
        // Targets with no canonical form.
        (get("\\login", user), refused()),
        (get("/\\login", user), refused()),
        (get("login", user), refused()),
        (get("/a%2fb", user), refused()),
        (get("/a%00b", user), refused()),
        (get("*", user), refused()),
        ("GET  /login HTTP/1.1\r\nHost: test.local\r\nX-User: u5\r\nConnection: close\r\n\r\n".into(), refused()),
        // Hosts: canonical for the rule, and for the upstream.
        (get("/api/x", "Host: api.example.com.\r\n"), forwarded(200, "api", "/api/x", "api.example.com")),
        (get("/api/x", "Host: API.Example.COM:8080\r\n"), forwarded(200, "api", "/api/x", "api.example.com:8080")),
        (get("/api/x", "Host: api.example.com\r\n"), forwarded(200, "api", "/api/x", "api.example.com")),
        (get("/api/x", "Host: api.example.com:abc\r\n"), refused()),
        (get("/api/x", "Host: api.example.com/x\r\n"), refused()),
        (get("/api/x", "Host: api.example.com\r\nHost: other\r\n"), refused()),
        (get("/api/x", ""), refused()),
        (
            "GET /api/x HTTP/1.0\r\n\r\n".into(),
            Seen { status: 200, route: Some("default"), upstream: Some(("/api/x".into(), String::new())) },
        ),
        // A limit keyed on X-User sees one value, the one the upstream reads.
        (get("/login", "Host: test.local\r\nX-User: random\r\nX-User: u6\r\n"), refused()),
        // Content-Length: one value on to the upstream, or refused.
        (
            "POST /login HTTP/1.1\r\nHost: test.local\r\nX-User: u7\r\nContent-Length: 5, 5\r\nConnection: close\r\n\r\nhello".into(),
            forwarded(200, "login", "/login", h),
        ),
        ("POST /login HTTP/1.1\r\nHost: test.local\r\nX-User: u7\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!".into(), refused()),
        ("POST /login HTTP/1.1\r\nHost: test.local\r\nX-User: u7\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".into(), refused()),
        // A route that must see the target as sent: routed on the canonical form all the same.
        (get("/raw/%7euser//x", user), forwarded(200, "raw", "/raw/%7euser//x", h)),
        (get("//raw/./%7euser", user), forwarded(200, "raw", "//raw/./%7euser", h)),
    ];
    let mut failures = Vec::new();
    for (raw, want) in &cases {
        let (got, response) = send(&s, raw);
        if &got != want {
            failures.push(format!(
                "{raw:?}\n  want {want:?}\n  got  {got:?}\n  {response:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(s.upstream.last_header("content-length").len(), 0);

    let refused_for = |reason: &str| {
        s.proxy.metric(&format!(
            "ratelimit_requests_refused_total{{reason=\"{reason}\"}}"
        )) as u64
    };
    assert_eq!(refused_for("bad_path"), 7);
    assert_eq!(refused_for("bad_host"), 4);
    assert_eq!(refused_for("duplicate_key_header"), 1);
    assert_eq!(refused_for("bad_framing"), 2);
}

/// The body of a `Content-Length: 5, 5` request reaches the upstream framed by one value.
#[test]
fn a_repeated_content_length_goes_on_as_one_value() {
    let s = Setup::start(Backend::Memory, ROUTES);
    let (seen, _) = send(
        &s,
        "POST /login HTTP/1.1\r\nHost: test.local\r\nX-User: u\r\nContent-Length: 5, 5\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    );
    assert_eq!(seen.status, 200);
    assert_eq!(s.upstream.last_header("content-length"), ["5"]);
    assert_eq!(s.upstream.last_body(), b"hello");
}

/// The attacks of the issue, end to end: spelling `/login` differently buys no token, and a
/// second X-User header buys no bucket.
#[test]
fn a_limit_holds_whatever_the_spelling() {
    let s = Setup::start(Backend::Memory, ROUTES);
    let victim = "Host: test.local\r\nX-User: victim\r\n";
    let statuses: Vec<u16> = ["//login", "/./login", "/%6cogin", "/login"]
        .iter()
        .map(|p| send(&s, &get(p, victim)).0.status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    for i in 0..6 {
        let two = format!("Host: test.local\r\nX-User: random-{i}\r\nX-User: victim\r\n");
        assert_eq!(send(&s, &get("/login", &two)).0.status, 400);
    }
    assert_eq!(
        s.upstream.hits(),
        3,
        "three admitted, nothing else reached it"
    );
    assert_eq!(s.proxy.decisions("login", "allowed"), 3);
    assert_eq!(s.proxy.decisions("login", "rejected"), 1);
}

/// `path_escaped_slashes: keep` and `on_duplicate_key_header: first`, for upstreams that need them.
#[test]
fn escaped_slashes_and_repeated_key_headers_can_be_let_through() {
    let routes = "  - name: any
    upstream: \"{upstream}\"
    limits: [{ name: l, capacity: 10, refill: \"1/m\", key: \"header:X-User\", on_duplicate_key_header: first }]
";
    let s = Setup::start_with_config(Backend::Memory, routes, "path_escaped_slashes: keep\n");
    let r = send_raw(
        s.proxy.addr,
        get("/a%2fb/%5c", "Host: a\r\nX-User: 1\r\nX-User: 2\r\n").as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(s.upstream.targets(), ["/a%2Fb/%5C"]);
    assert_eq!(
        s.upstream.last_header("x-user"),
        ["1", "2"],
        "forwarded as sent"
    );
    assert_eq!(r.header("x-ratelimit-remaining"), Some("9"));
}
