//! The bodies of the refusals the proxy writes itself, in the route's `deny.format`, and the
//! headers that go with a format: why a request is refused, in words a person or an SDK reads.
//!
//! Two kinds of refusal: a limit refused the request (waiting helps: `Retry-After`, the status of
//! `deny.status`), or a limit with `on_missing_key: deny` found no key (waiting will not help:
//! `deny.missing_key_status`, 401 by default, and no rate-limit headers). The `openai` and
//! `anthropic` formats write the error objects of those APIs, which their SDKs parse, and add
//! `retry-after-ms` (read before `Retry-After` by both) and, when a calendar quota refused,
//! `x-should-retry: false` (both honour it: retrying an exhausted monthly plan is pointless).

use crate::calendar;
use crate::config::DenyFormat;
use crate::text;
use http::{HeaderName, HeaderValue};

pub static RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");
pub static X_SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

/// Why a request is refused: the limits it violated, and when it may come back.
pub struct Refusal<'a> {
    pub status: u16,
    pub route: &'a str,
    pub violated: Vec<&'a str>,
    /// `None`: not by waiting, its key is missing.
    pub wait: Option<Wait>,
}

/// How long a refused request has to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// `Retry-After`: whole seconds, rounded up, at least 1.
    pub secs: u64,
    /// `retry-after-ms`: the same wait in milliseconds, rounded up, at least 1 (so `secs` is
    /// `ms` in seconds, rounded up).
    pub ms: u64,
    /// When a refused calendar quota is whole again (Unix seconds, a period boundary); `None`
    /// when no quota refused.
    pub resets_at: Option<u64>,
}

impl Refusal<'_> {
    /// Whether a calendar quota refused it: nothing comes back before its boundary.
    pub fn by_quota(&self) -> bool {
        self.wait.is_some_and(|w| w.resets_at.is_some())
    }
}

/// The IETF problem type for an exhausted quota (draft-ietf-httpapi-ratelimit-headers).
const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The content type and body of a refusal in the route's chosen format. Written without `format!`
/// (but `problem_json`'s): a client flooding an exhausted key gets one of these per request.
pub fn refusal_body<'a>(format: &'a DenyFormat, why: &Refusal<'_>) -> (&'a str, String) {
    let detail = refusal_detail(why);
    match format {
        DenyFormat::Text => {
            let reason = reason(why.status);
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
        DenyFormat::ProblemJson if why.wait.is_some() => (
            "application/problem+json",
            format!(
                "{{\"type\":\"{QUOTA_EXCEEDED}\",\"title\":\"Request cannot be satisfied as assigned quota has been exceeded\",\
                 \"status\":{},\"detail\":\"{}\",\"violated-policies\":[{}]}}",
                why.status,
                detail.replace('"', "'"),
                why.violated.iter().map(|v| format!("\"{v}\"")).collect::<Vec<_>>().join(",")
            ),
        ),
        // A missing key exceeds no quota: the plain problem of its status (RFC 9457 §4.2.1).
        DenyFormat::ProblemJson => (
            "application/problem+json",
            format!(
                "{{\"type\":\"about:blank\",\"title\":\"{}\",\"status\":{},\"detail\":\"{}\"}}",
                reason(why.status),
                why.status,
                detail.replace('"', "'"),
            ),
        ),
        DenyFormat::OpenAi => {
            let (kind, code) = match why.wait {
                None => ("invalid_request_error", "missing_api_key"),
                Some(_) if why.by_quota() => ("insufficient_quota", "insufficient_quota"),
                Some(_) => ("rate_limit_exceeded", "rate_limit_exceeded"),
            };
            let mut body = String::with_capacity(detail.len() + 112);
            body.push_str("{\"error\":{\"message\":");
            json_string(&mut body, &detail);
            body.push_str(",\"type\":\"");
            body.push_str(kind);
            body.push_str("\",\"param\":null,\"code\":\"");
            body.push_str(code);
            body.push_str("\"}}");
            ("application/json", body)
        }
        DenyFormat::Anthropic => {
            let kind = match why.wait {
                None => "authentication_error",
                Some(_) => "rate_limit_error",
            };
            let mut body = String::with_capacity(detail.len() + 80);
            body.push_str("{\"type\":\"error\",\"error\":{\"type\":\"");
            body.push_str(kind);
            body.push_str("\",\"message\":");
            json_string(&mut body, &detail);
            body.push_str("}}");
            ("application/json", body)
        }
    }
}

/// The headers a format adds to a refusal that waiting will end: the SDK formats' exact wait in
/// milliseconds, and that a refusal by a calendar quota is not worth retrying.
pub fn format_headers(
    format: &DenyFormat,
    why: &Refusal<'_>,
    out: &mut Vec<(HeaderName, HeaderValue)>,
) {
    let (DenyFormat::OpenAi | DenyFormat::Anthropic, Some(wait)) = (format, why.wait) else {
        return;
    };
    out.push((RETRY_AFTER_MS.clone(), HeaderValue::from(wait.ms)));
    if why.by_quota() {
        out.push((X_SHOULD_RETRY.clone(), HeaderValue::from_static("false")));
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
    match why.wait {
        Some(wait) => {
            detail.push_str("\" is exhausted; retry in ");
            detail.push_str(text::decimal_str(wait.secs, &mut [0; 20]));
            detail.push_str(" s");
            if let Some(at) = wait.resets_at {
                detail.push_str(" (the quota is whole again at ");
                detail.push_str(&utc(at));
                detail.push(')');
            }
        }
        None => detail.push_str("\" needs a key this request does not carry"),
    }
    detail
}

/// The status's reason phrase (`Too Many Requests`), or `Refused` for one without.
fn reason(status: u16) -> &'static str {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Refused")
}

/// Appends `s` as a JSON string, quotes included (RFC 8259 §7): `"` and `\` escaped, control
/// characters as `\n`, `\t`, … or `\u00XX`.
pub fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.push_str("\\u00");
                out.push(HEX[(u32::from(c) >> 4) as usize] as char);
                out.push(HEX[(u32::from(c) & 0xf) as usize] as char);
            }
            c => out.push(c),
        }
    }
    out.push('"');
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn why(violated: Vec<&str>, wait: Option<Wait>) -> Refusal<'_> {
        Refusal {
            status: 429,
            route: "api",
            violated,
            wait,
        }
    }

    fn secs(secs: u64) -> Option<Wait> {
        Some(Wait {
            secs,
            ms: secs * 1000,
            resets_at: None,
        })
    }

    fn json(format: DenyFormat, why: &Refusal<'_>) -> Value {
        let (content_type, body) = refusal_body(&format, why);
        assert_eq!(content_type, "application/json");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{body}: {e}"))
    }

    #[test]
    fn refusal_bodies_read_as_written() {
        let text = |w: &Refusal<'_>| refusal_body(&DenyFormat::Text, w);
        assert_eq!(
            text(&why(vec!["burst"], secs(60))),
            (
                "text/plain; charset=utf-8",
                "429 Too Many Requests: limit \"burst\" of route \"api\" is exhausted; retry in 60 s\n"
                    .to_string()
            )
        );
        let mut missing = why(vec!["a", "b"], None);
        missing.status = 401;
        assert_eq!(
            text(&missing).1,
            "401 Unauthorized: limit \"a\", \"b\" of route \"api\" needs a key this request does not carry\n"
        );
        let (content_type, json) =
            refusal_body(&DenyFormat::ProblemJson, &why(vec!["a", "b"], secs(1)));
        assert_eq!(content_type, "application/problem+json");
        assert!(
            json.contains("\"detail\":\"limit 'a', 'b' of route 'api' is exhausted; retry in 1 s\",\"violated-policies\":[\"a\",\"b\"]"),
            "{json}"
        );
        let (_, json) = refusal_body(&DenyFormat::ProblemJson, &missing);
        assert_eq!(
            json,
            "{\"type\":\"about:blank\",\"title\":\"Unauthorized\",\"status\":401,\"detail\":\"limit 'a', 'b' of route 'api' needs a key this request does not carry\"}"
        );
    }

    #[test]
    fn openai_refusals_are_its_error_objects() {
        let limited = json(DenyFormat::OpenAi, &why(vec!["burst"], secs(3)));
        assert_eq!(
            limited,
            json!({"error": {
                "message": "limit \"burst\" of route \"api\" is exhausted; retry in 3 s",
                "type": "rate_limit_exceeded", "param": null, "code": "rate_limit_exceeded"}})
        );
        let quota = Some(Wait {
            secs: 86_400,
            ms: 86_400_000,
            resets_at: Some(1_798_761_600),
        });
        let spent = json(DenyFormat::OpenAi, &why(vec!["monthly"], quota));
        assert_eq!(spent["error"]["type"], "insufficient_quota");
        assert_eq!(spent["error"]["code"], "insufficient_quota");
        assert!(spent["error"]["message"]
            .as_str()
            .unwrap()
            .ends_with("(the quota is whole again at 2027-01-01T00:00:00Z)"));
        let missing = json(DenyFormat::OpenAi, &why(vec!["k"], None));
        assert_eq!(
            missing,
            json!({"error": {
                "message": "limit \"k\" of route \"api\" needs a key this request does not carry",
                "type": "invalid_request_error", "param": null, "code": "missing_api_key"}})
        );
    }

    #[test]
    fn anthropic_refusals_are_its_error_objects() {
        assert_eq!(
            json(DenyFormat::Anthropic, &why(vec!["burst"], secs(3))),
            json!({"type": "error", "error": {"type": "rate_limit_error",
                "message": "limit \"burst\" of route \"api\" is exhausted; retry in 3 s"}})
        );
        assert_eq!(
            json(DenyFormat::Anthropic, &why(vec!["k"], None)),
            json!({"type": "error", "error": {"type": "authentication_error",
                "message": "limit \"k\" of route \"api\" needs a key this request does not carry"}})
        );
    }

    #[test]
    fn json_strings_escape_what_json_requires() {
        let hostile = "a\"b\\c\nd\te\u{1}f\u{7f}é\u{2028}";
        let mut out = String::new();
        json_string(&mut out, hostile);
        assert_eq!(out, "\"a\\\"b\\\\c\\nd\\te\\u0001f\u{7f}é\u{2028}\"");
        assert_eq!(serde_json::from_str::<String>(&out).unwrap(), hostile);
        let body = json(DenyFormat::OpenAi, &why(vec!["x\"y"], secs(1)));
        assert_eq!(
            body["error"]["message"],
            "limit \"x\"y\" of route \"api\" is exhausted; retry in 1 s"
        );
    }

    #[test]
    fn sdk_formats_add_the_exact_wait_and_say_a_quota_is_not_worth_retrying() {
        let headers = |format: DenyFormat, why: &Refusal<'_>| {
            let mut out = Vec::new();
            format_headers(&format, why, &mut out);
            out.iter()
                .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
                .collect::<Vec<_>>()
        };
        let wait = Some(Wait {
            secs: 3,
            ms: 2_501,
            resets_at: None,
        });
        assert_eq!(
            headers(DenyFormat::OpenAi, &why(vec!["b"], wait)),
            ["retry-after-ms: 2501"]
        );
        let quota = Some(Wait {
            secs: 10,
            ms: 9_001,
            resets_at: Some(1),
        });
        assert_eq!(
            headers(DenyFormat::Anthropic, &why(vec!["m"], quota)),
            ["retry-after-ms: 9001", "x-should-retry: false"]
        );
        assert!(headers(DenyFormat::OpenAi, &why(vec!["k"], None)).is_empty());
        assert!(headers(DenyFormat::Text, &why(vec!["b"], wait)).is_empty());
        assert!(headers(DenyFormat::ProblemJson, &why(vec!["b"], quota)).is_empty());
    }
}
