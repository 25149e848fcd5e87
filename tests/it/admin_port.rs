//! The admin port is for operators: health probes are answered under a flood of idle and
//! trickling connections, a page of another origin cannot read it by DNS rebinding (Host check),
//! every answer carries the headers that keep a browser from framing, sniffing or caching it, and
//! a storm of store calls is refused beyond the admin's share while the proxy serves on.

use crate::scenarios::{Backend, Setup};
use crate::support::http::{request_to, Response};
use crate::support::proxy::Proxy;
use crate::support::redis::RedisServer;
use crate::support::upstream::Upstream;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROUTE: &str = "  - name: api\n    upstream: \"{upstream}\"\n    \
    limits: [{ name: per_key, capacity: 1000000, refill: \"1000000/s\", key: \"header:X-Api-Key\" }]\n";

/// One probe on a fresh connection, given `limit` to be answered: its status line, or why not.
fn probe(admin: SocketAddr, path: &str, limit: Duration) -> Result<String, String> {
    let mut c = TcpStream::connect_timeout(&admin, limit).map_err(|e| format!("connect: {e}"))?;
    c.set_read_timeout(Some(limit)).unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n");
    c.write_all(head.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = Vec::new();
    c.read_to_end(&mut answer)
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&answer);
    match text.lines().next() {
        Some(line) if !line.is_empty() => Ok(line.to_string()),
        _ => Err("closed without an answer".into()),
    }
}

fn p99(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[(samples.len() * 99 / 100).min(samples.len() - 1)]
}

/// 300 silent connections and 20 that trickle a head byte by byte take every place the admin
/// has (256); 60 `/healthz` and `/readyz` probes are then all answered, each within a second:
/// a newcomer sheds the connection that has waited longest for its head.
#[test]
fn health_probes_are_answered_under_a_flood_of_idle_connections() {
    let s = Setup::start(Backend::Memory, ROUTE);
    let admin = s.proxy.admin;
    let mut silent: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(admin).expect("connect"))
        .collect();
    let trickling: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(admin).expect("connect"))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let trickler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut conns = trickling;
            let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
            // Bounded: one byte each every 50 ms, for at most 30 s.
            for i in 0..600 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let byte = [head.get(i).copied().unwrap_or(b'a')];
                for c in &mut conns {
                    let _ = c.write_all(&byte);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    // The flood is in when a last connection past the cap is accepted or shed: the proxy has
    // seen all before it.
    let bound = Duration::from_secs(1);
    let mut failures = Vec::new();
    let mut times = Vec::new();
    for i in 0..60 {
        let path = if i % 2 == 0 { "/healthz" } else { "/readyz" };
        let began = Instant::now();
        match probe(admin, path, bound) {
            Ok(line) if line.starts_with("HTTP/1.1 200 ") => times.push(began.elapsed()),
            Ok(line) => failures.push(format!("{path}: {line}")),
            Err(why) => failures.push(format!("{path}: {why}")),
        }
        // Keep the flood at full strength: a shed connection is replaced.
        silent.retain_mut(|c| {
            c.set_nonblocking(true).unwrap();
            let gone = matches!(c.read(&mut [0u8; 1]), Ok(0));
            c.set_nonblocking(false).unwrap();
            !gone
        });
        while silent.len() < 300 {
            silent.push(TcpStream::connect(admin).expect("connect"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    trickler.join().unwrap();
    let slowest = times.iter().max().copied().unwrap_or_default();
    println!(
        "admin flood (320 idle or trickling connections): {}/60 probes answered, slowest {slowest:?}",
        times.len()
    );
    assert!(
        failures.is_empty(),
        "{} of 60 probes failed: {failures:#?}",
        failures.len()
    );
    assert!(slowest < bound);
}

/// A page on another origin that rebinds its name to the admin's address sends its own name as
/// Host: refused with 421, nothing of the config in the answer. The admin's own address and
/// loopback with its port are answered; health probes are answered whatever their Host.
#[test]
fn a_page_of_another_origin_cannot_read_the_admin() {
    let s = Setup::start(Backend::Memory, ROUTE);
    let admin = s.proxy.admin;
    let port = admin.port();
    let get = |host: &str, path: &str| request_to(admin, host, "GET", path, &[]);
    for host in [
        admin.to_string(),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ] {
        let r = get(&host, "/v1/routes");
        assert_eq!(r.status, 200, "{host}: {r:?}");
    }
    for host in [
        format!("evil.example:{port}"),
        "evil.example".into(),
        "localhost".into(),
        format!("localhost:{}", port.wrapping_add(1)),
    ] {
        for path in ["/v1/routes", "/metrics", "/", "/v1/status"] {
            let r = get(&host, path);
            assert_eq!(r.status, 421, "{host}{path}: {r:?}");
            assert!(!r.body.contains("api"), "nothing of the config: {r:?}");
        }
        assert_eq!(get(&host, "/healthz").status, 200, "{host}");
        assert_eq!(get(&host, "/readyz").status, 200, "{host}");
    }
}

/// `admin.allowed_hosts` names the admin is also reached by (Prometheus scraping `proxy:9090`):
/// a name alone with any port, a name with a port with that port only.
#[test]
fn the_names_of_allowed_hosts_are_answered() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&format!(
        "listen: \"{{listen}}\"\n\
         admin: {{ address: \"{{admin}}\", allowed_hosts: [\"admin.internal\", \"prom.internal:9443\"] }}\n\
         routes:\n{}",
        ROUTE.replace("{upstream}", &upstream.addr.to_string())
    ));
    let get = |host: &str| request_to(proxy.admin, host, "GET", "/v1/routes", &[]).status;
    for host in [
        "admin.internal",
        "ADMIN.internal.:1234",
        "prom.internal:9443",
    ] {
        assert_eq!(get(host), 200, "{host}");
    }
    for host in ["prom.internal", "prom.internal:9090", "other.internal"] {
        assert_eq!(get(host), 421, "{host}");
    }
}

/// Every admin answer carries the same four headers: the status page, JSON, metrics, errors, a
/// refused Host, and the 408 the connection layer writes itself.
#[test]
fn every_admin_answer_forbids_framing_sniffing_and_caching() {
    let s = Setup::start_with_config(
        Backend::Memory,
        ROUTE,
        "downstream: { header_timeout_ms: 300 }\n",
    );
    let admin = s.proxy.admin;
    let mut answers: Vec<(String, Response)> = [
        "/",
        "/v1/routes",
        "/v1/status",
        "/v1/top",
        "/metrics",
        "/healthz",
        "/readyz",
        "/nope",
        "/v1/buckets?route=nope",
    ]
    .iter()
    .map(|p| (p.to_string(), s.proxy.admin_get(p)))
    .collect();
    answers.push((
        "wrong Host".into(),
        request_to(admin, "evil.example", "GET", "/v1/routes", &[]),
    ));
    for (what, r) in &answers {
        let csp = r.header("content-security-policy").unwrap_or_default();
        assert!(csp.starts_with("default-src 'none'; "), "{what}: {r:?}");
        assert!(csp.contains("frame-ancestors 'none'"), "{what}: {csp}");
        assert_eq!(r.header("x-frame-options"), Some("DENY"), "{what}");
        assert_eq!(
            r.header("x-content-type-options"),
            Some("nosniff"),
            "{what}"
        );
        assert_eq!(r.header("cache-control"), Some("no-store"), "{what}");
    }
    // A head too slow: answered by the connection layer, with the same headers.
    let mut c = TcpStream::connect(admin).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
    for line in [
        "x-frame-options: DENY\r\n",
        "x-content-type-options: nosniff\r\n",
        "cache-control: no-store\r\n",
        "content-security-policy: default-src 'none'; ",
    ] {
        assert!(answer.contains(line), "{line:?} in {answer:?}");
    }
}

/// 16 clients hammer `GET /v1/buckets` (a Redis call each) while 300 proxied requests are timed:
/// beyond the admin's two store calls at once the storm is refused (429, `Retry-After: 1`), and
/// every proxied request succeeds. The p99s are printed beside each other.
#[test]
fn an_admin_storm_is_refused_beyond_its_share_and_the_proxy_serves_on() {
    let s = Setup::start(Backend::Redis(RedisServer::start()), ROUTE);
    let proxied = |n: usize| -> Vec<Duration> {
        (0..n)
            .map(|i| {
                let began = Instant::now();
                let r = s.proxy.get("/x", &[("X-Api-Key", &format!("k{}", i % 50))]);
                assert_eq!(r.status, 200, "{r:?}");
                began.elapsed()
            })
            .collect()
    };
    let quiet = p99(proxied(300));

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, refused, other) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let storm: Vec<_> = (0..16)
        .map(|_| {
            let (stop, ok, refused, other) =
                (stop.clone(), ok.clone(), refused.clone(), other.clone());
            let admin = s.proxy.admin;
            std::thread::spawn(move || {
                // Bounded: at most 100 000 calls a client, or until the measure is done.
                for _ in 0..100_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let r = request_to(
                        admin,
                        &admin.to_string(),
                        "GET",
                        "/v1/buckets?route=api&key=k1",
                        &[],
                    );
                    match r.status {
                        200 => ok.fetch_add(1, Ordering::Relaxed),
                        429 if r.header("retry-after") == Some("1") => {
                            refused.fetch_add(1, Ordering::Relaxed)
                        }
                        _ => other.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    // The storm is under way once its first answers are in.
    crate::support::wait_for("the storm", Duration::from_secs(10), || {
        (ok.load(Ordering::Relaxed) + refused.load(Ordering::Relaxed) > 50).then_some(())
    });
    let stormy = p99(proxied(300));
    stop.store(true, Ordering::Relaxed);
    for t in storm {
        t.join().unwrap();
    }
    let (ok, refused, other) = (
        ok.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        other.load(Ordering::Relaxed),
    );
    println!(
        "proxied p99: {quiet:?} quiet, {stormy:?} under an admin storm; storm: {ok} answered, \
         {refused} refused 429, {other} other"
    );
    assert_eq!(
        other, 0,
        "every storm call is answered or refused with Retry-After"
    );
    assert!(refused > 0, "the storm was refused beyond the cap");
    assert!(ok > 0, "the admin still answers its share");
}
