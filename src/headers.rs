//! What clients see of a decision: the rate-limit response headers (a refusal's body is
//! `refusal`'s).
//!
//! Two vocabularies, because clients know both: the de-facto `X-RateLimit-*` trio, and the IETF
//! fields of draft-ietf-httpapi-ratelimit-headers-10 (`RateLimit-Policy` lists every limit of the
//! route; `RateLimit` reports the binding one, see `Decision::binding`). Fail-open responses carry
//! none of them: the proxy does not know the state then.

use crate::calendar::{self, Period};
use crate::clock::{Clock, SystemClock};
use crate::config::{Allowance, Route};
use crate::limiter::Decision;
use crate::refusal::{Refusal, Wait};
use crate::text;
use http::{HeaderName, HeaderValue};

// Names parsed once, at compile time: inserted into a header map directly (`head_room`), they are
// hashed and never parsed again, where Pingora's `insert_header` parses every name it is given.
// Statics, not consts: a name holds `Bytes`, and a clone of a static one only copies a pointer.
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub static RETRY_AFTER: HeaderName = http::header::RETRY_AFTER;

/// The most headers `RouteHeaders::each` puts.
pub const MOST: usize = 6;

/// A route's limits as headers need them; the policy field is the same for every response of the
/// route, so it is rendered once, at config load.
#[derive(Debug, Clone)]
pub struct RouteHeaders {
    names: Vec<String>,
    capacities: Vec<u64>,
    /// Each limit's quota period, for a quota.
    periods: Vec<Option<Period>>,
    policy: Option<HeaderValue>,
    /// When a monthly quota is enforced, the policy for each month length (28 to 31 days): its
    /// `w` is the length of the month under way, so the response picks one, never renders one.
    monthly: Option<Vec<HeaderValue>>,
}

impl RouteHeaders {
    pub fn new(route: &Route) -> RouteHeaders {
        // Shadow limits are the operator's experiment: clients never see them.
        let enforced: Vec<_> = route
            .limits
            .iter()
            .filter(|l| !l.shadow && !route.shadow)
            .collect();
        let listed: Vec<(String, Allowance)> = enforced
            .iter()
            .map(|l| (l.name.clone(), l.allowance))
            .collect();
        let monthly = listed.iter().any(|(_, a)| {
            matches!(
                a,
                Allowance::Quota {
                    period: Period::Month,
                    ..
                }
            )
        });
        RouteHeaders {
            names: route.limits.iter().map(|l| l.name.clone()).collect(),
            capacities: route
                .limits
                .iter()
                .map(|l| l.allowance.capacity())
                .collect(),
            periods: route
                .limits
                .iter()
                .map(|l| match l.allowance {
                    Allowance::Quota { period, .. } => Some(period),
                    _ => None,
                })
                .collect(),
            policy: policy(&listed, SystemClock.now_us()),
            // A month of each length: February 2027 and 2028, April and January 2027.
            monthly: monthly.then(|| {
                [(2027, 2), (2028, 2), (2027, 4), (2027, 1)]
                    .iter()
                    .filter_map(|&(y, m)| policy(&listed, calendar::midnight(y, m, 1)))
                    .collect()
            }),
        }
    }

    /// The name of limit `i`.
    pub fn limit_name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// Calls `put` with every header that describes `decision`, whose `limits[j]` is the route's
    /// limit `limits[j]`. A rejection adds `Retry-After`, and then `RateLimit`'s `t` is the same
    /// number of seconds.
    pub fn each(
        &self,
        decision: &Decision,
        limits: &[usize],
        mut put: impl FnMut(HeaderName, HeaderValue),
    ) {
        let Some(j) = decision.binding() else { return };
        let (Some(state), Some(&i)) = (decision.limits.get(j), limits.get(j)) else {
            return;
        };
        let t = if decision.allowed {
            secs_ceil(state.wait_us)
        } else {
            retry_after_secs(decision)
        };
        put(
            X_RATELIMIT_LIMIT.clone(),
            HeaderValue::from(self.capacities[i]),
        );
        put(
            X_RATELIMIT_REMAINING.clone(),
            HeaderValue::from(state.remaining),
        );
        put(
            X_RATELIMIT_RESET.clone(),
            HeaderValue::from(secs_ceil(state.reset_us)),
        );
        let policy = match &self.monthly {
            Some(by_length) => {
                let days = Period::Month.length_secs(SystemClock.now_us()) / 86_400;
                by_length.get(days.saturating_sub(28) as usize)
            }
            None => self.policy.as_ref(),
        };
        if let Some(p) = policy {
            put(RATELIMIT_POLICY.clone(), p.clone());
        }
        if let Ok(v) = HeaderValue::from_maybe_shared(self.ratelimit(i, state.remaining, t)) {
            put(RATELIMIT.clone(), v);
        }
        if !decision.allowed {
            put(RETRY_AFTER.clone(), HeaderValue::from(t));
        }
    }
}

impl RouteHeaders {
    /// `"name";r=remaining;t=seconds`, written without `format!` (this is on every allowed
    /// response).
    fn ratelimit(&self, i: usize, remaining: u64, t: u64) -> bytes::Bytes {
        let name = &self.names[i];
        let mut v = Vec::with_capacity(name.len() + 50);
        v.push(b'"');
        v.extend_from_slice(name.as_bytes());
        v.extend_from_slice(b"\";r=");
        text::decimal(&mut v, remaining);
        v.extend_from_slice(b";t=");
        text::decimal(&mut v, t);
        v.into()
    }

    /// A rejection's headers, and its body's reasons: the limits that refused it.
    pub fn rejection<'a>(
        &'a self,
        decision: &Decision,
        limits: &[usize],
        status: u16,
        route: &'a str,
    ) -> (Vec<(HeaderName, HeaderValue)>, Refusal<'a>) {
        let mut extra = Vec::with_capacity(6);
        self.each(decision, limits, |name, value| extra.push((name, value)));
        let violated = decision
            .limits
            .iter()
            .zip(limits)
            .filter(|(l, _)| !l.ok)
            .map(|(_, &i)| self.limit_name(i))
            .collect();
        // A refused quota says when it is whole again: its period's boundary, which the wait
        // reaches (rounded to the boundary: the store's clock and this one differ slightly).
        let resets_at = decision
            .limits
            .iter()
            .zip(limits)
            .filter(|(l, _)| !l.ok)
            .filter_map(|(l, &i)| {
                let period = self.periods[i]?;
                Some(period.start(SystemClock.now_us() + l.wait_us + 500_000) / 1_000_000)
            })
            .max();
        let why = Refusal {
            status,
            route,
            violated,
            wait: Some(Wait {
                secs: retry_after_secs(decision),
                ms: retry_after_ms(decision),
                resets_at,
            }),
        };
        (extra, why)
    }
}

/// `RateLimit-Policy` for `listed` limits at `now_us`: `"name";q=<capacity>;w=<window>`, where
/// the window is the time to refill an empty bucket or the quota period's length; a concurrency
/// limit says its unit instead (`qu="concurrent-requests"`). `None` when no limit is listed.
fn policy(listed: &[(String, Allowance)], now_us: u64) -> Option<HeaderValue> {
    if listed.is_empty() {
        return None;
    }
    let text = listed
        .iter()
        .map(|(name, a)| match a.window_secs(now_us) {
            Some(w) => format!("\"{name}\";q={};w={w}", a.capacity()),
            None => format!("\"{name}\";q={};qu=\"concurrent-requests\"", a.capacity()),
        })
        .collect::<Vec<_>>()
        .join(", ");
    // Names are [A-Za-z0-9_-], so the value is always a valid header value.
    HeaderValue::try_from(text).ok()
}

/// `Retry-After` of a rejection: whole seconds, rounded up, at least 1 (0 would invite a retry
/// that is certain to fail).
pub fn retry_after_secs(decision: &Decision) -> u64 {
    secs_ceil(decision.retry_after_us()).max(1)
}

/// `retry-after-ms` of a rejection: the same wait in milliseconds, rounded up, at least 1; in
/// seconds, rounded up, it is `Retry-After`.
pub fn retry_after_ms(decision: &Decision) -> u64 {
    decision.retry_after_us().div_ceil(1_000).max(1)
}

fn secs_ceil(us: u64) -> u64 {
    us.div_ceil(1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::limiter::LimitState;

    fn headers() -> RouteHeaders {
        let yaml = "listen: \"127.0.0.1:1\"\nroutes:\n  - name: api\n    upstream: \"h:1\"\n    limits:\n      - { name: burst, capacity: 20, refill: \"10/s\" }\n      - { name: hourly, capacity: 1000, refill: \"1000/h\" }\n";
        RouteHeaders::new(&Config::parse("t.yaml", yaml).unwrap().routes[0])
    }

    fn collect(h: &RouteHeaders, d: &Decision) -> Vec<(String, String)> {
        let mut out = Vec::new();
        h.each(d, &[0, 1], |n, v| {
            out.push((n.to_string(), v.to_str().unwrap().to_string()))
        });
        out
    }

    fn state(ok: bool, remaining: u64, reset_us: u64, wait_us: u64) -> LimitState {
        LimitState {
            ok,
            remaining,
            reset_us,
            wait_us,
            held: 0,
            lag_us: 0,
        }
    }

    #[test]
    fn allowed_reports_the_least_remaining_limit() {
        let d = Decision {
            allowed: true,
            limits: vec![
                state(true, 19, 100_000, 100_000),
                state(true, 5, 3_600_000_000, 2_500_001),
            ],
        };
        let got = collect(&headers(), &d);
        let want = [
            ("x-ratelimit-limit", "1000"),
            ("x-ratelimit-remaining", "5"),
            ("x-ratelimit-reset", "3600"),
            (
                "ratelimit-policy",
                "\"burst\";q=20;w=2, \"hourly\";q=1000;w=3600",
            ),
            ("ratelimit", "\"hourly\";r=5;t=3"),
        ];
        assert_eq!(got, want.map(|(a, b)| (a.to_string(), b.to_string())));
    }

    #[test]
    fn rejected_reports_the_longest_wait_and_retry_after_matches_t() {
        let d = Decision {
            allowed: false,
            limits: vec![state(false, 0, 2_000_000, 100_000), state(true, 5, 10, 0)],
        };
        let got = collect(&headers(), &d);
        assert!(got.contains(&("retry-after".into(), "1".into())), "{got:?}");
        assert!(
            got.contains(&("ratelimit".into(), "\"burst\";r=0;t=1".into())),
            "{got:?}"
        );
        assert!(
            got.contains(&("x-ratelimit-reset".into(), "2".into())),
            "{got:?}"
        );
    }

    #[test]
    fn a_monthly_quota_has_a_policy_for_each_month_length() {
        let yaml = "listen: \"127.0.0.1:1\"\nroutes:\n  - name: api\n    upstream: \"h:1\"\n    limits:\n      - { name: m, quota: { amount: 9, period: month } }\n";
        let h = RouteHeaders::new(&Config::parse("t.yaml", yaml).unwrap().routes[0]);
        let by_length = h.monthly.as_ref().expect("rendered once");
        let ws: Vec<&str> = by_length.iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(
            ws,
            [28, 29, 30, 31].map(|d| format!("\"m\";q=9;w={}", d * 86_400)),
        );
    }
}
