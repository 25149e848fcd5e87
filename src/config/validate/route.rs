//! One route: its name, match rules, upstream and failure policy; its limits are in `limit`.

use super::{at, key, valid_name, Validator};
use crate::config::locate::Seg;
use crate::config::raw::RawRoute;
use crate::config::*;
use std::collections::HashMap;

impl Validator<'_> {
    pub(super) fn routes(
        &mut self,
        raw: Vec<serde_yaml::Value>,
        default_fail: FailMode,
    ) -> Vec<Route> {
        if raw.is_empty() {
            self.problem(None, vec![key("routes")], "at least one route is required");
        }
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut routes = Vec::new();
        for (i, value) in raw.into_iter().enumerate() {
            let base = vec![key("routes"), Seg::Index(i)];
            // Name the route in every problem, even when the rest of it fails to parse.
            let label = match value.get("name").and_then(|n| n.as_str()) {
                Some(n) if !n.is_empty() => n.to_string(),
                _ => format!("#{i}"),
            };
            let raw: RawRoute = match serde_path_to_error::deserialize(value) {
                Ok(r) => r,
                Err(err) => {
                    self.serde_problem(Some(&label), &base, err, None);
                    continue;
                }
            };
            if let Some(name) = &raw.name {
                if let Some(first) = seen.insert(name.clone(), i) {
                    self.problem(
                        Some(&label),
                        at(&base, &["name"]),
                        format!("duplicate route name {name:?} (first used by routes[{first}])"),
                    );
                }
            }
            if let Some(route) = self.route(&label, &base, raw, default_fail) {
                routes.push(route);
            }
        }
        routes
    }

    fn route(
        &mut self,
        label: &str,
        base: &[Seg],
        raw: RawRoute,
        default_fail: FailMode,
    ) -> Option<Route> {
        let r = Some(label);
        let before = self.problems.len();
        let name = raw.name.unwrap_or_default();
        if name.is_empty() {
            self.problem(r, at(base, &["name"]), "is required");
        } else if !valid_name(&name) {
            self.problem(
                r,
                at(base, &["name"]),
                format!("{name:?} may contain only A-Z, a-z, 0-9, _ and - (at most 64)"),
            );
        }
        let path_prefix = raw.matcher.path_prefix.unwrap_or_else(|| "/".to_string());
        if !path_prefix.starts_with('/') {
            self.problem(
                r,
                at(base, &["match", "path_prefix"]),
                format!("{path_prefix:?} must start with /"),
            );
        }
        let host = raw.matcher.host.map(|h| h.to_ascii_lowercase());
        if let Some(h) = &host {
            if h.is_empty() || h.contains(':') || !h.bytes().all(|b| b.is_ascii_graphic()) {
                self.problem(
                    r,
                    at(base, &["match", "host"]),
                    format!("{h:?} must be a host name without port or spaces"),
                );
            }
        }
        let methods = raw.matcher.methods.map(|list| {
            if list.is_empty() {
                self.problem(
                    r,
                    at(base, &["match", "methods"]),
                    "must list at least one method, or be left out to match all",
                );
            }
            list.iter()
                .enumerate()
                .map(|(j, m)| {
                    if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic()) {
                        self.problem(
                            r,
                            at(base, &["match", "methods"])
                                .into_iter()
                                .chain([Seg::Index(j)])
                                .collect(),
                            format!("{m:?} is not an HTTP method"),
                        );
                    }
                    m.to_ascii_uppercase()
                })
                .collect()
        });
        let upstream = self.upstream(r, at(base, &["upstream"]), raw.upstream.as_deref());
        let on_redis_error = self
            .fail_mode(
                r,
                at(base, &["on_redis_error"]),
                raw.on_redis_error.as_deref(),
            )
            .unwrap_or(default_fail);
        let mut limit_names: HashMap<String, usize> = HashMap::new();
        let mut limits = Vec::new();
        for (j, raw) in raw.limits.into_iter().enumerate() {
            let lbase: Vec<Seg> = at(base, &["limits"])
                .into_iter()
                .chain([Seg::Index(j)])
                .collect();
            if let Some(n) = &raw.name {
                if let Some(first) = limit_names.insert(n.clone(), j) {
                    self.problem(r, at(&lbase, &["name"]), format!("duplicate limit name {n:?} in this route (first used by limits[{first}])"));
                }
            }
            if let Some(limit) = self.limit(r, &lbase, raw) {
                limits.push(limit);
            }
        }
        (self.problems.len() == before).then(|| Route {
            name,
            path_prefix,
            host,
            methods,
            upstream: upstream.expect("no problem means an upstream"),
            on_redis_error,
            limits,
        })
    }

    fn upstream(&mut self, r: Option<&str>, path: Vec<Seg>, raw: Option<&str>) -> Option<Upstream> {
        let Some(text) = raw else {
            self.problem(
                r,
                path,
                "is required: host:port of the service behind this route",
            );
            return None;
        };
        let parsed = text.rsplit_once(':').and_then(|(host, port)| {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
            (!host.is_empty() && host.bytes().all(|b| b.is_ascii_graphic())).then(|| Upstream {
                host: host.to_string(),
                port,
            })
        });
        if parsed.is_none() {
            self.problem(
                r,
                path,
                format!("invalid upstream {text:?}: expected host:port, e.g. \"127.0.0.1:8000\""),
            );
        }
        parsed
    }
}
