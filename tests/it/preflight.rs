//! `--check --redis` against real redis-server processes: every check passes against a good one,
//! and the failing check is named, with exit 2, for a wrong password, an ACL user without EVALSHA,
//! and one without TIME when the clock is Redis's.

use crate::support::proxy::BIN;
use crate::support::redis::RedisServer;
use std::process::Command;

/// `--check --redis` on a config for `url` (password from RL_TEST_PREFLIGHT_PASSWORD when given):
/// exit code and stdout.
fn preflight(url: &str, password: Option<&str>, clock: &str) -> (i32, String) {
    preflight_routes(url, password, clock, ROUTE)
}

const ROUTE: &str = "{ name: a, upstream: \"127.0.0.1:2\" }";

/// The same with one route, YAML.
fn preflight_routes(url: &str, password: Option<&str>, clock: &str, route: &str) -> (i32, String) {
    preflight_writing(url, password, clock, "packed", route)
}

/// The same writing buckets as `format`.
fn preflight_writing(
    url: &str,
    password: Option<&str>,
    clock: &str,
    format: &str,
    route: &str,
) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.yaml");
    let password_env = if password.is_some() {
        "\n  password_env: RL_TEST_PREFLIGHT_PASSWORD"
    } else {
        ""
    };
    std::fs::write(
        &path,
        format!(
            "listen: \"127.0.0.1:1\"\nredis:\n  url: \"{url}\"{password_env}\n  clock: {clock}\n  \
             state_format: {format}\nroutes:\n  - {route}\n"
        ),
    )
    .unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("--config").arg(&path).args(["--check", "--redis"]);
    if let Some(p) = password {
        cmd.env("RL_TEST_PREFLIGHT_PASSWORD", p);
    }
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// The lines about Redis, in order.
fn redis_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with("redis ")).collect()
}

/// An ACL user with every command the proxy needs but `missing`.
fn user_without(redis: &RedisServer, name: &str, missing: &str) {
    let mut args = vec!["ACL", "SETUSER", name, "on", ">user-secret", "~rl:*"];
    args.extend(
        crate::support::redis::PROXY_ACL
            .iter()
            .filter(|c| **c != missing),
    );
    let _: String = redis.cmd(&args);
}

#[test]
fn every_check_passes_against_a_good_redis() {
    let redis = RedisServer::start();
    let (code, text) = preflight(&redis.url(), None, "redis");
    assert_eq!(code, 0, "{text}");
    let lines = redis_lines(&text);
    assert_eq!(lines.len(), 8, "{text}");
    assert!(lines.iter().all(|l| l.ends_with(": ok")), "{text}");
    assert!(lines[3].contains("written as packed"), "{text}");
    assert!(lines[5].contains("peek.lua"), "{text}");
    assert!(lines[6].contains("TIME"), "{text}");
    assert_eq!(
        lines[7], "redis maxmemory-policy (noeviction): ok",
        "{text}"
    );
}

/// A Redis that may evict the proxy's keys passes the check with one warning line naming the
/// policies to use; the two that never hand a spent budget back pass quietly.
#[test]
fn an_evicting_maxmemory_policy_is_warned_about_and_the_safe_ones_are_not() {
    for (policy, warned) in [
        ("allkeys-lru", true),
        ("allkeys-lfu", true),
        ("allkeys-random", true),
        ("volatile-lru", true),
        ("volatile-ttl", false),
        ("noeviction", false),
    ] {
        let redis = RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", policy]);
        let (code, text) = preflight(&redis.url(), None, "redis");
        assert_eq!(code, 0, "a warning does not fail the check: {text}");
        let lines = redis_lines(&text);
        let line = lines.last().unwrap();
        let head = format!("redis maxmemory-policy ({policy}): ");
        assert!(line.starts_with(&head), "{text}");
        if warned {
            assert!(line.contains("WARNING"), "{line}");
            assert!(line.contains("at maxmemory (67108864 bytes)"), "{line}");
            assert!(
                line.contains("set maxmemory-policy volatile-ttl")
                    && line.contains("or noeviction"),
                "{line}"
            );
            assert_eq!(text.matches("WARNING").count(), 1, "one line: {text}");
        } else {
            assert!(line.ends_with(": ok"), "{line}");
        }
    }
}

/// packed_ttl's second write is its own: it keeps the key's expiry, overwriting the value in place.
#[test]
fn packed_ttl_checks_the_write_that_keeps_an_expiry() {
    let redis = RedisServer::start();
    let (code, text) = preflight_writing(&redis.url(), None, "redis", "packed_ttl", ROUTE);
    assert_eq!(code, 0, "{text}");
    let lines = redis_lines(&text);
    assert!(lines.iter().all(|l| l.ends_with(": ok")), "{text}");
    assert!(lines[3].contains("written as packed_ttl"), "{text}");
    assert!(lines[4].contains("its expiry kept (SETRANGE)"), "{text}");
}

#[test]
fn a_wrong_password_fails_the_authenticated_check() {
    let redis = RedisServer::start_with(&["--requirepass", "right"]);
    let (code, text) = preflight(&redis.url(), Some("wrong"), "redis");
    assert_eq!(code, 2, "{text}");
    let lines = redis_lines(&text);
    assert!(lines[0].ends_with(": ok"), "{text}");
    assert!(
        lines[1].starts_with("redis authenticated: FAILED"),
        "{text}"
    );
    assert_eq!(lines.len(), 2, "nothing after a failed login: {text}");
}

/// `--check --redis` as an ACL user with every command the proxy needs but `missing`, under
/// `clock`: the exit code, the lines that failed, and the whole output.
fn as_user_without(missing: &str, clock: &str) -> (i32, Vec<String>, String) {
    let redis = RedisServer::start_with(&["--requirepass", "admin-secret"]);
    user_without(&redis, "limiter", missing);
    let url = format!("{}?user=limiter", redis.url());
    let (code, text) = preflight(&url, Some("user-secret"), clock);
    let failed = redis_lines(&text)
        .into_iter()
        .filter(|l| l.contains("FAILED"))
        .map(str::to_string)
        .collect();
    (code, failed, text)
}

#[test]
fn an_acl_user_without_evalsha_fails_that_check() {
    let (code, failed, text) = as_user_without("+evalsha", "proxy");
    assert_eq!(code, 2, "{text}");
    assert_eq!(failed.len(), 1, "{text}");
    assert!(failed[0].starts_with("redis EVALSHA"), "{text}");
    assert!(failed[0].to_lowercase().contains("evalsha"), "{text}");
}

#[test]
fn an_acl_user_without_time_fails_the_redis_clock_check() {
    let (code, failed, text) = as_user_without("+time", "redis");
    assert_eq!(code, 2, "{text}");
    assert_eq!(failed.len(), 1, "{text}");
    assert!(
        failed[0].starts_with("redis clock: redis (TIME in the script): FAILED"),
        "{text}"
    );
    // With the proxy's clock, TIME is never needed.
    let (code, failed, text) = as_user_without("+time", "proxy");
    assert_eq!((code, failed.len()), (0, 0), "{text}");
}

#[test]
fn an_acl_user_without_pttl_fails_only_the_admin_read() {
    let (code, failed, text) = as_user_without("+pttl", "proxy");
    assert_eq!(code, 2, "{text}");
    assert_eq!(failed.len(), 1, "{text}");
    assert!(failed[0].contains("peek.lua"), "{text}");
}

/// A concurrency route needs the sorted-set commands too: the lease is taken, renewed and
/// released for real, and an ACL user without them fails exactly the lease check.
#[test]
fn a_concurrency_route_checks_its_leases_under_acl() {
    let redis = RedisServer::start_with(&["--requirepass", "admin-secret"]);
    let route =
        "{ name: a, upstream: \"127.0.0.1:2\", limits: [{ name: inflight, concurrency: 2 }] }";
    let mut args = vec!["ACL", "SETUSER", "full", "on", ">user-secret", "~rl:*"];
    args.extend(crate::support::redis::PROXY_ACL);
    args.extend(crate::support::redis::LEASE_ACL);
    let _: String = redis.cmd(&args);
    let url = format!("{}?user=full", redis.url());
    let (code, text) = preflight_routes(&url, Some("user-secret"), "proxy", route);
    assert_eq!(code, 0, "{text}");
    let lines = redis_lines(&text);
    assert!(
        lines.iter().any(|l| l.contains("concurrency lease taken")),
        "{text}"
    );
    assert!(lines.iter().any(|l| l.contains("renew.lua")), "{text}");
    assert!(lines.iter().any(|l| l.contains("lease released")), "{text}");
    assert!(lines.iter().all(|l| l.ends_with(": ok")), "{text}");

    user_without(&redis, "buckets_only", "none");
    let url = format!("{}?user=buckets_only", redis.url());
    let (code, text) = preflight_routes(&url, Some("user-secret"), "proxy", route);
    assert_eq!(code, 2, "{text}");
    let failed: Vec<&str> = redis_lines(&text)
        .into_iter()
        .filter(|l| l.contains("FAILED"))
        .collect();
    assert_eq!(failed.len(), 1, "{text}");
    assert!(failed[0].contains("concurrency lease taken"), "{text}");
    assert!(failed[0].contains("can't run this command"), "{text}");
}
