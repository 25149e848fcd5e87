//! docker-compose.yml is for users, and no Docker engine runs here. What can break the stack shows
//! only after `docker compose up`, as a container that will not start or a panel that stays empty:
//! a mounted file that is not there, a config the proxy rejects, Prometheus scraping a port nothing
//! serves, a dashboard asking for a datasource or a metric that does not exist. These read the files
//! as Docker, Prometheus and Grafana would and check exactly those.
//!
//! This module reads the compose file; `docker` checks what building and starting the containers
//! needs, `monitoring` what Prometheus and Grafana need.

mod docker;
mod monitoring;

use serde_yaml::Value;
use std::path::{Path, PathBuf};

const COMPOSE: &str = "docker-compose.yml";

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

/// The items of a YAML list; none when the value is missing or not a list.
fn list(value: &Value) -> &[Value] {
    value.as_sequence().map_or(&[], Vec::as_slice)
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
    list(&service["volumes"])
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
            let path = if rest.is_empty() {
                host_source(m)
            } else {
                // /etc/foo does not cover /etc/foobar
                host_source(m).join(rest.strip_prefix('/')?)
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
    // The proxy is the service told which config to load.
    let (service, proxy) = service("`--config`", |s| config_arg(s).is_some());
    let container_path = config_arg(&proxy).expect("the proxy service has --config");
    let host_path = host_path_or_panic(&service, &proxy, &container_path);
    ProxyConfig {
        service,
        container_path,
        host_path,
    }
}
