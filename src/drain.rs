//! SIGTERM ends the process as soon as no client connection is left, rather than after the whole
//! grace period: Pingora sleeps `grace_period_seconds` whatever is in flight, so an idle proxy
//! (a deploy, a developer's Ctrl-C on a script) would wait seconds for nothing.
//!
//! The signals are Pingora's own (SIGQUIT hands the sockets over, SIGTERM drains, SIGINT quits);
//! on SIGTERM a watcher also follows the connections still open, and exits with 0 once none is.
//! Each connection ends on its own at shutdown: one between requests is closed, one in flight is
//! served and then closed (`downstream`), an HTTP/2 one is sent GOAWAY. Pingora's grace period
//! still bounds the wait.

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch};
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

/// How often the watcher looks at the connections still open.
const POLL: Duration = Duration::from_millis(20);
/// Readings in a row with none open before it exits: a connection accepted a moment ago may not
/// hold its place yet (it takes it once its TLS handshake is done).
const QUIET: u32 = 5;

/// How many client connections are open.
pub type OpenCount = Arc<dyn Fn() -> usize + Send + Sync>;

/// Pingora's signal watch, and the early exit once drained.
pub struct Drain {
    open: OpenCount,
}

impl Drain {
    pub fn new(open: OpenCount) -> Drain {
        Drain { open }
    }
}

#[async_trait]
impl ShutdownSignalWatch for Drain {
    async fn recv(&self) -> ShutdownSignal {
        let (Ok(mut quit), Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::quit()),
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            // Pingora's own watch would panic here; without handlers only SIGKILL stops us.
            log::error!("cannot install the signal handlers: SIGTERM will not drain");
            return std::future::pending().await;
        };
        tokio::select! {
            _ = quit.recv() => ShutdownSignal::GracefulUpgrade,
            _ = int.recv() => ShutdownSignal::FastShutdown,
            _ = term.recv() => {
                let open = self.open.clone();
                std::thread::spawn(move || exit_when_drained(&*open));
                ShutdownSignal::GracefulTerminate
            }
        }
    }
}

/// Exits with 0 once no client connection is open (Pingora exits anyway when its grace period
/// ends).
fn exit_when_drained(open: &(dyn Fn() -> usize + Send + Sync)) {
    // Let the shutdown reach every connection first: one between requests closes at once.
    let mut quiet = 0;
    while quiet < QUIET {
        std::thread::sleep(POLL);
        quiet = if open() == 0 { quiet + 1 } else { 0 };
    }
    log::info!("SIGTERM: no client connection left, exiting before the grace period ends");
    log::logger().flush();
    std::process::exit(0);
}
