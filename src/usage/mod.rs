//! What a response says it used (`charge_from_response`): headers, trailers, and numbers in an
//! `application/json` body or in the JSON events of a `text/event-stream` body, found as the
//! body passes through without keeping it (`scan`, `sse`). The proxy's phases feed it;
//! `Gate::settle` charges what it found.

pub mod request;
pub mod scan;
pub mod sse;
pub mod strip;

use crate::config::{Charge, UsageSource};
use crate::held::Held;
use bytes::Bytes;
use http::HeaderMap;
use pingora::http::{RequestHeader, ResponseHeader};
use scan::JsonScan;
use sse::SseScan;
use std::sync::Arc;

/// What one response has shown so far.
#[derive(Default)]
pub struct Reported {
    /// The paths the body is scanned for, and the scanner.
    body: Option<(Arc<[Vec<String>]>, Body)>,
    /// Each header a charge reads, with what it said.
    headers: Vec<(String, Option<u64>)>,
    trailers: Option<HeaderMap>,
    /// Body bytes seen, for the relay's cap once the client is gone.
    pub body_bytes: u64,
    ended: bool,
}

enum Body {
    Json(JsonScan),
    Sse(SseScan),
}

impl Reported {
    /// At the final response head: remembers the headers the charges read, and starts a scanner
    /// for a body of the kind a charge reads (a JSON document, or an event stream), if the body
    /// is readable (not compressed) and the response a success.
    pub fn head(&mut self, held: &Held, resp: &ResponseHeader) {
        if !held.owes(|_| true) {
            return;
        }
        for name in held.terms().filter_map(|t| match &t.from {
            UsageSource::Header(name) => Some(name),
            _ => None,
        }) {
            if !self.headers.iter().any(|(n, _)| n == name) {
                self.headers
                    .push((name.clone(), number(&resp.headers, name)));
            }
        }
        // Encoded anyway (the upstream ignored `identity`): unreadable, so not scanned.
        let plain = resp
            .headers
            .get(http::header::CONTENT_ENCODING)
            .is_none_or(|v| v.as_bytes().eq_ignore_ascii_case(b"identity"));
        if !(plain && resp.status.is_success()) {
            return;
        }
        let media = media_type(resp).as_bytes();
        let json = media.eq_ignore_ascii_case(b"application/json")
            || media.len() >= 5 && media[media.len() - 5..].eq_ignore_ascii_case(b"+json");
        let sse = media.eq_ignore_ascii_case(b"text/event-stream");
        let paths: Vec<Vec<String>> = held
            .terms()
            .filter_map(|t| match &t.from {
                UsageSource::Json(p) if json => Some(p.clone()),
                UsageSource::Sse(p) if sse => Some(p.clone()),
                _ => None,
            })
            .collect();
        if paths.is_empty() {
            return;
        }
        let paths: Arc<[Vec<String>]> = paths.into();
        let scanner = match json {
            true => Body::Json(JsonScan::new(paths.clone())),
            false => Body::Sse(SseScan::new(paths.clone())),
        };
        self.body = Some((paths, scanner));
    }

    /// A chunk of the body on its way to the client; `end`: the body is complete.
    pub fn body(&mut self, chunk: Option<&Bytes>, end: bool) {
        let len = chunk.map_or(0, |c| c.len());
        self.body_bytes += len as u64;
        let Some((_, scanner)) = &mut self.body else {
            return;
        };
        match (scanner, chunk) {
            (Body::Json(s), Some(c)) => s.feed(c),
            (Body::Sse(s), Some(c)) => s.feed(c),
            _ => {}
        }
        if end {
            self.end_body();
        }
    }

    /// The body ended (or was cut: what was found stands); once.
    fn end_body(&mut self) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        match &mut self.body {
            Some((_, Body::Json(s))) => s.end(),
            Some((_, Body::Sse(s))) => s.end(),
            None => {}
        }
    }

    /// The upstream's trailers, when a charge reads one.
    pub fn trailers(&mut self, held: &Held, trailers: &HeaderMap) {
        if held.owes(|c| c.reads(|s| matches!(s, UsageSource::Trailer(_)))) {
            self.trailers = Some(trailers.clone());
        }
    }

    /// Bytes the scanners hold now: bounded whatever the body's size.
    pub fn held_bytes(&self) -> usize {
        match &self.body {
            Some((_, Body::Json(s))) => s.held_bytes(),
            Some((_, Body::Sse(s))) => s.held_bytes(),
            None => 0,
        }
    }

    /// What the response reported for `charge`, now that it is over: the weighted sum of every
    /// term it reported (saturating), `None` when it reported none.
    pub fn used(&mut self, charge: &Charge) -> Option<u64> {
        // A body cut short: what was found stands.
        self.end_body();
        let mut total: Option<u64> = None;
        for term in &charge.terms {
            let value = match &term.from {
                UsageSource::Header(name) => self
                    .headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .and_then(|(_, v)| *v),
                UsageSource::Trailer(name) => self.trailers.as_ref().and_then(|t| number(t, name)),
                UsageSource::Json(path) | UsageSource::Sse(path) => self.scanned(&term.from, path),
            };
            if let Some(v) = value {
                total = Some(
                    total
                        .unwrap_or(0)
                        .saturating_add(v.saturating_mul(term.weight)),
                );
            }
        }
        total
    }

    fn scanned(&self, source: &UsageSource, path: &[String]) -> Option<u64> {
        let (paths, body) = self.body.as_ref()?;
        let i = paths.iter().position(|p| p == path)?;
        match (body, source) {
            (Body::Json(s), UsageSource::Json(_)) => s.found(i),
            (Body::Sse(s), UsageSource::Sse(_)) => s.found(i),
            _ => None,
        }
    }
}

/// The response's media type, its parameters left out (compared ignoring case).
pub fn media_type(resp: &ResponseHeader) -> &str {
    resp.headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map_or("", str::trim)
}

/// The upstream request of a route charged from its body: asked for the body whole and
/// uncompressed (`Accept-Encoding: identity`, no `Range`), so that no client can make the usage
/// unreadable by asking for gzip or a part.
pub fn plain_body(req: &mut RequestHeader) -> pingora::Result<()> {
    req.remove_header(&http::header::RANGE);
    req.insert_header(http::header::ACCEPT_ENCODING, "identity")?;
    Ok(())
}

/// At the response head: what a charge of headers only reported (`None` inside: nothing), or
/// `None` for a charge that reads the body or trailers (settled at the end).
pub fn at_head(resp: &ResponseHeader, charge: &Charge) -> Option<Option<u64>> {
    if !charge.at_head() {
        return None;
    }
    let mut total: Option<u64> = None;
    for term in &charge.terms {
        if let UsageSource::Header(name) = &term.from {
            if let Some(v) = number(&resp.headers, name) {
                total = Some(
                    total
                        .unwrap_or(0)
                        .saturating_add(v.saturating_mul(term.weight)),
                );
            }
        }
    }
    Some(total)
}

/// A whole, non-negative number in the one field `name` (one too large for u64 is as large as
/// can be: an absurd usage is charged all the store holds, never nothing); anything else says
/// nothing.
fn number(headers: &HeaderMap, name: &str) -> Option<u64> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let digits = value.to_str().ok()?.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(digits.parse().unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_says_one_whole_number_or_nothing() {
        let mut h = HeaderMap::new();
        h.insert("x-usage", " 42 ".parse().unwrap());
        assert_eq!(number(&h, "x-usage"), Some(42));
        h.append("x-usage", "1".parse().unwrap());
        assert_eq!(number(&h, "x-usage"), None, "two values: which one?");
        h.insert("x-usage", "4e2".parse().unwrap());
        assert_eq!(number(&h, "x-usage"), None);
        h.insert("x-usage", "99999999999999999999999".parse().unwrap());
        assert_eq!(number(&h, "x-usage"), Some(u64::MAX), "absurd, not free");
        for bad in ["", "+5", "-5", "5 5"] {
            h.insert("x-usage", bad.parse().unwrap());
            assert_eq!(number(&h, "x-usage"), None, "{bad:?}");
        }
    }
}
