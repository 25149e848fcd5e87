//! TLS handshakes held to `header_timeout` and counted under `max_connections` from accept.
//!
//! Pingora runs a TLS handshake before the connection reaches `downstream`, with a fixed 60 s
//! timeout (stalled ones were seen closed only after ~35 s) and no cap: 1,000 clients that
//! connect and never send a ClientHello ran the process out of file descriptors. Pingora calls
//! a pre-TLS hook right after accept, on the raw socket; here it takes the connection's place
//! under the cap (or refuses it, counted as `max_connections`) and starts a watch. The place is
//! handed to `downstream` when the handshake is done (`claim`); a handshake still running at the
//! deadline has its socket shut down, which ends Pingora's handshake at once.
//!
//! The watch knows the socket by its descriptor number, which the kernel reuses as soon as
//! Pingora closes it (a failed handshake). So it also keeps the socket's cookie (`SO_COOKIE`,
//! never reused): before it shuts anything down it takes its own duplicate of the descriptor and
//! checks that it still names the same socket, and while it waits it looks now and then whether
//! the handshake's socket is gone, to give its place back early. `downstream` finds a
//! connection's place by the same cookie.

use crate::metrics::{Closed, Metrics, OpenConnection};
use async_trait::async_trait;
use parking_lot::Mutex;
use pingora::listeners::PreTlsProcess;
use pingora::protocols::l4::stream::Stream as L4Stream;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How often a waiting watch looks whether its handshake's socket was closed.
const LOOK: Duration = Duration::from_millis(250);

/// The handshakes under way, by descriptor, and what they share with `downstream`.
pub struct Handshakes {
    open: Arc<Semaphore>,
    deadline: Duration,
    metrics: Metrics,
    /// By socket cookie.
    pending: Mutex<HashMap<u64, Arc<Pending>>>,
}

/// One handshake's place under the cap, until `downstream` claims it; it counts as an open
/// connection meanwhile.
struct Pending {
    cookie: u64,
    place: Mutex<Option<(OwnedSemaphorePermit, OpenConnection)>>,
}

impl Handshakes {
    pub fn new(open: Arc<Semaphore>, deadline: Duration, metrics: Metrics) -> Arc<Handshakes> {
        Arc::new(Handshakes {
            open,
            deadline,
            metrics,
            pending: Mutex::default(),
        })
    }

    /// The place taken at accept for the connection whose socket has `cookie`, once its
    /// handshake is done.
    pub fn claim(&self, cookie: u64) -> Option<OwnedSemaphorePermit> {
        let pending = self.pending.lock().remove(&cookie)?;
        let place = pending.place.lock().take();
        place.map(|(permit, _open)| permit)
    }

    /// Waits for the handshake on `fd` until the deadline; shuts its socket down if it is
    /// still under way then.
    async fn watch(self: Arc<Self>, fd: RawFd, pending: Arc<Pending>) {
        let deadline = tokio::time::Instant::now() + self.deadline;
        let timed_out = loop {
            let claimed = pending.place.lock().is_none();
            if claimed || cookie(fd) != Some(pending.cookie) {
                break false;
            }
            if tokio::time::Instant::now() >= deadline {
                break true;
            }
            tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + LOOK)).await;
        };
        self.pending.lock().remove(&pending.cookie);
        // Taken here, it is not claimed after: a handshake that ends this instant is closed.
        let place = pending.place.lock().take();
        if timed_out && place.is_some() && shut_down_if(fd, pending.cookie) {
            self.metrics.connection_closed(Closed::HandshakeTimeout);
        }
    }
}

/// The pre-TLS hook: a place under the cap, or the connection is refused before any byte.
#[derive(Clone)]
pub struct Gate(pub Arc<Handshakes>);

#[async_trait]
impl PreTlsProcess for Gate {
    async fn process(&self, stream: &mut L4Stream) -> pingora::Result<()> {
        let refuse =
            |why: &str| pingora::Error::e_explain(pingora::ErrorType::AcceptError, why.to_string());
        let handshakes = &self.0;
        let Ok(place) = handshakes.open.clone().try_acquire_owned() else {
            handshakes.metrics.connection_closed(Closed::MaxConnections);
            return refuse("max_connections reached");
        };
        let fd = stream.as_raw_fd();
        let Some(cookie) = cookie(fd) else {
            return refuse("the socket is gone");
        };
        let pending = Arc::new(Pending {
            cookie,
            place: Mutex::new(Some((place, handshakes.metrics.connection_open()))),
        });
        handshakes.pending.lock().insert(cookie, pending.clone());
        tokio::spawn(handshakes.clone().watch(fd, pending));
        Ok(())
    }
}

/// The cookie of the socket `fd` names now: the kernel never gives two sockets the same.
fn cookie(fd: RawFd) -> Option<u64> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cookie`; a closed descriptor or one
    // that is not a socket is an error, not UB.
    let got = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    (got == 0).then_some(cookie)
}

/// Shuts down the socket `fd` names if it is still the one of `cookie`. The check and the
/// shutdown go through a duplicate, so `fd` cannot be closed and reused between them.
fn shut_down_if(fd: RawFd, cookie_was: u64) -> bool {
    // SAFETY: dup of any number is safe; a closed one fails with EBADF.
    let dup = unsafe { libc::dup(fd) };
    if dup < 0 {
        return false;
    }
    // SAFETY: `dup` is a descriptor this function just made and owns alone.
    let dup = unsafe { OwnedFd::from_raw_fd(dup) };
    if cookie(dup.as_raw_fd()) != Some(cookie_was) {
        return false;
    }
    // SAFETY: shutdown on a descriptor we own; it ends the connection for every holder.
    unsafe { libc::shutdown(dup.as_raw_fd(), libc::SHUT_RDWR) == 0 }
}
