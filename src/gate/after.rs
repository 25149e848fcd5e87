//! What follows an admission, until the request ends: usage charged from the response
//! (`settle`), concurrency leases renewed while it streams (`renewal`) and released at its end
//! (`release`), and leases a failed decision may have left in the store (`forget_leases`).

use super::Gate;
use crate::clock::Clock;
use crate::config::Charge;
use crate::draw::Draw;
use crate::held::{Held, Lease};
use crate::limiter::bucket::clamp_charge;
use crate::limiter::{Bucket, BucketParams, Decision, LimitState, Limiter, LimiterError};
use std::future::Future;
use std::time::Instant;

impl<L: Limiter, C: Clock + Clone> Gate<L, C> {
    /// Charges what `used` reports for each charge still owed that it can tell (`used(charge)`:
    /// `Some(Some(n))` used n, `Some(None)` did not say, `None` not known yet).
    /// Returns the enforced limits' buckets after their charges (the route's limit index, its
    /// state), for the response headers when they have not gone out yet.
    pub async fn settle(
        &self,
        held: &mut Held,
        mut used: impl FnMut(&Charge) -> Option<Option<u64>>,
    ) -> Vec<(usize, LimitState)> {
        let mut after = Vec::new();
        for owed in held.owed.iter_mut().filter(|o| !o.settled) {
            let Some(reported) = used(&owed.charge) else {
                continue;
            };
            owed.settled = true;
            let Some(amount) = owed.amount(reported) else {
                owed.count(reported);
                continue;
            };
            let amount = clamp_charge(&owed.params, amount);
            let bucket = [Bucket {
                key: &owed.key,
                params: owed.params,
            }];
            let charged = match owed.local {
                true => self.fallback.charge_now(&bucket, &[amount]),
                false => self.limiter.charge(&bucket, &[amount]).await,
            };
            match charged {
                Ok(d) => {
                    // Only enforced limits are answered from the cache.
                    if let (Some(cache), false, true) =
                        (&self.deny_cache, owed.local, owed.enforced)
                    {
                        let keys = [owed.key.clone()];
                        cache.note(&keys, &[owed.params], &d, self.clock.now_us(), None);
                    }
                    if let (true, Some(&state)) = (owed.enforced, d.limits.first()) {
                        after.push((owed.limit, state));
                    }
                }
                // The up-front cost stands; the store's error counter says why.
                Err(e) => log::debug!("usage of {} not charged: {e}", owed.key),
            }
            owed.count(reported);
        }
        after
    }

    /// A decision that failed after reaching the store (a timeout, a dropped connection) may
    /// have taken its leases there all the same: they are given back, in the background and at
    /// best (whatever is left expires after `lease_ms`).
    pub(super) fn forget_leases(&self, draw: &Draw, result: &Result<Decision, LimiterError>) {
        let reached = matches!(result, Err(e) if !matches!(e, LimiterError::Unavailable));
        if !(reached && draw.leases()) {
            return;
        }
        let leases: Vec<(String, BucketParams)> = draw
            .buckets()
            .iter()
            .filter(|b| b.params.is_lease())
            .map(|b| (b.key.to_string(), b.params))
            .collect();
        let limiter = self.limiter.clone();
        tokio::spawn(async move {
            let _ = limiter.release(&borrowed(&leases)).await;
        });
    }

    /// While a request holding leases is still in flight (its body moving), renews them once a
    /// third of their `lease_ms` has passed since they were taken or last renewed: a stream may
    /// run for longer than a lease lasts. The store's part is returned to run in the background.
    pub fn renewal(&self, held: &mut Held) -> Option<impl Future<Output = ()> + Send + 'static> {
        if !held.renewal_due(Instant::now()) {
            return None;
        }
        let local: Vec<Bucket<'_>> = held.local.iter().map(Lease::bucket).collect();
        self.fallback.renew_now(&local);
        let leases: Vec<(String, BucketParams)> = held.store.iter().map(Lease::owned).collect();
        let limiter = self.limiter.clone();
        (!leases.is_empty()).then_some(async move {
            if let Err(e) = limiter.renew(&borrowed(&leases)).await {
                log::debug!("leases not renewed (they expire after lease_ms): {e}");
            }
        })
    }

    /// Ends the leases a request held (`admit`): called when its response is done, or when it
    /// was aborted or its client went away. A store that cannot be told lets them expire.
    pub async fn release(&self, held: &mut Held) {
        let (store, local) = (
            std::mem::take(&mut held.store),
            std::mem::take(&mut held.local),
        );
        let held = Held {
            store,
            local,
            ..Held::default()
        };
        if !held.store.is_empty() {
            let buckets: Vec<Bucket<'_>> = held.store.iter().map(Lease::bucket).collect();
            if let Err(e) = self.limiter.release(&buckets).await {
                log::debug!("leases not released (they expire by themselves): {e}");
            }
        }
        let local: Vec<Bucket<'_>> = held.local.iter().map(Lease::bucket).collect();
        self.fallback.give_back(&local);
        for lease in held.store.iter().chain(&held.local) {
            if let Some(gauge) = &lease.gauge {
                gauge.dec();
            }
        }
    }
}

/// Buckets for leases a background task owns.
fn borrowed(leases: &[(String, BucketParams)]) -> Vec<Bucket<'_>> {
    leases
        .iter()
        .map(|(key, params)| Bucket {
            key,
            params: *params,
        })
        .collect()
}
