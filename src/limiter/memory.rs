//! Buckets in process memory, with the arithmetic of the Lua script (`bucket::evaluate`).
//!
//! The store when the config has no `redis:` (limits then hold per proxy, not per fleet), and the
//! oracle the Redis backend is tested against. Keys are sharded by their `{hash tag}`, the same
//! rule Redis Cluster uses: every key of one decision shares the tag, so a decision takes exactly
//! one short lock and threads deciding for different clients rarely meet.

use super::bucket::{evaluate, State};
use super::{Bucket, Decision, Limiter, LimiterError};
use crate::clock::Clock;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

const SHARDS: usize = 64;

pub struct MemoryLimiter<C> {
    clock: C,
    shards: Vec<Mutex<HashMap<String, State>>>,
}

impl<C: Clock> MemoryLimiter<C> {
    pub fn new(clock: C) -> MemoryLimiter<C> {
        MemoryLimiter {
            clock,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, tag: &str) -> &Mutex<HashMap<String, State>> {
        let mut h = DefaultHasher::new();
        tag.hash(&mut h);
        &self.shards[(h.finish() as usize) % SHARDS]
    }

    /// Decides synchronously; the lock is never held across an await.
    pub fn decide(&self, buckets: &[Bucket<'_>]) -> Result<Decision, LimiterError> {
        let now = self.clock.now_us();
        let params: Vec<_> = buckets.iter().map(|b| b.params).collect();
        let Some(first) = buckets.first() else {
            return Ok(Decision {
                allowed: true,
                limits: Vec::new(),
            });
        };
        let tag = hash_tag(first.key);
        if buckets.iter().any(|b| hash_tag(b.key) != tag) {
            // What Redis Cluster would answer with CROSSSLOT: one decision, one tag.
            return Err(LimiterError::Other(
                "the keys of one decision must share a {hash tag}".into(),
            ));
        }
        // A poisoned shard only means another thread panicked mid-update of plain integers.
        let mut map = self.shard(tag).lock().unwrap_or_else(|e| e.into_inner());
        let mut states: Vec<Option<State>> = buckets
            .iter()
            .zip(&params)
            // A bucket past its full instant is a full bucket, as an expired Redis key is.
            .map(|(b, p)| map.get(b.key).copied().filter(|s| s.full_at(p) > now))
            .collect();
        let decision = evaluate(now, &params, &mut states);
        if decision.allowed {
            for (b, s) in buckets.iter().zip(states) {
                if let Some(s) = s {
                    match map.get_mut(b.key) {
                        Some(slot) => *slot = s,
                        None => {
                            map.insert(b.key.to_string(), s);
                        }
                    }
                }
            }
        }
        Ok(decision)
    }
}

/// The part of a key that Redis Cluster hashes: between the first `{` and the next `}`, when
/// non-empty; the whole key otherwise.
fn hash_tag(key: &str) -> &str {
    key.find('{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.find('}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key)
}

impl<C: Clock> Limiter for MemoryLimiter<C> {
    async fn check(&self, buckets: &[Bucket<'_>]) -> Result<Decision, LimiterError> {
        self.decide(buckets)
    }

    async fn ping(&self) -> Result<(), LimiterError> {
        Ok(())
    }
}
