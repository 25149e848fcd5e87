//! What clients see of a decision: the rate-limit response headers (a refusal's body is
//! `refusal`'s).
//!
//! Two vocabularies, because clients know both: the de-facto `X-RateLimit-*` trio, which can only
//! describe one limit, the binding one (`Decision::binding_by`: allowed, the one with the fewest
//! *requests* left, `remaining / cost`; refused, the one waited for longest), in its own units;
//! and the IETF fields of draft-ietf-httpapi-ratelimit-headers-10, which are lists:
//! `RateLimit-Policy` every enforced limit of the route, `RateLimit` every limit the decision
//! enforced, the binding one first and then the others in the route's order (a client that reads
//! one item reads the binding one). Fail-open responses carry none of them: the proxy does not
//! know the state then.

use crate::calendar::{self, Period};
use crate::clock::{Clock, SystemClock};
use crate::config::{Allowance, Route};
use crate::limiter::{Decision, LimitState};
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
    /// What one request takes from each limit: the binding limit is the one with the fewest
    /// requests left.
    costs: Vec<u64>,
    /// Each limit is a concurrency limit.
    concurrent: Vec<bool>,
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
            costs: route.limits.iter().map(|l| l.cost.max(1)).collect(),
            concurrent: route
                .limits
                .iter()
                .map(|l| matches!(l.allowance, Allowance::Concurrency { .. }))
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
    /// limit `limits[j]`. A rejection adds `Retry-After`, and then `RateLimit`'s `t` of the limit
    /// waited for longest is the same number of seconds.
    pub fn each(
        &self,
        decision: &Decision,
        limits: &[usize],
        mut put: impl FnMut(HeaderName, HeaderValue),
    ) {
        let cost = |j: usize| limits.get(j).map_or(1, |&i| self.costs[i]);
        let Some(j) = decision.binding_by(cost) else {
            return;
        };
        let (Some(state), Some(&i)) = (decision.limits.get(j), limits.get(j)) else {
            return;
        };
        put(X_RATELIMIT_LIMIT.clone(), number(self.capacities[i]));
        put(X_RATELIMIT_REMAINING.clone(), number(state.remaining));
        put(X_RATELIMIT_RESET.clone(), number(secs_ceil(state.reset_us)));
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
        if let Ok(v) = HeaderValue::from_maybe_shared(self.ratelimit(decision, limits, j)) {
            put(RATELIMIT.clone(), v);
        }
        if !decision.allowed {
            put(RETRY_AFTER.clone(), number(retry_after_secs(decision)));
        }
    }
}

impl RouteHeaders {
    /// `RateLimit`: an item `"name";r=remaining;t=seconds` for every limit of the decision,
    /// `binding` first, then the others in order. Written without `format!`, its length counted
    /// first so that its buffer is allocated once, exactly, and becomes the value as it is (this
    /// is on every allowed response).
    fn ratelimit(&self, decision: &Decision, limits: &[usize], binding: usize) -> bytes::Bytes {
        let mut v = Vec::with_capacity(self.ratelimit_len(decision, limits, binding));
        for (n, (i, state)) in items(decision, limits, binding).enumerate() {
            if n > 0 {
                v.extend_from_slice(b", ");
            }
            v.push(b'"');
            v.extend_from_slice(self.names[i].as_bytes());
            v.extend_from_slice(b"\";r=");
            text::decimal(&mut v, state.remaining);
            v.extend_from_slice(b";t=");
            text::decimal(&mut v, self.item_t(i, state));
        }
        v.into()
    }

    /// The length of `ratelimit`'s value.
    fn ratelimit_len(&self, decision: &Decision, limits: &[usize], binding: usize) -> usize {
        items(decision, limits, binding)
            .map(|(i, state)| {
                // `, "` name `";r=` digits `;t=` digits; the first item has no `, `.
                self.names[i].len() + 10 + digits(state.remaining) + digits(self.item_t(i, state))
            })
            .sum::<usize>()
            .saturating_sub(2)
    }

    /// An item's `t`: for a limit that held the cost, the seconds until its next whole token (a
    /// quota's boundary; 0 when full, and 0 for a concurrency limit with a lease left, which is
    /// free now); for one that refused, the seconds until the cost is there, at least 1, so the
    /// longest of them is `Retry-After`.
    fn item_t(&self, i: usize, state: &LimitState) -> u64 {
        if !state.ok {
            secs_ceil(state.wait_us).max(1)
        } else if self.concurrent[i] && state.remaining > 0 {
            0
        } else {
            secs_ceil(state.wait_us)
        }
    }

    /// A rejection's headers, and its body's reasons: the limits that refused it.
    pub fn rejection<'a>(
        &'a self,
        decision: &Decision,
        limits: &[usize],
        status: u16,
        route: &'a str,
    ) -> (Vec<(HeaderName, HeaderValue)>, Refusal<'a>) {
        let mut extra = Vec::with_capacity(MOST + 2);
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

/// The route's index and the state of each limit of `decision`, `binding` first, then the others
/// in order.
fn items<'a>(
    decision: &'a Decision,
    limits: &'a [usize],
    binding: usize,
) -> impl Iterator<Item = (usize, &'a LimitState)> + 'a {
    std::iter::once(binding)
        .chain((0..limits.len()).filter(move |&j| j != binding))
        .filter_map(|j| Some((*limits.get(j)?, decision.limits.get(j)?)))
}

/// `n` as a header value: one allocation, where `HeaderValue::from(u64)` makes two.
fn number(n: u64) -> HeaderValue {
    let mut buf = [0; 20];
    let text = text::decimal_str(n, &mut buf).as_bytes();
    HeaderValue::from_maybe_shared(bytes::Bytes::copy_from_slice(text))
        .unwrap_or_else(|_| HeaderValue::from(n))
}

/// How many decimal digits `n` has.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
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
            ("ratelimit", "\"hourly\";r=5;t=3, \"burst\";r=19;t=1"),
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
            got.contains(&(
                "ratelimit".into(),
                "\"burst\";r=0;t=1, \"hourly\";r=5;t=0".into()
            )),
            "{got:?}"
        );
        assert!(
            got.contains(&("x-ratelimit-reset".into(), "2".into())),
            "{got:?}"
        );
    }

    fn route_headers(limits: &str) -> RouteHeaders {
        let yaml = format!("listen: \"127.0.0.1:1\"\nroutes:\n  - name: api\n    upstream: \"h:1\"\n    limits:\n{limits}");
        RouteHeaders::new(&Config::parse("t.yaml", &yaml).unwrap().routes[0])
    }

    fn field<'a>(got: &'a [(String, String)], name: &str) -> &'a str {
        got.iter()
            .find(|(n, _)| n == name)
            .map_or("", |(_, v)| v.as_str())
    }

    #[test]
    fn the_binding_limit_has_the_fewest_requests_left() {
        let h = route_headers(
            "      - { name: tokens, capacity: 100, refill: \"100/h\", cost: 5 }\n      \
             - { name: inflight, concurrency: 10 }\n",
        );
        let collect = |d: &Decision| {
            let mut out = Vec::new();
            h.each(d, &[0, 1], |n, v| {
                out.push((n.to_string(), v.to_str().unwrap().to_string()))
            });
            out
        };
        // 15 tokens at cost 5 are 3 requests; one lease is 1.
        let d = Decision {
            allowed: true,
            limits: vec![
                state(true, 15, 3_060_000_000, 36_000_000),
                state(true, 1, 1_000_000, 1_000_000),
            ],
        };
        let got = collect(&d);
        assert_eq!(field(&got, "x-ratelimit-limit"), "10", "{got:?}");
        assert_eq!(field(&got, "x-ratelimit-remaining"), "1");
        assert_eq!(
            field(&got, "ratelimit"),
            "\"inflight\";r=1;t=0, \"tokens\";r=15;t=36"
        );
        // 5 tokens are 1 request; two leases are 2.
        let d = Decision {
            allowed: true,
            limits: vec![
                state(true, 5, 3_420_000_000, 36_000_000),
                state(true, 2, 1_000_000, 1_000_000),
            ],
        };
        let got = collect(&d);
        assert_eq!(field(&got, "x-ratelimit-limit"), "100", "{got:?}");
        assert_eq!(field(&got, "x-ratelimit-remaining"), "5");
        assert_eq!(
            field(&got, "ratelimit"),
            "\"tokens\";r=5;t=36, \"inflight\";r=2;t=0"
        );
        assert_eq!(
            field(&got, "ratelimit-policy"),
            "\"tokens\";q=100;w=3600, \"inflight\";q=10;qu=\"concurrent-requests\""
        );
        // No lease left: a request ending frees one, which nobody can foresee.
        let d = Decision {
            allowed: true,
            limits: vec![
                state(true, 50, 1_800_000_000, 36_000_000),
                state(true, 0, 1_000_000, 1_000_000),
            ],
        };
        assert_eq!(
            field(&collect(&d), "ratelimit"),
            "\"inflight\";r=0;t=1, \"tokens\";r=50;t=36"
        );
    }

    #[test]
    fn a_rejection_lists_each_refusing_limit_with_its_own_wait() {
        let h = headers();
        let d = Decision {
            allowed: false,
            limits: vec![
                state(false, 0, 2_000_000, 100_000),
                state(false, 0, 3_600_000_000, 3_599_000_001),
            ],
        };
        let got = collect(&h, &d);
        assert_eq!(field(&got, "retry-after"), "3600");
        assert_eq!(
            field(&got, "ratelimit"),
            "\"hourly\";r=0;t=3600, \"burst\";r=0;t=1"
        );
        let (extra, why) = h.rejection(&d, &[0, 1], 429, "api");
        assert_eq!(extra.len(), 6);
        assert_eq!(why.violated, ["burst", "hourly"]);
        assert_eq!(
            why.wait,
            Some(Wait {
                secs: 3600,
                ms: 3_599_001,
                resets_at: None
            })
        );
    }

    #[test]
    fn the_ratelimit_field_fills_its_buffer_exactly() {
        for n in [0, 9, 10, 99, 100, u64::MAX] {
            assert_eq!(digits(n), n.to_string().len());
        }
        let h = headers();
        for (a, b) in [(0, 0), (19, 1000), (7, 5)] {
            let d = Decision {
                allowed: true,
                limits: vec![state(true, a, 100_000, 100_000), state(true, b, 10, 0)],
            };
            let binding = d.binding().unwrap();
            let v = h.ratelimit(&d, &[0, 1], binding);
            let mut written = Vec::new();
            for j in [binding, 1 - binding] {
                let l = &d.limits[j];
                written.push(format!(
                    "\"{}\";r={};t={}",
                    h.names[j],
                    l.remaining,
                    h.item_t(j, l)
                ));
            }
            assert_eq!(v, written.join(", ").as_bytes());
            assert_eq!(h.ratelimit_len(&d, &[0, 1], binding), v.len());
        }
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
