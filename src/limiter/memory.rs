//! Buckets in process memory, with the arithmetic of the Lua script (`bucket::evaluate`).
//!
//! The store when the config has no `redis:` (limits then hold per proxy, not per fleet), and the
//! oracle the Redis backend is tested against.
//!
//! Keys are sharded by their `{hash tag}`, the rule Redis Cluster uses: every key of one decision
//! shares the tag, so a decision takes exactly one short lock, and threads deciding for different
//! clients rarely meet.
//!
//! Memory is bounded. A bucket that is full again is the same as no bucket, so it is forgotten
//! (swept every few thousand inserts into its shard, as Redis expires the key). Nothing else is
//! ever dropped: a bucket that is not whole again, a quota whose period has not ended, a live
//! lease. Dropping one would hand its client the budget it spent, and a flood of fresh keys (a
//! header the client chooses) could then reset anybody's limits. So when a shard is at its share
//! of `max_keys` and nothing in it is full again, the store is full: a decision that would add a
//! bucket fails with `StoreFull` and follows the route's `on_redis_error`, as a Redis out of
//! memory does. Keys it already holds are decided as ever, and a decision that refuses needs no
//! room. While full, a shard remembers the earliest instant one of its buckets is whole again and
//! does not sweep before it, so a flood against a full store costs no scan per request.

use super::bucket::{charge, evaluate, State};
use super::{Bucket, BucketParams, Decision, Inspected, Kind, Limiter, LimiterError};
use crate::clock::Clock;
use crate::throttle::Throttle;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const SHARDS: usize = 64;
/// Inserts into a shard between two sweeps of its full buckets.
const SWEEP_EVERY: usize = 4096;
/// A full store's warning: at most one line per this interval.
const FULL_WARNING_EVERY: Duration = Duration::from_secs(10);

pub struct MemoryLimiter<C> {
    clock: C,
    shards: Vec<Mutex<Shard>>,
    shard_cap: usize,
    max_keys: usize,
    /// "The store is full": one line per 10 s, with the count since the last.
    full: Throttle,
}

#[derive(Default)]
struct Shard {
    buckets: HashMap<String, Stored>,
    /// Concurrency limits' leases by key: (lease id, the microsecond it expires at).
    leases: HashMap<String, Vec<(u64, u64)>>,
    inserts: usize,
    /// No bucket of this shard is full again before this instant (a lower bound, from the last
    /// sweep and every write since): a sweep before it would free nothing.
    next_full: u64,
}

#[derive(Clone, Copy)]
struct Stored {
    state: State,
    /// When the bucket is full again, with the limit it was written under.
    full_at: u64,
}

impl Shard {
    /// Forgets every bucket that is full again at `now`, and every expired lease.
    fn sweep(&mut self, now: u64) {
        self.buckets.retain(|_, s| s.full_at > now);
        self.next_full = self
            .buckets
            .values()
            .map(|s| s.full_at)
            .min()
            .unwrap_or(u64::MAX);
        self.leases.retain(|_, held| {
            held.retain(|&(_, expires)| expires > now);
            !held.is_empty()
        });
        self.inserts = 0;
    }

    /// The leases at `key` that have not expired at `now` (expired ones are dropped).
    fn live_leases(&mut self, key: &str, now: u64) -> u64 {
        let Some(held) = self.leases.get_mut(key) else {
            return 0;
        };
        held.retain(|&(_, expires)| expires > now);
        held.len() as u64
    }

    /// Makes room for `n` more buckets under `cap` by forgetting the ones full again; `false`
    /// when there is none (nothing else may go: see the module's header).
    fn make_room(&mut self, now: u64, cap: usize, n: usize) -> bool {
        self.inserts += n;
        let full = self.buckets.len() + n > cap;
        if self.inserts >= SWEEP_EVERY || (full && now >= self.next_full) {
            self.sweep(now);
        }
        self.buckets.len() + n <= cap
    }

    /// Stores `bucket` at `key`.
    fn put(&mut self, key: &str, bucket: Stored) {
        self.next_full = self.next_full.min(bucket.full_at);
        match self.buckets.get_mut(key) {
            Some(s) => *s = bucket,
            None => {
                self.buckets.insert(key.to_string(), bucket);
            }
        }
    }
}

impl<C: Clock> MemoryLimiter<C> {
    /// A store that tracks at most about `max_keys` buckets.
    pub fn new(clock: C, max_keys: usize) -> MemoryLimiter<C> {
        MemoryLimiter {
            clock,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            shard_cap: (max_keys / SHARDS).max(1),
            max_keys,
            full: Throttle::new(FULL_WARNING_EVERY),
        }
    }

    fn shard(&self, tag: &str) -> &Mutex<Shard> {
        let mut h = DefaultHasher::new();
        tag.hash(&mut h);
        &self.shards[(h.finish() as usize) % SHARDS]
    }

    /// Buckets tracked right now.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).buckets.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides synchronously; the lock is never held across an await.
    pub fn decide(&self, buckets: &[Bucket<'_>]) -> Result<Decision, LimiterError> {
        self.under_lock(buckets, |now, params, states| {
            let decision = evaluate(now, params, states);
            let allowed = decision.allowed;
            (decision, allowed)
        })
    }

    /// `Limiter::charge`, synchronously: every bucket is written.
    pub fn charge_now(
        &self,
        buckets: &[Bucket<'_>],
        amounts: &[i64],
    ) -> Result<Decision, LimiterError> {
        self.under_lock(buckets, |now, params, states| {
            (charge(now, params, amounts, states), true)
        })
    }

    /// Runs `step` on the buckets' states under their shard's one lock, and stores what it
    /// changed when it says so (with a lease taken for each concurrency limit).
    fn under_lock(
        &self,
        buckets: &[Bucket<'_>],
        step: impl FnOnce(u64, &[BucketParams], &mut [Option<State>]) -> (Decision, bool),
    ) -> Result<Decision, LimiterError> {
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
        let now = self.clock.now_us();
        let params: Vec<_> = buckets.iter().map(|b| b.params).collect();
        // A poisoned shard only means another thread panicked mid-update of plain integers.
        let mut shard = self.shard(tag).lock().unwrap_or_else(|e| e.into_inner());
        let mut states: Vec<Option<State>> = buckets
            .iter()
            .zip(&params)
            .map(|(b, p)| match p.kind {
                // The free leases, as the arithmetic's units: a request takes one.
                Kind::Leases { .. } => Some(State {
                    v: p.capacity.saturating_sub(shard.live_leases(b.key, now)),
                    t: now,
                    scale: 1,
                }),
                // A bucket past its full instant is a full bucket, as an expired Redis key is.
                _ => shard
                    .buckets
                    .get(b.key)
                    .map(|s| s.state)
                    .filter(|s| s.full_at(p) > now),
            })
            .collect();
        let (decision, write) = step(now, &params, &mut states);
        if !write {
            return Ok(decision);
        }
        let new = buckets
            .iter()
            .zip(&states)
            .filter(|(b, s)| {
                s.is_some() && !b.params.is_lease() && !shard.buckets.contains_key(b.key)
            })
            .count();
        if new > 0 && !shard.make_room(now, self.shard_cap, new) {
            drop(shard);
            return Err(self.store_full());
        }
        for ((b, p), state) in buckets.iter().zip(&params).zip(states) {
            if let Kind::Leases { ms, id } = p.kind {
                let held = shard.leases.entry(b.key.to_string()).or_default();
                held.push((id, now + ms * 1000));
                continue;
            }
            let Some(state) = state else { continue };
            let full_at = state.full_at(p);
            shard.put(b.key, Stored { state, full_at });
        }
        Ok(decision)
    }

    /// A decision that needed room the store does not have; the operator hears of it.
    fn store_full(&self) -> LimiterError {
        if let Some(more) = self.full.note("full", Instant::now()) {
            log::warn!(
                "the in-memory store is full (memory.max_keys = {}) with buckets that are not whole \
                 again: decisions that need a new bucket follow on_redis_error until some refill{}",
                self.max_keys,
                match more {
                    0 => String::new(),
                    n => format!(" ({n} more in the last 10 s)"),
                }
            );
        }
        LimiterError::StoreFull
    }

    /// `Limiter::renew`, synchronously: each lease still held expires `lease_ms` from now.
    pub fn renew_now(&self, leases: &[Bucket<'_>]) {
        let now = self.clock.now_us();
        self.each_lease(leases, |held, id, ms| {
            for lease in held.iter_mut().filter(|l| l.0 == id && l.1 > now) {
                lease.1 = now + ms * 1000;
            }
        });
    }

    /// Ends the leases of `leases` (concurrency limits' buckets, each with its request's id).
    pub fn give_back(&self, leases: &[Bucket<'_>]) {
        self.each_lease(leases, |held, id, _| held.retain(|&(lease, _)| lease != id));
    }

    /// Calls `f` with the set of leases at each lease's key, its id and `lease_ms`, under the
    /// key's shard lock; a set left empty is dropped.
    fn each_lease(&self, leases: &[Bucket<'_>], mut f: impl FnMut(&mut Vec<(u64, u64)>, u64, u64)) {
        for b in leases {
            let Kind::Leases { ms, id } = b.params.kind else {
                continue;
            };
            let mut shard = self
                .shard(hash_tag(b.key))
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Some(held) = shard.leases.get_mut(b.key) {
                f(held, id, ms);
                if held.is_empty() {
                    shard.leases.remove(b.key);
                }
            }
        }
    }
}

impl<C: Clock> Limiter for MemoryLimiter<C> {
    async fn check(&self, buckets: &[Bucket<'_>]) -> Result<Decision, LimiterError> {
        self.decide(buckets)
    }

    async fn ping(&self) -> Result<(), LimiterError> {
        Ok(())
    }

    async fn charge(
        &self,
        buckets: &[Bucket<'_>],
        amounts: &[i64],
    ) -> Result<Decision, LimiterError> {
        self.charge_now(buckets, amounts)
    }

    async fn renew(&self, leases: &[Bucket<'_>]) -> Result<(), LimiterError> {
        self.renew_now(leases);
        Ok(())
    }

    async fn release(&self, leases: &[Bucket<'_>]) -> Result<(), LimiterError> {
        self.give_back(leases);
        Ok(())
    }

    async fn inspect(&self, key: &str) -> Result<Inspected, LimiterError> {
        let now = self.clock.now_us();
        let mut shard = self
            .shard(hash_tag(key))
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let leases = shard
            .leases
            .contains_key(key)
            .then(|| shard.live_leases(key, now));
        // Past its full instant it is a full bucket, as an expired Redis key is.
        let stored = shard.buckets.get(key).filter(|s| s.full_at > now);
        Ok(Inspected {
            state: stored.map(|s| s.state),
            now_us: now,
            ttl_ms: stored.map(|s| (s.full_at - now).div_ceil(1000)),
            leases,
        })
    }

    async fn reset(&self, key: &str) -> Result<bool, LimiterError> {
        let now = self.clock.now_us();
        let mut shard = self
            .shard(hash_tag(key))
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let leases = shard
            .leases
            .remove(key)
            .is_some_and(|held| !held.is_empty());
        Ok(shard.buckets.remove(key).is_some_and(|s| s.full_at > now) || leases)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::limiter::{BucketParams, Kind};
    use std::sync::Arc;

    const P: BucketParams = BucketParams {
        capacity: 2,
        scale: 1_000_000,
        num: 1,
        cost: 1,
        kind: Kind::Bucket,
    };

    fn hit(m: &MemoryLimiter<Arc<ManualClock>>, key: &str) -> Decision {
        m.decide(&[Bucket { key, params: P }]).unwrap()
    }

    #[test]
    fn full_buckets_are_forgotten_and_the_cap_holds() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let m = MemoryLimiter::new(clock.clone(), 64 * 10);
        let mut full = 0;
        for i in 0..1_000 {
            let key = format!("{{c{i}}}:l");
            match m.decide(&[Bucket {
                key: &key,
                params: P,
            }]) {
                Ok(_) => {}
                Err(LimiterError::StoreFull) => full += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(m.len() <= 640, "{} buckets tracked", m.len());
        assert_eq!(m.len() + full, 1_000, "every key stored or refused");
        // 2 s later every bucket is full again: the next inserts sweep them away.
        clock.advance_us(2_000_000);
        let mut stored = 0;
        for i in 0..64 * 10 {
            let key = format!("{{d{i}}}:l");
            stored += usize::from(
                m.decide(&[Bucket {
                    key: &key,
                    params: P,
                }])
                .is_ok(),
            );
        }
        assert!(m.len() <= 640);
        // Every old bucket went: the new ones are all that is left (a shard that drew more than
        // its 10 of them was full for the rest).
        assert_eq!(m.len(), stored);
        assert!(stored > 400, "{stored}");
    }

    #[test]
    fn at_the_cap_only_full_buckets_go_and_then_the_store_is_full() {
        let stored = |full_at| Stored {
            state: State {
                v: 0,
                t: 0,
                scale: 1,
            },
            full_at,
        };
        let mut shard = Shard::default();
        shard.put("soon", stored(20));
        shard.put("late", stored(90));
        shard.put("done", stored(5));
        // At t=10 "done" is full already: the sweep alone makes room for one more.
        assert!(shard.make_room(10, 3, 1));
        assert_eq!(shard.buckets.len(), 2);
        assert!(!shard.buckets.contains_key("done"));
        // Nothing else is whole again at t=10: no room, and nothing was dropped.
        assert!(!shard.make_room(10, 2, 1));
        assert_eq!(shard.buckets.len(), 2);
        // Until t=20 a full shard does not even look (no scan per request of a flood)...
        shard.buckets.get_mut("late").unwrap().full_at = 15;
        assert!(!shard.make_room(16, 2, 1));
        // ...and from then on it finds what refilled.
        assert!(shard.make_room(20, 2, 1));
        assert!(shard.buckets.is_empty());
    }

    #[test]
    fn a_flood_of_new_keys_never_gives_a_spent_key_its_budget_back() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        // One shard's worth: every key below lands in a shard of 2.
        let m = MemoryLimiter::new(clock.clone(), 64 * 2);
        let spend = |key: &str| {
            assert!(hit(&m, key).allowed);
            assert!(hit(&m, key).allowed);
            assert!(!hit(&m, key).allowed);
        };
        spend("{victim}:l");
        let mut refused = 0;
        for i in 0..10_000 {
            match m.decide(&[Bucket {
                key: &format!("{{junk{i}}}:l"),
                params: P,
            }]) {
                Ok(d) => assert!(d.allowed),
                Err(LimiterError::StoreFull) => refused += 1,
                Err(e) => panic!("{e}"),
            }
            clock.advance_us(1);
        }
        assert!(refused > 9_000, "{refused}");
        assert!(!hit(&m, "{victim}:l").allowed, "the victim stays spent");
        assert!(m.len() <= 128);
        // Once the buckets are whole again (2 tokens at 1/s: 2 s), new keys are taken again.
        clock.advance_us(2_000_000);
        assert!(hit(&m, "{new}:l").allowed);
    }

    #[test]
    fn keys_without_one_shared_tag_are_refused() {
        let m = MemoryLimiter::new(ManualClock::new(0), 1_000);
        let r = m.decide(&[
            Bucket {
                key: "{a}:1",
                params: P,
            },
            Bucket {
                key: "{b}:2",
                params: P,
            },
        ]);
        assert!(matches!(r, Err(LimiterError::Other(_))));
    }
}
