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

pub use crate::config::EscapedSlashes;
use std::borrow::Cow;
use std::net::Ipv6Addr;

/// Why a request was refused before any route saw it, as `ratelimit_requests_refused_total`'s
/// `reason` label spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The request target is not a path this proxy can put in one canonical form.
    BadPath,
    /// The Host (or the target's authority) is missing, repeated or malformed.
    BadHost,
    /// A header that a limit keys on came more than once.
    DuplicateKeyHeader,
    /// The body's length is ambiguous (`Content-Length` values that differ, or with
    /// `Transfer-Encoding`).
    BadFraming,
}

impl Refused {
    pub const ALL: [Refused; 4] = [
        Refused::BadPath,
        Refused::BadHost,
        Refused::DuplicateKeyHeader,
        Refused::BadFraming,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refused::BadPath => "bad_path",
            Refused::BadHost => "bad_host",
            Refused::DuplicateKeyHeader => "duplicate_key_header",
            Refused::BadFraming => "bad_framing",
        }
    }

    /// What the 400's body says.
    pub fn explain(self) -> &'static str {
        match self {
            Refused::BadPath => "the request target is not a valid path",
            Refused::BadHost => "the Host header is missing, repeated or invalid",
            Refused::DuplicateKeyHeader => {
                "a header this route's rate limit is keyed on appears more than once"
            }
            Refused::BadFraming => "the request body's length is ambiguous",
        }
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

/// RFC 3986 unreserved: what an escape never needs to hide.
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// What a path may carry unescaped: pchar (unreserved, sub-delims, `:` and `@`) and `/`.
fn path_char(b: u8) -> bool {
    unreserved(b)
        || matches!(
            b,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
                | b'/'
        )
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// What an escaped byte becomes.
enum Escape {
    /// Unreserved: decoded.
    Decode(u8),
    /// Kept encoded, in uppercase.
    Keep(u8),
}

fn escape(byte: u8, slashes: EscapedSlashes) -> Result<Escape, Refused> {
    match byte {
        b if unreserved(b) => Ok(Escape::Decode(b)),
        b'/' | b'\\' if slashes == EscapedSlashes::Reject => Err(Refused::BadPath),
        // An escaped NUL or control byte means nothing in a path and truncates or splits it in
        // some upstreams.
        b if b < 0x20 || b == 0x7f => Err(Refused::BadPath),
        b => Ok(Escape::Keep(b)),
    }
}

/// Whether `path` is its own canonical form: only path characters and uppercase escapes of bytes
/// that stay encoded, no empty segment but a trailing one, no dot segment.
fn is_canonical(path: &[u8], slashes: EscapedSlashes) -> bool {
    if path.first() != Some(&b'/') {
        return false;
    }
    let mut segment_start = 1;
    let mut i = 1;
    while i <= path.len() {
        let b = path.get(i).copied().unwrap_or(b'/');
        match b {
            b'/' => {
                let segment = &path[segment_start..i];
                let last = i == path.len();
                if matches!(segment, b"." | b"..") || (segment.is_empty() && !last) {
                    return false;
                }
                segment_start = i + 1;
            }
            b'%' => {
                let (Some(hi), Some(lo)) = (path.get(i + 1), path.get(i + 2)) else {
                    return false;
                };
                let upper = |c: &u8| c.is_ascii_digit() || (b'A'..=b'F').contains(c);
                if !upper(hi) || !upper(lo) {
                    return false;
                }
                let byte = (hex(*hi).unwrap_or(0) << 4) | hex(*lo).unwrap_or(0);
                if !matches!(escape(byte, slashes), Ok(Escape::Keep(_))) {
                    return false;
                }
                i += 2;
            }
            b if path_char(b) => {}
            _ => return false,
        }
        i += 1;
    }
    true
}

/// The canonical form of a path (without its query), or why it has none.
pub fn normalize_path(path: &[u8], slashes: EscapedSlashes) -> Result<Cow<'_, str>, Refused> {
    if is_canonical(path, slashes) {
        // Only ASCII path characters passed the check.
        return std::str::from_utf8(path)
            .map(Cow::Borrowed)
            .map_err(|_| Refused::BadPath);
    }
    if path.first() != Some(&b'/') {
        return Err(Refused::BadPath);
    }
    let decoded = decode(path, slashes)?;
    Ok(Cow::Owned(remove_dot_segments(&decoded)))
}

/// Step one: every byte in its canonical spelling (escapes decoded or uppercased, bytes that a
/// path cannot carry raw escaped), segments untouched.
fn decode(path: &[u8], slashes: EscapedSlashes) -> Result<String, Refused> {
    let mut out = String::with_capacity(path.len() + 8);
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        match b {
            b'%' => {
                let byte = match (
                    path.get(i + 1).and_then(|&c| hex(c)),
                    path.get(i + 2).and_then(|&c| hex(c)),
                ) {
                    (Some(hi), Some(lo)) => (hi << 4) | lo,
                    _ => return Err(Refused::BadPath),
                };
                match escape(byte, slashes)? {
                    Escape::Decode(c) => out.push(c as char),
                    Escape::Keep(c) => push_escaped(&mut out, c),
                }
                i += 3;
                continue;
            }
            b'\\' if slashes == EscapedSlashes::Reject => return Err(Refused::BadPath),
            b'\\' => push_escaped(&mut out, b),
            // Control bytes, and `#`: a fragment never belongs in a request.
            b if b <= b' ' || b == 0x7f || b == b'#' => return Err(Refused::BadPath),
            b if path_char(b) => out.push(b as char),
            // `"`, `<`, `{`, non-ASCII and the like: what a browser would have escaped.
            b => push_escaped(&mut out, b),
        }
        i += 1;
    }
    Ok(out)
}

fn push_escaped(out: &mut String, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(HEX[usize::from(b >> 4)] as char);
    out.push(HEX[usize::from(b & 0xf)] as char);
}

/// Step two: repeated slashes merged, `.` and `..` segments resolved (RFC 3986 §5.2.4; `..` never
/// climbs above the root). A path that ended in `/`, `.` or `..` keeps a trailing slash.
fn remove_dot_segments(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut trailing = false;
    for segment in path[1..].split('/') {
        trailing = true;
        match segment {
            "" | "." => {}
            ".." => out.truncate(out.rfind('/').unwrap_or(0)),
            s => {
                out.push('/');
                out.push_str(s);
                trailing = false;
            }
        }
    }
    if trailing || out.is_empty() {
        out.push('/');
    }
    out
}

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

/// Parses a Host header value (or the authority of an absolute-form target): `reg-name[:port]` or
/// `[IPv6][:port]`. Userinfo, escapes, empty labels and anything outside RFC 3986's host syntax are
/// refused.
pub fn host(raw: &[u8]) -> Result<Host<'_>, Refused> {
    let (name, port) = if raw.first() == Some(&b'[') {
        let close = raw
            .iter()
            .position(|&b| b == b']')
            .ok_or(Refused::BadHost)?;
        let inside = std::str::from_utf8(&raw[1..close]).map_err(|_| Refused::BadHost)?;
        inside.parse::<Ipv6Addr>().map_err(|_| Refused::BadHost)?;
        let port = match &raw[close + 1..] {
            [] => None,
            [b':', port @ ..] => Some(port),
            _ => return Err(Refused::BadHost),
        };
        (&raw[..=close], port)
    } else {
        match raw.iter().position(|&b| b == b':') {
            Some(colon) => (&raw[..colon], Some(&raw[colon + 1..])),
            None => (raw, None),
        }
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
    let name = if name.first() == Some(&b'[') {
        name
    } else {
        let stripped = name.strip_suffix(b".");
        as_sent &= stripped.is_none();
        let name = stripped.unwrap_or(name);
        let label_char = |b: &u8| {
            unreserved(*b)
                || matches!(
                    b,
                    b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'='
                )
        };
        if name.is_empty()
            || !name.iter().all(label_char)
            || name.split(|&b| b == b'.').any(<[u8]>::is_empty)
        {
            return Err(Refused::BadHost);
        }
        name
    };
    // ASCII by now.
    let name = std::str::from_utf8(name).map_err(|_| Refused::BadHost)?;
    let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
        as_sent = false;
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

/// A request as routing, keys and the upstream see it.
#[derive(Debug)]
pub struct Request<'a> {
    pub target: Target<'a>,
    /// `None` only for an HTTP/1.0 request without a Host: it matches routes without a host rule.
    pub host: Option<Host<'a>>,
}

/// Puts a request head in canonical form: its target (see [`target`]) and its host, from an
/// absolute-form target or else the one Host header, which HTTP/1.1 requires (RFC 9112 §3.2).
pub fn request<'a>(
    method: &str,
    raw_target: &'a [u8],
    version: http::Version,
    headers: &'a http::HeaderMap,
    slashes: EscapedSlashes,
) -> Result<Request<'a>, Refused> {
    let target = target(method, raw_target, slashes)?;
    let mut hosts = headers.get_all(http::header::HOST).iter();
    let (first, second) = (hosts.next(), hosts.next());
    if second.is_some() {
        return Err(Refused::BadHost);
    }
    let host = match (target.authority, first) {
        (Some(authority), _) => Some(host(authority)?),
        (None, Some(value)) => Some(host(value.as_bytes())?),
        (None, None) if version >= http::Version::HTTP_11 => return Err(Refused::BadHost),
        (None, None) => None,
    };
    Ok(Request { target, host })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> Result<String, Refused> {
        normalize_path(p.as_bytes(), EscapedSlashes::Reject).map(Cow::into_owned)
    }

    #[test]
    fn canonical_paths_are_borrowed() {
        for p in [
            "/",
            "/login",
            "/api/v1/users/",
            "/a%20b",
            "/a:b@c!$&'()*+,;=",
            "/%C3%A9",
            "/...",
        ] {
            assert!(
                matches!(normalize_path(p.as_bytes(), EscapedSlashes::Reject), Ok(Cow::Borrowed(b)) if b == p),
                "{p}"
            );
        }
    }

    #[test]
    fn spellings_of_one_path_meet() {
        for p in [
            "//login",
            "/./login",
            "/x/../login",
            "/%6cogin",
            "/%6Cogin",
            "/%2e/login",
            "/%2E%2E/login",
            "/a/b/../../login",
            "/../../login",
            "///login",
        ] {
            assert_eq!(path(p).as_deref(), Ok("/login"), "{p}");
        }
        assert_eq!(path("/api/../login").as_deref(), Ok("/login"));
        assert_eq!(path("/a/b/..").as_deref(), Ok("/a/"));
        assert_eq!(path("/a/.").as_deref(), Ok("/a/"));
        assert_eq!(path("/a//").as_deref(), Ok("/a/"));
        assert_eq!(path("/a%2fb").ok(), None);
        assert_eq!(path("/a%7eb").as_deref(), Ok("/a~b"));
        assert_eq!(
            path("/a%3ab").as_deref(),
            Ok("/a%3Ab"),
            "reserved: uppercased, kept"
        );
        assert_eq!(path("/caf\u{e9}").as_deref(), Ok("/caf%C3%A9"));
        assert_eq!(path("/a\"b{c}").as_deref(), Ok("/a%22b%7Bc%7D"));
    }

    #[test]
    fn hostile_paths_are_refused() {
        for p in [
            "\\login",
            "/\\login",
            "/a%5cb",
            "/a%2Fb",
            "/a%00b",
            "/a%0d%0ab",
            "/a%zz",
            "/a%4",
            "/a%",
            "login",
            "",
            "/a#frag",
            "/a\x01b",
        ] {
            assert_eq!(path(p), Err(Refused::BadPath), "{p:?}");
        }
    }

    #[test]
    fn escaped_slashes_can_be_kept() {
        let keep =
            |p: &str| normalize_path(p.as_bytes(), EscapedSlashes::Keep).map(Cow::into_owned);
        assert_eq!(keep("/a%2fb/%5c").as_deref(), Ok("/a%2Fb/%5C"));
        assert_eq!(keep("/a\\b").as_deref(), Ok("/a%5Cb"));
        assert!(matches!(
            normalize_path(b"/a%2Fb", EscapedSlashes::Keep),
            Ok(Cow::Borrowed(_))
        ));
        assert_eq!(keep("/a%00"), Err(Refused::BadPath));
    }

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
