//! Rate-limit decisions behind one trait, so the proxy neither knows nor cares where buckets live.
//!
//! Every backend evaluates all limits of a request at once and all-or-nothing: a request takes
//! tokens from every bucket or from none, so a rejected request costs the client nothing.

pub mod breaker;
pub mod bucket;
pub mod late;
pub mod memory;
pub mod redis;

pub use crate::calendar::Period;
pub use crate::metrics::{Cause, ErrorKind};
use std::future::Future;
use std::time::Duration;

/// A limit's numbers as the arithmetic needs them (see `lua/token_bucket.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketParams {
    pub capacity: u64,
    /// Units per token.
    pub scale: u64,
    /// Units gained per microsecond; 0 for a quota.
    pub num: u64,
    pub cost: u64,
    pub kind: Kind,
}

/// How a limit's allowance comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A token bucket: `num` units per microsecond, continuously.
    Bucket,
    /// A calendar quota of `capacity` per period, whole again at each of the period's boundaries
    /// (`scale` 1, `num` 0).
    Quota(Period),
    /// A concurrency limit: at most `capacity` requests hold a lease at once (`scale` 1, `num` 0,
    /// `cost` 1). A lease comes back when its request releases it, or `ms` after it was taken (a
    /// proxy that died holding it). `id` names this request's lease, unique across the fleet
    /// (0 in a route's plan; each request gets its own).
    Leases { ms: u64, id: u64 },
}

impl BucketParams {
    /// A quota of `amount` per `period`, `cost` per request.
    pub const fn quota(amount: u64, period: Period, cost: u64) -> BucketParams {
        BucketParams {
            capacity: amount,
            scale: 1,
            num: 0,
            cost,
            kind: Kind::Quota(period),
        }
    }

    /// At most `max` requests in flight at once, a lease expiring after `ms` unless released.
    pub const fn leases(max: u64, ms: u64) -> BucketParams {
        BucketParams {
            capacity: max,
            scale: 1,
            num: 0,
            cost: 1,
            kind: Kind::Leases { ms, id: 0 },
        }
    }

    /// What a stored state's `s` records under this limit: its scale, or a quota's amount (a
    /// quota's state then says how much was used, whatever the amount becomes).
    pub fn unit(&self) -> u64 {
        match self.kind {
            Kind::Quota(_) => self.capacity,
            _ => self.scale,
        }
    }

    /// A quota's period.
    pub fn period(&self) -> Option<Period> {
        match self.kind {
            Kind::Quota(period) => Some(period),
            _ => None,
        }
    }

    /// These params for the request whose lease is `id` (a concurrency limit's; others as they
    /// are).
    pub fn with_lease(self, id: u64) -> BucketParams {
        match self.kind {
            Kind::Leases { ms, .. } => BucketParams {
                kind: Kind::Leases { ms, id },
                ..self
            },
            _ => self,
        }
    }

    /// Whether requests hold this limit's allowance only while in flight.
    pub fn is_lease(&self) -> bool {
        matches!(self.kind, Kind::Leases { .. })
    }
}

/// One bucket a request must draw from.
#[derive(Debug, Clone, Copy)]
pub struct Bucket<'a> {
    pub key: &'a str,
    pub params: BucketParams,
}

/// What one bucket said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitState {
    /// This bucket alone held the cost.
    pub ok: bool,
    /// Whole tokens left: after this request when it was allowed, untouched when not.
    pub remaining: u64,
    /// Until the bucket is full again.
    pub reset_us: u64,
    /// When `ok`: until the next whole token (0 when full). Otherwise: until the cost is there.
    pub wait_us: u64,
    /// Units of `1/scale` token held: the exact state the numbers above are rounded from, so a
    /// remembered decision can be answered again later (`deny_cache`).
    pub held: u64,
    /// How far ahead of this decision's clock the bucket was last written (by a proxy whose clock
    /// runs ahead): it refills only from then. 0 but under clock skew.
    pub lag_us: u64,
}

impl LimitState {
    /// The bucket as of `now` on the clock this decision was made by.
    /// `unit`: the limit's `BucketParams::unit`.
    pub fn state(&self, now: u64, unit: u64) -> bucket::State {
        bucket::State {
            v: self.held,
            t: now + self.lag_us,
            scale: unit,
        }
    }
}

/// The outcome of one request against all of its route's limits, in the route's limit order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub limits: Vec<LimitState>,
}

impl Decision {
    /// The limit the response headers describe, for requests that each cost one. See
    /// `binding_by`.
    pub fn binding(&self) -> Option<usize> {
        self.binding_by(|_| 1)
    }

    /// The limit the response headers describe, where `cost(j)` is what one request takes from
    /// limit `j`. Allowed: the one with the fewest requests left (`remaining / cost`; tie → the
    /// longest reset), so a bucket of 15 tokens at cost 5 (3 requests) binds before 4 leases.
    /// Rejected: the limit the client must wait for longest, whose wait is `Retry-After` (tie →
    /// the least remaining), so that `RateLimit`'s `t` and `Retry-After` agree.
    pub fn binding_by(&self, cost: impl Fn(usize) -> u64) -> Option<usize> {
        let indexed = self.limits.iter().enumerate();
        if self.allowed {
            indexed
                .min_by(|(i, a), (j, b)| {
                    let requests = |n: usize, l: &LimitState| l.remaining / cost(n).max(1);
                    requests(*i, a)
                        .cmp(&requests(*j, b))
                        .then(b.reset_us.cmp(&a.reset_us))
                })
                .map(|(i, _)| i)
        } else {
            indexed
                .filter(|(_, l)| !l.ok)
                .max_by(|(_, a), (_, b)| {
                    a.wait_us
                        .cmp(&b.wait_us)
                        .then(b.remaining.cmp(&a.remaining))
                })
                .map(|(i, _)| i)
        }
    }

    /// Replaces the states of the limits charged since (`after`: the route's limit index and
    /// its state), where `limits` gives each state's route index.
    pub fn update(&mut self, limits: &[usize], after: &[(usize, LimitState)]) {
        for (i, state) in after {
            if let Some(j) = limits.iter().position(|l| l == i) {
                self.limits[j] = *state;
            }
        }
    }

    /// Microseconds until this request's cost would be admitted by every limit; 0 when allowed.
    pub fn retry_after_us(&self) -> u64 {
        self.limits
            .iter()
            .filter(|l| !l.ok)
            .map(|l| l.wait_us)
            .max()
            .unwrap_or(0)
    }
}

/// Why a backend could not decide. The proxy turns every variant into the route's
/// `on_redis_error` policy; `kind` labels the error metric.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LimiterError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The budget ran out, but the proxy's own lateness (its runtime not running the call's
    /// task when it was due: a starved or overloaded process) took most of it: not Redis's
    /// fault, so the breaker does not count it (`limiter::late`).
    #[error("no answer within {budget:?}, {late:?} of it lost to the proxy's own lateness")]
    Late { budget: Duration, late: Duration },
    #[error("connection: {0}")]
    Connection(String),
    #[error("script: {0}")]
    Script(String),
    /// Redis is at `maxmemory` with no eviction: it refuses the writes a decision needs.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// The in-memory store holds `max_keys` buckets, none of them whole again: it has no room
    /// for a new one and drops none that a client has spent (`memory`).
    #[error("the in-memory store is full (memory.max_keys)")]
    StoreFull,
    #[error("{0}")]
    Other(String),
    /// Not called: the circuit breaker knows the store is down.
    #[error("circuit breaker open: not calling the store")]
    Unavailable,
}

impl LimiterError {
    /// The `kind` label of `ratelimit_redis_errors_total`.
    pub fn kind(&self) -> ErrorKind {
        match self {
            LimiterError::Timeout(_) => ErrorKind::Timeout,
            LimiterError::Late { .. } => ErrorKind::ProxyLate,
            LimiterError::Connection(_) => ErrorKind::Connection,
            LimiterError::Script(_) => ErrorKind::Script,
            LimiterError::OutOfMemory(_) => ErrorKind::Oom,
            LimiterError::StoreFull => ErrorKind::StoreFull,
            LimiterError::Other(_) => ErrorKind::Other,
            LimiterError::Unavailable => ErrorKind::Unavailable,
        }
    }

    /// Why a decision the store did not make followed `on_redis_error`: the `cause` label of
    /// `ratelimit_store_failures_total`.
    pub fn cause(&self) -> Cause {
        match self {
            LimiterError::Timeout(_) => Cause::Timeout,
            LimiterError::Late { .. } => Cause::ProxyLate,
            LimiterError::Connection(_) => Cause::Connection,
            LimiterError::Unavailable => Cause::BreakerOpen,
            LimiterError::OutOfMemory(_) => Cause::Oom,
            LimiterError::StoreFull => Cause::StoreFull,
            LimiterError::Script(_) => Cause::Script,
            LimiterError::Other(_) => Cause::Other,
        }
    }

    /// A failure of the store's reachability rather than of our request: worth a retry later,
    /// and what a circuit breaker counts.
    pub fn is_transient(&self) -> bool {
        matches!(self, LimiterError::Timeout(_) | LimiterError::Connection(_))
    }
}

/// A place where buckets live.
pub trait Limiter: Send + Sync + 'static {
    /// Takes `cost` from every bucket, or from none. Resolves within the backend's time budget.
    fn check(
        &self,
        buckets: &[Bucket<'_>],
    ) -> impl Future<Output = Result<Decision, LimiterError>> + Send;

    /// Whether the store answers, for `/readyz`.
    fn ping(&self) -> impl Future<Output = Result<(), LimiterError>> + Send;

    /// Ends the leases that `check` granted: `leases` are the concurrency limits' buckets of an
    /// admitted request, as it drew them (their ids name its leases).
    fn release(
        &self,
        leases: &[Bucket<'_>],
    ) -> impl Future<Output = Result<(), LimiterError>> + Send;

    /// Keeps the leases `check` granted alive for another `lease_ms` while their request is
    /// still in flight (a long stream); a lease that already expired stays gone.
    fn renew(&self, leases: &[Bucket<'_>])
        -> impl Future<Output = Result<(), LimiterError>> + Send;

    /// Takes `amounts[i]` whole tokens from `buckets[i]` (negative: gives them back, up to the
    /// capacity) whatever they hold, going into debt: the usage a response reported beyond its
    /// up-front cost. The decision is the buckets after the charge (`allowed` is always true).
    fn charge(
        &self,
        buckets: &[Bucket<'_>],
        amounts: &[i64],
    ) -> impl Future<Output = Result<Decision, LimiterError>> + Send;

    /// One bucket as the store holds it now, read without changing it (the admin API).
    fn inspect(&self, key: &str) -> impl Future<Output = Result<Inspected, LimiterError>> + Send {
        let _ = key;
        async { Err(LimiterError::Other("this store cannot be inspected".into())) }
    }

    /// Forgets one bucket, which is full from then on (the admin API); `true` when there was one.
    fn reset(&self, key: &str) -> impl Future<Output = Result<bool, LimiterError>> + Send {
        let _ = key;
        async {
            Err(LimiterError::Other(
                "this store cannot reset a bucket".into(),
            ))
        }
    }
}

/// What `Limiter::inspect` read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inspected {
    /// `None`: no bucket, which is a full one.
    pub state: Option<bucket::State>,
    /// The store's clock when it was read (µs): the instant to refill `state` to.
    pub now_us: u64,
    /// Until the store forgets it (Redis: PTTL), when it has one.
    pub ttl_ms: Option<u64>,
    /// A concurrency limit's key: the leases held now.
    pub leases: Option<u64>,
}
