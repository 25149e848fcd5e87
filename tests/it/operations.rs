//! Day-2 operations through the real binary: hot reload (file change and SIGHUP), a refused
//! reload, settings that need a restart, and Pingora's zero-downtime upgrade.

use crate::scenarios::{Backend, Setup};
use crate::support::redis::RedisServer;
use crate::support::wait_for;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn config(upstream: std::net::SocketAddr, section: &str, routes: &str) -> String {
    format!(
        "listen: \"{{listen}}\"\nadmin: \"{{admin}}\"\nshutdown_grace_seconds: 1\n{section}routes:\n{}",
        routes.replace("{upstream}", &upstream.to_string())
    )
}

const V1: &str = "  - name: api
    upstream: \"{upstream}\"
    limits: [{ name: burst, capacity: 3, refill: \"1/m\" }]
";

const V2: &str = "  - name: api
    match: { path_prefix: \"/api\" }
    upstream: \"{upstream}\"
    limits: [{ name: burst, capacity: 5, refill: \"1/m\" }]
  - name: health
    match: { path_prefix: \"/health\" }
    upstream: \"{upstream}\"
";

fn reloads(s: &Setup, result: &str) -> u64 {
    s.proxy.metric(&format!(
        "ratelimit_config_reloads_total{{result=\"{result}\"}}"
    )) as u64
}

fn reload_scenario(backend: Backend) {
    let section = backend.section(2000);
    let mut s = Setup::start_with_config(
        backend,
        V1,
        &format!("shutdown_grace_seconds: 1\n{section}"),
    );
    let r = s.proxy.get("/api/a", &[]);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("2"));
    let hash_before = s.proxy.admin_get("/metrics").body;

    // A valid change is picked up from the file: a new route, and a bigger bucket that keeps the
    // two tokens this client still holds (a fresh bucket would have 4 left after this request).
    s.proxy
        .rewrite_config(&config(s.upstream.addr, &section, V2));
    wait_for("the reload", Duration::from_secs(10), || {
        (reloads(&s, "success") == 1).then_some(())
    });
    assert_eq!(s.proxy.get("/health", &[]).status, 200);
    let r = s.proxy.get("/api/a", &[]);
    assert_eq!(r.header("x-ratelimit-limit"), Some("5"), "{r:?}");
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("1"),
        "bucket state survives the reload"
    );
    assert_eq!(s.proxy.metric("ratelimit_config_last_reload_success"), 1.0);
    let info = |body: &str| {
        body.lines()
            .find(|l| l.starts_with("ratelimit_config_info"))
            .map(str::to_string)
    };
    assert_ne!(
        info(&hash_before),
        info(&s.proxy.admin_get("/metrics").body),
        "the hash follows the file"
    );

    // An invalid change is refused with --check's messages, and the running config stays.
    let broken = config(s.upstream.addr, &section, V2).replace("capacity: 5", "capacity: 0");
    s.proxy.rewrite_config(&broken);
    wait_for("the refusal", Duration::from_secs(10), || {
        (reloads(&s, "failure") == 1).then_some(())
    });
    assert_eq!(s.proxy.metric("ratelimit_config_last_reload_success"), 0.0);
    let line = broken
        .lines()
        .position(|l| l.contains("capacity: 0"))
        .unwrap()
        + 1;
    let message = format!(
        "{}:{line}: route \"api\": routes[0].limits[0].capacity: must be an integer >= 1, got 0",
        s.proxy.config_path().display()
    );
    // The metric is counted just before the line is logged.
    wait_for("the refusal's message", Duration::from_secs(10), || {
        s.proxy.stderr().contains(&message).then_some(())
    });
    let r = s.proxy.get("/api/a", &[]);
    assert_eq!(
        r.header("x-ratelimit-limit"),
        Some("5"),
        "still the last good config"
    );
    assert_eq!(s.proxy.get("/health", &[]).status, 200);
    // Tried once, not at every poll: an absence needs time to show, here two more polls.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(reloads(&s, "failure"), 1);
}

#[test]
fn reload_applies_a_valid_change_keeps_state_and_refuses_an_invalid_one_on_redis() {
    reload_scenario(Backend::Redis(RedisServer::start()));
}

#[test]
fn reload_applies_a_valid_change_keeps_state_and_refuses_an_invalid_one_in_memory() {
    reload_scenario(Backend::Memory);
}

#[test]
fn sighup_reloads_and_live_only_settings_wait_for_a_restart() {
    let mut s = Setup::start_with_config(Backend::Memory, V1, "shutdown_grace_seconds: 1\n");
    // SIGHUP reloads even an unchanged file (the watcher would not).
    s.proxy.signal("-HUP");
    wait_for("the SIGHUP reload", Duration::from_secs(10), || {
        (reloads(&s, "success") == 1).then_some(())
    });

    let moved = config(s.upstream.addr, "", V1).replace("{listen}", "127.0.0.1:1");
    s.proxy.rewrite_config(&moved);
    s.proxy.signal("-HUP");
    wait_for("the second reload", Duration::from_secs(10), || {
        (reloads(&s, "success") >= 2).then_some(())
    });
    assert_eq!(
        s.proxy.get("/", &[]).status,
        200,
        "still serving on the old address"
    );
    let stderr = s.proxy.stderr();
    assert!(
        stderr.contains(
            "changed settings that need a restart to apply, still running the old values: listen"
        ),
        "{stderr}"
    );

    // Valid but likely a mistake: applied, and said.
    let trusting = config(s.upstream.addr, "trusted_proxies: [\"0.0.0.0/0\"]\n", V1);
    s.proxy.rewrite_config(&trusting);
    s.proxy.signal("-HUP");
    wait_for("the reload's warning", Duration::from_secs(10), || {
        s.proxy
            .stderr()
            .lines()
            .any(|l| {
                l.contains("WARN")
                    && l.contains("SIGHUP: ")
                    && l.contains("trusted_proxies[0]: \"0.0.0.0/0\" trusts more than a /8")
            })
            .then_some(())
    });
    assert_eq!(reloads(&s, "failure"), 0, "a warning refuses nothing");
}

/// A new process takes the listening sockets over (started with --upgrade, then SIGQUIT to the
/// old one): a client hammering the proxy throughout sees no failed request, and at most a
/// connection or two closed before its request was read (which clients retry).
#[test]
fn zero_downtime_upgrade_fails_no_request() {
    let routes = "  - name: api\n    upstream: \"{upstream}\"\n    limits: [{ name: l, capacity: 1000000, refill: \"1000/s\" }]\n";
    let backend = Backend::Redis(RedisServer::start());
    let top = format!("shutdown_grace_seconds: 1\n{}", backend.section(2000));
    let mut s = Setup::start_with_config(backend, routes, &top);

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, unread) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let client = {
        let (stop, ok, unread, addr) = (stop.clone(), ok.clone(), unread.clone(), s.proxy.addr);
        std::thread::spawn(move || {
            let request = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
            let mut failures = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let mut answer = crate::support::http::send_raw(addr, request);
                // Pingora closes, at its shutdown, a connection whose request it has not read yet
                // (a client's idle keep-alive, or one accepted in the old instance's last
                // instant): nothing was processed, and clients retry such a request. It counts,
                // but it is not a failed request. A second drop is.
                if answer
                    .as_ref()
                    .is_err_and(|e| e.to_string().contains("no status line in \"\""))
                {
                    unread.fetch_add(1, Ordering::SeqCst);
                    answer = crate::support::http::send_raw(addr, request);
                }
                match answer {
                    Ok(r) if r.status == 200 => {
                        ok.fetch_add(1, Ordering::SeqCst);
                    }
                    other => failures.push(format!("{other:?}")),
                }
            }
            failures
        })
    };
    wait_for("traffic", Duration::from_secs(10), || {
        (ok.load(Ordering::SeqCst) > 20).then_some(())
    });

    let mut next = s.proxy.start_upgrade();
    s.proxy.signal("-QUIT");
    let status = s.proxy.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "the old instance exits cleanly: {status}");
    // The new instance alone serves now.
    let served_before = ok.load(Ordering::SeqCst);
    wait_for(
        "traffic through the new instance",
        Duration::from_secs(10),
        || (ok.load(Ordering::SeqCst) > served_before + 20).then_some(()),
    );
    stop.store(true, Ordering::SeqCst);
    let failures = client.join().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} requests failed: {failures:?}\n{}",
        failures.len(),
        ok.load(Ordering::SeqCst),
        next.report()
    );
    let unread = unread.load(Ordering::SeqCst);
    assert!(
        unread <= 3,
        "{unread} connections closed unread: more than the hand-over instant explains"
    );
    assert_eq!(next.admin_get("/healthz").status, 200);
    // Every worker's socket was handed over and taken: none is left without an acceptor.
    let sockets = crate::support::sockets_per_address(1);
    assert_eq!(crate::support::listening_sockets(next.addr.port()), sockets);
    assert!(
        next.decisions("api", "allowed") > 20,
        "the new instance decides with Redis"
    );
    assert_eq!(next.decisions("api", "fail_open"), 0);
    next.terminate(Duration::from_secs(10));
}

/// An upgrade whose config adds a listener binds it with a socket per worker, as a start does,
/// and hands it on at the next upgrade with the others.
#[test]
fn an_upgrade_that_adds_a_listener_serves_it_and_hands_it_on() {
    let mut s = Setup::start_with_config(Backend::Memory, V1, "shutdown_grace_seconds: 1\n");
    // Two addresses now, each with its share of the hand-over (on a machine with many CPUs, the
    // first address's sockets beyond that share are closed).
    let sockets = crate::support::sockets_per_address(2);
    let added: std::net::SocketAddr = format!("127.0.0.1:{}", crate::support::free_port())
        .parse()
        .unwrap();
    let yaml = std::fs::read_to_string(s.proxy.config_path())
        .unwrap()
        .replace(
            &format!("listen: \"{}\"", s.proxy.addr),
            &format!("listen: [\"{}\", \"{added}\"]", s.proxy.addr),
        );
    assert!(yaml.contains(&added.to_string()), "{yaml}");
    s.proxy.rewrite_config(&yaml);

    let mut next = s.proxy.start_upgrade();
    s.proxy.signal("-QUIT");
    assert!(s.proxy.wait_exit(Duration::from_secs(30)).success());
    let serves = |addr| crate::support::http::get(addr, "/", &[]).status;
    assert_eq!(serves(added), 200, "{}", next.report());
    assert_eq!(crate::support::listening_sockets(added.port()), sockets);

    let mut third = next.start_upgrade();
    next.signal("-QUIT");
    assert!(next.wait_exit(Duration::from_secs(30)).success());
    assert_eq!(serves(added), 200, "{}", third.report());
    assert_eq!(serves(third.addr), 200);
    for port in [added.port(), third.addr.port()] {
        assert_eq!(crate::support::listening_sockets(port), sockets);
    }
    third.terminate(Duration::from_secs(10));
}
