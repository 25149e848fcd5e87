//! Floods of client-chosen keys must not reset or switch off anybody's limits: spent buckets and
//! quotas survive a flood of junk keys in the in-memory store at its `max_keys`, and in an
//! evicting Redis; what one client address can make the store hold is bounded.

use crate::scenarios::{Backend, Setup};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Sends `n` requests to `path`, each with a fresh value of header `x-key`, from 4 threads;
/// returns how many got each status: (2xx, 429, other).
pub fn flood(s: &Setup, path: &str, n: u64, tag: &str) -> (u64, u64, u64) {
    let (ok, limited, other) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let next = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Relaxed);
                if i >= n {
                    break;
                }
                let key = format!("junk-{tag}-{i}");
                let status = s.proxy.get(path, &[("x-key", &key)]).status;
                match status {
                    200..=299 => ok.fetch_add(1, Relaxed),
                    429 => limited.fetch_add(1, Relaxed),
                    _ => other.fetch_add(1, Relaxed),
                };
            });
        }
    });
    (ok.into_inner(), limited.into_inner(), other.into_inner())
}

/// A bucket of one token an hour and a daily quota of one, both keyed on a header: a client
/// that spent them is refused for an hour / until midnight, whatever else happens.
pub const SPENDABLE: &str = "  - name: bucket
    match: { path_prefix: \"/b\" }
    upstream: \"{upstream}\"
    limits: [{ name: l, capacity: 1, refill: \"1/h\", key: \"header:x-key\" }]
  - name: quota
    match: { path_prefix: \"/q\" }
    upstream: \"{upstream}\"
    limits: [{ name: daily, quota: { amount: 1, period: day }, key: \"header:x-key\" }]
";

/// The victim spends its bucket and its quota: one 200 each, then 429.
pub fn spend(s: &Setup) {
    for path in ["/b", "/q"] {
        let victim = [("x-key", "victim")];
        assert_eq!(s.proxy.get(path, &victim).status, 200, "{path}");
        assert_eq!(s.proxy.get(path, &victim).status, 429, "{path}");
    }
}

/// What the victim gets after the flood: the statuses of one request on each route.
pub fn victim_after(s: &Setup) -> [u16; 2] {
    ["/b", "/q"].map(|path| s.proxy.get(path, &[("x-key", "victim")]).status)
}

#[test]
fn a_junk_key_flood_at_max_keys_never_gives_a_spent_key_its_budget_back() {
    // 1000 keys: 15 per shard (64 shards); the flood writes 2000 per route, ~60 per shard.
    let s = Setup::start_with_config(Backend::Memory, SPENDABLE, "memory: { max_keys: 1000 }\n");
    spend(&s);
    let (b_ok, _, b_other) = flood(&s, "/b", 2000, "b");
    let (q_ok, _, q_other) = flood(&s, "/q", 2000, "q");
    assert_eq!(
        victim_after(&s),
        [429, 429],
        "the spent bucket and quota must survive the flood\n{}",
        s.proxy.report()
    );
    // The store filled: new keys beyond it follow on_redis_error (open here), counted by cause.
    assert_eq!((b_ok, q_ok, b_other, q_other), (2000, 2000, 0, 0));
    let full = s
        .proxy
        .metric("ratelimit_store_failures_total{cause=\"store_full\",route=\"bucket\"}")
        + s.proxy
            .metric("ratelimit_store_failures_total{cause=\"store_full\",route=\"quota\"}");
    let fail_open =
        s.proxy.decisions("bucket", "fail_open") + s.proxy.decisions("quota", "fail_open");
    assert!(full >= 2000.0, "{full} store_full\n{}", s.proxy.report());
    assert_eq!(full as u64, fail_open);
    assert!(
        s.proxy.stderr().contains("in-memory store is full"),
        "the operator is told\n{}",
        s.proxy.report()
    );
}

/// The proxy's start says, in one line, when Redis may evict its keys, and what to set instead.
#[test]
fn the_start_warns_once_about_an_evicting_maxmemory_policy() {
    use crate::support::redis::RedisServer;
    for (policy, warned) in [("allkeys-lru", true), ("volatile-ttl", false)] {
        let redis = RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", policy]);
        let s = Setup::start(Backend::Redis(redis), SPENDABLE);
        let said = format!("Redis maxmemory-policy is {policy}");
        let stderr = crate::support::wait_for(
            "the eviction check's line",
            std::time::Duration::from_secs(10),
            || Some(s.proxy.stderr()).filter(|e| e.contains(&said)),
        );
        let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(&said)).collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        if warned {
            assert!(lines[0].contains("WARN"), "{}", lines[0]);
            assert!(
                lines[0].contains("set maxmemory-policy volatile-ttl")
                    && lines[0].contains("or noeviction"),
                "{}",
                lines[0]
            );
        } else {
            assert!(!lines[0].contains("WARN"), "{}", lines[0]);
        }
    }
}

/// `volatile-ttl` and `noeviction` are safe only because every key the proxy writes expires:
/// buckets in each format, quotas, and concurrency leases while held.
#[test]
fn every_key_the_proxy_writes_has_a_ttl() {
    use crate::support::redis::RedisServer;
    let routes = "  - name: kinds
    upstream: \"{upstream}\"
    limits:
      - { name: b, capacity: 5, refill: \"1/s\", key: \"header:x-key\" }
      - { name: q, quota: { amount: 5, period: month }, key: \"header:x-key\" }
      - { name: c, concurrency: 5, key: \"header:x-key\" }
";
    for format in ["hash", "packed", "packed_ttl"] {
        let redis = RedisServer::start();
        let top = format!(
            "redis:\n  url: \"{}\"\n  timeout_ms: 2000\n  state_format: {format}\n",
            redis.url()
        );
        let s = Setup::start_with_config(Backend::Redis(redis), routes, &top);
        assert_eq!(s.proxy.get("/", &[("x-key", "a")]).status, 200);
        // One request held at the upstream keeps its lease in the store.
        s.upstream.open(false);
        let held = std::thread::scope(|scope| {
            let req = scope.spawn(|| s.proxy.get("/hold", &[("x-key", "a")]).status);
            crate::support::wait_for(
                "the held request",
                std::time::Duration::from_secs(10),
                || (s.upstream.in_flight() == 1).then_some(()),
            );
            let Backend::Redis(redis) = &s.backend else {
                unreachable!()
            };
            let keys: Vec<String> = redis.cmd(&["KEYS", "rl:*"]);
            let ttls: Vec<(String, i64)> = keys
                .iter()
                .map(|k| (k.clone(), redis.cmd(&["PTTL", k])))
                .collect();
            s.upstream.open(true);
            assert_eq!(req.join().unwrap(), 200);
            ttls
        });
        assert_eq!(
            held.len(),
            3,
            "{format}: a bucket, a quota, a lease set: {held:?}"
        );
        assert!(held.iter().all(|(_, ttl)| *ttl > 0), "{format}: {held:?}");
    }
}

fn dbsize(s: &Setup) -> u64 {
    match &s.backend {
        Backend::Redis(r) => r.cmd(&["DBSIZE"]),
        Backend::Memory => unreachable!(),
    }
}

fn redis_top(s: &crate::support::redis::RedisServer, budget: &str) -> String {
    format!(
        "redis:\n  url: \"{}\"\n  timeout_ms: 2000\nnew_keys_per_client: {budget}\n",
        s.url()
    )
}

/// One address inventing keys: without a budget, Redis holds a key per request; with
/// `new_keys_per_client: 100/m`, at most the budget, and the rest of the flood is counted (and
/// limited) on one bucket of the address per limit.
#[test]
fn a_flood_from_one_address_creates_at_most_its_budget_of_keys() {
    use crate::support::redis::RedisServer;
    // 100 at once, then 100 a minute: the few seconds of the flood add a handful.
    for (budget, most) in [("off", None), ("100/m", Some(100 + 2 + 10))] {
        let redis = RedisServer::start();
        let top = redis_top(&redis, budget);
        let s = Setup::start_with_config(Backend::Redis(redis), SPENDABLE, &top);
        let (ok_b, limited_b, _) = flood(&s, "/b", 1000, "b");
        let (ok_q, limited_q, _) = flood(&s, "/q", 1000, "q");
        let keys = dbsize(&s);
        match most {
            None => {
                assert_eq!(keys, 2000, "a key per request");
                assert_eq!((ok_b, ok_q), (1000, 1000));
            }
            Some(most) => {
                assert!(keys <= most, "{keys} keys\n{}", s.proxy.report());
                // 100 new keys in all (and what refilled), then one bucket of the address per
                // route, of capacity 1: every key made is one admitted request.
                assert_eq!(ok_b + ok_q, keys, "{ok_b} + {ok_q}");
                assert_eq!(limited_b + limited_q, 2000 - keys);
            }
        }
        eprintln!("new_keys_per_client {budget}: {keys} keys after a 2,000-key flood");
    }
}

/// With an evicting Redis (`allkeys-lru`, a small `maxmemory`) a flood of fresh keys evicts a
/// victim's spent bucket and quota and gives them back; with the budget the flood cannot grow the
/// keyspace, so they survive (a flood from many addresses still can: set `volatile-ttl` or
/// `noeviction`, as the start warns).
#[test]
fn under_allkeys_lru_the_budget_keeps_a_victims_spent_bucket() {
    use crate::support::redis::RedisServer;
    for (budget, kept) in [("off", false), ("100/m", true)] {
        let redis =
            RedisServer::start_with(&["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"]);
        let top = redis_top(&redis, budget);
        let s = Setup::start_with_config(Backend::Redis(redis), SPENDABLE, &top);
        spend(&s);
        flood(&s, "/b", 6000, "b");
        flood(&s, "/q", 6000, "q");
        let evicted: String = match &s.backend {
            Backend::Redis(r) => r.cmd(&["INFO", "stats"]),
            Backend::Memory => unreachable!(),
        };
        let evicted = evicted
            .lines()
            .find_map(|l| l.strip_prefix("evicted_keys:"))
            .unwrap_or("?")
            .trim()
            .to_string();
        // This proxy's deny cache still refuses the victim; any other proxy of the fleet reads
        // Redis, where an evicted key is a full bucket and a fresh quota.
        let victim = ["rl:{bucket:victim}:l", "rl:{quota:victim}:daily@quota"];
        let held: Vec<bool> = match &s.backend {
            Backend::Redis(r) => victim
                .iter()
                .map(|k| r.cmd::<bool>(&["EXISTS", k]))
                .collect(),
            Backend::Memory => unreachable!(),
        };
        eprintln!(
            "new_keys_per_client {budget}: {evicted} keys evicted, the victim's kept: {held:?}"
        );
        assert_eq!(
            held,
            [kept, kept],
            "budget {budget}: {evicted} evicted\n{}",
            s.proxy.report()
        );
        assert_eq!(victim_after(&s), [429, 429]);
    }
}
