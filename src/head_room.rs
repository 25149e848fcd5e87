//! Headers this proxy adds on the way through, added where Pingora's header maps cost least.
//!
//! Pingora sizes a parsed head's header map to the headers it arrived with, keeps a second map
//! with each name as the peer spelled it, and parses every name `insert_header` is given. So the
//! first header added grows (rehashes) both maps, and every header added is parsed, then inserted
//! into both: callgrind counted about 1,550 instructions per added header, against about 550 in
//! one map with room, and less again with the name parsed once (`headers`' statics). Here a head
//! gives up the spelling map, gets room for what comes, and the headers go straight into its
//! map. Header names are case-insensitive (RFC 9110, section 5.1; HTTP/2 sends them all in
//! lowercase): they travel on spelled as Pingora spells its own.

use http::HeaderMap;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;

/// Makes room in `resp` for `more` headers, which `add` puts in its map.
pub fn response(
    resp: &mut ResponseHeader,
    more: usize,
    add: impl FnOnce(&mut HeaderMap),
) -> Result<()> {
    let reason = resp.get_reason_phrase().map(str::to_owned);
    // Allocates nothing, parses nothing.
    let placeholder = http::Response::new(()).into_parts().0.into();
    let mut parts: http::response::Parts = std::mem::replace(resp, placeholder).into();
    parts.headers.reserve(more);
    add(&mut parts.headers);
    *resp = parts.into();
    resp.set_reason_phrase(reason.as_deref())
}

/// Makes room in `req` for `more` headers, which `add` puts in its map. A target that the URI
/// does not give back byte for byte (absolute form, not UTF-8) is kept as it was.
pub fn request(
    req: &mut RequestHeader,
    more: usize,
    add: impl FnOnce(&mut HeaderMap),
) -> Result<()> {
    let raw = req.raw_path();
    let verbatim = (raw != from_uri(&req.uri)).then(|| raw.to_vec());
    let placeholder = http::Request::new(()).into_parts().0.into();
    let mut parts: http::request::Parts = std::mem::replace(req, placeholder).into();
    parts.headers.reserve(more);
    add(&mut parts.headers);
    *req = parts.into();
    match verbatim {
        Some(target) => req.set_raw_path(&target),
        None => Ok(()),
    }
}

/// The target a request header built from `uri` alone sends.
fn from_uri(uri: &http::Uri) -> &[u8] {
    uri.path_and_query()
        .map(|p| p.as_str().as_bytes())
        .or_else(|| uri.authority().map(|a| a.as_str().as_bytes()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_keeps_everything_but_the_spelling() {
        let mut resp = ResponseHeader::build(503, None).unwrap();
        resp.append_header("X-Thing", "1").unwrap();
        resp.append_header("x-thing", "2").unwrap();
        resp.insert_header("Content-Type", "text/plain").unwrap();
        resp.set_reason_phrase(Some("Resting")).unwrap();
        response(&mut resp, 6, |h| {
            h.insert("x-added", http::HeaderValue::from_static("yes"));
        })
        .unwrap();
        assert_eq!(resp.status, 503);
        assert_eq!(resp.get_reason_phrase(), Some("Resting"));
        let things: Vec<_> = resp.headers.get_all("x-thing").iter().collect();
        assert_eq!(things, ["1", "2"]);
        assert!(resp.headers.capacity() >= 9);
        let mut wire = Vec::new();
        resp.header_to_h1_wire(&mut wire);
        let wire = String::from_utf8(wire).unwrap();
        assert!(wire.contains("Content-Type: text/plain\r\n"), "{wire}");
        assert!(wire.contains("x-added: yes\r\n"), "{wire}");
    }

    #[test]
    fn a_request_keeps_its_target_as_sent() {
        for target in [
            &b"/a/b?c=d"[..],
            b"http://example.com/x?y",
            b"/caf\xc3\xa9",
            b"*",
        ] {
            let mut req = RequestHeader::build("GET", target, None).unwrap();
            req.append_header("Host", "example.com").unwrap();
            request(&mut req, 3, |h| {
                h.insert("x-added", http::HeaderValue::from_static("yes"));
            })
            .unwrap();
            assert_eq!(req.raw_path(), target);
            assert_eq!(req.headers["x-added"], "yes");
            assert_eq!(req.method, "GET");
            assert_eq!(req.headers["host"], "example.com");
        }
        let mut req = RequestHeader::build("GET", b"/\xff", None).unwrap();
        request(&mut req, 3, |_| {}).unwrap();
        assert_eq!(req.raw_path(), b"/\xff");
        assert!(!req.raw_path_is_utf8());
    }
}
