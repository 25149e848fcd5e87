//! Raw YAML → validated `Config`, collecting every problem instead of stopping at the first.

use super::locate::{line_of, render, Seg};
use super::raw::{OneOrMany, RawConfig, RawLimit, RawRedis, RawRoute};
use super::*;
use std::collections::HashMap;

pub(super) fn validate(file: &str, text: &str) -> Result<Config, ConfigError> {
    let mut v = Validator {
        file,
        text,
        problems: Vec::new(),
    };
    let config = v.config();
    match config {
        Some(c) if v.problems.is_empty() => Ok(c),
        _ => Err(ConfigError::Invalid(v.problems)),
    }
}

struct Validator<'a> {
    file: &'a str,
    text: &'a str,
    problems: Vec<Problem>,
}

fn key(k: &str) -> Seg {
    Seg::Key(k.to_string())
}

fn at(base: &[Seg], more: &[&str]) -> Vec<Seg> {
    base.iter()
        .cloned()
        .chain(more.iter().map(|k| key(k)))
        .collect()
}

/// Names go into metric labels, store keys and header values: keep them to a safe alphabet.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Validator<'_> {
    fn problem(&mut self, route: Option<&str>, path: Vec<Seg>, message: impl Into<String>) {
        self.problems.push(Problem {
            file: self.file.to_string(),
            line: line_of(self.text, &path),
            route: route.map(str::to_string),
            field: render(&path),
            message: message.into(),
        });
    }

    /// A serde error at `base` (plus the path serde tracked below it).
    fn serde_problem<E: std::fmt::Display>(
        &mut self,
        route: Option<&str>,
        base: &[Seg],
        err: serde_path_to_error::Error<E>,
        location: Option<usize>,
    ) {
        let mut path = base.to_vec();
        for seg in err.path().iter() {
            match seg {
                serde_path_to_error::Segment::Seq { index } => path.push(Seg::Index(*index)),
                serde_path_to_error::Segment::Map { key: k } => path.push(key(k)),
                _ => {}
            }
        }
        // serde_yaml names the map for an unknown key, the field for anything else.
        let own = &path[base.len()..];
        let prefixes = [render(own), render(&own[..own.len().saturating_sub(1)])];
        let message = clean_serde_message(&err.inner().to_string(), &prefixes);
        // "unknown field `x`": point at the key itself, not the map that holds it.
        if let Some(name) = message
            .strip_prefix("unknown field `")
            .and_then(|m| m.split('`').next())
        {
            if path.last() != Some(&key(name)) {
                path.push(key(name));
            }
        }
        let line = location.or_else(|| line_of(self.text, &path));
        self.problems.push(Problem {
            file: self.file.to_string(),
            line,
            route: route.map(str::to_string),
            field: render(&path),
            message,
        });
    }

    fn config(&mut self) -> Option<Config> {
        let de = serde_yaml::Deserializer::from_str(self.text);
        let raw: RawConfig = match serde_path_to_error::deserialize(de) {
            Ok(raw) => raw,
            Err(err) => {
                let location = err.inner().location().map(|l| l.line());
                self.serde_problem(None, &[], err, location);
                return None;
            }
        };
        let listen = self.listen(raw.listen);
        let admin = self.address(
            None,
            vec![key("admin")],
            raw.admin.as_deref().unwrap_or(DEFAULT_ADMIN),
        );
        if let (Some(admin), Some(listen)) = (admin, &listen) {
            if listen.contains(&admin) {
                self.problem(
                    None,
                    vec![key("admin")],
                    "must differ from every listen address",
                );
            }
        }
        let redis = raw.redis.and_then(|r| self.redis(r));
        let default_fail = self.fail_mode(
            None,
            vec![key("on_redis_error")],
            raw.on_redis_error.as_deref(),
        );
        let grace = raw.shutdown_grace_seconds.unwrap_or(5);
        if grace > 3600 {
            self.problem(
                None,
                vec![key("shutdown_grace_seconds")],
                format!("must be at most 3600, got {grace}"),
            );
        }
        let max_keys = raw
            .memory
            .and_then(|m| m.max_keys)
            .unwrap_or(DEFAULT_MAX_KEYS as u64);
        if !(1_000..=1_000_000_000).contains(&max_keys) {
            self.problem(
                None,
                vec![key("memory"), key("max_keys")],
                format!("must be between 1000 and 1000000000, got {max_keys}"),
            );
        }
        let routes = self.routes(raw.routes, default_fail.unwrap_or(FailMode::Open));
        Some(Config {
            listen: listen?,
            admin: admin?,
            redis,
            shutdown_grace: Duration::from_secs(grace),
            memory: MemorySettings {
                max_keys: max_keys as usize,
            },
            routes,
        })
    }

    fn address(&mut self, route: Option<&str>, path: Vec<Seg>, text: &str) -> Option<SocketAddr> {
        match text.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                self.problem(
                    route,
                    path,
                    format!("invalid address {text:?}: expected IP:port, e.g. \"0.0.0.0:8080\""),
                );
                None
            }
        }
    }

    fn listen(&mut self, raw: Option<OneOrMany>) -> Option<Vec<SocketAddr>> {
        let list = match raw {
            None => {
                self.problem(
                    None,
                    vec![key("listen")],
                    "is required: an address like \"0.0.0.0:8080\", or a list of them",
                );
                return None;
            }
            Some(OneOrMany::One(one)) => {
                return self
                    .address(None, vec![key("listen")], &one)
                    .map(|a| vec![a])
            }
            Some(OneOrMany::Many(list)) => list,
        };
        if list.is_empty() {
            self.problem(None, vec![key("listen")], "must name at least one address");
            return None;
        }
        let before = self.problems.len();
        let addrs: Vec<_> = list
            .iter()
            .enumerate()
            .filter_map(|(i, a)| self.address(None, vec![key("listen"), Seg::Index(i)], a))
            .collect();
        (self.problems.len() == before).then_some(addrs)
    }

    fn redis(&mut self, raw: RawRedis) -> Option<RedisSettings> {
        let before = self.problems.len();
        let target = self.redis_target(&raw);
        let password_env = raw.password_env.clone();
        let tls_ca_file = raw.tls_ca_file.clone().map(std::path::PathBuf::from);
        if tls_ca_file
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            self.problem(
                None,
                vec![key("redis"), key("tls_ca_file")],
                "must be a path to a PEM file",
            );
        }
        if let Some(name) = &password_env {
            let valid = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                self.problem(
                    None,
                    vec![key("redis"), key("password_env")],
                    format!("{name:?} is not an environment variable name"),
                );
            }
        }
        let fleet_size = raw.fleet_size.unwrap_or(1);
        if !(1..=1000).contains(&fleet_size) {
            self.problem(
                None,
                vec![key("redis"), key("fleet_size")],
                format!("must be between 1 and 1000, got {fleet_size}"),
            );
        }
        let timeout_ms = raw.timeout_ms.unwrap_or(25);
        if !(1..=60_000).contains(&timeout_ms) {
            self.problem(
                None,
                vec![key("redis"), key("timeout_ms")],
                format!("must be between 1 and 60000, got {timeout_ms}"),
            );
        }
        let key_prefix = raw.key_prefix.unwrap_or_else(|| "rl".to_string());
        if key_prefix.is_empty()
            || key_prefix.len() > 64
            || key_prefix
                .bytes()
                .any(|b| b == b'{' || b == b'}' || !b.is_ascii_graphic())
        {
            self.problem(
                None,
                vec![key("redis"), key("key_prefix")],
                format!("{key_prefix:?} must be 1 to 64 visible ASCII characters without braces"),
            );
        }
        let clock = match raw.clock.as_deref() {
            None | Some("redis") => ClockSource::Redis,
            Some("proxy") => ClockSource::Proxy,
            Some(other) => {
                self.problem(
                    None,
                    vec![key("redis"), key("clock")],
                    format!("must be \"redis\" or \"proxy\", got {other:?}"),
                );
                ClockSource::Redis
            }
        };
        (self.problems.len() == before).then(|| RedisSettings {
            target: target.expect("no problem means a target"),
            password_env,
            tls_ca_file,
            fleet_size,
            timeout: Duration::from_millis(timeout_ms),
            key_prefix,
            clock,
        })
    }

    /// Exactly one of `url`, `cluster` and `sentinel`.
    fn redis_target(&mut self, raw: &RawRedis) -> Option<RedisTarget> {
        let at = |field: &str| vec![key("redis"), key(field)];
        let given = [
            raw.url.is_some(),
            raw.cluster.is_some(),
            raw.sentinel.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            self.problem(
                None,
                vec![key("redis")],
                "needs exactly one of `url` (one server), `cluster` (seed nodes) or `sentinel` \
                 (leave `redis` out to keep limits in memory)",
            );
            return None;
        }
        let before = self.problems.len();
        let check_url = |v: &mut Self, path: Vec<Seg>, url: &str| {
            if !["redis://", "rediss://", "unix://", "redis+unix://"]
                .iter()
                .any(|s| url.starts_with(s))
            {
                v.problem(
                    None,
                    path,
                    format!("{url:?} must start with redis://, rediss:// or unix://"),
                );
            }
        };
        let target = if let Some(url) = &raw.url {
            check_url(self, at("url"), url);
            RedisTarget::Standalone(url.clone())
        } else if let Some(nodes) = &raw.cluster {
            if nodes.is_empty() {
                self.problem(None, at("cluster"), "must list at least one seed node");
            }
            for (i, url) in nodes.iter().enumerate() {
                check_url(self, [at("cluster"), vec![Seg::Index(i)]].concat(), url);
            }
            RedisTarget::Cluster(nodes.clone())
        } else {
            let s = raw.sentinel.as_ref().expect("one of the three is set");
            let master = s.master.clone().unwrap_or_default();
            if master.is_empty() {
                self.problem(
                    None,
                    [at("sentinel"), vec![key("master")]].concat(),
                    "is required: the name the sentinels monitor",
                );
            }
            if s.nodes.is_empty() {
                self.problem(
                    None,
                    [at("sentinel"), vec![key("nodes")]].concat(),
                    "must list at least one sentinel",
                );
            }
            for (i, url) in s.nodes.iter().enumerate() {
                check_url(
                    self,
                    [at("sentinel"), vec![key("nodes"), Seg::Index(i)]].concat(),
                    url,
                );
            }
            RedisTarget::Sentinel {
                master,
                nodes: s.nodes.clone(),
            }
        };
        (self.problems.len() == before).then_some(target)
    }

    fn fail_mode(
        &mut self,
        route: Option<&str>,
        path: Vec<Seg>,
        raw: Option<&str>,
    ) -> Option<FailMode> {
        match raw {
            None => None,
            Some("open") => Some(FailMode::Open),
            Some("closed") => Some(FailMode::Closed),
            Some("local") => Some(FailMode::Local),
            Some(other) => {
                self.problem(
                    route,
                    path,
                    format!("must be \"open\", \"closed\" or \"local\", got {other:?}"),
                );
                None
            }
        }
    }

    fn routes(&mut self, raw: Vec<serde_yaml::Value>, default_fail: FailMode) -> Vec<Route> {
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

    fn limit(&mut self, r: Option<&str>, base: &[Seg], raw: RawLimit) -> Option<Limit> {
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
        let capacity = match raw.capacity {
            None => {
                self.problem(
                    r,
                    at(base, &["capacity"]),
                    "is required: the bucket size (burst), an integer >= 1",
                );
                None
            }
            Some(0) => {
                self.problem(r, at(base, &["capacity"]), "must be an integer >= 1, got 0");
                None
            }
            Some(c) => Some(c),
        };
        let refill = match raw.refill.as_deref() {
            None => {
                self.problem(
                    r,
                    at(base, &["refill"]),
                    "is required: the sustained rate, e.g. \"10/s\"",
                );
                None
            }
            Some(text) => match Rate::parse(text) {
                Ok(rate) => Some(rate),
                Err(msg) => {
                    self.problem(r, at(base, &["refill"]), msg);
                    None
                }
            },
        };
        let key = match raw.key.as_deref() {
            None | Some("client_ip") => Some(KeySource::ClientIp),
            Some("route") => Some(KeySource::Route),
            Some(other) => match other.strip_prefix("header:") {
                Some(h) if !h.is_empty() && http::HeaderName::from_bytes(h.as_bytes()).is_ok() => {
                    Some(KeySource::Header(h.to_ascii_lowercase()))
                }
                _ => {
                    self.problem(
                        r,
                        at(base, &["key"]),
                        format!("must be client_ip, route or header:<Name>, got {other:?}"),
                    );
                    None
                }
            },
        };
        let cost = raw.cost.unwrap_or(1);
        if let Some(cap) = capacity {
            if cost == 0 || cost > cap {
                self.problem(
                    r,
                    at(base, &["cost"]),
                    format!("must be between 1 and the capacity ({cap}), got {cost}"),
                );
            }
        }
        if let (Some(cap), Some(rate)) = (capacity, refill) {
            let units = u128::from(cap) * u128::from(rate.scale()) + u128::from(rate.num());
            if units > u128::from(EXACT_LIMIT) {
                self.problem(r, at(base, &["capacity"]), format!(
                    "capacity {cap} at refill {rate} needs more precision than the store's numbers hold exactly \
                     ({cap} × {} units > 2^53); lower the capacity or use a faster rate", rate.scale()
                ));
            }
        }
        (self.problems.len() == before).then(|| Limit {
            name,
            capacity: capacity.unwrap_or(1),
            refill: refill.expect("no problem means a rate"),
            key: key.unwrap_or(KeySource::ClientIp),
            cost,
        })
    }
}

/// serde_yaml puts " at line L column C" into its messages and may start them with the path; the
/// problem carries both separately. Its type names are Rust's; the operator reads YAML.
fn clean_serde_message(msg: &str, paths: &[String]) -> String {
    let out = paths
        .iter()
        .filter(|p| !p.is_empty())
        .find_map(|p| {
            msg.strip_prefix(p.as_str())
                .and_then(|m| m.strip_prefix(": "))
        })
        .unwrap_or(msg);
    let mut clean = String::with_capacity(out.len());
    let mut rest = out;
    while let Some(i) = rest.find(" at line ") {
        clean.push_str(&rest[..i]);
        let tail = &rest[i + " at line ".len()..];
        let digits = |s: &str| s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let n = digits(tail);
        match tail[n..].strip_prefix(" column ") {
            Some(col) if n > 0 => rest = &col[digits(col)..],
            _ => {
                clean.push_str(" at line ");
                rest = tail;
            }
        }
    }
    clean.push_str(rest);
    clean
        .replace("expected u64", "expected a whole number")
        .replace("expected a string", "expected text")
}
