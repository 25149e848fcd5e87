//! Real parts for the scenarios: redis-server processes, an HTTP upstream, the proxy binary, and a
//! plain HTTP/1.1 client that sends exactly the bytes a test asks for.

pub mod cluster;
pub mod h2raw;
pub mod http;
pub mod lua;
pub mod proxy;
pub mod redis;
pub mod tls;
pub mod upstream;

use std::net::TcpListener;
use std::time::{Duration, Instant};

/// A port nothing listens on right now. Another process may take it before we use it; callers
/// that bind it retry with a new one.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// The proxy's sockets on each of its `cleartext` addresses on this machine: one per worker thread
/// (one per CPU), as many as Pingora's 32-socket upgrade hand-over carries beside the admin one.
pub fn sockets_per_address(cleartext: usize) -> usize {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    workers.min(31 / cleartext).max(1)
}

/// Listening TCP sockets on loopback `port` (IPv4), whichever process holds them: the proxy has one
/// per worker thread.
pub fn listening_sockets(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let local = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let mut fields = line.split_whitespace().skip(1);
            // local address, remote address, state (0A: LISTEN)
            fields.next() == Some(local.as_str()) && fields.nth(1) == Some("0A")
        })
        .count()
}

/// Polls `f` until it returns `Some`, at most until `limit`; the poll is the test's clock.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
