//! The operator's console on the admin listener: `/v1/routes` says what is running (the route
//! table, the file's hash, the last reload) and is never reachable through the proxy listener.

use crate::support::proxy::Proxy;
use crate::support::upstream::Upstream;
use crate::support::wait_for;
use serde_json::Value;
use std::time::Duration;

fn config(upstream: &Upstream, limit: &str) -> String {
    format!(
        "listen: \"{{listen}}\"\nadmin: \"{{admin}}\"\nroutes:\n  - name: api\n    match: {{ path_prefix: \"/api/\", methods: [GET] }}\n    \
         upstream: \"{0}\"\n    limits:\n      - {{ name: {limit}, capacity: 5, refill: \"1/s\", key: [client_ip, \"header:X-Api-Key\"] }}\n  \
         - {{ name: rest, upstream: \"h2c://{0}\" }}\n",
        upstream.addr
    )
}

fn routes(proxy: &Proxy) -> Value {
    let r = proxy.admin_get("/v1/routes");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"));
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body))
}

#[test]
fn v1_routes_says_what_runs_and_what_the_last_reload_did() {
    let upstream = Upstream::start();
    let mut proxy = Proxy::start(&config(&upstream, "burst"));
    let v = routes(&proxy);
    assert_eq!(v["store"], "memory");
    assert_eq!(v["last_reload"]["result"], "start");
    let hash = v["config_hash"].as_str().unwrap().to_string();
    assert_eq!(
        proxy.metric(&format!("ratelimit_config_info{{hash=\"{hash}\"}}")),
        1.0,
        "the same hash as the metric"
    );
    let api = &v["routes"][0];
    assert_eq!(api["name"], "api");
    assert_eq!(api["match"]["path_prefix"], "/api/");
    assert_eq!(api["match"]["methods"], serde_json::json!(["GET"]));
    assert_eq!(
        api["upstreams"],
        serde_json::json!([upstream.addr.to_string()])
    );
    let limit = &api["limits"][0];
    assert_eq!(limit["name"], "burst");
    assert_eq!(limit["capacity"], 5);
    assert_eq!(limit["refill"], "1/s");
    assert_eq!(
        limit["key"],
        serde_json::json!(["client_ip", "header:x-api-key"])
    );
    assert_eq!(
        v["routes"][1]["upstreams"],
        serde_json::json!([format!("h2c://{}", upstream.addr)])
    );

    // A reload applied: the new table, a new hash, success.
    proxy.rewrite_config(&config(&upstream, "renamed"));
    proxy.signal("-HUP");
    let v = wait_for("the reload", Duration::from_secs(10), || {
        let v = routes(&proxy);
        (v["last_reload"]["result"] == "success").then_some(v)
    });
    assert_eq!(v["routes"][0]["limits"][0]["name"], "renamed");
    assert_ne!(v["config_hash"], hash.as_str());

    // A reload refused: the table that runs, and why the new one did not.
    proxy.rewrite_config(&config(&upstream, "renamed").replace("capacity: 5", "capacity: 0"));
    proxy.signal("-HUP");
    let v = wait_for("the refused reload", Duration::from_secs(10), || {
        let v = routes(&proxy);
        (v["last_reload"]["result"] == "failure").then_some(v)
    });
    assert!(
        v["last_reload"]["error"]
            .as_str()
            .unwrap()
            .contains("capacity"),
        "{v:#}"
    );
    assert_eq!(v["routes"][0]["limits"][0]["capacity"], 5);

    // Never through the proxy listener.
    let through = proxy.get("/v1/routes", &[]);
    assert_ne!(through.header("content-type"), Some("application/json"));
}

/// The admin listener's config for a route limited per (address, API key), on `backend`.
fn bucket_config(backend: &crate::scenarios::Backend, upstream: &Upstream, admin: &str) -> String {
    format!(
        "listen: \"{{listen}}\"\nadmin: {admin}\n{}routes:\n  - name: api\n    upstream: \"{}\"\n    limits:\n      \
         - {{ name: pair, capacity: 5, refill: \"1/h\", key: [client_ip, \"header:X-Api-Key\"] }}\n      \
         - {{ name: all, capacity: 100, refill: \"1/h\", key: route }}\n",
        backend.section(2000),
        upstream.addr
    )
}

fn json_of(r: &crate::support::http::Response) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {r:?}"))
}

/// A key's buckets read exactly after three requests, reset with the token (401 without it), and
/// full again for the client, on each store.
fn inspect_and_reset(backend: crate::scenarios::Backend, format: &str) {
    let upstream = Upstream::start();
    let yaml = bucket_config(
        &backend,
        &upstream,
        "{ address: \"{admin}\", token_env: RL_TEST_ADMIN_TOKEN }",
    )
    .replace(
        "timeout_ms: 2000\n",
        &format!("timeout_ms: 2000\n  state_format: {format}\n"),
    );
    let proxy = Proxy::start_with_env(&yaml, &[("RL_TEST_ADMIN_TOKEN", "s3cret")]);
    for _ in 0..3 {
        assert_eq!(proxy.get("/x", &[("X-Api-Key", "alice")]).status, 200);
    }
    let query = "/v1/buckets?route=api&client_ip=127.0.0.1&header:X-Api-Key=alice";
    let r = proxy.admin_get(query);
    assert_eq!(r.status, 200, "{r:?}");
    let v = json_of(&r);
    let pair = &v["limits"][0];
    assert_eq!(pair["limit"], "pair");
    assert_eq!(pair["exists"], true);
    assert_eq!(pair["tokens"], 2, "{v:#}");
    assert_eq!(pair["capacity"], 5);
    assert!(
        pair["store_key"]
            .as_str()
            .unwrap()
            .contains("127.0.0.1|alice"),
        "{v:#}"
    );
    let to_full = pair["seconds_to_full"].as_f64().unwrap();
    assert!(
        to_full > 3.0 * 3600.0 - 60.0 && to_full <= 3.0 * 3600.0,
        "{v:#}"
    );
    assert!(pair["ttl_ms"].as_u64().unwrap() > 0, "{v:#}");
    assert_eq!(v["limits"][1]["tokens"], 97, "the route-wide bucket: {v:#}");
    // Reading wrote nothing: the client's next request still sees 2 left before it.
    assert_eq!(json_of(&proxy.admin_get(query))["limits"][0]["tokens"], 2);

    // Exhausted: the last one refused (with Redis, remembered in this proxy's deny cache).
    let statuses: Vec<u16> = (0..3)
        .map(|_| proxy.get("/x", &[("X-Api-Key", "alice")]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429]);

    // Resetting needs the token.
    let reset = format!("{query}&limit=pair");
    assert_eq!(proxy.admin_request("DELETE", &reset, &[]).status, 401);
    let wrong = [("Authorization", "Bearer nope")];
    assert_eq!(proxy.admin_request("DELETE", &reset, &wrong).status, 401);
    let right = [("Authorization", "Bearer s3cret")];
    let r = proxy.admin_request("DELETE", &reset, &right);
    assert_eq!(r.status, 200, "{r:?}");
    let v = json_of(&r);
    assert_eq!(v["reset"][0]["limit"], "pair");
    assert_eq!(v["reset"][0]["existed"], true);
    assert_eq!(
        v["reset"].as_array().unwrap().len(),
        1,
        "only the limit asked for"
    );
    assert!(
        proxy
            .stderr()
            .contains("admin: reset bucket rl:{api}:pair:127.0.0.1|…"),
        "logged, the key masked: {}",
        proxy.stderr()
    );

    let v = json_of(&proxy.admin_get(query));
    assert_eq!(v["limits"][0]["tokens"], 5);
    assert_eq!(v["limits"][0]["exists"], false);
    assert_eq!(v["limits"][1]["tokens"], 95, "the other limit untouched");
    // Admitted at once: the remembered denial went with the bucket.
    let r = proxy.get("/x", &[("X-Api-Key", "alice")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("x-ratelimit-remaining"), Some("4"), "{r:?}");
}

#[test]
fn a_bucket_is_inspected_and_reset_on_redis_hashes() {
    let redis = crate::support::redis::RedisServer::start();
    inspect_and_reset(crate::scenarios::Backend::Redis(redis), "hash");
}

#[test]
fn a_bucket_is_inspected_and_reset_on_redis_packed() {
    let redis = crate::support::redis::RedisServer::start();
    inspect_and_reset(crate::scenarios::Backend::Redis(redis), "packed");
}

/// The admin read knows the 32-byte value too: a packed_ttl bucket is no "full" bucket to it.
#[test]
fn a_bucket_is_inspected_and_reset_on_redis_packed_ttl() {
    let redis = crate::support::redis::RedisServer::start();
    inspect_and_reset(crate::scenarios::Backend::Redis(redis), "packed_ttl");
}

#[test]
fn a_bucket_is_inspected_and_reset_in_memory() {
    inspect_and_reset(crate::scenarios::Backend::Memory, "-");
}

/// Without `admin.token_env`, nothing can be reset (403), and a bad query says what is wrong.
#[test]
fn without_a_token_nothing_is_reset() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&bucket_config(
        &crate::scenarios::Backend::Memory,
        &upstream,
        "\"{admin}\"",
    ));
    let r = proxy.admin_request(
        "DELETE",
        "/v1/buckets?route=api&key=x",
        &[("Authorization", "Bearer anything")],
    );
    assert_eq!(r.status, 403, "{r:?}");
    let r = proxy.admin_get("/v1/buckets?route=nope");
    assert_eq!(r.status, 400);
    assert!(r.body.contains("no route is named"), "{r:?}");
}

/// Three attacking keys rank above twenty normal ones, with their exact refusal counts (fewer keys
/// than the sketch holds: no error; a 5-minute window, so a minute turning mid-test loses nothing),
/// whichever store (with Redis, most refusals come from the deny cache, without a store call).
fn top_ranks_the_attackers(backend: crate::scenarios::Backend) {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&format!(
        "listen: \"{{listen}}\"\nadmin: \"{{admin}}\"\n{}routes:\n  - name: api\n    upstream: \"{}\"\n    \
         limits: [{{ name: per_key, capacity: 5, refill: \"1/h\", key: \"header:X-Api-Key\" }}]\n",
        backend.section(2000),
        upstream.addr
    ));
    let send = |key: &str, n: usize| {
        for _ in 0..n {
            proxy.get("/x", &[("X-Api-Key", key)]);
        }
    };
    for i in 0..20 {
        send(&format!("normal-{i}"), 6);
    }
    send("attacker-a-4f9a", 65);
    send("attacker-b-77e1", 45);
    send("attacker-c-0d2c", 25);
    let r = proxy.admin_get("/v1/top?route=api&window=5m");
    assert_eq!(r.status, 200, "{r:?}");
    let v = json_of(&r);
    let route = &v["routes"][0];
    assert_eq!(route["route"], "api");
    assert_eq!(route["refusals"], 20 + 60 + 40 + 20, "{v:#}");
    let keys = route["keys"].as_array().unwrap();
    let first: Vec<(&str, u64)> = keys
        .iter()
        .take(4)
        .map(|k| (k["key"].as_str().unwrap(), k["refused"].as_u64().unwrap()))
        .collect();
    // The keys masked (API keys are secrets; the endpoint needs no token): first 3 and last 2.
    assert_eq!(first[0], ("rl:{api:att…9a}:per_key", 60), "{v:#}");
    assert_eq!(first[1], ("rl:{api:att…e1}:per_key", 40), "{v:#}");
    assert_eq!(first[2], ("rl:{api:att…2c}:per_key", 20), "{v:#}");
    assert!(!r.body.contains("attacker"), "no key readable whole: {v:#}");
    assert_eq!(first[3].1, 1, "then the normal keys: {v:#}");
    assert_eq!(keys.len(), 23);
    assert!(keys.iter().all(|k| k["error"] == 0), "{v:#}");
    assert_eq!(proxy.admin_get("/v1/top?window=2h").status, 400);
}

#[test]
fn top_ranks_the_attackers_in_memory() {
    top_ranks_the_attackers(crate::scenarios::Backend::Memory);
}

#[test]
fn top_ranks_the_attackers_on_redis() {
    top_ranks_the_attackers(crate::scenarios::Backend::Redis(
        crate::support::redis::RedisServer::start(),
    ));
}
