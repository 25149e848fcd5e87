//! Listening sockets bound before Pingora starts, so that a taken port stops the start.
//!
//! Pingora binds inside a service's runtime: on a taken port it retries for 30 s, then panics in
//! that service's thread while the rest of the process, `/healthz` included, runs on as if it were
//! serving. So every address is bound here first, and a failure is one line and exit code 1. The
//! sockets are then handed to Pingora through the table it keeps for zero-downtime upgrades (the
//! same one that carries them to the next instance on SIGQUIT). An instance started with
//! `--upgrade` binds nothing: its sockets come from the running one.

use async_trait::async_trait;
use pingora::server::{ListenFds, ShutdownWatch};
use pingora::services::Service;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{IntoRawFd, OwnedFd};

#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} ({what})")]
pub struct BindError {
    addr: SocketAddr,
    what: &'static str,
    #[source]
    source: std::io::Error,
}

/// A socket bound and listening, under the address string the service's `add_tcp` was given.
#[derive(Debug)]
pub struct Bound {
    key: String,
    fd: OwnedFd,
}

/// Binds `addr` now; `what` names it in the error ("proxy", "admin").
pub fn bind(addr: SocketAddr, what: &'static str) -> Result<Bound, BindError> {
    let fail = |source| BindError { addr, what, source };
    let listener = TcpListener::bind(addr).map_err(fail)?;
    // Pingora's runtime accepts on it: a blocking socket would stall a worker thread.
    listener.set_nonblocking(true).map_err(fail)?;
    Ok(Bound {
        key: addr.to_string(),
        fd: OwnedFd::from(listener),
    })
}

/// A listening service whose sockets were bound before the server started.
pub struct PreBound<S> {
    inner: S,
    sockets: Vec<Bound>,
}

impl<S> PreBound<S> {
    pub fn new(inner: S, sockets: Vec<Bound>) -> PreBound<S> {
        PreBound { inner, sockets }
    }
}

#[async_trait]
impl<S: Service> Service for PreBound<S> {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
    ) {
        if let Some(fds) = &fds {
            let mut table = fds.lock();
            for bound in self.sockets.drain(..) {
                // A socket inherited in an upgrade would be the same address: it wins.
                if table.get(&bound.key).is_none() {
                    table.add(bound.key, bound.fd.into_raw_fd());
                }
            }
        }
        self.inner
            .start_service(fds, shutdown, listeners_per_fd)
            .await
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn threads(&self) -> Option<usize> {
        self.inner.threads()
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        self.inner.listen_addresses()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_is_one_clear_error() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = format!("{:#}", anyhow::Error::new(bind(addr, "proxy").unwrap_err()));
        assert!(
            err.starts_with(&format!("cannot listen on {addr} (proxy): ")),
            "{err}"
        );
        assert!(err.contains("in use"), "{err}");
    }
}
