//! One Redis server (or a primary behind a fixed address): a connection per worker thread.
//!
//! One connection shared by the whole process has its driver task on one thread, so most
//! decisions cross threads twice (request → driver → request), and each crossing is a wake-up
//! through the kernel. With a connection per thread (Pingora's runtimes run one thread each, see
//! `server`), a decision's round trip stays on the thread that asked. Over plain TCP or a Unix
//! socket the thread's batch driver reads and writes that connection itself (`wire`); over TLS a
//! redis-rs connection manager carries the calls.

use super::wire::{self, Wire};
use super::{manager_config, Security, Topology};
use crate::limiter::LimiterError;
use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{Cmd, ConnectionInfo, IntoConnectionInfo, RedisError, Value};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Tells apart the limiters of one process (tests make several), for the per-thread table.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Idle connections a thread keeps per limiter: the batch driver needs one; a health check that
/// overlaps a call takes a second.
const IDLE_PER_THREAD: usize = 2;

/// A thread's connections to one server.
enum Local {
    Idle(Vec<Wire>),
    Manager(ConnectionManager),
}

thread_local! {
    /// This thread's connections of each standalone limiter, made on first use here.
    static CONNECTIONS: RefCell<Vec<(u64, Local)>> = const { RefCell::new(Vec::new()) };
}

/// How this server is reached.
enum Way {
    /// Plain TCP or a Unix socket: our own connections.
    Wire(ConnectionInfo),
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
                Way::Wire(info.clone())
            } else {
                Way::Library(client)
            },
            timeout,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// `with` this thread's entry; `None` when it has none yet.
    fn local<T>(&self, with: impl FnOnce(&mut Local) -> T) -> Option<T> {
        CONNECTIONS.with_borrow_mut(|table| {
            let (_, local) = table.iter_mut().find(|(id, _)| *id == self.id)?;
            Some(with(local))
        })
    }

    fn add_local(&self, local: Local) {
        CONNECTIONS.with_borrow_mut(|table| table.push((self.id, local)));
    }

    fn idle(&self) -> Option<Wire> {
        self.local(|local| match local {
            Local::Idle(idle) => idle.pop(),
            Local::Manager(_) => None,
        })
        .flatten()
    }

    fn put_back(&self, wire: Wire) {
        CONNECTIONS.with_borrow_mut(
            |table| match table.iter_mut().find(|(id, _)| *id == self.id) {
                Some((_, Local::Idle(idle))) if idle.len() < IDLE_PER_THREAD => idle.push(wire),
                Some(_) => {}
                None => table.push((self.id, Local::Idle(vec![wire]))),
            },
        )
    }

    /// On this thread's idle connection, or a new one. A connection that failed is dropped; one
    /// that was idle may have been closed by a restarted server meanwhile, so that failure gets
    /// one retry on a new connection (the command may have run: a retried decision can only
    /// take tokens twice, never admit more).
    async fn by_wire(&self, info: &ConnectionInfo, cmd: &Cmd) -> Result<Value, RedisError> {
        let (mut wire, reused) = match self.idle() {
            Some(wire) => (wire, true),
            None => (Wire::connect(info).await?, false),
        };
        let mut result = wire.exchange(cmd).await;
        if reused && matches!(&result, Err(e) if !wire::usable_after(e)) {
            wire = Wire::connect(info).await?;
            result = wire.exchange(cmd).await;
        }
        match &result {
            Err(e) if !wire::usable_after(e) => {}
            _ => self.put_back(wire),
        }
        result
    }

    /// This thread's connection manager, made on first use here (inside the runtime that
    /// serves, so its driver task runs on this thread).
    fn manager(&self, client: &redis::Client) -> Result<ConnectionManager, RedisError> {
        let found = self.local(|local| match local {
            Local::Manager(conn) => Some(conn.clone()),
            Local::Idle(_) => None,
        });
        if let Some(Some(conn)) = found {
            return Ok(conn);
        }
        let conn =
            ConnectionManager::new_lazy_with_config(client.clone(), manager_config(self.timeout))?;
        self.add_local(Local::Manager(conn.clone()));
        Ok(conn)
    }
}

#[async_trait]
impl Topology for Standalone {
    async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let client = match &self.way {
            Way::Wire(info) => return self.by_wire(info, cmd).await,
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
