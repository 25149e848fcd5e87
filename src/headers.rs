//! What clients see of a decision: the rate-limit response headers and the 429's body.
//!
//! Two vocabularies, because clients know both: the de-facto `X-RateLimit-*` trio, and the IETF
//! fields of draft-ietf-httpapi-ratelimit-headers-10 (`RateLimit-Policy` lists every limit of the
//! route; `RateLimit` reports the binding one, see `Decision::binding`). Fail-open responses carry
//! none of them: the proxy does not know the state then.

use crate::calendar::{self, Period};
use crate::clock::{Clock, SystemClock};
use crate::config::{Allowance, DenyFormat, Route};
use crate::limiter::Decision;
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
            retry_after: Some(retry_after_secs(decision)),
            resets_at,
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

/// Why a request is refused: the limits it violated, and when it may come back (`None`: not by
/// waiting, its key is missing).
pub struct Refusal<'a> {
    pub status: u16,
    pub route: &'a str,
    pub violated: Vec<&'a str>,
    pub retry_after: Option<u64>,
    /// When a refused quota is whole again (Unix seconds, a period boundary).
    pub resets_at: Option<u64>,
}

/// The IETF problem type for an exhausted quota (draft-ietf-httpapi-ratelimit-headers).
const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The content type and body of a refusal in the route's chosen format. Written without `format!`:
/// a client flooding an exhausted key gets one of these per request.
pub fn refusal_body<'a>(format: &'a DenyFormat, why: &Refusal<'_>) -> (&'a str, String) {
    let detail = refusal_detail(why);
    match format {
        DenyFormat::Text => {
            let reason = http::StatusCode::from_u16(why.status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("Refused");
            let mut body = String::with_capacity(detail.len() + reason.len() + 8);
            body.push_str(text::decimal_str(why.status.into(), &mut [0; 20]));
            body.push(' ');
            body.push_str(reason);
            body.push_str(": ");
            body.push_str(&detail);
            body.push('\n');
            ("text/plain; charset=utf-8", body)
        }
        DenyFormat::Custom { body, content_type } => (content_type, body.clone()),
        // Route and limit names are [A-Za-z0-9_-]: nothing in them needs JSON escaping.
        DenyFormat::ProblemJson => (
            "application/problem+json",
            format!(
                "{{\"type\":\"{QUOTA_EXCEEDED}\",\"title\":\"Request cannot be satisfied as assigned quota has been exceeded\",\
                 \"status\":{},\"detail\":\"{}\",\"violated-policies\":[{}]}}",
                why.status,
                detail.replace('"', "'"),
                why.violated.iter().map(|v| format!("\"{v}\"")).collect::<Vec<_>>().join(",")
            ),
        ),
    }
}

/// Why a request was refused, in words: `limit "burst" of route "api" is exhausted; retry in 3 s`.
pub fn refusal_detail(why: &Refusal<'_>) -> String {
    let mut detail = String::with_capacity(96);
    detail.push_str("limit ");
    for (i, name) in why.violated.iter().enumerate() {
        if i > 0 {
            detail.push_str(", ");
        }
        detail.push('"');
        detail.push_str(name);
        detail.push('"');
    }
    detail.push_str(" of route \"");
    detail.push_str(why.route);
    match why.retry_after {
        Some(s) => {
            detail.push_str("\" is exhausted; retry in ");
            detail.push_str(text::decimal_str(s, &mut [0; 20]));
            detail.push_str(" s");
            if let Some(at) = why.resets_at {
                detail.push_str(" (the quota is whole again at ");
                detail.push_str(&utc(at));
                detail.push(')');
            }
        }
        None => detail.push_str("\" needs a key this request does not carry"),
    }
    detail
}

/// Unix seconds as `2027-01-01T00:00:00Z`.
fn utc(secs: u64) -> String {
    let (y, m, d) = calendar::civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
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
    fn refusal_bodies_read_as_written() {
        let why = |violated, retry_after| Refusal {
            status: 429,
            route: "api",
            violated,
            retry_after,
            resets_at: None,
        };
        let text = |w: &Refusal<'_>| refusal_body(&DenyFormat::Text, w);
        assert_eq!(
            text(&why(vec!["burst"], Some(60))),
            (
                "text/plain; charset=utf-8",
                "429 Too Many Requests: limit \"burst\" of route \"api\" is exhausted; retry in 60 s\n"
                    .to_string()
            )
        );
        assert_eq!(
            text(&why(vec!["a", "b"], None)).1,
            "429 Too Many Requests: limit \"a\", \"b\" of route \"api\" needs a key this request does not carry\n"
        );
        let (content_type, json) =
            refusal_body(&DenyFormat::ProblemJson, &why(vec!["a", "b"], Some(1)));
        assert_eq!(content_type, "application/problem+json");
        assert!(
            json.contains("\"detail\":\"limit 'a', 'b' of route 'api' is exhausted; retry in 1 s\",\"violated-policies\":[\"a\",\"b\"]"),
            "{json}"
        );
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
