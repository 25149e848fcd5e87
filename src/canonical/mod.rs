//! The request as routing, keys and the upstream all see it.
//!
//! A limit is only worth its promise if a client cannot step around it by spelling the same
//! request differently: `//login`, `/./login`, `/%6cogin` and `API.example.com.` name what
//! `/login` and `api.example.com` name. So the head is put in one canonical form before anything
//! reads it, and the upstream receives that same form: what is counted is exactly what is served.
//!
//! The path follows RFC 3986 §6.2.2 (as Envoy's `normalize_path` and `merge_slashes` do):
//! escapes of unreserved characters are decoded, the others uppercased, repeated slashes merged,
//! dot segments removed. Encoded slashes and backslashes, whose meaning differs between upstreams,
//! are refused unless the operator keeps them; control bytes always are. The query is kept byte for
//! byte. The host is lowercased, without its port and one trailing dot.
//!
//! A path that is canonical already (nearly every request) is borrowed, not copied.

use std::borrow::Cow;

mod field;
mod host;
mod path;

pub use field::trim_ows;

pub use host::{host, Host};
pub use path::normalize_path;

words! {
    /// Why a request was refused before any route saw it, as `ratelimit_requests_refused_total`'s
    /// `reason` label spells it.
    pub enum Refused {
        /// The request target is not a path this proxy can put in one canonical form.
        BadPath = "bad_path",
        /// The Host (or the target's authority) is missing, repeated or malformed.
        BadHost = "bad_host",
        /// A header that a limit keys on came more than once.
        DuplicateKeyHeader = "duplicate_key_header",
        /// The body's length is ambiguous (`Content-Length` values that differ, or with
        /// `Transfer-Encoding`).
        BadFraming = "bad_framing",
        /// An HTTP/2 field value with whitespace around it or a byte HTTP/1.1 refuses
        /// (RFC 9113 §8.2.1): it would not mean the same to this proxy and to its upstream.
        BadHeader = "bad_header",
    }
}

impl Refused {
    /// What the 400's body says.
    pub fn explain(self) -> &'static str {
        match self {
            Refused::BadPath => "the request target is not a valid path",
            Refused::BadHost => "the Host header is missing, repeated or invalid",
            Refused::DuplicateKeyHeader => {
                "a header this route's rate limit is keyed on appears more than once"
            }
            Refused::BadFraming => "the request body's length is ambiguous",
            Refused::BadHeader => {
                "a header value has whitespace around it or a byte HTTP does not allow"
            }
        }
    }
}

words! {
    /// What an escaped `/` (`%2F`) or `\` (`%5C`, or raw) in a path gets: upstreams disagree on
    /// whether they separate segments, so by default the request is refused.
    #[derive(Default)]
    pub enum EscapedSlashes {
        #[default]
        Reject = "reject",
        /// Kept encoded (`%2F`, `%5C`), for upstreams that need them and do not decode them.
        Keep = "keep",
    }
}
/// A request target, split (RFC 9112 §3.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    /// The host the absolute form names (`GET http://host/path`); the Host header is ignored then.
    pub authority: Option<&'a [u8]>,
    /// Canonical.
    pub path: Cow<'a, str>,
    /// As sent, without the `?`.
    pub query: Option<&'a str>,
}

/// Splits and normalises a request target as it came on the request line. Origin form
/// (`/path?query`) and absolute form (`http://host/path`) are accepted, `*` only for OPTIONS.
pub fn target<'a>(
    method: &str,
    raw: &'a [u8],
    slashes: EscapedSlashes,
) -> Result<Target<'a>, Refused> {
    if raw == b"*" {
        // Asterisk form asks about the server itself; routes only know paths.
        return match method {
            "OPTIONS" => Ok(Target {
                authority: None,
                path: Cow::Borrowed("*"),
                query: None,
            }),
            _ => Err(Refused::BadPath),
        };
    }
    let (authority, rest) = match raw.first() {
        Some(b'/') => (None, raw),
        _ => {
            let after_scheme = strip_prefix_ignore_case(raw, b"http://")
                .or_else(|| strip_prefix_ignore_case(raw, b"https://"))
                .ok_or(Refused::BadPath)?;
            let end = after_scheme
                .iter()
                .position(|b| matches!(b, b'/' | b'?'))
                .unwrap_or(after_scheme.len());
            (Some(&after_scheme[..end]), &after_scheme[end..])
        }
    };
    let (path, query) = match rest.iter().position(|&b| b == b'?') {
        Some(q) => (&rest[..q], Some(&rest[q + 1..])),
        None => (rest, None),
    };
    let query = match query {
        // Bytes a request line cannot carry are refused; the rest goes on as sent.
        Some(q) if q.iter().all(|&b| b > b' ' && b != 0x7f && b != b'#') => {
            Some(std::str::from_utf8(q).map_err(|_| Refused::BadPath)?)
        }
        Some(_) => return Err(Refused::BadPath),
        None => None,
    };
    let path = match path {
        // `http://host` and `http://host?q` name the root.
        b"" => Cow::Borrowed("/"),
        p => normalize_path(p, slashes)?,
    };
    Ok(Target {
        authority,
        path,
        query,
    })
}

fn strip_prefix_ignore_case<'a>(s: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    (s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &s[prefix.len()..])
}
/// A request as routing, keys and the upstream see it.
#[derive(Debug)]
pub struct Request<'a> {
    pub target: Target<'a>,
    /// `None` only for an HTTP/1.0 request without a Host: it matches routes without a host rule.
    pub host: Option<Host<'a>>,
}

/// Puts a request head in canonical form: its target (see [`target`]) and its host, from an
/// absolute-form target, else HTTP/2's `:authority` (`pseudo`), else the one Host header, which
/// HTTP/1.1 requires (RFC 9112 §3.2). An HTTP/2 request whose Host differs from its
/// `:authority` is refused (RFC 9113 §8.3.1 asks for them to agree), and so is one with a
/// malformed field value (see `field`; HTTP/1.1's parser refuses or trims those itself).
pub fn request<'a>(
    method: &str,
    raw_target: &'a [u8],
    version: http::Version,
    pseudo: Option<&'a [u8]>,
    headers: &'a http::HeaderMap,
    slashes: EscapedSlashes,
) -> Result<Request<'a>, Refused> {
    let target = target(method, raw_target, slashes)?;
    if version == http::Version::HTTP_2 {
        field::values(headers)?;
    }
    let mut hosts = headers.get_all(http::header::HOST).iter();
    let (first, second) = (hosts.next(), hosts.next());
    if second.is_some() {
        return Err(Refused::BadHost);
    }
    let host = match (target.authority, pseudo, first) {
        (Some(authority), _, _) => Some(host(authority)?),
        (None, Some(authority), Some(value))
            if !authority.eq_ignore_ascii_case(value.as_bytes()) =>
        {
            return Err(Refused::BadHost)
        }
        (None, Some(authority), _) => {
            // The upstream speaks HTTP/1.1: it is told the host in a Host header.
            let mut h = host(authority)?;
            h.as_sent = false;
            Some(h)
        }
        (None, None, Some(value)) => Some(host(value.as_bytes())?),
        (None, None, None) if version >= http::Version::HTTP_11 => return Err(Refused::BadHost),
        (None, None, None) => None,
    };
    Ok(Request { target, host })
}

/// The canonical request where it differs from what the client sent: the upstream serves exactly
/// what was counted. Empty (no allocation) for a request that was canonical already.
#[derive(Debug, Default)]
pub struct Rewrite {
    /// Origin-form path and query.
    pub target: Option<Vec<u8>>,
    /// `name[:port]`.
    pub host: Option<String>,
}

impl Request<'_> {
    /// What the upstream must be told differently from what the client sent; with
    /// `preserve_raw_path`, the target goes on as sent.
    pub fn rewrite(&self, preserve_raw_path: bool) -> Rewrite {
        let t = &self.target;
        let reshaped = matches!(t.path, Cow::Owned(_)) || t.authority.is_some();
        let target = (reshaped && !preserve_raw_path).then(|| {
            let mut target = t.path.as_bytes().to_vec();
            if let Some(q) = t.query {
                target.push(b'?');
                target.extend_from_slice(q.as_bytes());
            }
            target
        });
        let host = self
            .host
            .as_ref()
            .filter(|h| !h.as_sent || t.authority.is_some())
            .map(Host::header_value);
        Rewrite { target, host }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_split_into_authority_path_and_query() {
        let t = target("GET", b"/a//b?x=%2F&y=1//2", EscapedSlashes::Reject).unwrap();
        assert_eq!(
            (t.authority, &*t.path, t.query),
            (None, "/a/b", Some("x=%2F&y=1//2"))
        );
        let t = target(
            "GET",
            b"HTTP://Example.com//login?q",
            EscapedSlashes::Reject,
        )
        .unwrap();
        assert_eq!(
            (t.authority, &*t.path, t.query),
            (Some(&b"Example.com"[..]), "/login", Some("q"))
        );
        let t = target("GET", b"http://x", EscapedSlashes::Reject).unwrap();
        assert_eq!((t.authority, &*t.path), (Some(&b"x"[..]), "/"));
        assert_eq!(
            &*target("OPTIONS", b"*", EscapedSlashes::Reject)
                .unwrap()
                .path,
            "*"
        );
        for bad in [
            &b"*"[..],
            b"login",
            b"ftp://x/",
            b"x:80",
            b"/a?b c",
            b"/a?b#c",
        ] {
            assert_eq!(
                target("GET", bad, EscapedSlashes::Reject),
                Err(Refused::BadPath),
                "{bad:?}"
            );
        }
    }

    /// HTTP/2 names the host in `:authority`; a Host header beside it must agree.
    #[test]
    fn http2_takes_the_host_from_its_authority() {
        let decide = |authority: &[u8], host: Option<&str>| {
            let mut headers = http::HeaderMap::new();
            if let Some(h) = host {
                headers.insert(http::header::HOST, h.parse().unwrap());
            }
            request(
                "GET",
                b"/x",
                http::Version::HTTP_2,
                Some(authority),
                &headers,
                EscapedSlashes::Reject,
            )
            .map(|r| {
                (
                    r.host.as_ref().map(|h| h.name.to_string()),
                    r.rewrite(false).host,
                )
            })
        };
        let told = Ok((
            Some("api.example.com".into()),
            Some("api.example.com:8443".into()),
        ));
        assert_eq!(decide(b"API.example.com:8443", None), told);
        assert_eq!(
            decide(b"api.example.com:8443", Some("api.example.com:8443")),
            told
        );
        assert_eq!(
            decide(b"api.example.com", Some("other.example.com")),
            Err(Refused::BadHost)
        );
        assert_eq!(decide(b"a/b", None), Err(Refused::BadHost));
    }

    #[test]
    fn the_upstream_is_told_only_what_the_client_spelled_differently() {
        let rewrite = |target: &[u8], host: &str, preserve: bool| {
            let mut headers = http::HeaderMap::new();
            headers.insert(http::header::HOST, host.parse().unwrap());
            let r = request(
                "GET",
                target,
                http::Version::HTTP_11,
                None,
                &headers,
                EscapedSlashes::Reject,
            )
            .unwrap()
            .rewrite(preserve);
            (r.target.map(|t| String::from_utf8(t).unwrap()), r.host)
        };
        assert_eq!(
            rewrite(b"/login?a=1", "api.example.com:8080", false),
            (None, None)
        );
        assert_eq!(
            rewrite(b"//login?a=//1", "API.example.com.", false),
            (Some("/login?a=//1".into()), Some("api.example.com".into()))
        );
        assert_eq!(
            rewrite(b"//login", "a", true),
            (None, None),
            "preserve_raw_path"
        );
        assert_eq!(
            rewrite(b"http://a:80/x", "a:80", false),
            (Some("/x".into()), Some("a:80".into())),
            "absolute form goes on in origin form"
        );
    }
}
