//! `normalise`'s spelling table again over HTTP/2, cleartext (h2c) and inside TLS (ALPN h2), sent
//! byte for byte (`support::h2raw`), and the spellings HTTP/2 adds: a field value with whitespace
//! around it, which HTTP/1.1's parser trims and an HTTP/1.1 upstream reads as the same user
//! (RFC 9113 §8.2.1 makes it malformed), and the control bytes HTTP/1.1 refuses.
//!
//! A request HTTP/2 itself cannot carry (an absolute-form or empty `:path`, `Transfer-Encoding`, a
//! control byte) may be ended by the HTTP/2 layer (a stream reset, or GOAWAY for a byte HPACK
//! refuses) rather than by the proxy's counted 400: either way it is refused, routed nowhere and
//! never forwarded.

use crate::normalise::{served, ROUTES, ROUTE_NAMES};
use crate::support::h2raw::{self, Answer, Via};
use crate::support::proxy::Proxy;
use crate::support::tls::certificates;
use crate::support::upstream::Upstream;
use crate::support::wait_for;
use std::time::Duration;
use tempfile::TempDir;

/// `ratelimit_requests_refused_total`'s reasons.
const REASONS: [&str; 5] = [
    "bad_path",
    "bad_host",
    "duplicate_key_header",
    "bad_framing",
    "bad_header",
];

struct Setup {
    proxy: Proxy,
    upstream: Upstream,
    via: Via,
    /// The certificates of a TLS listener, for as long as it serves them.
    _certs: TempDir,
}

impl Setup {
    fn start(tls: bool) -> Setup {
        let upstream = Upstream::start();
        let certs = tempfile::tempdir().unwrap();
        let listen = if tls {
            certificates(certs.path());
            format!(
                "{{ address: \"{{listen}}\", tls: {{ cert_file: \"{}\", key_file: \"{}\" }} }}",
                certs.path().join("server.crt").display(),
                certs.path().join("server.key").display()
            )
        } else {
            "{ address: \"{listen}\", h2c: true }".to_string()
        };
        let yaml = format!(
            "listen:\n  - {listen}\nadmin: \"{{admin}}\"\nroutes:\n{}",
            ROUTES.replace("{upstream}", &upstream.addr.to_string())
        );
        let proxy = Proxy::start(&yaml);
        let via = match tls {
            true => Via::Tls(proxy.addr, certs.path().join("ca.crt")),
            false => Via::H2c(proxy.addr),
        };
        Setup {
            proxy,
            upstream,
            via,
            _certs: certs,
        }
    }

    /// Requests the proxy refused with its own 400, whatever the reason.
    fn refused(&self) -> u64 {
        REASONS.iter().map(|r| self.refused_for(r)).sum()
    }

    fn refused_for(&self, reason: &str) -> u64 {
        self.proxy.metric(&format!(
            "ratelimit_requests_refused_total{{reason=\"{reason}\"}}"
        )) as u64
    }
}

/// What one request did: how it was answered, the route that answered it, and what the upstream
/// received (target and Host), if it was forwarded.
#[derive(Debug, PartialEq)]
struct Seen {
    answer: Answer,
    route: Option<&'static str>,
    upstream: Option<(String, String)>,
    /// Counted in `ratelimit_requests_refused_total`.
    counted: bool,
}

/// One request: `:authority`, `:path`, then the fields, each as raw bytes.
struct Case {
    authority: Option<&'static str>,
    path: &'static str,
    fields: Vec<(&'static str, &'static [u8])>,
}

fn send(s: &Setup, case: &Case) -> Seen {
    let before_routes = served(&s.proxy);
    let before_hits = s.upstream.hits();
    let before_refused = s.refused();
    let fields: Vec<(&[u8], &[u8])> = case
        .fields
        .iter()
        .map(|(n, v)| (n.as_bytes(), *v))
        .collect();
    let answer = h2raw::get(
        &s.via,
        case.authority.map(str::as_bytes),
        case.path.as_bytes(),
        &fields,
    );
    // A forwarded request is counted on its route in `logging`, which may run a moment after
    // the client has its answer: wait for it (refusals before routing count on no route).
    let forwarded = s.upstream.hits() > before_hits;
    let after = wait_for("the route's count", Duration::from_secs(5), || {
        let after = served(&s.proxy);
        (!forwarded || after != before_routes).then_some(after)
    });
    let routes: Vec<&'static str> = ROUTE_NAMES
        .iter()
        .zip(before_routes.iter().zip(&after))
        .filter(|(_, (b, a))| a > b)
        .map(|(name, _)| *name)
        .collect();
    assert!(routes.len() <= 1, "{:?} counted on {routes:?}", case.path);
    let upstream = forwarded.then(|| {
        let target = s.upstream.targets().last().cloned().unwrap_or_default();
        let host = s.upstream.last_header("host").join(" | ");
        (target, host)
    });
    Seen {
        answer,
        route: routes.first().copied(),
        upstream,
        counted: s.refused() > before_refused,
    }
}

fn at(path: &'static str, user: &'static str) -> Case {
    Case {
        authority: Some("test.local"),
        path,
        fields: vec![("x-user", user.as_bytes())],
    }
}

fn with(
    authority: Option<&'static str>,
    path: &'static str,
    fields: &[(&'static str, &'static [u8])],
) -> Case {
    Case {
        authority,
        path,
        fields: fields.to_vec(),
    }
}

fn forwarded(route: &'static str, target: &str, host: &str) -> Expect {
    Expect::Seen(Seen {
        answer: Answer::Status(200),
        route: Some(route),
        upstream: Some((target.into(), host.into())),
        counted: false,
    })
}

/// What a case must do.
enum Expect {
    Seen(Seen),
    /// The proxy's 400, counted.
    Refused400,
    /// Refused by the proxy or by HTTP/2 itself: not routed, not forwarded.
    Refused,
}

fn table() -> Vec<(Case, Expect)> {
    use Expect::{Refused, Refused400};
    let h = "test.local";
    vec![
        // Spellings of /login: counted on login, and the upstream sees /login.
        (at("//login", "u1"), forwarded("login", "/login", h)),
        (at("/./login", "u1"), forwarded("login", "/login", h)),
        (at("/x/../login", "u1"), forwarded("login", "/login", h)),
        (at("/%6cogin", "u2"), forwarded("login", "/login", h)),
        (at("/%2e/login", "u2"), forwarded("login", "/login", h)),
        (
            with(
                Some("api.example.com"),
                "/api/../login",
                &[("x-user", b"u3")],
            ),
            forwarded("login", "/login", "api.example.com"),
        ),
        (
            at("/login?q=%2F&x=//y", "u3"),
            forwarded("login", "/login?q=%2F&x=//y", h),
        ),
        // Absolute form has no place in `:path` (RFC 9113 §8.3.1).
        (at("http://x.example//login", "u4"), Refused),
        // Targets with no canonical form.
        (at("\\login", "u5"), Refused),
        (at("/\\login", "u5"), Refused400),
        (at("login", "u5"), Refused),
        (at("/a%2fb", "u5"), Refused400),
        (at("/a%00b", "u5"), Refused400),
        (at("*", "u5"), Refused),
        (at("", "u5"), Refused),
        // Hosts: canonical for the rule, and for the upstream.
        (
            with(Some("api.example.com."), "/api/x", &[]),
            forwarded("api", "/api/x", "api.example.com"),
        ),
        (
            with(Some("API.Example.COM:8080"), "/api/x", &[]),
            forwarded("api", "/api/x", "api.example.com:8080"),
        ),
        (
            with(
                Some("api.example.com"),
                "/api/x",
                &[("host", b"api.example.com")],
            ),
            forwarded("api", "/api/x", "api.example.com"),
        ),
        (with(Some("api.example.com:abc"), "/api/x", &[]), Refused),
        (with(Some("api.example.com/x"), "/api/x", &[]), Refused),
        // A Host beside `:authority` that differs, two of them, or neither: Pingora's HTTP/2
        // server answers these 400s itself, before the proxy sees the request.
        (
            with(Some("api.example.com"), "/api/x", &[("host", b"other")]),
            Refused,
        ),
        (
            with(
                None,
                "/api/x",
                &[("host", b"api.example.com"), ("host", b"other")],
            ),
            Refused,
        ),
        (with(None, "/api/x", &[]), Refused),
        // A limit keyed on x-user sees one value, the one the upstream reads.
        (
            with(
                Some(h),
                "/login",
                &[("x-user", b"random"), ("x-user", b"u6")],
            ),
            Refused400,
        ),
        // Framing is HTTP/2's own: connection-specific fields are malformed.
        (
            with(
                Some(h),
                "/login",
                &[("x-user", b"u7"), ("transfer-encoding", b"chunked")],
            ),
            Refused,
        ),
        // Field values HTTP/1.1 would trim or refuse: malformed on HTTP/2 too.
        (at("/login", "victim "), Refused400),
        (at("/login", "\tvictim"), Refused400),
        (at("/login", " victim"), Refused400),
        (at("/login", "victim\t"), Refused400),
        (with(Some(h), "/other", &[("x-other", b"a ")]), Refused400),
        (
            with(Some(h), "/login", &[("x-user", b"vic\x00tim")]),
            Refused,
        ),
        (
            with(Some(h), "/login", &[("x-user", b"victim\r\nx-user: u8")]),
            Refused,
        ),
        (with(Some(h), "/login", &[("x-user", b"victim\n")]), Refused),
        (
            with(Some(h), "/login", &[("x-user", b"vic\x01tim")]),
            Refused,
        ),
        (
            with(Some(h), "/login", &[("x-user", b"vic\x7ftim")]),
            Refused,
        ),
        // Odd but valid values are keys like any other.
        (
            with(Some(h), "/login", &[("x-user", b"caf\xc3\xa9 {}}{ ~#")]),
            forwarded("login", "/login", h),
        ),
        // A route that must see the target as sent: routed on the canonical form all the same.
        (
            at("/raw/%7euser//x", "u9"),
            forwarded("raw", "/raw/%7euser//x", h),
        ),
        (
            at("//raw/./%7euser", "u9"),
            forwarded("raw", "//raw/./%7euser", h),
        ),
    ]
}

fn every_spelling(tls: bool) {
    let s = Setup::start(tls);
    let mut failures = Vec::new();
    for (case, want) in table() {
        let got = send(&s, &case);
        let ok = match &want {
            Expect::Seen(seen) => &got == seen,
            Expect::Refused400 => {
                got.answer == Answer::Status(400)
                    && got.counted
                    && got.upstream.is_none()
                    && got.route.is_none()
            }
            Expect::Refused => {
                got.answer.refused() && got.upstream.is_none() && got.route.is_none()
            }
        };
        if !ok {
            failures.push(format!(
                "{:?} {:?} {:?}\n  got {got:?}",
                case.authority,
                case.path,
                case.fields
                    .iter()
                    .map(|(n, v)| format!("{n}: {:?}", String::from_utf8_lossy(v)))
                    .collect::<Vec<_>>()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "over {:?}:\n{}",
        s.via,
        failures.join("\n")
    );
    assert_eq!(s.refused_for("bad_header"), 5);
    assert_eq!(s.refused_for("duplicate_key_header"), 1);
}

#[test]
fn every_spelling_is_counted_where_it_is_served_over_h2c() {
    every_spelling(false);
}

#[test]
fn every_spelling_is_counted_where_it_is_served_over_h2_with_tls() {
    every_spelling(true);
}

/// The attack of the issue: `victim` with a space or a tab around it bought a fresh bucket over
/// HTTP/2 while the upstream served the victim. Now it is refused, and the victim's bucket holds
/// on either protocol (HTTP/1.1 trims the value to `victim`).
fn whitespace_buys_no_bucket(tls: bool) {
    let s = Setup::start(tls);
    for _ in 0..3 {
        assert_eq!(
            send(&s, &at("/login", "victim")).answer,
            Answer::Status(200)
        );
    }
    for spelling in ["victim ", "\tvictim", "victim\t", " victim "] {
        let c = Case {
            authority: Some("test.local"),
            path: "/login",
            fields: vec![("x-user", spelling.as_bytes())],
        };
        assert_eq!(send(&s, &c).answer, Answer::Status(400), "{spelling:?}");
    }
    assert_eq!(
        send(&s, &at("/login", "victim")).answer,
        Answer::Status(429)
    );
    if !tls {
        let h1 = crate::support::http::send_raw(
            s.proxy.addr,
            b"GET /login HTTP/1.1\r\nHost: test.local\r\nX-User: \tvictim \r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        assert_eq!(h1.status, 429, "HTTP/1.1 trims to the same bucket: {h1:?}");
    }
    assert_eq!(s.upstream.hits(), 3, "only the three admitted reached it");
    assert_eq!(s.proxy.decisions("login", "allowed"), 3);
}

#[test]
fn whitespace_around_a_key_buys_no_bucket_over_h2c() {
    whitespace_buys_no_bucket(false);
}

#[test]
fn whitespace_around_a_key_buys_no_bucket_over_h2_with_tls() {
    whitespace_buys_no_bucket(true);
}
