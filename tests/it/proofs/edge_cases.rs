//! The corners of the arithmetic, each through the Lua script (caller's clock: exact time) and the
//! Rust mirror side by side, and the key corners through the real proxy.
//!
//! Exactness is bounded by Lua's doubles: the config refuses a limit whose capacity × scale + num
//! passes 2^53 (`the_config_refuses_only_what_the_arithmetic_cannot_hold_exactly`), so capacity
//! 10^9 is tested at 1/s and 10^6/s, and 1/d at the largest capacity it allows, 104,249.

use super::limit;
use crate::scenarios::{Backend, Setup};
use crate::support::http::send_raw;
use crate::support::lua::{decision, Script, T0};
use crate::support::redis::RedisServer;
use crate::support::wait_for;
use ratelimit_proxy::config::Config;
use ratelimit_proxy::limiter::bucket::{evaluate, State};
use ratelimit_proxy::limiter::{BucketParams, Decision, LimitState};
use std::collections::HashMap;
use std::time::Duration;

const SECOND: u64 = 1_000_000;
const DAY: u64 = 86_400 * SECOND;

/// The script and `bucket::evaluate` on the same buckets: every decision is asserted equal before
/// the test looks at it.
struct Twin {
    script: Script,
    mirror: HashMap<String, Option<State>>,
}

impl Twin {
    fn new() -> Twin {
        Twin {
            script: Script::load(),
            mirror: HashMap::new(),
        }
    }

    fn decide(&mut self, key: &str, now: u64, p: BucketParams) -> Decision {
        let lua = self.script.eval(&[key], now, &[p]);
        let state = self.mirror.entry(key.to_string()).or_default();
        let mut states = [*state];
        let rust = evaluate(now, &[p], &mut states);
        *state = states[0];
        assert_eq!(lua, rust, "{key} at T0+{} µs, {p:?}", now - T0);
        lua
    }

    /// What Redis stores, `v` and `t`, as the integer strings the script writes.
    fn stored(&self, key: &str) -> (String, String) {
        let v: String = self.script.redis.cmd(&["HGET", key, "v"]);
        let t: String = self.script.redis.cmd(&["HGET", key, "t"]);
        (v, t)
    }
}

/// What a client is told of one bucket.
type View = (bool, u64, u64, u64);

fn state(ok: bool, remaining: u64, reset_us: u64, wait_us: u64) -> View {
    (ok, remaining, reset_us, wait_us)
}

fn view(l: &LimitState) -> View {
    (l.ok, l.remaining, l.reset_us, l.wait_us)
}

#[test]
fn capacity_one_admits_exactly_one_request_per_token() {
    let mut b = Twin::new();
    let p = limit(1, "1/s", 1);
    for k in 0..100 {
        let now = T0 + k * SECOND;
        let d = b.decide("k", now, p);
        assert!(d.allowed, "token {k}");
        assert_eq!(view(&d.limits[0]), state(true, 0, SECOND, SECOND));
        let again = b.decide("k", now, p);
        assert_eq!(view(&again.limits[0]), state(false, 0, SECOND, SECOND));
        assert_eq!(
            view(&b.decide("k", now + SECOND - 1, p).limits[0]),
            state(false, 0, 1, 1),
            "one microsecond short of the next token"
        );
    }
}

#[test]
fn capacity_a_billion_is_exact_at_one_per_second_and_a_million_per_second() {
    let mut b = Twin::new();
    let slow = limit(1_000_000_000, "1/s", 1);
    let d = b.decide("slow", T0, slow);
    assert_eq!(view(&d.limits[0]), state(true, 999_999_999, SECOND, SECOND));
    // The whole bucket in one request: a token short now, exactly enough a second later.
    let all = BucketParams {
        cost: 1_000_000_000,
        ..slow
    };
    let d = b.decide("slow", T0, all);
    assert_eq!(
        view(&d.limits[0]),
        state(false, 999_999_999, SECOND, SECOND)
    );
    let d = b.decide("slow", T0 + SECOND, all);
    assert_eq!(
        view(&d.limits[0]),
        state(true, 0, 1_000_000_000 * SECOND, SECOND),
        "empty, full again in 10^9 s"
    );
    assert_eq!(b.stored("slow"), ("0".into(), (T0 + SECOND).to_string()));

    // 10^6/s is one token per microsecond: scale 1, the finest the arithmetic has.
    let fast = limit(1_000_000_000, "1000000/s", 1_000_000_000);
    assert_eq!(
        view(&b.decide("fast", T0, fast).limits[0]),
        state(true, 0, 1_000_000_000, 1)
    );
    let one = BucketParams { cost: 1, ..fast };
    assert_eq!(
        view(&b.decide("fast", T0 + 1, one).limits[0]),
        state(true, 0, 1_000_000_000, 1)
    );
    assert_eq!(
        view(&b.decide("fast", T0 + 1, one).limits[0]),
        state(false, 0, 1_000_000_000, 1)
    );
    let d = b.decide("fast", T0 + 1 + 1_000_000_000, one);
    assert_eq!(
        view(&d.limits[0]),
        state(true, 999_999_999, 1, 1),
        "full again after 10^9 µs"
    );
}

#[test]
fn one_per_day_is_exact_at_the_largest_capacity_it_allows() {
    let mut b = Twin::new();
    // 104,249 × 86,400,000,000 units = 9,007,113,600,000,000: just under 2^53.
    let p = limit(104_249, "1/d", 104_249);
    let d = b.decide("k", T0, p);
    assert_eq!(view(&d.limits[0]), state(true, 0, 104_249 * DAY, DAY));
    let one = BucketParams { cost: 1, ..p };
    assert_eq!(
        view(&b.decide("k", T0 + DAY - 1, one).limits[0]),
        state(false, 0, 104_249 * DAY - (DAY - 1), 1)
    );
    let d = b.decide("k", T0 + DAY, one);
    assert_eq!(view(&d.limits[0]), state(true, 0, 104_249 * DAY, DAY));
    // Ten idle days and a partial microsecond's worth: held as exact units, not rounded.
    let d = b.decide("k", T0 + 11 * DAY + 7, one);
    assert_eq!(
        view(&d.limits[0]),
        state(true, 9, 104_240 * DAY - 7, DAY - 7)
    );
    assert_eq!(
        b.stored("k"),
        ("777600000007".into(), (T0 + 11 * DAY + 7).to_string())
    );
}

#[test]
fn the_config_refuses_only_what_the_arithmetic_cannot_hold_exactly() {
    let parse = |capacity: u64, refill: &str| {
        let yaml = format!(
            "listen: \"127.0.0.1:1\"\nroutes:\n  - name: api\n    upstream: \"h:1\"\n    limits: [{{ name: l, capacity: {capacity}, refill: \"{refill}\" }}]\n"
        );
        Config::parse("t.yaml", &yaml).map_err(|e| e.to_string())
    };
    // capacity × scale + num ≤ 2^53 = 9,007,199,254,740,992, at the boundary for each rate.
    for (largest, refill) in [
        (104_249, "1/d"),
        (9_007_199_254, "1/s"),
        (9_007_199_254_740_991, "1000000/s"),
    ] {
        assert!(
            parse(largest, refill).is_ok(),
            "capacity {largest} at {refill}"
        );
        let err = parse(largest + 1, refill).expect_err("one more token");
        assert!(
            err.contains("needs more precision than the store's numbers hold exactly"),
            "{err}"
        );
    }
    let err = parse(1_000_000_000, "1/d").unwrap_err();
    assert!(
        err.contains("capacity 1000000000 at refill 1/d") && err.contains("2^53"),
        "{err}"
    );
}

#[test]
fn cost_equal_to_capacity_takes_a_full_bucket_and_waits_a_full_refill() {
    let mut b = Twin::new();
    let p = limit(5, "1/s", 5);
    assert_eq!(
        view(&b.decide("k", T0, p).limits[0]),
        state(true, 0, 5 * SECOND, SECOND)
    );
    let d = b.decide("k", T0 + 5 * SECOND - 1, p);
    assert_eq!(
        view(&d.limits[0]),
        state(false, 4, 1, 1),
        "4.999999 tokens are not 5"
    );
    assert_eq!(
        view(&b.decide("k", T0 + 5 * SECOND, p).limits[0]),
        state(true, 0, 5 * SECOND, SECOND)
    );
}

/// A key expires one second after its bucket is full again, and a missing key is a full bucket:
/// so expiry (early by up to a second of skew, or exactly at the full instant) never gives more
/// than the bucket itself would. One microsecond earlier it would.
#[test]
fn a_key_gone_at_the_full_instant_decides_like_the_bucket_it_replaces() {
    let mut b = Twin::new();
    let p = limit(3, "1/s", 3);
    let one = BucketParams { cost: 1, ..p };
    for key in ["kept", "gone"] {
        assert!(b.decide(key, T0, p).allowed);
        let pttl: i64 = b.script.redis.cmd(&["PTTL", key]);
        assert!(
            (3_000..=4_000).contains(&pttl),
            "{key}: PTTL {pttl} for a 3 s refill"
        );
    }
    // Redis drops the key at its TTL; here at the earliest instant the bucket is full.
    let _: i64 = b.script.redis.cmd(&["DEL", "gone"]);
    b.mirror.insert("gone".into(), None);
    assert_eq!(
        view(&b.decide("kept", T0 + 3 * SECOND - 1, p).limits[0]),
        state(false, 2, 1, 1),
        "a microsecond before, the bucket is not full"
    );
    let kept = b.decide("kept", T0 + 3 * SECOND, one);
    let gone = b.decide("gone", T0 + 3 * SECOND, one);
    assert_eq!(kept, gone);
    assert_eq!(view(&kept.limits[0]), state(true, 2, SECOND, SECOND));

    // A long idle saturates at capacity, whatever its length.
    let years = T0 + 10 * 365 * DAY;
    assert_eq!(b.decide("kept", years, one), b.decide("fresh", years, one));
}

/// With Redis `TIME` (no injected clock) and a 40 ms refill, the key really expires, and not before
/// its bucket is full again.
#[test]
fn a_key_expires_in_redis_only_after_its_bucket_is_full_again() {
    let s = Script::load();
    let p = limit(2, "50/s", 1);
    for left in [1, 0] {
        let d = decision(&s.raw(&["k"], None, &[p]), &[p]);
        assert_eq!(d.limits[0].remaining, left);
    }
    let t: u64 = s.redis.cmd::<String>(&["HGET", "k", "t"]).parse().unwrap();
    let fill_us = 2 * 20_000;
    wait_for("the key to expire", Duration::from_secs(10), || {
        (s.redis.cmd::<i64>(&["EXISTS", "k"]) == 0).then_some(())
    });
    let time: Vec<String> = s.redis.cmd(&["TIME"]);
    let gone_by = time[0].parse::<u64>().unwrap() * SECOND + time[1].parse::<u64>().unwrap();
    assert!(
        gone_by >= t + fill_us,
        "expired {} µs after the last write, before the {fill_us} µs refill",
        gone_by - t
    );
    // And it is the 1 s margin that covers clock skew, give or take the few milliseconds by which
    // the time Redis bases a TTL on (cached per command, in ms) trails `TIME`.
    assert!(
        gone_by + 10_000 >= t + fill_us + SECOND,
        "expired {} µs after the last write",
        gone_by - t
    );
    let d = decision(&s.raw(&["k"], None, &[p]), &[p]);
    assert_eq!(d.limits[0].remaining, 1, "a full bucket again");
}

/// Refill steps that are never a whole number of tokens (7/m: 8,571,428.57 µs per token), each
/// request spending one: the stored units equal the closed form exactly after every step.
fn drift_free(steps: u64, pipeline: usize) {
    let s = Script::load();
    let p = limit(1_000, "7/m", 1);
    let half = BucketParams { cost: 500, ..p };
    let mut conn = s.redis.connection().unwrap();
    let _: redis::Value = s
        .invocation(&["k"], Some(T0), &[half])
        .query(&mut conn)
        .unwrap();
    let (mut now, mut gained) = (T0, 0u128);
    let mut done = 0;
    while done < steps {
        let batch = (steps - done).min(pipeline as u64);
        let mut pipe = redis::pipe();
        for i in 0..batch {
            // -4, +3, +10 units against the token spent: the bucket wanders but never fills or empties.
            now += 8_571_428 + (done + i) % 3;
            pipe.add_command(s.invocation(&["k"], Some(now), &[p]));
        }
        let replies: Vec<redis::Value> = pipe.query(&mut conn).unwrap();
        for r in &replies {
            assert!(decision(r, &[p]).allowed);
        }
        done += batch;
    }
    for i in 0..steps {
        gained += u128::from(8_571_428 + i % 3) * 7;
    }
    let expected = 500 * 60_000_000 + gained - u128::from(steps) * 60_000_000;
    let v: String = s.redis.cmd(&["HGET", "k", "v"]);
    assert_eq!(v, expected.to_string(), "after {steps} refills");
    let t: String = s.redis.cmd(&["HGET", "k", "t"]);
    assert_eq!(t, now.to_string());

    // The mirror, ten times as many steps: the same closed form.
    let mut st = [None];
    evaluate(T0, &[half], &mut st);
    let (mut now, mut gained) = (T0, 0u128);
    for i in 0..steps * 10 {
        now += 8_571_428 + i % 3;
        gained += u128::from(8_571_428 + i % 3) * 7;
        assert!(evaluate(now, &[p], &mut st).allowed);
    }
    let expected = 500 * 60_000_000 + gained - u128::from(steps * 10) * 60_000_000;
    assert_eq!(u128::from(st[0].unwrap().v), expected);
}

#[test]
fn no_drift_after_a_hundred_thousand_refills_in_redis_and_a_million_in_the_mirror() {
    drift_free(100_000, 1_000);
}

/// `cargo test --test it proofs::edge_cases -- --ignored` (about 3 minutes).
#[test]
#[ignore = "long variant: 5 million refills in Redis, 50 million in the mirror"]
fn no_drift_after_five_million_refills_in_redis_and_fifty_million_in_the_mirror() {
    drift_free(5_000_000, 10_000);
}

/// 81 tokens at 1/d are 6,998,400,000,000 units; times the new scale 43,200,000,000 that is past
/// 2^53, where a plain `held * scale / was` in doubles came out one unit short of 81 whole tokens
/// at 2/d. The script now rescales without rounding, as the mirror (u128) does.
#[test]
fn a_reload_between_slow_rates_keeps_every_whole_token() {
    let mut b = Twin::new();
    assert!(b.decide("k", T0, limit(100, "1/d", 19)).allowed);
    let d = b.decide("k", T0, limit(100, "2/d", 1));
    assert_eq!(d.limits[0].remaining, 80, "81 tokens carried over, 1 spent");
}

/// Client-chosen key values are limited like any other: a 10 KB value and one differing from it
/// only in its last byte are two buckets (hashed, not truncated), odd bytes are one bucket, and an
/// empty value shares the "missing" bucket with requests that send none. Every key stays short.
#[test]
fn long_odd_and_empty_key_values_each_get_exactly_their_quota() {
    let s = Setup::start(
        Backend::Redis(RedisServer::start()),
        "  - name: api\n    upstream: \"{upstream}\"\n    limits:\n      - { name: k, capacity: 2, refill: \"1/h\", key: \"header:X-Api-Key\" }\n",
    );
    let long = "k".repeat(10_000);
    let long_too = format!("{}j", &long[1..]);
    let request = |value: Option<&str>| {
        let header = value.map_or(String::new(), |v| format!("X-Api-Key: {v}\r\n"));
        let raw = format!("GET / HTTP/1.1\r\nHost: x\r\n{header}Connection: close\r\n\r\n");
        send_raw(s.proxy.addr, raw.as_bytes()).unwrap().status
    };
    for value in [long.as_str(), long_too.as_str(), "caf\u{e9} {}}{ ~#\t%00"] {
        let statuses: Vec<u16> = (0..3).map(|_| request(Some(value))).collect();
        assert_eq!(statuses, [200, 200, 429], "{} bytes", value.len());
    }
    assert_eq!(
        [request(Some("")), request(None), request(None)],
        [200, 200, 429],
        "empty and absent share one bucket"
    );
    assert_eq!(s.upstream.hits(), 8);
    let Backend::Redis(redis) = &s.backend else {
        unreachable!()
    };
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert_eq!(keys.len(), 4, "{keys:?}");
    assert!(keys.iter().all(|k| k.len() <= 64), "{keys:?}");
}
