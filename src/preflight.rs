//! `--check --redis`: what would fail at run time against the configured Redis, found before a
//! deploy rather than by the first request: the server reachable, the password accepted, the ACL
//! allowing every command the proxy and its script run, the script loading, and the clock mode
//! working. One line per check; the first that fails skips the ones that need it.
//!
//! The script runs for real, on a bucket of its own under the key prefix (`rl:{--check}:bucket`,
//! which any ACL key pattern for the prefix covers): written in the configured format, read back
//! in the other (a fleet upgrading its format runs both), read by the admin API's `peek.lua`, and
//! again with Redis `TIME` when the clock is Redis's. It refills in a microsecond and expires a
//! second later. When a route has a concurrency limit, a lease is taken, renewed and released
//! on `rl:{--check}:inflight@inflight` (sorted-set commands an ACL must allow too).

use crate::config::{ClockSource, RedisSettings, StateFormat};
use crate::limiter::redis::{
    eviction, full_reply, Topology, PEEK_LUA, RENEW_LUA, TOKEN_BUCKET_LUA,
};
use redis::{Cmd, ErrorKind, RedisError, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest one check waits: at least this, or the decision budget if that is longer.
const AT_LEAST: Duration = Duration::from_secs(2);

/// One check's outcome, as printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub what: String,
    pub result: Result<(), String>,
    /// Passed, but risky: printed as a warning; the check still succeeds.
    pub warning: Option<String>,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.result, &self.warning) {
            (Ok(()), Some(warning)) => write!(f, "redis {}: WARNING: {warning}", self.what),
            (Ok(()), None) => write!(f, "redis {}: ok", self.what),
            (Err(why), _) => write!(f, "redis {}: FAILED: {why}", self.what),
        }
    }
}

/// Runs every check against `topology` (built from `redis`), the lease ones when `leases` (a
/// route has a concurrency limit); the lines in order.
pub async fn check(redis: &RedisSettings, topology: &dyn Topology, leases: bool) -> Vec<Line> {
    let wait = redis.timeout.max(AT_LEAST);
    let query = |cmd: Cmd| async move {
        match tokio::time::timeout(wait, topology.query(&cmd)).await {
            Ok(reply) => reply,
            Err(_) => Err(RedisError::from((
                ErrorKind::Io,
                "no answer",
                format!("within {} ms", wait.as_millis()),
            ))),
        }
    };
    let mut lines = Vec::new();
    let mut line = |what: &str, result: Result<(), String>| {
        let ok = result.is_ok();
        lines.push(Line {
            what: what.to_string(),
            result,
            warning: None,
        });
        ok
    };

    // Reaching it and being let in show in the same first command.
    let reachable = format!("reachable ({})", target(redis));
    match query(redis::cmd("PING")).await {
        Ok(_) => {
            line(&reachable, Ok(()));
            line("authenticated", Ok(()));
        }
        Err(e) if is_auth(&e) => {
            line(&reachable, Ok(()));
            line("authenticated", Err(e.to_string()));
            return lines;
        }
        Err(e) => {
            line(&reachable, Err(e.to_string()));
            return lines;
        }
    }

    let mut load = redis::cmd("SCRIPT");
    load.arg("LOAD").arg(TOKEN_BUCKET_LUA);
    let sha = match query(load).await {
        Ok(Value::BulkString(sha)) => String::from_utf8_lossy(&sha).into_owned(),
        Ok(Value::SimpleString(sha)) => sha,
        Ok(other) => {
            line(
                "SCRIPT LOAD",
                Err(format!("an unexpected reply: {other:?}")),
            );
            return lines;
        }
        Err(e) => {
            line("SCRIPT LOAD", Err(e.to_string()));
            return lines;
        }
    };
    line("SCRIPT LOAD", Ok(()));

    let key = format!("{}:{{--check}}:bucket", redis.key_prefix);
    // The second write reads the first as the other format's writers do; packed_ttl's second
    // write is its own, which keeps the key's expiry (it overwrites the value in place, SETRANGE).
    let other = match redis.state_format {
        StateFormat::Hash => StateFormat::Packed,
        StateFormat::Packed => StateFormat::Hash,
        StateFormat::PackedTtl => StateFormat::PackedTtl,
    };
    let (format, other) = (redis.state_format.as_str(), other.as_str());
    let now = now_us().to_string();
    let decide = |format: &str, now: &str| {
        let mut cmd = redis::cmd("EVALSHA");
        // One request drawing one token from a bucket of 1, refilled one token per microsecond.
        cmd.arg(&sha)
            .arg(1)
            .arg(&key)
            .arg(now)
            .arg(format)
            .arg(1)
            .arg(&[1, 1, 1, 1])
            .arg(1)
            .arg(1);
        cmd
    };
    let written = query(decide(format, &now)).await.and_then(admitted);
    if !line(
        &format!("EVALSHA, a bucket written as {format}"),
        written.map_err(|e| e.to_string()),
    ) {
        return lines;
    }
    let later = (now_us() + 10).to_string();
    let read = query(decide(other, &later)).await.and_then(admitted);
    let again = if other == format {
        "that bucket written again in place, its expiry kept (SETRANGE)".to_string()
    } else {
        format!("that bucket read as {other} writers read it")
    };
    line(
        &format!("EVALSHA, {again}"),
        read.map_err(|e| e.to_string()),
    );
    let mut load = redis::cmd("SCRIPT");
    load.arg("LOAD").arg(PEEK_LUA);
    let peeked = match query(load).await {
        Ok(Value::BulkString(peek)) => {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(String::from_utf8_lossy(&peek).as_ref())
                .arg(1)
                .arg(&key)
                .arg(now_us().to_string());
            query(cmd).await.map(drop).map_err(|e| e.to_string())
        }
        Ok(other) => Err(format!("SCRIPT LOAD replied {other:?}")),
        Err(e) => Err(e.to_string()),
    };
    line("the admin API's bucket read (peek.lua)", peeked);
    if leases {
        let key = format!("{}:{{--check}}:inflight@inflight", redis.key_prefix);
        let now = now_us().to_string();
        // One request holding one lease (id 1, a second long) of a limit of one.
        let mut take = redis::cmd("EVALSHA");
        take.arg(&sha)
            .arg(1)
            .arg(&key)
            .arg(&now)
            .arg(format)
            .arg(1)
            .arg(&["1", "1", "lease:1000:1", "1"])
            .arg(1)
            .arg(1);
        let taken = query(take).await.and_then(admitted);
        if line(
            "EVALSHA, a concurrency lease taken",
            taken.map_err(|e| e.to_string()),
        ) {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(RENEW_LUA);
            let renewed = match query(load).await {
                Ok(Value::BulkString(renew)) => {
                    let mut cmd = redis::cmd("EVALSHA");
                    cmd.arg(String::from_utf8_lossy(&renew).as_ref())
                        .arg(1)
                        .arg(&key)
                        .arg(&now)
                        .arg(1000)
                        .arg(1);
                    query(cmd).await.map(drop).map_err(|e| e.to_string())
                }
                Ok(other) => Err(format!("SCRIPT LOAD replied {other:?}")),
                Err(e) => Err(e.to_string()),
            };
            line("a streaming request's lease renewed (renew.lua)", renewed);
            let mut zrem = redis::cmd("ZREM");
            zrem.arg(&key).arg(1);
            let released = query(zrem).await.map(drop).map_err(|e| e.to_string());
            line("ZREM, a concurrency lease released", released);
        }
    }
    if redis.clock == ClockSource::Redis {
        let timed = query(decide(format, "")).await.and_then(admitted);
        line(
            "clock: redis (TIME in the script)",
            timed.map_err(|e| e.to_string()),
        );
    }
    lines.push(eviction_line(
        tokio::time::timeout(wait, eviction::read(topology)).await,
    ));
    lines
}

/// Whether Redis may evict the proxy's keys: a warning, never a failure (a Redis without
/// `maxmemory` evicts nothing yet; an ACL may not allow `INFO`).
fn eviction_line(
    read: Result<Result<(String, u64), RedisError>, tokio::time::error::Elapsed>,
) -> Line {
    let (what, warning) = match read {
        Ok(Ok((policy, maxmemory))) => (
            format!("maxmemory-policy ({policy})"),
            eviction::advice(&policy, maxmemory),
        ),
        Ok(Err(e)) => (
            "maxmemory-policy".to_string(),
            Some(format!(
                "not read ({e}): INFO memory shows it; make sure it is volatile-ttl or noeviction"
            )),
        ),
        Err(_) => (
            "maxmemory-policy".to_string(),
            Some(
                "not read (no answer to INFO memory): make sure it is volatile-ttl or noeviction"
                    .into(),
            ),
        ),
    };
    Line {
        what,
        result: Ok(()),
        warning,
    }
}

/// The script's reply to one request: admitted, with a full bucket each time.
fn admitted(reply: Value) -> Result<(), RedisError> {
    let values: Vec<i64> = redis::from_redis_value(reply)?;
    // After the call's `now`: the request's `allowed`.
    let full = full_reply(values.clone(), std::iter::once(1)).ok();
    match full.as_deref().and_then(|full| full.get(1)) {
        Some(1) => Ok(()),
        _ => Err(RedisError::from((
            ErrorKind::Client,
            "the script refused a full bucket",
            format!("{values:?}"),
        ))),
    }
}

/// A password Redis refused, or one it wanted and did not get.
fn is_auth(e: &RedisError) -> bool {
    let text = e.to_string();
    e.kind() == ErrorKind::AuthenticationFailed
        || text.contains("WRONGPASS")
        || text.contains("NOAUTH")
        || text.contains("invalid password")
}

/// Where the config points, for the first line.
fn target(redis: &RedisSettings) -> String {
    match &redis.target {
        crate::config::RedisTarget::Standalone(url) => without_password(url),
        crate::config::RedisTarget::Cluster(nodes) => format!(
            "cluster {}",
            nodes
                .iter()
                .map(|n| without_password(n))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        crate::config::RedisTarget::Sentinel { master, .. } => format!("sentinel master {master}"),
    }
}

/// A URL as it may be printed: the password of `redis://user:secret@host` and of a `pass=` or
/// `password=` query parameter (unix sockets carry it there) becomes `***`.
fn without_password(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let head = match (head.find("://"), head.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => match head[scheme + 3..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &head[..scheme + 3], &head[at..]),
            None => head.to_string(),
        },
        _ => head.to_string(),
    };
    match query {
        None => head,
        Some(query) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) if k == "pass" || k == "password" => format!("{k}=***"),
                    _ => pair.to_string(),
                })
                .collect();
            format!("{head}?{}", pairs.join("&"))
        }
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            without_password("redis://limiter:s3cret@10.0.0.1:6379/0"),
            "redis://limiter:***@10.0.0.1:6379/0"
        );
        assert_eq!(
            without_password("redis://10.0.0.1:6379"),
            "redis://10.0.0.1:6379"
        );
        assert_eq!(
            without_password("unix:///run/redis.sock"),
            "unix:///run/redis.sock"
        );
    }

    #[test]
    fn lines_say_ok_or_why() {
        let ok = Line {
            what: "SCRIPT LOAD".into(),
            result: Ok(()),
            warning: None,
        };
        assert_eq!(ok.to_string(), "redis SCRIPT LOAD: ok");
        let failed = Line {
            what: "authenticated".into(),
            result: Err("WRONGPASS".into()),
            warning: None,
        };
        assert_eq!(failed.to_string(), "redis authenticated: FAILED: WRONGPASS");
    }
}
