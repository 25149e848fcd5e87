//! Redis Cluster: the client follows MOVED/ASK and failovers itself, and loads the script on every
//! primary when one answers NOSCRIPT.

use super::{tcp_settings, Security, Topology};
use crate::limiter::LimiterError;
use async_trait::async_trait;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, RedisError, Value};
use std::time::Duration;
use tokio::sync::OnceCell;

pub struct Cluster {
    client: ClusterClient,
    /// One multiplexed connection per node, behind one handle.
    conn: OnceCell<ClusterConnection>,
}

impl Cluster {
    /// The cluster, from any of these seed nodes. Connects nothing yet.
    pub fn new(
        nodes: &[String],
        security: &Security,
        timeout: Duration,
    ) -> Result<Self, LimiterError> {
        let nodes = nodes
            .iter()
            .map(|n| {
                let info = n
                    .as_str()
                    .into_connection_info()
                    .map_err(super::misconfigured)?;
                Ok(security.apply(info))
            })
            .collect::<Result<Vec<_>, LimiterError>>()?;
        // The cluster client has no response timeout unless it is given one.
        let mut builder = ClusterClient::builder(nodes)
            .tcp_settings(tcp_settings())
            .connection_timeout(timeout)
            .response_timeout(timeout);
        if let Some(certs) = security.certificates() {
            builder = builder.certs(certs);
        }
        Ok(Cluster {
            client: builder.build().map_err(super::misconfigured)?,
            conn: OnceCell::new(),
        })
    }

    async fn connection(&self) -> Result<ClusterConnection, RedisError> {
        let conn = self
            .conn
            .get_or_try_init(|| self.client.get_async_connection())
            .await?;
        Ok(conn.clone())
    }
}

#[async_trait]
impl Topology for Cluster {
    async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        cmd.query_async(&mut self.connection().await?).await
    }

    /// Keys of many slots: a call carries one request's buckets (one hash tag) only.
    fn one_server(&self) -> bool {
        false
    }
}
