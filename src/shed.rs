//! Connections waiting for a request head, oldest first, so that a full listener can make room
//! by closing the one that has waited longest instead of refusing the newcomer.
//!
//! The admin listener keeps few connections (`downstream::ADMIN_CONNECTIONS`). Refusing new ones
//! at the cap let a few hundred silent connections (each held until its header deadline) turn
//! away every health probe, and an orchestrator kills a healthy proxy. A connection that has sent
//! no whole head costs nothing to close and loses nothing; one being served is never shed. A
//! probe sends its head at once, so it is never the oldest waiter for long.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

#[derive(Debug, Default)]
pub struct Waiting {
    /// By arrival: each waiter's wake-up, told when it is shed.
    waiters: Mutex<BTreeMap<u64, Arc<Notify>>>,
    next: AtomicU64,
}

/// One connection's place among the waiters; dropping it (the head arrived, or the connection
/// ended) leaves the line.
#[derive(Debug)]
pub struct Waiter {
    line: Arc<Waiting>,
    id: u64,
    pub shed: Arc<Notify>,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Ok(mut w) = self.line.waiters.lock() {
            w.remove(&self.id);
        }
    }
}

impl Waiting {
    /// Joins the line, at its end.
    pub fn enter(self: &Arc<Self>) -> Waiter {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let shed = Arc::new(Notify::new());
        if let Ok(mut w) = self.waiters.lock() {
            w.insert(id, shed.clone());
        }
        Waiter {
            line: self.clone(),
            id,
            shed,
        }
    }

    /// Tells the longest waiter to close, taking it out of the line; `false` when none waits.
    pub fn shed_oldest(&self) -> bool {
        let oldest = self.waiters.lock().ok().and_then(|mut w| w.pop_first());
        match oldest {
            Some((_, shed)) => {
                // Kept if it is not listening this instant: its next wait ends at once.
                shed.notify_one();
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_oldest_waiter_is_shed_first_and_a_leaver_is_not() {
        let line = Arc::new(Waiting::default());
        let first = line.enter();
        let second = line.enter();
        let third = line.enter();
        drop(second);
        assert!(line.shed_oldest());
        // Told before it listens: the wake-up is kept.
        first.shed.notified().await;
        assert!(line.shed_oldest());
        third.shed.notified().await;
        assert!(!line.shed_oldest(), "no one left");
    }
}
