//! What Prometheus and Grafana need to show the proxy's metrics: a scrape target that serves them,
//! a provisioned datasource and dashboards Grafana finds, and queries for metrics that exist.

use super::{
    env_var, host_path, host_path_or_panic, list, parse, proxy_config, root, service_with_image,
    shown, words, COMPOSE,
};
use serde_yaml::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const PROMETHEUS_IMAGE: &str = "prom/prometheus";
const PROMETHEUS_CONFIG: &str = "config/prometheus.yml";
const GRAFANA_IMAGE: &str = "grafana/grafana";
const GRAFANA_DIR: &str = "config/grafana";

/// Every metric the proxy exports. A dashboard querying any other name shows "No data" forever.
/// The metric families the proxy registers, and which of them are histograms: read from the
/// proxy's own `Metrics`, so this list cannot fall behind it.
fn exported() -> (Vec<String>, Vec<String>) {
    let registry = prometheus::Registry::new();
    let metrics =
        ratelimit_proxy::metrics::Metrics::new(&registry, true).expect("metrics register");
    // Per-route families appear once a route has its counters, the config's once one runs.
    metrics.route("r");
    metrics.config_running("0");
    let families = registry.gather();
    let names = families.iter().map(|f| f.name().to_string()).collect();
    let histograms = families
        .iter()
        .filter(|f| f.get_field_type() == prometheus::proto::MetricType::HISTOGRAM)
        .map(|f| f.name().to_string())
        .collect();
    (names, histograms)
}

/// Every file under `dir` whose extension is one of `exts`, sorted.
fn files(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: cannot list: {e}", shown(dir)));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            found.extend(files(&path, exts));
        } else if path
            .extension()
            .is_some_and(|x| exts.iter().any(|e| x == *e))
        {
            found.push(path);
        }
    }
    found.sort();
    found
}

/// The port the proxy's admin endpoint listens on, asserting that other containers can reach it.
fn admin_port(config_path: &Path) -> u16 {
    // The default the README documents.
    let config = parse(config_path);
    let admin = config["admin"]
        .as_str()
        .or_else(|| config["admin"]["address"].as_str())
        .unwrap_or("127.0.0.1:9090");
    let (host, port) = admin
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{}: admin {admin:?} has no port", shown(config_path)));
    assert!(
        ["0.0.0.0", "[::]"].contains(&host),
        "{}: admin listens on {admin}, which Prometheus in another container cannot reach",
        shown(config_path)
    );
    port.parse()
        .unwrap_or_else(|e| panic!("{}: admin port {port:?}: {e}", shown(config_path)))
}

#[test]
fn prometheus_scrapes_the_proxy_admin_port() {
    let (prometheus_name, prometheus) = service_with_image(PROMETHEUS_IMAGE);
    let mounted = host_path(&prometheus, "/etc/prometheus/prometheus.yml");
    assert_eq!(
        mounted.as_deref(),
        Some(root().join(PROMETHEUS_CONFIG).as_path()),
        "{COMPOSE}: service `{prometheus_name}` must mount {PROMETHEUS_CONFIG} as its config"
    );

    let proxy = proxy_config();
    let want = format!("{}:{}", proxy.service, admin_port(&proxy.host_path));
    // Prometheus sends the target as its Host: the admin answers only names it was given.
    let allowed = words(&parse(&proxy.host_path)["admin"]["allowed_hosts"]);
    assert!(
        allowed.contains(&proxy.service),
        "{}: admin.allowed_hosts must name `{}`, the Host Prometheus scrapes it by; has {allowed:?}",
        shown(&proxy.host_path),
        proxy.service
    );

    let scrape = parse(Path::new(PROMETHEUS_CONFIG));
    let jobs = list(&scrape["scrape_configs"]);
    let targets_of = |job: &Value| -> Vec<String> {
        list(&job["static_configs"])
            .iter()
            .flat_map(|c| words(&c["targets"]))
            .collect()
    };
    let all: Vec<String> = jobs.iter().flat_map(targets_of).collect();
    assert!(
        !all.is_empty(),
        "{PROMETHEUS_CONFIG}: no static targets found"
    );
    let job = jobs
        .iter()
        .find(|j| targets_of(j).contains(&want))
        .unwrap_or_else(|| panic!("{PROMETHEUS_CONFIG}: no job scrapes {want}; targets: {all:?}"));
    let metrics_path = job["metrics_path"].as_str().unwrap_or("/metrics");
    assert_eq!(
        metrics_path, "/metrics",
        "{PROMETHEUS_CONFIG}: the job scraping {want} has the wrong metrics_path"
    );
}

/// Every entry of the `list_key` list in the provisioning YAML files of `kind`, found through the
/// Grafana service's mounts.
fn provisioned(kind: &str, list_key: &str) -> Vec<(PathBuf, Value)> {
    let (name, grafana) = service_with_image(GRAFANA_IMAGE);
    let dir = host_path_or_panic(&name, &grafana, "/etc/grafana/provisioning").join(kind);
    let mut entries = Vec::new();
    for file in files(&dir, &["yaml", "yml"]) {
        let items = list(&parse(&file)[list_key]).to_vec();
        entries.extend(items.into_iter().map(|item| (file.clone(), item)));
    }
    assert!(
        !entries.is_empty(),
        "{}: no `{list_key}:` entries provisioned",
        shown(&dir)
    );
    entries
}

fn datasources() -> Vec<(PathBuf, Value)> {
    provisioned("datasources", "datasources")
}

#[test]
fn grafana_datasource_points_at_the_prometheus_service() {
    let (prometheus_name, _) = service_with_image(PROMETHEUS_IMAGE);
    // The port the Prometheus image listens on inside the compose network.
    let want = format!("http://{prometheus_name}:9090");
    let datasources = datasources();
    let prometheus: Vec<_> = datasources
        .iter()
        .filter(|(_, ds)| ds["type"].as_str() == Some("prometheus"))
        .collect();
    assert!(
        !prometheus.is_empty(),
        "{GRAFANA_DIR}: no datasource of type prometheus"
    );
    for (file, ds) in prometheus {
        assert_eq!(
            ds["url"].as_str(),
            Some(want.as_str()),
            "{}: datasource {:?} does not point at the `{prometheus_name}` service",
            shown(file),
            ds["name"].as_str().unwrap_or("?")
        );
    }
}

#[test]
fn grafana_loads_the_dashboards_from_their_mounted_directory() {
    let (name, grafana) = service_with_image(GRAFANA_IMAGE);
    for (file, provider) in provisioned("dashboards", "providers") {
        let container_dir = provider["options"]["path"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: a provider without options.path", shown(&file)));
        let dir = host_path_or_panic(&name, &grafana, container_dir);
        assert!(
            dir.is_dir() && !files(&dir, &["json"]).is_empty(),
            "{}: provider path {container_dir} is {} on the host, which holds no dashboard JSON",
            shown(&file),
            shown(&dir)
        );
    }
    if let Some(home) = env_var(&grafana, "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH") {
        let path = host_path_or_panic(&name, &grafana, &home);
        assert!(
            path.is_file(),
            "{COMPOSE}: Grafana's home dashboard {home} is {}, which does not exist",
            shown(&path)
        );
    }
}

fn dashboards() -> Vec<(PathBuf, Value)> {
    let found: Vec<_> = files(&root().join(GRAFANA_DIR), &["json"])
        .into_iter()
        .map(|path| {
            let dashboard = parse(&path);
            (path, dashboard)
        })
        .collect();
    assert!(!found.is_empty(), "{GRAFANA_DIR}: no dashboard JSON");
    found
}

/// Every panel, including those nested in collapsed rows.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(parent: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in list(&parent["panels"]) {
            out.push(panel);
            walk(panel, out);
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out
}

fn title(panel: &Value) -> &str {
    panel["title"].as_str().unwrap_or("?")
}

fn is_row(panel: &Value) -> bool {
    panel["type"].as_str() == Some("row")
}

fn variables(dashboard: &Value) -> &[Value] {
    list(&dashboard["templating"]["list"])
}

/// Where each query of a dashboard lives, for messages, and the query itself.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for panel in panels(dashboard) {
        for target in list(&panel["targets"]) {
            let expr = target["expr"].as_str().unwrap_or_default();
            found.push((format!("panel {:?}", title(panel)), expr.to_owned()));
        }
    }
    for var in variables(dashboard) {
        let name = var["name"].as_str().unwrap_or("?");
        let query = &var["query"];
        let query = query
            .as_str()
            .or(query["query"].as_str())
            .unwrap_or_default();
        found.push((format!("variable ${name}"), query.to_owned()));
    }
    found
}

/// What would stop Grafana from loading a dashboard or leave a panel empty, short of its queries.
fn structure_problems(dashboard: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for key in ["uid", "title"] {
        if !dashboard[key].is_string() {
            problems.push(format!("no `{key}`"));
        }
    }
    if !dashboard["schemaVersion"].is_u64() {
        problems.push("no `schemaVersion`".into());
    }
    let panels = panels(dashboard);
    if panels.is_empty() {
        problems.push("no panels".into());
    }
    let mut ids = BTreeSet::new();
    for panel in panels {
        let title = title(panel);
        if !panel["id"].as_u64().is_some_and(|id| ids.insert(id)) {
            problems.push(format!("panel {title:?}: missing or duplicate id"));
        }
        if !panel["gridPos"].is_mapping() {
            problems.push(format!("panel {title:?}: no gridPos"));
        }
        let has_query = list(&panel["targets"])
            .iter()
            .filter_map(|t| t["expr"].as_str())
            .any(|e| !e.is_empty());
        if !is_row(panel) && !has_query {
            problems.push(format!("panel {title:?}: no query"));
        }
    }
    problems
}

#[test]
fn every_dashboard_is_importable() {
    for (path, dashboard) in dashboards() {
        let problems = structure_problems(&dashboard);
        assert!(
            problems.is_empty(),
            "{}:\n{}",
            shown(&path),
            problems.join("\n")
        );
    }
}

/// Panels, their queries and variables whose datasource is not one of `uids`. Rows have none.
fn datasource_problems(dashboard: &Value, uids: &[String]) -> Vec<String> {
    let mut sources: Vec<(String, &Value)> = Vec::new();
    for panel in panels(dashboard).into_iter().filter(|p| !is_row(p)) {
        let place = format!("panel {:?}", title(panel));
        let targets = list(&panel["targets"]).iter();
        let queried = targets.map(|t| &t["datasource"]).filter(|d| !d.is_null());
        sources.extend(queried.map(|d| (format!("{place}, a query"), d)));
        sources.push((place, &panel["datasource"]));
    }
    for var in variables(dashboard)
        .iter()
        .filter(|v| !v["datasource"].is_null())
    {
        let place = format!("variable ${}", var["name"].as_str().unwrap_or("?"));
        sources.push((place, &var["datasource"]));
    }
    sources
        .into_iter()
        .filter_map(|(place, source)| match source["uid"].as_str() {
            Some(uid) if uids.iter().any(|k| k == uid) => None,
            Some(uid) => Some(format!("{place}: datasource uid {uid:?}")),
            None => Some(format!("{place}: no datasource uid")),
        })
        .collect()
}

#[test]
fn every_dashboard_uses_the_provisioned_datasource() {
    let uids: Vec<String> = datasources()
        .iter()
        .map(|(file, ds)| {
            let uid = ds["uid"].as_str();
            uid.unwrap_or_else(|| panic!("{}: a datasource without a fixed uid", shown(file)))
                .to_owned()
        })
        .collect();
    for (path, dashboard) in dashboards() {
        let problems = datasource_problems(&dashboard, &uids);
        assert!(
            problems.is_empty(),
            "{}: the provisioned datasource uids are {uids:?}:\n{}",
            shown(&path),
            problems.join("\n")
        );
    }
}

/// The `ratelimit_*` names a PromQL expression mentions.
fn metric_names(expr: &str) -> Vec<&str> {
    let in_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("ratelimit_") {
        let len = rest[at..].find(|c| !in_name(c)).unwrap_or(rest.len() - at);
        if !rest[..at].ends_with(in_name) {
            names.push(&rest[at..at + len]);
        }
        rest = &rest[at + len..];
    }
    names
}

fn is_exported(name: &str) -> bool {
    let (names, histograms) = exported();
    let histogram_series = ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        name.strip_suffix(suffix)
            .is_some_and(|base| histograms.iter().any(|h| h == base))
    });
    names.iter().any(|n| n == name) || histogram_series
}

#[test]
fn metric_names_are_found_whole() {
    assert_eq!(
        metric_names("sum(rate(ratelimit_a_total{x=\"y\"}[1m])) / my_ratelimit_b + ratelimit_c:d"),
        ["ratelimit_a_total", "ratelimit_c:d"]
    );
    assert!(is_exported("ratelimit_redis_duration_seconds_bucket"));
    assert!(!is_exported("ratelimit_decisions_total_bucket"));
    assert!(!is_exported("ratelimit_decisions"));
}

#[test]
fn every_dashboard_queries_only_metrics_the_proxy_exports() {
    for (path, dashboard) in dashboards() {
        let file = shown(&path);
        let queries = queries(&dashboard);
        let mentioned: Vec<(String, &str)> = queries
            .iter()
            .flat_map(|(place, expr)| metric_names(expr).into_iter().map(|n| (place.clone(), n)))
            .collect();
        assert!(
            !mentioned.is_empty(),
            "{file}: no query mentions a ratelimit_* metric"
        );
        let unknown: Vec<String> = mentioned
            .iter()
            .filter(|(_, name)| !is_exported(name))
            .map(|(place, name)| format!("{place}: {name}"))
            .collect();
        assert!(
            unknown.is_empty(),
            "{file}: metrics the proxy does not export (it exports {:?}):\n{}",
            exported().0,
            unknown.join("\n")
        );
    }
}
