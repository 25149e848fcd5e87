//! The canonical form of a host: lowercase, without its port and one trailing dot.

use super::path::unreserved;
use super::Refused;
use std::borrow::Cow;
use std::net::Ipv6Addr;

/// A canonical host: lowercase, without one trailing dot and without its port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host<'a> {
    pub name: Cow<'a, str>,
    pub port: Option<u16>,
    /// The value was already `name[:port]`, as `header_value` writes it.
    pub as_sent: bool,
}

impl Host<'_> {
    /// `name[:port]`, as the upstream's Host header carries it.
    pub fn header_value(&self) -> String {
        match self.port {
            Some(p) => format!("{}:{p}", self.name),
            None => self.name.to_string(),
        }
    }
}

/// What a reg-name may hold besides dots: unreserved characters and sub-delims (RFC 3986 §3.2.2),
/// not escapes.
fn label_char(b: u8) -> bool {
    unreserved(b)
        || matches!(
            b,
            b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'='
        )
}

/// Parses a Host header value (or the authority of an absolute-form target): `reg-name[:port]` or
/// `[IPv6][:port]`. Userinfo, escapes, empty labels and anything outside RFC 3986's host syntax are
/// refused.
pub fn host(raw: &[u8]) -> Result<Host<'_>, Refused> {
    let mut upper = false;
    let (name, port) = if raw.first() == Some(&b'[') {
        let close = raw
            .iter()
            .position(|&b| b == b']')
            .ok_or(Refused::BadHost)?;
        let inside = std::str::from_utf8(&raw[1..close]).map_err(|_| Refused::BadHost)?;
        inside.parse::<Ipv6Addr>().map_err(|_| Refused::BadHost)?;
        upper = inside.bytes().any(|b| b.is_ascii_uppercase());
        let port = match &raw[close + 1..] {
            [] => None,
            [b':', port @ ..] => Some(port),
            _ => return Err(Refused::BadHost),
        };
        (&raw[..=close], port)
    } else {
        // One pass: where the name ends, that every byte may be in a name, that no label is
        // empty, and whether any letter must be lowercased.
        let mut end = raw.len();
        let mut empty_label = true;
        for (i, &b) in raw.iter().enumerate() {
            match b {
                b':' => {
                    end = i;
                    break;
                }
                b'.' if empty_label => return Err(Refused::BadHost),
                b'.' => empty_label = true,
                b if label_char(b) => {
                    upper |= b.is_ascii_uppercase();
                    empty_label = false;
                }
                _ => return Err(Refused::BadHost),
            }
        }
        // Empty here: the name is empty, or ends in a dot (one trailing dot is allowed).
        if empty_label && !(end > 1 && raw[end - 1] == b'.' && raw[end - 2] != b'.') {
            return Err(Refused::BadHost);
        }
        let port = (end < raw.len()).then(|| &raw[end + 1..]);
        (&raw[..end], port)
    };
    // `host:` (an empty port) and `host:080` are valid, but not how the upstream is told.
    let mut as_sent = !matches!(port, Some([]) | Some([b'0', _, ..]));
    let port = match port {
        // `host:` is an empty port: the default.
        None | Some([]) => None,
        Some(digits) if digits.len() <= 5 && digits.iter().all(u8::is_ascii_digit) => {
            let n: u32 = digits.iter().fold(0, |n, &d| n * 10 + u32::from(d - b'0'));
            Some(u16::try_from(n).map_err(|_| Refused::BadHost)?)
        }
        Some(_) => return Err(Refused::BadHost),
    };
    let stripped = name.strip_suffix(b".");
    as_sent &= stripped.is_none() && !upper;
    // ASCII by now.
    let name = std::str::from_utf8(stripped.unwrap_or(name)).map_err(|_| Refused::BadHost)?;
    let name = if upper {
        Cow::Owned(name.to_ascii_lowercase())
    } else {
        Cow::Borrowed(name)
    };
    Ok(Host {
        name,
        port,
        as_sent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_lowercased_without_port_or_trailing_dot() {
        let h = |s: &str| host(s.as_bytes()).map(|h| (h.name.into_owned(), h.port));
        let sent = |s: &str| host(s.as_bytes()).unwrap().as_sent;
        assert!(sent("api.example.com") && sent("api.example.com:8080") && sent("[::1]:80"));
        assert!(
            !sent("Api.example.com") && !sent("api.example.com.") && !sent("a:") && !sent("a:080")
        );
        assert_eq!(h("API.Example.com."), Ok(("api.example.com".into(), None)));
        assert_eq!(
            h("api.example.com:8080"),
            Ok(("api.example.com".into(), Some(8080)))
        );
        assert_eq!(h("api.example.com:"), Ok(("api.example.com".into(), None)));
        assert_eq!(h("[::1]:80"), Ok(("[::1]".into(), Some(80))));
        assert_eq!(h("10.0.0.1"), Ok(("10.0.0.1".into(), None)));
        assert!(matches!(
            host(b"api.example.com").unwrap().name,
            Cow::Borrowed(_)
        ));
        for bad in [
            "",
            ".",
            "a..b",
            ".a",
            "a.b..",
            "api.example.com:abc",
            "a:99999",
            "a:1:2",
            "user@a",
            "a%2eb",
            "a b",
            "a/b",
            "[::1",
            "[nope]",
            "[::1]x",
            "a\\b",
        ] {
            assert_eq!(h(bad), Err(Refused::BadHost), "{bad:?}");
        }
    }
}
