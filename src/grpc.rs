//! Refusals a gRPC client understands. gRPC maps a plain HTTP 429 to UNAVAILABLE, which its
//! clients retry at once; a limit's refusal is instead HTTP 200 with a trailers-only response
//! (one HEADERS frame that ends the stream) carrying `grpc-status` RESOURCE_EXHAUSTED, which they
//! do not retry blindly, and the rate-limit fields as metadata.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use pingora::http::ResponseHeader;

/// `grpc-status` of a request a limit refused.
pub const RESOURCE_EXHAUSTED: u8 = 8;
/// `grpc-status` of a request refused because a limit that needs a key found none
/// (`on_missing_key: deny`): waiting will not help, credentials will.
pub const UNAUTHENTICATED: u8 = 16;
/// `grpc-status` of a request refused because the store is down on a fail-closed route.
pub const UNAVAILABLE: u8 = 14;

/// Whether the request is a gRPC call: its content type is `application/grpc`, alone or with a
/// `+proto`, `+json`, … suffix or parameters (the gRPC over HTTP/2 spec). gRPC-Web
/// (`application/grpc-web…`) is not: its clients read a different framing.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    headers.get(http::header::CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        v.len() >= GRPC.len()
            && v[..GRPC.len()].eq_ignore_ascii_case(GRPC)
            && matches!(v.get(GRPC.len()), None | Some(b'+' | b';'))
    })
}

/// `grpc-message`: the text percent-encoded as the spec asks (every byte outside printable ASCII,
/// and `%` itself).
pub fn message(text: &str) -> HeaderValue {
    let mut out = Vec::with_capacity(text.len());
    for &b in text.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.push(b'%');
            out.extend_from_slice(format!("{b:02X}").as_bytes());
        }
    }
    // Only printable ASCII is left.
    HeaderValue::from_maybe_shared(Bytes::from(out))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// `grpc-status` as a header value.
pub fn status(code: u8) -> HeaderValue {
    HeaderValue::from(u16::from(code))
}

/// A trailers-only response: HTTP 200 and the status in the headers (which end the stream), with
/// `extra` as metadata.
pub fn trailers_only(
    code: u8,
    detail: &str,
    extra: Vec<(HeaderName, HeaderValue)>,
) -> pingora::Result<ResponseHeader> {
    let mut resp = ResponseHeader::build_no_case(200, None)?;
    // Straight into the map: Pingora's `insert_header` would copy and parse each name again.
    crate::head_room::response(&mut resp, 3 + extra.len(), |map| {
        map.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        map.insert(GRPC_STATUS.clone(), status(code));
        map.insert(GRPC_MESSAGE.clone(), message(detail));
        for (name, value) in extra {
            map.insert(name, value);
        }
    })?;
    Ok(resp)
}

static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_is_known_by_its_content_type() {
        let mut h = HeaderMap::new();
        assert!(!is_grpc(&h));
        for (ct, grpc) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("Application/GRPC+json", true),
            ("application/grpc; charset=utf-8", true),
            ("application/grpc-web-text", false),
            ("application/grpcx", false),
            ("application/json", false),
            ("application/grp", false),
        ] {
            h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(ct));
            assert_eq!(is_grpc(&h), grpc, "{ct}");
        }
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(
            message("limit \"a\" of route \"b\""),
            "limit \"a\" of route \"b\""
        );
        assert_eq!(message("100% sûr\n"), "100%25 s%C3%BBr%0A");
        assert_eq!(status(RESOURCE_EXHAUSTED), "8");
    }
}
