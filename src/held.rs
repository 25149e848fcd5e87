//! What an admitted request holds until it ends, and what it owes once its response is known:
//! its concurrency leases (released in the logging phase, `Gate::release`), and the usage its
//! limits with `charge_from_response` charge beyond the up-front cost (`Gate::settle`).

use crate::config::{Charge, Term};
use crate::draw::Draw;
use crate::limiter::{Bucket, BucketParams, Kind};
use crate::plan::RoutePlan;
use prometheus::{IntCounter, IntGauge};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A request's leases and charges, in the store or (failing over locally) in the fallback.
#[derive(Default)]
pub struct Held {
    pub(crate) store: Vec<Lease>,
    pub(crate) local: Vec<Lease>,
    pub(crate) owed: Vec<Owed>,
    /// When the leases were taken or last renewed.
    pub(crate) renewed: Option<Instant>,
}

impl Held {
    /// Whether the leases are a third of their shortest life old since they were taken or last
    /// renewed; if so they count as renewed from `now`.
    pub(crate) fn renewal_due(&mut self, now: Instant) -> bool {
        let shortest = self
            .store
            .iter()
            .chain(&self.local)
            .filter_map(|l| match l.params.kind {
                Kind::Leases { ms, .. } => Some(ms),
                _ => None,
            })
            .min();
        let Some(shortest) = shortest else {
            return false;
        };
        let since = *self.renewed.get_or_insert(now);
        if now.duration_since(since) < Duration::from_millis(shortest / 3) {
            return false;
        }
        self.renewed = Some(now);
        true
    }

    /// A copy of its leases alone, to renew them from elsewhere (the relay's outer leg, while
    /// the request waits on its upstream); it releases nothing and moves no gauge.
    pub fn lease_copy(&self) -> Held {
        let copy = |leases: &[Lease]| -> Vec<Lease> {
            leases
                .iter()
                .map(|l| Lease {
                    key: l.key.clone(),
                    params: l.params,
                    gauge: None,
                })
                .collect()
        };
        Held {
            store: copy(&self.store),
            local: copy(&self.local),
            owed: Vec::new(),
            renewed: self.renewed,
        }
    }

    /// Whether it holds any lease.
    pub fn leases(&self) -> bool {
        !(self.store.is_empty() && self.local.is_empty())
    }

    /// Whether a charge like this is still to settle.
    pub fn owes(&self, charge: impl Fn(&Charge) -> bool) -> bool {
        self.owed.iter().any(|o| !o.settled && charge(&o.charge))
    }

    /// The terms of the charges still to settle.
    pub fn terms(&self) -> impl Iterator<Item = &Term> {
        self.owed
            .iter()
            .filter(|o| !o.settled)
            .flat_map(|o| &o.charge.terms)
    }

    /// The charges owed by `draw`'s buckets, which were just granted to a request that goes on
    /// to the upstream; `enforced`: the client is told about these limits.
    pub(crate) fn owe(&mut self, route: &RoutePlan, draw: &Draw, local: bool, enforced: bool) {
        let params = if local { &draw.local } else { &draw.params };
        for ((key, p), &i) in draw.keys.iter().zip(params).zip(&draw.limits) {
            let Some(limit) = route.limits.get(i) else {
                continue;
            };
            if let Some(charge) = &limit.charge {
                self.owed.push(Owed {
                    key: key.clone(),
                    params: *p,
                    // Drawn beyond the limit's own cost: the request's reservation.
                    reserved: p.cost.saturating_sub(match local {
                        true => limit.local.cost,
                        false => limit.params.cost,
                    }),
                    limit: i,
                    charge: charge.clone(),
                    local,
                    enforced,
                    settled: false,
                    counters: limit.usage.clone(),
                });
            }
        }
    }

    /// The leases among `draw`'s buckets, which were just granted (whatever becomes of the
    /// request: they are the store's until released).
    pub(crate) fn lease(&mut self, route: &RoutePlan, draw: &Draw, local: bool) {
        let params = if local { &draw.local } else { &draw.params };
        for ((key, p), &i) in draw.keys.iter().zip(params).zip(&draw.limits) {
            if !p.is_lease() {
                continue;
            }
            let gauge = route.limits.get(i).and_then(|l| l.inflight.clone());
            if let Some(g) = &gauge {
                g.inc();
            }
            let lease = Lease {
                key: key.clone(),
                params: p.with_lease(draw.lease),
                gauge,
            };
            match local {
                true => self.local.push(lease),
                false => self.store.push(lease),
            }
            self.renewed.get_or_insert_with(Instant::now);
        }
    }
}

pub(crate) struct Lease {
    key: String,
    params: BucketParams,
    pub(crate) gauge: Option<IntGauge>,
}

impl Lease {
    pub(crate) fn owned(&self) -> (String, BucketParams) {
        (self.key.clone(), self.params)
    }

    pub(crate) fn bucket(&self) -> Bucket<'_> {
        Bucket {
            key: &self.key,
            params: self.params,
        }
    }
}

/// A limit to charge once the response reports what the request used.
pub(crate) struct Owed {
    pub(crate) key: String,
    /// The limit's, with what was drawn up front as its `cost`: the limit's own and `reserved`.
    pub(crate) params: BucketParams,
    /// What the request reserved beside the limit's cost (`reserve`), settled by its usage.
    pub(crate) reserved: u64,
    /// The route's index of the limit.
    pub(crate) limit: usize,
    pub(crate) charge: Charge,
    pub(crate) local: bool,
    pub(crate) enforced: bool,
    pub(crate) settled: bool,
    /// `ratelimit_usage_charged_total`, `ratelimit_usage_unreported_total`.
    pub(crate) counters: Option<(IntCounter, IntCounter)>,
}

impl Owed {
    /// What is left to charge when the response reported `used` (`None`: it did not say; what
    /// was drawn up front stands). The limit is charged `used` in all, but never less than its
    /// own cost unless it refunds the unused part: the reservation is always settled.
    pub(crate) fn amount(&self, used: Option<u64>) -> Option<i64> {
        let used = used?;
        let own = self.params.cost.saturating_sub(self.reserved);
        let total = match self.charge.refund_unused {
            true => used,
            false => used.max(own),
        };
        let more = i128::from(total) - i128::from(self.params.cost);
        let more = more.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        (more != 0).then_some(more)
    }

    /// Counts the settlement (`ratelimit_usage_charged_total`, or `..._unreported_total`): once
    /// it is written, so that a reader of the counter finds the bucket charged.
    pub(crate) fn count(&self, used: Option<u64>) {
        match (&self.counters, used) {
            // Never wrapping: an absurd usage counts as what the stores hold exactly (2^53),
            // and the counter stops at its top.
            (Some((charged, _)), Some(used)) => {
                charged.inc_by(used.min(1 << 53).min(u64::MAX - charged.get()))
            }
            (Some((_, unreported)), None) => unreported.inc(),
            (None, _) => {}
        }
    }
}

/// Lease ids unique across a fleet: this process's random start, then one after another.
pub(crate) struct LeaseIds(AtomicU64);

impl LeaseIds {
    pub(crate) fn new() -> LeaseIds {
        use std::hash::{BuildHasher, Hasher};
        // Seeded by the OS's randomness (std's hasher keys); the time and the process id keep
        // two processes apart even if it were not.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        LeaseIds(AtomicU64::new(h.finish()))
    }

    pub(crate) fn next(&self) -> u64 {
        // Ids travel as decimal text and never 0 (the plan's placeholder).
        self.0.fetch_add(1, Ordering::Relaxed).max(1)
    }
}
