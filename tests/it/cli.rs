//! The command line as an operator meets it.

use crate::support::proxy::BIN;
use std::process::Command;

#[test]
fn check_accepts_a_valid_config() {
    let out = Command::new(BIN)
        .args(["--config", "config/routes.yaml", "--check"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "config/routes.yaml: ok (2 routes)");
    // The compiled route table follows, in the order routes are tried.
    assert_eq!(lines[1], "routes, tried in this order (first match wins):");
    assert!(
        lines[2].starts_with("  1. api: any method any host /api/* -> 127.0.0.1:8000"),
        "{stdout}"
    );
    assert!(stdout.contains("limit per_key: 100 tokens, refill 100/h, cost 1, per header:x-api-key (key missing: limit skipped)"), "{stdout}");
    assert!(
        stdout.contains("  2. everything-else: any method any host /* -> 127.0.0.1:8000"),
        "{stdout}"
    );
}

#[test]
fn check_lists_every_problem_and_fails() {
    let path = "tests/fixtures/config/several_problems.yaml";
    let out = Command::new(BIN)
        .args(["--config", path, "--check"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let fixture = std::fs::read_to_string(path).unwrap();
    let want: Vec<&str> = fixture
        .lines()
        .filter_map(|l| l.strip_prefix("# error: "))
        .collect();
    assert!(want.len() >= 3);
    assert_eq!(stderr.lines().collect::<Vec<_>>(), want);
}

#[test]
fn a_missing_config_file_is_named() {
    let out = Command::new(BIN)
        .args(["--config", "/nonexistent/routes.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("/nonexistent/routes.yaml: cannot read the config:"),
        "{stderr}"
    );
}

#[test]
fn version_and_help() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("ratelimit-proxy {}\n", env!("CARGO_PKG_VERSION"))
    );
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("--config <PATH>") && help.contains("--check"),
        "{help}"
    );
}

#[test]
fn sigterm_lets_the_request_in_flight_finish_then_exits_cleanly() {
    use crate::scenarios::{Backend, Setup};
    use crate::support::wait_for;
    use std::time::Duration;

    let routes = "  - name: api\n    upstream: \"{upstream}\"\n    limits: [{ name: l, capacity: 10, refill: \"1/s\" }]\n";
    let mut s = Setup::start_with_config(Backend::Memory, routes, "shutdown_grace_seconds: 2\n");
    let addr = s.proxy.addr;
    let in_flight = std::thread::spawn(move || crate::support::http::get(addr, "/slow", &[]));
    wait_for(
        "the upstream to receive the slow request",
        Duration::from_secs(10),
        || (s.upstream.hits() == 1).then_some(()),
    );
    let status = s.proxy.terminate(Duration::from_secs(10));
    assert!(status.success(), "{status}");
    let r = in_flight.join().unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, "hello from upstream\n");
}

/// Valid but almost surely a mistake: trusting every address as a proxy lets any client forge
/// `X-Forwarded-For`. `--check` accepts the file and says why it should not.
/// `--check` on a config file holding `yaml`: its output, and the file's path.
fn check(yaml: &str) -> (std::process::Output, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .arg("--check")
        .output()
        .unwrap();
    (out, path.display().to_string())
}

#[test]
fn check_warns_of_a_trusted_proxy_block_wider_than_a_slash_8() {
    let (out, path) = check(
        "listen: \"127.0.0.1:8080\"\ntrusted_proxies:\n  - \"10.0.0.0/8\"\n  - \"0.0.0.0/0\"\nroutes:\n  - { name: a, upstream: \"127.0.0.1:8000\" }\n",
    );
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "warning: {path}:4: trusted_proxies[1]: \"0.0.0.0/0\" trusts more than a /8 of IPv4 or a /32 of IPv6: \
             any client in it can forge X-Forwarded-For and get a fresh bucket per request; list only your \
             load balancers' addresses"
        )
    );
}

/// A document nested thousands of levels deep is refused at once, with one line.
#[test]
fn check_refuses_a_deeply_nested_document_with_one_line() {
    let (out, path) = check(&format!("listen: {}", "[".repeat(200_000)));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim_end(),
        format!("{path}:1: the document nests deeper than 64 levels; a config needs fewer than 10")
    );
}
