//! Ends concurrency leases: one `ZREM` per lease, off the decision's path (the logging phase).
//! A release that fails costs nothing lasting: the lease expires after its `lease_ms` anyway.

use super::{classify, RedisLimiter};
use crate::limiter::{Bucket, Kind, LimiterError};

impl RedisLimiter {
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
