//! Concurrency leases: the script (a sorted set of lease ids per key, in a batch call with the
//! request's buckets) and the in-memory store decide alike on random histories of acquisitions
//! (all-or-nothing with a token bucket and a quota beside them), releases, lease expiry and
//! reloads that change the limit, in both state formats.

use super::{buckets, check, SetClock};
use crate::support::lua::{Script, T0};
use proptest::prelude::*;
use ratelimit_proxy::limiter::memory::MemoryLimiter;
use ratelimit_proxy::limiter::redis::Format;
use ratelimit_proxy::limiter::{Bucket, BucketParams, Decision, Period};
use std::sync::Arc;

/// A request's buckets share one tag: a concurrency limit, a bucket, a quota.
const LEASES: &str = "{k}:inflight@inflight";
const BUCKET: &str = "{k}:burst";
const QUOTA: &str = "{k}:daily@quota";

#[derive(Debug, Clone)]
enum Step {
    /// A request drawing on the concurrency limit (with `max` leases of `ms`), and on the bucket
    /// and the quota when asked.
    Acquire {
        max: u64,
        ms: u64,
        bucket: bool,
        quota: bool,
    },
    /// The request admitted `which`-th among those still holding (modulo) ends.
    Release(usize),
    /// Time passes (µs).
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (1..=4u64, prop_oneof![Just(1_000u64), Just(30_000u64)], any::<bool>(), any::<bool>())
            .prop_map(|(max, ms, bucket, quota)| Step::Acquire { max, ms, bucket, quota }),
        3 => (0..8usize).prop_map(Step::Release),
        2 => prop_oneof![0..2_000_000u64, Just(999_999), Just(1_000_000), Just(30_000_000)]
            .prop_map(Step::Wait),
    ]
}

fn replay(s: &Script, steps: &[Step]) -> Result<(), TestCaseError> {
    let mut conn = s.redis.connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    let clock = Arc::new(SetClock::new(T0));
    let memory = MemoryLimiter::new(clock.clone(), 1_000);
    let mut now = T0;
    let mut holding: Vec<BucketParams> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        match *step {
            Step::Wait(us) => now += us,
            Step::Release(which) => {
                if holding.is_empty() {
                    continue;
                }
                let p = holding.remove(which % holding.len());
                let ids: Vec<u64> = vec![lease_id(&p)];
                let _: i64 = redis::cmd("ZREM")
                    .arg(LEASES)
                    .arg(ids[0])
                    .query(&mut conn)
                    .unwrap();
                memory.give_back(&[Bucket {
                    key: LEASES,
                    params: p,
                }]);
            }
            Step::Acquire {
                max,
                ms,
                bucket,
                quota,
            } => {
                let lease = BucketParams::leases(max, ms).with_lease(i as u64 + 1);
                let mut keys = vec![LEASES];
                let mut params = vec![lease];
                if bucket {
                    keys.push(BUCKET);
                    params.push(super::limit(3, "1/s", 1));
                }
                if quota {
                    keys.push(QUOTA);
                    params.push(BucketParams::quota(5, Period::Day, 1));
                }
                let lua: Decision = s.eval(&keys, now, &params);
                // Redis expires the set by its own clock, which the injected one does not drive.
                for key in [LEASES, BUCKET, QUOTA] {
                    let _: i64 = redis::cmd("PERSIST").arg(key).query(&mut conn).unwrap();
                }
                clock.set(now);
                let in_memory = memory.decide(&buckets(&keys, &params)).unwrap();
                prop_assert_eq!(&lua, &in_memory, "step {}: {:?}", i, step);
                if lua.allowed {
                    holding.push(lease);
                }
                let live: u64 = redis::cmd("ZCOUNT")
                    .arg(LEASES)
                    .arg(format!("({now}"))
                    .arg("+inf")
                    .query(&mut conn)
                    .unwrap();
                prop_assert!(
                    live <= max.max(holding.len() as u64),
                    "step {}: {} live",
                    i,
                    live
                );
            }
        }
    }
    Ok(())
}

fn lease_id(p: &BucketParams) -> u64 {
    match p.kind {
        ratelimit_proxy::limiter::Kind::Leases { id, .. } => id,
        _ => unreachable!("a lease"),
    }
}

#[test]
fn leases_in_the_script_and_in_memory_decide_alike_on_random_histories() {
    for format in [Format::Hash, Format::Packed] {
        let s = Script::writing(format);
        check(
            file!(),
            64,
            prop::collection::vec(step(), 1..=60),
            |steps| replay(&s, &steps),
        );
    }
}
