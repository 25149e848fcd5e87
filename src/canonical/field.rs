//! Header field values as both protocols must carry them.
//!
//! HTTP/1.1's parser (httparse, under Pingora) refuses control bytes in a value and trims the
//! optional whitespace around it, so `X-User: victim ` is `victim`. HTTP/2 carries a value as a
//! length-prefixed string: the `h2` crate refuses control bytes (CR, LF, NUL, DEL) with a
//! connection error but lets a leading or trailing space or tab through, which RFC 9113 §8.2.1
//! makes malformed. Let through, `victim ` would be a fresh bucket here while the HTTP/1.1
//! upstream, trimming it, serves the victim: so such a request is refused, and a key part is
//! read trimmed whatever the protocol.

use super::Refused;

/// Whether `b` may stand in a field value: HTAB, SP, visible ASCII and obs-text (RFC 9110 §5.5),
/// the bytes httparse lets through.
fn allowed(b: u8) -> bool {
    matches!(b, b'\t' | b' '..=0x7e | 0x80..=0xff)
}

fn ows(b: u8) -> bool {
    matches!(b, b' ' | b'\t')
}

/// Refuses a request one of whose field values starts or ends with whitespace or holds a byte
/// HTTP/1.1 refuses: the same value must mean the same thing on both protocols.
pub fn values(headers: &http::HeaderMap) -> Result<(), Refused> {
    let bad = |v: &[u8]| {
        v.first().is_some_and(|&b| ows(b))
            || v.last().is_some_and(|&b| ows(b))
            || !v.iter().all(|&b| allowed(b))
    };
    match headers.values().any(|v| bad(v.as_bytes())) {
        true => Err(Refused::BadHeader),
        false => Ok(()),
    }
}

/// `v` without the optional whitespace around it (RFC 9110 §5.5), as HTTP/1.1's parser reads it.
pub fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|&b| !ows(b)).unwrap_or(v.len());
    let end = v.iter().rposition(|&b| !ows(b)).map_or(start, |e| e + 1);
    &v[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(value: &[u8]) -> Result<(), Refused> {
        let mut headers = http::HeaderMap::new();
        headers.insert("x-user", http::HeaderValue::from_bytes(value).unwrap());
        values(&headers)
    }

    #[test]
    fn whitespace_around_a_value_is_malformed() {
        for bad in [&b"victim "[..], b"\tvictim", b" victim", b"victim\t", b" "] {
            assert_eq!(one(bad), Err(Refused::BadHeader), "{bad:?}");
        }
        for good in [&b"victim"[..], b"", b"a b\tc", b"caf\xc3\xa9 {}}{ ~#"] {
            assert_eq!(one(good), Ok(()), "{good:?}");
        }
    }

    #[test]
    fn ows_is_trimmed_as_http1_trims_it() {
        assert_eq!(trim_ows(b" \tvictim \t"), b"victim");
        assert_eq!(trim_ows(b"a b"), b"a b");
        assert_eq!(trim_ows(b"  "), b"");
        assert_eq!(trim_ows(b""), b"");
        // Only SP and HTAB are OWS.
        assert_eq!(trim_ows(b"\x0bv"), b"\x0bv");
    }

    #[test]
    fn the_bytes_http1_refuses_are_refused() {
        // `HeaderValue` (what both servers build) cannot hold them; a map filled otherwise is
        // checked all the same.
        for b in (0u8..=0x1f).filter(|&b| b != b'\t').chain([0x7f]) {
            assert!(!allowed(b), "{b:#x}");
        }
        assert!((0x20u8..=0x7e).chain(0x80..=0xff).all(allowed));
    }
}
