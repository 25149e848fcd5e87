//! A circuit breaker in front of the store, so that an outage costs requests nothing once it is
//! known: after `THRESHOLD` consecutive transient failures (timeouts, refused or dropped
//! connections) calls stop for a cool-down, then one probe is let through. A probe that fails
//! doubles the cool-down (capped); one that succeeds closes the breaker.
//!
//! Script and other non-transient errors do not count: they say nothing about reachability.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Consecutive transient failures that open the breaker.
const THRESHOLD: u32 = 3;
const FIRST_COOL_DOWN: Duration = Duration::from_millis(100);
const MAX_COOL_DOWN: Duration = Duration::from_secs(5);

/// The breaker's state, as `ratelimit_redis_breaker_transitions_total{state}` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn label(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// Whether a call may go to the store now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Call; report the result.
    Call,
    /// Don't call: the store is known to be down, or a probe is already out.
    Reject,
}

#[derive(Debug)]
struct Inner {
    state: BreakerState,
    failures: u32,
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
        b.failures = 0;
        b.cool_down = FIRST_COOL_DOWN;
        (b.state != BreakerState::Closed).then(|| {
            b.state = BreakerState::Closed;
            BreakerState::Closed
        })
    }

    /// Reports a transient failure.
    pub fn failure(&self, now: Instant) -> Transition {
        let mut b = self.lock();
        match b.state {
            BreakerState::HalfOpen => {
                b.cool_down = (b.cool_down * 2).min(MAX_COOL_DOWN);
                b.open_until = now + b.cool_down;
                b.state = BreakerState::Open;
                Some(BreakerState::Open)
            }
            BreakerState::Closed => {
                b.failures += 1;
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

    #[test]
    fn opens_after_consecutive_failures_and_probes_once_after_the_cool_down() {
        let b = Breaker::default();
        let t0 = Instant::now();
        assert_eq!(b.failure(t0), None);
        assert_eq!(b.success(), None, "a success in between resets the count");
        assert_eq!(b.failure(t0), None);
        assert_eq!(b.failure(t0), None);
        assert_eq!(b.failure(t0), Some(BreakerState::Open));
        assert_eq!(b.admit(t0).0, Admission::Reject);
        let later = t0 + FIRST_COOL_DOWN;
        assert_eq!(
            b.admit(later),
            (Admission::Call, Some(BreakerState::HalfOpen))
        );
        assert_eq!(b.admit(later).0, Admission::Reject, "one probe at a time");
        // The probe fails: open again, for twice as long.
        assert_eq!(b.failure(later), Some(BreakerState::Open));
        assert_eq!(b.admit(later + FIRST_COOL_DOWN).0, Admission::Reject);
        let probe_at = later + FIRST_COOL_DOWN * 2;
        assert_eq!(b.admit(probe_at).0, Admission::Call);
        assert_eq!(b.success(), Some(BreakerState::Closed));
        assert_eq!(b.admit(probe_at).0, Admission::Call);
    }

    #[test]
    fn the_cool_down_is_capped() {
        let b = Breaker::default();
        let mut now = Instant::now();
        for _ in 0..THRESHOLD {
            b.failure(now);
        }
        for _ in 0..20 {
            now += MAX_COOL_DOWN;
            assert_eq!(b.admit(now).0, Admission::Call);
            b.failure(now);
        }
        assert_eq!(b.admit(now + MAX_COOL_DOWN).0, Admission::Call);
    }
}
