//! A route's upstreams: taken in turn (round robin), skipping the ones that failed recently.
//!
//! Failure is noticed two ways. Passively: a connection that fails marks its upstream down for a
//! while, and the request is retried on the next one. Actively, when the route has a health check:
//! a background task probes every upstream and marks it up or down. When every upstream is down
//! the request still goes to one of them (the least recently failed), so the client gets a fast,
//! honest 502 or 504 rather than a hang, and a recovered upstream is found by real traffic too.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a passive failure keeps an upstream out of turn.
const DOWN_FOR: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct UpstreamPool {
    peers: Vec<SocketAddr>,
    next: AtomicUsize,
    /// Per peer: the millisecond (Unix time) until which it is down; 0 when up.
    down_until: Vec<AtomicU64>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl UpstreamPool {
    pub fn new(peers: Vec<SocketAddr>) -> UpstreamPool {
        let down_until = peers.iter().map(|_| AtomicU64::new(0)).collect();
        UpstreamPool {
            peers,
            next: AtomicUsize::new(0),
            down_until,
        }
    }

    pub fn peers(&self) -> &[SocketAddr] {
        &self.peers
    }

    /// The next upstream in turn that is up, as an index and address. With every upstream down,
    /// the one whose down time ends first.
    pub fn pick(&self) -> (usize, SocketAddr) {
        let n = self.peers.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let now = now_ms();
        let up = (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| self.down_until[i].load(Ordering::Relaxed) <= now);
        let i = up.unwrap_or_else(|| {
            (0..n)
                .min_by_key(|&i| self.down_until[i].load(Ordering::Relaxed))
                .unwrap_or(0)
        });
        (i, self.peers[i])
    }

    /// Whether some upstream other than `i` is up: worth retrying a failed connection there.
    pub fn has_other_up(&self, i: usize) -> bool {
        let now = now_ms();
        (0..self.peers.len()).any(|k| k != i && self.down_until[k].load(Ordering::Relaxed) <= now)
    }

    /// Marks upstream `i` down for a while after a failure. `true` when it was up: the caller
    /// says so once, not on every request that finds it down.
    pub fn mark_down(&self, i: usize) -> bool {
        self.mark_down_for(i, DOWN_FOR)
    }

    pub fn mark_down_for(&self, i: usize, d: Duration) -> bool {
        let now = now_ms();
        self.down_until
            .get(i)
            .is_some_and(|slot| slot.swap(now + d.as_millis() as u64, Ordering::Relaxed) <= now)
    }

    /// `true` when it was down.
    pub fn mark_up(&self, i: usize) -> bool {
        let now = now_ms();
        self.down_until
            .get(i)
            .is_some_and(|slot| slot.swap(0, Ordering::Relaxed) > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: u16) -> UpstreamPool {
        UpstreamPool::new(
            (1..=n)
                .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
                .collect(),
        )
    }

    #[test]
    fn takes_turns_and_skips_the_down() {
        let p = pool(3);
        let turns: Vec<usize> = (0..6).map(|_| p.pick().0).collect();
        assert_eq!(turns, [0, 1, 2, 0, 1, 2]);
        assert!(p.mark_down(1), "a change: said once");
        assert!(!p.mark_down(1), "no change: nothing to say");
        let turns: Vec<usize> = (0..4).map(|_| p.pick().0).collect();
        assert!(!turns.contains(&1), "{turns:?}");
        assert!(p.has_other_up(1));
        assert!(p.mark_up(1));
        assert!(!p.mark_up(1));
        assert!((0..3).any(|_| p.pick().0 == 1));
    }

    #[test]
    fn with_all_down_the_first_to_recover_is_tried() {
        let p = pool(2);
        p.mark_down_for(0, Duration::from_secs(20));
        p.mark_down_for(1, Duration::from_secs(5));
        assert_eq!(p.pick().0, 1);
        assert!(!p.has_other_up(1));
    }
}
