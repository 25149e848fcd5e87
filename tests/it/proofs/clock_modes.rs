//! What each clock mode guarantees, with proxies whose clocks differ.
//!
//! Two (or three) `RedisLimiter`s on one Redis stand for proxies; with `clock: proxy` each gets its
//! own clock, offset through the `Clock` abstraction (no user-facing knob), with `clock: redis`
//! none (the script reads Redis `TIME`).
//!
//! The bound, `clock: proxy`, clocks spread over S (latest minus earliest): a bucket's stored
//! instant `t` never moves back (an earlier clock refills nothing), so the refill a key ever credits
//! telescopes to (latest `t`) − (`t` at the first decision), and in any interval of length D that
//! is at most D + S. A key therefore admits at most capacity + rate × (D + S) in any such
//! interval: rate × S more than one clock allows, once, however long the interval. With
//! `clock: redis` S is 0.
//!
//! The bound holds across key expiry while S ≤ 1 s: a key expires one second after the instant its
//! bucket is full by its stored `t`, so when it expires the bucket is full on every clock within a
//! second of that one. Beyond 1 s of skew a key can expire while some proxy's clock still sees it
//! refilling, and each such expiry can hand out up to rate × (S − 1 s) again
//! (`beyond_one_second_of_skew_every_expiry_over_admits_again`).

use super::{limit, redis_limiter, runtime, Offset};
use crate::support::redis::RedisServer;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;
use ratelimit_proxy::clock::{Clock, ManualClock, SystemClock};
use ratelimit_proxy::limiter::redis::{Format, RedisLimiter};
use ratelimit_proxy::limiter::{Bucket, BucketParams, Limiter};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECOND: u64 = 1_000_000;
const T0: u64 = crate::support::lua::T0;

/// The wall clock, pushed forward by the test: time never runs slower than Redis's own, so a key
/// that Redis expires (by its own clock) is one whose bucket is full by these clocks too.
#[derive(Default)]
struct Jumping(AtomicU64);

impl Jumping {
    fn jump(&self, us: u64) {
        self.0.fetch_add(us, Ordering::SeqCst);
    }
}

impl Clock for Jumping {
    fn now_us(&self) -> u64 {
        SystemClock.now_us() + self.0.load(Ordering::SeqCst)
    }
}

/// A proxy's limiter: `clock: proxy` with `clock`, `clock: redis` with `None`.
fn proxy(redis: &RedisServer, clock: Option<Box<dyn Clock>>) -> RedisLimiter {
    redis_limiter(redis, clock, Format::Hash)
}

async fn admitted(l: &RedisLimiter, key: &str, p: BucketParams) -> bool {
    l.check(&[Bucket { key, params: p }]).await.unwrap().allowed
}

/// Requests until one is rejected: what this proxy admits right now.
async fn drain(l: &RedisLimiter, key: &str, p: BucketParams) -> u64 {
    let mut n = 0;
    while admitted(l, key, p).await {
        n += 1;
        assert!(n <= 1_000_000, "{key} never runs dry");
    }
    n
}

/// Refill over `us` microseconds, whole tokens.
fn tokens(p: BucketParams, us: u64) -> u64 {
    (u128::from(us) * u128::from(p.num) / u128::from(p.scale)) as u64
}

fn redis_time(redis: &RedisServer) -> u64 {
    let t: Vec<String> = redis.cmd(&["TIME"]);
    t[0].parse::<u64>().unwrap() * SECOND + t[1].parse::<u64>().unwrap()
}

/// Injected time: every 500 ms, proxy `first` drains the bucket, then proxy `second`. Returns the
/// total admitted after 1 s, 10 s and 100 s.
fn drained_every_half_second(
    first: &RedisLimiter,
    second: &RedisLimiter,
    base: &ManualClock,
    key: &str,
    p: BucketParams,
) -> [u64; 3] {
    let rt = runtime();
    let mut total = 0;
    let mut at = [0; 3];
    for step in 0..=200u64 {
        total += rt.block_on(drain(first, key, p)) + rt.block_on(drain(second, key, p));
        match step {
            2 => at[0] = total,
            20 => at[1] = total,
            200 => at[2] = total,
            _ => {}
        }
        base.advance_us(SECOND / 2);
    }
    at
}

/// Two seconds of skew buy rate × 2 s once, when the proxy behind creates the key and the one
/// ahead then refills from its instant; the excess stays exactly that after 1 s, 10 s and 100 s.
/// In the other order, or with equal clocks, there is none.
#[test]
fn two_seconds_of_skew_over_admit_rate_times_skew_once_and_never_again() {
    let redis = RedisServer::start();
    let base = Arc::new(ManualClock::new(T0));
    let behind = proxy(&redis, Some(Box::new(Offset::new(&base, 0))));
    let ahead = proxy(
        &redis,
        Some(Box::new(Offset::new(&base, 2 * SECOND as i64))),
    );
    let also_behind = proxy(&redis, Some(Box::new(Offset::new(&base, 0))));
    // Capacity 100 at 10/s: a drained bucket's key lives 11 s of real time, longer than the test.
    let p = limit(100, "10/s", 1);
    let expected = |secs: u64, skew_secs: u64| 100 + 10 * (secs + skew_secs);

    let skewed = drained_every_half_second(&behind, &ahead, &base, "{skewed}", p);
    assert_eq!(
        skewed,
        [1, 10, 100].map(|d| expected(d, 2)),
        "excess rate × S = 20 tokens"
    );

    let reversed = drained_every_half_second(&ahead, &behind, &base, "{reversed}", p);
    assert_eq!(
        reversed,
        [1, 10, 100].map(|d| expected(d, 0)),
        "the key's instant starts ahead"
    );

    let equal = drained_every_half_second(&behind, &also_behind, &base, "{equal}", p);
    assert_eq!(equal, [1, 10, 100].map(|d| expected(d, 0)));

    let expired: String = redis.cmd(&["INFO", "stats"]);
    assert!(
        expired.contains("expired_keys:0\r\n"),
        "no key expired mid-test: {expired}"
    );
}

#[derive(Debug, Clone)]
struct Pattern {
    capacity: u64,
    refill: &'static str,
    /// Each proxy's clock offset, µs; their spread is at most 1 s.
    offsets: [i64; 3],
    /// (which proxy, how far the clocks jump first, cost).
    requests: Vec<(usize, u64, u64)>,
}

fn pattern() -> impl Strategy<Value = Pattern> {
    let jump = prop_oneof![3 => Just(0u64), 3 => 0..200_000u64, 1 => 0..3 * SECOND];
    (
        1..=40u64,
        select(vec!["1/s", "10/s", "7/s", "100/s", "0.5/s"]),
        [
            -500_000i64..=500_000,
            -500_000i64..=500_000,
            -500_000i64..=500_000,
        ],
        prop::collection::vec((0..3usize, jump, 1..=3u64), 1..=120),
    )
        .prop_map(|(capacity, refill, offsets, requests)| Pattern {
            capacity,
            refill,
            offsets,
            requests,
        })
}

/// Random interleavings of three proxies whose clocks are up to 1 s apart, the clocks jumping
/// forward in between: no interval of decisions admits more tokens than
/// capacity + rate × (its length + S), for every one of the n² intervals.
#[test]
fn no_interval_admits_more_than_capacity_plus_rate_times_its_length_plus_skew() {
    let redis = RedisServer::start();
    let base = Arc::new(Jumping::default());
    let clocks: Vec<_> = (0..3).map(|_| Offset::new(&base, 0)).collect();
    let proxies: Vec<RedisLimiter> = clocks
        .iter()
        .map(|c| proxy(&redis, Some(Box::new(c.clone()))))
        .collect();
    let rt = runtime();
    let case = AtomicU64::new(0);
    super::check(file!(), 24, pattern(), |pat| {
        let key = format!("{{case{}}}", case.fetch_add(1, Ordering::SeqCst));
        for (clock, offset) in clocks.iter().zip(pat.offsets) {
            clock.offset.store(offset, Ordering::SeqCst);
        }
        let skew = (pat.offsets.iter().max().unwrap() - pat.offsets.iter().min().unwrap()) as u64;
        let p = limit(pat.capacity, pat.refill, 1);
        // (base clock before, after, tokens admitted) of every decision.
        let mut log: Vec<(u64, u64, u64)> = Vec::new();
        for &(who, jump, cost) in &pat.requests {
            base.jump(jump);
            let cost = cost.min(pat.capacity);
            let before = base.now_us();
            let ok = rt.block_on(admitted(&proxies[who], &key, BucketParams { cost, ..p }));
            log.push((before, base.now_us(), if ok { cost } else { 0 }));
        }
        for i in 0..log.len() {
            let mut sum = 0;
            for j in i..log.len() {
                sum += log[j].2;
                let bound = pat.capacity + tokens(p, log[j].1 - log[i].0 + skew);
                prop_assert!(
                    sum <= bound,
                    "decisions {}..={}: {} tokens admitted, bound {} (skew {} µs)",
                    i,
                    j,
                    sum,
                    bound,
                    skew
                );
            }
        }
        Ok::<(), TestCaseError>(())
    });
}

/// The same pattern on real clocks: proxy A drains the bucket, then proxy B, for a second. With
/// `clock: redis` the pair admits no more than one clock allows (bracketed by Redis `TIME`); with
/// `clock: proxy` and B's clock 2 s ahead, it admits at least rate × 2 s more, and no more than
/// the bound with S = 2 s.
#[test]
fn redis_time_leaves_no_skew_to_exploit_where_proxy_clocks_do() {
    let redis = RedisServer::start();
    let rt = runtime();
    let p = limit(100, "20/s", 1);
    let run = |a: &RedisLimiter, b: &RedisLimiter, key: &str| {
        let started = Instant::now();
        let mut total = 0;
        while started.elapsed() < Duration::from_secs(1) {
            total += rt.block_on(drain(a, key, p)) + rt.block_on(drain(b, key, p));
        }
        total
    };

    let (a, b) = (proxy(&redis, None), proxy(&redis, None));
    let start = redis_time(&redis);
    let shared = run(&a, &b, "{redis}");
    let window = redis_time(&redis) - start;
    assert!(
        shared <= 100 + tokens(p, window),
        "clock: redis admitted {shared} in {window} µs"
    );

    let wall = Arc::new(SystemClock);
    let a = proxy(&redis, Some(Box::new(Offset::new(&wall, 0))));
    let b = proxy(
        &redis,
        Some(Box::new(Offset::new(&wall, 2 * SECOND as i64))),
    );
    let start = SystemClock.now_us();
    let skewed = run(&a, &b, "{proxy}");
    let window = SystemClock.now_us() - start;
    assert!(
        skewed <= 100 + tokens(p, window + 2 * SECOND),
        "clock: proxy admitted {skewed} in {window} µs"
    );
    assert!(
        skewed >= 100 + tokens(p, 2 * SECOND),
        "B's first refill spans the 2 s of skew: {skewed}"
    );
    eprintln!("clock: redis {shared} admitted, clock: proxy with 2 s skew {skewed}");
}

/// Injected time, with Redis's expiry played on the same clock: the key is deleted once the base
/// clock passes its write + the TTL the script set (checked against Redis's PTTL). Every 4.5 s
/// proxy A (behind) drains the bucket, then proxy B (ahead by S). With S = 1 s the pair never
/// passes capacity + rate × (D + S); with S = 3 s each expiry hands out 15 tokens more than that
/// bound, and the excess grows by 15 per cycle.
#[test]
fn beyond_one_second_of_skew_every_expiry_over_admits_again() {
    let redis = RedisServer::start();
    let p = limit(30, "10/s", 1);
    let cycle = 4 * SECOND + SECOND / 2;
    let run = |skew: u64, key: &str| -> Vec<u64> {
        let base = Arc::new(ManualClock::new(T0));
        let a = proxy(&redis, Some(Box::new(Offset::new(&base, 0))));
        let b = proxy(&redis, Some(Box::new(Offset::new(&base, skew as i64))));
        let rt = runtime();
        let (mut total, mut totals, mut expires_at) = (0, Vec::new(), u64::MAX);
        for _ in 0..10 {
            for l in [&a, &b] {
                if base.now_us() > expires_at {
                    let _: i64 = redis.cmd(&["DEL", key]);
                }
                let n = rt.block_on(drain(l, key, p));
                if n > 0 {
                    // The script's TTL: until full by the stored instant, plus 1 s.
                    let v: u64 = redis.cmd::<String>(&["HGET", key, "v"]).parse().unwrap();
                    let fill = (30 * p.scale - v).div_ceil(p.num);
                    let ttl_ms = fill.div_ceil(1000) + 1000;
                    let pttl: u64 = redis.cmd(&["PTTL", key]);
                    assert!(
                        pttl <= ttl_ms && pttl + 200 >= ttl_ms,
                        "PTTL {pttl} vs {ttl_ms}"
                    );
                    expires_at = base.now_us() + ttl_ms * 1000;
                }
                total += n;
            }
            totals.push(total);
            base.advance_us(cycle);
        }
        totals
    };
    // After k cycles the decisions span D = 4.5 s × (k - 1).
    let bound = |k: u64, skew: u64| 30 + tokens(p, cycle * (k - 1) + skew);

    let within = run(SECOND, "{one}");
    for (k, total) in (1..).zip(&within) {
        assert!(
            *total <= bound(k, SECOND),
            "cycle {k}: {total} > {}",
            bound(k, SECOND)
        );
    }

    let beyond = run(3 * SECOND, "{three}");
    let excess: Vec<i64> = (1..)
        .zip(&beyond)
        .map(|(k, total)| *total as i64 - bound(k, 3 * SECOND) as i64)
        .collect();
    assert_eq!(
        excess,
        (0..10).map(|k| 15 * k).collect::<Vec<i64>>(),
        "{beyond:?}"
    );
}
