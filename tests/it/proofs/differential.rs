//! The Lua script and the in-memory store are one algorithm: on random histories of (time step,
//! clock skew, cost, capacity, rate, limit set, reload) they give the same decision, the same
//! remaining counts and the same reset and retry times, and Redis holds exactly the state the Rust
//! mirror (`bucket::evaluate`) computes.
//!
//! The script runs with the caller's clock, so time is injected. Redis still expires keys by its
//! own clock, which does not follow the injected one: each step reads the key's TTL (it must cover
//! the time to refill, which is what makes an expired key and a full bucket the same thing) and
//! then removes it, so a slow run cannot expire a key that the injected clock says is not full yet.
//!
//! Replaying a failure: see `proofs::check` (`PROPTEST_RNG_SEED=<n> cargo test --test it
//! proofs::differential`).

use super::{buckets, check, SetClock};
use crate::support::lua::{decision, stored, type_of, Request, Script, T0};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;
use ratelimit_proxy::config::Config;
use ratelimit_proxy::config::{Rate, EXACT_LIMIT};
use ratelimit_proxy::deny_cache::{Consult, DenyCache};
use ratelimit_proxy::headers::RouteHeaders;
use ratelimit_proxy::limiter::bucket::{charge, clamp_charge, evaluate, State};
use ratelimit_proxy::limiter::memory::MemoryLimiter;
use ratelimit_proxy::limiter::redis::Format;
use ratelimit_proxy::limiter::Decision;
use ratelimit_proxy::limiter::{BucketParams, Period};
use redis::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Three buckets sharing one hash tag, so any subset can be one decision (as a route's limits are).
const KEYS: [&str; 3] = ["{p}:a", "{p}:b", "{p}:c"];

/// One limit of one key; a key has one to three, and a step picking another one is a reload.
#[derive(Debug, Clone)]
struct LimitSpec {
    capacity: u64,
    /// A rate, or a quota's period (`day`, `week`, `month`): then `capacity` is its amount.
    refill: String,
    cost: u64,
}

impl LimitSpec {
    fn params(&self) -> BucketParams {
        match self.refill.parse::<Period>() {
            Ok(period) => BucketParams::quota(self.capacity, period, self.cost),
            Err(_) => super::limit(self.capacity, &self.refill, self.cost),
        }
    }

    /// The limit as a config writes it.
    fn yaml(&self, name: &str) -> String {
        match self.refill.parse::<Period>() {
            Ok(period) => format!(
                "{{ name: {name}, quota: {{ amount: {}, period: {} }}, cost: {} }}",
                self.capacity,
                period.as_str(),
                self.cost
            ),
            Err(_) => format!(
                "{{ name: {name}, capacity: {}, refill: \"{}\", cost: {} }}",
                self.capacity, self.refill, self.cost
            ),
        }
    }
}

#[derive(Debug, Clone)]
enum Advance {
    /// Same microsecond: concurrent requests.
    None,
    /// Hundredths of a token of the first key's first limit: the scale where refills matter.
    Hundredths(u64),
    /// Anything up to 115 days, roughly log-uniform: idles, and buckets full long ago.
    Us(u64),
}

#[derive(Debug, Clone)]
struct Step {
    advance: Advance,
    /// This request comes from a proxy whose clock is this far off (`clock: proxy`).
    skew_us: i64,
    /// (key, which of its limits): the limit set of this request, in this order.
    picks: Vec<(usize, usize)>,
    /// Not a request but a charge of usage a response reported, of this many tokens from each
    /// bucket picked (negative: a refund). `replay` only; the other replays decide it.
    charge: Option<i64>,
}

#[derive(Debug, Clone)]
struct History {
    limits: Vec<Vec<LimitSpec>>,
    steps: Vec<Step>,
}

/// `<number>/<unit>` as an operator writes it: common rates, and random ones with up to six
/// decimals (the parser's limit), up to a billion per second and down to rates so slow that no
/// capacity passes the 2^53 rule (those are filtered out below).
fn refill() -> impl Strategy<Value = String> {
    let common = select(vec![
        "1/s",
        "3/s",
        "10/s",
        "100/s",
        "1000000/s",
        "0.5/s",
        "2.5/s",
        "1/m",
        "7/m",
        "30/m",
        "1/h",
        "1000/h",
        "1/d",
        "2/d",
    ])
    .prop_map(String::from);
    let random = (
        (0u32..9).prop_flat_map(|e| 10u64.pow(e)..10u64.pow(e + 1)),
        0usize..=6,
        select(vec!['s', 'm', 'h', 'd']),
    )
        .prop_map(|(digits, decimals, unit)| {
            let text = format!("{digits:0width$}", width = decimals + 1);
            let (whole, frac) = text.split_at(text.len() - decimals);
            if decimals == 0 {
                format!("{whole}/{unit}")
            } else {
                format!("{whole}.{frac}/{unit}")
            }
        });
    prop_oneof![1 => common, 1 => random]
}

/// A quota's period: long advances cross its boundaries.
fn period() -> impl Strategy<Value = String> {
    select(vec!["day", "week", "month"]).prop_map(String::from)
}

/// The largest capacity the config accepts at `rate`. Reloads between any two of the rates
/// convert exactly in the script too: its rescaling never rounds (see `lua/token_bucket.lua`).
fn capacity_bound(rate: &Rate) -> u64 {
    EXACT_LIMIT.saturating_sub(rate.num()) / rate.scale()
}

/// Roughly log-uniform in 1..=max, with 1 and `max` themselves likely.
fn up_to(max: u64) -> BoxedStrategy<u64> {
    let digits = max.ilog10();
    prop_oneof![
        1 => Just(1),
        1 => Just(max),
        6 => (0..=digits).prop_flat_map(move |e| 1..=max.min(10u64.pow(e + 1))),
    ]
    .boxed()
}

/// A key's limits: the first is the one it starts with, the others what reloads switch to.
/// Buckets, or now and then quotas (amounts and periods changing): one kind per key, as in the
/// proxy, where a limit that changes kind gets keys of its own (`name@quota`).
fn key_limits() -> impl Strategy<Value = Vec<LimitSpec>> {
    prop_oneof![
        4 => prop::collection::vec(refill(), 1..=3),
        1 => prop::collection::vec(period(), 1..=3),
    ]
    .prop_filter_map("no capacity fits these rates", |texts| {
        let kept: Vec<(String, u64)> = texts
            .iter()
            .map(|t| match Rate::parse(t) {
                Ok(r) => (t.clone(), capacity_bound(&r)),
                Err(_) => (t.clone(), EXACT_LIMIT),
            })
            .filter(|(_, bound)| *bound >= 1)
            .collect();
        (!kept.is_empty()).then_some(kept)
    })
    .prop_flat_map(|kept| {
        kept.into_iter()
            .map(|(refill, bound)| {
                up_to(bound).prop_flat_map(move |capacity| {
                    let refill = refill.clone();
                    up_to(capacity).prop_map(move |cost| LimitSpec {
                        capacity,
                        refill: refill.clone(),
                        cost,
                    })
                })
            })
            .collect::<Vec<_>>()
    })
}

fn step() -> impl Strategy<Value = Step> {
    let advance = prop_oneof![
        3 => Just(Advance::None),
        6 => (0u64..300).prop_map(Advance::Hundredths),
        1 => (0u32..13).prop_flat_map(|e| 0..10u64.pow(e + 1)).prop_map(Advance::Us),
    ];
    let skew = prop_oneof![9 => Just(0i64), 1 => -5_000_000i64..=5_000_000];
    // Mostly a key's first limit; now and then another one: a reload.
    let pick = (
        0..KEYS.len(),
        prop_oneof![6 => Just(0usize), 1 => 0usize..3],
    );
    let charge = prop_oneof![
        6 => Just(None),
        2 => (-3i64..=300).prop_map(Some),
        1 => (0u32..16).prop_flat_map(|e| 0..10i64.pow(e)).prop_map(Some),
    ];
    (advance, skew, prop::collection::vec(pick, 1..=3), charge).prop_map(
        |(advance, skew_us, picks, charge)| Step {
            advance,
            skew_us,
            picks,
            charge,
        },
    )
}

fn history(steps: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = History> {
    (
        prop::collection::vec(key_limits(), KEYS.len()),
        prop::collection::vec(step(), steps),
    )
        .prop_map(|(limits, steps)| History { limits, steps })
}

impl Step {
    /// How far the fleet's clock moves before this request.
    fn advance_us(&self, first: &BucketParams) -> u64 {
        match self.advance {
            Advance::None => 0,
            // A quota's: hundredths of a day.
            Advance::Hundredths(k) if first.period().is_some() => k * 864_000_000,
            Advance::Hundredths(k) => {
                (u128::from(first.scale) * u128::from(k) / 100 / u128::from(first.num))
                    .min(10_000_000_000_000) as u64
            }
            Advance::Us(us) => us,
        }
    }
}

impl History {
    /// The buckets `step` draws from, each once, in order: (key, its limit now). Without
    /// `reloads`, every key keeps its first limit.
    fn picks(&self, step: &Step, reloads: bool) -> Vec<(usize, &LimitSpec)> {
        let mut picked: Vec<(usize, &LimitSpec)> = Vec::new();
        for &(k, which) in &step.picks {
            if picked.iter().all(|(seen, _)| *seen != k) {
                let specs = &self.limits[k];
                let which = if reloads { which % specs.len() } else { 0 };
                picked.push((k, &specs[which]));
            }
        }
        picked
    }
}

/// The in-memory store's decision at `now` for these buckets.
fn decide_in_memory<K: AsRef<str>>(
    memory: &MemoryLimiter<Arc<SetClock>>,
    clock: &SetClock,
    now: u64,
    keys: &[K],
    params: &[BucketParams],
) -> Decision {
    clock.set(now);
    memory.decide(&buckets(keys, params)).expect("one hash tag")
}

/// Replays `h` through the script, the in-memory store and the mirror, comparing every step.
fn replay(s: &Script, h: &History) -> Result<(), TestCaseError> {
    let mut conn = s.redis.connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    let clock = Arc::new(SetClock::new(T0));
    let memory = MemoryLimiter::new(clock.clone(), 1_000_000);
    let mut mirror: [Option<State>; 3] = [None; 3];
    // packed_ttl: when each key's expiry, as last set, ends (on the injected clock: the test
    // persists keys after each step, so Redis's own clock never ends one).
    let mut expiry: [Option<u64>; 3] = [None; 3];
    let first = h.limits[0][0].params();
    let mut base = T0;
    for (i, step) in h.steps.iter().enumerate() {
        base += step.advance_us(&first);
        let now = base.saturating_add_signed(step.skew_us);
        let picked: Vec<(usize, BucketParams)> = h
            .picks(step, true)
            .into_iter()
            .map(|(k, spec)| (k, spec.params()))
            .collect();
        let keys: Vec<&str> = picked.iter().map(|(k, _)| KEYS[*k]).collect();
        let params: Vec<BucketParams> = picked.iter().map(|(_, p)| *p).collect();

        // A charge's amounts, as the proxy clamps them.
        let amounts: Option<Vec<i64>> = step
            .charge
            .map(|c| params.iter().map(|p| clamp_charge(p, c)).collect());
        let mut tx = redis::pipe();
        tx.atomic().add_command(match &amounts {
            Some(amounts) => s.charging(&keys, now, &params, amounts),
            None => s.invocation(&keys, Some(now), &params),
        });
        for key in &keys {
            tx.cmd("PTTL").arg(*key);
            tx.cmd("PERSIST").arg(*key).ignore();
        }
        let replies: Vec<Value> = tx.query(&mut conn).expect("MULTI");
        let lua = decision(&replies[0], &params);

        let mut states: Vec<Option<State>> = picked.iter().map(|(k, _)| mirror[*k]).collect();
        let (in_memory, rust) = match &amounts {
            Some(amounts) => {
                clock.set(now);
                (
                    memory
                        .charge_now(&buckets(&keys, &params), amounts)
                        .unwrap(),
                    charge(now, &params, amounts, &mut states),
                )
            }
            None => (
                decide_in_memory(&memory, &clock, now, &keys, &params),
                evaluate(now, &params, &mut states),
            ),
        };
        for ((k, _), state) in picked.iter().zip(&states) {
            mirror[*k] = *state;
        }

        let at = || {
            format!(
                "step {i}: now T0{:+} µs, {picked:?}",
                now as i128 - T0 as i128
            )
        };
        prop_assert_eq!(&lua, &in_memory, "Lua vs the in-memory store at {}", at());
        prop_assert_eq!(&lua, &rust, "Lua vs bucket::evaluate at {}", at());
        for (j, ((k, p), state)) in picked.iter().zip(&states).enumerate() {
            let pttl = match replies[1 + j] {
                Value::Int(ms) => ms,
                ref other => panic!("PTTL: {other:?}"),
            };
            // Unchanging now that it no longer expires: read in the format written.
            let kind: String = s.redis.cmd(&["TYPE", keys[j]]);
            let expected = state.map(|st| [st.v, st.t, st.scale]);
            prop_assert_eq!(
                (stored(&s.redis, keys[j]), kind.as_str()),
                (
                    expected,
                    if expected.is_some() {
                        type_of(s.format)
                    } else {
                        "none"
                    }
                ),
                "stored v, t, s of {} at {}",
                keys[j],
                at()
            );
            if lua.allowed {
                // Written just now: it lives until the bucket is full again plus the 1 s margin
                // that covers proxy clock skew, and no longer. (100 ms of slack for Redis being
                // descheduled between the script and PTTL; it is 0 to 1 ms in practice.)
                let st = state.expect("an allowed request writes every bucket");
                // Counted from the decision: a bucket written ahead (another clock, a debt)
                // refills only from its instant, a quota is whole at its period's end.
                let fill_ms = (st.full_at(p) - now).div_ceil(1000) as i64;
                let mut slack = 0;
                if s.format == Format::PackedTtl {
                    if pttl == -1 {
                        // Kept (SETRANGE in place): the expiry set before must still cover the
                        // bucket until it is full plus the margin.
                        let until = expiry[*k].expect("an expiry kept that was never set");
                        prop_assert!(
                            until + 100_000 >= st.full_at(p) + 1_000_000,
                            "{} kept an expiry ending at T0{:+} µs for a bucket full at T0{:+} µs at {}",
                            keys[j],
                            until as i128 - T0 as i128,
                            st.full_at(p) as i128 - T0 as i128,
                            at()
                        );
                        continue;
                    }
                    // Set again: 5 s further than needed.
                    slack = 5_000;
                    expiry[*k] = Some(now + pttl as u64 * 1000);
                }
                prop_assert!(
                    fill_ms + slack + 900 <= pttl && pttl <= fill_ms + slack + 1000,
                    "PTTL {} ms of {} for a refill of {} ms at {}",
                    pttl,
                    keys[j],
                    fill_ms,
                    at()
                );
            }
        }
    }
    Ok(())
}

#[test]
fn the_script_and_the_in_memory_store_decide_alike_on_random_histories() {
    let s = Script::load();
    check(file!(), 128, history(1..=40), |h| replay(&s, &h));
}

#[test]
fn the_script_writing_packed_buckets_and_the_in_memory_store_decide_alike_on_random_histories() {
    let s = Script::writing(Format::Packed);
    check(file!(), 128, history(1..=40), |h| replay(&s, &h));
}

/// packed_ttl keeps a key's expiry while it covers the bucket: every write is checked against the
/// expiry set last (`replay`), so a key can never end before its bucket is full again.
#[test]
fn the_script_writing_packed_ttl_buckets_and_the_in_memory_store_decide_alike_on_random_histories()
{
    let s = Script::writing(Format::PackedTtl);
    check(file!(), 128, history(1..=40), |h| replay(&s, &h));
}

/// `cargo test --test it proofs::differential -- --ignored` (about 2.5 minutes on 2 cores).
#[test]
#[ignore = "long variant: 4,000 histories of up to 200 steps"]
fn the_script_and_the_in_memory_store_decide_alike_on_long_random_histories() {
    let s = Script::load();
    check(file!(), 4_000, history(1..=200), |h| replay(&s, &h));
}

/// How a step reaches Redis in `replay_batched`.
#[derive(Debug, Clone, Copy)]
enum Call {
    /// In the same call as the step before (the same proxy, the same instant): its own time
    /// step and skew are ignored.
    Joins,
    /// First of a new call.
    Starts,
    /// Alone, from a proxy of the previous version (`PREVIOUS_LUA`), sharing the Redis.
    Previous,
    /// First of a new call, from a proxy writing the other format.
    Other,
}

/// How `n` steps reach Redis: with `Previous` calls while a fleet still runs the previous version
/// (its proxies write hashes), or with `Other` calls once every proxy reads both formats and some
/// write packed buckets: the two phases of turning `state_format: packed` on.
fn calls(n: usize, odd_one: Call) -> impl Strategy<Value = Vec<Call>> {
    let call = prop_oneof![
        4 => Just(Call::Joins),
        2 => Just(Call::Starts),
        1 => Just(odd_one),
    ];
    prop::collection::vec(call, n)
}

/// Replays `h` in batches, as proxies send it: runs of steps are decided by one call each, in
/// order, at the instant of the run's first step; now and then a step goes alone through the
/// previous version's script, or a call comes from a proxy writing the other format, as during a
/// rolling upgrade. Every request's decision must be the one the in-memory store gives deciding
/// the same requests one by one at the same instants: a batch decides as its requests would
/// alone, and the versions and formats read each other's buckets.
fn replay_batched(s: &Script, h: &History, how: &[Call]) -> Result<(), TestCaseError> {
    let mut conn = s.redis.connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    let clock = Arc::new(SetClock::new(T0));
    let memory = MemoryLimiter::new(clock.clone(), 1_000_000);
    let first = h.limits[0][0].params();
    let request = |step: &Step| -> Request<'static> {
        h.picks(step, true)
            .into_iter()
            .map(|(k, spec)| (KEYS[k], spec.params()))
            .unzip()
    };
    let mut base = T0;
    let mut i = 0;
    while i < h.steps.len() {
        let head = &h.steps[i];
        base += head.advance_us(&first);
        let now = base.saturating_add_signed(head.skew_us);
        let start = i;
        i += 1;
        // The previous version knows no quotas: a config with one does not load there, so a
        // fleet has no such proxy left when quotas are configured.
        let previous = matches!(how[start], Call::Previous)
            && h.limits
                .iter()
                .flatten()
                .all(|l| l.params().period().is_none());
        let lua = if previous {
            let (keys, params) = request(head);
            vec![s.previous(&keys, now, &params)]
        } else {
            while i < h.steps.len() && matches!(how[i], Call::Joins) {
                i += 1;
            }
            let batch: Vec<Request<'_>> = h.steps[start..i].iter().map(request).collect();
            let format = match (how[start], s.format) {
                (Call::Other, Format::Hash) => Format::Packed,
                (Call::Other, Format::Packed) => Format::Hash,
                (Call::Other, Format::PackedTtl) => Format::Packed,
                (_, format) => format,
            };
            s.batch_in(format, &batch, now)
        };
        // Redis expires keys by its own clock, which the injected one does not drive: a slow run
        // must not expire a bucket the history says is not full yet (`replay` checks the TTLs).
        let mut persist = redis::pipe();
        for key in KEYS {
            persist.cmd("PERSIST").arg(key).ignore();
        }
        let _: () = persist.query(&mut conn).unwrap();
        for (j, (step, lua)) in h.steps[start..i].iter().zip(&lua).enumerate() {
            let (keys, params) = request(step);
            let in_memory = decide_in_memory(&memory, &clock, now, &keys, &params);
            prop_assert_eq!(
                lua,
                &in_memory,
                "step {} ({:?}, request {} of its call) at T0{:+} µs: {:?}",
                start + j,
                how[start],
                j,
                now as i128 - T0 as i128,
                keys
            );
        }
    }
    Ok(())
}

#[test]
fn batched_calls_and_the_previous_script_decide_as_the_in_memory_store_one_by_one() {
    let s = Script::load();
    let cases = (history(1..=40), calls(40, Call::Previous));
    check(file!(), 128, cases, |(h, how)| replay_batched(&s, &h, &how));
}

#[test]
fn batched_calls_writing_packed_buckets_and_hashes_decide_as_the_in_memory_store_one_by_one() {
    let s = Script::writing(Format::Packed);
    let cases = (history(1..=40), calls(40, Call::Other));
    check(file!(), 128, cases, |(h, how)| replay_batched(&s, &h, &how));
}

/// Turning packed_ttl on: proxies writing packed and packed_ttl share buckets.
#[test]
fn batched_calls_writing_packed_ttl_and_packed_buckets_decide_as_the_in_memory_store_one_by_one() {
    let s = Script::writing(Format::PackedTtl);
    let cases = (history(1..=40), calls(40, Call::Other));
    check(file!(), 128, cases, |(h, how)| replay_batched(&s, &h, &how));
}

/// `cargo test --test it proofs::differential -- --ignored`.
#[test]
#[ignore = "long variant: 4,000 histories of up to 200 steps"]
fn batched_calls_and_the_previous_script_decide_as_the_in_memory_store_on_long_histories() {
    let s = Script::load();
    let cases = (history(1..=200), calls(200, Call::Previous));
    check(file!(), 4_000, cases, |(h, how)| {
        replay_batched(&s, &h, &how)
    });
}

/// The response headers a route with these limits (named after their keys) gives for `d`.
fn headers(picked: &[(usize, &LimitSpec)], d: &Decision) -> Vec<(String, String)> {
    let mut yaml = String::from(
        "listen: \"127.0.0.1:1\"\nroutes:\n  - name: r\n    upstream: \"h:1\"\n    limits:\n",
    );
    for (k, spec) in picked {
        yaml.push_str(&format!("      - {}\n", spec.yaml(["a", "b", "c"][*k])));
    }
    let route = &Config::parse("t.yaml", &yaml)
        .expect("a valid route")
        .routes[0];
    let limits: Vec<usize> = (0..picked.len()).collect();
    let mut out = Vec::new();
    RouteHeaders::new(route).each(d, &limits, |name, value| {
        out.push((name.to_string(), value.to_str().unwrap().to_string()))
    });
    out
}

/// Replays `h` through the path a proxy takes to Redis, the deny cache in front of the script,
/// and through the in-memory store.
///
/// One proxy (`fleet: false`, every step on one clock): the two give the same decision and the
/// same headers at every step, whether the cache or the script answered: the cache's remembered
/// state is exact, and every admission forgets what it made stale.
///
/// A fleet (`fleet: true`: three proxies on one clock, as with `clock: redis`, each with a cache
/// of its own, the step's skew choosing which one serves it): another proxy's admissions make what
/// a cache remembers optimistic, never wrong. A cached denial is one the store gives too, with no
/// longer a `Retry-After` and no fewer tokens remaining. (Skewed clocks and fleets halfway through
/// a reload are left out: a clock ahead, or a faster rate, refills early for everyone, cache or
/// not; the plain differential covers both.)
fn replay_cached(s: &Script, h: &History, fleet: bool) -> Result<(), TestCaseError> {
    let mut conn = s.redis.connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    let clock = Arc::new(SetClock::new(T0));
    let memory = MemoryLimiter::new(clock.clone(), 1_000_000);
    let mut caches: HashMap<i64, DenyCache> = HashMap::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let first = h.limits[0][0].params();
    let mut base = T0;
    for (i, step) in h.steps.iter().enumerate() {
        base += step.advance_us(&first);
        let now = base;
        let proxy = if fleet { step.skew_us.rem_euclid(3) } else { 0 };
        // Proxies that run different limits for one key (a fleet halfway through a config
        // change) each answer by their own: only one proxy reloads here.
        let picked = h.picks(step, !fleet);
        let keys: Vec<String> = picked.iter().map(|(k, _)| KEYS[*k].to_string()).collect();
        let params: Vec<BucketParams> = picked.iter().map(|(_, spec)| spec.params()).collect();
        let at = || {
            format!(
                "step {i}: now T0{:+} µs, {picked:?}",
                now as i128 - T0 as i128
            )
        };

        let in_memory = decide_in_memory(&memory, &clock, now, &keys, &params);

        let cache = caches
            .entry(proxy)
            .or_insert_with(|| DenyCache::new(1_000, Duration::from_secs(1)));
        let refresh = match runtime.block_on(cache.consult(&keys, &params, || now)) {
            Consult::Denied(cached) => {
                prop_assert!(
                    !in_memory.allowed,
                    "a cached denial the store would admit at {}",
                    at()
                );
                if fleet {
                    prop_assert!(
                        cached.retry_after_us() <= in_memory.retry_after_us(),
                        "a longer wait than the store's at {}: {:?} vs {:?}",
                        at(),
                        cached,
                        in_memory
                    );
                    for (c, m) in cached.limits.iter().zip(&in_memory.limits) {
                        prop_assert!(
                            c.remaining >= m.remaining,
                            "fewer tokens than the store's at {}",
                            at()
                        );
                    }
                } else {
                    prop_assert_eq!(
                        &cached,
                        &in_memory,
                        "cached vs the in-memory store at {}",
                        at()
                    );
                    prop_assert_eq!(headers(&picked, &cached), headers(&picked, &in_memory));
                }
                continue;
            }
            Consult::Ask(refresh) => refresh,
            Consult::StoreFailed(_) => panic!("nothing fails here"),
        };
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut tx = redis::pipe();
        tx.atomic()
            .add_command(s.invocation(&key_refs, Some(now), &params));
        for key in &key_refs {
            // Redis expires keys by its own clock, which does not follow the injected one.
            tx.cmd("PERSIST").arg(*key).ignore();
        }
        let replies: Vec<Value> = tx.query(&mut conn).expect("MULTI");
        let lua = decision(&replies[0], &params);
        cache.note(&keys, &params, &lua, now, refresh);
        prop_assert_eq!(&lua, &in_memory, "Lua vs the in-memory store at {}", at());
        prop_assert_eq!(headers(&picked, &lua), headers(&picked, &in_memory));
    }
    Ok(())
}

#[test]
fn one_proxy_with_its_deny_cache_answers_as_the_in_memory_store_on_random_histories() {
    let s = Script::load();
    check(file!(), 128, history(1..=40), |h| {
        replay_cached(&s, &h, false)
    });
}

#[test]
fn a_fleet_of_deny_caches_never_denies_what_the_store_would_admit() {
    let s = Script::load();
    check(file!(), 128, history(1..=40), |h| {
        replay_cached(&s, &h, true)
    });
}
