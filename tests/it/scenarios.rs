//! What a user sees through the proxy, run against every store: one test body, each backend.

use crate::support::proxy::Proxy;
use crate::support::redis::RedisServer;
use crate::support::upstream::Upstream;

/// Where the buckets live for one test.
pub enum Backend {
    Redis(RedisServer),
    Memory,
}

impl Backend {
    /// The config's `redis:` section, or nothing for the in-memory store.
    pub fn section(&self, timeout_ms: u64) -> String {
        match self {
            Backend::Redis(r) => format!(
                "redis:\n  url: \"{}\"\n  timeout_ms: {timeout_ms}\n",
                r.url()
            ),
            Backend::Memory => String::new(),
        }
    }
}

/// A running proxy in front of a counting upstream, with `routes` (YAML, `{upstream}` filled in).
pub struct Setup {
    pub upstream: Upstream,
    pub proxy: Proxy,
    pub backend: Backend,
}

impl Setup {
    pub fn start(backend: Backend, routes: &str) -> Setup {
        // A budget no loaded CI machine misses on loopback: these tests are about answers.
        Setup::start_with_timeout(backend, routes, 2000)
    }

    pub fn start_with_timeout(backend: Backend, routes: &str, timeout_ms: u64) -> Setup {
        let section = backend.section(timeout_ms);
        Setup::start_with_config(backend, routes, &section)
    }

    /// `top` is YAML placed before `routes:` (store section, other top-level settings).
    pub fn start_with_config(backend: Backend, routes: &str, top: &str) -> Setup {
        let upstream = Upstream::start();
        let yaml = format!(
            "listen: \"{{listen}}\"\nadmin: \"{{admin}}\"\n{top}routes:\n{}",
            routes.replace("{upstream}", &upstream.addr.to_string())
        );
        let proxy = Proxy::start(&yaml);
        Setup {
            upstream,
            proxy,
            backend,
        }
    }
}

/// Runs each scenario against Redis and against the in-memory store.
macro_rules! every_backend {
    ($($name:ident),* $(,)?) => {
        mod redis_backend {
            $(#[test] fn $name() { super::$name(super::Backend::Redis(crate::support::redis::RedisServer::start())) })*
        }
        mod memory_backend {
            $(#[test] fn $name() { super::$name(super::Backend::Memory) })*
        }
    };
}

every_backend!(
    burst_then_429_with_every_header,
    refill_restores_tokens_after_the_advertised_wait,
    two_keys_do_not_interfere,
    the_tighter_of_two_limits_decides,
    cost_above_one,
    retry_after_is_the_wait_for_the_whole_cost,
    unmatched_requests_get_404_and_unlimited_routes_pass,
    a_daily_quota_refuses_until_midnight_utc,
);

const ONE_LIMIT: &str = "  - name: api
    upstream: \"{upstream}\"
    limits:
      - { name: burst, capacity: 3, refill: \"1/m\" }
";

/// Seconds from now to the next UTC midnight, and that midnight's date.
fn to_midnight() -> (u64, String) {
    use ratelimit_proxy::calendar::{civil_from_days, Period};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let end = Period::Day.end(now);
    let (y, m, d) = civil_from_days((end / 86_400_000_000) as i64);
    (
        (end - now).div_ceil(1_000_000),
        format!("{y:04}-{m:02}-{d:02}T00:00:00Z"),
    )
}

fn a_daily_quota_refuses_until_midnight_utc(backend: Backend) {
    let s = Setup::start(
        backend,
        "  - name: api
    upstream: \"{upstream}\"
    limits:
      - { name: daily, quota: { amount: 3, period: day }, key: \"header:x-api-key\" }
      - { name: monthly, quota: { amount: 100, period: month }, key: \"header:x-api-key\" }
",
    );
    let key = [("x-api-key", "sk_test_1")];
    let near = |got: Option<&str>, want: u64| {
        let got: u64 = got.expect("the header").parse().unwrap();
        got.abs_diff(want) <= 2
    };
    for remaining in [2, 1, 0] {
        let r = s.proxy.get("/x", &key);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(remaining.to_string().as_str())
        );
        let (secs, _) = to_midnight();
        assert!(near(r.header("x-ratelimit-reset"), secs), "{r:?}");
        let policy = r.header("ratelimit-policy").unwrap();
        assert!(
            policy.starts_with("\"daily\";q=3;w=86400, \"monthly\";q=100;w="),
            "{policy}"
        );
        let month_days: u64 = policy.rsplit("w=").next().unwrap().parse::<u64>().unwrap() / 86_400;
        assert!((28..=31).contains(&month_days), "{policy}");
    }
    let r = s.proxy.get("/x", &key);
    assert_eq!(r.status, 429, "{r:?}");
    let (secs, date) = to_midnight();
    assert!(near(r.header("retry-after"), secs), "{r:?}");
    assert!(
        r.body
            .contains("limit \"daily\" of route \"api\" is exhausted")
            && r.body
                .contains(&format!("(the quota is whole again at {date})")),
        "{}",
        r.body
    );
    // Another key has its own quota.
    assert_eq!(s.proxy.get("/x", &[("x-api-key", "sk_test_2")]).status, 200);
    assert_eq!(s.upstream.hits(), 4);
    assert_eq!(s.proxy.decisions("api", "rejected"), 1);
    // With Redis, the admission that spent the quota is remembered as the denial it implies,
    // until the boundary: both refusals were answered without a call.
    let again = s.proxy.get("/x", &key);
    assert_eq!(again.status, 429);
    assert!(
        near(again.header("retry-after"), to_midnight().0),
        "{again:?}"
    );
    if let Backend::Redis(_) = s.backend {
        assert_eq!(
            s.proxy
                .metric("ratelimit_deny_cache_hits_total{route=\"api\"}"),
            2.0
        );
    }
}

fn burst_then_429_with_every_header(backend: Backend) {
    let s = Setup::start(backend, ONE_LIMIT);
    // 1/m: one token per 60 s, so nothing refills during the test and every value is exact.
    for (remaining, reset) in [(2, 60), (1, 120), (0, 180)] {
        let r = s.proxy.get("/x", &[]);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.body, "hello from upstream\n");
        assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(remaining.to_string().as_str())
        );
        assert_eq!(
            r.header("x-ratelimit-reset"),
            Some(reset.to_string().as_str())
        );
        assert_eq!(r.header("ratelimit-policy"), Some("\"burst\";q=3;w=180"));
        assert_eq!(
            r.header("ratelimit"),
            Some(format!("\"burst\";r={remaining};t=60").as_str())
        );
        assert_eq!(r.header("retry-after"), None);
    }
    let r = s.proxy.get("/x", &[]);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.header("retry-after"), Some("60"));
    assert_eq!(r.header("ratelimit"), Some("\"burst\";r=0;t=60"));
    assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(r.header("x-ratelimit-reset"), Some("180"));
    assert_eq!(r.header("ratelimit-policy"), Some("\"burst\";q=3;w=180"));
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert!(
        r.body.contains("limit \"burst\" of route \"api\"") && r.body.contains("retry in 60 s"),
        "{}",
        r.body
    );

    assert_eq!(
        s.upstream.hits(),
        3,
        "the rejected request must not reach the upstream"
    );
    assert_eq!(s.proxy.decisions("api", "allowed"), 3);
    assert_eq!(s.proxy.decisions("api", "rejected"), 1);
    assert_eq!(s.proxy.decisions("api", "fail_open"), 0);
}

fn refill_restores_tokens_after_the_advertised_wait(backend: Backend) {
    // 4/s: a token every 250 ms.
    let s = Setup::start(backend, "  - name: api\n    upstream: \"{upstream}\"\n    limits:\n      - { name: fast, capacity: 2, refill: \"4/s\" }\n");
    let started = std::time::Instant::now();
    assert_eq!(s.proxy.get("/", &[]).status, 200);
    assert_eq!(s.proxy.get("/", &[]).status, 200);
    let rejected = s.proxy.get("/", &[]);
    if started.elapsed() < std::time::Duration::from_millis(240) {
        assert_eq!(rejected.status, 429, "{rejected:?}");
        assert_eq!(
            rejected.header("retry-after"),
            Some("1"),
            "250 ms, rounded up"
        );
    }
    // Poll until admitted again: never sooner than one token's worth of time.
    let readmitted = crate::support::wait_for(
        "a refilled token",
        std::time::Duration::from_secs(5),
        || {
            let r = s.proxy.get("/", &[]);
            (r.status == 200).then_some((r, started.elapsed()))
        },
    );
    let (r, at) = readmitted;
    assert!(
        at >= std::time::Duration::from_millis(250),
        "re-admitted after only {at:?}"
    );
    // One token came back and was spent, unless another refilled meanwhile.
    let remaining: u64 = r.header("x-ratelimit-remaining").unwrap().parse().unwrap();
    assert!(remaining <= 1, "{r:?}");
    assert_eq!(s.proxy.decisions("api", "allowed"), s.upstream.hits());
}

fn two_keys_do_not_interfere(backend: Backend) {
    let s = Setup::start(
        backend,
        "  - name: api\n    upstream: \"{upstream}\"\n    limits:\n      - { name: per_key, capacity: 2, refill: \"1/h\", key: \"header:X-Api-Key\" }\n",
    );
    let a = [("X-Api-Key", "alice")];
    let b = [("X-Api-Key", "bob")];
    assert_eq!(s.proxy.get("/", &a).status, 200);
    assert_eq!(s.proxy.get("/", &a).status, 200);
    assert_eq!(s.proxy.get("/", &a).status, 429);
    let r = s.proxy.get("/", &b);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"));
    // Absent and empty headers share one "missing" bucket, apart from every real key.
    assert_eq!(s.proxy.get("/", &[]).status, 200);
    assert_eq!(
        s.proxy
            .get("/", &[("X-Api-Key", "")])
            .header("x-ratelimit-remaining"),
        Some("0")
    );
    assert_eq!(s.proxy.get("/", &[]).status, 429);
    assert_eq!(
        s.proxy.get("/", &b).header("x-ratelimit-remaining"),
        Some("0")
    );
}

fn the_tighter_of_two_limits_decides(backend: Backend) {
    let s = Setup::start(
        backend,
        "  - name: api
    upstream: \"{upstream}\"
    limits:
      - { name: loose, capacity: 10, refill: \"1/m\" }
      - { name: tight, capacity: 2, refill: \"1/h\" }
",
    );
    let r = s.proxy.get("/", &[]);
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"), "{r:?}");
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"));
    // Every limit, the binding one first.
    assert_eq!(
        r.header("ratelimit"),
        Some("\"tight\";r=1;t=3600, \"loose\";r=9;t=60")
    );
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"loose\";q=10;w=600, \"tight\";q=2;w=7200")
    );
    assert_eq!(s.proxy.get("/", &[]).status, 200);
    let r = s.proxy.get("/", &[]);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("3600"));
    // The refusing limit first, its `t` the `Retry-After`; the loose one as it stands.
    let rl = r.header("ratelimit").unwrap();
    assert!(
        rl.starts_with("\"tight\";r=0;t=3600, \"loose\";r=8;t="),
        "{rl}"
    );
    // The rejection took nothing from the loose bucket: 8 left there, still 0 in the tight one.
    let r = s.proxy.get("/", &[]);
    assert_eq!((r.status, r.header("x-ratelimit-limit")), (429, Some("2")));
    assert_eq!(s.upstream.hits(), 2);
}

fn cost_above_one(backend: Backend) {
    let s = Setup::start(
        backend,
        "  - name: api\n    upstream: \"{upstream}\"\n    limits:\n      - { name: heavy, capacity: 5, refill: \"1/m\", cost: 2 }\n",
    );
    assert_eq!(
        s.proxy.get("/", &[]).header("x-ratelimit-remaining"),
        Some("3")
    );
    assert_eq!(
        s.proxy.get("/", &[]).header("x-ratelimit-remaining"),
        Some("1")
    );
    let r = s.proxy.get("/", &[]);
    assert_eq!(r.status, 429);
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("1"),
        "one token left, the request needs two"
    );
    assert_eq!(
        r.header("retry-after"),
        Some("60"),
        "one more token is a minute away"
    );
    assert_eq!(s.upstream.hits(), 2);
}

/// Cost 5 at 2 tokens/s: after two admissions the bucket is empty and the cost is 2.5 s away, not
/// the next token's 0.5 s. While the client waits, every 429 (from Redis's deny cache or the
/// in-memory store alike) counts `Remaining` up and `Retry-After` down, and the request is admitted
/// again no later than the instant the first 429 gave.
fn retry_after_is_the_wait_for_the_whole_cost(backend: Backend) {
    use std::time::{Duration, Instant};
    let s = Setup::start(
        backend,
        "  - name: api\n    upstream: \"{upstream}\"\n    limits:\n      - { name: heavy, capacity: 10, refill: \"2/s\", cost: 5 }\n",
    );
    let started = Instant::now();
    assert_eq!(s.proxy.get("/", &[]).status, 200);
    assert_eq!(s.proxy.get("/", &[]).status, 200);
    let first = s.proxy.get("/", &[]);
    assert_eq!(first.status, 429, "{first:?}");
    if started.elapsed() < Duration::from_millis(500) {
        assert_eq!(
            first.header("retry-after"),
            Some("3"),
            "2.5 s, rounded up: {first:?}"
        );
        assert_eq!(first.header("ratelimit"), Some("\"heavy\";r=0;t=3"));
    }
    let promised = Duration::from_secs(first.header("retry-after").unwrap().parse().unwrap());
    let refused_at = Instant::now();
    let (mut remaining, mut retry_after) = (0u64, u64::MAX);
    let admitted = crate::support::wait_for("admission again", Duration::from_secs(10), || {
        let r = s.proxy.get("/", &[]);
        if r.status == 200 {
            return Some(Instant::now());
        }
        assert_eq!(r.status, 429, "{r:?}");
        let now: u64 = r.header("x-ratelimit-remaining").unwrap().parse().unwrap();
        let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!(
            now >= remaining && now < 5,
            "Remaining counts up to the cost: {remaining} then {r:?}"
        );
        assert!(
            wait <= retry_after && wait >= 1,
            "Retry-After counts down: {retry_after} then {r:?}"
        );
        (remaining, retry_after) = (now, wait);
        None
    });
    assert!(
        admitted.duration_since(started) >= Duration::from_millis(2_500),
        "not before the whole cost was back"
    );
    assert!(
        admitted.duration_since(refused_at) <= promised,
        "admitted within the promised {promised:?}"
    );
    assert_eq!(remaining, 4, "the last 429s saw four tokens");
    assert_eq!(s.upstream.hits(), 3);
}

fn unmatched_requests_get_404_and_unlimited_routes_pass(backend: Backend) {
    let s = Setup::start(
        backend,
        "  - name: api
    match: { path_prefix: \"/api/\", methods: [GET] }
    upstream: \"{upstream}\"
    limits: [{ name: l, capacity: 1, refill: \"1/h\" }]
  - name: open
    match: { path_prefix: \"/open\" }
    upstream: \"{upstream}\"
",
    );
    assert_eq!(s.proxy.get("/nowhere", &[]).status, 404);
    assert_eq!(
        crate::support::http::request(s.proxy.addr, "POST", "/api/x", &[("Content-Length", "0")])
            .status,
        404
    );
    for _ in 0..3 {
        let r = s.proxy.get("/open/thing", &[]);
        assert_eq!(r.status, 200);
        assert!(!r.has_ratelimit_headers(), "{r:?}");
    }
    assert_eq!(s.upstream.hits(), 3);
}

/// Whatever a client sends, it gets a 4xx or a closed connection, and the proxy serves the next
/// request as before.
#[test]
fn hostile_requests_get_4xx_and_the_proxy_lives_on() {
    use crate::support::http::{send_raw, send_raw_half_closed};
    let redis = RedisServer::start();
    let s = Setup::start(Backend::Redis(redis), "  - name: api\n    upstream: \"{upstream}\"\n    limits:\n      - { name: k, capacity: 100, refill: \"1/s\", key: \"header:X-Api-Key\" }\n");
    let huge = "a".repeat(100_000);
    let binary_key =
        "GET / HTTP/1.1\r\nHost: x\r\nX-Api-Key: caf\u{e9} {}}{ ~#\r\nConnection: close\r\n\r\n";
    let long_key = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Api-Key: {}\r\nConnection: close\r\n\r\n",
        "k".repeat(10_000)
    );
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"\x00\x01\x02 not http at all\r\n\r\n".to_vec()),
        (
            "control bytes in a header",
            b"GET / HTTP/1.1\r\nHost: x\r\nX-Api-Key: \x01\x7f\r\n\r\n".to_vec(),
        ),
        ("bad request line", b"GET\r\n\r\n".to_vec()),
        ("bad version", b"GET / HTTP/9.9\r\nHost: x\r\n\r\n".to_vec()),
        (
            "huge header",
            format!("GET / HTTP/1.1\r\nHost: x\r\nX-Big: {huge}\r\n\r\n").into_bytes(),
        ),
        (
            "bad content-length",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n".to_vec(),
        ),
        ("truncated", b"GET / HTTP/1.1\r\nHost: x\r\n".to_vec()),
    ];
    for (what, raw) in cases {
        // A closed connection without a response is also an acceptable answer to garbage.
        if let Ok(r) = send_raw_half_closed(s.proxy.addr, &raw) {
            assert!((400..500).contains(&r.status), "{what}: {r:?}");
        }
        assert_eq!(
            s.proxy.get("/", &[]).status,
            200,
            "the proxy must survive {what:?}"
        );
    }
    // Odd but valid key values are limited like any other, in bounded keys.
    for raw in [binary_key.to_string(), long_key] {
        let r = send_raw(s.proxy.addr, raw.as_bytes()).unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("x-ratelimit-remaining"), Some("99"));
    }
    let Backend::Redis(redis) = &s.backend else {
        unreachable!()
    };
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert!(
        keys.iter()
            .all(|k| k.len() < 80 && k.matches('{').count() == 1),
        "{keys:?}"
    );
}
