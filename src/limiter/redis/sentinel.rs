//! The primary that a set of sentinels names: its address changes at failover, so it is asked of
//! the sentinels again whenever the current one stops answering or has become a read-only
//! replica.

use super::{manager_config, Security, Topology};
use crate::limiter::LimiterError;
use arc_swap::ArcSwapOption;
use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, IntoConnectionInfo, RedisError, TlsMode, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

pub struct Sentinel {
    sentinels: Mutex<SentinelClient>,
    /// The primary gets the password and, with a CA, TLS; the sentinels are reached as their URLs
    /// say.
    security: Security,
    timeout: Duration,
    primary: ArcSwapOption<ConnectionManager>,
}

impl Sentinel {
    /// The primary these sentinels call `master`. Connects nothing yet.
    pub fn new(
        master: &str,
        nodes: &[String],
        security: Security,
        timeout: Duration,
    ) -> Result<Self, LimiterError> {
        let nodes = nodes
            .iter()
            .map(|n| n.as_str().into_connection_info())
            .collect::<Result<Vec<_>, _>>()
            .map_err(super::misconfigured)?;
        let node_info = security
            .ca_pem
            .is_some()
            .then(|| SentinelNodeConnectionInfo::default().set_tls_mode(TlsMode::Secure));
        let sentinels = SentinelClient::build(nodes, master, node_info, SentinelServerType::Master)
            .map_err(super::misconfigured)?;
        Ok(Sentinel {
            sentinels: Mutex::new(sentinels),
            security,
            timeout,
            primary: ArcSwapOption::empty(),
        })
    }

    /// The current primary's connection, asking the sentinels when there is none.
    async fn primary(&self) -> Result<Arc<ConnectionManager>, RedisError> {
        if let Some(c) = self.primary.load_full() {
            return Ok(c);
        }
        let mut sentinels = self.sentinels.lock().await;
        // Another decision may have found the primary while this one waited for the lock.
        if let Some(c) = self.primary.load_full() {
            return Ok(c);
        }
        let found = sentinels.async_get_client().await?;
        let client = self.security.client(found.get_connection_info().clone())?;
        log::info!(
            "sentinel: primary is {}",
            client.get_connection_info().addr()
        );
        let manager = Arc::new(ConnectionManager::new_lazy_with_config(
            client,
            manager_config(self.timeout),
        )?);
        self.primary.store(Some(manager.clone()));
        Ok(manager)
    }

    /// Drops `failed` as the primary, unless another decision replaced it already.
    fn forget(&self, failed: &Arc<ConnectionManager>) {
        self.primary.rcu(|current| match current {
            Some(c) if Arc::ptr_eq(c, failed) => None,
            other => other.clone(),
        });
    }
}

/// The errors after which the sentinels must be asked for the primary again.
fn moved_primary(e: &RedisError) -> bool {
    e.is_unrecoverable_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
}

#[async_trait]
impl Topology for Sentinel {
    async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let primary = self.primary().await?;
        match cmd.query_async(&mut (*primary).clone()).await {
            // Failed over: the old primary is gone or now a read-only replica.
            Err(e) if moved_primary(&e) => {
                self.forget(&primary);
                let mut conn = (*self.primary().await?).clone();
                cmd.query_async(&mut conn).await
            }
            other => other,
        }
    }
}
