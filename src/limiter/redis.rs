//! Buckets in Redis: one EVALSHA of `lua/token_bucket.lua` per decision.
//!
//! One multiplexed connection (redis-rs `ConnectionManager`) carries every concurrent decision: it
//! pipelines them on one socket, so there is no pool to size. The manager is created on first use,
//! inside the runtime that serves requests (a handle made before Pingora forks or starts its
//! runtimes would be bound to a dead one). Every call runs under one deadline, reconnects included:
//! the manager itself would wait for Redis forever.

use super::{Bucket, Decision, LimitState, Limiter, LimiterError};
use crate::clock::Clock;
use crate::metrics::Metrics;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script};
use std::time::Duration;
use tokio::sync::OnceCell;
use tokio::time::Instant;

/// The script, compiled into the binary so it always matches the code that parses its reply.
pub const TOKEN_BUCKET_LUA: &str = include_str!("../../lua/token_bucket.lua");

pub struct RedisLimiter {
    client: redis::Client,
    conn: OnceCell<ConnectionManager>,
    script: Script,
    timeout: Duration,
    /// `None`: the script reads Redis `TIME`.
    clock: Option<Box<dyn Clock>>,
    metrics: Metrics,
}

impl RedisLimiter {
    /// Validates the URL; connects nothing yet.
    pub fn new(
        url: &str,
        timeout: Duration,
        clock: Option<Box<dyn Clock>>,
        metrics: Metrics,
    ) -> Result<RedisLimiter, LimiterError> {
        let client =
            redis::Client::open(url).map_err(|e| LimiterError::Other(format!("redis url: {e}")))?;
        Ok(RedisLimiter {
            client,
            conn: OnceCell::new(),
            script: Script::new(TOKEN_BUCKET_LUA),
            timeout,
            clock,
            metrics,
        })
    }

    async fn connection(&self) -> Result<ConnectionManager, LimiterError> {
        let conn = self
            .conn
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout))
                    // Few, quick reconnect attempts: a refused connection then fails the decision
                    // fast instead of holding it for the whole budget, and the next decision
                    // starts a new attempt, so a Redis that comes back is found at once.
                    .set_min_delay(Duration::from_millis(5))
                    .set_max_delay(Duration::from_millis(50))
                    .set_number_of_retries(1);
                ConnectionManager::new_lazy_with_config(self.client.clone(), config)
            })
            .await
            .map_err(classify)?;
        Ok(conn.clone())
    }

    async fn eval(&self, buckets: &[Bucket<'_>]) -> Result<Decision, LimiterError> {
        let mut invocation = self.script.prepare_invoke();
        for b in buckets {
            invocation.key(b.key);
        }
        match &self.clock {
            Some(clock) => invocation.arg(clock.now_us()),
            None => invocation.arg(""),
        };
        for b in buckets {
            let p = b.params;
            invocation
                .arg(p.capacity)
                .arg(p.scale)
                .arg(p.num)
                .arg(p.cost);
        }
        let mut conn = self.connection().await?;
        let reply: Vec<i64> = match invocation.invoke_async(&mut conn).await {
            Ok(reply) => reply,
            // The manager replaces a dropped connection on this error; the retry waits for the
            // new one (Redis restarted, failed over) instead of failing a request that can succeed.
            Err(e) if e.is_unrecoverable_error() || e.is_connection_dropped() => {
                invocation.invoke_async(&mut conn).await.map_err(classify)?
            }
            Err(e) => return Err(classify(e)),
        };
        parse_reply(&reply, buckets.len())
    }
}

impl Limiter for RedisLimiter {
    async fn check(&self, buckets: &[Bucket<'_>]) -> Result<Decision, LimiterError> {
        let started = Instant::now();
        let result = match tokio::time::timeout(self.timeout, self.eval(buckets)).await {
            Ok(result) => result,
            Err(_) => Err(LimiterError::Timeout(self.timeout)),
        };
        match &result {
            Ok(_) => self.metrics.redis_latency(started.elapsed()),
            Err(e) => self.metrics.redis_error(e.kind()),
        }
        result
    }

    async fn ping(&self) -> Result<(), LimiterError> {
        let ping = async {
            let mut conn = self.connection().await?;
            redis::cmd("PING")
                .query_async::<()>(&mut conn)
                .await
                .map_err(classify)
        };
        tokio::time::timeout(self.timeout, ping)
            .await
            .unwrap_or(Err(LimiterError::Timeout(self.timeout)))
    }
}

fn classify(e: RedisError) -> LimiterError {
    if e.is_timeout() {
        LimiterError::Timeout(Duration::ZERO)
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
    {
        LimiterError::Connection(e.to_string())
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

/// `{allowed, then ok, remaining, reset_us, wait_us per limit}`, as the script's header says.
fn parse_reply(reply: &[i64], limits: usize) -> Result<Decision, LimiterError> {
    if reply.len() != 1 + 4 * limits || reply.iter().any(|n| *n < 0) {
        return Err(LimiterError::Script(format!(
            "unexpected reply {reply:?} for {limits} limits"
        )));
    }
    let limits = reply[1..]
        .chunks_exact(4)
        .map(|c| LimitState {
            ok: c[0] == 1,
            remaining: c[1] as u64,
            reset_us: c[2] as u64,
            wait_us: c[3] as u64,
        })
        .collect();
    Ok(Decision {
        allowed: reply[0] == 1,
        limits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_reply_the_script_documents() {
        let d = parse_reply(&[0, 1, 5, 100, 10, 0, 0, 2_000, 1_000], 2).unwrap();
        assert!(!d.allowed);
        assert_eq!(
            d.limits[1],
            LimitState {
                ok: false,
                remaining: 0,
                reset_us: 2_000,
                wait_us: 1_000
            }
        );
    }

    #[test]
    fn rejects_a_reply_of_the_wrong_shape() {
        assert!(matches!(
            parse_reply(&[1, 1, 5], 1),
            Err(LimiterError::Script(_))
        ));
        assert!(matches!(
            parse_reply(&[1, 1, -5, 0, 0], 1),
            Err(LimiterError::Script(_))
        ));
    }
}
