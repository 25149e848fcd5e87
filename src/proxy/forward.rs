//! What the upstream is told beside the client's request: its host as HTTP/1.1 names it, who
//! asked (`X-Forwarded-*`), and one `Content-Length`.

use bytes::Bytes;
use http::{header, HeaderName, HeaderValue};
use pingora::http::RequestHeader;
use pingora::prelude::*;
use std::net::IpAddr;

/// An HTTP/2 request that names its host only in `:authority` gets it as a `Host` header too, as
/// an HTTP/1.1 request would carry it: a limit keyed on `header:host` then finds it (and the
/// HTTP/1.1 upstream is told it). One that has both is checked in `canonical`.
pub(super) fn host_from_authority(req: &mut RequestHeader) -> Result<()> {
    if req.headers.contains_key(header::HOST) {
        return Ok(());
    }
    match req
        .uri
        .authority()
        .map(|a| HeaderValue::from_str(a.as_str()))
    {
        Some(Ok(host)) => req.insert_header(header::HOST, host),
        _ => Ok(()),
    }
}

// Parsed once (see `headers`).
pub(super) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(super) static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub(super) static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// `X-Forwarded-For` with `ip` appended to what it held.
pub(super) fn forwarded_for(prior: Option<&[u8]>, ip: IpAddr) -> HeaderValue {
    let mut v = Vec::with_capacity(prior.map_or(0, |p| p.len() + 2) + 39);
    if let Some(prior) = prior {
        v.extend_from_slice(prior);
        v.extend_from_slice(b", ");
    }
    crate::text::ip(&mut v, ip);
    // The prior value was a valid header value, and an address adds only ASCII.
    HeaderValue::from_maybe_shared(Bytes::from(v)).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// `Content-Length: 54, 54` (or the same value twice), which Pingora accepts as 54, goes on as one
/// value: an upstream that reads the list differently could take the body for another request.
pub(super) fn single_content_length(req: &mut RequestHeader) -> Result<()> {
    let mut values = req.headers.get_all(header::CONTENT_LENGTH).iter();
    let Some(first) = values.next() else {
        return Ok(());
    };
    if values.next().is_none() && !first.as_bytes().contains(&b',') {
        return Ok(());
    }
    // Differing values never get here (`head::inspect` refuses them): the first number is it.
    let n = first
        .as_bytes()
        .split(|&b| b == b',')
        .next()
        .map(|v| String::from_utf8_lossy(v).trim().to_string())
        .unwrap_or_default();
    req.insert_header(header::CONTENT_LENGTH, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_for_appends_the_address_as_written() {
        let v4: IpAddr = "10.0.255.7".parse().unwrap();
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(forwarded_for(None, v4), "10.0.255.7");
        assert_eq!(forwarded_for(Some(b"1.2.3.4"), v6), "1.2.3.4, 2001:db8::1");
        assert_eq!(forwarded_for(None, "0.0.0.0".parse().unwrap()), "0.0.0.0");
    }
}
