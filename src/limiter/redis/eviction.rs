//! Whether Redis may evict the proxy's keys, read from `INFO memory` (managed Redis services that
//! refuse `CONFIG GET` answer it) by `--check --redis` and once at start.
//!
//! An evicted bucket or quota is a full one: under memory pressure an evicting Redis hands spent
//! budgets back, and a flood of fresh keys (a header the client chooses) creates that pressure on
//! purpose. Every key the script writes has a TTL (`PEXPIRE`, `SET … PX`; checked by
//! `tests/it/key_floods.rs`), so:
//! - `noeviction` never drops one: at `maxmemory` the writes fail (`OOM`) and decisions follow
//!   `on_redis_error`, counted and warned: an outage, but no budget is given back silently;
//! - `volatile-ttl` drops the keys nearest their expiry first, and a bucket's TTL is the time to
//!   refill it plus a second: the first to go are the ones nearly full again, whose clients get
//!   back the few tokens they were missing, and spent daily quotas (expiring at midnight) last;
//! - every other policy (`allkeys-*`, `volatile-lru`, `volatile-lfu`, `volatile-random`) drops
//!   the proxy's keys like any cache entry, spent ones included.

use super::Topology;
use redis::RedisError;

/// `maxmemory-policy` and `maxmemory` (bytes; 0: no limit), as `INFO memory` reports them.
pub async fn read(topology: &dyn Topology) -> Result<(String, u64), RedisError> {
    let mut info = redis::cmd("INFO");
    info.arg("memory");
    let text: String = redis::from_redis_value(topology.query(&info).await?)?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let policy = field("maxmemory_policy").unwrap_or("unknown").to_string();
    let bytes = field("maxmemory").and_then(|b| b.parse().ok()).unwrap_or(0);
    Ok((policy, bytes))
}

/// What to tell the operator about `policy` (`None`: nothing, it never drops a spent budget
/// early). One line, naming the settings to use instead.
pub fn advice(policy: &str, maxmemory: u64) -> Option<String> {
    if matches!(policy, "noeviction" | "volatile-ttl") {
        return None;
    }
    let limit = match maxmemory {
        0 => "no maxmemory is set yet, but once one is, it".to_string(),
        n => format!("at maxmemory ({n} bytes) it"),
    };
    Some(format!(
        "Redis maxmemory-policy is {policy}: {limit} evicts rate-limit keys, spent buckets and \
         quotas included, which hands their clients their budget back (a flood of new keys does \
         it on purpose); set maxmemory-policy volatile-ttl (drops the keys nearest to full first: \
         every key the proxy writes has a TTL) or noeviction (drops none; at maxmemory decisions \
         follow on_redis_error, counted as oom)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_policies_that_can_drop_a_spent_budget_are_warned_about() {
        assert_eq!(advice("noeviction", 0), None);
        assert_eq!(advice("volatile-ttl", 1 << 30), None);
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
        ] {
            let line = advice(policy, 1 << 20).expect(policy);
            assert!(
                line.contains(policy) && line.contains("1048576 bytes"),
                "{line}"
            );
            assert!(
                line.contains("volatile-ttl") && line.contains("noeviction"),
                "{line}"
            );
        }
        assert!(advice("allkeys-lru", 0)
            .unwrap()
            .contains("no maxmemory is set yet"));
    }
}
