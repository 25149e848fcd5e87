//! The token-bucket arithmetic of `lua/token_bucket.lua`, step for step, in Rust integers.
//!
//! The in-memory store runs it; the tests hold the Lua script to it. Any change here is a change
//! to the script and the other way round.

use super::{BucketParams, Decision, Kind, LimitState};

/// A stored bucket: `v` units of `1/scale` token held as of microsecond `t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    pub v: u64,
    pub t: u64,
    /// The scale `v` was written in (a quota: its amount, `BucketParams::unit`); a reload may
    /// have changed the limit since.
    pub scale: u64,
}

impl State {
    /// The microsecond at which this bucket is full again: from then on it is the same as no state
    /// at all, so it may be forgotten (Redis: PEXPIRE).
    pub fn full_at(&self, p: &BucketParams) -> u64 {
        self.t + until(p, self.t, self.rescaled(p), p.capacity * p.scale)
    }

    /// `v` in `p`'s units: the tokens held carry over a limit change, rounded down, and never
    /// exceed the capacity (a shrunk limit must not keep the old burst).
    fn rescaled(&self, p: &BucketParams) -> u64 {
        let cap = p.capacity * p.scale;
        if let Kind::Quota(_) = p.kind {
            // A quota counts what was used: under another amount, the used part stays used (a
            // plan raised mid-month gives the difference at once, a lowered one never more).
            if self.scale == p.capacity || self.scale == 0 {
                return self.v.min(cap);
            }
            return cap.saturating_sub(self.scale.saturating_sub(self.v));
        }
        if self.scale == p.scale || self.scale == 0 {
            return self.v.min(cap);
        }
        // Capped before it is narrowed: converted to a much finer scale, a bucket can hold more
        // than u64 counts (it is full then), and `as u64` would keep only the low bits.
        let v = u128::from(self.v) * u128::from(p.scale) / u128::from(self.scale);
        v.min(u128::from(cap)) as u64
    }
}

/// A concurrency limit's answer to "when": a lease comes back when a request ends, which nobody
/// can tell in advance; a client is asked to retry in a second.
pub const LEASE_RETRY_US: u64 = 1_000_000;

/// Microseconds from instant `t`, when the bucket holds `held` units, until it holds `want`: at
/// the refill's pace, at the next boundary for a quota (which is whole again then).
fn until(p: &BucketParams, t: u64, held: u64, want: u64) -> u64 {
    if held >= want {
        return 0;
    }
    match p.kind {
        Kind::Bucket => (want - held).div_ceil(p.num),
        Kind::Quota(period) => period.end(t) - t,
        Kind::Leases { .. } => LEASE_RETRY_US,
    }
}

/// `s` refilled up to `now`, in `p`'s units. A clock behind the stored instant refills nothing and
/// never moves `t` back (another proxy's clock was ahead), so skew cannot credit an interval twice.
fn refill(now: u64, p: &BucketParams, s: Option<State>) -> State {
    let cap = p.capacity * p.scale;
    let (mut held, mut at) = s.map_or((cap, now), |s| (s.rescaled(p), s.t));
    if now > at {
        let missing = cap.saturating_sub(held);
        match p.kind {
            // A quota is whole again once `now` is in a later period than its instant.
            Kind::Quota(period) if missing > 0 && period.start(now) > at => held = cap,
            // Leases come back by release or expiry, which the store counts, not by time here.
            Kind::Quota(_) | Kind::Leases { .. } => {}
            Kind::Bucket if missing > 0 => {
                let gained = u128::from(now - at) * u128::from(p.num);
                held = if gained >= u128::from(missing) {
                    cap
                } else {
                    held + gained as u64
                };
            }
            Kind::Bucket => {}
        }
        at = now;
    }
    State {
        v: held,
        t: at,
        scale: p.unit(),
    }
}

/// What one bucket reports at `now`, holding `s.v` units: after the request when it was allowed,
/// untouched when not. `ok`: it held the request's cost.
pub fn report(now: u64, p: &BucketParams, s: &State, ok: bool) -> LimitState {
    let cap = p.capacity * p.scale;
    let cost = p.cost * p.scale;
    let whole = s.v / p.scale;
    // From `now` until the bucket holds `want` units.
    let wait = |want: u64| match p.kind {
        // A bucket written ahead (in debt, or by a clock ahead) refills only from its instant.
        Kind::Bucket if s.v < want => s.t.saturating_sub(now) + (want - s.v).div_ceil(p.num),
        Kind::Bucket => 0,
        // The boundary after the bucket's instant, which is ahead of `now` under skew.
        Kind::Quota(period) if s.v < want => period.end(s.t.max(now)) - now,
        Kind::Leases { .. } if s.v < want => LEASE_RETRY_US,
        Kind::Quota(_) | Kind::Leases { .. } => 0,
    };
    let wait_us = if !ok {
        wait(cost)
    } else if s.v < cap {
        wait((whole + 1) * p.scale)
    } else {
        0
    };
    LimitState {
        ok,
        remaining: whole,
        reset_us: wait(cap),
        wait_us,
        held: s.v,
        lag_us: s.t.saturating_sub(now),
    }
}

/// Evaluates one request at `now`. `states[i]` is limit i's stored state (`None`: never seen or
/// expired, a full bucket). When allowed, every state is replaced by its new value; when not,
/// nothing changes.
pub fn evaluate(now: u64, params: &[BucketParams], states: &mut [Option<State>]) -> Decision {
    debug_assert_eq!(params.len(), states.len());
    let mut refilled: Vec<State> = params
        .iter()
        .zip(states.iter())
        .map(|(p, s)| refill(now, p, *s))
        .collect();
    let decision = take(now, params, &mut refilled);
    if decision.allowed {
        for (slot, s) in states.iter_mut().zip(refilled) {
            *slot = Some(s);
        }
    }
    decision
}

/// Charges `amounts` (whole tokens, one per bucket) at `now`, whatever the buckets hold: what a
/// response reported using beyond its up-front cost (`charge_from_response`). Every state is
/// replaced. A negative amount gives tokens back (`refund_unused`), up to the capacity.
///
/// A bucket charged more than it holds goes into debt without a negative number: it is left
/// empty with its instant moved ahead by the time the refill takes to pay the rest, from which it
/// refills as a negative balance would (rounded up to the microsecond, never in the client's
/// favour). Every version reads such a state (it is what a proxy clock running ahead writes), so
/// fleets mixing versions stay exact. A quota has no refill to pay a debt with: it is left empty
/// until its boundary, and the rest is forgiven.
pub fn charge(
    now: u64,
    params: &[BucketParams],
    amounts: &[i64],
    states: &mut [Option<State>],
) -> Decision {
    let limits = params
        .iter()
        .zip(amounts)
        .zip(states.iter_mut())
        .map(|((p, &amount), slot)| {
            let mut s = refill(now, p, *slot);
            debit(now, p, &mut s, amount);
            *slot = Some(s);
            report(now, p, &s, true)
        })
        .collect();
    Decision {
        allowed: true,
        limits,
    }
}

/// `amount` as far as the stores' numbers stay exact (a Lua double holds integers to 2^53): a
/// response that reports an absurd usage leaves its key in debt for centuries, never wraps.
pub fn clamp_charge(p: &BucketParams, amount: i64) -> i64 {
    const EXACT: u64 = 1 << 53;
    let most = (EXACT.saturating_sub(p.capacity * p.scale) / p.scale.max(1) / 2) as i64;
    amount.clamp(-most, most)
}

/// How far ahead of `now` a debt can move a bucket's instant: a century, which keeps every
/// instant an exact integer in Lua however often a key is charged.
pub const DEBT_HORIZON_US: u64 = 100 * 365 * 86_400_000_000;

/// `amount` whole tokens taken from (or, negative, given back to) the refilled bucket `s`.
fn debit(now: u64, p: &BucketParams, s: &mut State, amount: i64) {
    let cap = p.capacity * p.scale;
    let units = amount.unsigned_abs() * p.scale;
    if amount < 0 {
        s.v = (s.v + units).min(cap);
    } else if s.v >= units {
        s.v -= units;
    } else {
        let owed = units - s.v;
        s.v = 0;
        if p.kind == Kind::Bucket {
            s.t = (s.t + owed.div_ceil(p.num)).min(now + DEBT_HORIZON_US);
        }
    }
}

/// What a request at `now` would be told by buckets last seen as `states`, which are not changed:
/// how a remembered denial is answered again. Only a denial means anything here; `allowed` says
/// that the buckets may hold enough again, which only the store can tell.
pub fn peek(now: u64, params: &[BucketParams], states: &[State]) -> Decision {
    // Refilled twice rather than kept: a remembered denial is answered on every request of a
    // hammering client, and this way with one allocation (the reply's), not two.
    let refilled = || {
        params
            .iter()
            .zip(states)
            .map(|(p, s)| (p, refill(now, p, Some(*s))))
    };
    let allowed = refilled().all(|(p, s)| s.v >= p.cost * p.scale);
    let limits = refilled()
        .map(|(p, s)| report(now, p, &s, s.v >= p.cost * p.scale))
        .collect();
    Decision { allowed, limits }
}

/// Takes every cost from the refilled buckets, or none.
fn take(now: u64, params: &[BucketParams], refilled: &mut [State]) -> Decision {
    let allowed = params
        .iter()
        .zip(refilled.iter())
        .all(|(p, s)| s.v >= p.cost * p.scale);
    let limits = params
        .iter()
        .zip(refilled.iter_mut())
        .map(|(p, s)| {
            let ok = s.v >= p.cost * p.scale;
            if allowed {
                s.v -= p.cost * p.scale;
            }
            report(now, p, s, ok)
        })
        .collect();
    Decision { allowed, limits }
}

/// The microsecond at which every bucket holds its cost again (`now` when they all do):
/// until then a request like this one is denied, whatever other proxies do.
pub fn denied_until(now: u64, params: &[BucketParams], states: &[State]) -> u64 {
    params
        .iter()
        .zip(states)
        .map(|(p, s)| {
            let s = refill(now, p, Some(*s));
            s.t + until(p, s.t, s.v, p.cost * p.scale)
        })
        .max()
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// capacity 3, 1 token/s, cost 1
    const P: BucketParams = BucketParams {
        capacity: 3,
        scale: 1_000_000,
        num: 1,
        cost: 1,
        kind: Kind::Bucket,
    };

    /// 143,688,200,674 tokens at 1000000/s (scale 1) reloaded to capacity 104,249 at 1/d (scale
    /// 86,400,000,000): 1.2 × 10^22 units, more than u64 counts, and full. Found by the
    /// differential proof: narrowed before it was capped, the bucket came out 0.15 token short.
    #[test]
    fn a_reload_to_a_much_finer_scale_caps_before_it_narrows() {
        let daily = BucketParams {
            capacity: 104_249,
            scale: 86_400_000_000,
            num: 1,
            cost: 1,
            kind: Kind::Bucket,
        };
        let s = State {
            v: 143_688_200_674,
            t: 0,
            scale: 1,
        };
        assert_eq!(s.rescaled(&daily), 104_249 * 86_400_000_000);
    }

    #[test]
    fn burst_then_reject_then_exact_refill() {
        let mut s = [None];
        for left in [2, 1, 0] {
            let d = evaluate(0, &[P], &mut s);
            assert!(d.allowed);
            assert_eq!(d.limits[0].remaining, left);
        }
        let d = evaluate(0, &[P], &mut s);
        assert!(!d.allowed);
        assert_eq!(
            d.limits[0],
            LimitState {
                ok: false,
                remaining: 0,
                reset_us: 3_000_000,
                wait_us: 1_000_000,
                held: 0,
                lag_us: 0,
            }
        );
        // 999,999 µs later: still not a whole token.
        assert!(!evaluate(999_999, &[P], &mut s).allowed);
        let d = evaluate(1_000_000, &[P], &mut s);
        assert!(d.allowed);
        assert_eq!(
            d.limits[0],
            LimitState {
                ok: true,
                remaining: 0,
                reset_us: 3_000_000,
                wait_us: 1_000_000,
                held: 0,
                lag_us: 0,
            }
        );
    }

    #[test]
    fn all_or_nothing() {
        let big = BucketParams { capacity: 10, ..P };
        let mut s = [
            None,
            Some(State {
                v: 0,
                t: 0,
                scale: P.scale,
            }),
        ];
        let d = evaluate(0, &[big, P], &mut s);
        assert!(!d.allowed);
        assert!(d.limits[0].ok && !d.limits[1].ok);
        assert_eq!(s[0], None, "a rejected request takes nothing");
        assert_eq!(d.binding(), Some(1));
        assert_eq!(d.retry_after_us(), 1_000_000);
    }

    #[test]
    fn skewed_clock_never_credits_twice() {
        let mut s = [Some(State {
            v: 0,
            t: 5_000_000,
            scale: P.scale,
        })];
        assert!(!evaluate(4_000_000, &[P], &mut s).allowed);
        assert_eq!(
            s[0],
            Some(State {
                v: 0,
                t: 5_000_000,
                scale: P.scale
            })
        );
    }

    #[test]
    fn a_changed_limit_keeps_the_tokens_held_within_the_new_capacity() {
        // 3 of 10 tokens left at 1 token/s; the limit becomes 5 tokens at 10 tokens/s.
        let old = BucketParams { capacity: 10, ..P };
        let mut s = [Some(State {
            v: 3_000_000,
            t: 0,
            scale: old.scale,
        })];
        let new = BucketParams {
            capacity: 5,
            scale: 100_000,
            num: 1,
            cost: 1,
            kind: Kind::Bucket,
        };
        let d = evaluate(0, &[new], &mut s);
        assert_eq!(d.limits[0].remaining, 2, "3 tokens carried over, 1 spent");
        // Shrunk below what was held: clamped to the new capacity.
        let mut s = [Some(State {
            v: 9_000_000,
            t: 0,
            scale: old.scale,
        })];
        assert_eq!(evaluate(0, &[new], &mut s).limits[0].remaining, 4);
    }

    #[test]
    fn long_idle_saturates_without_overflow() {
        let fast = BucketParams {
            capacity: 1_000_000_000,
            scale: 1,
            num: 1,
            cost: 1,
            kind: Kind::Bucket,
        };
        let mut s = [Some(State {
            v: 0,
            t: 0,
            scale: 1,
        })];
        let d = evaluate(u64::MAX / 2, &[fast], &mut s);
        assert_eq!(d.limits[0].remaining, 999_999_999);
        assert_eq!(s[0].unwrap().full_at(&fast), u64::MAX / 2 + 1);
    }

    #[test]
    fn a_charge_beyond_the_balance_is_a_debt_the_refill_pays_first() {
        let p = BucketParams { capacity: 10, ..P };
        let mut s = [None];
        // Full (10), charged 15: 5 owed, paid by 5 s of refill before a token shows.
        let d = charge(0, &[p], &[15], &mut s);
        assert_eq!((d.limits[0].remaining, d.limits[0].lag_us), (0, 5_000_000));
        assert!(!evaluate(5_999_999, &[p], &mut s).allowed);
        let d = evaluate(6_000_000, &[p], &mut s);
        assert!(
            d.allowed,
            "a token 6 s on: 5 s of debt, then one second's refill"
        );
        // Refunds top up, never past the capacity.
        let d = charge(6_000_000, &[p], &[-3], &mut s);
        assert_eq!(d.limits[0].remaining, 3);
        assert_eq!(
            charge(6_000_000, &[p], &[-30], &mut s).limits[0].remaining,
            10
        );
    }

    #[test]
    fn a_quota_keeps_what_was_used_when_its_amount_changes() {
        let five = BucketParams::quota(5, crate::calendar::Period::Day, 1);
        let mut s = [None];
        for _ in 0..3 {
            assert!(evaluate(0, &[five], &mut s).allowed);
        }
        // 3 used: raised to 10, 7 are left; lowered to 4, 1 is.
        let ten = BucketParams {
            capacity: 10,
            ..five
        };
        assert_eq!(evaluate(1, &[ten], &mut s.clone()).limits[0].remaining, 6);
        let four = BucketParams {
            capacity: 4,
            ..five
        };
        let d = evaluate(1, &[four], &mut s);
        assert_eq!(d.limits[0].remaining, 0, "the last one taken");
        assert!(!evaluate(2, &[four], &mut s).allowed);
    }
}
