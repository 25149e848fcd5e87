//! The primary that a set of sentinels names: its address changes at failover, so it is asked of
//! the sentinels again whenever the current one stops answering or has become a read-only
//! replica. The sentinels are asked through redis-rs; the primary is reached as a standalone
//! server is (`standalone`): each thread's own connection, or over TLS a redis-rs manager.

use super::wire::{Pool, Wire};
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
    primary: ArcSwapOption<Primary>,
}

/// How the current primary is reached.
enum Primary {
    /// Plain TCP: each thread's own connection.
    Wire(Box<Pool>),
    /// TLS: a redis-rs connection manager.
    Manager(ConnectionManager),
}

impl Primary {
    async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Primary::Wire(pool) => pool.query(cmd).await,
            Primary::Manager(manager) => cmd.query_async(&mut manager.clone()).await,
        }
    }
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

    /// The current primary, asking the sentinels when there is none.
    async fn primary(&self) -> Result<Arc<Primary>, RedisError> {
        if let Some(p) = self.primary.load_full() {
            return Ok(p);
        }
        let mut sentinels = self.sentinels.lock().await;
        // Another decision may have found the primary while this one waited for the lock.
        if let Some(p) = self.primary.load_full() {
            return Ok(p);
        }
        let found = sentinels.async_get_client().await?;
        let client = self.security.client(found.get_connection_info().clone())?;
        let info = client.get_connection_info();
        log::info!("sentinel: primary is {}", info.addr());
        let primary = Arc::new(if Wire::reaches(info) {
            Primary::Wire(Box::new(Pool::new(info.clone())))
        } else {
            Primary::Manager(ConnectionManager::new_lazy_with_config(
                client,
                manager_config(self.timeout),
            )?)
        });
        self.primary.store(Some(primary.clone()));
        Ok(primary)
    }

    /// Drops `failed` as the primary, unless another decision replaced it already. Once no
    /// decision holds it, each thread closes its connections to it at its next call.
    fn forget(&self, failed: &Arc<Primary>) {
        self.primary.rcu(|current| match current {
            Some(p) if Arc::ptr_eq(p, failed) => None,
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
        match primary.query(cmd).await {
            // Failed over: the old primary is gone or now a read-only replica.
            Err(e) if moved_primary(&e) => {
                self.forget(&primary);
                self.primary().await?.query(cmd).await
            }
            other => other,
        }
    }
}
