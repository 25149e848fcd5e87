//! Usage charged after a response (`charge_from_response`): one call of the script in its charge
//! mode, on its own rather than in a batch (it is off the decision's path, and rare beside
//! decisions), within the decision budget.

use super::{full_reply, limit_args, parse_reply, RedisLimiter, TOKEN_BUCKET_LUA};
use crate::limiter::{Bucket, Decision, LimiterError};

impl RedisLimiter {
    /// `Limiter::charge`: `amounts[i]` whole tokens taken from `buckets[i]` (negative: given
    /// back), whatever it holds.
    pub(super) async fn charge_buckets(
        &self,
        buckets: &[Bucket<'_>],
        amounts: &[i64],
    ) -> Result<Decision, LimiterError> {
        // The breaker knows Redis is down: the up-front cost stands, without waiting.
        if !self.metrics.redis_up() {
            return Err(LimiterError::Unavailable);
        }
        let caller = &self.caller;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(caller.script.get_hash()).arg(buckets.len());
        for b in buckets {
            cmd.arg(b.key);
        }
        match &caller.clock {
            Some(clock) => cmd.arg(clock.now_us()),
            None => cmd.arg(""),
        };
        cmd.arg(caller.format.as_str()).arg(buckets.len());
        for (b, &amount) in buckets.iter().zip(amounts) {
            limit_args(&mut cmd, &b.params, amount);
        }
        // One request, its limits 1..=n, in charge mode (a negative count).
        cmd.arg(-(buckets.len() as i64));
        for i in 1..=buckets.len() {
            cmd.arg(i);
        }
        let reply = self.admin_query(&cmd, Some(TOKEN_BUCKET_LUA)).await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                self.metrics.redis_error(e.kind());
                return Err(e);
            }
        };
        let reply: Vec<i64> =
            redis::from_redis_value(reply).map_err(|e| LimiterError::Script(e.to_string()))?;
        let reply = full_reply(reply, std::iter::once(buckets.len()))?;
        let (&now, rest) = reply
            .split_first()
            .ok_or_else(|| LimiterError::Script("an empty reply".into()))?;
        let (decision, bad) = parse_reply(rest, now as u64, buckets)?;
        for i in bad {
            self.bad_state(buckets[i].key);
        }
        Ok(decision)
    }
}
