//! The `redis:` section: which servers, how to reach them, what the budget is.

use super::{key, Validator};
use crate::config::locate::Seg;
use crate::config::raw::RawRedis;
use crate::config::*;

impl Validator<'_> {
    pub(super) fn redis(&mut self, raw: RawRedis) -> Option<RedisSettings> {
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
        let clock = self
            .word(None, vec![key("redis"), key("clock")], raw.clock.as_deref())
            .unwrap_or(ClockSource::Redis);
        let state_format = self
            .word(
                None,
                vec![key("redis"), key("state_format")],
                raw.state_format.as_deref(),
            )
            .unwrap_or(StateFormat::Hash);
        (self.problems.len() == before).then(|| RedisSettings {
            target: target.expect("no problem means a target"),
            password_env,
            tls_ca_file,
            fleet_size,
            timeout: Duration::from_millis(timeout_ms),
            key_prefix,
            clock,
            state_format,
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
}
