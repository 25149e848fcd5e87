//! Log lines about things that can happen on every request, at most once per key per interval.
//!
//! A poisoned bucket key or a Redis out of memory fails decision after decision; one line per
//! decision would flood the log (and the disk) exactly when the operator needs to read it. The
//! first occurrence of a key is logged at once; later ones are counted and reported with the next
//! line that interval allows, so no occurrence goes unmentioned.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Keys remembered at most: enough for every kind of error and a burst of poisoned keys, small
/// enough that a flood of distinct keys cannot grow it.
const MAX_KEYS: usize = 1024;

pub struct Throttle {
    interval: Duration,
    seen: Mutex<HashMap<String, Seen>>,
}

struct Seen {
    logged_at: Instant,
    /// Occurrences since that line.
    suppressed: u64,
}

impl Throttle {
    pub fn new(interval: Duration) -> Throttle {
        Throttle {
            interval,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Notes one occurrence of `key` at `now`. `Some(n)`: log it now, mentioning the `n`
    /// occurrences that were not logged since the last line; `None`: stay quiet.
    pub fn note(&self, key: &str, now: Instant) -> Option<u64> {
        // A line is never half-written into the map: a poisoned lock still holds whole entries.
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = seen.get_mut(key) {
            if now.duration_since(s.logged_at) < self.interval {
                s.suppressed += 1;
                return None;
            }
            let suppressed = std::mem::take(&mut s.suppressed);
            s.logged_at = now;
            return Some(suppressed);
        }
        if seen.len() >= MAX_KEYS {
            let interval = self.interval;
            seen.retain(|_, s| now.duration_since(s.logged_at) < interval);
            if seen.len() >= MAX_KEYS {
                return None;
            }
        }
        seen.insert(
            key.to_string(),
            Seen {
                logged_at: now,
                suppressed: 0,
            },
        );
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_interval_with_the_count_of_what_was_skipped() {
        let t = Throttle::new(Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(t.note("oom", start), Some(0));
        for s in 1..=5 {
            assert_eq!(t.note("oom", start + Duration::from_secs(s)), None);
        }
        assert_eq!(t.note("script", start), Some(0), "keys are apart");
        assert_eq!(t.note("oom", start + Duration::from_secs(10)), Some(5));
        assert_eq!(t.note("oom", start + Duration::from_secs(11)), None);
    }

    #[test]
    fn stays_bounded() {
        let t = Throttle::new(Duration::from_secs(60));
        let now = Instant::now();
        for i in 0..(MAX_KEYS * 3) {
            t.note(&format!("k{i}"), now);
        }
        assert!(t.seen.lock().unwrap().len() <= MAX_KEYS);
    }
}
