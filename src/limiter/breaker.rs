//! A circuit breaker in front of the store, so that an outage costs requests nothing once it is
//! known: after `THRESHOLD` consecutive transient failures (timeouts, refused or dropped
//! connections) calls stop for a cool-down, then one probe is let through. A probe that fails
//! doubles the cool-down (capped); one that succeeds closes the breaker.
//!
//! "Consecutive" means one after another in time, not side by side: calls that were in flight
//! together when they failed are one event. A stall of the machine (or of one Redis reply) times
//! out every call in flight at once; counting each would open the breaker, and switch limiting
//! off, exactly when the proxy is under pressure. So a failure counts only if its call started
//! after the last counted failure was seen. Script and other non-transient errors do not count:
//! they say nothing about reachability.

pub use crate::metrics::BreakerState;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Consecutive transient failures that open the breaker.
const THRESHOLD: u32 = 3;
const FIRST_COOL_DOWN: Duration = Duration::from_millis(100);
const MAX_COOL_DOWN: Duration = Duration::from_secs(5);

/// Whether a call may go to the store now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Call; report the result with the instant the call started.
    Call,
    /// Don't call: the store is known to be down, or a probe is already out.
    Reject,
}

#[derive(Debug)]
struct Inner {
    state: BreakerState,
    failures: u32,
    /// When the last counted failure was seen: calls started before it failed with it.
    last_failure: Option<Instant>,
    cool_down: Duration,
    open_until: Instant,
}

#[derive(Debug)]
pub struct Breaker {
    inner: Mutex<Inner>,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            inner: Mutex::new(Inner {
                state: BreakerState::Closed,
                failures: 0,
                last_failure: None,
                cool_down: FIRST_COOL_DOWN,
                open_until: Instant::now(),
            }),
        }
    }
}

/// A state change, for the caller to log and count.
pub type Transition = Option<BreakerState>;

impl Breaker {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Plain counters: a panic elsewhere cannot leave them half-written.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks before a call. An open breaker past its cool-down turns half-open and admits exactly
    /// this one call as the probe.
    pub fn admit(&self, now: Instant) -> (Admission, Transition) {
        let mut b = self.lock();
        match b.state {
            BreakerState::Closed => (Admission::Call, None),
            BreakerState::HalfOpen => (Admission::Reject, None),
            BreakerState::Open if now >= b.open_until => {
                b.state = BreakerState::HalfOpen;
                (Admission::Call, Some(BreakerState::HalfOpen))
            }
            BreakerState::Open => (Admission::Reject, None),
        }
    }

    /// Reports a call that reached the store and got an answer (or a non-transient error).
    pub fn success(&self) -> Transition {
        let mut b = self.lock();
        match b.state {
            BreakerState::Closed => {
                b.failures = 0;
                None
            }
            BreakerState::HalfOpen => {
                b.failures = 0;
                b.cool_down = FIRST_COOL_DOWN;
                b.state = BreakerState::Closed;
                Some(BreakerState::Closed)
            }
            // Only calls from before it opened can still answer: their news is stale.
            BreakerState::Open => None,
        }
    }

    /// Reports a transient failure of a call started at `started`, seen at `now`.
    pub fn failure(&self, started: Instant, now: Instant) -> Transition {
        let mut b = self.lock();
        match b.state {
            BreakerState::HalfOpen => {
                b.cool_down = (b.cool_down * 2).min(MAX_COOL_DOWN);
                b.open_until = now + b.cool_down;
                b.state = BreakerState::Open;
                Some(BreakerState::Open)
            }
            BreakerState::Closed => {
                if b.last_failure.is_some_and(|seen| started < seen) {
                    // In flight with the last counted failure: the same event.
                    return None;
                }
                b.failures += 1;
                b.last_failure = Some(now);
                (b.failures >= THRESHOLD).then(|| {
                    b.open_until = now + b.cool_down;
                    b.state = BreakerState::Open;
                    BreakerState::Open
                })
            }
            // Calls admitted before the breaker opened, failing late: already counted.
            BreakerState::Open => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn opens_after_consecutive_failures_and_probes_once_after_the_cool_down() {
        let b = Breaker::default();
        let t0 = Instant::now();
        assert_eq!(b.failure(t0, t0 + MS), None);
        assert_eq!(b.success(), None, "a success in between resets the count");
        assert_eq!(b.failure(t0 + 3 * MS, t0 + 4 * MS), None);
        assert_eq!(b.failure(t0 + 5 * MS, t0 + 6 * MS), None);
        let t = t0 + 8 * MS;
        assert_eq!(b.failure(t0 + 7 * MS, t), Some(BreakerState::Open));
        assert_eq!(b.admit(t).0, Admission::Reject);
        let later = t + FIRST_COOL_DOWN;
        assert_eq!(
            b.admit(later),
            (Admission::Call, Some(BreakerState::HalfOpen))
        );
        assert_eq!(b.admit(later).0, Admission::Reject, "one probe at a time");
        // The probe fails: open again, for twice as long.
        assert_eq!(b.failure(later, later + MS), Some(BreakerState::Open));
        assert_eq!(b.admit(later + MS + FIRST_COOL_DOWN).0, Admission::Reject);
        let probe_at = later + MS + FIRST_COOL_DOWN * 2;
        assert_eq!(b.admit(probe_at).0, Admission::Call);
        assert_eq!(b.success(), Some(BreakerState::Closed));
        assert_eq!(b.admit(probe_at).0, Admission::Call);
    }

    #[test]
    fn calls_that_fail_together_are_one_failure() {
        let b = Breaker::default();
        let t0 = Instant::now();
        // A 30 ms stall times out all 16 calls in flight: one event, the breaker stays closed.
        for i in 0..16 {
            assert_eq!(b.failure(t0 + i * MS, t0 + 30 * MS + i * MS), None);
        }
        assert_eq!(b.admit(t0 + 50 * MS).0, Admission::Call);
        // Two more waves, each started after the last failure was seen, make three.
        assert_eq!(b.failure(t0 + 50 * MS, t0 + 80 * MS), None);
        assert_eq!(
            b.failure(t0 + 90 * MS, t0 + 120 * MS),
            Some(BreakerState::Open)
        );
    }

    #[test]
    fn a_late_success_of_an_old_call_does_not_close_an_open_breaker() {
        let b = Breaker::default();
        let t0 = Instant::now();
        for i in 1..=3u32 {
            b.failure(t0 + i * 10 * MS, t0 + i * 10 * MS + MS);
        }
        assert_eq!(b.admit(t0 + 40 * MS).0, Admission::Reject);
        assert_eq!(b.success(), None);
        assert_eq!(b.admit(t0 + 40 * MS).0, Admission::Reject);
    }

    #[test]
    fn the_cool_down_is_capped() {
        let b = Breaker::default();
        let mut now = Instant::now();
        for _ in 0..THRESHOLD {
            now += MS;
            b.failure(now, now);
        }
        for _ in 0..20 {
            now += MAX_COOL_DOWN;
            assert_eq!(b.admit(now).0, Admission::Call);
            b.failure(now, now);
        }
        assert_eq!(b.admit(now + MAX_COOL_DOWN).0, Admission::Call);
    }
}
