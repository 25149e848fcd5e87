//! Telling a slow proxy from a slow Redis.
//!
//! A decision's budget (`timeout_ms`) is spent by Redis and by the proxy itself: the request's
//! task waiting for its thread's batch driver, the driver waiting for the thread to run it again
//! after the reply arrived. On a busy or starved box the second share can be all of it: in a
//! 10-minute soak 7 % of decisions failed open, most of them because the circuit breaker opened
//! on timeouts that the proxy's own lateness caused. So the driver measures that lateness as a
//! timer's overshoot: while a call is out it wakes every `tick` (a call that answers first costs
//! no timer at all), and a wake that comes late, or a reply read after a tick that never ran,
//! says the thread was not running when it should have been. A timeout is Redis's only when
//! Redis had at least half the budget once that lateness is taken off; otherwise it is the
//! proxy's (`LimiterError::Late`), counted under its own cause and ignored by the breaker.

use super::LimiterError;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Tokio's timers fire on a 1 ms wheel: an overshoot up to this is how timers work, not lateness.
pub const GRANULARITY: Duration = Duration::from_millis(1);

/// How often a driver with a call out looks at the clock: an eighth of the budget (at least the
/// timers' granularity), so a fast call never sees a tick.
pub fn tick(budget: Duration) -> Duration {
    (budget / 8).max(GRANULARITY)
}

/// How late something due at `due` ran, seen running at `now`: what exceeds the granularity.
pub fn past(now: Instant, due: Instant) -> Duration {
    now.saturating_duration_since(due)
        .saturating_sub(GRANULARITY)
}

/// What a request whose budget ran out is told: a timeout that is Redis's, or one the proxy's
/// own lateness explains. `elapsed`: since the request asked; `late`: the proxy's lateness
/// measured meanwhile.
pub fn classify(budget: Duration, elapsed: Duration, late: Duration) -> LimiterError {
    let redis_share = elapsed.saturating_sub(late);
    if redis_share >= budget / 2 {
        LimiterError::Timeout(budget)
    } else {
        LimiterError::Late { budget, late }
    }
}

/// Runs `call` within `budget` from `started`, looking at the clock every `tick` while it is out:
/// a call of its own (a Redis Cluster's, not batched) told apart from the proxy's lateness like a
/// batched one. The output, or the timeout `classify` names.
pub async fn within<F: std::future::Future>(
    budget: Duration,
    started: Instant,
    call: F,
) -> Result<F::Output, LimiterError> {
    let deadline = started + budget;
    let tick = tick(budget);
    let mut late = Duration::ZERO;
    let mut due = (Instant::now() + tick).min(deadline);
    tokio::pin!(call);
    loop {
        tokio::select! {
            biased;
            out = &mut call => return Ok(out),
            _ = tokio::time::sleep_until(due.into()) => {
                let now = Instant::now();
                late += past(now, due);
                if now >= deadline {
                    return Err(classify(budget, now - started, late));
                }
                due = (now + tick).min(deadline);
            }
        }
    }
}

/// Episodes of lateness one driver saw, each noted when it ended: the ones within the longest
/// budget are kept, as many as a driver can see in it.
#[derive(Default)]
pub struct Log {
    episodes: VecDeque<(Instant, Duration)>,
}

/// Episodes kept at most: one per call and one per batch's gathering within a budget.
const KEPT: usize = 256;

impl Log {
    /// `late` ended at `at` (nothing is noted for no lateness).
    pub fn note(&mut self, at: Instant, late: Duration) {
        if late.is_zero() {
            return;
        }
        if self.episodes.len() == KEPT {
            self.episodes.pop_front();
        }
        self.episodes.push_back((at, late));
    }

    /// The lateness that ended after `since` (a request's start).
    pub fn since(&self, since: Instant) -> Duration {
        self.episodes
            .iter()
            .rev()
            .take_while(|(at, _)| *at > since)
            .map(|(_, late)| *late)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_timeout_is_redis_s_only_when_redis_had_half_the_budget() {
        let budget = 25 * MS;
        // Redis paused, the proxy on time: Redis's.
        assert!(matches!(
            classify(budget, 26 * MS, MS),
            LimiterError::Timeout(_)
        ));
        // The proxy stopped for 90 ms with a call out: its own.
        assert!(matches!(
            classify(budget, 100 * MS, 90 * MS),
            LimiterError::Late { .. }
        ));
        // Both slow: 15 ms of the proxy's, 15 of Redis's: Redis had more than half.
        assert!(matches!(
            classify(budget, 30 * MS, 15 * MS),
            LimiterError::Timeout(_)
        ));
        // 20 of the proxy's, 10 of Redis's: not enough to blame Redis.
        assert!(matches!(
            classify(budget, 30 * MS, 20 * MS),
            LimiterError::Late { .. }
        ));
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_call_of_its_own_that_never_answers_is_redis_s_timeout() {
        let budget = 40 * MS;
        let out = runtime().block_on(within(budget, Instant::now(), std::future::pending::<()>()));
        assert!(matches!(out, Err(LimiterError::Timeout(_))), "{out:?}");
    }

    #[test]
    fn a_call_of_its_own_whose_thread_stalls_is_the_proxy_s_lateness() {
        let budget = 40 * MS;
        let rt = runtime();
        let out = rt.block_on(async {
            // Something else on this thread holds it for 120 ms once the call is out.
            tokio::spawn(async { std::thread::sleep(120 * MS) });
            within(budget, Instant::now(), std::future::pending::<()>()).await
        });
        assert!(matches!(out, Err(LimiterError::Late { .. })), "{out:?}");
        let answered = rt.block_on(within(budget, Instant::now(), async { 7 }));
        assert_eq!(answered.ok(), Some(7));
    }

    #[test]
    fn only_lateness_after_a_request_started_counts_for_it() {
        let t0 = Instant::now();
        let mut log = Log::default();
        log.note(t0 + MS, 5 * MS);
        log.note(t0 + 2 * MS, Duration::ZERO);
        log.note(t0 + 10 * MS, 7 * MS);
        assert_eq!(log.since(t0), 12 * MS);
        assert_eq!(log.since(t0 + 5 * MS), 7 * MS);
        assert_eq!(log.since(t0 + 10 * MS), Duration::ZERO);
        assert_eq!(past(t0 + 3 * MS, t0), 2 * MS);
        assert_eq!(past(t0, t0 + 3 * MS), Duration::ZERO);
        assert_eq!(tick(25 * MS), Duration::from_micros(3125));
        assert_eq!(tick(2 * MS), MS);
    }
}
