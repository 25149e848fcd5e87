//! Reservations (`reserve`) and their settlement: the bound a budget keeps whatever clients do.
//!
//! The claim (README, "Limiting usage"): on a limit with `capacity` C, refill r and a reservation,
//! the usage charged for the requests admitted over any interval of length D is at most
//! C + r × D, across any number of proxies, when each request's usage is within what it drew up
//! front (its cost plus its reservation: a model's answer is capped by `max_tokens`).
//!
//! Why: a request is admitted only when the bucket holds its cost plus its reservation, and draws
//! both; a settlement then gives back what it did not use (the usage is known) or nothing (the
//! client hung up and the answer never reported, or the upstream never reports: what was drawn
//! stands). A settlement within what was drawn never takes more, so the bucket never goes below
//! zero and what was charged in all is what the refill and the initial capacity provided. The
//! store does it in one atomic step per admission and per settlement, so proxies sharing it
//! interleave as one.
//!
//! Checked here on random histories of admissions on three proxies sharing one Redis (and on the
//! in-memory store), with reservations present, absent and absurd, settlements that report a
//! usage, report nothing or never come (an aborted client whose answer was cut), time advancing
//! by random steps: after every step the usage charged so far is within the bound, and the
//! script and the in-memory store admit exactly the same requests.

use super::{check, redis_limiter, runtime, SetClock};
use crate::support::redis::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use ratelimit_proxy::config::{Config, Rate};
use ratelimit_proxy::gate::{Asking, Gate, Verdict};
use ratelimit_proxy::held::Held;
use ratelimit_proxy::limiter::memory::MemoryLimiter;
use ratelimit_proxy::limiter::redis::Format;
use ratelimit_proxy::limiter::Limiter;
use ratelimit_proxy::metrics::Metrics;
use ratelimit_proxy::plan::Plan;
use ratelimit_proxy::usage::request::reservations;
use std::sync::Arc;

const T0: u64 = 1_800_000_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    /// A request on proxy `proxy` naming `max_tokens` (or none, or an absurd one).
    Admit {
        proxy: usize,
        max_tokens: Option<u64>,
    },
    /// The answer of the `pending`-th request in flight: its usage as a share (per mille) of what
    /// it drew, or nothing (`None`: cut short, or never reported).
    Settle { pending: usize, used: Option<u16> },
}

#[derive(Debug, Clone)]
struct History {
    capacity: u64,
    per_second: u64,
    cost: u64,
    reserve_max: u64,
    refund_unused: bool,
    steps: Vec<(u64, Op)>,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize, prop_oneof![
            Just(None),
            (0..400u64).prop_map(Some),
            Just(Some(u64::MAX)),
        ]).prop_map(|(proxy, max_tokens)| Op::Admit { proxy, max_tokens }),
        2 => (0..8usize, prop_oneof![Just(None), (0..=1000u16).prop_map(Some)])
            .prop_map(|(pending, used)| Op::Settle { pending, used }),
    ]
}

fn history(steps: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = History> {
    (50..600u64, 1..50u64, 1..4u64, any::<bool>()).prop_flat_map(
        move |(capacity, per_second, cost, refund_unused)| {
            let room = capacity - cost;
            (
                1..=room,
                prop::collection::vec((0..400_000u64, op()), steps.clone()),
            )
                .prop_map(move |(reserve_max, steps)| History {
                    capacity,
                    per_second,
                    cost,
                    reserve_max,
                    refund_unused,
                    steps,
                })
        },
    )
}

fn plan(h: &History) -> Plan {
    let yaml = format!(
        "listen: \"127.0.0.1:1\"\nroutes:\n  - name: llm\n    upstream: \"127.0.0.1:2\"\n    limits:\n      - name: tokens\n        capacity: {}\n        refill: \"{}/s\"\n        cost: {}\n        key: \"header:x-api-key\"\n        reserve: \"json:max_tokens\"\n        reserve_max: {}\n        reserve_default: {}\n        charge_from_response: \"json:usage.total_tokens\"\n        refund_unused: {}\n",
        h.capacity, h.per_second, h.cost, h.reserve_max, h.reserve_max / 2, h.refund_unused
    );
    let config = Config::parse("t.yaml", &yaml).unwrap_or_else(|e| panic!("{e}"));
    Plan::compile(
        &config,
        &Metrics::new(&prometheus::Registry::new(), true).unwrap(),
    )
    .unwrap()
}

/// A request in flight: what it holds, and what it drew.
struct Pending {
    held: Held,
    drawn: u64,
}

/// Replays `h` on `gates` (the proxies, sharing one store, all on `clock`); returns which
/// admissions passed, after checking the bound at every step.
fn replay<L: Limiter>(
    h: &History,
    gates: &[Gate<L, Arc<SetClock>>],
    clock: &SetClock,
) -> Result<Vec<bool>, TestCaseError> {
    let plan = plan(h);
    let route = &plan.routes[0];
    let rate = Rate::parse(&format!("{}/s", h.per_second)).unwrap();
    let mut headers = http::HeaderMap::new();
    headers.insert("x-api-key", "k".parse().unwrap());
    let rt = runtime();
    let mut now = T0;
    let mut pending: Vec<Pending> = Vec::new();
    // Usage charged so far: settled requests' charges, and what unsettled ones drew.
    let mut settled: u64 = 0;
    let mut admitted = Vec::new();
    for (advance, op) in &h.steps {
        now += advance;
        clock.set(now);
        match *op {
            Op::Admit { proxy, max_tokens } => {
                let body = match max_tokens {
                    Some(n) => format!("{{\"max_tokens\": {n}}}"),
                    None => "{}".to_string(),
                };
                let reserved = reservations(
                    route.limits.iter().map(|l| l.reserve.as_ref()),
                    body.as_bytes(),
                );
                let asking = Asking {
                    client: None,
                    method: "POST",
                    path: "/v1/chat/completions",
                    query: None,
                    headers: &headers,
                    reserved: &reserved,
                };
                let (verdict, held) = rt.block_on(gates[proxy].admit(route, &asking));
                let pass = matches!(verdict, Verdict::Pass(..));
                admitted.push(pass);
                if pass {
                    pending.push(Pending {
                        held,
                        drawn: h.cost + reserved[0],
                    });
                }
            }
            Op::Settle { pending: i, used } if !pending.is_empty() => {
                let mut p = pending.remove(i % pending.len());
                let used = used.map(|per_mille| p.drawn * u64::from(per_mille) / 1000);
                // The settlement goes through whichever proxy served the request.
                rt.block_on(gates[0].settle(&mut p.held, |_| Some(used)));
                settled += match used {
                    None => p.drawn,
                    Some(u) if h.refund_unused => u,
                    Some(u) => u.max(h.cost),
                };
            }
            Op::Settle { .. } => {}
        }
        let in_flight: u64 = pending.iter().map(|p| p.drawn).sum();
        let bound = h.capacity + (now - T0) * rate.num() / rate.scale();
        prop_assert!(
            settled + in_flight <= bound,
            "charged {settled} + drawn by requests in flight {in_flight} > {bound} \
             (capacity {} + refill over {} µs)",
            h.capacity,
            now - T0
        );
    }
    Ok(admitted)
}

/// Three proxies on one Redis and the in-memory store, on one history.
fn both_hold_the_bound_and_agree(redis: &RedisServer, h: History) -> Result<(), TestCaseError> {
    let clock = Arc::new(SetClock::new(T0));
    redis.cmd::<()>(&["FLUSHALL"]);
    let fleet: Vec<_> = (0..3)
        .map(|_| {
            let store = redis_limiter(redis, Some(Box::new(clock.clone())), Format::PackedTtl);
            let fallback = MemoryLimiter::new(clock.clone(), 1000);
            Gate::new(Arc::new(store), None, fallback, clock.clone())
        })
        .collect();
    let by_redis = replay(&h, &fleet, &clock)?;
    let memory = Arc::new(MemoryLimiter::new(clock.clone(), 1000));
    let single: Vec<_> = (0..3)
        .map(|_| {
            let fallback = MemoryLimiter::new(clock.clone(), 1000);
            Gate::new(memory.clone(), None, fallback, clock.clone())
        })
        .collect();
    let by_memory = replay(&h, &single, &clock)?;
    prop_assert_eq!(
        by_redis,
        by_memory,
        "the script and the in-memory store differ"
    );
    Ok(())
}

#[test]
fn reservations_keep_charged_usage_within_capacity_plus_refill_across_three_proxies() {
    let redis = RedisServer::start();
    check(file!(), 48, history(1..=60), |h| {
        both_hold_the_bound_and_agree(&redis, h)
    });
}

#[test]
#[ignore]
fn reservations_keep_the_bound_on_long_histories() {
    let redis = RedisServer::start();
    check(file!(), 200, history(100..=400), |h| {
        both_hold_the_bound_and_agree(&redis, h)
    });
}
