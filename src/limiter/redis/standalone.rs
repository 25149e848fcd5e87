//! One Redis server (or a primary behind a fixed address): a connection per worker thread.
//!
//! One connection shared by the whole process has its driver task on one thread, so most
//! decisions cross threads twice (request → driver → request), and each crossing is a wake-up
//! through the kernel. With a connection per thread (Pingora's runtimes run one thread each, see
//! `server`), a decision's round trip stays on the thread that asked. Over plain TCP or a Unix
//! socket the thread's batch driver reads and writes that connection itself (`wire`); over TLS a
//! redis-rs connection manager carries the calls.

use super::wire::{Pool, Wire};
use super::{manager_config, Security, Topology};
use crate::limiter::LimiterError;
use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{Cmd, IntoConnectionInfo, RedisError, Value};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Tells apart the limiters of one process (tests make several), for the per-thread table.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's connection manager of each standalone limiter over TLS, made on first use.
    static MANAGERS: RefCell<Vec<(u64, ConnectionManager)>> = const { RefCell::new(Vec::new()) };
}

/// How this server is reached.
enum Way {
    /// Plain TCP or a Unix socket: our own connections.
    Wire(Pool),
    /// TLS: redis-rs's.
    Library(redis::Client),
}

pub struct Standalone {
    way: Way,
    timeout: Duration,
    id: u64,
}

impl Standalone {
    /// The server at `url`. Connects nothing yet.
    pub fn new(url: &str, security: &Security, timeout: Duration) -> Result<Self, LimiterError> {
        let info = url.into_connection_info().map_err(super::misconfigured)?;
        let client = security.client(info).map_err(super::misconfigured)?;
        let info = client.get_connection_info();
        Ok(Standalone {
            way: if Wire::reaches(info) {
                Way::Wire(Pool::new(info.clone()))
            } else {
                Way::Library(client)
            },
            timeout,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// This thread's connection manager, made on first use here (inside the runtime that
    /// serves, so its driver task runs on this thread).
    fn manager(&self, client: &redis::Client) -> Result<ConnectionManager, RedisError> {
        let found = MANAGERS.with_borrow(|table| {
            table
                .iter()
                .find(|(id, _)| *id == self.id)
                .map(|(_, conn)| conn.clone())
        });
        if let Some(conn) = found {
            return Ok(conn);
        }
        let conn =
            ConnectionManager::new_lazy_with_config(client.clone(), manager_config(self.timeout))?;
        MANAGERS.with_borrow_mut(|table| table.push((self.id, conn.clone())));
        Ok(conn)
    }
}

#[async_trait]
impl Topology for Standalone {
    async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let client = match &self.way {
            Way::Wire(pool) => return pool.query(cmd).await,
            Way::Library(client) => client,
        };
        let mut conn = self.manager(client)?;
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
