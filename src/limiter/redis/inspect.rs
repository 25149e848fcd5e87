//! The admin API's reads and resets of single buckets: rare, never on the request path, and
//! outside the batches (each is its own command, within the decision budget or a second).

use super::{classify, query_loading, RedisLimiter, PEEK_LUA};
use crate::limiter::bucket::State;
use crate::limiter::{Inspected, LimiterError};
use redis::{Cmd, Script, Value};
use std::time::Duration;

impl RedisLimiter {
    /// `Limiter::inspect`: `lua/peek.lua`, by SHA.
    pub(super) async fn inspect_bucket(&self, key: &str) -> Result<Inspected, LimiterError> {
        let script = Script::new(PEEK_LUA);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(1).arg(key);
        match &self.caller.clock {
            Some(clock) => cmd.arg(clock.now_us()),
            None => cmd.arg(""),
        };
        let reply = self.admin_query(&cmd, Some(PEEK_LUA)).await?;
        let fields: Vec<String> =
            redis::from_redis_value(reply).map_err(|e| LimiterError::Script(e.to_string()))?;
        let number = |i: usize| -> Result<i64, LimiterError> {
            fields
                .get(i)
                .and_then(|f| f.parse().ok())
                .ok_or_else(|| LimiterError::Script(format!("peek.lua replied {fields:?}")))
        };
        let whole = |i: usize| number(i).map(|n| u64::try_from(n).unwrap_or(0));
        let found = number(0)?;
        let state = (found == 1)
            .then(|| -> Result<State, LimiterError> {
                Ok(State {
                    v: whole(1)?,
                    t: whole(2)?,
                    scale: whole(3)?,
                })
            })
            .transpose()?;
        let pttl = number(4)?;
        Ok(Inspected {
            state,
            now_us: whole(5)?,
            ttl_ms: u64::try_from(pttl).ok(),
            leases: if found == 2 { Some(whole(1)?) } else { None },
        })
    }

    /// `Limiter::reset`: the key deleted, in whichever format it was.
    pub(super) async fn reset_bucket(&self, key: &str) -> Result<bool, LimiterError> {
        let mut del = redis::cmd("DEL");
        del.arg(key);
        let reply = self.admin_query(&del, None).await?;
        let removed: i64 =
            redis::from_redis_value(reply).map_err(|e| LimiterError::Script(e.to_string()))?;
        Ok(removed > 0)
    }

    /// One command of the admin API within the budget, loading `script` where the server does
    /// not know it.
    pub(super) async fn admin_query(
        &self,
        cmd: &Cmd,
        script: Option<&str>,
    ) -> Result<Value, LimiterError> {
        let topology = self.caller.topology.as_ref();
        let attempt = async {
            match script {
                Some(script) => query_loading(topology, cmd, script).await,
                None => topology.query(cmd).await,
            }
        };
        match tokio::time::timeout(self.timeout.max(Duration::from_secs(1)), attempt).await {
            Ok(answer) => answer.map_err(classify),
            Err(_) => Err(LimiterError::Timeout(self.timeout)),
        }
    }
}
