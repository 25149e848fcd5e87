//! Proofs that limits hold ("Proof that limits hold"): no over-admission across a fleet, the Lua
//! script equal to the in-memory bucket on random histories, the bound each clock mode gives, the
//! edge cases of the arithmetic, and exact accounting within one proxy.
//!
//! | property | file |
//! |---|---|
//! | three proxies, one Redis: admitted ≤ capacity + rate × elapsed, and ≥ 95 % of it | `fleet.rs` |
//! | Lua script ≡ in-memory store on random (time, cost, capacity, rate, limit set) histories | `differential.rs` |
//! | `clock: proxy` over-admits at most rate × skew, never accumulating; `clock: redis` none | `clock_modes.rs` |
//! | capacity 1 and 10^9, 1/d and 10^6/s, cost = capacity, idle and expiry, drift, long keys | `edge_cases.rs` |
//! | thousands of concurrent requests: every decision counted once | `one_proxy.rs` |
//! | concurrency leases: script ≡ in-memory store on random acquisitions, releases, expiries and reloads | `leases.rs` |
//! | calendar quotas whole again exactly at UTC boundaries (leap day, ISO week); at most the amount per period across clocks straddling one | `quotas.rs` |
//! | reservations: usage charged ≤ capacity + refill × elapsed over three proxies, whatever clients abort; script ≡ in-memory store | `reservations.rs` |
//! | every spelling of a path (escapes, dot segments, slashes) meets one canonical form: one route, one bucket | `canonical.rs` |
//!
//! Covered elsewhere, not repeated here: a limit changed by reload while a bucket is half empty
//! (`lua_script::a_changed_limit_keeps_the_tokens_held_within_the_new_capacity`, the
//! `limiter::bucket` unit tests, `operations::reload_*` end to end); odd bytes and 10 KB header
//! values answered and kept in bounded keys (`scenarios::hostile_requests_get_4xx_and_the_proxy_lives_on`,
//! `key.rs` unit tests); empty and absent values sharing one bucket
//! (`scenarios::*::two_keys_do_not_interfere`).
//!
//! Long variants are `#[ignore]`d; `cargo test --test it proofs -- --ignored` runs them all.

mod canonical;
mod clock_modes;
mod differential;
mod edge_cases;
mod fleet;
mod leases;
mod one_proxy;
mod quotas;
mod reservations;

use crate::support::redis::RedisServer;
use proptest::strategy::Strategy;
use proptest::test_runner::{
    Config, FileFailurePersistence, RngSeed, TestCaseError, TestError, TestRunner,
};
use ratelimit_proxy::clock::Clock;
use ratelimit_proxy::config::Rate;
use ratelimit_proxy::limiter::redis::{Format, RedisLimiter, RedisOptions, Security, Standalone};
use ratelimit_proxy::limiter::{Bucket, BucketParams, Kind};
use ratelimit_proxy::metrics::Metrics;
use std::fmt::Debug;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A limit as the config would compile it: `refill` is parsed by the config's own `Rate`.
pub fn limit(capacity: u64, refill: &str, cost: u64) -> BucketParams {
    let rate = Rate::parse(refill).unwrap_or_else(|e| panic!("{e}"));
    BucketParams {
        capacity,
        scale: rate.scale(),
        num: rate.num(),
        cost,
        kind: Kind::Bucket,
    }
}

/// A proxy's clock: some base clock, `offset` µs ahead (negative: behind).
pub struct Offset<C> {
    base: Arc<C>,
    pub offset: AtomicI64,
}

impl<C: Clock> Offset<C> {
    pub fn new(base: &Arc<C>, offset: i64) -> Arc<Offset<C>> {
        Arc::new(Offset {
            base: base.clone(),
            offset: AtomicI64::new(offset),
        })
    }
}

impl<C: Clock> Clock for Offset<C> {
    fn now_us(&self) -> u64 {
        self.base
            .now_us()
            .saturating_add_signed(self.offset.load(Ordering::SeqCst))
    }
}

/// A proxy's `RedisLimiter` on `redis` (a 10 s budget: these proofs are about answers), with
/// `clock` (`clock: proxy`) or Redis `TIME` (`None`), writing `format`.
pub fn redis_limiter(
    redis: &RedisServer,
    clock: Option<Box<dyn Clock>>,
    format: Format,
) -> RedisLimiter {
    let metrics = Metrics::new(&prometheus::Registry::new(), true).unwrap();
    let timeout = Duration::from_secs(10);
    let topology = Standalone::new(&redis.url(), &Security::default(), timeout).unwrap();
    let options = RedisOptions {
        timeout,
        clock,
        format,
        metrics,
    };
    RedisLimiter::new(Box::new(topology), options)
}

/// One request's buckets: `keys[i]` drawn under `params[i]`.
pub fn buckets<'a, K: AsRef<str>>(keys: &'a [K], params: &[BucketParams]) -> Vec<Bucket<'a>> {
    keys.iter()
        .zip(params)
        .map(|(key, p)| Bucket {
            key: key.as_ref(),
            params: *p,
        })
        .collect()
}

/// A runtime for one test thread's calls.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A clock the test sets to any instant, backwards included (a proxy whose clock is behind).
#[derive(Debug, Default)]
pub struct SetClock(AtomicU64);

impl SetClock {
    pub fn new(us: u64) -> SetClock {
        SetClock(AtomicU64::new(us))
    }

    pub fn set(&self, us: u64) {
        self.0.store(us, Ordering::SeqCst);
    }
}

impl Clock for SetClock {
    fn now_us(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Runs a property with proptest, reproducibly.
///
/// `cases` is the default run (kept short); `PROPTEST_CASES` overrides it. Every run draws one seed
/// and prints it when a case fails, as `PROPTEST_RNG_SEED=<n>`: setting that variable replays the
/// same cases in the same order. proptest also saves each failing case's own seed under
/// `tests/proptest-regressions/` (next to `tests/it/`, path and name of the property's file) and
/// replays the saved seeds first on every later run; commit those files with the fix.
pub fn check<S>(
    source_file: &'static str,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    let mut config = Config {
        source_file: Some(source_file),
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        // Every shrink step replays a whole history against Redis: bound the time it may take.
        max_shrink_time: 60_000,
        ..Config::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    let seed = match config.rng_seed {
        RngSeed::Fixed(seed) => seed,
        RngSeed::Random => {
            let seed = fresh_seed();
            config.rng_seed = RngSeed::Fixed(seed);
            seed
        }
    };
    let mut runner = TestRunner::new(config);
    match runner.run(&strategy, test) {
        Ok(()) => {}
        Err(TestError::Fail(why, input)) => panic!(
            "{why}\nminimal failing input: {input:#?}\nreplay: PROPTEST_RNG_SEED={seed} cargo test --test it {}",
            source_file
                .trim_start_matches("tests/it/")
                .trim_end_matches(".rs")
                .replace('/', "::")
        ),
        Err(e) => panic!("{e} (PROPTEST_RNG_SEED={seed})"),
    }
}

fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}
