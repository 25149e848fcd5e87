//! Redis Cluster and Sentinel, for real: limits hold on a cluster, across a resharded slot, and
//! across a primary killed under load (a replica promoted, the script reloaded on it).

use crate::support::cluster::{Cluster, Sentinels};
use crate::support::http::{self, Response};
use crate::support::proxy::Proxy;
use crate::support::upstream::Upstream;
use crate::support::wait_for;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

fn start_proxy(upstream: &Upstream, redis: &str, routes: &str) -> Proxy {
    Proxy::start(&format!(
        "listen: \"{{listen}}\"\nadmin: \"{{admin}}\"\nredis:\n{redis}  timeout_ms: 500\nroutes:\n{}",
        routes.replace("{upstream}", &upstream.addr.to_string())
    ))
}

const ROUTES: &str = "  - name: api
    match: { path_prefix: \"/api\" }
    upstream: \"{upstream}\"
    limits: [{ name: burst, capacity: 3, refill: \"1/h\", key: \"header:X-Client\" }]
  - name: load
    match: { path_prefix: \"/load\" }
    upstream: \"{upstream}\"
    limits: [{ name: l, capacity: 1000000, refill: \"1000/s\", key: route }]
";

/// 3 requests pass, the 4th is refused: the limit is enforced for client `who`.
fn assert_limited(proxy: &Proxy, who: &str) {
    for left in ["2", "1", "0"] {
        let r = proxy.get("/api", &[("X-Client", who)]);
        assert_eq!(
            (r.status, r.header("x-ratelimit-remaining")),
            (200, Some(left)),
            "{r:?}"
        );
    }
    assert_eq!(proxy.get("/api", &[("X-Client", who)]).status, 429);
}

/// Sends requests to `path` until stopped; returns every response.
fn load(addr: SocketAddr, path: &'static str, stop: Arc<AtomicBool>) -> JoinHandle<Vec<Response>> {
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            // The proxy may close a connection it was serving when the test stops it.
            match http::send_raw(
                addr,
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            ) {
                Ok(r) => seen.push(r),
                Err(_) if stop.load(Ordering::SeqCst) => break,
                Err(e) => panic!("GET {path}: {e}"),
            }
        }
        seen
    })
}

/// Waits for the new primary to decide again, stops the load, and checks every response it got.
fn settle_after_failover(proxy: &Proxy, stop: &AtomicBool, traffic: JoinHandle<Vec<Response>>) {
    let allowed_after = proxy.decisions("load", "allowed") + 20;
    wait_for(
        "decisions from the new primary",
        Duration::from_secs(30),
        || (proxy.decisions("load", "allowed") > allowed_after).then_some(()),
    );
    stop.store(true, Ordering::SeqCst);
    let seen = traffic.join().unwrap();
    assert_only_decisions_or_counted_fail_open(proxy, &seen);
}

/// Every response under load was a decision (headers) or a counted fail-open; never an error.
fn assert_only_decisions_or_counted_fail_open(proxy: &Proxy, seen: &[Response]) {
    assert!(
        seen.iter().all(|r| r.status == 200),
        "{:?}",
        seen.iter().find(|r| r.status != 200)
    );
    let headerless = seen.iter().filter(|r| !r.has_ratelimit_headers()).count() as u64;
    assert_eq!(proxy.decisions("load", "fail_open"), headerless);
    assert_eq!(
        proxy.metric("ratelimit_redis_errors_total{kind=\"script\"}"),
        0.0
    );
}

fn cluster_section(cluster: &Cluster) -> String {
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    format!("  cluster: [{}]\n", urls.join(", "))
}

#[test]
fn a_cluster_enforces_limits_and_survives_a_primary_killed_under_load() {
    let mut cluster = Cluster::start();
    let upstream = Upstream::start();
    let proxy = start_proxy(&upstream, &cluster_section(&cluster), ROUTES);
    assert_limited(&proxy, "alice");

    let slot: u16 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", "rl:{load}:l"]);
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = load(proxy.addr, "/load", stop.clone());
    wait_for("traffic", Duration::from_secs(10), || {
        (proxy.decisions("load", "allowed") > 20).then_some(())
    });

    let victim = cluster.primary_of(slot);
    cluster.nodes[victim].kill();
    wait_for(
        "a replica to take the slot over",
        Duration::from_secs(30),
        || {
            let healthy = cluster.is_healthy();
            (healthy && cluster.primary_of(slot) != victim).then_some(())
        },
    );
    settle_after_failover(&proxy, &stop, traffic);

    // The promoted replica never had the script loaded (scripts are not replicated): the proxy
    // loaded it on NOSCRIPT, then called it.
    let promoted = &cluster.nodes[cluster.primary_of(slot)];
    let stats = promoted.commandstats();
    assert!(
        stats.get("script|load").copied().unwrap_or(0) >= 1,
        "{stats:?}"
    );
    assert!(
        stats.get("evalsha").copied().unwrap_or(0) >= 20,
        "{stats:?}"
    );
    assert_limited(&proxy, "bob");
}

/// Packed buckets (`state_format: packed`): the script's `MGET` and `SET` follow the slot as the
/// hash commands do.
#[test]
fn a_slot_moved_under_load_keeps_its_bucket_exactly() {
    let cluster = Cluster::start();
    let upstream = Upstream::start();
    let routes = "  - name: load
    upstream: \"{upstream}\"
    limits: [{ name: l, capacity: 300, refill: \"1/h\", key: route }]
";
    let redis = format!("{}  state_format: packed\n", cluster_section(&cluster));
    let proxy = start_proxy(&upstream, &redis, routes);
    let slot: u16 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", "rl:{load}:l"]);

    let stop = Arc::new(AtomicBool::new(false));
    let traffic = load(proxy.addr, "/", stop.clone());
    wait_for("traffic", Duration::from_secs(10), || {
        (proxy.decisions("load", "allowed") > 50).then_some(())
    });
    let from = cluster.primary_of(slot);
    let to = (0..cluster.nodes.len())
        .find(|&i| i != from && cluster.primary_of_node(i))
        .expect("another primary");
    cluster.move_slot(slot, to);
    assert_eq!(cluster.primary_of(slot), to);
    wait_for("the bucket to run dry", Duration::from_secs(60), || {
        (proxy.decisions("load", "rejected") > 20).then_some(())
    });
    stop.store(true, Ordering::SeqCst);
    let seen = traffic.join().unwrap();

    assert!(
        seen.iter().all(|r| r.status == 200 || r.status == 429),
        "{:?}",
        seen.iter().find(|r| r.status >= 500)
    );
    assert_eq!(
        proxy.decisions("load", "fail_open"),
        0,
        "ASK and MOVED were followed, nothing failed"
    );
    assert_eq!(
        proxy.decisions("load", "allowed"),
        300,
        "exactly the capacity, across the move"
    );
    assert_eq!(upstream.hits(), 300);
    let kind: String = cluster.nodes[to].cmd(&["TYPE", "rl:{load}:l"]);
    assert_eq!(kind, "string", "the bucket is packed");
}

#[test]
fn sentinel_failover_under_load_finds_the_new_primary() {
    let mut topo = Sentinels::start();
    let upstream = Upstream::start();
    let nodes: Vec<String> = topo
        .sentinel_urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect();
    let section = format!(
        "  sentinel:\n    master: {}\n    nodes: [{}]\n",
        Sentinels::MASTER,
        nodes.join(", ")
    );
    let proxy = start_proxy(&upstream, &section, ROUTES);
    assert_limited(&proxy, "alice");

    let stop = Arc::new(AtomicBool::new(false));
    let traffic = load(proxy.addr, "/load", stop.clone());
    wait_for("traffic", Duration::from_secs(10), || {
        (proxy.decisions("load", "allowed") > 20).then_some(())
    });
    let old = topo.primary.port;
    topo.primary.kill();
    wait_for(
        "the sentinels to promote the replica",
        Duration::from_secs(60),
        || (topo.primary_port() == Some(topo.replica.port)).then_some(()),
    );
    assert_ne!(topo.primary_port(), Some(old));
    settle_after_failover(&proxy, &stop, traffic);
    assert!(
        topo.replica
            .commandstats()
            .get("evalsha")
            .copied()
            .unwrap_or(0)
            >= 20
    );
    assert_limited(&proxy, "bob");
}
