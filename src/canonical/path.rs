//! The canonical form of a path (RFC 3986 §6.2.2, and merged slashes), borrowed when the path is
//! canonical already.

use super::{EscapedSlashes, Refused};
use std::borrow::Cow;

/// RFC 3986 unreserved: what an escape never needs to hide.
pub(super) fn unreserved(b: u8) -> bool {
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
}
