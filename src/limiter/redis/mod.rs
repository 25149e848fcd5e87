//! Buckets in Redis: `lua/token_bucket.lua` by EVALSHA, on a standalone server, a Redis Cluster,
//! or the primary a set of sentinels names.
//!
//! Decisions that arrive while a call is in flight go together in the next one (`batch`); on a
//! Cluster, where keys live on many nodes, each decision is its own call. A standalone server or a
//! sentinels' primary gets a connection per worker thread, which that thread's batch driver reads
//! and writes itself (`wire`; over TLS a redis-rs manager per thread); a Cluster, redis-rs's
//! multiplexed connections. So there is no pool to size. Connections are made on first use,
//! inside the runtime that serves requests: a handle made before Pingora starts its runtimes
//! would be bound to a dead one. Every decision runs under one
//! deadline, queueing and reconnects included, because the clients themselves would wait for Redis
//! far longer; and a circuit breaker stops calling a Redis that is known to be down.
//!
//! Each deployment shape is a `Topology` in a file of its own (`standalone`, `cluster`,
//! `sentinel`): how it connects and how it recovers after an error. What is common (the script,
//! the deadline, the breaker, the reply) is here.

mod batch;
mod charge;
mod cluster;
pub mod eviction;
mod inspect;
mod release;
mod sentinel;
mod standalone;
mod wire;

pub use cluster::Cluster;
pub use sentinel::Sentinel;
pub use standalone::Standalone;

use super::breaker::{Admission, Breaker, BreakerState, Transition};
use super::bucket::{report, State};
use super::{Bucket, BucketParams, Decision, ErrorKind, Inspected, Kind, Limiter, LimiterError};
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::throttle::Throttle;
use async_trait::async_trait;
use batch::Batches;
use redis::aio::ConnectionManagerConfig;
use redis::{Cmd, RedisError, Script, TlsCertificates, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The script, compiled into the binary so it always matches the code that parses its reply.
pub const TOKEN_BUCKET_LUA: &str = include_str!("../../../lua/token_bucket.lua");
/// Renews a concurrency lease whose request is still in flight.
pub const RENEW_LUA: &str = include_str!("../../../lua/renew.lua");
/// One bucket read without writing (the admin API).
pub const PEEK_LUA: &str = include_str!("../../../lua/peek.lua");

/// The format buckets are written in (every format is read, so proxies writing any of them share
/// buckets exactly): the script's `ARGV[2]`, see "State" in `lua/token_bucket.lua`.
pub use crate::config::StateFormat as Format;

/// How a Redis deployment is reached: a standalone server, a cluster, or sentinels' primary. Each
/// knows its own way back after an error (reconnect, follow a failover); the limiter around it
/// keeps the script, the deadline, the breaker and the reply the same for all.
#[async_trait]
pub trait Topology: Send + Sync + 'static {
    /// Sends one command, retrying where this topology knows a retry can succeed.
    async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError>;

    /// Whether every key is on one server, so that one call may carry the buckets of many
    /// requests.
    fn one_server(&self) -> bool {
        true
    }
}

/// `cmd`, an EVALSHA of `script`, loading the script first where the server does not know it (a
/// restart, a failover, `SCRIPT FLUSH`). On a Cluster the load goes to the primaries the client
/// knows and the call to the key's node: while a failover moves slots, the load can miss the node
/// the call then reaches, so a second load follows a second NOSCRIPT (seen under the failover
/// test).
async fn query_loading(
    topology: &dyn Topology,
    cmd: &Cmd,
    script: &str,
) -> Result<Value, RedisError> {
    let mut reply = topology.query(cmd).await;
    for _ in 0..2 {
        match &reply {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(script);
                topology.query(&load).await?;
                reply = topology.query(cmd).await;
            }
            _ => break,
        }
    }
    reply
}

/// A configuration the client library refuses (a bad URL, say): found at start.
fn misconfigured(e: RedisError) -> LimiterError {
    LimiterError::Other(format!("redis configuration: {e}"))
}

/// The settings of a reconnecting connection: the budget is the one limit.
fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        // redis-rs otherwise gives up on a response after 500 ms, whatever our budget is; the
        // budget (enforced around the whole call) is the one limit.
        .set_response_timeout(Some(timeout))
        // Few, quick reconnect attempts: a refused connection then fails the decision fast
        // instead of holding it for the whole budget, and the next decision starts a new
        // attempt, so a Redis that comes back is found at once.
        .set_min_delay(Duration::from_millis(5))
        .set_max_delay(Duration::from_millis(50))
        .set_number_of_retries(1)
}

/// How to authenticate to the Redis servers.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// Overrides what the URLs carry (it comes from the environment).
    pub password: Option<String>,
    /// Trust this CA (PEM) for `rediss://` instead of the system's store.
    pub ca_pem: Option<Vec<u8>>,
}

impl Security {
    fn certificates(&self) -> Option<TlsCertificates> {
        self.ca_pem.as_ref().map(|pem| TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.clone()),
        })
    }

    fn apply(&self, info: redis::ConnectionInfo) -> redis::ConnectionInfo {
        let info = info.set_tcp_settings(tcp_settings());
        match &self.password {
            Some(p) => {
                let settings = info.redis_settings().clone().set_password(p);
                info.set_redis_settings(settings)
            }
            None => info,
        }
    }

    fn client(&self, info: redis::ConnectionInfo) -> redis::RedisResult<redis::Client> {
        let info = self.apply(info);
        match self.certificates() {
            Some(certs) => redis::Client::build_with_tls(info, certs),
            None => redis::Client::open(info),
        }
    }
}

/// Nagle's algorithm off (redis-rs leaves it on): decisions are small writes pipelined on one
/// connection, and with Nagle each one waits for the previous one's ACK. In bench/compare.sh's
/// fixed-rate runs (half of peak) the check added 578 µs at p50 and 6.5 ms at p99 with Nagle,
/// 276 µs and 2.0 ms without.
fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// What calls the script: the topology, the script, the clock, the budget.
pub struct Caller {
    topology: Box<dyn Topology>,
    script: Script,
    timeout: Duration,
    /// `None`: the script reads Redis `TIME`.
    clock: Option<Box<dyn Clock>>,
    format: Format,
    metrics: Metrics,
}

impl Caller {
    /// The EVALSHA of these requests' decisions (the argument layout is the script's header):
    /// each distinct limit once, then each request's limit numbers.
    fn command(&self, jobs: &[batch::Job]) -> Cmd {
        let mut limits: Vec<BucketParams> = Vec::new();
        let mut index = |p: &BucketParams| match limits.iter().position(|l| l == p) {
            Some(i) => i + 1,
            None => {
                limits.push(*p);
                limits.len()
            }
        };
        let numbers: Vec<usize> = jobs
            .iter()
            .flat_map(|j| &j.params)
            .map(&mut index)
            .collect();
        // Sized once: arguments are a key or a number each (a key's bytes counted, 20 per number).
        let keys: usize = jobs.iter().flat_map(|j| &j.keys).map(String::len).sum();
        let args = 5 + numbers.len() * 2 + jobs.len() + limits.len() * 4;
        let mut cmd = redis::Cmd::with_capacity(args, keys + 40 + (args - numbers.len()) * 20);
        cmd.arg("EVALSHA")
            .arg(self.script.get_hash())
            .arg(numbers.len());
        for j in jobs {
            for k in &j.keys {
                cmd.arg(k.as_str());
            }
        }
        match &self.clock {
            Some(clock) => cmd.arg(clock.now_us()),
            None => cmd.arg(""),
        };
        cmd.arg(self.format.as_str()).arg(limits.len());
        for p in &limits {
            limit_args(&mut cmd, p, p.cost as i64);
        }
        // One limit, one bucket per request: the script reads each key as a request of its own.
        if limits.len() == 1 && jobs.iter().all(|j| j.params.len() == 1) {
            return cmd;
        }
        let mut numbers = numbers.into_iter();
        for j in jobs {
            cmd.arg(j.params.len());
            for n in numbers.by_ref().take(j.params.len()) {
                cmd.arg(n);
            }
        }
        cmd
    }

    /// One call of the script for `jobs`, loading it first where the server does not know it
    /// (a restart, a failover, `SCRIPT FLUSH`). The flat reply, of exactly the length `jobs` need
    /// after the call's `now`.
    async fn call(&self, jobs: &[batch::Job]) -> Result<Vec<i64>, LimiterError> {
        self.metrics.redis_batch(jobs.len());
        let cmd = self.command(jobs);
        let reply = query_loading(self.topology.as_ref(), &cmd, TOKEN_BUCKET_LUA)
            .await
            .map_err(classify)?;
        let reply: Vec<i64> =
            redis::from_redis_value(reply).map_err(|e| LimiterError::Script(e.to_string()))?;
        full_reply(reply, jobs.iter().map(|j| j.params.len()))
    }
}

pub struct RedisLimiter {
    caller: Arc<Caller>,
    /// `None` on a Cluster: each decision is its own call.
    batches: Option<Batches>,
    timeout: Duration,
    metrics: Metrics,
    breaker: Breaker,
    /// Poisoned keys: a warning per key per minute.
    bad_keys: Throttle,
    /// Errors that are not about reaching Redis (script, out of memory): a warning per kind per
    /// 10 s. Reachability has the breaker's own lines.
    errors: Throttle,
}

/// What every topology's limiter is given.
pub struct RedisOptions {
    /// The whole budget of one decision, queueing and reconnecting included.
    pub timeout: Duration,
    /// `None`: the script reads Redis `TIME`.
    pub clock: Option<Box<dyn Clock>>,
    /// What buckets are written as.
    pub format: Format,
    pub metrics: Metrics,
}

/// ", and N more since the last line this <period>" when something was not logged.
fn since(more: u64, period: &str) -> String {
    match more {
        0 => String::new(),
        n => format!(" ({n} more times in the last {period})"),
    }
}

impl RedisLimiter {
    /// Decisions on `topology`. Connects nothing yet: connections are made on first use, inside
    /// the runtime that serves requests.
    pub fn new(topology: Box<dyn Topology>, options: RedisOptions) -> RedisLimiter {
        let batched = topology.one_server();
        let caller = Arc::new(Caller {
            topology,
            script: Script::new(TOKEN_BUCKET_LUA),
            timeout: options.timeout,
            clock: options.clock,
            format: options.format,
            metrics: options.metrics.clone(),
        });
        RedisLimiter {
            batches: batched.then(|| Batches::new(caller.clone())),
            caller,
            timeout: options.timeout,
            metrics: options.metrics,
            breaker: Breaker::default(),
            bad_keys: Throttle::new(Duration::from_secs(60)),
            errors: Throttle::new(Duration::from_secs(10)),
        }
    }

    /// The decision, within the budget: batched calls keep each request's deadline themselves
    /// (no timer per request); a call of its own runs under a timeout.
    async fn eval(
        &self,
        buckets: &[Bucket<'_>],
        started: Instant,
    ) -> Result<Decision, LimiterError> {
        let answer = match &self.batches {
            Some(batches) => batches.decide(buckets, started + self.timeout).await?,
            // A call of its own (a Cluster's): its timeout told from the proxy's lateness too.
            None => {
                crate::limiter::late::within(
                    self.timeout,
                    started,
                    batch::alone(&self.caller, buckets),
                )
                .await??
            }
        };
        let (decision, bad) = parse_reply(answer.reply(), answer.now(), buckets)?;
        for i in bad {
            self.bad_state(buckets[i].key);
        }
        Ok(decision)
    }

    /// A bucket key held something else (written by another program, or a format this version
    /// does not read). The script rewrote it; the operator should know something else writes there.
    fn bad_state(&self, key: &str) {
        self.metrics.redis_error(ErrorKind::BadState);
        if let Some(more) = self.bad_keys.note(key, Instant::now()) {
            log::warn!(
                "redis: key {key} held something other than a bucket; rewritten as a full bucket{}",
                since(more, "minute")
            );
        }
    }

    /// Warns once when Redis's `maxmemory-policy` can evict the proxy's keys (`eviction`); says
    /// at info level when it cannot be read (an ACL without `+info`, Redis not up yet).
    pub async fn check_eviction(&self) {
        let wait = self.timeout.max(Duration::from_secs(2));
        match tokio::time::timeout(wait, eviction::read(self.caller.topology.as_ref())).await {
            Ok(Ok((policy, maxmemory))) => match eviction::advice(&policy, maxmemory) {
                Some(line) => log::warn!("{line}"),
                None => {
                    log::info!("Redis maxmemory-policy is {policy}: no spent budget is evicted")
                }
            },
            Ok(Err(e)) => log::info!("redis maxmemory-policy not checked: {e}"),
            Err(_) => log::info!("redis maxmemory-policy not checked: no answer within {wait:?}"),
        }
    }

    fn note(&self, transition: Transition) {
        let Some(state) = transition else { return };
        match state {
            BreakerState::Open => log::warn!(
                "redis unreachable: circuit breaker open, decisions follow on_redis_error without calling Redis"
            ),
            BreakerState::HalfOpen => log::info!("redis circuit breaker half-open: probing"),
            BreakerState::Closed => log::info!("redis reachable again: circuit breaker closed"),
        }
        self.metrics.breaker(state);
    }
}

impl Limiter for RedisLimiter {
    async fn check(&self, buckets: &[Bucket<'_>]) -> Result<Decision, LimiterError> {
        let started = Instant::now();
        let (admission, transition) = self.breaker.admit(started);
        self.note(transition);
        if admission == Admission::Reject {
            return Err(LimiterError::Unavailable);
        }
        let result = match self.eval(buckets, started).await {
            // Ours or the client's own (set to the same budget): the budget ran out either way.
            Err(LimiterError::Timeout(_)) => Err(LimiterError::Timeout(self.timeout)),
            result => result,
        };
        match &result {
            Ok(_) => {
                self.metrics.redis_latency(started.elapsed());
                self.note(self.breaker.success());
            }
            Err(e) => {
                self.metrics.redis_error(e.kind());
                let transition = if e.is_transient() {
                    self.breaker.failure(started, Instant::now())
                } else if let LimiterError::Late { .. } = e {
                    // Says nothing about Redis, either way: the breaker hears nothing of it.
                    if let Some(more) = self.errors.note(e.kind().as_str(), Instant::now()) {
                        log::warn!(
                            "a decision ran out of time while the proxy itself ran late (a busy or \
                             starved process), not counted against Redis: {e}{}",
                            since(more, "10 s")
                        );
                    }
                    None
                } else {
                    if let Some(more) = self.errors.note(e.kind().as_str(), Instant::now()) {
                        log::warn!(
                            "redis: a decision failed ({}): {e}{}",
                            e.kind(),
                            since(more, "10 s")
                        );
                    }
                    self.breaker.success()
                };
                self.note(transition);
            }
        }
        result
    }

    async fn ping(&self) -> Result<(), LimiterError> {
        let ping = redis::cmd("PING");
        match tokio::time::timeout(self.timeout, self.caller.topology.query(&ping)).await {
            Ok(answer) => answer.map(drop).map_err(classify),
            Err(_) => Err(LimiterError::Timeout(self.timeout)),
        }
    }

    async fn release(&self, leases: &[Bucket<'_>]) -> Result<(), LimiterError> {
        self.release_leases(leases).await
    }

    async fn renew(&self, leases: &[Bucket<'_>]) -> Result<(), LimiterError> {
        self.renew_leases(leases).await
    }

    async fn charge(
        &self,
        buckets: &[Bucket<'_>],
        amounts: &[i64],
    ) -> Result<Decision, LimiterError> {
        self.charge_buckets(buckets, amounts).await
    }

    async fn inspect(&self, key: &str) -> Result<Inspected, LimiterError> {
        self.inspect_bucket(key).await
    }

    async fn reset(&self, key: &str) -> Result<bool, LimiterError> {
        self.reset_bucket(key).await
    }
}

fn classify(e: RedisError) -> LimiterError {
    if e.is_timeout() {
        // The client's own timeout is the budget; `check` puts the real figure in.
        LimiterError::Timeout(Duration::ZERO)
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || e.is_cluster_error()
    {
        LimiterError::Connection(e.to_string())
    } else if e.code() == Some("OOM") {
        LimiterError::OutOfMemory(e.to_string())
    } else if matches!(
        e.kind(),
        redis::ErrorKind::Server(_)
            | redis::ErrorKind::Extension
            | redis::ErrorKind::UnexpectedReturnType
            | redis::ErrorKind::Parse
    ) {
        LimiterError::Script(e.to_string())
    } else {
        LimiterError::Other(e.to_string())
    }
}

/// A limit's entry in the script's table: capacity, scale, its refill (units per µs, a quota's
/// period, or a concurrency limit's lease), and `cost` (a charge's amount, negative to refund).
fn limit_args(cmd: &mut Cmd, p: &BucketParams, cost: i64) {
    cmd.arg(p.capacity).arg(p.scale);
    match p.kind {
        Kind::Bucket => cmd.arg(p.num),
        Kind::Quota(period) => cmd.arg(period.as_str()),
        Kind::Leases { ms, id } => cmd.arg(format!("lease:{ms}:{id}")),
    };
    cmd.arg(cost);
}

/// The script's reply in full: `now`, then for each request (`limits` gives how many limits each
/// has) `allowed` and `held, lag_us, bad` per limit. A call whose requests were all the usual one
/// is answered compactly, one integer per request (see the script's header): that is expanded
/// here, so that everything after reads one shape.
pub fn full_reply(
    reply: Vec<i64>,
    limits: impl Iterator<Item = usize> + Clone,
) -> Result<Vec<i64>, LimiterError> {
    let requests = limits.clone().count();
    let expected = 1 + limits.clone().map(|n| 1 + 3 * n).sum::<usize>();
    if reply.len() == expected {
        return Ok(reply);
    }
    if reply.len() != 1 + requests || limits.clone().any(|n| n != 1) {
        return Err(LimiterError::Script(format!(
            "a reply of {} integers for {requests} requests that need {expected}",
            reply.len(),
        )));
    }
    let mut full = Vec::with_capacity(expected);
    full.push(reply[0]);
    for &x in &reply[1..] {
        let (allowed, held) = if x >= 0 { (1, x) } else { (0, -(x + 1)) };
        full.extend_from_slice(&[allowed, held, 0, 0]);
    }
    Ok(full)
}

/// A decision from one request's part of the script's reply `{allowed, then held, lag_us, bad
/// per limit}` (see its header), decided at `now`: what clients see is derived with the in-memory
/// store's own arithmetic. Also returns the buckets whose key held something else and was
/// rewritten.
pub fn parse_reply(
    reply: &[i64],
    now: u64,
    buckets: &[Bucket<'_>],
) -> Result<(Decision, Vec<usize>), LimiterError> {
    if reply.len() != 1 + 3 * buckets.len() || reply.iter().any(|n| *n < 0) {
        return Err(LimiterError::Script(format!(
            "unexpected reply {reply:?} for {} limits",
            buckets.len()
        )));
    }
    let allowed = reply[0] == 1;
    let mut bad = Vec::new();
    let limits = reply[1..]
        .chunks_exact(3)
        .zip(buckets)
        .enumerate()
        .map(|(i, (c, b))| {
            if c[2] == 1 {
                bad.push(i);
            }
            let p = &b.params;
            let state = State {
                v: c[0] as u64,
                t: now + c[1] as u64,
                scale: p.unit(),
            };
            report(now, p, &state, allowed || state.v >= p.cost * p.scale)
        })
        .collect();
    Ok((Decision { allowed, limits }, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: super::super::BucketParams = super::super::BucketParams {
        capacity: 10,
        scale: 1_000_000,
        num: 1,
        cost: 5,
        kind: Kind::Bucket,
    };

    #[test]
    fn parses_the_reply_the_script_documents() {
        let buckets = [
            Bucket {
                key: "a",
                params: P,
            },
            Bucket {
                key: "b",
                params: P,
            },
        ];
        // Denied: the first bucket had 7 tokens, the second 3 and its clock was 2 µs behind
        // (it refills from 2 µs on: every wait is 2 µs longer).
        let (d, bad) = parse_reply(&[0, 7_000_000, 0, 0, 3_000_000, 2, 1], 0, &buckets).unwrap();
        assert!(!d.allowed);
        assert_eq!(bad, [1]);
        let b = d.limits[1];
        assert!(!b.ok);
        assert_eq!(
            (b.remaining, b.reset_us, b.wait_us, b.held, b.lag_us),
            (3, 7_000_002, 2_000_002, 3_000_000, 2)
        );
        assert!(d.limits[0].ok);
    }

    #[test]
    fn a_compact_reply_is_expanded_and_one_of_another_length_refused() {
        // Admitted holding 5 units; refused holding 2.
        assert_eq!(
            full_reply(vec![9, 5, -3], [1, 1].into_iter()).unwrap(),
            [9, 1, 5, 0, 0, 0, 2, 0, 0]
        );
        assert_eq!(
            full_reply(vec![9, 1, 5, 0, 0], [1].into_iter()).unwrap(),
            [9, 1, 5, 0, 0]
        );
        // The compact form is only ever sent for requests of one limit.
        assert!(full_reply(vec![9, 5, 3], [1, 2].into_iter()).is_err());
        assert!(full_reply(vec![9, 5, 3, 1], [1, 1].into_iter()).is_err());
    }

    #[test]
    fn rejects_a_reply_of_the_wrong_shape() {
        let one = [Bucket {
            key: "a",
            params: P,
        }];
        assert!(matches!(
            parse_reply(&[1, 1, 5], 0, &one),
            Err(LimiterError::Script(_))
        ));
        assert!(matches!(
            parse_reply(&[1, 1, -5, 0], 0, &one),
            Err(LimiterError::Script(_))
        ));
    }
}
