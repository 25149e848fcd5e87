//! The LLM clients people really use, through the real proxy: the `openai` SDK sends its key as
//! `Authorization: Bearer`, the `anthropic` SDK as `x-api-key`. Bearer tokens are keys that are
//! never shown; a missing key is a 401, not a rate limit; refusals come in the error objects the
//! SDKs parse, with the exact wait they read first (`retry-after-ms`) and, for an exhausted quota,
//! `x-should-retry: false`; and the headers name the limit with the fewest requests left.

use crate::scenarios::{Backend, Setup};
use crate::support::http::Response;
use crate::support::proxy;
use crate::support::redis::RedisServer;
use crate::support::wait_for;
use serde_json::{json, Value};
use std::process::Command;
use std::time::Duration;

const SDK_CLIENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/it/support/sdk_client.py"
);

fn redis() -> Backend {
    Backend::Redis(RedisServer::start())
}

/// What one SDK call ended with.
#[derive(Debug)]
struct Call {
    ok: bool,
    status: u16,
    error: String,
    body: Value,
    headers: Value,
    seconds: f64,
}

/// `calls` calls of `sdk` (`openai` or `anthropic`) with `key` to the proxy's `base`, each with
/// the SDK's own retries (`max_retries`).
fn sdk(sdk: &str, s: &Setup, base: &str, key: &str, max_retries: u32, calls: usize) -> Vec<Call> {
    let url = format!("http://{}{base}", s.proxy.addr);
    let out = Command::new("python3")
        .args([SDK_CLIENT, sdk, &url, key])
        .arg(max_retries.to_string())
        .arg(calls.to_string())
        // Straight to the proxy, whatever the environment says.
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("all_proxy")
        .output()
        .expect("python3 with the openai and anthropic SDKs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{sdk} client: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let calls: Vec<Call> = text
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            Call {
                ok: v["ok"].as_bool().unwrap(),
                status: v["status"].as_u64().unwrap() as u16,
                error: v["error"].as_str().unwrap_or_default().to_string(),
                body: v["body"].clone(),
                headers: v["headers"].clone(),
                seconds: v["seconds"].as_f64().unwrap(),
            }
        })
        .collect();
    calls
}

fn json_of(r: &Response) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {r:?}"))
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Two tokens are two buckets; the token is stored only hashed, and appears nowhere an operator
/// looks: not in Redis, not in the admin API's top keys or bucket answers, not in `--check`, not in
/// the proxy's log (at debug). Each hostile spelling of `Authorization` is decided as the RFCs
/// spell a bearer token: another case or more spaces are the same token; a lone scheme, another
/// scheme, a token with more words after it, or two headers carry none.
#[test]
fn bearer_tokens_are_keys_that_are_never_shown() {
    let alice = "sk-alice-0123456789";
    let bob = "sk-bob";
    let s = Setup::start(
        redis(),
        "  - name: llm
    match: { path_prefix: \"/v1/\" }
    upstream: \"{upstream}\"
    limits: [{ name: per_token, capacity: 2, refill: \"1/h\", key: bearer, on_missing_key: deny }]
",
    );
    let p = &s.proxy;
    let get = |auth: &[&str]| {
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", *a)).collect();
        p.get("/v1/models", &headers)
    };
    assert_eq!(get(&[&bearer(alice)]).status, 200);
    // The scheme in another case, more spaces, whitespace around: the same token, the same bucket.
    let r = get(&[&format!("bearer   {alice}  ")]);
    assert_eq!(
        (r.status, r.header("x-ratelimit-remaining")),
        (200, Some("0"))
    );
    let r = get(&[&format!("BEARER {alice}")]);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(
        get(&[&bearer(bob)]).status,
        200,
        "another token, another bucket"
    );

    // No bearer token at all: refused for want of a key (401), never counted against a bucket.
    let bob_twice = [bearer(bob), bearer(bob)];
    let bob_twice: Vec<&str> = bob_twice.iter().map(String::as_str).collect();
    let spellings: [&[&str]; 7] = [
        &["Bearer"],
        &["Bearer   "],
        &["Basic YWxpY2U6c2VjcmV0"],
        &["Bearer sk-bob extra"],
        &["Bearertoken"],
        &bob_twice,
        &[],
    ];
    for auth in spellings {
        let r = get(auth);
        assert_eq!(r.status, 401, "{auth:?}: {r:?}");
        assert!(!r.has_ratelimit_headers(), "{auth:?}: {r:?}");
        assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"llm\""));
    }
    assert_eq!(s.upstream.hits(), 3);
    assert_eq!(s.proxy.decisions("llm", "rejected"), 1 + 7);

    // Redis holds the hash, never the token.
    let Backend::Redis(redis) = &s.backend else {
        unreachable!()
    };
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    let sha = |t: &str| sha1_smol::Sha1::from(t).digest().to_string();
    for (token, hashed) in [(alice, sha(alice)), (bob, sha(bob))] {
        assert!(
            keys.contains(&format!("rl:{{llm:#{hashed}}}:per_token")),
            "{keys:?}"
        );
        assert!(!keys.iter().any(|k| k.contains(token)), "{keys:?}");
    }
    // The admin API: the most refused keys, and a bucket looked up by the token itself.
    let top = p.admin_get("/v1/top?route=llm");
    assert_eq!(top.status, 200, "{top:?}");
    assert!(top.body.contains(&sha(alice)), "{}", top.body);
    let looked_up = p.admin_get(&format!("/v1/buckets?route=llm&key={alice}"));
    assert_eq!(looked_up.status, 200, "{looked_up:?}");
    assert_eq!(json_of(&looked_up)["limits"][0]["tokens"], 0);
    let check = proxy::check(p.config_path());
    let check_out = String::from_utf8_lossy(&check.stdout).to_string();
    assert!(
        check_out.contains(
            "per bearer (the Authorization: Bearer token, hashed) (key missing: refused)"
        ),
        "{check_out}"
    );
    assert!(
        check_out.contains("| deny 429 text, missing key 401"),
        "{check_out}"
    );
    let log = p.stderr();
    for shown in [&top.body, &looked_up.body, &check_out, &log] {
        for token in [alice, bob] {
            assert!(!shown.contains(token), "{token} shown in:\n{shown}");
        }
    }
}

/// `header:x-api-key|bearer`: whichever way an SDK sends the secret, one bucket. The real openai
/// SDK (Bearer) and anthropic SDK (x-api-key) with the same key share it; another key has its own.
#[test]
fn one_secret_sent_either_way_is_one_bucket() {
    let s = Setup::start(
        redis(),
        "  - name: gateway
    upstream: \"{upstream}\"
    deny: { format: anthropic }
    limits: [{ name: per_key, capacity: 2, refill: \"1/h\", key: \"header:x-api-key|bearer\" }]
",
    );
    let key = "sk-shared-secret";
    let first = sdk("openai", &s, "/v1", key, 0, 1);
    assert!(first[0].ok, "{first:?}");
    assert_eq!(first[0].headers["x-ratelimit-remaining"], "1");
    let then = sdk("anthropic", &s, "", key, 0, 2);
    assert!(then[0].ok, "{then:?}");
    assert_eq!(then[0].headers["x-ratelimit-remaining"], "0");
    assert!(!then[1].ok, "{then:?}");
    assert_eq!(
        (then[1].status, then[1].error.as_str()),
        (429, "RateLimitError")
    );
    assert_eq!(then[1].body["error"]["type"], "rate_limit_error");
    let other = sdk("openai", &s, "/v1", "sk-another", 0, 1);
    assert!(other[0].ok, "{other:?}");
    // Both ways, the hash of the secret is the key.
    let Backend::Redis(redis) = &s.backend else {
        unreachable!()
    };
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    let hashed = sha1_smol::Sha1::from(key).digest().to_string();
    assert_eq!(
        keys.iter().filter(|k| k.contains(&hashed)).count(),
        1,
        "{keys:?}"
    );
    assert_eq!(s.upstream.hits(), 3);
}

/// A limit with `on_missing_key: deny` and no key: 401 (or the route's `missing_key_status`) in
/// the route's format, saying the key is missing, with no `Retry-After` and no rate-limit headers.
#[test]
fn a_missing_key_is_a_401_in_every_format() {
    let limit = "limits: [{ name: per_key, capacity: 5, refill: \"1/h\", key: \"header:x-api-key|bearer\", on_missing_key: deny }]";
    let route = |name: &str, deny: &str| {
        format!("  - name: {name}\n    match: {{ path_prefix: \"/{name}/\" }}\n    upstream: \"{{upstream}}\"\n    deny: {deny}\n    {limit}\n")
    };
    let routes = [
        route("text", "{ status: 429 }"),
        route("problem", "{ format: problem_json }"),
        route("openai", "{ format: openai }"),
        route("anthropic", "{ format: anthropic }"),
        route("forbidden", "{ format: openai, missing_key_status: 403 }"),
    ]
    .concat();
    let s = Setup::start(redis(), &routes);
    let missing = |name: &str| {
        let r = s.proxy.get(&format!("/{name}/x"), &[]);
        assert!(!r.has_ratelimit_headers(), "{r:?}");
        assert_eq!(r.header("retry-after-ms"), None, "{r:?}");
        assert_eq!(r.header("x-should-retry"), None, "{r:?}");
        r
    };
    let why = |route: &str| {
        format!("limit \"per_key\" of route \"{route}\" needs a key this request does not carry")
    };

    let r = missing("text");
    assert_eq!(r.status, 401);
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(r.body, format!("401 Unauthorized: {}\n", why("text")));
    assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"text\""));

    let r = missing("problem");
    assert_eq!(r.status, 401);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(
        json_of(&r),
        json!({"type": "about:blank", "title": "Unauthorized", "status": 401,
               "detail": why("problem").replace('"', "'")})
    );

    let r = missing("openai");
    assert_eq!(r.status, 401);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        json_of(&r),
        json!({"error": {"message": why("openai"), "type": "invalid_request_error",
                         "param": null, "code": "missing_api_key"}})
    );

    let r = missing("anthropic");
    assert_eq!(r.status, 401);
    assert_eq!(
        json_of(&r),
        json!({"type": "error", "error": {"type": "authentication_error", "message": why("anthropic")}})
    );

    let r = missing("forbidden");
    assert_eq!(r.status, 403);
    assert_eq!(
        r.header("www-authenticate"),
        None,
        "a challenge goes with a 401 only"
    );
    assert_eq!(json_of(&r)["error"]["code"], "missing_api_key");

    assert_eq!(s.upstream.hits(), 0);
    // With the key, the same routes pass.
    let r = s.proxy.get("/openai/x", &[("x-api-key", "k")]);
    assert_eq!(r.status, 200, "{r:?}");
}

/// A bucket's refusal in the SDK formats: the error object the SDK raises, `retry-after-ms` the
/// exact wait (whose seconds, rounded up, are `Retry-After`), and the SDK itself waiting that long,
/// not `Retry-After`'s whole second, before its retry succeeds.
#[test]
fn sdk_formats_refuse_with_their_error_objects_and_the_exact_wait() {
    // One token, a new one every 250 ms.
    let route = |name: &str, base: &str| {
        format!("  - name: {name}\n    match: {{ path_prefix: \"{base}\" }}\n    upstream: \"{{upstream}}\"\n    \
                 deny: {{ format: {name} }}\n    \
                 limits: [{{ name: per_key, capacity: 1, refill: \"4/s\", key: \"header:x-api-key|bearer\" }}]\n")
    };
    let s = Setup::start(
        redis(),
        &[
            route("openai", "/v1/chat/"),
            route("anthropic", "/v1/messages"),
        ]
        .concat(),
    );
    for (name, path, want) in [
        (
            "openai",
            "/v1/chat/completions",
            json!({"error": {"message": "", "type": "rate_limit_exceeded",
                             "param": null, "code": "rate_limit_exceeded"}}),
        ),
        (
            "anthropic",
            "/v1/messages",
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": ""}}),
        ),
    ] {
        let auth = [("Authorization", "Bearer sk-raw")];
        assert_eq!(s.proxy.get(path, &auth).status, 200);
        let r = s.proxy.get(path, &auth);
        assert_eq!(r.status, 429, "{r:?}");
        assert_eq!(r.header("content-type"), Some("application/json"));
        let ms: u64 = r.header("retry-after-ms").unwrap().parse().unwrap();
        let secs: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=250).contains(&ms), "{r:?}");
        assert_eq!(secs, ms.div_ceil(1000), "{r:?}");
        assert_eq!(r.header("x-should-retry"), None, "a bucket refills: {r:?}");
        let mut body = json_of(&r);
        let message = &mut body["error"]["message"];
        assert_eq!(
            *message,
            format!("limit \"per_key\" of route \"{name}\" is exhausted; retry in {secs} s")
        );
        *message = json!("");
        assert_eq!(body, want);
    }

    // The real SDKs: the second call is refused, the SDK waits `retry-after-ms` (250 ms at
    // most), retries, and succeeds; had it waited for `Retry-After` it would have taken 1 s.
    for (name, base) in [("openai", "/v1"), ("anthropic", "")] {
        let rejected = s.proxy.decisions(name, "rejected");
        let calls = sdk(name, &s, base, &format!("sk-{name}-sdk"), 2, 2);
        assert!(calls.iter().all(|c| c.ok && c.status == 200), "{calls:?}");
        assert_eq!(
            s.proxy.decisions(name, "rejected"),
            rejected + 1,
            "{calls:?}"
        );
        assert!(
            (0.1..0.9).contains(&calls[1].seconds),
            "{name} waited {} s: {calls:?}",
            calls[1].seconds
        );
    }
}

/// An exhausted calendar quota in the SDK formats: `insufficient_quota` (openai), and
/// `x-should-retry: false`, which both SDKs obey: one attempt, however many retries they allow.
#[test]
fn an_exhausted_quota_tells_the_sdks_not_to_retry() {
    let route = |name: &str, base: &str| {
        format!("  - name: {name}\n    match: {{ path_prefix: \"{base}\" }}\n    upstream: \"{{upstream}}\"\n    \
                 deny: {{ format: {name} }}\n    \
                 limits: [{{ name: daily, quota: {{ amount: 1, period: day }}, key: \"header:x-api-key|bearer\" }}]\n")
    };
    let s = Setup::start(
        redis(),
        &[
            route("openai", "/v1/chat/"),
            route("anthropic", "/v1/messages"),
        ]
        .concat(),
    );
    for (name, base) in [("openai", "/v1"), ("anthropic", "")] {
        let calls = sdk(name, &s, base, "sk-plan", 3, 2);
        assert!(calls[0].ok, "{calls:?}");
        let refused = &calls[1];
        assert_eq!(
            (refused.status, refused.error.as_str()),
            (429, "RateLimitError")
        );
        assert_eq!(refused.headers["x-should-retry"], "false", "{refused:?}");
        let ms: u64 = refused.headers["retry-after-ms"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let secs: u64 = refused.headers["retry-after"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(secs, ms.div_ceil(1000), "{refused:?}");
        let body = &refused.body;
        let message = match name {
            "openai" => {
                // The openai SDK keeps the `error` object as the body.
                assert_eq!(body["type"], "insufficient_quota", "{body}");
                assert_eq!(body["code"], "insufficient_quota", "{body}");
                &body["message"]
            }
            _ => {
                assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
                &body["error"]["message"]
            }
        };
        assert!(
            message
                .as_str()
                .unwrap()
                .contains("(the quota is whole again at "),
            "{body}"
        );
        assert_eq!(
            s.proxy.decisions(name, "rejected"),
            1,
            "the SDK did not retry"
        );
    }
}

/// The route of the issue: 15 tokens left at cost 5 are 3 requests, one lease left is 1, so the
/// concurrency limit binds; 5 tokens (1 request) beside 2 leases, the bucket binds. `RateLimit`
/// lists every limit, the binding one first; a quota reads as its amount per period.
fn the_headers_name_the_limit_with_the_fewest_requests_left(backend: Backend) {
    let s = Setup::start(
        backend,
        "  - name: one_lease
    match: { path_prefix: \"/one/\" }
    upstream: \"{upstream}\"
    limits:
      - { name: tokens, capacity: 20, refill: \"1/h\", cost: 5 }
      - { name: inflight, concurrency: 2 }
  - name: two_leases
    match: { path_prefix: \"/two/\" }
    upstream: \"{upstream}\"
    limits:
      - { name: tokens, capacity: 20, refill: \"1/h\", cost: 5 }
      - { name: inflight, concurrency: 3 }
      - { name: monthly, quota: { amount: 1000, period: month } }
",
    );
    let p = &s.proxy;
    // Each request's lease is released after its response: wait for it, so each request finds
    // every lease free.
    let get = |path: &str, route: &str| {
        let r = p.get(path, &[]);
        let series = format!("ratelimit_inflight{{limit=\"inflight\",route=\"{route}\"}}");
        wait_for("the lease released", Duration::from_secs(5), || {
            (p.metric(&series) == 0.0).then_some(())
        });
        r
    };

    let r = get("/one/x", "one_lease");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"), "{r:?}");
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(
        r.header("ratelimit"),
        Some("\"inflight\";r=1;t=0, \"tokens\";r=15;t=3600")
    );
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"tokens\";q=20;w=72000, \"inflight\";q=2;qu=\"concurrent-requests\"")
    );

    let month = month_secs();
    // Three requests in 15 tokens beside two leases: the leases; two beside two, a tie: the
    // longest reset (the bucket's hours); one beside two: the bucket.
    for (remaining, binding) in [(15, "inflight"), (10, "tokens"), (5, "tokens")] {
        let r = get("/two/x", "two_leases");
        assert_eq!(r.status, 200, "{r:?}");
        let used = (20 - remaining) / 5;
        let rl = r.header("ratelimit").unwrap();
        let (first, _) = rl.split_once(", ").unwrap();
        assert!(first.starts_with(&format!("\"{binding}\";")), "{rl}");
        let items: Vec<&str> = rl.split(", ").collect();
        assert!(items.contains(&"\"inflight\";r=2;t=0"), "{rl}");
        // The next whole token is an hour after the first request, less what has passed since.
        let tokens = items.iter().find(|i| i.starts_with("\"tokens\";")).unwrap();
        let t = tokens.rsplit_once(";t=").unwrap().1.parse::<u64>().unwrap();
        assert_eq!(*tokens, format!("\"tokens\";r={remaining};t={t}"));
        assert!((3590..=3600).contains(&t), "{rl}");
        let monthly = items
            .iter()
            .find(|i| i.starts_with("\"monthly\";"))
            .unwrap();
        let t = monthly
            .rsplit_once(";t=")
            .unwrap()
            .1
            .parse::<u64>()
            .unwrap();
        assert_eq!(*monthly, format!("\"monthly\";r={};t={t}", 1000 - used));
        assert!(t.abs_diff(month.1) <= 5, "{rl}: {month:?}");
        let (limit, left) = match binding {
            "inflight" => ("3", "2".to_string()),
            _ => ("20", remaining.to_string()),
        };
        assert_eq!(r.header("x-ratelimit-limit"), Some(limit), "{r:?}");
        assert_eq!(r.header("x-ratelimit-remaining"), Some(left.as_str()));
        assert_eq!(
            r.header("ratelimit-policy"),
            Some(
                format!(
                    "\"tokens\";q=20;w=72000, \"inflight\";q=3;qu=\"concurrent-requests\", \"monthly\";q=1000;w={}",
                    month.0
                )
                .as_str()
            )
        );
    }
    // 5 tokens, cost 5: one more, then a refusal whose `t` is `Retry-After`: 5 tokens at 1/h.
    assert_eq!(get("/two/x", "two_leases").status, 200);
    let r = get("/two/x", "two_leases");
    assert_eq!(r.status, 429, "{r:?}");
    let retry_after: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((17990..=18000).contains(&retry_after), "{r:?}");
    let rl = r.header("ratelimit").unwrap();
    assert!(
        rl.starts_with(&format!("\"tokens\";r=0;t={retry_after}, \"inflight\";r=")),
        "{rl}"
    );
}

/// This month's length and the seconds left of it, in UTC.
fn month_secs() -> (u64, u64) {
    use ratelimit_proxy::calendar::Period;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    (
        Period::Month.length_secs(now),
        (Period::Month.end(now) - now).div_ceil(1_000_000),
    )
}

#[test]
fn the_headers_name_the_limit_with_the_fewest_requests_left_on_redis() {
    the_headers_name_the_limit_with_the_fewest_requests_left(redis());
}

#[test]
fn the_headers_name_the_limit_with_the_fewest_requests_left_in_memory() {
    the_headers_name_the_limit_with_the_fewest_requests_left(Backend::Memory);
}
