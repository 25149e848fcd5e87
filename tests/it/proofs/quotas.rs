//! Calendar quotas: whole again exactly at their period's UTC boundary (month lengths, leap days
//! and ISO weeks included), in the Redis script (`clock: proxy` with an injected clock, both state
//! formats) and the in-memory store alike; and never more than the amount per period when the
//! proxies' clocks straddle a boundary.

use super::{redis_limiter, runtime, Offset};
use crate::support::redis::RedisServer;
use ratelimit_proxy::calendar::midnight;
use ratelimit_proxy::clock::{Clock, ManualClock};
use ratelimit_proxy::limiter::memory::MemoryLimiter;
use ratelimit_proxy::limiter::redis::{Format, RedisLimiter};
use ratelimit_proxy::limiter::{Bucket, BucketParams, Decision, Limiter, Period};
use std::sync::Arc;

const SECOND: u64 = 1_000_000;
const DAY: u64 = 86_400 * SECOND;

/// A store's decision for one bucket.
type Decide = Box<dyn Fn(&str, BucketParams) -> Decision>;

/// One store behind one injected clock, as a test drives it.
struct Store {
    name: String,
    clock: Arc<ManualClock>,
    decide: Decide,
}

impl Store {
    fn at(&self, t: u64) {
        let now = self.clock.now_us();
        assert!(t >= now, "the test moves time forward");
        self.clock.advance_us(t - now);
    }

    /// Requests at `t` until one is refused: what the quota has left then.
    fn drain(&self, key: &str, p: BucketParams, t: u64) -> u64 {
        self.at(t);
        let mut n = 0;
        while (self.decide)(key, p).allowed {
            n += 1;
            assert!(n <= 10_000, "{}: {key} never runs dry", self.name);
        }
        n
    }
}

/// The in-memory store and the script in both formats, each on its own clock from `start`.
fn stores(redis: &RedisServer, start: u64) -> Vec<Store> {
    let mut out = Vec::new();
    let clock = Arc::new(ManualClock::new(start));
    let memory = Arc::new(MemoryLimiter::new(clock.clone(), 1_000));
    out.push(Store {
        name: "memory".into(),
        clock,
        decide: Box::new(move |key, params| memory.decide(&[Bucket { key, params }]).unwrap()),
    });
    for format in [Format::Hash, Format::Packed] {
        let clock = Arc::new(ManualClock::new(start));
        let proxy = Arc::new(redis_limiter(redis, Some(Box::new(clock.clone())), format));
        let rt = Arc::new(runtime());
        out.push(Store {
            name: format!("redis {format:?}"),
            clock,
            decide: Box::new(move |key, params| {
                let key = format!("{key}:{format:?}");
                rt.block_on(proxy.check(&[Bucket { key: &key, params }]))
                    .unwrap()
            }),
        });
    }
    out
}

#[test]
fn a_monthly_quota_is_whole_again_exactly_at_the_month_boundary_leap_day_included() {
    let redis = RedisServer::start();
    let monthly = BucketParams::quota(5, Period::Month, 1);
    let feb = midnight(2028, 2, 1);
    for s in stores(&redis, feb) {
        let key = "{a}:monthly";
        assert_eq!(s.drain(key, monthly, feb + 3 * DAY), 5, "{}", s.name);
        // 2028 is a leap year: February 29 is still February's quota.
        assert_eq!(
            s.drain(key, monthly, midnight(2028, 2, 29)),
            0,
            "{}",
            s.name
        );
        let last = midnight(2028, 3, 1) - 1;
        s.at(last);
        let refused = (s.decide)(key, monthly);
        assert!(!refused.allowed, "{}", s.name);
        assert_eq!(refused.limits[0].wait_us, 1, "{}: one µs to March", s.name);
        assert_eq!(s.drain(key, monthly, last + 1), 5, "{}: March", s.name);
        // A quota spent in part keeps its balance through the month.
        assert_eq!(
            s.drain(key, monthly, midnight(2028, 3, 31)),
            0,
            "{}",
            s.name
        );
        let april = (s.decide)("{b}:monthly", monthly);
        assert_eq!(april.limits[0].remaining, 4, "{}", s.name);
        assert_eq!(
            april.limits[0].reset_us, DAY,
            "{}: `t` is the time to the boundary",
            s.name
        );
    }
}

#[test]
fn weekly_quotas_turn_on_monday_and_daily_ones_at_midnight_utc() {
    let redis = RedisServer::start();
    let weekly = BucketParams::quota(2, Period::Week, 2);
    let daily = BucketParams::quota(3, Period::Day, 1);
    // Thursday 2026-12-31; the ISO week that holds it ends at Monday 2027-01-04.
    let thursday = midnight(2026, 12, 31);
    for s in stores(&redis, thursday) {
        assert_eq!(s.drain("{w}:weekly", weekly, thursday + 1), 1, "{}", s.name);
        assert_eq!(
            s.drain("{w}:weekly", weekly, midnight(2027, 1, 4) - 1),
            0,
            "{}: Sunday night is the same week",
            s.name
        );
        assert_eq!(
            s.drain("{w}:weekly", weekly, midnight(2027, 1, 4)),
            1,
            "{}",
            s.name
        );
        assert_eq!(
            s.drain("{d}:daily", daily, midnight(2027, 1, 4) + DAY - 1),
            3,
            "{}",
            s.name
        );
        assert_eq!(
            s.drain("{d}:daily", daily, midnight(2027, 1, 5)),
            3,
            "{}",
            s.name
        );
    }
}

/// Three proxies 400 ms apart burst through a month boundary, 50 ms per round: the proxy ahead
/// opens the new month first, and the ones behind then draw on the new month's quota, never on
/// the old one again. So the old month admits exactly the amount, and so does the new one.
#[test]
fn proxies_whose_clocks_straddle_the_boundary_never_admit_more_than_the_amount_per_period() {
    let redis = RedisServer::start();
    let amount = 40;
    let monthly = BucketParams::quota(amount, Period::Month, 1);
    let boundary = midnight(2027, 1, 1);
    let start = boundary - 2 * SECOND;
    let base = Arc::new(ManualClock::new(start));
    let proxies: Vec<RedisLimiter> = [-400_000, 0, 400_000]
        .into_iter()
        .map(|offset| {
            redis_limiter(
                &redis,
                Some(Box::new(Offset::new(&base, offset))),
                Format::Packed,
            )
        })
        .collect();
    let rt = runtime();
    let key = "{straddle}:monthly";
    let admit = |p: &RedisLimiter| {
        rt.block_on(p.check(&[Bucket {
            key,
            params: monthly,
        }]))
        .unwrap()
        .allowed
    };
    let (mut early, mut total, mut round) = (0, 0, 0);
    while base.now_us() < boundary + 2 * SECOND {
        if base.now_us() + 400_000 < boundary {
            // Every clock in December: one request a round, fewer than the amount in all.
            let admitted = u64::from(admit(&proxies[round % 3]));
            early += admitted;
            total += admitted;
        } else {
            // The clocks disagree about the month: a burst from every proxy each round.
            for p in &proxies {
                for _ in 0..8 {
                    total += u64::from(admit(p));
                }
            }
        }
        base.advance_us(50_000);
        round += 1;
    }
    assert!(
        early < amount,
        "December was not spent before the straddle: {early}"
    );
    assert_eq!(total, 2 * amount, "December's quota and January's, no more");
    // The quota is the new month's now, and spent: every clock agrees.
    for p in &proxies {
        assert!(!admit(p));
    }
}
