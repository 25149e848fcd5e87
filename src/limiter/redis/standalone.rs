//! One Redis server (or a primary behind a fixed address): a multiplexed connection per worker
//! thread, each reconnecting by itself.
//!
//! One connection shared by the whole process has its driver task on one thread, so most
//! decisions cross threads twice (request → driver → request), and each crossing is a wake-up
//! through the kernel. With a connection per thread (Pingora's runtimes run one thread each, see
//! `server`), a decision's round trip stays on the thread that asked.

use super::{manager_config, Security, Topology};
use crate::limiter::LimiterError;
use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{Cmd, IntoConnectionInfo, RedisError, Value};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Tells apart the limiters of one process (tests make several), for the per-thread table.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's connection of each standalone limiter, made on its first decision here.
    static CONNECTIONS: RefCell<HashMap<u64, ConnectionManager>> = RefCell::new(HashMap::new());
}

pub struct Standalone {
    client: redis::Client,
    timeout: Duration,
    id: u64,
}

impl Standalone {
    /// The server at `url`. Connects nothing yet.
    pub fn new(url: &str, security: &Security, timeout: Duration) -> Result<Self, LimiterError> {
        let info = url.into_connection_info().map_err(super::misconfigured)?;
        Ok(Standalone {
            client: security.client(info).map_err(super::misconfigured)?,
            timeout,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// This thread's connection, made on first use here (inside the runtime that serves, so its
    /// driver task runs on this thread).
    fn connection(&self) -> Result<ConnectionManager, RedisError> {
        CONNECTIONS.with(|table| {
            if let Some(conn) = table.borrow().get(&self.id) {
                return Ok(conn.clone());
            }
            let conn = ConnectionManager::new_lazy_with_config(
                self.client.clone(),
                manager_config(self.timeout),
            )?;
            table.borrow_mut().insert(self.id, conn.clone());
            Ok(conn)
        })
    }
}

#[async_trait]
impl Topology for Standalone {
    async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let mut conn = self.connection()?;
        match cmd.query_async(&mut conn).await {
            // The manager replaces a dropped connection on this error; the retry waits for the
            // new one (Redis restarted) instead of failing a request that can succeed.
            Err(e) if e.is_unrecoverable_error() || e.is_connection_dropped() => {
                cmd.query_async(&mut conn).await
            }
            other => other,
        }
    }
}
