//! Denials without a round trip.
//!
//! A token bucket that denies a request keeps denying that request until its retry instant,
//! whatever other proxies do: they can only take tokens, never add them. So a denial can be
//! remembered and repeated locally, with the same 429 and headers (`Retry-After` counting down),
//! until that instant, and an exhausted client hammering the proxy costs Redis nothing.
//!
//! An entry is only used for the same keys under the same limits: a reload that changes a limit
//! invalidates its cached denials. The retry instant is counted from when the answer arrived, so it
//! is never earlier than Redis's own (it may be later by one round trip). The cache is bounded;
//! when a shard is full of live denials, a new one is simply not remembered.

use crate::limiter::{BucketParams, Decision};
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

const SHARDS: usize = 16;

struct Denial {
    keys: Vec<String>,
    params: Vec<BucketParams>,
    decision: Decision,
    decided_at: u64,
    until: u64,
}

pub struct DenyCache {
    /// By the first key of the request; the rest are compared on a hit.
    shards: Vec<Mutex<HashMap<String, Denial>>>,
    shard_cap: usize,
}

impl DenyCache {
    pub fn new(max_entries: usize) -> DenyCache {
        DenyCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            shard_cap: (max_entries / SHARDS).max(1),
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, HashMap<String, Denial>> {
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        // Entries are replaced whole: a panic elsewhere cannot leave one half-written.
        self.shards[(h.finish() as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The remembered denial of this request at `now` (µs), its waits counted down; `None` when
    /// there is none, it has expired, or the limits changed since.
    pub fn lookup(&self, keys: &[String], params: &[BucketParams], now: u64) -> Option<Decision> {
        let first = keys.first()?;
        let mut shard = self.shard(first);
        let denial = shard.get(first)?;
        if denial.keys != keys {
            return None;
        }
        if denial.params != params || now >= denial.until {
            shard.remove(first);
            return None;
        }
        let elapsed = now.saturating_sub(denial.decided_at);
        let mut decision = denial.decision.clone();
        for limit in &mut decision.limits {
            limit.reset_us = limit.reset_us.saturating_sub(elapsed);
            limit.wait_us = limit.wait_us.saturating_sub(elapsed);
        }
        Some(decision)
    }

    /// Remembers a denial made at `now` until its retry instant.
    pub fn remember(
        &self,
        keys: &[String],
        params: &[BucketParams],
        decision: &Decision,
        now: u64,
    ) {
        let Some(first) = keys.first() else { return };
        let until = now + decision.retry_after_us();
        if decision.allowed || until <= now {
            return;
        }
        let mut shard = self.shard(first);
        if shard.len() >= self.shard_cap && !shard.contains_key(first) {
            shard.retain(|_, d| d.until > now);
            if shard.len() >= self.shard_cap {
                return;
            }
        }
        shard.insert(
            first.clone(),
            Denial {
                keys: keys.to_vec(),
                params: params.to_vec(),
                decision: decision.clone(),
                decided_at: now,
                until,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::LimitState;

    const P: BucketParams = BucketParams {
        capacity: 3,
        scale: 1_000_000,
        num: 1,
        cost: 1,
    };

    fn denied(wait_us: u64) -> Decision {
        Decision {
            allowed: false,
            limits: vec![LimitState {
                ok: false,
                remaining: 0,
                reset_us: 3_000_000,
                wait_us,
            }],
        }
    }

    #[test]
    fn repeats_a_denial_counting_down_until_its_retry_instant() {
        let cache = DenyCache::new(100);
        let keys = vec!["rl:{a:1}:l".to_string()];
        cache.remember(&keys, &[P], &denied(1_000_000), 10);
        let d = cache.lookup(&keys, &[P], 400_010).expect("cached");
        assert_eq!(d.limits[0].wait_us, 600_000);
        assert_eq!(d.limits[0].reset_us, 2_600_000);
        assert!(
            cache.lookup(&keys, &[P], 1_000_010).is_none(),
            "expired at the retry instant"
        );
    }

    #[test]
    fn a_changed_limit_or_other_keys_miss() {
        let cache = DenyCache::new(100);
        let keys = vec!["rl:{a}:x".to_string(), "rl:{a}:y:1".to_string()];
        cache.remember(&keys, &[P, P], &denied(1_000_000), 0);
        let other = vec!["rl:{a}:x".to_string(), "rl:{a}:y:2".to_string()];
        assert!(cache.lookup(&other, &[P, P], 1).is_none());
        let bigger = BucketParams { capacity: 10, ..P };
        assert!(cache.lookup(&keys, &[bigger, P], 1).is_none());
        assert!(
            cache.lookup(&keys, &[P, P], 1).is_none(),
            "the stale entry was dropped"
        );
    }

    #[test]
    fn stays_bounded() {
        let cache = DenyCache::new(SHARDS * 2);
        for i in 0..1_000 {
            cache.remember(&[format!("k{i}")], &[P], &denied(1_000_000), 0);
        }
        let total: usize = cache.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert!(total <= SHARDS * 2, "{total}");
    }
}
