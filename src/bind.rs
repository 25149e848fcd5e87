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
use std::net::SocketAddr;
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

/// At most this many sockets pass from one instance to the next in an upgrade (Pingora's
/// `transfer_fd` receives 32; more would fail the new instance's start).
const HANDOVER_MAX: usize = 32;

/// Sockets per cleartext address: one per worker, as many as the upgrade hand-over carries
/// beside `others` (the TLS and admin listeners' one each). Workers beyond it share.
pub fn per_address(workers: usize, cleartext: usize, others: usize) -> usize {
    match cleartext {
        0 => 1,
        n => (HANDOVER_MAX.saturating_sub(others) / n).clamp(1, workers.max(1)),
    }
}

/// Binds `sockets` sockets on `addr` now; `what` names it in the error ("proxy", "admin").
pub fn bind(addr: SocketAddr, what: &'static str, sockets: usize) -> Result<Vec<Bound>, BindError> {
    let fail = |source| BindError { addr, what, source };
    // The first bind is plain: it fails on any listener of the port, another instance's
    // `SO_REUSEPORT` sockets included, which the others would otherwise join. Only once it holds
    // the port does it let the others in beside it.
    let first = socket(addr).map_err(fail)?;
    first.bind(&addr.into()).map_err(fail)?;
    // With port 0, the others go on the port the kernel chose.
    let local = first.local_addr().ok().and_then(|a| a.as_socket());
    let local = local.ok_or_else(|| fail(std::io::ErrorKind::InvalidInput.into()))?;
    let mut bound = vec![listening(addr, 0, first, sockets > 1).map_err(fail)?];
    for n in 1..sockets {
        let next = socket(addr).map_err(fail)?;
        next.set_reuse_port(true).map_err(fail)?;
        next.bind(&local.into()).map_err(fail)?;
        bound.push(listening(addr, n, next, false).map_err(fail)?);
    }
    Ok(bound)
}

fn socket(addr: SocketAddr) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    // As std's bind: a restart finds the port free while old connections sit in TIME_WAIT.
    socket.set_reuse_address(true)?;
    Ok(socket)
}

fn listening(addr: SocketAddr, n: usize, socket: Socket, share: bool) -> std::io::Result<Bound> {
    if share {
        socket.set_reuse_port(true)?;
    }
    // What Pingora asks for when it binds; Linux caps it at net.core.somaxconn.
    socket.listen(65535)?;
    // Pingora's runtime accepts on it: a blocking socket would stall a worker thread.
    socket.set_nonblocking(true)?;
    Ok(Bound {
        key: key(&addr.to_string(), n),
        fd: socket.into(),
    })
}

/// The sockets bound before the start, for every worker's service to put into Pingora's table.
pub type Fresh = Arc<StdMutex<Vec<Bound>>>;

/// What one kind of listening service (cleartext proxy, TLS proxy, admin) listens on.
#[derive(Clone)]
pub struct Group {
    /// Every address the service listens on, each given to its `add_tcp` as `to_string()`.
    pub addrs: Vec<SocketAddr>,
    /// Names them in an error ("proxy", "admin").
    pub what: &'static str,
    /// Sockets per address (`per_address`).
    pub sockets: usize,
    /// Those bound before the start; none in an upgrade.
    pub fresh: Fresh,
}

/// One worker's listening service, on the sockets bound before the server started (or inherited
/// in an upgrade).
pub struct PreBound<S> {
    inner: S,
    worker: usize,
    group: Group,
}

impl<S> PreBound<S> {
    pub fn new(inner: S, worker: usize, group: Group) -> PreBound<S> {
        PreBound {
            inner,
            worker,
            group,
        }
    }

    /// Whether this worker has a socket of its own on each address: only the first `sockets` do.
    /// One inherited beyond them (from an instance with more) goes unclaimed and is closed at the
    /// start, so the table never holds more than the next hand-over carries.
    fn owns_a_socket(&self) -> bool {
        self.worker < self.group.sockets.max(1)
    }

    /// The keys it takes from the table: an inherited socket nobody claims is closed at the
    /// start, so that no `SO_REUSEPORT` socket is left to take connections without an acceptor.
    fn claimed(&self) -> Vec<String> {
        self.group
            .addrs
            .iter()
            .map(ToString::to_string)
            .flat_map(|addr| {
                let mine = self.owns_a_socket().then(|| key(&addr, self.worker));
                mine.into_iter().chain([addr])
            })
            .collect()
    }

    /// This worker's own table: for each address, its socket, or a copy of another worker's when
    /// there are fewer sockets than workers (more workers than the hand-over carries, or an
    /// upgrade from an instance with fewer).
    fn table(&self, fds: &ListenFds) -> ListenFds {
        let mut table = fds.lock();
        for bound in self
            .group
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
        let Group { what, sockets, .. } = self.group;
        let mut own = Fds::new();
        for &addr in &self.group.addrs {
            let name = addr.to_string();
            if table.get(&name).is_none() {
                // An address the running instance did not have: an upgrade added it. Bound here,
                // all its sockets, so that they are handed on at the next upgrade too; Pingora
                // would bind one per worker without `SO_REUSEPORT`, and all but the first fail.
                match bind(addr, what, sockets) {
                    Ok(bound) => bound
                        .into_iter()
                        .for_each(|b| table.add(b.key, b.fd.into_raw_fd())),
                    Err(e) => {
                        eprintln!("error: cannot start: {e}: {}", e.source);
                        std::process::exit(1);
                    }
                }
            }
            let mine = self.owns_a_socket().then(|| key(&name, self.worker));
            if let Some(fd) = mine.and_then(|k| table.get(&k).copied()) {
                // Pingora's listener owns it from here, as it would own a socket it bound.
                own.add(name, fd);
            } else if let Some(shared) = table
                .get(&key(&name, self.worker % sockets.max(1)))
                .or_else(|| table.get(&name))
                .and_then(|fd| duplicate(*fd))
            {
                own.add(name, shared);
            }
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

    /// See `claimed`.
    fn listen_addresses(&self) -> Option<Vec<String>> {
        Some(self.claimed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
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

    fn group(addr: SocketAddr, sockets: usize) -> Group {
        Group {
            addrs: vec![addr],
            what: "proxy",
            sockets,
            fresh: Fresh::default(),
        }
    }

    #[test]
    fn a_worker_without_a_socket_of_its_own_shares_the_first() {
        let first = bind("127.0.0.1:0".parse().unwrap(), "proxy", 1).unwrap();
        let fd = first[0].fd.as_raw_fd();
        // As an upgrade from an instance with one socket per address would leave the table.
        let inherited: ListenFds = Arc::new(Mutex::new(Fds::new()));
        inherited.lock().add("127.0.0.1:0".into(), fd);
        let second = PreBound::new((), 1, group("127.0.0.1:0".parse().unwrap(), 2));
        let own = second.table(&inherited);
        let copy = *own.lock().get("127.0.0.1:0").unwrap();
        assert_ne!(copy, fd);
        drop(unsafe { OwnedFd::from_raw_fd(copy) });
    }

    /// An upgrade that adds an address: the first worker to start binds all of its sockets into
    /// the main table, where the next upgrade finds them, and each worker takes its own.
    #[test]
    fn an_address_the_table_lacks_is_bound_with_all_its_sockets() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let table: ListenFds = Arc::new(Mutex::new(Fds::new()));
        let first = PreBound::new((), 0, group(addr, 2)).table(&table);
        let second = PreBound::new((), 1, group(addr, 2)).table(&table);
        let main = table.lock();
        let name = addr.to_string();
        let keys = [name.clone(), format!("{name}#1")];
        assert!(keys.iter().all(|k| main.get(k).is_some()));
        assert_eq!(first.lock().get(&name), main.get(&keys[0]));
        assert_eq!(second.lock().get(&name), main.get(&keys[1]));
    }

    /// An upgrade from an instance with more sockets per address (fewer listeners, or more CPUs):
    /// the workers beyond this one's share take no inherited socket of their own, and leave the
    /// extra ones unclaimed, for Pingora to close, so the next hand-over fits.
    #[test]
    fn sockets_beyond_the_cap_are_shared_and_left_unclaimed() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let table: ListenFds = Arc::new(Mutex::new(Fds::new()));
        PreBound::new((), 0, group(addr, 3)).table(&table);
        let name = addr.to_string();
        let third = PreBound::new((), 2, group(addr, 2));
        let own = *third.table(&table).lock().get(&name).unwrap();
        let inherited = *table.lock().get(&format!("{name}#2")).unwrap();
        assert_ne!(
            own, inherited,
            "a copy of a shared socket, not the extra one"
        );
        assert_eq!(third.claimed(), std::slice::from_ref(&name));
        let second = PreBound::new((), 1, group(addr, 2));
        assert_eq!(second.claimed(), [format!("{name}#1"), name]);
    }

    #[test]
    fn sockets_per_address_fit_the_upgrade_hand_over() {
        assert_eq!(per_address(2, 1, 1), 2);
        assert_eq!(per_address(64, 1, 1), 31);
        assert_eq!(per_address(16, 2, 2), 15);
        assert_eq!(per_address(8, 0, 3), 1);
        // More listeners than the hand-over carries: one each, as before.
        assert_eq!(per_address(8, 40, 1), 1);
    }
}
