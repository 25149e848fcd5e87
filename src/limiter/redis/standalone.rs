//! One Redis server (or a primary behind a fixed address): one multiplexed connection that
//! reconnects by itself.

use super::{manager_config, Security, Topology};
use crate::limiter::LimiterError;
use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{IntoConnectionInfo, RedisError, ScriptInvocation};
use std::time::Duration;
use tokio::sync::OnceCell;

pub struct Standalone {
    client: redis::Client,
    timeout: Duration,
    conn: OnceCell<ConnectionManager>,
}

impl Standalone {
    /// The server at `url`. Connects nothing yet.
    pub fn new(url: &str, security: &Security, timeout: Duration) -> Result<Self, LimiterError> {
        let info = url.into_connection_info().map_err(super::misconfigured)?;
        Ok(Standalone {
            client: security.client(info).map_err(super::misconfigured)?,
            timeout,
            conn: OnceCell::new(),
        })
    }

    /// The one connection, made on first use.
    async fn connection(&self) -> Result<ConnectionManager, RedisError> {
        let manager = self
            .conn
            .get_or_try_init(|| async {
                ConnectionManager::new_lazy_with_config(
                    self.client.clone(),
                    manager_config(self.timeout),
                )
            })
            .await?;
        Ok(manager.clone())
    }
}

#[async_trait]
impl Topology for Standalone {
    async fn invoke(&self, script: &ScriptInvocation<'_>) -> Result<Vec<i64>, RedisError> {
        let mut conn = self.connection().await?;
        match script.invoke_async(&mut conn).await {
            // The manager replaces a dropped connection on this error; the retry waits for the
            // new one (Redis restarted) instead of failing a request that can succeed.
            Err(e) if e.is_unrecoverable_error() || e.is_connection_dropped() => {
                script.invoke_async(&mut conn).await
            }
            other => other,
        }
    }

    async fn ping(&self) -> Result<(), RedisError> {
        redis::cmd("PING")
            .query_async(&mut self.connection().await?)
            .await
    }
}
