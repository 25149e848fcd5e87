//! Reaching a protected Redis: a least-privilege ACL user whose password comes from the
//! environment, and TLS verified against the operator's CA.

use crate::support::proxy::{Proxy, BIN};
use crate::support::redis::RedisServer;
use crate::support::upstream::Upstream;
use std::process::Command;

/// The password comes from the environment (`redis.password_env`), and the proxy needs no more
/// than this ACL: its keys, EVALSHA, SCRIPT LOAD, PING, and the commands the script runs in
/// either `state_format` (each also reads the other's buckets).
#[test]
fn a_least_privilege_acl_user_with_its_password_from_the_environment() {
    let redis = RedisServer::start_with(&["--requirepass", "admin-secret"]);
    let mut acl = vec![
        "ACL",
        "SETUSER",
        "limiter",
        "on",
        ">limiter-secret",
        "~rl:*",
    ];
    acl.extend(crate::support::redis::PROXY_ACL);
    let _: String = redis.cmd(&acl);
    let upstream = Upstream::start();
    let config = |url: &str, format: &str| {
        format!(
            "listen: \"{{listen}}\"\nadmin: \"{{admin}}\"\nredis:\n  url: \"{url}\"\n  password_env: RL_TEST_REDIS_PASSWORD\n  timeout_ms: 2000\n  state_format: {format}\n\
             routes:\n  - name: api\n    upstream: \"{}\"\n    on_redis_error: closed\n    limits: [{{ name: l, capacity: 3, refill: \"1/h\" }}]\n",
            upstream.addr
        )
    };
    let url = format!("{}?user=limiter", redis.url());
    let env = [("RL_TEST_REDIS_PASSWORD", "limiter-secret")];
    let hash = Proxy::start_with_env(&config(&url, "hash"), &env);
    let packed = Proxy::start_with_env(&config(&url, "packed"), &env);
    // Each step runs other commands (a closed route: a refused one is a 503): a new hash (HMGET,
    // EXISTS, HSET, PEXPIRE, TIME); packed over it (MGET, EXISTS, TYPE, HMGET, SET); a hash over
    // that (HMGET, GET, DEL, HSET, PEXPIRE); packed refusing from the hash.
    for (proxy, status, remaining) in [
        (&hash, 200, "2"),
        (&packed, 200, "1"),
        (&hash, 200, "0"),
        (&packed, 429, "0"),
    ] {
        let r = proxy.get("/", &[]);
        assert_eq!(
            (r.status, r.header("x-ratelimit-remaining")),
            (status, Some(remaining)),
            "{r:?}"
        );
    }
    assert_eq!(hash.admin_get("/readyz").status, 200);
    assert_eq!(packed.admin_get("/readyz").status, 200);

    // A wrong password is a failed decision like any other: this route fails closed.
    let wrong = Proxy::start_with_env(&config(&url, "hash"), &[("RL_TEST_REDIS_PASSWORD", "nope")]);
    assert_eq!(wrong.get("/", &[]).status, 503);
    assert_eq!(wrong.admin_get("/readyz").status, 503);
    assert_eq!(upstream.hits(), 3);
}

#[test]
fn a_missing_password_variable_stops_the_start_with_its_name() {
    let redis = RedisServer::start();
    let yaml = format!(
        "listen: \"127.0.0.1:1\"\nredis:\n  url: \"{}\"\n  password_env: RL_TEST_UNSET_VARIABLE\nroutes:\n  - {{ name: a, upstream: \"127.0.0.1:2\" }}\n",
        redis.url()
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .env_remove("RL_TEST_UNSET_VARIABLE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "redis.password_env names RL_TEST_UNSET_VARIABLE, which is not set in the environment"
        ),
        "{stderr}"
    );
}

#[test]
fn tls_to_redis_is_verified_against_the_configured_ca() {
    let dir = tempfile::tempdir().unwrap();
    crate::support::tls::certificates(dir.path());
    let tls_port = crate::support::free_port().to_string();
    let file = |name: &str| dir.path().join(name).display().to_string();
    let redis = RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &file("server.crt"),
        "--tls-key-file",
        &file("server.key"),
        "--tls-ca-cert-file",
        &file("ca.crt"),
        "--tls-auth-clients",
        "no",
    ]);
    let upstream = Upstream::start();
    let config = |ca: &str| {
        format!(
            "listen: \"{{listen}}\"\nadmin: \"{{admin}}\"\nredis:\n  url: \"rediss://127.0.0.1:{tls_port}\"\n{ca}  timeout_ms: 2000\n\
             routes:\n  - name: api\n    upstream: \"{}\"\n    on_redis_error: closed\n    limits: [{{ name: l, capacity: 2, refill: \"1/h\" }}]\n",
            upstream.addr
        )
    };
    let proxy = Proxy::start(&config(&format!("  tls_ca_file: \"{}\"\n", file("ca.crt"))));
    assert_eq!(
        proxy.get("/", &[]).header("x-ratelimit-remaining"),
        Some("1")
    );
    assert_eq!(proxy.get("/", &[]).status, 200);
    assert_eq!(proxy.get("/", &[]).status, 429);
    let keys: Vec<String> = redis.cmd(&["KEYS", "rl:*"]);
    assert_eq!(keys.len(), 1, "the buckets live in the TLS-served Redis");

    // Without the CA the server's certificate is not trusted: no decision, the route fails closed.
    let untrusting = Proxy::start(&config(""));
    assert_eq!(untrusting.get("/", &[]).status, 503);
    assert!(untrusting.metric("ratelimit_redis_errors_total{kind=\"connection\"}") >= 1.0);
}

/// Over TCP, with a password and a database number in the URL: the proxy's own connection
/// authenticates and selects the database before its first call (the other tests reach Redis
/// over a Unix socket), and a connection the server closed is replaced without failing a request.
#[test]
fn a_tcp_url_with_a_password_and_a_database_number() {
    let port = crate::support::free_port();
    let mut redis =
        RedisServer::start_with(&["--port", &port.to_string(), "--requirepass", "tcp-secret"]);
    let upstream = Upstream::start();
    let proxy = Proxy::start(&format!(
        "listen: \"{{listen}}\"\nadmin: \"{{admin}}\"\nredis:\n  url: \"redis://:tcp-secret@127.0.0.1:{port}/3\"\n  timeout_ms: 2000\n\
         routes:\n  - name: api\n    upstream: \"{}\"\n    on_redis_error: closed\n    limits: [{{ name: l, capacity: 10, refill: \"1/h\" }}]\n",
        upstream.addr
    ));
    // Several requests, so that each worker thread most likely has a connection open to be killed.
    let mut left = 10;
    let mut next = |proxy: &Proxy| {
        left -= 1;
        let r = proxy.get("/", &[]);
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(&*left.to_string()),
            "{r:?}"
        );
    };
    for _ in 0..4 {
        next(&proxy);
    }
    let in_db = |db: i64| -> i64 {
        let mut c = redis.connection().expect("connect to the test redis");
        let _: () = redis::cmd("SELECT").arg(db).query(&mut c).unwrap();
        redis::cmd("DBSIZE").query(&mut c).unwrap()
    };
    assert_eq!((in_db(0), in_db(3)), (0, 1), "the bucket lives in db 3");

    // Every connection the server has is closed under the proxy: the next decision still holds.
    let _: () = redis.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    for _ in 0..4 {
        next(&proxy);
    }
    redis.restart();
    assert_eq!(
        proxy.get("/", &[]).header("x-ratelimit-remaining"),
        Some("9"),
        "a full bucket again: the restarted server kept nothing"
    );
}
