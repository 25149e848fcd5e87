//! docker-compose.yml is for users, and no Docker engine runs here. What can break the stack shows
//! only after `docker compose up`, as a container that will not start or a panel that stays empty:
//! a mounted file that is not there, a config the proxy rejects, Prometheus scraping a port nothing
//! serves, a dashboard asking for a datasource or a metric that does not exist. These read the files
//! as Docker, Prometheus and Grafana would and check exactly those.

use crate::support::proxy::BIN;
use serde_yaml::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const COMPOSE: &str = "docker-compose.yml";
const PROMETHEUS_CONFIG: &str = "config/prometheus.yml";
const GRAFANA_DIR: &str = "config/grafana";

/// Every metric the proxy exports. A dashboard querying any other name shows "No data" forever.
const METRICS: &[&str] = &[
    "ratelimit_decisions_total",
    "ratelimit_redis_duration_seconds",
    "ratelimit_redis_errors_total",
    "ratelimit_config_reloads_total",
    "ratelimit_config_last_reload_success",
    "ratelimit_config_info",
];

/// The histograms among them, which queries reach through their `_bucket`, `_sum` and `_count`.
const HISTOGRAMS: &[&str] = &["ratelimit_redis_duration_seconds"];

/// Compose resolves relative paths against the compose file's directory, the crate root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A path for messages: relative to the crate root when it is inside it.
fn shown(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(root().join(path))
        .unwrap_or_else(|e| panic!("{}: cannot read: {e}", shown(path)))
}

/// YAML or JSON (serde_yaml reads both).
fn parse(path: &Path) -> Value {
    serde_yaml::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", shown(path)))
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

fn services() -> Vec<(String, Value)> {
    let compose = parse(Path::new(COMPOSE));
    let services: Vec<_> = compose["services"]
        .as_mapping()
        .unwrap_or_else(|| panic!("{COMPOSE}: no `services:` mapping"))
        .iter()
        .map(|(name, def)| (name.as_str().expect("service name").to_owned(), def.clone()))
        .collect();
    assert!(!services.is_empty(), "{COMPOSE}: no services");
    services
}

/// The one service `is_it` picks out; `what` names it in the failure.
fn service(what: &str, is_it: impl Fn(&Value) -> bool) -> (String, Value) {
    let mut matching: Vec<_> = services().into_iter().filter(|(_, s)| is_it(s)).collect();
    assert_eq!(
        matching.len(),
        1,
        "{COMPOSE}: want exactly one {what} service, found {:?}",
        matching.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    matching.remove(0)
}

fn service_with_image(prefix: &str) -> (String, Value) {
    service(&format!("`{prefix}` image"), |s| {
        s["image"].as_str().is_some_and(|i| i.starts_with(prefix))
    })
}

/// The proxy is the service told which config to load.
fn proxy_service() -> (String, Value) {
    service("`--config`", |s| config_arg(s).is_some())
}

/// A command or entrypoint in either form Compose accepts: a list, or one string.
fn words(value: &Value) -> Vec<String> {
    match value {
        Value::Sequence(items) => items
            .iter()
            .map(|w| w.as_str().expect("a command word").to_owned())
            .collect(),
        Value::String(line) => line.split_whitespace().map(str::to_owned).collect(),
        _ => Vec::new(),
    }
}

/// The container path of `--config PATH` or `--config=PATH` in the service's command.
fn config_arg(service: &Value) -> Option<String> {
    let words = words(&service["command"]);
    words
        .iter()
        .enumerate()
        .find_map(|(i, w)| match w.strip_prefix("--config") {
            Some("") => words.get(i + 1).cloned(),
            Some(rest) => rest.strip_prefix('=').map(str::to_owned),
            None => None,
        })
}

/// A host path mounted into a container. Named volumes have no host path and are left out.
struct Mount {
    source: String,
    target: String,
}

fn bind_mounts(service: &Value) -> Vec<Mount> {
    let volumes = service["volumes"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    volumes
        .iter()
        .filter_map(|v| match v {
            // Short syntax: SOURCE:TARGET[:MODE]; a source that is not a path names a volume.
            Value::String(s) => {
                let mut parts = s.splitn(3, ':');
                let source = parts.next()?;
                let target = parts.next()?;
                let is_path = source.starts_with('.') || source.starts_with('/');
                is_path.then(|| Mount {
                    source: source.to_owned(),
                    target: target.to_owned(),
                })
            }
            _ if v["type"].as_str() == Some("bind") => Some(Mount {
                source: v["source"].as_str()?.to_owned(),
                target: v["target"].as_str()?.to_owned(),
            }),
            _ => None,
        })
        .collect()
}

fn host_source(mount: &Mount) -> PathBuf {
    root().join(mount.source.trim_start_matches("./"))
}

/// Where on the host a path inside the service's container comes from, through the most specific
/// bind mount that covers it (Docker's rule too).
fn host_path(service: &Value, container_path: &str) -> Option<PathBuf> {
    bind_mounts(service)
        .iter()
        .filter_map(|m| {
            let rest = container_path.strip_prefix(m.target.trim_end_matches('/'))?;
            let path = match rest.strip_prefix('/') {
                _ if rest.is_empty() => host_source(m),
                Some(inside) => host_source(m).join(inside),
                None => return None, // /etc/foo does not cover /etc/foobar
            };
            Some((m.target.len(), path))
        })
        .max_by_key(|(specificity, _)| *specificity)
        .map(|(_, path)| path)
}

fn host_path_or_panic(name: &str, service: &Value, container_path: &str) -> PathBuf {
    host_path(service, container_path).unwrap_or_else(|| {
        panic!("{COMPOSE}: service `{name}` uses {container_path}, which no bind mount provides")
    })
}

/// The proxy service's config file: where its container reads it, and where that is on the host.
struct ProxyConfig {
    service: String,
    container_path: String,
    host_path: PathBuf,
}

fn proxy_config() -> ProxyConfig {
    let (service, proxy) = proxy_service();
    let container_path = config_arg(&proxy).expect("proxy_service has --config");
    let host_path = host_path_or_panic(&service, &proxy, &container_path);
    ProxyConfig {
        service,
        container_path,
        host_path,
    }
}

#[test]
fn every_bind_mount_source_exists() {
    let mut mounts = Vec::new();
    for (name, service) in services() {
        mounts.extend(bind_mounts(&service).into_iter().map(|m| (name.clone(), m)));
    }
    assert!(!mounts.is_empty(), "{COMPOSE}: no bind mounts found");
    let missing: Vec<String> = mounts
        .iter()
        .filter(|(_, m)| !host_source(m).exists())
        .map(|(name, m)| format!("service `{name}` mounts {}", m.source))
        .collect();
    assert!(
        missing.is_empty(),
        "{COMPOSE}: bind-mount sources that do not exist:\n{}",
        missing.join("\n")
    );
}

/// (context, Dockerfile) of every service that builds an image, relative to the crate root.
fn builds() -> BTreeSet<(PathBuf, PathBuf)> {
    let builds: BTreeSet<_> = services()
        .iter()
        .filter_map(|(_, s)| {
            let build = &s["build"];
            let (context, dockerfile) = match build {
                Value::String(context) => (context.as_str(), "Dockerfile"),
                Value::Mapping(_) => (
                    build["context"].as_str().unwrap_or("."),
                    build["dockerfile"].as_str().unwrap_or("Dockerfile"),
                ),
                _ => return None,
            };
            let context = PathBuf::from(context);
            Some((context.clone(), context.join(dockerfile)))
        })
        .collect();
    assert!(!builds.is_empty(), "{COMPOSE}: no service has `build:`");
    builds
}

#[test]
fn every_build_context_has_its_dockerfile() {
    for (context, dockerfile) in builds() {
        assert!(
            root().join(&context).is_dir(),
            "{COMPOSE}: build context {} is not a directory",
            context.display()
        );
        assert!(
            root().join(&dockerfile).is_file(),
            "{COMPOSE}: {} does not exist",
            dockerfile.display()
        );
    }
}

/// Dockerfile instructions, one per string: comments dropped, `\` continuations joined.
fn instructions(dockerfile: &str) -> Vec<String> {
    let mut done = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines().map(str::trim) {
        if line.starts_with('#') {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                if !current.trim().is_empty() {
                    done.push(current.trim().to_owned());
                }
                current.clear();
            }
        }
    }
    done
}

/// The build-context paths that COPY and ADD read. `--from` reads another stage, not the context,
/// and ADD of a URL reads the network.
fn copied_sources(dockerfile: &str) -> Vec<String> {
    let mut sources = Vec::new();
    for instruction in instructions(dockerfile) {
        let (keyword, args) = instruction
            .split_once(char::is_whitespace)
            .unwrap_or_default();
        if !["COPY", "ADD"]
            .iter()
            .any(|k| keyword.eq_ignore_ascii_case(k))
        {
            continue;
        }
        let mut rest = args.trim_start();
        let mut flags = Vec::new();
        while rest.starts_with("--") {
            let (flag, after) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            flags.push(flag);
            rest = after.trim_start();
        }
        if flags.iter().any(|f| f.starts_with("--from")) {
            continue;
        }
        let mut words: Vec<String> = if rest.starts_with('[') {
            serde_yaml::from_str(rest).unwrap_or_else(|e| panic!("{instruction}: {e}"))
        } else {
            rest.split_whitespace().map(str::to_owned).collect()
        };
        words.pop(); // the destination
        sources.extend(words.into_iter().filter(|w| !w.contains("://")));
    }
    sources
}

/// Literal `.dockerignore` patterns (globs and exceptions are not evaluated).
fn ignored_paths(context: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root().join(context).join(".dockerignore"));
    text.unwrap_or_default()
        .lines()
        .map(|l| l.trim().trim_matches('/'))
        .filter(|l| !l.is_empty() && !l.starts_with(['#', '!']) && !l.contains(['*', '?', '[']))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_file_the_dockerfile_copies_is_in_the_build_context() {
    for (context, dockerfile) in builds() {
        let sources = copied_sources(&read(&dockerfile));
        assert!(
            !sources.is_empty(),
            "{}: no COPY from the build context found",
            dockerfile.display()
        );
        let ignored = ignored_paths(&context);
        for source in sources {
            let path = source.trim_start_matches("./").trim_end_matches('/');
            assert!(
                root().join(&context).join(path).exists(),
                "{}: COPY {source}: not in the build context {}",
                dockerfile.display(),
                context.display()
            );
            let excluded = ignored
                .iter()
                .find(|p| path == p.as_str() || path.starts_with(&format!("{p}/")));
            assert!(
                excluded.is_none(),
                "{}: COPY {source}: .dockerignore excludes it ({excluded:?})",
                dockerfile.display()
            );
        }
    }
}

#[test]
fn the_proxy_accepts_the_config_compose_gives_it() {
    let config = proxy_config();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&config.host_path)
        .arg("--check")
        .output()
        .unwrap_or_else(|e| panic!("run {BIN}: {e}"));
    assert!(
        out.status.success(),
        "{COMPOSE}: service `{}` loads {} ({}), which `--check` rejects:\n{}",
        config.service,
        config.container_path,
        shown(&config.host_path),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The port the proxy's admin endpoint listens on, asserting that other containers can reach it.
fn admin_port(config_path: &Path) -> u16 {
    // The default the README documents.
    let config = parse(config_path);
    let admin = config["admin"].as_str().unwrap_or("127.0.0.1:9090");
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
    let (prometheus_name, prometheus) = service_with_image("prom/prometheus");
    let mounted = host_path(&prometheus, "/etc/prometheus/prometheus.yml");
    assert_eq!(
        mounted.as_deref(),
        Some(root().join(PROMETHEUS_CONFIG).as_path()),
        "{COMPOSE}: service `{prometheus_name}` must mount {PROMETHEUS_CONFIG} as its config"
    );

    let proxy = proxy_config();
    let want = format!("{}:{}", proxy.service, admin_port(&proxy.host_path));

    let scrape = parse(Path::new(PROMETHEUS_CONFIG));
    let jobs = scrape["scrape_configs"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    let targets_of = |job: &Value| -> Vec<String> {
        let static_configs = job["static_configs"]
            .as_sequence()
            .cloned()
            .unwrap_or_default();
        static_configs
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

/// Grafana's provisioning directory on the host, through the Grafana service's mounts.
fn grafana_provisioning() -> PathBuf {
    let (name, grafana) = service_with_image("grafana/grafana");
    host_path_or_panic(&name, &grafana, "/etc/grafana/provisioning")
}

/// Every entry of the `list_key` list in the provisioning YAML files of `kind`.
fn provisioned(kind: &str, list_key: &str) -> Vec<(PathBuf, Value)> {
    let dir = grafana_provisioning().join(kind);
    let mut entries = Vec::new();
    for file in files(&dir, &["yaml", "yml"]) {
        let items = parse(&file)[list_key]
            .as_sequence()
            .cloned()
            .unwrap_or_default();
        entries.extend(items.into_iter().map(|item| (file.clone(), item)));
    }
    assert!(
        !entries.is_empty(),
        "{}: no `{list_key}:` entries provisioned",
        shown(&dir)
    );
    entries
}

fn datasource_uids() -> Vec<String> {
    provisioned("datasources", "datasources")
        .iter()
        .map(|(file, ds)| {
            let uid = ds["uid"].as_str();
            uid.unwrap_or_else(|| panic!("{}: a datasource without a fixed uid", shown(file)))
                .to_owned()
        })
        .collect()
}

#[test]
fn grafana_datasource_points_at_the_prometheus_service() {
    let (prometheus_name, _) = service_with_image("prom/prometheus");
    // The port the Prometheus image listens on inside the compose network.
    let want = format!("http://{prometheus_name}:9090");
    let datasources = provisioned("datasources", "datasources");
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
    let (name, grafana) = service_with_image("grafana/grafana");
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
    let home = env_var(&grafana, "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH");
    if let Some(home) = home {
        let path = host_path_or_panic(&name, &grafana, &home);
        assert!(
            path.is_file(),
            "{COMPOSE}: Grafana's home dashboard {home} is {}, which does not exist",
            shown(&path)
        );
    }
}

/// A service's environment variable, in either form Compose accepts: a mapping or `KEY=VALUE`s.
fn env_var(service: &Value, key: &str) -> Option<String> {
    let env = &service["environment"];
    if let Some(value) = env[key].as_str() {
        return Some(value.to_owned());
    }
    words(env)
        .iter()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=').map(str::to_owned))
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
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in list.as_sequence().into_iter().flatten() {
            out.push(panel);
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

fn is_row(panel: &Value) -> bool {
    panel["type"].as_str() == Some("row")
}

fn variables(dashboard: &Value) -> Vec<&Value> {
    let list = dashboard["templating"]["list"].as_sequence();
    list.into_iter().flatten().collect()
}

/// Where each query of a dashboard lives, for messages, and the query itself.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or("?");
        for target in panel["targets"].as_sequence().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            found.push((format!("panel {title:?}"), expr.to_owned()));
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
        let title = panel["title"].as_str().unwrap_or("?");
        if !panel["id"].as_u64().is_some_and(|id| ids.insert(id)) {
            problems.push(format!("panel {title:?}: missing or duplicate id"));
        }
        if !panel["gridPos"].is_mapping() {
            problems.push(format!("panel {title:?}: no gridPos"));
        }
        let targets = panel["targets"].as_sequence().into_iter().flatten();
        let has_query = targets
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
        let place = format!("panel {:?}", panel["title"].as_str().unwrap_or("?"));
        let targets = panel["targets"].as_sequence().into_iter().flatten();
        let queried = targets.map(|t| &t["datasource"]).filter(|d| !d.is_null());
        sources.extend(queried.map(|d| (format!("{place}, a query"), d)));
        sources.push((place, &panel["datasource"]));
    }
    for var in variables(dashboard)
        .into_iter()
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
    let uids = datasource_uids();
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
    let histogram_series = ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        name.strip_suffix(suffix)
            .is_some_and(|base| HISTOGRAMS.contains(&base))
    });
    METRICS.contains(&name) || histogram_series
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
            "{file}: metrics the proxy does not export (it exports {METRICS:?}):\n{}",
            unknown.join("\n")
        );
    }
}
