//! One route: its name, match rules, upstream and failure policy; its limits are in `limit`.

use super::{at, key, Validator};
use crate::config::locate::Seg;
use crate::config::raw::{OneOrMany, RawAllow, RawDeny, RawRoute, RawUpstreamTls};
use crate::config::*;
use std::collections::HashMap;

impl Validator<'_> {
    pub(super) fn routes(
        &mut self,
        raw: Vec<serde_yaml::Value>,
        default_fail: FailMode,
        slashes: EscapedSlashes,
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
            if let Some(route) = self.route(&label, &base, raw, default_fail, slashes) {
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
        slashes: EscapedSlashes,
    ) -> Option<Route> {
        let r = Some(label);
        let before = self.problems.len();
        let name = self.name(r, base, raw.name);
        let path_prefix = raw.matcher.path_prefix.unwrap_or_else(|| "/".to_string());
        if !path_prefix.starts_with('/') {
            self.problem(
                r,
                at(base, &["match", "path_prefix"]),
                format!("{path_prefix:?} must start with /"),
            );
        } else {
            // Requests are matched on their canonical path: any other spelling never matches.
            match crate::canonical::normalize_path(path_prefix.as_bytes(), slashes) {
                Ok(canonical) if canonical == path_prefix => {}
                Ok(canonical) => self.problem(
                    r,
                    at(base, &["match", "path_prefix"]),
                    format!(
                        "{path_prefix:?} is not a canonical path, so no request would match it: write {canonical:?}"
                    ),
                ),
                Err(_) => {
                    let kept = crate::canonical::normalize_path(
                        path_prefix.as_bytes(),
                        EscapedSlashes::Keep,
                    );
                    let why = match kept {
                        Ok(_) => "holds an escaped / or \\, and requests that do are refused unless path_escaped_slashes is \"keep\"",
                        Err(_) => "holds a control byte or a malformed escape: no request can match it",
                    };
                    self.problem(
                        r,
                        at(base, &["match", "path_prefix"]),
                        format!("{path_prefix:?} {why}"),
                    );
                }
            }
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
        let upstreams = self.upstreams(r, at(base, &["upstream"]), raw.upstream);
        let upstream_tls = self.upstream_tls(r, base, raw.upstream_tls, &upstreams);
        let timeout = |v: &mut Self, field: &str, raw: Option<u64>, default: u64| {
            let ms = raw.unwrap_or(default);
            if !(1..=3_600_000).contains(&ms) {
                v.problem(
                    r,
                    at(base, &[field]),
                    format!("must be between 1 and 3600000, got {ms}"),
                );
            }
            Duration::from_millis(ms)
        };
        let upstream_timeouts = UpstreamTimeouts {
            connect: timeout(self, "connect_timeout_ms", raw.connect_timeout_ms, 1_000),
            read: timeout(self, "read_timeout_ms", raw.read_timeout_ms, 60_000),
        };
        let health_check = raw.health_check.map(|h| {
            let path = h.path.unwrap_or_else(|| "/".to_string());
            if !path.starts_with('/') {
                self.problem(
                    r,
                    at(base, &["health_check", "path"]),
                    format!("{path:?} must start with /"),
                );
            }
            let interval = h.interval_ms.unwrap_or(2_000);
            if !(100..=3_600_000).contains(&interval) {
                self.problem(
                    r,
                    at(base, &["health_check", "interval_ms"]),
                    format!("must be between 100 and 3600000, got {interval}"),
                );
            }
            HealthCheck {
                path,
                interval: Duration::from_millis(interval),
            }
        });
        let allow = raw
            .allow
            .map(|a| self.allow(r, base, a))
            .unwrap_or_default();
        let deny = self.deny(r, base, raw.deny);
        let on_redis_error = self
            .word(
                r,
                at(base, &["on_redis_error"]),
                raw.on_redis_error.as_deref(),
            )
            .unwrap_or(default_fail);
        let mut limit_names: HashMap<String, usize> = HashMap::new();
        let mut limits = Vec::new();
        let stream_usage = match raw.stream_usage.as_deref() {
            None | Some("off") => false,
            Some("request") => true,
            Some(other) => {
                self.problem(
                    r,
                    at(base, &["stream_usage"]),
                    format!(
                        "must be \"request\" (ask a streaming request to report its usage) or \
                         \"off\", got {other:?}"
                    ),
                );
                false
            }
        };
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
                let read = upstream_timeouts.read.as_millis() as u64;
                if let Allowance::Concurrency {
                    lease_ms: Some(ms), ..
                } = limit.allowance
                {
                    if ms < read {
                        self.problem(
                            r,
                            at(&lbase, &["lease_ms"]),
                            format!(
                                "must be at least the route's read_timeout_ms ({read}), got {ms}: a \
                                 lease that ends while the upstream may still be answering frees a \
                                 slot for another request of the key"
                            ),
                        );
                    }
                }
                limits.push(limit);
            }
        }
        (self.problems.len() == before).then(|| Route {
            name,
            path_prefix,
            host,
            methods,
            upstreams,
            upstream_tls,
            upstream_timeouts,
            health_check,
            on_redis_error,
            shadow: raw.shadow.unwrap_or(false),
            preserve_raw_path: raw.preserve_raw_path.unwrap_or(false),
            allow,
            deny,
            stream_usage,
            limits,
        })
    }

    /// One `host:port` or a list of them.
    fn upstreams(
        &mut self,
        r: Option<&str>,
        path: Vec<Seg>,
        raw: Option<OneOrMany>,
    ) -> Vec<Upstream> {
        let list = match raw {
            None => {
                self.problem(
                    r,
                    path,
                    "is required: host:port of the service behind this route, or a list",
                );
                return Vec::new();
            }
            Some(OneOrMany::One(one)) => return self.upstream(r, path, &one).into_iter().collect(),
            Some(OneOrMany::Many(list)) => list,
        };
        if list.is_empty() {
            self.problem(r, path.clone(), "must name at least one host:port");
        }
        list.iter()
            .enumerate()
            .filter_map(|(i, u)| self.upstream(r, [path.clone(), vec![Seg::Index(i)]].concat(), u))
            .collect()
    }

    /// `host:port`, or `scheme://host:port` where the scheme says how to speak to it.
    fn upstream(&mut self, r: Option<&str>, path: Vec<Seg>, text: &str) -> Option<Upstream> {
        let (scheme, rest) = match text.split_once("://") {
            Some((word, rest)) => match word.parse::<UpstreamScheme>() {
                Ok(scheme) => (scheme, rest),
                Err(message) => {
                    self.problem(
                        r,
                        path,
                        format!("invalid upstream {text:?}: its scheme {message}"),
                    );
                    return None;
                }
            },
            None => (UpstreamScheme::Http, text),
        };
        let parsed = rest.rsplit_once(':').and_then(|(host, port)| {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
            (!host.is_empty() && host.bytes().all(|b| b.is_ascii_graphic() && b != b'/')).then(
                || Upstream {
                    scheme,
                    host: host.to_string(),
                    port,
                },
            )
        });
        if parsed.is_none() {
            self.problem(
                r,
                path,
                format!(
                    "invalid upstream {text:?}: expected host:port, e.g. \"127.0.0.1:8000\", \
                     or scheme://host:port (http, https, h2c)"
                ),
            );
        }
        parsed
    }

    /// `upstream_tls`: only beside an `https://` upstream, its CA file read now.
    fn upstream_tls(
        &mut self,
        r: Option<&str>,
        base: &[Seg],
        raw: Option<RawUpstreamTls>,
        upstreams: &[Upstream],
    ) -> UpstreamTls {
        let Some(raw) = raw else {
            return UpstreamTls::default();
        };
        if !upstreams.iter().any(|u| u.scheme == UpstreamScheme::Https) {
            self.problem(
                r,
                at(base, &["upstream_tls"]),
                "applies to https:// upstreams only, and this route has none",
            );
        }
        let sni = raw.sni.filter(|s| {
            let ok = !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
            if !ok {
                self.problem(
                    r,
                    at(base, &["upstream_tls", "sni"]),
                    format!("{s:?} is not a host name"),
                );
            }
            ok
        });
        let ca = raw.ca_file.and_then(|f| {
            let file = std::path::PathBuf::from(f);
            match crate::tls::load_ca(&file) {
                Ok(certs) => Some(CaBundle { file, certs }),
                Err(e) => {
                    self.problem(r, at(base, &["upstream_tls", "ca_file"]), e);
                    None
                }
            }
        });
        UpstreamTls { sni, ca }
    }

    fn allow(&mut self, r: Option<&str>, base: &[Seg], raw: RawAllow) -> Allow {
        let cidrs = raw
            .cidrs
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c.parse::<Cidr>() {
                Ok(c) => Some(c),
                Err(msg) => {
                    self.problem(
                        r,
                        [at(base, &["allow", "cidrs"]), vec![Seg::Index(i)]].concat(),
                        msg,
                    );
                    None
                }
            })
            .collect();
        let headers = raw
            .headers
            .into_iter()
            .filter_map(|(name, value)| {
                if http::HeaderName::from_bytes(name.as_bytes()).is_err() || value.is_empty() {
                    self.problem(
                        r,
                        at(base, &["allow", "headers", &name]),
                        format!("{name:?} must be a header name with a non-empty value"),
                    );
                    return None;
                }
                Some((name.to_ascii_lowercase(), value))
            })
            .collect();
        Allow { cidrs, headers }
    }

    fn deny(&mut self, r: Option<&str>, base: &[Seg], raw: Option<RawDeny>) -> DenyResponse {
        let Some(raw) = raw else {
            return DenyResponse {
                status: 429,
                missing_key_status: DEFAULT_MISSING_KEY_STATUS,
                format: DenyFormat::Text,
            };
        };
        let status = raw.status.unwrap_or(429);
        if !(400..=599).contains(&status) {
            self.problem(
                r,
                at(base, &["deny", "status"]),
                format!("must be a 4xx or 5xx status, got {status}"),
            );
        }
        let name = self
            .word(r, at(base, &["deny", "format"]), raw.format.as_deref())
            .unwrap_or(DenyFormatName::Text);
        let own = |name: DenyFormatName| match name {
            DenyFormatName::ProblemJson => Some(DenyFormat::ProblemJson),
            DenyFormatName::OpenAi => Some(DenyFormat::OpenAi),
            DenyFormatName::Anthropic => Some(DenyFormat::Anthropic),
            DenyFormatName::Text => None,
        };
        let format = match (own(name), raw.body) {
            (None, None) => DenyFormat::Text,
            (None, Some(body)) => DenyFormat::Custom {
                body,
                content_type: raw
                    .content_type
                    .unwrap_or_else(|| "text/plain; charset=utf-8".into()),
            },
            (Some(format), None) if raw.content_type.is_none() => format,
            (Some(format), _) => {
                self.problem(
                    r,
                    at(base, &["deny", "format"]),
                    format!(
                        "{} writes its own body and content type: leave body and content_type out",
                        name.as_str()
                    ),
                );
                format
            }
        };
        if let DenyFormat::Custom { content_type, .. } = &format {
            if http::HeaderValue::from_str(content_type).is_err() {
                self.problem(
                    r,
                    at(base, &["deny", "content_type"]),
                    format!("{content_type:?} is not a header value"),
                );
            }
        }
        let missing_key_status = raw.missing_key_status.unwrap_or(DEFAULT_MISSING_KEY_STATUS);
        if !(400..=499).contains(&missing_key_status) {
            self.problem(
                r,
                at(base, &["deny", "missing_key_status"]),
                format!(
                    "must be a 4xx status (400 to 499): a missing key is the client's to fix, got {missing_key_status}"
                ),
            );
        }
        DenyResponse {
            status,
            missing_key_status,
            format,
        }
    }
}
