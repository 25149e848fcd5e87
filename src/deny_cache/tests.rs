//! The deny cache on a driven clock: what it repeats, for how long, and who asks the store.

use super::*;
use crate::limiter::Kind;

const BUDGET: Duration = Duration::from_millis(50);

const P: BucketParams = BucketParams {
    capacity: 3,
    scale: 1_000_000,
    num: 1,
    cost: 1,
    kind: Kind::Bucket,
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
    refresh.failed(crate::limiter::LimiterError::Unavailable);
    assert!(matches!(waiting.await.unwrap(), Consult::StoreFailed(_)));

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
    let (leaders, waiting): (Vec<_>, Vec<_>) = waiters.into_iter().partition(|w| w.is_finished());
    assert_eq!(leaders.len(), 1, "one asks again, the others wait for it");
    let Consult::Ask(Some(refresh)) = leaders.into_iter().next().unwrap().await.unwrap() else {
        panic!("the one that asks again holds the refresh");
    };
    let started = std::time::Instant::now();
    refresh.failed(crate::limiter::LimiterError::Unavailable);
    for w in waiting {
        assert!(matches!(w.await.unwrap(), Consult::StoreFailed(_)));
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
        Consult::StoreFailed(_)
    ));
    assert!(started.elapsed() < BUDGET * 4, "{:?}", started.elapsed());
}
