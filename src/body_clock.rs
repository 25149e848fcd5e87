//! The whole-body deadline of an HTTP/1.1 request (`downstream.request_body_timeout_ms`), kept
//! by the connection (`client_conn`) as Pingora reads the body through it.
//!
//! Pingora's read timeout is per read, so one byte every `body_timeout` kept a request, and the
//! upstream connection under it, for as long as the client liked. A minimum rate would not end
//! that either: a client that sends just above it keeps a chunked body open for ever. A deadline
//! on the whole body does, whatever the pace; its price, a legitimate upload slower than it is
//! cut, is why its default is generous. The deadline runs from the end of the head until the
//! body's last byte: a `Content-Length` body ends when that many bytes were read, a chunked one
//! at its last chunk's blank line, which `Chunks` finds as the bytes go by (Pingora parses them
//! properly; this only has to know where they end).

use std::io;

/// What a read past the deadline fails with, inside the `io::Error` Pingora wraps.
#[derive(Debug)]
pub struct Expired;

impl std::fmt::Display for Expired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive whole within request_body_timeout_ms")
    }
}

impl std::error::Error for Expired {}

/// The error a body read returns once the deadline has passed.
pub fn expired() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, Expired)
}

/// Whether Pingora's error `e` is a body read cut by the deadline.
pub fn is_expired(e: &pingora::Error) -> bool {
    e.root_cause()
        .downcast_ref::<io::Error>()
        .and_then(io::Error::get_ref)
        .is_some_and(|inner| inner.is::<Expired>())
}

/// Where a chunked body stands (RFC 9112 §7.1), byte by byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Chunks {
    /// In a chunk-size line: the size so far.
    #[default]
    Size,
    /// Past the size (extensions): its value kept.
    SizeRest(u64),
    /// In a chunk's data: bytes left.
    Data(u64),
    /// After a chunk's data, up to its line end.
    DataEnd,
    /// At the start of a trailer line, after the last chunk.
    TrailerStart,
    /// In a trailer line.
    Trailer,
    /// The body has ended.
    Done,
}

/// A chunked body's state: the size being read lives beside `Chunks::Size`.
#[derive(Debug, Default)]
pub struct ChunkedEnd {
    state: Chunks,
    size: u64,
}

impl ChunkedEnd {
    /// Follows `bytes` of the body; whether it has ended.
    pub fn feed(&mut self, mut bytes: &[u8]) -> bool {
        while let Some((&b, rest)) = bytes.split_first() {
            match self.state {
                Chunks::Done => return true,
                Chunks::Data(left) => {
                    let take = (left as usize).min(bytes.len());
                    bytes = &bytes[take..];
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        Chunks::DataEnd
                    } else {
                        Chunks::Data(left)
                    };
                    continue;
                }
                Chunks::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        let digit = (b as char).to_digit(16).unwrap_or(0);
                        self.size = self
                            .size
                            .saturating_mul(16)
                            .saturating_add(u64::from(digit));
                    }
                    b'\n' => self.end_of_size(self.size),
                    _ => self.state = Chunks::SizeRest(self.size),
                },
                Chunks::SizeRest(size) => {
                    if b == b'\n' {
                        self.end_of_size(size);
                    }
                }
                Chunks::DataEnd => {
                    if b == b'\n' {
                        self.state = Chunks::Size;
                        self.size = 0;
                    }
                }
                Chunks::TrailerStart => match b {
                    b'\r' => {}
                    b'\n' => self.state = Chunks::Done,
                    _ => self.state = Chunks::Trailer,
                },
                Chunks::Trailer => {
                    if b == b'\n' {
                        self.state = Chunks::TrailerStart;
                    }
                }
            }
            bytes = rest;
        }
        self.state == Chunks::Done
    }

    fn end_of_size(&mut self, size: u64) {
        self.state = match size {
            0 => Chunks::TrailerStart,
            n => Chunks::Data(n),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunked_body_ends_at_its_last_chunk_read_in_any_pieces() {
        let body = b"5;ext=1\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nX-T: 1\r\n\r\n";
        for cut in 0..body.len() {
            let mut end = ChunkedEnd::default();
            assert!(!end.feed(&body[..cut]), "ended early at {cut}");
            assert!(end.feed(&body[cut..]), "not ended after {cut}");
        }
        let mut end = ChunkedEnd::default();
        assert!(end.feed(b"0\r\n\r\n"));
        let mut trickle = ChunkedEnd::default();
        assert!(!trickle.feed(b"3\r\nabc\r\n0\r\nX-Slow: "));
    }

    #[test]
    fn an_expired_read_is_known_through_pingoras_wrapping() {
        use pingora::OrErr;
        let wrapped: pingora::Result<()> =
            Err(expired()).or_err(pingora::ErrorType::ReadError, "when reading body");
        assert!(is_expired(&wrapped.unwrap_err()));
        let other: pingora::Result<()> = Err(io::Error::from(io::ErrorKind::TimedOut))
            .or_err(pingora::ErrorType::ReadError, "when reading body");
        assert!(!is_expired(&other.unwrap_err()));
    }
}
