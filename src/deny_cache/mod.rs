//! Denials without a round trip.
//!
//! A token bucket that denies a request keeps denying that request until its retry instant,
//! whatever other proxies do: they can only take tokens, never add them. So a denial can be
//! remembered and repeated locally until that instant, and an exhausted client hammering the proxy
//! costs Redis nothing. The same holds after an admission that left fewer tokens than the request
//! costs: the next such request is denied until the cost is back, so that admission is remembered
//! as the denial it implies.
//!
//! What is remembered is the buckets' exact state (units held, from the store's reply), not the
//! answer: each repeated denial is worked out again by the in-memory store's own arithmetic
//! (`bucket::peek`), so `Remaining` counts up and `Retry-After` down exactly as that store's would,
//! for any cost.
//!
//! When a remembered denial runs out, every connection of the client waiting on it would miss at
//! the same instant and ask Redis at once. Instead the first one asks, and the others wait for its
//! answer (one round trip at most) and take it from the cache: one call per key at a time, however
//! many connections hammer it. If Redis fails that one call, the waiting ones fail with it instead
//! of spending their own budget on a store that just failed.
//!
//! An entry is only used for the same keys under the same limits: a reload that changes a limit
//! invalidates its cached denials. An admission takes tokens, so it makes whatever is remembered of
//! its buckets stale: every entry that holds one of its keys is forgotten. (An entry is filed under
//! each of its keys for that; requests find it under their first.) Admissions through other
//! proxies cannot be seen: they make a remembered state optimistic (more tokens than Redis holds),
//! so a cached denial can only be a true one, at worst with a `Retry-After` one of those
//! admissions too short. The retry instant is counted from when the answer arrived, so it
//! is never earlier than Redis's own (it may be later by one round trip). The cache is bounded;
//! when a shard is full of live denials, a new one is simply not remembered.

use crate::limiter::bucket::{denied_until, peek, State};
use crate::limiter::{BucketParams, Decision, LimiterError};
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

const SHARDS: usize = 16;

struct Denial {
    keys: Vec<String>,
    params: Vec<BucketParams>,
    /// The buckets as the store reported them, on this proxy's clock.
    states: Vec<State>,
    /// When every bucket holds its cost again: the store must be asked from then on.
    until: u64,
}

/// One key's place: the denial it belongs to (found by its first key, forgotten by any).
struct Slot {
    denial: Arc<Denial>,
    /// Once expired, in the first key's slot: the request asking Redis again, which the others
    /// wait for.
    refresh: Option<watch::Receiver<Failed>>,
}

type Shard = HashMap<String, Slot>;

pub struct DenyCache {
    shards: Vec<Mutex<Shard>>,
    shard_cap: usize,
    /// Slots held, so that an admission with nothing remembered costs no lock.
    entries: AtomicUsize,
    /// The longest a request waits for another one's answer: the store's budget.
    wait_budget: Duration,
}

/// What the cache says about a request.
pub enum Consult {
    /// Denied: answer this without asking the store.
    Denied(Decision),
    /// Ask the store. With a `Refresh`, this request asks for everyone waiting on an expired
    /// denial: keep it until the answer is noted (or report the failure on it).
    Ask(Option<Refresh>),
    /// The request that asked for everyone found the store failing (with this error, for its
    /// cause to be counted), or did not hear back within the store's budget (a timeout).
    StoreFailed(LimiterError),
}

/// Held by the one request refreshing an expired denial; dropping it wakes the waiting ones.
pub struct Refresh {
    done: watch::Sender<Failed>,
}

/// What the waiting requests are told: `Some` once the refreshing request's call failed.
type Failed = Option<LimiterError>;

impl Refresh {
    /// The store failed: the waiting requests fail too, without a call of their own.
    pub fn failed(self, error: LimiterError) {
        self.done.send_replace(Some(error));
    }
}

enum Lookup {
    Denied(Decision),
    Miss,
    Lead(Refresh),
    Wait(watch::Receiver<Failed>),
}

impl DenyCache {
    pub fn new(max_entries: usize, wait_budget: Duration) -> DenyCache {
        DenyCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            shard_cap: (max_entries / SHARDS).max(1),
            entries: AtomicUsize::new(0),
            wait_budget,
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, Shard> {
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        // Entries are replaced whole: a panic elsewhere cannot leave one half-written.
        self.shards[(h.finish() as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this request (its bucket keys and limits) is denied at `now()` (µs), waiting first
    /// for another request's answer when that one is refreshing the same expired denial.
    pub async fn consult(
        &self,
        keys: &[String],
        params: &[BucketParams],
        now: impl Fn() -> u64,
    ) -> Consult {
        // The refreshing request's own call ends within the budget; a wait that outlasts it
        // means the store is failing.
        let deadline = tokio::time::Instant::now() + self.wait_budget;
        loop {
            let mut done = match self.lookup(keys, params, now()) {
                Lookup::Denied(d) => return Consult::Denied(d),
                Lookup::Miss => return Consult::Ask(None),
                Lookup::Lead(refresh) => return Consult::Ask(Some(refresh)),
                Lookup::Wait(done) => done,
            };
            // Ends when the refreshing request reports a failure or drops its `Refresh` (answer
            // noted, or the request cancelled). The answer it noted may itself have run out by
            // the time this one looks again, when the next token was due within microseconds:
            // then this one waits for the next refresh rather than asking Redis with everyone.
            match tokio::time::timeout_at(deadline, done.changed()).await {
                Err(_) => return Consult::StoreFailed(LimiterError::Timeout(self.wait_budget)),
                Ok(_) => {
                    if let Some(e) = done.borrow().clone() {
                        return Consult::StoreFailed(e);
                    }
                }
            }
        }
    }

    fn lookup(&self, keys: &[String], params: &[BucketParams], now: u64) -> Lookup {
        let Some(first) = keys.first() else {
            return Lookup::Miss;
        };
        let mut shard = self.shard(first);
        let Some(slot) = shard.get_mut(first) else {
            return Lookup::Miss;
        };
        let denial = &slot.denial;
        if denial.keys != keys {
            return Lookup::Miss;
        }
        if denial.params != params {
            let stale = denial.clone();
            drop(shard);
            self.forget(&stale);
            return Lookup::Miss;
        }
        if now < denial.until {
            let decision = peek(now, &denial.params, &denial.states);
            if !decision.allowed {
                return Lookup::Denied(decision);
            }
        }
        // The cost is back by now: the store must say whether another proxy took it.
        if let Some(done) = &slot.refresh {
            // Still being asked for (the sender lives until the answer is noted).
            if done.has_changed().is_ok() {
                return Lookup::Wait(done.clone());
            }
        }
        let (tx, rx) = watch::channel(None);
        slot.refresh = Some(rx);
        Lookup::Lead(Refresh { done: tx })
    }

    /// Removes `denial` from the slot of each of its keys (those it still holds).
    fn forget(&self, denial: &Arc<Denial>) {
        for key in &denial.keys {
            let mut shard = self.shard(key);
            if shard
                .get(key)
                .is_some_and(|s| Arc::ptr_eq(&s.denial, denial))
            {
                shard.remove(key);
                self.entries.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Forgets the denial filed under `key`, if any, under all of its keys (also the admin API's,
    /// when it resets that bucket).
    pub fn forget_key(&self, key: &str) {
        let found = self.shard(key).get(key).map(|s| s.denial.clone());
        if let Some(denial) = found {
            self.forget(&denial);
        }
    }

    /// Notes what the store decided at `now` for these keys: remembered while it implies that a
    /// request like this one is denied (a denial, or an admission that left some bucket short of
    /// the cost), until the cost is back. An admission took tokens, so whatever was remembered of
    /// these buckets is stale: it is forgotten first. `refresh` is this request's, when it asked
    /// for others; the waiting requests wake (when it drops, at the end) to what was noted.
    pub fn note(
        &self,
        keys: &[String],
        params: &[BucketParams],
        decision: &Decision,
        now: u64,
        refresh: Option<Refresh>,
    ) {
        // Dropped on return, once the answer it was waited for is noted: the waiters wake to it.
        let _wake_waiters = refresh;
        if keys.is_empty() {
            return;
        }
        // A denial always leaves some bucket short; most admissions leave enough, and imply
        // nothing.
        let short = |leases: bool| {
            decision
                .limits
                .iter()
                .zip(params)
                .any(|(l, p)| l.held < p.cost * p.scale && (!leases || p.is_lease()))
        };
        // A concurrency limit's lease comes back when some request ends, which nothing here
        // foresees: a decision it refused (or left without a lease) is never remembered.
        if !short(false) || short(true) {
            if decision.allowed && self.entries.load(Ordering::Relaxed) > 0 {
                for key in keys {
                    self.forget_key(key);
                }
            }
            return;
        }
        let states: Vec<State> = decision
            .limits
            .iter()
            .zip(params)
            .map(|(l, p)| l.state(now, p.unit()))
            .collect();
        let denial = Arc::new(Denial {
            keys: keys.to_vec(),
            params: params.to_vec(),
            until: denied_until(now, params, &states),
            states,
        });
        // Filed under every key, the first (where requests find it) last, each slot replaced in
        // one step so that no request finds it empty meanwhile; whatever a slot held before is
        // forgotten whole (after an admission it is stale, and it could not be told apart).
        for (n, key) in keys.iter().enumerate().rev() {
            let replaced = {
                let mut shard = self.shard(key);
                if shard.len() >= self.shard_cap && !shard.contains_key(key) {
                    let before = shard.len();
                    shard.retain(|_, s| s.denial.until > now);
                    self.entries
                        .fetch_sub(before - shard.len(), Ordering::Relaxed);
                }
                if shard.len() >= self.shard_cap && !shard.contains_key(key) {
                    // Full of live denials: this one is not remembered, and nothing stale of
                    // these buckets may stay either.
                    drop(shard);
                    for key in &keys[..=n] {
                        self.forget_key(key);
                    }
                    self.forget(&denial);
                    return;
                }
                let slot = Slot {
                    denial: denial.clone(),
                    refresh: None,
                };
                match shard.insert(key.clone(), slot) {
                    None => {
                        self.entries.fetch_add(1, Ordering::Relaxed);
                        None
                    }
                    Some(old) => Some(old.denial),
                }
            };
            if let Some(old) = replaced {
                // Its other slots; this one now holds the new denial.
                self.forget(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests;
