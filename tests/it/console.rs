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
