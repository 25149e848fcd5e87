//! Concurrency leases after the decision: renewed while a long request is in flight
//! (`lua/renew.lua`), ended by one `ZREM` each when it is over (the logging phase). Neither is on
//! the decision's path, and one that fails costs nothing lasting: a lease expires by itself.

use super::{classify, RedisLimiter, RENEW_LUA};
use crate::limiter::{Bucket, Kind, LimiterError};

impl RedisLimiter {
    /// `Limiter::renew`: each lease still held expires `lease_ms` from now.
    pub(super) async fn renew_leases(&self, leases: &[Bucket<'_>]) -> Result<(), LimiterError> {
        if !self.metrics.redis_up() {
            return Err(LimiterError::Unavailable);
        }
        let sha = redis::Script::new(RENEW_LUA).get_hash().to_string();
        let mut failed = Ok(());
        for b in leases {
            let Kind::Leases { ms, id } = b.params.kind else {
                continue;
            };
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&sha).arg(1).arg(b.key);
            match &self.caller.clock {
                Some(clock) => cmd.arg(clock.now_us()),
                None => cmd.arg(""),
            };
            cmd.arg(ms).arg(id);
            if let Err(e) = self.admin_query(&cmd, Some(RENEW_LUA)).await {
                self.metrics.redis_error(e.kind());
                failed = Err(e);
            }
        }
        failed
    }

    /// `Limiter::release`: each lease removed from its key's sorted set.
    pub(super) async fn release_leases(&self, leases: &[Bucket<'_>]) -> Result<(), LimiterError> {
        // The breaker knows Redis is down: nothing to wait for, the leases expire.
        if !self.metrics.redis_up() {
            return Err(LimiterError::Unavailable);
        }
        let mut failed = Ok(());
        for b in leases {
            let Kind::Leases { id, .. } = b.params.kind else {
                continue;
            };
            let mut zrem = redis::cmd("ZREM");
            zrem.arg(b.key).arg(id);
            let sent = tokio::time::timeout(self.timeout, self.caller.topology.query(&zrem));
            let result = match sent.await {
                Ok(answer) => answer.map(drop).map_err(classify),
                Err(_) => Err(LimiterError::Timeout(self.timeout)),
            };
            // Each lease is tried: one that fails still expires by itself.
            if let Err(e) = result {
                self.metrics.redis_error(e.kind());
                failed = Err(e);
            }
        }
        failed
    }
}
