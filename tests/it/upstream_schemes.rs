//! An `https://` upstream is reached over verified TLS (rustls server with a test CA): trusted with
//! `upstream_tls.ca_file` it serves and is rate limited as any other, and a certificate the proxy
//! cannot verify (system roots, wrong SNI) gets 502 with nothing reaching it; `--check` refuses a
//! bad scheme, misplaced `upstream_tls` and an unusable CA file, naming the field.

use crate::support::proxy::Proxy;
use crate::support::tls::certificates;
use crate::support::upstream::Upstream;
use crate::support::wait_for;
use std::path::Path;
use std::time::Duration;
use tempfile::TempDir;

/// A CA and a TLS upstream that serves the certificate it signed.
fn tls_upstream() -> (TempDir, Upstream) {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let upstream = Upstream::start_tls(
        &dir.path().join("server.crt"),
        &dir.path().join("server.key"),
    );
    (dir, upstream)
}

/// One route to `upstream` (as written), limited to one request per key an hour, with
/// `upstream_tls` (a YAML flow mapping) when given.
fn config(upstream: &str, upstream_tls: Option<String>) -> String {
    let tls = upstream_tls.map_or(String::new(), |t| format!("    upstream_tls: {t}\n"));
    format!(
        "listen: \"{{listen}}\"\nadmin: \"{{admin}}\"\nroutes:\n  - name: api\n    \
         upstream: \"{upstream}\"\n{tls}    \
         limits: [{{ name: per_key, capacity: 1, refill: \"1/h\", key: \"header:X-Api-Key\" }}]\n"
    )
}

fn ca(dir: &Path) -> String {
    format!("{{ ca_file: \"{}\" }}", dir.join("ca.crt").display())
}

#[test]
fn an_https_upstream_trusted_by_its_ca_is_served_and_limited() {
    let (dir, upstream) = tls_upstream();
    let port = upstream.addr.port();
    let proxy = Proxy::start(&config(
        &format!("https://127.0.0.1:{port}"),
        Some(ca(dir.path())),
    ));

    let r = proxy.get("/hello", &[("X-Api-Key", "alice")]);
    assert_eq!(
        (r.status, r.body.as_str()),
        (200, "hello from upstream\n"),
        "{r:?}"
    );
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"), "{r:?}");
    assert_eq!(upstream.hits(), 1);
    assert_eq!(upstream.targets(), ["/hello"]);

    let r = proxy.get("/hello", &[("X-Api-Key", "alice")]);
    assert_eq!(r.status, 429, "{r:?}");
    assert!(r.header("retry-after").is_some(), "{r:?}");
    assert_eq!(
        upstream.hits(),
        1,
        "the refused request never reached the upstream"
    );
}

#[test]
fn an_https_upstream_by_host_name_is_verified_for_that_name() {
    let (dir, upstream) = tls_upstream();
    let port = upstream.addr.port();
    let proxy = Proxy::start(&config(
        &format!("https://localhost:{port}"),
        Some(ca(dir.path())),
    ));
    let r = proxy.get("/hello", &[("X-Api-Key", "bob")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(upstream.hits(), 1);
}

#[test]
fn an_https_upstream_the_proxy_cannot_verify_gets_502_and_no_request() {
    let (dir, upstream) = tls_upstream();
    let port = upstream.addr.port();

    // The system roots do not trust the test CA.
    let proxy = Proxy::start(&config(&format!("https://localhost:{port}"), None));
    let r = proxy.get("/hello", &[("X-Api-Key", "carol")]);
    assert_eq!(r.status, 502, "{r:?}");
    logged(&proxy, "invalid peer certificate: UnknownIssuer");

    // Trusted CA, but the certificate does not carry the name asked for.
    let tls = format!(
        "{{ sni: \"wrong.example\", ca_file: \"{}\" }}",
        dir.path().join("ca.crt").display()
    );
    let proxy = Proxy::start(&config(&format!("https://localhost:{port}"), Some(tls)));
    let r = proxy.get("/hello", &[("X-Api-Key", "carol")]);
    assert_eq!(r.status, 502, "{r:?}");
    logged(&proxy, "certificate not valid for name \"wrong.example\"");

    assert_eq!(
        upstream.hits(),
        0,
        "no request went over an unverified connection"
    );
}

/// The proxy logs `what` (the reason a handshake failed: rustls's words, through Pingora's log).
fn logged(proxy: &Proxy, what: &str) {
    wait_for(what, Duration::from_secs(10), || {
        proxy.stderr().contains(what).then_some(())
    });
}

/// `--check` on `yaml`: exit code and stderr.
fn check(dir: &Path, yaml: &str) -> (Option<i32>, String) {
    let file = dir.join("routes.yaml");
    std::fs::write(
        &file,
        yaml.replace("{listen}", "127.0.0.1:8080")
            .replace("{admin}", "127.0.0.1:9091"),
    )
    .unwrap();
    let out = crate::support::proxy::check(&file);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn check_refuses_a_bad_scheme_misplaced_upstream_tls_and_an_unusable_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |yaml: String, parts: &[&str]| {
        let (code, stderr) = check(dir.path(), &yaml);
        assert_eq!(code, Some(2), "{stderr}");
        for part in parts {
            assert!(stderr.contains(part), "{part:?} not in {stderr}");
        }
    };

    refused(
        config("ftp://x:1", None),
        &[
            "routes[0].upstream: invalid upstream \"ftp://x:1\"",
            "must be \"http\", \"https\" or \"h2c\", got \"ftp\"",
        ],
    );
    refused(
        config("http://127.0.0.1:8000", Some(ca(dir.path()))),
        &["routes[0].upstream_tls: applies to https:// upstreams only"],
    );

    let missing = dir.path().join("missing.crt");
    refused(
        config(
            "https://127.0.0.1:8443",
            Some(ca(dir.path()).replace("ca.crt", "missing.crt")),
        ),
        &[
            "routes[0].upstream_tls.ca_file: cannot read",
            &missing.display().to_string(),
        ],
    );

    std::fs::write(dir.path().join("ca.crt"), "not a certificate\n").unwrap();
    refused(
        config("https://127.0.0.1:8443", Some(ca(dir.path()))),
        &["routes[0].upstream_tls.ca_file: no PEM certificate in"],
    );
}

/// A health check reaches an `https://` upstream as requests do (verified TLS), so a healthy one
/// stays up.
#[test]
fn a_health_check_probes_an_https_upstream_over_tls() {
    let (dir, upstream) = tls_upstream();
    let port = upstream.addr.port();
    let yaml = config(&format!("https://localhost:{port}"), Some(ca(dir.path()))).replace(
        "    limits:",
        "    health_check: { path: /healthz, interval_ms: 100 }\n    limits:",
    );
    let proxy = Proxy::start(&yaml);
    wait_for("two probes over TLS", Duration::from_secs(10), || {
        (upstream.hits() >= 2).then_some(())
    });
    assert_eq!(
        upstream.last_header("user-agent"),
        ["ratelimit-proxy-health"]
    );
    assert_eq!(upstream.targets()[0], "/healthz");
    assert!(
        !proxy.stderr().contains("failed its health check"),
        "{}",
        proxy.stderr()
    );
    assert_eq!(proxy.get("/hello", &[("X-Api-Key", "a")]).status, 200);
}
