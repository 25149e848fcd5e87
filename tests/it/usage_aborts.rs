//! The attacks on usage charged from the response: a client that leaves before the usage goes
//! by must be charged all the same, or it gets answers for free. A key with a bucket of 100 tokens
//! (refill 1 an hour), a model that answers 50 tokens a request: whatever the client does, the
//! model is reached about twice, and every answer whose usage it sent is charged its 50 (the proxy
//! reads on after its client left, until it has the usage).
//!
//! Each attack is 30 requests, one after the other, each abandoned at one point of the answer
//! (`tests/fixtures/llm/abort_client.py`: HTTP/1.1 on a raw socket, closed or reset; HTTP/2 with
//! prior knowledge, RST_STREAM(CANCEL)); the test waits for each admitted one to be settled (its
//! usage charged, or counted unreported) before it sends the next. Then big answers: a 5 MiB JSON
//! body and a 10,000-event stream charged exactly, and the proxy's memory while 20 such answers
//! pass at once to slow readers or to clients that left.

use crate::llm_sdks::{post, FakeModel, Stats};
use crate::support::proxy::Proxy;
use crate::support::redis::RedisServer;
use crate::support::wait_for;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ABORT_CLIENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/llm/abort_client.py"
);
const KEY: &str = "sk-attacker";
const ROUTE: &str = "llm";

/// The route's one limit: 100 tokens, 1 back an hour, charged from `usage.total_tokens`.
const TOKENS: &str = "      - { name: tokens, capacity: 100, refill: \"1/h\", key: \"header:x-api-key\", charge_from_response: \"json:usage.total_tokens\" }\n";

/// Redis, the fake model, and the proxy (HTTP/1.1 and h2c on one listener) with one route to the
/// model whose limits are `limits` (YAML list items).
struct Rig {
    proxy: Proxy,
    model: FakeModel,
    _redis: RedisServer,
}

impl Rig {
    fn start(limits: &str) -> Rig {
        Rig::start_routes(&format!(
            "  - name: {ROUTE}\n    upstream: \"UPSTREAM\"\n    read_timeout_ms: 10000\n    limits:\n{limits}"
        ))
    }

    /// `routes` (YAML items) with `UPSTREAM` standing for the model's address.
    fn start_routes(routes: &str) -> Rig {
        let model = FakeModel::start();
        let redis = RedisServer::start();
        let yaml = format!(
            "listen:\n  - {{ address: \"{{listen}}\", h2c: true }}\nadmin: \"{{admin}}\"\n\
             redis:\n  url: \"{}\"\n  timeout_ms: 5000\n  clock: redis\non_redis_error: closed\nroutes:\n{}",
            redis.url(),
            routes.replace("UPSTREAM", &model.addr.to_string())
        );
        let proxy = Proxy::start(&yaml);
        Rig {
            proxy,
            model,
            _redis: redis,
        }
    }

    fn charged(&self, route: &str) -> f64 {
        self.proxy.metric(&format!(
            "ratelimit_usage_charged_total{{limit=\"tokens\",route=\"{route}\"}}"
        ))
    }

    fn unreported(&self, route: &str) -> f64 {
        self.proxy.metric(&format!(
            "ratelimit_usage_unreported_total{{limit=\"tokens\",route=\"{route}\"}}"
        ))
    }

    /// One request left at `at`; what the client saw.
    fn abort(&self, proto: &str, at: &str, reset: bool, body: &str) -> Value {
        let mut cmd = Command::new("python3");
        cmd.arg(ABORT_CLIENT)
            .arg(self.proxy.addr.to_string())
            .args(["--proto", proto, "--at", at, "--wait-ms", "30"])
            .args(["--header", &format!("x-api-key: {KEY}"), "--body", body]);
        if reset {
            cmd.arg("--reset");
        }
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .expect("python3 with h2 (scripts/test installs it)");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "abort_client.py {proto} {at}: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(stdout.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("abort_client.py printed no JSON line ({e}): {stdout}"))
    }

    /// Waits until `i` requests are decided and every admitted one is settled (charged its 50,
    /// or counted unreported): the next request then meets the charge.
    fn settled(&self, i: u64) {
        wait_for(
            &format!("request {i} decided, and settled if admitted"),
            Duration::from_secs(15),
            || {
                let allowed = self.proxy.decisions(ROUTE, "allowed");
                let rejected = self.proxy.decisions(ROUTE, "rejected");
                let settled = self.charged(ROUTE) / 50.0 + self.unreported(ROUTE);
                (allowed + rejected >= i && settled >= allowed as f64).then_some(())
            },
        );
    }

    /// Waits until the model has no answer half-written (each finished, or cut off because the
    /// proxy went away), at most `limit`.
    fn model_idle(&self, limit: Duration) -> Stats {
        wait_for("the model to finish or lose every answer", limit, || {
            let s = self.model.stats();
            (s.sending == 0).then_some(s)
        })
    }
}

/// 30 requests of one key, each left at `at`: the model is reached at most 3 times (2 answers of
/// 50 empty a bucket of 100), and the usage charged is 50 for every answer whose usage the model
/// sent (for these answers, the last piece: the proxy read on to it).
fn thirty_requests_left(proto: &str, at: &str, reset: bool, model: &str) {
    let rig = Rig::start(TOKENS);
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    let mut outs = Vec::new();
    for i in 1..=30u64 {
        let out = rig.abort(proto, at, reset, &body);
        let what = format!("status {} aborted {}", out["status"], out["aborted"]);
        *seen.entry(what).or_default() += 1;
        outs.push(out);
        rig.settled(i);
    }
    let stats = rig.model_idle(Duration::from_secs(15));
    let allowed = rig.proxy.decisions(ROUTE, "allowed");
    let charged = rig.charged(ROUTE);
    eprintln!(
        "{proto} {at}{}: clients saw {seen:?}; allowed {allowed}, rejected {}; model {stats:?}; \
         charged {charged}, unreported {}",
        if reset { " (reset)" } else { "" },
        rig.proxy.decisions(ROUTE, "rejected"),
        rig.unreported(ROUTE)
    );
    let left: Vec<_> = outs.iter().filter(|o| o["aborted"] == true).collect();
    assert!(
        !left.is_empty(),
        "the client never left at {at}: the attack was not played: {outs:?}"
    );
    assert!(
        stats.requests <= 3,
        "the model was reached {} times by a key with 100 tokens and answers of 50: {stats:?}, \
         charged {charged}",
        stats.requests
    );
    assert_eq!(
        charged,
        50.0 * stats.reported as f64,
        "every answer whose usage the model sent is charged its 50: {stats:?}"
    );
    assert_eq!(
        stats.reported, stats.requests,
        "the proxy read every answer on to its usage: {stats:?}"
    );
    assert!(stats.requests <= allowed, "only admitted requests reach it");
}

/// The model's answer: 20 + 30 tokens in 20,000 bytes of JSON, each piece 100 ms apart (the head,
/// then 4 pieces of 5,000 bytes). Pieces that large: today's proxy holds a Content-Length body's
/// pieces of a few hundred bytes (and the head with them) until the body is whole, so a client
/// could not leave mid-body.
const SLOW: &str = "atk-in-20-out-30-slow-100-big-20000";
/// The same, framed chunked: the end (the last chunk) comes 100 ms after the whole JSON.
const SLOW_CHUNKED: &str = "atk-in-20-out-30-slow-100-big-20000-chunked";

macro_rules! attacks {
    ($($name:ident: $proto:literal, $at:literal, $reset:literal, $model:expr;)*) => {
        $(#[test] fn $name() { thirty_requests_left($proto, $at, $reset, $model) })*
    };
}

attacks! {
    http1_client_closes_before_the_head_arrives: "h1", "before-head", false, SLOW;
    http1_client_closes_after_the_head: "h1", "after-head", false, SLOW;
    http1_client_resets_after_the_head: "h1", "after-head", true, SLOW;
    http1_client_closes_mid_body: "h1", "mid-body", false, SLOW;
    http1_client_resets_mid_body: "h1", "mid-body", true, SLOW;
    http1_client_closes_with_the_json_whole_before_the_last_chunk: "h1", "before-end", false, SLOW_CHUNKED;
    http1_client_closes_after_the_whole_body: "h1", "after-body", false, SLOW;
    http2_client_cancels_before_the_head_arrives: "h2", "before-head", false, SLOW;
    http2_client_cancels_after_the_head: "h2", "after-head", false, SLOW;
    http2_client_cancels_mid_body: "h2", "mid-body", false, SLOW;
    http2_client_cancels_mid_body_and_resets_the_connection: "h2", "mid-body", true, SLOW;
    http2_client_cancels_with_the_json_whole_before_end_stream: "h2", "before-end", false, SLOW_CHUNKED;
    http2_client_leaves_after_the_whole_body: "h2", "after-body", false, SLOW;
}

/// A reservation stands when nothing settles it: each request asks for `max_tokens: 50` and draws
/// 1 + 50 up front; the model never reports usage; half the clients read the answer, half leave
/// mid-body. A bucket of 100 admits one such request (at most 2), and keeps what it drew.
#[test]
fn a_reservation_stands_when_the_model_never_reports_and_the_client_leaves() {
    let rig = Rig::start(
        "      - { name: tokens, capacity: 100, refill: \"1/h\", key: \"header:x-api-key\", reserve: \"json:max_tokens\", charge_from_response: \"json:usage.total_tokens\" }\n",
    );
    let body = r#"{"model":"atk-silent-slow-50","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}"#;
    for i in 1..=30u64 {
        if i % 2 == 0 {
            let r = post(
                rig.proxy.addr,
                "/v1/chat/completions",
                &[("x-api-key", KEY)],
                body,
            );
            assert!(matches!(r.status, 200 | 429), "{r:?}");
        } else {
            rig.abort("h1", "mid-body", false, body);
        }
        rig.settled(i);
    }
    let stats = rig.model_idle(Duration::from_secs(15));
    let allowed = rig.proxy.decisions(ROUTE, "allowed");
    let r = rig
        .proxy
        .admin_get(&format!("/v1/buckets?route={ROUTE}&key={KEY}&limit=tokens"));
    assert_eq!(r.status, 200, "{r:?}");
    let bucket: Value = serde_json::from_str(&r.body).unwrap();
    let left = bucket["limits"][0]["tokens"].as_i64().expect("tokens");
    eprintln!("allowed {allowed}; model {stats:?}; bucket {bucket}");
    assert!(
        allowed <= 2,
        "each admission drew 51 of 100: {allowed} admitted"
    );
    assert!(allowed >= 1, "the first request fits");
    assert_eq!(
        left,
        100 - 51 * allowed as i64,
        "every admitted request keeps its cost and reservation: {bucket}"
    );
    assert_eq!(rig.unreported(ROUTE), allowed as f64, "none reported");
    assert_eq!(rig.charged(ROUTE), 0.0);
    assert_eq!(stats.requests, allowed, "{stats:?}");
}

const FIVE_MIB: usize = 5 * 1024 * 1024;

/// Tokens enough for the big answers; the route charged from the JSON body.
const ROOMY: &str = "      - { name: tokens, capacity: 100000, refill: \"1/h\", key: \"header:x-api-key\", charge_from_response: \"json:usage.total_tokens\" }\n";

fn big_body() -> String {
    format!(
        r#"{{"model":"big-in-20-out-30-big-{FIVE_MIB}","messages":[{{"role":"user","content":"hi"}}]}}"#
    )
}

/// A JSON answer of 5 MiB, its usage at the very end: charged exactly, not "too big to read".
#[test]
fn a_5_mib_json_answer_is_charged_exactly() {
    let rig = Rig::start(ROOMY);
    let r = post(
        rig.proxy.addr,
        "/v1/chat/completions",
        &[("x-api-key", KEY)],
        &big_body(),
    );
    assert_eq!(r.status, 200, "{}", r.status);
    assert_eq!(r.body.len(), FIVE_MIB, "the whole answer went through");
    let tail = &r.body[r.body.len() - 300..];
    assert!(
        tail.contains(
            "\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":30,\"total_tokens\":50"
        ),
        "the usage at the very end: {tail}"
    );
    wait_for("the answer settled", Duration::from_secs(10), || {
        (rig.charged(ROUTE) + rig.unreported(ROUTE) > 0.0).then_some(())
    });
    assert_eq!(rig.unreported(ROUTE), 0.0, "a 5 MiB answer is still read");
    assert_eq!(rig.charged(ROUTE), 50.0);
}

/// Streams of 10,000 content events before the usage: the OpenAI usage chunk (`sse:`) and
/// Anthropic's input in `message_start` plus output in `message_delta` (a `sum`), each exact.
#[test]
fn a_10000_event_stream_is_charged_exactly() {
    let rig = Rig::start_routes(
        "  - name: openai\n    match: { path_prefix: \"/v1/chat/completions\" }\n    upstream: \"UPSTREAM\"\n    limits:\n      - { name: tokens, capacity: 100000, refill: \"1/h\", key: \"header:x-api-key\", charge_from_response: \"sse:usage.total_tokens\" }\n\
           \x20 - name: anthropic\n    match: { path_prefix: \"/v1/messages\" }\n    upstream: \"UPSTREAM\"\n    limits:\n      - name: tokens\n        capacity: 100000\n        refill: \"1/h\"\n        key: \"header:x-api-key\"\n        charge_from_response: { sum: [\"sse:message.usage.input_tokens\", \"sse:usage.output_tokens\"] }\n",
    );
    let r = post(
        rig.proxy.addr,
        "/v1/chat/completions",
        &[("x-api-key", KEY)],
        r#"{"model":"sse-in-20-out-30-events-10000","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#,
    );
    assert_eq!(r.status, 200, "{:?}", r.headers);
    let body = dechunk(&r.body);
    assert!(
        body.matches("chat.completion.chunk").count() > 10_000,
        "the whole stream went through"
    );
    assert!(
        body.contains("\"total_tokens\":50"),
        "the usage chunk went through"
    );
    let r = post(
        rig.proxy.addr,
        "/v1/messages",
        &[("x-api-key", KEY)],
        r#"{"model":"sse-in-20-out-30-events-10000","stream":true,"max_tokens":100,"messages":[]}"#,
    );
    assert_eq!(r.status, 200, "{:?}", r.headers);
    let body = dechunk(&r.body);
    assert!(
        body.matches("content_block_delta").count() >= 20_000,
        "event: and type: of each"
    );
    for route in ["openai", "anthropic"] {
        wait_for(
            &format!("{route}'s stream settled"),
            Duration::from_secs(10),
            || (rig.charged(route) + rig.unreported(route) > 0.0).then_some(()),
        );
        assert_eq!(rig.unreported(route), 0.0, "{route}: the stream reported");
        assert_eq!(rig.charged(route), 50.0, "{route}: 20 in + 30 out");
    }
}

/// A chunked body's content (the proxy frames a stream in chunks of its own choosing).
fn dechunk(framed: &str) -> String {
    let mut out = String::new();
    let mut rest = framed;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .unwrap_or_else(|_| panic!("not chunked: {:?}", &rest[..rest.len().min(80)]));
        if size == 0 {
            return out;
        }
        out.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
    panic!("the stream did not end")
}

/// The proxy's resident memory (`VmRSS` of /proc/<pid>/status), in bytes.
fn rss(pid: u32) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// Samples the proxy's RSS every 20 ms until stopped (at most 2 minutes); the highest seen.
fn rss_peak(pid: u32) -> (Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let sampler = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut peak = 0;
        while !flag.load(Ordering::SeqCst) && Instant::now() < deadline {
            peak = peak.max(rss(pid));
            std::thread::sleep(Duration::from_millis(20));
        }
        peak.max(rss(pid))
    });
    (stop, sampler)
}

fn request_bytes(body: &str, key: &str) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: test.local\r\nConnection: close\r\nContent-Type: application/json\r\nx-api-key: {key}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

const MIB: f64 = 1024.0 * 1024.0;
/// Half of what keeping the 20 bodies would take. Not a quarter: today's proxy, which keeps none
/// of a 5 MiB body (it drops the answer of a client that left, and passes a slow reader's through
/// with back-pressure), already grows by 15 to 26 MiB with 20 such answers in flight (about 1 MiB
/// a request, in its buffers and allocator, after a warm-up of 20 requests at once).
const MEMORY_BOUND: u64 = 20 * FIVE_MIB as u64 / 2;

/// What the proxy allocates once goes into the baseline: 20 requests in flight at once (small
/// answers held 300 ms by the model: connections, tasks, pools), then one 5 MiB answer read whole.
fn warm_up(rig: &Rig) {
    let addr = rig.proxy.addr;
    let small: Vec<_> = (0..20)
        .map(|i| {
            std::thread::spawn(move || {
                let body = r#"{"model":"warm-in-1-out-1-slow-300","messages":[]}"#;
                post(
                    addr,
                    "/v1/chat/completions",
                    &[("x-api-key", &format!("sk-warm-{i}"))],
                    body,
                )
                .status
            })
        })
        .collect();
    for h in small {
        assert_eq!(h.join().unwrap(), 200);
    }
    let r = post(
        addr,
        "/v1/chat/completions",
        &[("x-api-key", "sk-warm")],
        &big_body(),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), FIVE_MIB);
}

/// 20 answers of 5 MiB at once, each read by a client that takes 64 KiB every 20 ms (1.6 s for
/// the whole): the proxy passes them through without holding them (back-pressure, not buffers),
/// so its memory grows by far less than the bodies (bound: half of 20 × 5 MiB).
#[test]
fn twenty_slow_readers_of_5_mib_answers_cost_the_proxy_little_memory() {
    let rig = Rig::start(ROOMY);
    warm_up(&rig);
    let pid = rig.proxy.pid();
    let before = rss(pid);
    let (stop, sampler) = rss_peak(pid);
    let addr = rig.proxy.addr;
    let readers: Vec<_> = (0..20)
        .map(|i| {
            let request = request_bytes(&big_body(), &format!("sk-slow-{i}"));
            std::thread::spawn(move || slow_read(addr, &request))
        })
        .collect();
    let got: Vec<usize> = readers.into_iter().map(|h| h.join().unwrap()).collect();
    stop.store(true, Ordering::SeqCst);
    let peak = sampler.join().unwrap();
    let after = rss(pid);
    eprintln!(
        "proxy RSS with 20 slow readers of 5 MiB: before {:.1} MiB, peak {:.1} MiB (+{:.1}), after {:.1} MiB (+{:.1}); bound +{:.1} MiB",
        before as f64 / MIB,
        peak as f64 / MIB,
        peak.saturating_sub(before) as f64 / MIB,
        after as f64 / MIB,
        after.saturating_sub(before) as f64 / MIB,
        MEMORY_BOUND as f64 / MIB
    );
    for (i, n) in got.iter().enumerate() {
        assert!(
            *n > FIVE_MIB,
            "reader {i} got {n} bytes: not the whole answer"
        );
    }
    assert!(
        peak.saturating_sub(before) < MEMORY_BOUND,
        "the proxy grew by {:.1} MiB passing 20 answers of 5 MiB",
        peak.saturating_sub(before) as f64 / MIB
    );
}

/// Reads the answer to `request` 64 KiB at a time, 20 ms apart; the bytes read.
fn slow_read(addr: SocketAddr, request: &[u8]) -> usize {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(request).unwrap();
    let mut buf = vec![0; 64 * 1024];
    let mut total = 0;
    // Bounded: 5 MiB in 64 KiB reads is 80 of them; a short read only adds a few.
    for _ in 0..10_000 {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(e) => panic!("after {total} bytes: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    total
}

/// 20 answers of 5 MiB at once, each client leaving as soon as the head arrives: the proxy reads
/// each answer to its end for the usage (charged 50 each) without keeping the bodies.
#[test]
fn twenty_clients_leaving_5_mib_answers_are_each_charged_without_the_proxy_keeping_them() {
    let rig = Rig::start(ROOMY);
    warm_up(&rig);
    let pid = rig.proxy.pid();
    let before = rss(pid);
    let (stop, sampler) = rss_peak(pid);
    let addr = rig.proxy.addr;
    let leavers: Vec<_> = (0..20)
        .map(|i| {
            let request = request_bytes(&big_body(), &format!("sk-leave-{i}"));
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                s.write_all(&request).unwrap();
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 64 * 1024 {
                    s.read_exact(&mut byte).expect("the head");
                    head.push(byte[0]);
                }
                String::from_utf8_lossy(&head)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
        })
        .collect();
    let heads: Vec<String> = leavers.into_iter().map(|h| h.join().unwrap()).collect();
    for h in &heads {
        assert!(h.contains(" 200 "), "{h}");
    }
    let stats = rig.model_idle(Duration::from_secs(60));
    stop.store(true, Ordering::SeqCst);
    let peak = sampler.join().unwrap();
    let after = rss(pid);
    // The warm-up's 21 answers of 2 tokens and 50, then the 20 left.
    let settled =
        |rig: &Rig| (rig.charged(ROUTE) - 20.0 * 2.0 - 50.0) / 50.0 + rig.unreported(ROUTE);
    wait_for("the 20 answers settled", Duration::from_secs(15), || {
        (settled(&rig) >= 20.0).then_some(())
    });
    eprintln!(
        "proxy RSS with 20 clients leaving 5 MiB answers: before {:.1} MiB, peak {:.1} MiB (+{:.1}), after {:.1} MiB (+{:.1}); bound +{:.1} MiB; model {stats:?}; charged {}, unreported {}",
        before as f64 / MIB,
        peak as f64 / MIB,
        peak.saturating_sub(before) as f64 / MIB,
        after as f64 / MIB,
        after.saturating_sub(before) as f64 / MIB,
        MEMORY_BOUND as f64 / MIB,
        rig.charged(ROUTE),
        rig.unreported(ROUTE)
    );
    assert!(
        peak.saturating_sub(before) < MEMORY_BOUND,
        "the proxy grew by {:.1} MiB reading 20 answers of 5 MiB",
        peak.saturating_sub(before) as f64 / MIB
    );
    assert_eq!(
        stats.reported, 41,
        "the proxy read every answer on to its usage, at the very end: {stats:?}"
    );
    assert_eq!(rig.unreported(ROUTE), 0.0);
    assert_eq!(
        rig.charged(ROUTE),
        20.0 * 2.0 + 50.0 + 20.0 * 50.0,
        "the warm-up's 20 small answers and its big one, and each of the 20 left"
    );
}
