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
use crate::limiter::{BucketParams, Decision};
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
    refresh: Option<watch::Receiver<bool>>,
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
    /// The request that asked for everyone found the store failing, or did not hear back within
    /// the store's budget.
    StoreFailed,
}

/// Held by the one request refreshing an expired denial; dropping it wakes the waiting ones.
pub struct Refresh {
    done: watch::Sender<bool>,
}

impl Refresh {
    /// The store failed: the waiting requests fail too, without a call of their own.
    pub fn failed(self) {
        self.done.send_replace(true);
    }
}

enum Lookup {
    Denied(Decision),
    Miss,
    Lead(Refresh),
    Wait(watch::Receiver<bool>),
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
                Err(_) => return Consult::StoreFailed,
                Ok(_) if *done.borrow() => return Consult::StoreFailed,
                Ok(_) => {}
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
        let (tx, rx) = watch::channel(false);
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

    /// Forgets the denial filed under `key`, if any, under all of its keys.
    fn forget_key(&self, key: &str) {
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
        let short = decision
            .limits
            .iter()
            .zip(params)
            .any(|(l, p)| l.held < p.cost * p.scale);
        if !short {
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
            .map(|(l, p)| l.state(now, p.scale))
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
mod tests {
    use super::*;

    const BUDGET: Duration = Duration::from_millis(50);

    const P: BucketParams = BucketParams {
        capacity: 3,
        scale: 1_000_000,
        num: 1,
        cost: 1,
    };

    /// What the store answers for one bucket of `P` holding `held` units.
    fn answer(allowed: bool, held: u64) -> Decision {
        let state = State {
            v: held,
            t: 0,
            scale: P.scale,
        };
        Decision {
            allowed,
            limits: vec![crate::limiter::bucket::report(0, &P, &state, allowed)],
        }
    }

    /// Denied, the cost back in `wait_us`.
    fn denied(wait_us: u64) -> Decision {
        answer(false, P.scale - wait_us)
    }

    /// Admitted, `remaining` whole tokens left and the next one in `wait_us`.
    fn allowed(remaining: u64, wait_us: u64) -> Decision {
        answer(true, (remaining + 1) * P.scale - wait_us)
    }

    fn lookup(
        cache: &DenyCache,
        keys: &[String],
        params: &[BucketParams],
        now: u64,
    ) -> Option<Decision> {
        match cache.lookup(keys, params, now) {
            Lookup::Denied(d) => Some(d),
            _ => None,
        }
    }

    #[test]
    fn repeats_a_denial_counting_down_until_its_retry_instant() {
        let cache = DenyCache::new(100, BUDGET);
        let keys = vec!["rl:{a:1}:l".to_string()];
        cache.note(&keys, &[P], &denied(1_000_000), 10, None);
        let d = lookup(&cache, &keys, &[P], 400_010).expect("cached");
        assert_eq!(d.limits[0].wait_us, 600_000);
        assert_eq!(d.limits[0].reset_us, 2_600_000);
        assert!(
            lookup(&cache, &keys, &[P], 1_000_010).is_none(),
            "expired at the retry instant"
        );
    }

    #[test]
    fn an_admission_that_emptied_the_bucket_denies_the_next_request_until_the_next_token() {
        let cache = DenyCache::new(100, BUDGET);
        let keys = vec!["rl:{a:1}:l".to_string()];
        cache.note(&keys, &[P], &allowed(0, 250_000), 0, None);
        let d = lookup(&cache, &keys, &[P], 100_000).expect("cached");
        assert!(!d.allowed && !d.limits[0].ok);
        assert_eq!(d.limits[0].wait_us, 150_000);
        assert!(lookup(&cache, &keys, &[P], 250_000).is_none());

        // A token left for the next request: nothing to remember, and the expired denial its
        // refresh was for is forgotten.
        cache.note(&keys, &[P], &denied(1_000), 0, None);
        let Lookup::Lead(refresh) = cache.lookup(&keys, &[P], 1_000) else {
            panic!("the first request after expiry refreshes");
        };
        cache.note(&keys, &[P], &allowed(1, 250_000), 1_010, Some(refresh));
        assert!(cache.shards.iter().all(|s| s.lock().unwrap().is_empty()));

        // Cost 2 with one token left: denied too.
        let two = BucketParams { cost: 2, ..P };
        cache.note(&keys, &[two], &allowed(1, 250_000), 0, None);
        assert!(lookup(&cache, &keys, &[two], 1).is_some());
    }

    #[test]
    fn a_remembered_denial_counts_as_the_store_would_for_any_cost() {
        // Capacity 10 at 1 token/s, cost 5: two admissions emptied the bucket.
        let p = BucketParams {
            capacity: 10,
            cost: 5,
            ..P
        };
        let cache = DenyCache::new(100, BUDGET);
        let keys = vec!["rl:{a:1}:l".to_string()];
        let empty = State {
            v: 0,
            t: 0,
            scale: P.scale,
        };
        let admitted = Decision {
            allowed: true,
            limits: vec![crate::limiter::bucket::report(0, &p, &empty, true)],
        };
        cache.note(&keys, &[p], &admitted, 0, None);
        for (now, remaining, wait) in [
            (0, 0, 5_000_000),
            (1_000_000, 1, 4_000_000),
            (4_500_000, 4, 500_000),
        ] {
            let d = lookup(&cache, &keys, &[p], now).expect("denied until the cost is back");
            let mut states = [Some(empty)];
            let store = crate::limiter::bucket::evaluate(now, &[p], &mut states);
            assert_eq!(d, store, "the in-memory store's answer at {now}");
            assert_eq!(
                (d.limits[0].remaining, d.limits[0].wait_us),
                (remaining, wait)
            );
        }
        assert!(lookup(&cache, &keys, &[p], 5_000_000).is_none());
    }

    #[test]
    fn an_admission_forgets_what_was_remembered_of_its_buckets() {
        let cache = DenyCache::new(100, BUDGET);
        let (a, b) = ("rl:{r}:a".to_string(), "rl:{r}:b".to_string());
        let both = vec![a.clone(), b.clone()];
        let denied_on_b = Decision {
            allowed: false,
            limits: vec![allowed(2, 0).limits[0], denied(500_000).limits[0]],
        };
        cache.note(&both, &[P, P], &denied_on_b, 0, None);
        assert!(lookup(&cache, &both, &[P, P], 1).is_some());
        // A request that skipped limit b took a token from a: the remembered a is stale.
        cache.note(std::slice::from_ref(&a), &[P], &allowed(1, 0), 2, None);
        assert!(lookup(&cache, &both, &[P, P], 3).is_none());

        // The same when the remembered set starts with another key.
        cache.note(std::slice::from_ref(&b), &[P], &denied(500_000), 0, None);
        let admitted = Decision {
            allowed: true,
            limits: vec![allowed(1, 0).limits[0], allowed(1, 0).limits[0]],
        };
        cache.note(&both, &[P, P], &admitted, 2, None);
        assert!(lookup(&cache, &[b], &[P], 3).is_none());
        assert_eq!(cache.entries.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_changed_limit_or_other_keys_miss() {
        let cache = DenyCache::new(100, BUDGET);
        let keys = vec!["rl:{a}:x".to_string(), "rl:{a}:y:1".to_string()];
        cache.note(&keys, &[P, P], &denied(1_000_000), 0, None);
        let other = vec!["rl:{a}:x".to_string(), "rl:{a}:y:2".to_string()];
        assert!(lookup(&cache, &other, &[P, P], 1).is_none());
        let bigger = BucketParams { capacity: 10, ..P };
        assert!(lookup(&cache, &keys, &[bigger, P], 1).is_none());
        assert!(
            lookup(&cache, &keys, &[P, P], 1).is_none(),
            "the stale entry was dropped"
        );
    }

    #[test]
    fn stays_bounded() {
        let cache = DenyCache::new(SHARDS * 2, BUDGET);
        for i in 0..1_000 {
            cache.note(&[format!("k{i}")], &[P], &denied(1_000_000), 0, None);
        }
        let total: usize = cache.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert!(total <= SHARDS * 2, "{total}");
    }

    /// Two requests on an expired denial: the first asks, the second waits for its answer.
    async fn expired(cache: &DenyCache, keys: &[String]) -> Refresh {
        cache.note(keys, &[P], &denied(1_000), 0, None);
        let Consult::Ask(Some(refresh)) = cache.consult(keys, &[P], || 5_000).await else {
            panic!("the first request after expiry refreshes");
        };
        refresh
    }

    #[tokio::test]
    async fn one_request_refreshes_an_expired_denial_and_the_others_take_its_answer() {
        let cache = std::sync::Arc::new(DenyCache::new(100, BUDGET));
        let keys = vec!["rl:{hot}:l".to_string()];
        let refresh = expired(&cache, &keys).await;
        let waiting = {
            let (cache, keys) = (cache.clone(), keys.clone());
            tokio::spawn(async move { cache.consult(&keys, &[P], || 5_000).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "waits for the refreshing request");
        cache.note(&keys, &[P], &allowed(0, 100_000), 5_000, Some(refresh));
        match waiting.await.unwrap() {
            Consult::Denied(d) => assert_eq!(d.limits[0].wait_us, 100_000),
            _ => panic!("the waiting request is answered from the cache"),
        }
    }

    #[tokio::test]
    async fn a_failed_refresh_fails_the_waiting_requests_and_a_dropped_one_passes_the_turn() {
        let cache = std::sync::Arc::new(DenyCache::new(100, BUDGET));
        let keys = vec!["rl:{hot}:l".to_string()];
        let spawn_waiter = || {
            let (cache, keys) = (cache.clone(), keys.clone());
            tokio::spawn(async move { cache.consult(&keys, &[P], || 5_000).await })
        };

        let refresh = expired(&cache, &keys).await;
        let waiting = spawn_waiter();
        tokio::task::yield_now().await;
        refresh.failed();
        assert!(matches!(waiting.await.unwrap(), Consult::StoreFailed));

        // Cancelled without an answer: the next request in line asks instead.
        let refresh = expired(&cache, &keys).await;
        let waiting = spawn_waiter();
        tokio::task::yield_now().await;
        drop(refresh);
        assert!(matches!(waiting.await.unwrap(), Consult::Ask(Some(_))));
    }

    #[tokio::test]
    async fn a_refreshed_answer_that_already_ran_out_hands_the_turn_to_one_waiter() {
        let cache = std::sync::Arc::new(DenyCache::new(100, BUDGET));
        let keys = vec!["rl:{hot}:l".to_string()];
        let refresh = expired(&cache, &keys).await;
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let (cache, keys) = (cache.clone(), keys.clone());
                tokio::spawn(async move { cache.consult(&keys, &[P], || 5_000).await })
            })
            .collect();
        tokio::task::yield_now().await;
        // Admitted with the next token due at once: the noted denial has run out already.
        cache.note(&keys, &[P], &allowed(0, 1), 4_000, Some(refresh));
        // The test runtime has one thread: after a yield every waiter has looked again.
        tokio::task::yield_now().await;
        let (leaders, waiting): (Vec<_>, Vec<_>) =
            waiters.into_iter().partition(|w| w.is_finished());
        assert_eq!(leaders.len(), 1, "one asks again, the others wait for it");
        let Consult::Ask(Some(refresh)) = leaders.into_iter().next().unwrap().await.unwrap() else {
            panic!("the one that asks again holds the refresh");
        };
        let started = std::time::Instant::now();
        refresh.failed();
        for w in waiting {
            assert!(matches!(w.await.unwrap(), Consult::StoreFailed));
        }
        assert!(
            started.elapsed() < BUDGET,
            "they took its answer, not the budget's end"
        );
    }

    #[tokio::test]
    async fn a_wait_never_outlasts_the_store_budget() {
        let cache = DenyCache::new(100, BUDGET);
        let keys = vec!["rl:{hot}:l".to_string()];
        let _stuck = expired(&cache, &keys).await;
        let started = std::time::Instant::now();
        assert!(matches!(
            cache.consult(&keys, &[P], || 5_000).await,
            Consult::StoreFailed
        ));
        assert!(started.elapsed() < BUDGET * 4, "{:?}", started.elapsed());
    }
}
