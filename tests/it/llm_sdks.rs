//! The LLM gateway of `config/routes-llm.yaml`, as shipped, in front of a fake model that speaks
//! OpenAI's and Anthropic's APIs (`tests/fixtures/llm/fake_model.py`), driven by the real `openai`
//! and `anthropic` SDKs from PyPI (`tests/fixtures/llm/sdk_client.py`): every answer charged
//! exactly what the model reported, a streaming chat request given `stream_options.include_usage`
//! on its way, a missing key a 401 that no SDK retries, a refusal the SDKs raise as
//! `RateLimitError` and retry after the `retry-after-ms` they were told. On both stores.
//!
//! Only `listen`, `admin`, `upstream` and `redis.url` of the example are replaced (and its `redis:`
//! section dropped for the in-memory store): the example must work as it is.

use crate::support::http::{self, Response};
use crate::support::proxy::Proxy;
use crate::support::redis::RedisServer;
use crate::support::wait_for;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llm");
const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/routes-llm.yaml");

/// The fake model upstream, for as long as the test holds it (it exits when its stdin closes).
/// When the test fails, it prints every request it received.
pub struct FakeModel {
    child: Child,
    _stdin: ChildStdin,
    pub addr: SocketAddr,
}

/// `GET /_stats` of the fake model: answers to the API paths by how they ended, and how many of
/// them had their usage written whole (finished, or cut off after the usage).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub requests: u64,
    pub finished: u64,
    pub cut: u64,
    pub sending: u64,
    pub reported: u64,
}

impl FakeModel {
    pub fn start() -> FakeModel {
        let mut child = Command::new("python3")
            .arg(format!("{FIXTURES}/fake_model.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 (scripts/test installs it)");
        let stdin = child.stdin.take().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the fake model did not say its port: {line:?}"));
        FakeModel {
            child,
            _stdin: stdin,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    /// Every request received so far, oldest first.
    pub fn seen(&self) -> Vec<Value> {
        let r = http::get(self.addr, "/_seen", &[]);
        assert_eq!(r.status, 200, "{r:?}");
        serde_json::from_str(&r.body).expect("/_seen is JSON")
    }

    /// The requests received on API paths (`/v1/...`).
    pub fn api_requests(&self) -> Vec<Value> {
        self.seen()
            .into_iter()
            .filter(|s| s["path"].as_str().is_some_and(|p| p.starts_with("/v1/")))
            .collect()
    }

    pub fn stats(&self) -> Stats {
        let r = http::get(self.addr, "/_stats", &[]);
        assert_eq!(r.status, 200, "{r:?}");
        let v: Value = serde_json::from_str(&r.body).expect("/_stats is JSON");
        let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
        Stats {
            requests: n("requests"),
            finished: n("finished"),
            cut: n("cut"),
            sending: n("sending"),
            reported: n("reported"),
        }
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let seen = http::send_raw(
                self.addr,
                b"GET /_seen HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            )
            .map(|r| r.body)
            .unwrap_or_else(|e| format!("(unreadable: {e})"));
            eprintln!("--- fake model: /_seen ---\n{seen}");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A header of one request `/_seen` recorded (case-insensitive).
pub fn seen_header<'a>(request: &'a Value, name: &str) -> Option<&'a str> {
    request["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0].as_str().is_some_and(|n| n.eq_ignore_ascii_case(name)))
        .and_then(|h| h[1].as_str())
}

/// A POST of `body` (JSON) on its own connection, the answer read to its end.
pub fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &str) -> Response {
    let mut raw = format!(
        "POST {path} HTTP/1.1\r\nHost: test.local\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        raw.push_str(&format!("{name}: {value}\r\n"));
    }
    raw.push_str("\r\n");
    raw.push_str(body);
    http::send_raw(addr, raw.as_bytes()).unwrap_or_else(|e| panic!("POST {path} via {addr}: {e}"))
}

/// `r` of the item `name` in a `RateLimit` field (`"tokens";r=199950;t=0, "inflight";r=9;t=0`).
pub fn ratelimit_remaining(r: &Response, name: &str) -> Option<i64> {
    let field = r.header("ratelimit")?;
    field.split(',').find_map(|item| {
        let mut params = item.trim().split(';');
        (params.next()? == format!("\"{name}\"")).then_some(())?;
        params.find_map(|p| p.strip_prefix("r=")?.parse().ok())
    })
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The example config with only its addresses replaced: the proxy's, the upstream's, and Redis's
/// (`None`: its `redis:` section dropped, for the in-memory store).
fn example(upstream: SocketAddr, redis: Option<&str>) -> String {
    let text = std::fs::read_to_string(EXAMPLE).expect("config/routes-llm.yaml");
    let replace_all = |text: &str, from: &str, to: &str| {
        assert!(text.contains(from), "the example no longer says {from}");
        text.replace(from, to)
    };
    let mut yaml = replace_all(&text, "listen: \"0.0.0.0:8080\"", "listen: \"{listen}\"");
    yaml = replace_all(&yaml, "admin: \"127.0.0.1:9090\"", "admin: \"{admin}\"");
    yaml = replace_all(
        &yaml,
        "upstream: \"127.0.0.1:8000\"",
        &format!("upstream: \"{upstream}\""),
    );
    match redis {
        Some(url) => replace_all(
            &yaml,
            "url: \"redis://127.0.0.1:6379\"",
            &format!("url: \"{url}\""),
        ),
        None => {
            // The `redis:` line and the indented lines under it.
            let mut out = String::new();
            let mut inside = false;
            for line in yaml.lines() {
                if line.starts_with("redis:") {
                    inside = true;
                    continue;
                }
                if inside && (line.starts_with(' ') || line.is_empty()) {
                    continue;
                }
                inside = false;
                out.push_str(line);
                out.push('\n');
            }
            out
        }
    }
}

/// The gateway of the example on one store, the fake model behind it.
pub struct Gateway {
    // Dropped in this order: the proxy (its report first), the model, Redis.
    pub proxy: Proxy,
    pub model: FakeModel,
    _redis: Option<RedisServer>,
}

#[derive(Clone, Copy, Debug)]
pub enum Store {
    Redis,
    Memory,
}

impl Gateway {
    pub fn start(store: Store) -> Gateway {
        let model = FakeModel::start();
        let redis = match store {
            Store::Redis => Some(RedisServer::start()),
            Store::Memory => None,
        };
        let yaml = example(model.addr, redis.as_ref().map(|r| r.url()).as_deref());
        Gateway::on(model, redis, &yaml)
    }

    /// The proxy on `yaml` in front of `model`.
    fn on(model: FakeModel, redis: Option<RedisServer>, yaml: &str) -> Gateway {
        let proxy = Proxy::start(yaml);
        Gateway {
            proxy,
            model,
            _redis: redis,
        }
    }

    fn base_url(&self) -> String {
        format!("http://{}", self.proxy.addr)
    }

    /// Runs one scenario of `sdk_client.py` against the proxy; its JSON line.
    fn sdk(&self, scenario: &str, args: &[&str]) -> Value {
        let out = Command::new("python3")
            .arg(format!("{FIXTURES}/sdk_client.py"))
            .arg(self.base_url())
            .arg(scenario)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("python3 with openai and anthropic (scripts/test installs them)");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "sdk_client.py {scenario} {args:?}: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout.lines().last().unwrap_or_default();
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("sdk_client.py printed no JSON line ({e}): {stdout}"));
        eprintln!("sdk_client.py {scenario}: {v}");
        v
    }

    /// `ratelimit_usage_charged_total` of a route's `tokens` limit.
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

    /// Waits until the route's `tokens` limit was charged `expected` in all, then checks it stays
    /// so and that nothing went unreported.
    fn assert_charged(&self, route: &str, expected: f64) {
        let charged = wait_for(
            &format!("{expected} tokens charged on route {route}"),
            Duration::from_secs(10),
            || {
                let c = self.charged(route);
                (c >= expected || self.unreported(route) > 0.0).then_some(c)
            },
        );
        assert_eq!(
            charged,
            expected,
            "ratelimit_usage_charged_total of {route}/tokens (unreported: {})",
            self.unreported(route)
        );
        assert_eq!(self.unreported(route), 0.0, "{route}: nothing unreported");
    }

    /// The `tokens` bucket of `key` on the route at `path`, seen in the `RateLimit` field of a
    /// probe (a request asking for 1 token, answered with usage 0: it draws its cost 1 and a
    /// reservation of 1, and is settled at its cost). Checks that the bucket holds `capacity -
    /// used - 2`, plus at most the refill since `since` (epoch seconds).
    fn assert_bucket_after(&self, path: &str, key: (&str, &str), used: i64, since: f64) {
        self.assert_bucket_after_probe(path, key, used, since, 2)
    }

    /// `assert_bucket_after` with a probe that draws `probe` up front.
    fn assert_bucket_after_probe(
        &self,
        path: &str,
        key: (&str, &str),
        used: i64,
        since: f64,
        probe: i64,
    ) {
        let body = r#"{"model":"probe-in-0-out-0","max_tokens":1,"max_completion_tokens":1,"max_output_tokens":1,"messages":[{"role":"user","content":"hi"}],"input":"hi"}"#;
        let r = post(self.proxy.addr, path, &[key], body);
        let elapsed = now() - since;
        assert_eq!(r.status, 200, "the probe: {r:?}");
        let left = ratelimit_remaining(&r, "tokens")
            .unwrap_or_else(|| panic!("the RateLimit field lists no \"tokens\" item: {r:?}"));
        let floor = 200_000 - used - probe;
        // 200,000 an hour: 55.6 a second came back since the scenario's first request.
        let refill = (200_000.0 * elapsed / 3600.0).ceil() as i64 + 1;
        assert!(
            (floor..=floor + refill).contains(&left),
            "tokens left {left}: expected {floor}, plus at most {refill} refilled in {elapsed:.2} s \
             (charged {used} then the probe's {probe}); {r:?}"
        );
    }
}

/// The usage an SDK saw, as a number: `total_tokens`, or input + output.
fn sdk_total(usage: &Value) -> i64 {
    usage["total_tokens"].as_i64().unwrap_or_else(|| {
        usage["input_tokens"].as_i64().expect("input_tokens")
            + usage["output_tokens"].as_i64().expect("output_tokens")
    })
}

/// The model of every charged scenario: 1,200 in and 2,300 out, 3,500 in all; asked with a cap
/// of 1,000, so neither the reservation nor the cost can pass for the charge.
const MODEL: &str = "gpt-in-1200-out-2300";
const USED: i64 = 3500;

/// One SDK scenario that the route charges from the answer: the SDK parses the answer and sees
/// the usage, the limit is charged exactly that, and the key's bucket shows it.
fn charged_scenario(
    g: &Gateway,
    scenario: &str,
    route: &str,
    path: &str,
    key: (&str, &str),
    extra: &[&str],
) {
    // The SDK is given the key itself; it sends it as the header `key` names.
    let token = key.1.strip_prefix("Bearer ").unwrap_or(key.1);
    let mut args = vec!["--key", token, "--model", MODEL, "--max-tokens", "1000"];
    args.extend_from_slice(extra);
    let out = g.sdk(scenario, &args);
    assert_eq!(out["ok"], true, "the SDK call failed: {out}");
    assert_eq!(out["attempts"].as_array().map(Vec::len), Some(1), "{out}");
    assert_eq!(
        out["text"], "tok0 tok1 tok2 ",
        "the SDK read the answer: {out}"
    );
    if scenario == "openai-chat-stream" {
        // The usage chunk was asked for by the proxy, not the client: it is not passed on, so
        // code that reads choices[0] of every chunk still works.
        assert_eq!(out["usage"], Value::Null, "{out}");
        assert_eq!(out["empty_choice_chunks"], 0, "{out}");
    } else {
        assert_eq!(sdk_total(&out["usage"]), USED, "what the SDK saw: {out}");
    }
    let reached = g.model.api_requests();
    assert_eq!(reached.len(), 1, "one request reached the model");
    assert!(
        seen_header(&reached[0], "authorization").is_some()
            || seen_header(&reached[0], "x-api-key").is_some(),
        "the key went upstream: {}",
        reached[0]
    );
    g.assert_charged(route, USED as f64);
    let sent_at = out["sent_at"].as_f64().expect("sent_at");
    g.assert_bucket_after(path, key, USED, sent_at);
}

fn openai_chat_is_charged_what_the_model_reported(store: Store) {
    let g = Gateway::start(store);
    charged_scenario(
        &g,
        "openai-chat",
        "openai",
        "/v1/chat/completions",
        ("authorization", "Bearer sk-proj-chat"),
        &[],
    );
}

/// `"stream": true` without `stream_options`: the proxy asks the model for the usage chunk
/// (`stream_usage: request`), the body it forwards is valid JSON with a Content-Length that fits,
/// the SDK still parses the stream, and the usage chunk is charged.
fn openai_chat_stream_is_given_include_usage_and_charged(store: Store) {
    let g = Gateway::start(store);
    let key = ("authorization", "Bearer sk-proj-stream");
    charged_scenario(
        &g,
        "openai-chat-stream",
        "openai",
        "/v1/chat/completions",
        key,
        &[],
    );
    let reached = g.model.api_requests();
    let request = &reached[0];
    let body = request["body"].as_str().unwrap();
    let sent: Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("the proxy forwarded a body that is not JSON ({e}): {body}"));
    assert_eq!(sent["stream"], true, "{sent}");
    assert_eq!(
        sent["stream_options"]["include_usage"], true,
        "added by the proxy: {sent}"
    );
    assert_eq!(sent["model"], MODEL, "the rest as the SDK sent it: {sent}");
    assert_eq!(sent["max_tokens"], 1000, "{sent}");
    assert_eq!(sent["messages"][0]["content"], "Say something.", "{sent}");
    let length = seen_header(request, "content-length")
        .unwrap_or_else(|| panic!("no Content-Length on the rewritten body: {request}"));
    assert_eq!(
        length.parse::<u64>().ok(),
        request["body_length"].as_u64(),
        "the Content-Length fits the rewritten body: {request}"
    );
    assert!(
        seen_header(request, "transfer-encoding").is_none(),
        "one framing: {request}"
    );
}

fn openai_responses_is_charged(store: Store) {
    let g = Gateway::start(store);
    charged_scenario(
        &g,
        "openai-responses",
        "openai-responses",
        "/v1/responses",
        ("authorization", "Bearer sk-proj-resp"),
        &[],
    );
}

fn openai_responses_stream_is_charged(store: Store) {
    let g = Gateway::start(store);
    charged_scenario(
        &g,
        "openai-responses-stream",
        "openai-responses",
        "/v1/responses",
        ("authorization", "Bearer sk-proj-resps"),
        &[],
    );
}

fn anthropic_messages_are_charged(store: Store) {
    let g = Gateway::start(store);
    charged_scenario(
        &g,
        "anthropic-messages",
        "anthropic",
        "/v1/messages",
        ("authorization", "Bearer sk-ant-msg"),
        &[],
    );
}

/// The key in `x-api-key` (older SDKs, curl): the same bucket as the key would have as a bearer
/// token (`header:x-api-key|bearer`: one client, one budget, however it sends its key).
fn anthropic_messages_with_x_api_key_are_charged(store: Store) {
    let g = Gateway::start(store);
    charged_scenario(
        &g,
        "anthropic-messages",
        "anthropic",
        "/v1/messages",
        ("x-api-key", "sk-ant-xkey"),
        &["--key-in", "x-api-key"],
    );
    let reached = g.model.api_requests();
    assert_eq!(
        seen_header(&reached[0], "x-api-key"),
        Some("sk-ant-xkey"),
        "{}",
        reached[0]
    );
}

fn anthropic_message_stream_is_charged(store: Store) {
    let g = Gateway::start(store);
    charged_scenario(
        &g,
        "anthropic-messages-stream",
        "anthropic",
        "/v1/messages",
        ("authorization", "Bearer sk-ant-stream"),
        &[],
    );
}

/// No key: a 401 the SDK raises as `AuthenticationError` and does not retry (one attempt), no
/// `Retry-After` (waiting will not help), nothing sent to the model.
fn a_missing_key_is_a_401_that_no_sdk_retries(store: Store) {
    let g = Gateway::start(store);
    for scenario in ["openai-no-key", "anthropic-no-key"] {
        let out = g.sdk(scenario, &["--model", MODEL]);
        assert_eq!(out["ok"], false, "{out}");
        let error = &out["error"];
        assert_eq!(error["class"], "AuthenticationError", "{out}");
        assert_eq!(error["status"], 401, "{out}");
        let attempts = out["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "a 401 is not retried: {out}");
        let headers = &attempts[0]["headers"];
        assert!(
            headers.get("retry-after").is_none(),
            "no Retry-After on a 401: {out}"
        );
        assert!(headers.get("retry-after-ms").is_none(), "{out}");
    }
    assert!(
        g.model.api_requests().is_empty(),
        "no request reached the model"
    );
    assert_eq!(
        g.proxy
            .metric("ratelimit_responses_total{class=\"4xx\",route=\"openai\"}"),
        1.0
    );
    assert_eq!(
        g.proxy
            .metric("ratelimit_responses_total{class=\"4xx\",route=\"anthropic\"}"),
        1.0
    );
}

/// A key that spent its whole budget (one answer of 200,000 tokens) is refused: the SDK raises
/// `RateLimitError` with the proxy's message (in the API's error shape), and, allowed one retry,
/// waits the `retry-after-ms` it was told (the refill of a debt of 100 and the next request's 101 tokens, up to
/// 3.6 s) and then gets its answer.
fn a_refusal_is_the_sdks_rate_limit_error_and_retried_after_its_wait(
    store: Store,
    scenario: &str,
    path: &str,
    key: (&str, &str),
) {
    let g = Gateway::start(store);
    // 200,100 tokens: the bucket is left 100 in debt, so the next request's 101 come back only
    // after 3.6 s, longer than the SDK takes to start on a loaded box.
    let spend = r#"{"model":"spend-in-100000-out-100100","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = post(g.proxy.addr, path, &[key], spend);
    assert_eq!(r.status, 200, "the spending request: {r:?}");
    let token = key.1.trim_start_matches("Bearer ");
    let out = g.sdk(
        scenario,
        &["--key", token, "--model", MODEL, "--max-tokens", "100"],
    );

    let first = &out["first"];
    assert_eq!(first["ok"], false, "refused: {out}");
    let error = &first["error"];
    assert_eq!(error["class"], "RateLimitError", "{out}");
    assert_eq!(error["status"], 429, "{out}");
    let body = &error["body"];
    let message = if scenario.starts_with("openai") {
        // The SDK keeps the `error` object as the body.
        assert_eq!(body["type"], "rate_limit_exceeded", "{out}");
        assert!(body.get("param").is_some_and(Value::is_null), "{out}");
        assert!(body.get("code").is_some(), "{out}");
        assert_eq!(error["type"], "rate_limit_exceeded", "{out}");
        body["message"].as_str()
    } else {
        assert_eq!(body["type"], "error", "{out}");
        assert_eq!(body["error"]["type"], "rate_limit_error", "{out}");
        body["error"]["message"].as_str()
    };
    let message = message.unwrap_or_else(|| panic!("no message in the refusal: {out}"));
    assert!(!message.is_empty(), "{out}");
    assert!(
        error["message"].as_str().unwrap().contains(message),
        "the SDK's message carries the proxy's: {out}"
    );
    let attempts = first["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "max_retries=0: {out}");
    let told = &attempts[0]["headers"];
    assert!(told.get("retry-after").is_some(), "{out}");

    let retried = &out["retried"];
    let attempts = retried["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "one retry: {out}");
    assert_eq!(attempts[0]["status"], 429, "{out}");
    let wait_ms: f64 = attempts[0]["headers"]["retry-after-ms"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no retry-after-ms on the 429: {out}"));
    // At most the refill of 100 + 101 tokens at 55.6/s; less by what refilled while the SDK
    // started.
    assert!(
        (1.0..=3700.0).contains(&wait_ms),
        "201 tokens at 55.6/s: {wait_ms} ms: {out}"
    );
    let waited = retried["waits"][0].as_f64().unwrap() * 1000.0;
    assert!(
        waited >= wait_ms * 0.9 && waited <= wait_ms + 1500.0,
        "the SDK waited {waited:.0} ms for a retry-after-ms of {wait_ms}: {out}"
    );
    assert_eq!(attempts[1]["status"], 200, "admitted after the wait: {out}");
    assert_eq!(retried["ok"], true, "{out}");
    assert_eq!(
        g.model.api_requests().len(),
        2,
        "the spending request and the retry"
    );
}

fn an_openai_refusal_is_rate_limit_error_and_retried_after_its_wait(store: Store) {
    a_refusal_is_the_sdks_rate_limit_error_and_retried_after_its_wait(
        store,
        "openai-refused",
        "/v1/chat/completions",
        ("authorization", "Bearer sk-proj-refused"),
    );
}

fn an_anthropic_refusal_is_rate_limit_error_and_retried_after_its_wait(store: Store) {
    a_refusal_is_the_sdks_rate_limit_error_and_retried_after_its_wait(
        store,
        "anthropic-refused",
        "/v1/messages",
        ("authorization", "Bearer sk-ant-refused"),
    );
}

macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        mod on_redis {
            $(#[test] fn $name() { super::$name(super::Store::Redis) })*
        }
        mod in_memory {
            $(#[test] fn $name() { super::$name(super::Store::Memory) })*
        }
    };
}

both_stores!(
    openai_chat_is_charged_what_the_model_reported,
    openai_chat_stream_is_given_include_usage_and_charged,
    openai_responses_is_charged,
    openai_responses_stream_is_charged,
    anthropic_messages_are_charged,
    anthropic_messages_with_x_api_key_are_charged,
    anthropic_message_stream_is_charged,
    a_missing_key_is_a_401_that_no_sdk_retries,
    an_openai_refusal_is_rate_limit_error_and_retried_after_its_wait,
    an_anthropic_refusal_is_rate_limit_error_and_retried_after_its_wait,
);

/// The harness itself, against the fake model with no proxy: every SDK scenario parses what the
/// fake model says (so a failure above is the proxy's, not the fake's), and a streaming chat
/// request without `stream_options` gets no usage chunk, as from OpenAI.
#[test]
fn the_sdks_parse_the_fake_model_as_they_parse_the_real_apis() {
    let model = FakeModel::start();
    let base = format!("http://{}", model.addr);
    let run = |scenario: &str, extra: &[&str]| -> Value {
        let out = Command::new("python3")
            .arg(format!("{FIXTURES}/sdk_client.py"))
            .args([
                base.as_str(),
                scenario,
                "--key",
                "sk-direct",
                "--model",
                MODEL,
            ])
            .args(extra)
            .output()
            .expect("python3");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{scenario}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap()
    };
    for scenario in [
        "openai-chat",
        "openai-responses",
        "openai-responses-stream",
        "anthropic-messages",
        "anthropic-messages-stream",
    ] {
        let out = run(scenario, &[]);
        assert_eq!(out["ok"], true, "{out}");
        assert_eq!(out["text"], "tok0 tok1 tok2 ", "{out}");
        assert_eq!(sdk_total(&out["usage"]), USED, "{out}");
    }
    let out = run("openai-chat-stream", &[]);
    assert_eq!(out["ok"], true, "{out}");
    assert_eq!(out["text"], "tok0 tok1 tok2 ", "{out}");
    assert!(
        out["usage"].is_null(),
        "no include_usage, no usage chunk: {out}"
    );
    assert_eq!(out["empty_choice_chunks"], 0, "{out}");
    // With no key at all, the SDKs still send their request (the fake model takes it).
    for scenario in ["openai-no-key", "anthropic-no-key"] {
        assert_eq!(run(scenario, &[])["ok"], true, "{scenario}");
    }
    let seen = model.api_requests();
    assert_eq!(seen.len(), 8, "one request per scenario");
    let openai_no_key = &seen[6];
    assert!(
        seen_header(openai_no_key, "authorization").is_none(),
        "{openai_no_key}"
    );
    let anthropic_no_key = &seen[7];
    assert!(
        seen_header(anthropic_no_key, "authorization").is_none(),
        "{anthropic_no_key}"
    );
    assert_eq!(
        seen_header(anthropic_no_key, "x-api-key"),
        Some(""),
        "{anthropic_no_key}"
    );
    // anthropic 2.x sends api_key as a bearer token; the example's key takes either.
    assert_eq!(
        seen_header(&seen[3], "authorization"),
        Some("Bearer sk-direct")
    );
    assert_eq!(model.stats().finished, 8);
}

/// The harness through today's proxy, with what it has always had: a non-streaming answer charged
/// from `json:usage.total_tokens`, the key being the whole `Authorization` header. The openai SDK's
/// chat and the anthropic SDK's message are each charged exactly what the model reported, and the
/// bucket shows it (the probe draws its cost, 1, with no reservation).
#[test]
fn the_sdks_non_streaming_answers_are_charged_from_the_json_body() {
    let model = FakeModel::start();
    let yaml = format!(
        "listen: \"{{listen}}\"\nadmin: \"{{admin}}\"\nroutes:\n\
         - name: openai\n  match: {{ path_prefix: \"/v1/chat/completions\" }}\n  upstream: \"{0}\"\n  \
           limits: [{{ name: tokens, capacity: 200000, refill: \"200000/h\", key: \"header:authorization\", charge_from_response: \"json:usage.total_tokens\" }}]\n\
         - name: anthropic\n  match: {{ path_prefix: \"/v1/messages\" }}\n  upstream: \"{0}\"\n  \
           limits: [{{ name: tokens, capacity: 200000, refill: \"200000/h\", key: \"header:authorization\", charge_from_response: \"json:usage.total_tokens\" }}]\n",
        model.addr
    );
    let g = Gateway::on(model, None, &yaml);
    let key = ("authorization", "Bearer sk-proj-today");
    let out = g.sdk(
        "openai-chat",
        &[
            "--key",
            "sk-proj-today",
            "--model",
            MODEL,
            "--max-tokens",
            "1000",
        ],
    );
    assert_eq!(out["ok"], true, "{out}");
    assert_eq!(sdk_total(&out["usage"]), USED, "{out}");
    g.assert_charged("openai", USED as f64);
    g.assert_bucket_after_probe(
        "/v1/chat/completions",
        key,
        USED,
        out["sent_at"].as_f64().unwrap(),
        1,
    );
    // Anthropic's usage has no total: input + output, 3,500, is not what this source reads.
    let out = g.sdk(
        "anthropic-messages",
        &[
            "--key",
            "sk-proj-today",
            "--model",
            MODEL,
            "--max-tokens",
            "1000",
        ],
    );
    assert_eq!(out["ok"], true, "{out}");
    assert_eq!(
        g.unreported("anthropic"),
        1.0,
        "no usage.total_tokens in a message"
    );
}
