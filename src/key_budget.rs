//! `new_keys_per_client`: how many store keys one client address may create through key parts it
//! chooses itself (a header, a query parameter, the path, the method).
//!
//! Every such key costs the store memory until it expires (a daily quota's key lives until
//! midnight): one address sending a fresh `X-Api-Key` per request made Redis hold 1.8 M keys,
//! 337 MB, in ten minutes, and filled the in-memory store. So each address gets a budget of keys
//! it has not used within the window: a key it used in the last window is free; a new one draws
//! one from its budget; beyond the budget the request is counted on a bucket of the client
//! address itself (`rl:{api:!10.0.0.7}:per_key`, which no key value can spell), limited as any
//! other request under that limit, so a flood lands in one bucket per address however many keys
//! it invents. Counted per proxy, in process memory: a fleet of N proxies lets an address create
//! up to N times the budget.
//!
//! Why not count only keys the store does not hold yet: that needs the store's answer first,
//! so a budget could only be checked one round trip late, and every request of a flood in flight
//! at once would pass it. Counting keys new to this client in the window is decided before the
//! store is asked, costs no Redis call, and gives a client that reuses its keys (an SDK with one
//! API key, a gateway with a few hundred) nothing to notice.

use crate::clock::SystemClock;
use crate::config::NewKeyBudget;
use crate::limiter::memory::MemoryLimiter;
use crate::limiter::{Bucket, BucketParams, Kind};
use std::hash::{BuildHasher, RandomState};

/// Entries the tracker holds at most (two per client and one per key a client used in the
/// window, about 150 bytes each). When it is full, new keys are counted on the address, as
/// beyond a budget.
const TRACKED: usize = 200_000;

pub struct KeyBudget {
    seen: MemoryLimiter<SystemClock>,
    /// One token a window: spent, the key was used in the window.
    marker: BucketParams,
    /// `count` tokens, `count` a window.
    budget: BucketParams,
    /// Seeded per process: a client cannot aim its keys at another's marker.
    hasher: RandomState,
}

impl KeyBudget {
    pub fn new(settings: NewKeyBudget) -> KeyBudget {
        KeyBudget::with_clock(settings, SystemClock, TRACKED)
    }

    fn with_clock(settings: NewKeyBudget, clock: SystemClock, tracked: usize) -> KeyBudget {
        let per_window = |capacity: u64| BucketParams {
            capacity,
            scale: settings.window_us,
            num: capacity,
            cost: 1,
            kind: Kind::Bucket,
        };
        KeyBudget {
            seen: MemoryLimiter::new(clock, tracked),
            marker: per_window(1),
            budget: per_window(settings.count),
            hasher: RandomState::new(),
        }
    }

    /// Whether `client` may use store key `key`: it used it in the window, or its budget of new
    /// keys has room (drawn). `false`: count the request on the client's own bucket.
    pub fn admit(&self, client: &str, key: &str) -> bool {
        let marker = format!("{{{client}}}:k:{:x}", self.hasher.hash_one(key));
        let budget = format!("{{{client}}}:budget");
        let drawn = self.seen.decide(&[
            Bucket {
                key: &marker,
                params: self.marker,
            },
            Bucket {
                key: &budget,
                params: self.budget,
            },
        ]);
        match drawn {
            // New, and within the budget: both drawn.
            Ok(d) if d.allowed => true,
            // Used in the window: free.
            Ok(d) => d.limits.first().is_some_and(|m| !m.ok),
            // The tracker is full: as beyond the budget.
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_gets_its_budget_of_new_keys_and_keeps_the_ones_it_used() {
        let b = KeyBudget::new(NewKeyBudget {
            count: 3,
            window_us: 60_000_000,
        });
        for k in ["a", "b", "c"] {
            assert!(b.admit("10.0.0.1", k), "{k}");
        }
        assert!(
            !b.admit("10.0.0.1", "d"),
            "a fourth new key is over the budget"
        );
        assert!(b.admit("10.0.0.1", "a"), "a key used in the window is free");
        assert!(b.admit("10.0.0.1", "b"));
        assert!(!b.admit("10.0.0.1", "e"));
        assert!(b.admit("10.0.0.2", "d"), "budgets are per address");
    }

    #[test]
    fn a_full_tracker_counts_new_keys_on_the_address() {
        let b = KeyBudget::with_clock(
            NewKeyBudget {
                count: 1_000,
                window_us: 60_000_000,
            },
            SystemClock,
            1_000,
        );
        let admitted = (0..5_000)
            .filter(|i| b.admit(&format!("10.0.{}.{}", i / 256, i % 256), "k"))
            .count();
        assert!(admitted < 1_000, "{admitted}");
    }
}
