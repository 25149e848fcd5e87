//! Listening sockets bound before Pingora starts, so that a taken port stops the start, and one
//! socket per worker thread, so that each thread accepts, forwards and pools on its own.
//!
//! Pingora binds inside a service's runtime: on a taken port it retries for 30 s, then panics in
//! that service's thread while the rest of the process, `/healthz` included, runs on as if it were
//! serving. So every address is bound here first, and a failure is one line and exit code 1. The
//! sockets are then handed to Pingora through the table it keeps for zero-downtime upgrades (the
//! same one that carries them to the next instance on SIGQUIT). An instance started with
//! `--upgrade` takes the running one's sockets from that table.
//!
//! The proxy runs a single-threaded service per worker thread (`server`), each with its own
//! `SO_REUSEPORT` socket on every address: the kernel spreads connections over them, and a
//! connection, its upstream connections and their pool stay on one thread, as with nginx's
//! `reuseport` or Envoy's listeners. A port that anything else holds, another instance's
//! `SO_REUSEPORT` group included, is found by a plain bind first and refused.

use async_trait::async_trait;
use parking_lot::Mutex;
use pingora::server::{Fds, ListenFds, ShutdownWatch};
use pingora::services::Service;
use socket2::{Domain, Socket, Type};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{IntoRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex as StdMutex};

#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} ({what})")]
pub struct BindError {
    addr: SocketAddr,
    what: &'static str,
    #[source]
    source: std::io::Error,
}

/// A socket bound and listening, under its key in Pingora's socket table.
#[derive(Debug)]
pub struct Bound {
    key: String,
    fd: OwnedFd,
}

/// Worker `worker`'s socket on `addr` in Pingora's table: the address itself for the first (so a
/// table a single-socket instance handed over still fits), `addr#N` for the others.
fn key(addr: &str, worker: usize) -> String {
    match worker {
        0 => addr.to_string(),
        n => format!("{addr}#{n}"),
    }
}

/// Binds `addr` now, one socket per worker; `what` names it in the error ("proxy", "admin").
pub fn bind(addr: SocketAddr, what: &'static str, workers: usize) -> Result<Vec<Bound>, BindError> {
    let fail = |source| BindError { addr, what, source };
    // A plain bind fails on any listener of the port, another instance's `SO_REUSEPORT` sockets
    // included, which the sockets below would otherwise join.
    let plain = TcpListener::bind(addr).map_err(fail)?;
    if workers <= 1 {
        return Ok(vec![listening(addr, plain.into()).map_err(fail)?]);
    }
    // Port 0 is the one the kernel chose.
    let port = plain.local_addr().map_err(fail)?;
    drop(plain);
    (0..workers)
        .map(|worker| {
            let socket = Socket::new(Domain::for_address(port), Type::STREAM, None)?;
            socket.set_reuse_address(true)?;
            socket.set_reuse_port(true)?;
            socket.bind(&port.into())?;
            // Linux caps it at net.core.somaxconn; what std's bind asks for.
            socket.listen(1024)?;
            let mut bound = listening(addr, socket.into())?;
            bound.key = key(&bound.key, worker);
            Ok(bound)
        })
        .collect::<std::io::Result<_>>()
        .map_err(fail)
}

fn listening(addr: SocketAddr, fd: OwnedFd) -> std::io::Result<Bound> {
    let listener = TcpListener::from(fd);
    // Pingora's runtime accepts on it: a blocking socket would stall a worker thread.
    listener.set_nonblocking(true)?;
    Ok(Bound {
        key: addr.to_string(),
        fd: listener.into(),
    })
}

/// The sockets bound before the start, for every worker's service to put into Pingora's table.
pub type Fresh = Arc<StdMutex<Vec<Bound>>>;

/// One worker's listening service, on the sockets bound before the server started (or inherited
/// in an upgrade).
pub struct PreBound<S> {
    inner: S,
    worker: usize,
    /// Every address the service listens on, as given to its `add_tcp`.
    addrs: Vec<String>,
    fresh: Fresh,
}

impl<S> PreBound<S> {
    pub fn new(inner: S, worker: usize, addrs: Vec<String>, fresh: Fresh) -> PreBound<S> {
        PreBound {
            inner,
            worker,
            addrs,
            fresh,
        }
    }

    /// This worker's own table: for each address, its socket, or a copy of the first worker's when
    /// the running instance handed over fewer sockets than this one has workers (an instance
    /// from before one socket per worker, or one on fewer CPUs).
    fn table(&self, fds: &ListenFds) -> ListenFds {
        let mut table = fds.lock();
        for bound in self
            .fresh
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            // A socket inherited in an upgrade would be the same address: it wins.
            if table.get(&bound.key).is_none() {
                table.add(bound.key, bound.fd.into_raw_fd());
            }
        }
        let mut own = Fds::new();
        for addr in &self.addrs {
            if let Some(fd) = table.get(&key(addr, self.worker)) {
                // Pingora's listener owns it from here, as it would own a socket it bound.
                own.add(addr.clone(), *fd);
            } else if let Some(shared) = table.get(addr).and_then(|fd| duplicate(*fd)) {
                own.add(addr.clone(), shared);
            }
            // Neither: an address the running instance did not have; Pingora binds it, and if
            // it cannot, `server` stops the process.
        }
        Arc::new(Mutex::new(own))
    }
}

/// A second descriptor of a socket, for a second listener to own.
fn duplicate(fd: RawFd) -> Option<RawFd> {
    // SAFETY: `fd` is an open socket of the table, borrowed only for the copy.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    Some(borrowed.try_clone_to_owned().ok()?.into_raw_fd())
}

#[async_trait]
impl<S: Service> Service for PreBound<S> {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
    ) {
        let own = fds.as_ref().map(|fds| self.table(fds));
        self.inner
            .start_service(own, shutdown, listeners_per_fd)
            .await
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn threads(&self) -> Option<usize> {
        self.inner.threads()
    }

    /// The keys it takes from the table: an inherited socket nobody claims is closed at the
    /// start, so that no `SO_REUSEPORT` socket is left to take connections without an acceptor.
    fn listen_addresses(&self) -> Option<Vec<String>> {
        Some(
            self.addrs
                .iter()
                .flat_map(|addr| [addr.clone(), key(addr, self.worker)])
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd};

    fn error(addr: SocketAddr, workers: usize) -> String {
        format!(
            "{:#}",
            anyhow::Error::new(bind(addr, "proxy", workers).unwrap_err())
        )
    }

    #[test]
    fn a_taken_port_is_one_clear_error() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        for workers in [1, 2] {
            let err = error(addr, workers);
            assert!(
                err.starts_with(&format!("cannot listen on {addr} (proxy): ")),
                "{err}"
            );
            assert!(err.contains("in use"), "{err}");
        }
    }

    #[test]
    fn each_worker_gets_its_own_socket_on_one_port() {
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let bound = bind(addr, "proxy", 3).unwrap();
        let keys: Vec<&str> = bound.iter().map(|b| b.key.as_str()).collect();
        assert_eq!(keys, ["127.0.0.1:0", "127.0.0.1:0#1", "127.0.0.1:0#2"]);
        let ports: Vec<SocketAddr> = bound
            .iter()
            .map(|b| {
                TcpListener::from(b.fd.try_clone().unwrap())
                    .local_addr()
                    .unwrap()
            })
            .collect();
        assert_ne!(ports[0].port(), 0);
        assert!(ports.iter().all(|p| *p == ports[0]), "{ports:?}");
        assert!(bound.iter().all(|b| b.fd.as_raw_fd() >= 0));
        // Every socket accepts: a connection lands on one of them.
        std::net::TcpStream::connect(ports[0]).unwrap();
    }

    /// Another instance's sockets are `SO_REUSEPORT` too: a second start must not join them.
    #[test]
    fn a_port_held_by_another_instance_is_refused() {
        let running = bind("127.0.0.1:0".parse().unwrap(), "proxy", 2).unwrap();
        let addr = TcpListener::from(running[0].fd.try_clone().unwrap())
            .local_addr()
            .unwrap();
        assert!(error(addr, 2).contains("in use"));
        assert!(error(addr, 1).contains("in use"));
    }

    #[test]
    fn a_worker_without_a_socket_of_its_own_shares_the_first() {
        let first = bind("127.0.0.1:0".parse().unwrap(), "proxy", 1).unwrap();
        let fd = first[0].fd.as_raw_fd();
        // As an upgrade from an instance with one socket per address would leave the table.
        let inherited: ListenFds = Arc::new(Mutex::new(Fds::new()));
        inherited.lock().add("127.0.0.1:0".into(), fd);
        let second = PreBound::new((), 1, vec!["127.0.0.1:0".into()], Fresh::default());
        let own = second.table(&inherited);
        let copy = *own.lock().get("127.0.0.1:0").unwrap();
        assert_ne!(copy, fd);
        drop(unsafe { OwnedFd::from_raw_fd(copy) });
    }
}
