//! The keys a route refuses most, over the last 1, 5 or 15 minutes, in fixed memory: the admin
//! API's `/v1/top`, for "who is being limited right now" (Prometheus labels must stay bounded, so
//! no client key is ever a metric).
//!
//! Each minute has a Space-Saving sketch (Metwally, Agrawal, El Abbadi, 2005) of [`SLOTS`] keys per
//! worker thread: a refused key is counted where it is, or takes a free slot, or replaces the
//! least-counted key and inherits its count as its error. A key's count is then never below its
//! true count and above it by at most its `error`, itself at most the sketch's refusals /
//! [`SLOTS`]; so every key refused more often than that in a minute is in that minute's sketch.
//! A window adds its sketches up as such summaries merge (a full sketch's least count is added to
//! a key it does not hold), so the bound holds for the sum. Allowed requests are counted only for
//! keys already there (one map lookup): a key's allowed count is a lower bound.
//!
//! Each worker thread writes its own shard (no lock shared by all threads, and no Redis call);
//! `/v1/top` locks each shard briefly to read it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Keys per sketch (one minute of one thread).
pub const SLOTS: usize = 64;
/// Keys reported at most.
pub const TOP: usize = 50;
/// Minutes kept: the longest window's whole minutes, and the one under way.
const MINUTES: usize = 16;
/// Shards: worker threads beyond this share one.
const SHARDS: usize = 16;

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's shard, the same for every route.
    static SHARD: usize = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
}

/// One route's sketches.
pub struct TopKeys {
    shards: Vec<Mutex<Minutes>>,
}

/// The last [`MINUTES`] minutes of one shard, in a ring by minute number.
#[derive(Default)]
struct Minutes {
    /// The minute each slot holds (0: none yet).
    minute: [u64; MINUTES],
    sketch: [Sketch; MINUTES],
}

#[derive(Default)]
struct Sketch {
    counts: HashMap<Box<str>, Counts>,
    /// Refusals counted in this sketch.
    refusals: u64,
}

/// One key's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Never below the true count; above it by at most `error`.
    pub refused: u64,
    /// Counted while the key was in the sketch: a lower bound.
    pub allowed: u64,
    pub error: u64,
}

/// One line of `/v1/top`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranked {
    pub key: String,
    pub counts: Counts,
}

impl Default for TopKeys {
    fn default() -> TopKeys {
        TopKeys {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl Minutes {
    /// The sketch of `minute`, emptied first when its slot held an older one.
    fn at(&mut self, minute: u64) -> &mut Sketch {
        let i = (minute % MINUTES as u64) as usize;
        if self.minute[i] != minute {
            self.minute[i] = minute;
            self.sketch[i] = Sketch::default();
        }
        &mut self.sketch[i]
    }
}

impl TopKeys {
    fn shard(&self) -> std::sync::MutexGuard<'_, Minutes> {
        let i = SHARD.with(|s| *s);
        // Plain counters: a panic elsewhere cannot leave them half-written.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `key` was refused at `now_us`.
    pub fn refused(&self, key: &str, now_us: u64) {
        let mut shard = self.shard();
        let sketch = shard.at(minute(now_us));
        sketch.refusals += 1;
        if let Some(c) = sketch.counts.get_mut(key) {
            c.refused += 1;
            return;
        }
        let mut entry = Counts {
            refused: 1,
            ..Counts::default()
        };
        if sketch.counts.len() >= SLOTS {
            let least = sketch
                .counts
                .iter()
                .min_by_key(|(_, c)| c.refused)
                .map(|(k, c)| (k.clone(), *c));
            if let Some((k, c)) = least {
                sketch.counts.remove(&k);
                entry.refused = c.refused + 1;
                entry.error = c.refused;
            }
        }
        sketch.counts.insert(key.into(), entry);
    }

    /// `key` was allowed at `now_us`: counted only if it is being tracked this minute.
    pub fn allowed(&self, key: &str, now_us: u64) {
        let mut shard = self.shard();
        let counts = &mut shard.at(minute(now_us)).counts;
        // Most minutes refuse nobody: then no key is hashed at all.
        if counts.is_empty() {
            return;
        }
        if let Some(c) = counts.get_mut(key) {
            c.allowed += 1;
        }
    }

    /// The keys refused most over the last `minutes` whole minutes (1 to 15) and the one under
    /// way at `now_us`, most first, and the refusals counted in that window.
    ///
    /// Sketches add up as Space-Saving summaries merge: a key one full sketch no longer holds may
    /// have had up to that sketch's least count there, so that much is added to its count and to
    /// its error, which keeps every count an upper bound.
    pub fn top(&self, minutes: u64, now_us: u64) -> (Vec<Ranked>, u64) {
        let now = minute(now_us);
        let from = now.saturating_sub(minutes.clamp(1, MINUTES as u64 - 1));
        let mut total: HashMap<Box<str>, (Counts, u64)> = HashMap::new();
        let mut refusals = 0;
        // The least counts of the full sketches in the window, added up.
        let mut floors = 0;
        for shard in &self.shards {
            let shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            for (m, sketch) in shard.minute.iter().zip(&shard.sketch) {
                if *m < from || *m > now || *m == 0 {
                    continue;
                }
                refusals += sketch.refusals;
                let floor = if sketch.counts.len() >= SLOTS {
                    sketch.counts.values().map(|c| c.refused).min().unwrap_or(0)
                } else {
                    0
                };
                floors += floor;
                for (k, c) in &sketch.counts {
                    let (t, seen_floors) = total.entry(k.clone()).or_default();
                    t.refused += c.refused;
                    t.allowed += c.allowed;
                    t.error += c.error;
                    *seen_floors += floor;
                }
            }
        }
        let mut ranked: Vec<Ranked> = total
            .into_iter()
            .map(|(key, (mut counts, seen_floors))| {
                let unseen = floors - seen_floors;
                counts.refused += unseen;
                counts.error += unseen;
                Ranked {
                    key: key.into(),
                    counts,
                }
            })
            .collect();
        ranked.sort_by(|a, b| {
            b.counts
                .refused
                .cmp(&a.counts.refused)
                .then_with(|| a.key.cmp(&b.key))
        });
        ranked.truncate(TOP);
        (ranked, refusals)
    }
}

fn minute(now_us: u64) -> u64 {
    now_us / 60_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_800_000_000_000_000;

    #[test]
    fn heavy_hitters_rank_first_with_their_allowed_counts() {
        let top = TopKeys::default();
        for i in 0..20 {
            top.allowed(&format!("normal{i}"), T);
            top.refused(&format!("normal{i}"), T);
        }
        for (key, n) in [("a", 300), ("b", 200), ("c", 100)] {
            for _ in 0..n {
                top.refused(key, T);
            }
            top.allowed(key, T);
        }
        let (ranked, refusals) = top.top(1, T);
        assert_eq!(refusals, 620);
        let keys: Vec<&str> = ranked.iter().take(3).map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert_eq!(ranked[0].counts.refused, 300);
        assert_eq!(ranked[0].counts.allowed, 1);
        assert_eq!(ranked.len(), 23);
    }

    #[test]
    fn counts_stay_within_the_bound_when_keys_outnumber_the_slots() {
        let top = TopKeys::default();
        // A heavy key among 1,000 that each appear twice.
        for round in 0..2 {
            for i in 0..1000 {
                top.refused(&format!("k{i}"), T);
                if i % 10 == 0 {
                    top.refused("heavy", T + round);
                }
            }
        }
        let (ranked, refusals) = top.top(1, T);
        assert_eq!(refusals, 2200);
        let heavy = ranked.iter().find(|r| r.key == "heavy").expect("found");
        assert!(heavy.counts.refused >= 200);
        assert!(heavy.counts.refused - heavy.counts.error <= 200);
        assert!(heavy.counts.error <= refusals / SLOTS as u64);
        assert!(ranked.len() <= TOP);
    }

    #[test]
    fn a_key_one_shard_dropped_is_still_counted_from_above() {
        let top = TopKeys::default();
        // One thread (shard) sees the victim once, then enough other keys to push it out of its
        // sketch.
        let push_out = |top: &TopKeys| {
            top.refused("victim", T);
            for i in 0..SLOTS {
                top.refused(&format!("other{i}"), T);
                top.refused(&format!("other{i}"), T);
            }
        };
        std::thread::scope(|s| {
            s.spawn(|| push_out(&top));
        });
        // Another thread (shard) sees it five times.
        std::thread::scope(|s| {
            s.spawn(|| (0..5).for_each(|_| top.refused("victim", T)));
        });
        let (ranked, _) = top.top(1, T);
        let victim = ranked.iter().find(|r| r.key == "victim").expect("listed");
        assert!(victim.counts.refused >= 6, "{victim:?}");
        assert!(
            victim.counts.refused - victim.counts.error <= 6,
            "{victim:?}"
        );
    }

    #[test]
    fn windows_hold_their_minutes_only() {
        let top = TopKeys::default();
        let minute = 60_000_000;
        top.refused("old", T - 20 * minute);
        top.refused("four", T - 4 * minute);
        top.refused("now", T);
        top.refused("last", T - minute);
        let keys = |m| -> Vec<String> { top.top(m, T).0.into_iter().map(|r| r.key).collect() };
        // A window is its whole minutes and the one under way: a refusal a second before the
        // minute turned is still in the last minute's.
        assert_eq!(keys(1), ["last", "now"]);
        assert_eq!(keys(5), ["four", "last", "now"]);
        assert_eq!(keys(15), ["four", "last", "now"]);
    }
}
