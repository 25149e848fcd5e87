//! Raw YAML → validated `Config`, collecting every problem instead of stopping at the first.

mod limit;
mod redis;
mod route;

use super::locate::{line_of, render, Seg};
use super::raw::{RawAdmin, RawConfig, RawListener, RawTls};
use super::*;

pub(super) fn validate(file: &str, text: &str) -> Result<Config, ConfigError> {
    let mut v = Validator {
        file,
        text,
        problems: Vec::new(),
        warnings: Vec::new(),
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
    warnings: Vec<Problem>,
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
    pub(super) fn problem(
        &mut self,
        route: Option<&str>,
        path: Vec<Seg>,
        message: impl Into<String>,
    ) {
        self.problems.push(Problem {
            file: self.file.to_string(),
            line: line_of(self.text, &path),
            route: route.map(str::to_string),
            field: render(&path),
            message: message.into(),
        });
    }

    /// A serde error at `base` (plus the path serde tracked below it).
    pub(super) fn serde_problem<E: std::fmt::Display>(
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
        if let Some(line) = super::depth::too_deep(self.text) {
            self.problems.push(Problem {
                file: self.file.to_string(),
                line: Some(line),
                route: None,
                field: String::new(),
                message: format!(
                    "the document nests deeper than {} levels; a config needs fewer than 10",
                    super::depth::MAX_DEPTH
                ),
            });
            return None;
        }
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
        let (admin, admin_token_env, admin_allowed_hosts) = self.admin(raw.admin);
        if let (Some(admin), Some(listen)) = (admin, &listen) {
            if listen.iter().any(|l| l.addr == admin) {
                self.problem(
                    None,
                    vec![key("admin")],
                    "must differ from every listen address",
                );
            }
        }
        let redis = raw.redis.and_then(|r| self.redis(r));
        let default_fail = self.word::<FailMode>(
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
        let new_keys_per_client = match raw.new_keys_per_client.as_deref() {
            None | Some("off") => None,
            Some(text) => match NewKeyBudget::parse(text) {
                Ok(budget) => Some(budget),
                Err(msg) => {
                    self.problem(None, vec![key("new_keys_per_client")], msg);
                    None
                }
            },
        };
        let trusted_proxies = raw
            .trusted_proxies
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c.parse::<Cidr>() {
                Ok(block) => {
                    if block.is_wide() {
                        let path = vec![key("trusted_proxies"), Seg::Index(i)];
                        self.warnings.push(Problem {
                            file: self.file.to_string(),
                            line: line_of(self.text, &path),
                            route: None,
                            field: render(&path),
                            message: format!(
                                "{c:?} trusts more than a /8 of IPv4 or a /32 of IPv6: any client in it \
                                 can forge X-Forwarded-For and get a fresh bucket per request; list only \
                                 your load balancers' addresses"
                            ),
                        });
                    }
                    Some(block)
                }
                Err(msg) => {
                    self.problem(None, vec![key("trusted_proxies"), Seg::Index(i)], msg);
                    None
                }
            })
            .collect();
        let ipv6_prefix = raw.client_ipv6_prefix.unwrap_or(128);
        if !(32..=128).contains(&ipv6_prefix) {
            self.problem(
                None,
                vec![key("client_ipv6_prefix")],
                format!("must be between 32 and 128, got {ipv6_prefix}"),
            );
        }
        let path_escaped_slashes = self
            .word(
                None,
                vec![key("path_escaped_slashes")],
                raw.path_escaped_slashes.as_deref(),
            )
            .unwrap_or_default();
        let downstream = self.downstream(raw.downstream);
        let routes = self.routes(
            raw.routes,
            default_fail.unwrap_or(FailMode::Open),
            path_escaped_slashes,
        );
        Some(Config {
            listen: listen?,
            admin: admin?,
            admin_token_env,
            admin_allowed_hosts,
            redis,
            shutdown_grace: Duration::from_secs(grace),
            memory: MemorySettings {
                max_keys: max_keys as usize,
            },
            new_keys_per_client,
            client: ClientIdentity {
                trusted_proxies,
                ipv6_prefix,
            },
            path_escaped_slashes,
            downstream,
            routes,
            warnings: std::mem::take(&mut self.warnings),
        })
    }

    fn downstream(&mut self, raw: Option<super::raw::RawDownstream>) -> Downstream {
        let defaults = Downstream::default();
        let Some(raw) = raw else { return defaults };
        let number = |v: &mut Self, field: &str, raw: Option<u64>, default: u64, max: u64| {
            let n = raw.unwrap_or(default);
            if !(1..=max).contains(&n) {
                v.problem(
                    None,
                    vec![key("downstream"), key(field)],
                    format!("must be between 1 and {max}, got {n}"),
                );
            }
            n
        };
        let ms = |d: Duration| d.as_millis() as u64;
        let max_connections = number(
            self,
            "max_connections",
            raw.max_connections,
            defaults.max_connections as u64,
            10_000_000,
        ) as usize;
        Downstream {
            header_timeout: Duration::from_millis(number(
                self,
                "header_timeout_ms",
                raw.header_timeout_ms,
                ms(defaults.header_timeout),
                3_600_000,
            )),
            idle_timeout: Duration::from_millis(number(
                self,
                "idle_timeout_ms",
                raw.idle_timeout_ms,
                ms(defaults.idle_timeout),
                3_600_000,
            )),
            body_timeout: Duration::from_millis(number(
                self,
                "body_timeout_ms",
                raw.body_timeout_ms,
                ms(defaults.body_timeout),
                3_600_000,
            )),
            request_body_timeout: Duration::from_millis(number(
                self,
                "request_body_timeout_ms",
                raw.request_body_timeout_ms,
                ms(defaults.request_body_timeout),
                86_400_000,
            )),
            max_connections,
            // By default one request in flight per connection, as the file descriptors were
            // always counted; more only if asked for.
            max_requests_in_flight: number(
                self,
                "max_requests_in_flight",
                raw.max_requests_in_flight,
                max_connections as u64,
                10_000_000,
            ) as usize,
            max_requests_per_connection: number(
                self,
                "max_requests_per_connection",
                raw.max_requests_per_connection,
                u64::from(defaults.max_requests_per_connection),
                1_000_000_000,
            ) as u32,
            max_concurrent_streams: number(
                self,
                "max_concurrent_streams",
                raw.max_concurrent_streams,
                u64::from(defaults.max_concurrent_streams),
                10_000,
            ) as u32,
        }
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

    fn listen(&mut self, raw: Option<serde_yaml::Value>) -> Option<Vec<Listener>> {
        let entries = match raw {
            None => {
                self.problem(
                    None,
                    vec![key("listen")],
                    "is required: an address like \"0.0.0.0:8080\", or a list of them",
                );
                return None;
            }
            Some(serde_yaml::Value::Sequence(list)) => {
                if list.is_empty() {
                    self.problem(None, vec![key("listen")], "must name at least one address");
                    return None;
                }
                list.into_iter()
                    .enumerate()
                    .map(|(i, v)| (vec![key("listen"), Seg::Index(i)], v))
                    .collect()
            }
            Some(one) => vec![(vec![key("listen")], one)],
        };
        let before = self.problems.len();
        let listeners: Vec<Listener> = entries
            .into_iter()
            .filter_map(|(path, value)| self.listener(path, value))
            .collect();
        (self.problems.len() == before).then_some(listeners)
    }

    /// `admin`: `"IP:port"`, or `{ address, token_env, allowed_hosts }`.
    fn admin(
        &mut self,
        raw: Option<serde_yaml::Value>,
    ) -> (Option<SocketAddr>, Option<String>, Vec<String>) {
        let mapped = matches!(raw, Some(serde_yaml::Value::Mapping(_)));
        let raw = match raw {
            None => RawAdmin {
                address: None,
                token_env: None,
                allowed_hosts: None,
            },
            Some(serde_yaml::Value::String(address)) => RawAdmin {
                address: Some(address),
                token_env: None,
                allowed_hosts: None,
            },
            Some(value) => match serde_path_to_error::deserialize(value) {
                Ok(raw) => raw,
                Err(err) => {
                    self.serde_problem(None, &[key("admin")], err, None);
                    return (None, None, Vec::new());
                }
            },
        };
        let path = match mapped {
            true => vec![key("admin"), key("address")],
            false => vec![key("admin")],
        };
        let address = self.address(None, path, raw.address.as_deref().unwrap_or(DEFAULT_ADMIN));
        let token_env = raw.token_env.filter(|name| {
            let ok =
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !ok {
                self.problem(
                    None,
                    vec![key("admin"), key("token_env")],
                    format!("{name:?} is not an environment variable name"),
                );
            }
            ok
        });
        let allowed_hosts = raw
            .allowed_hosts
            .unwrap_or_default()
            .iter()
            .enumerate()
            .filter_map(|(i, h)| {
                let host = crate::canonical::host(h.as_bytes()).ok().filter(|_| !h.is_empty());
                if host.is_none() {
                    self.problem(
                        None,
                        vec![key("admin"), key("allowed_hosts"), Seg::Index(i)],
                        format!("{h:?} is not a host name (a name or an IP address, with an optional port)"),
                    );
                }
                host.map(|h| h.header_value())
            })
            .collect();
        (address, token_env, allowed_hosts)
    }

    /// One `listen` entry: `"IP:port"`, or `{ address, tls: { cert_file, key_file } }`.
    fn listener(&mut self, path: Vec<Seg>, value: serde_yaml::Value) -> Option<Listener> {
        match &value {
            serde_yaml::Value::String(text) => {
                let addr = self.address(None, path, text)?;
                return Some(Listener {
                    addr,
                    tls: None,
                    h2c: false,
                });
            }
            serde_yaml::Value::Mapping(_) => {}
            _ => {
                self.problem(
                    None,
                    path,
                    "must be an address like \"0.0.0.0:8080\", or { address, tls }",
                );
                return None;
            }
        }
        let raw: RawListener = match serde_path_to_error::deserialize(value) {
            Ok(raw) => raw,
            Err(err) => {
                self.serde_problem(None, &path, err, None);
                return None;
            }
        };
        let Some(address) = raw.address else {
            self.problem(
                None,
                at(&path, &["address"]),
                "is required, e.g. \"0.0.0.0:8443\"",
            );
            return None;
        };
        let addr = self.address(None, at(&path, &["address"]), &address);
        let h2c = raw.h2c.unwrap_or(false);
        let tls = match raw.tls {
            None => {
                if raw.http2.is_some() {
                    self.problem(
                        None,
                        at(&path, &["http2"]),
                        "applies to TLS listeners only (on cleartext, h2c: true accepts HTTP/2 \
                         with prior knowledge)",
                    );
                    return None;
                }
                None
            }
            Some(_) if h2c => {
                self.problem(
                    None,
                    at(&path, &["h2c"]),
                    "applies to cleartext listeners only (a TLS listener offers HTTP/2 by ALPN: \
                     http2)",
                );
                return None;
            }
            Some(tls) => Some(self.tls(&at(&path, &["tls"]), tls, raw.http2.unwrap_or(true))?),
        };
        Some(Listener {
            addr: addr?,
            tls,
            h2c,
        })
    }

    /// A listener's certificates: `cert_file` and `key_file`, and any in `certificates` (chosen by
    /// SNI); each pair given whole, readable, and one pair.
    fn tls(&mut self, base: &[Seg], raw: RawTls, http2: bool) -> Option<TlsListener> {
        let before = self.problems.len();
        let mut certs = Vec::new();
        if raw.cert_file.is_some() || raw.key_file.is_some() || raw.certificates.is_none() {
            certs.extend(self.certificate(base, raw.cert_file, raw.key_file));
        }
        for (i, c) in raw.certificates.unwrap_or_default().into_iter().enumerate() {
            let path: Vec<Seg> = at(base, &["certificates"])
                .into_iter()
                .chain([Seg::Index(i)])
                .collect();
            certs.extend(self.certificate(&path, c.cert_file, c.key_file));
        }
        if certs.is_empty() && self.problems.len() == before {
            self.problem(
                None,
                at(base, &["certificates"]),
                "must name at least one { cert_file, key_file }",
            );
        }
        (self.problems.len() == before).then_some(TlsListener { http2, certs })
    }

    /// One certificate file and its key file.
    fn certificate(
        &mut self,
        base: &[Seg],
        cert_file: Option<String>,
        key_file: Option<String>,
    ) -> Option<TlsCert> {
        let file = |v: &mut Self, name: &str, given: Option<String>| match given {
            Some(f) if !f.is_empty() => Some(std::path::PathBuf::from(f)),
            _ => {
                v.problem(None, at(base, &[name]), "is required: a PEM file");
                None
            }
        };
        let cert_file = file(self, "cert_file", cert_file);
        let key_file = file(self, "key_file", key_file);
        let (cert_file, key_file) = (cert_file?, key_file?);
        match crate::tls::load(&cert_file, &key_file) {
            Ok((served, pair)) => Some(TlsCert {
                cert_file,
                key_file,
                served,
                pair,
            }),
            Err(e) => {
                let field = if e.is_key() { "key_file" } else { "cert_file" };
                self.problem(None, at(base, &[field]), e.to_string());
                None
            }
        }
    }

    /// A route's or a limit's `name`: required, and of the safe alphabet.
    pub(super) fn name(&mut self, r: Option<&str>, base: &[Seg], raw: Option<String>) -> String {
        let name = raw.unwrap_or_default();
        if name.is_empty() {
            self.problem(r, at(base, &["name"]), "is required");
        } else if !valid_name(&name) {
            self.problem(
                r,
                at(base, &["name"]),
                format!("{name:?} may contain only A-Z, a-z, 0-9, _ and - (at most 64)"),
            );
        }
        name
    }

    /// A word of one of the config's word lists (`words!`), when given; a problem names the
    /// words it may be.
    pub(super) fn word<T>(
        &mut self,
        route: Option<&str>,
        path: Vec<Seg>,
        raw: Option<&str>,
    ) -> Option<T>
    where
        T: std::str::FromStr<Err = String>,
    {
        match raw?.parse() {
            Ok(word) => Some(word),
            Err(message) => {
                self.problem(route, path, message);
                None
            }
        }
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
