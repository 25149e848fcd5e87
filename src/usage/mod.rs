//! What a response says it used (`charge_from_response`): a header, a trailer, or a number in an
//! `application/json` body, read as the response passes through and never holding it back. The
//! proxy's phases feed it; `Gate::settle` charges what it found.

use crate::config::UsageSource;
use crate::held::Held;
use bytes::Bytes;
use http::HeaderMap;
use pingora::http::{RequestHeader, ResponseHeader};

/// The most of a JSON body kept to find the usage in; a longer body is charged the up-front cost.
pub const MAX_JSON: usize = 1 << 20;

/// What one response has shown so far.
#[derive(Default)]
pub struct Reported {
    /// The JSON body so far, while one is being kept.
    json: Option<Vec<u8>>,
    trailers: Option<HeaderMap>,
}

impl Reported {
    /// At the response head: keeps the body when a charge reads it from JSON and the body is
    /// JSON that may fit (never a stream, such as `text/event-stream`).
    pub fn head(&mut self, held: &Held, resp: &ResponseHeader) {
        if !held.owes(|s| matches!(s, UsageSource::Json(_))) {
            return;
        }
        let json = resp
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|t| t.trim().to_ascii_lowercase())
            .is_some_and(|t| t == "application/json" || t.ends_with("+json"));
        // Encoded anyway (the upstream ignored `identity`): unreadable, so not kept.
        let plain = resp
            .headers
            .get(http::header::CONTENT_ENCODING)
            .is_none_or(|v| v.as_bytes().eq_ignore_ascii_case(b"identity"));
        let length = resp
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<usize>().ok());
        if json && plain && resp.status.is_success() && length.is_none_or(|n| n <= MAX_JSON) {
            self.json = Some(Vec::with_capacity(length.unwrap_or(4096)));
        }
    }

    /// A chunk of the body on its way to the client.
    pub fn body(&mut self, chunk: Option<&Bytes>) {
        let (Some(kept), Some(chunk)) = (&mut self.json, chunk) else {
            return;
        };
        if kept.len() + chunk.len() > MAX_JSON {
            self.json = None;
        } else {
            kept.extend_from_slice(chunk);
        }
    }

    /// The upstream's trailers, when a charge reads one.
    pub fn trailers(&mut self, held: &Held, trailers: &HeaderMap) {
        if held.owes(|s| matches!(s, UsageSource::Trailer(_))) {
            self.trailers = Some(trailers.clone());
        }
    }

    /// At the end of the response: what `source` reported (`None` inside: it did not say).
    pub fn used(&self, source: &UsageSource) -> Option<Option<u64>> {
        Some(match source {
            // Charged at the head already, or there was no response head: nothing reported.
            UsageSource::Header(_) => None,
            UsageSource::Trailer(name) => self.trailers.as_ref().and_then(|t| number(t, name)),
            UsageSource::Json(path) => self.json.as_deref().and_then(|b| json_number(b, path)),
        })
    }
}

/// The upstream request of a route charged from a JSON body: asked for the body whole and
/// uncompressed (`Accept-Encoding: identity`, no `Range`), so that no client can make the usage
/// unreadable by asking for gzip or a part.
pub fn plain_body(req: &mut RequestHeader) -> pingora::Result<()> {
    req.remove_header(&http::header::RANGE);
    req.insert_header(http::header::ACCEPT_ENCODING, "identity")?;
    Ok(())
}

/// At the response head: what a header source reported, `None` for the other sources (they
/// report later).
pub fn at_head(resp: &ResponseHeader, source: &UsageSource) -> Option<Option<u64>> {
    match source {
        UsageSource::Header(name) => Some(number(&resp.headers, name)),
        _ => None,
    }
}

/// A whole, non-negative number in the one field `name`; anything else says nothing.
fn number(headers: &HeaderMap, name: &str) -> Option<u64> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    value.to_str().ok()?.trim().parse().ok()
}

/// The number at `path` in a JSON document: a whole number, or a fraction rounded up (usage is
/// never under-charged); anything else says nothing.
fn json_number(body: &[u8], path: &[String]) -> Option<u64> {
    let doc: serde_json::Value = serde_json::from_slice(body).ok()?;
    let mut at = &doc;
    for key in path {
        at = at.get(key)?;
    }
    match at.as_u64() {
        Some(n) => Some(n),
        None => at
            .as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(|f| f.ceil().min(u64::MAX as f64) as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> Vec<String> {
        p.split('.').map(str::to_string).collect()
    }

    #[test]
    fn json_usage_is_found_by_path_and_never_rounded_down() {
        let body = br#"{"usage":{"prompt_tokens":3,"total_tokens":120,"cost":2.1}}"#;
        assert_eq!(json_number(body, &path("usage.total_tokens")), Some(120));
        assert_eq!(json_number(body, &path("usage.cost")), Some(3));
        assert_eq!(json_number(body, &path("usage.missing")), None);
        assert_eq!(
            json_number(
                b"{\"usage\":{\"total_tokens\":-5}}",
                &path("usage.total_tokens")
            ),
            None
        );
        assert_eq!(
            json_number(
                b"{\"usage\":{\"total_tokens\":\"7\"}}",
                &path("usage.total_tokens")
            ),
            None
        );
        assert_eq!(json_number(b"not json", &path("usage")), None);
    }

    #[test]
    fn a_header_says_one_whole_number_or_nothing() {
        let mut h = HeaderMap::new();
        h.insert("x-usage", " 42 ".parse().unwrap());
        assert_eq!(number(&h, "x-usage"), Some(42));
        h.append("x-usage", "1".parse().unwrap());
        assert_eq!(number(&h, "x-usage"), None, "two values: which one?");
        h.insert("x-usage", "4e2".parse().unwrap());
        assert_eq!(number(&h, "x-usage"), None);
    }
}
