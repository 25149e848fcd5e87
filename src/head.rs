//! A request head as the connection sees it before Pingora parses it: where it ends, and how
//! long the body after it is.
//!
//! The connection reads each head itself (`client_conn`) so that a deadline covers the whole head,
//! and it must know where the body ends so that a request sent right behind it (pipelining) waits
//! for its turn instead of being taken for body bytes. Framing a proxy and its upstream could read
//! differently is refused here, before anything is parsed twice: differing `Content-Length`
//! values, `Content-Length` with `Transfer-Encoding` (RFC 9112 §6.3: "ought to be handled as an
//! error"), a transfer coding that does not end in `chunked`, and a second `Host`.

use crate::canonical::Refused;
use crate::text;

/// Where the head in `buf` ends (just past its blank line), if it has arrived whole. Empty lines
/// before the request line are skipped, as HTTP/1.1 servers must (RFC 9112 §2.2). `from` is where
/// the previous call stopped looking, so that reading a head in many pieces stays linear.
pub fn end(buf: &[u8], from: usize) -> Option<usize> {
    let start = buf.iter().position(|&b| b != b'\r' && b != b'\n')?;
    let mut i = from.max(start);
    while let Some(at) = memchr::memchr(b'\n', &buf[i..]) {
        let newline = i + at;
        match &buf[newline + 1..] {
            [b'\n', ..] => return Some(newline + 2),
            [b'\r', b'\n', ..] => return Some(newline + 3),
            _ => i = newline + 1,
        }
    }
    None
}

/// Where to resume looking for the end after `end(buf, _)` found none.
pub fn resume_at(buf: &[u8]) -> usize {
    buf.len().saturating_sub(2)
}

/// What follows a head on the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// Exactly this many bytes (0 when the request has no body).
    Length(u64),
    /// A chunked body: its end is found by parsing it.
    Chunked,
    /// The connection may become a tunnel (`Upgrade`, `CONNECT`): everything after the head is
    /// the upstream's.
    Tunnel,
}

/// The body's framing, or why the head is refused. Anything else malformed is left to Pingora's
/// parser, which answers 400 itself.
pub fn inspect(head: &[u8]) -> Result<Body, Refused> {
    let mut lines = memchr::memchr_iter(b'\n', head)
        .scan(0, |start, end| {
            let line = &head[*start..end];
            *start = end + 1;
            Some(line.strip_suffix(b"\r").unwrap_or(line))
        })
        .skip_while(|l| l.is_empty());
    let request_line = lines.next().unwrap_or_default();
    let http10 = request_line.ends_with(b"HTTP/1.0");
    let connect = request_line.starts_with(b"CONNECT ");
    let mut length: Option<u64> = None;
    let mut chunked: Option<bool> = None;
    let mut hosts = 0;
    let mut upgrade = false;
    for line in lines {
        // Only four names matter here: most lines are passed over by their first letter.
        let (wanted, first): (&[u8], _) = match line.first().map(u8::to_ascii_lowercase) {
            Some(b'c') => (b"content-length", b'c'),
            Some(b't') => (b"transfer-encoding", b't'),
            Some(b'h') => (b"host", b'h'),
            Some(b'u') => (b"upgrade", b'u'),
            _ => continue,
        };
        let named = line.len() > wanted.len()
            && line[wanted.len()] == b':'
            && line[..wanted.len()].eq_ignore_ascii_case(wanted);
        if !named {
            continue;
        }
        let value = trim(&line[wanted.len() + 1..]);
        match first {
            b'c' => {
                for n in value.split(|&b| b == b',').map(trim) {
                    let n = text::digits(n).ok_or(Refused::BadFraming)?;
                    if length.is_some_and(|l| l != n) {
                        return Err(Refused::BadFraming);
                    }
                    length = Some(n);
                }
            }
            b't' => {
                // Only the last coding of the last line counts: it must be chunked.
                let last = value.rsplit(|&b| b == b',').next().map(trim);
                chunked = Some(last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked")));
            }
            b'h' => hosts += 1,
            _ => upgrade = true,
        }
    }
    if hosts > 1 {
        return Err(Refused::BadHost);
    }
    match (length, chunked) {
        (Some(_), Some(_)) | (_, Some(false)) => Err(Refused::BadFraming),
        (None, Some(true)) if http10 => Err(Refused::BadFraming),
        _ if upgrade || connect => Ok(Body::Tunnel),
        (None, Some(true)) => Ok(Body::Chunked),
        (length, None) => Ok(Body::Length(length.unwrap_or(0))),
    }
}

fn trim(s: &[u8]) -> &[u8] {
    let start = s
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &s[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_end_of_a_head_read_in_pieces() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\nNEXT";
        assert_eq!(end(head, 0), Some(head.len() - 4));
        for cut in 0..head.len() - 4 {
            let part = &head[..cut];
            assert_eq!(end(part, 0), None, "{cut}");
            assert_eq!(end(head, resume_at(part)), Some(head.len() - 4), "{cut}");
        }
        assert_eq!(end(b"GET / HTTP/1.1\nHost: a\n\nx", 0), Some(24));
        assert_eq!(
            end(b"\r\n\r\nGET / HTTP/1.1\r\n\r\n", 0),
            Some(22),
            "leading empty lines"
        );
        assert_eq!(end(b"\r\n\r\n", 0), None);
    }

    #[test]
    fn reads_the_body_length() {
        let body = |h: &str| inspect(h.as_bytes());
        assert_eq!(
            body("GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
            Ok(Body::Length(0))
        );
        assert_eq!(
            body("POST / HTTP/1.1\r\ncontent-length: 54\r\n\r\n"),
            Ok(Body::Length(54))
        );
        assert_eq!(
            body("POST / HTTP/1.1\r\nContent-Length: 54, 54\r\nContent-Length: 54\r\n\r\n"),
            Ok(Body::Length(54))
        );
        assert_eq!(
            body("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            Ok(Body::Chunked)
        );
        assert_eq!(
            body("GET / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n"),
            Ok(Body::Tunnel)
        );
        assert_eq!(body("CONNECT a:443 HTTP/1.1\r\n\r\n"), Ok(Body::Tunnel));
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        let body = |h: &str| inspect(h.as_bytes());
        for bad in [
            "POST / HTTP/1.1\r\nContent-Length: 54, 55\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 54\r\nContent-Length: 5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: +54\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: \r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 54\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert_eq!(body(bad), Err(Refused::BadFraming), "{bad:?}");
        }
        assert_eq!(
            body("GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n"),
            Err(Refused::BadHost)
        );
    }
}
