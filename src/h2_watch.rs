//! Each HTTP/2 stream's request held to the body deadlines, watched from the connection's bytes.
//!
//! Pingora's HTTP/2 server reads request bodies with no timeout at all: a stream with an open
//! request and no data kept its upstream connection, and the HTTP/2 connection (never idle while
//! a stream is open), for ever. Its streams are out of reach of this proxy's code once accepted
//! (the `h2` crate frames them, Pingora reads them), so the connection (`client_conn`) follows
//! the frame headers going each way instead: a stream's request is open from its HEADERS until
//! the client's END_STREAM, or a reset, or the end of the response. A request still open
//! `request_body_timeout` after its HEADERS, or with no frame for `body_timeout`, is cut: a
//! HEADERS frame with an empty block and no END_STREAM (trailers that do not end the stream) is
//! handed to the `h2` crate as if the client had sent it, between two of the client's frames;
//! `h2` treats it as the malformed message it is and resets the stream (RST_STREAM
//! PROTOCOL_ERROR to the client), so Pingora's read fails and the upstream is let go. A client
//! that stalls in the middle of a frame past a deadline has its connection closed instead.

use crate::metrics::{Closed, Metrics};
use std::collections::HashMap;
use tokio::time::{Duration, Instant};

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// The client's connection preface, which comes before its first frame.
const PREFACE_LEN: usize = 24;

/// Frame headers found in one direction of the connection, as its bytes go by.
#[derive(Debug)]
struct Frames {
    /// Preface bytes still to skip.
    skip_preface: usize,
    head: [u8; 9],
    head_len: usize,
    payload_left: usize,
    /// A header block is open on this stream (HEADERS without END_HEADERS): nothing may come
    /// between it and its CONTINUATION frames.
    in_block: bool,
}

impl Frames {
    fn new(preface: bool) -> Frames {
        Frames {
            skip_preface: if preface { PREFACE_LEN } else { 0 },
            head: [0; 9],
            head_len: 0,
            payload_left: 0,
            in_block: false,
        }
    }

    /// Between two frames, outside a header block: where a frame may be put.
    fn at_boundary(&self) -> bool {
        self.skip_preface == 0 && self.head_len == 0 && self.payload_left == 0 && !self.in_block
    }

    /// Follows `bytes`; `frame(kind, flags, stream)` for each frame header completed.
    fn feed(&mut self, mut bytes: &[u8], mut frame: impl FnMut(u8, u8, u32)) {
        while !bytes.is_empty() {
            if self.skip_preface > 0 {
                let n = self.skip_preface.min(bytes.len());
                self.skip_preface -= n;
                bytes = &bytes[n..];
                continue;
            }
            if self.payload_left > 0 {
                let n = self.payload_left.min(bytes.len());
                self.payload_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.head_len).min(bytes.len());
            self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
            self.head_len += n;
            bytes = &bytes[n..];
            if self.head_len == 9 {
                let h = self.head;
                self.head_len = 0;
                self.payload_left = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
                let (kind, flags) = (h[3], h[4]);
                let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                if matches!(kind, HEADERS | CONTINUATION) {
                    self.in_block = flags & END_HEADERS == 0;
                }
                frame(kind, flags, stream);
            }
        }
    }
}

/// A stream whose request is still coming.
#[derive(Debug, Clone, Copy)]
struct Open {
    since: Instant,
    last: Instant,
}

/// One HTTP/2 connection's open requests and their deadlines.
pub struct H2Watch {
    body_timeout: Duration,
    request_body_timeout: Duration,
    metrics: Option<Metrics>,
    read: Frames,
    written: Frames,
    open: HashMap<u32, Open>,
}

impl std::fmt::Debug for H2Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Watch")
            .field("open", &self.open.len())
            .finish()
    }
}

/// Whether Pingora's error `e` is a stream reset this side made (`h2` says "detected" for its
/// own, "received" for the client's): a cut stream's read fails with it.
pub fn reset_here(e: &pingora::Error) -> bool {
    e.root_cause()
        .to_string()
        .starts_with("stream error detected")
}

/// What the connection must do about a passed deadline.
#[derive(Debug, PartialEq, Eq)]
pub enum Cut {
    /// Hand these bytes (frames) to the `h2` crate before the client's next ones.
    Inject(Vec<u8>),
    /// The client stalled mid-frame: close the connection.
    Close,
}

impl H2Watch {
    pub fn new(
        body_timeout: Duration,
        request_body_timeout: Duration,
        metrics: Option<Metrics>,
    ) -> H2Watch {
        H2Watch {
            body_timeout,
            request_body_timeout,
            metrics,
            read: Frames::new(true),
            written: Frames::new(false),
            open: HashMap::new(),
        }
    }

    /// `bytes` from the client went to the `h2` crate.
    pub fn client_sent(&mut self, bytes: &[u8], now: Instant) {
        let open = &mut self.open;
        self.read.feed(bytes, |kind, flags, stream| {
            if stream == 0 {
                return;
            }
            let ends = flags & END_STREAM != 0 && matches!(kind, DATA | HEADERS);
            match (kind, open.get_mut(&stream)) {
                (RST_STREAM, _) | (_, Some(_)) if ends || kind == RST_STREAM => {
                    open.remove(&stream);
                }
                (_, Some(o)) => o.last = now,
                (HEADERS, None) if !ends => {
                    open.insert(
                        stream,
                        Open {
                            since: now,
                            last: now,
                        },
                    );
                }
                _ => {}
            }
        });
    }

    /// `bytes` of the server went to the client: a reset, or the response's end, ends the
    /// request too.
    pub fn server_sent(&mut self, bytes: &[u8]) {
        let open = &mut self.open;
        self.written.feed(bytes, |kind, flags, stream| {
            let ends = flags & END_STREAM != 0 && matches!(kind, DATA | HEADERS);
            if ends || kind == RST_STREAM {
                open.remove(&stream);
            }
        });
    }

    /// The next deadline of any open request.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.open
            .values()
            .map(|o| (o.since + self.request_body_timeout).min(o.last + self.body_timeout))
            .min()
    }

    /// The requests past a deadline at `now`, cut: counted, and what the connection must do.
    pub fn cut(&mut self, now: Instant) -> Option<Cut> {
        let (whole, idle) = (self.request_body_timeout, self.body_timeout);
        let expired: Vec<(u32, Closed)> = self
            .open
            .iter()
            .filter_map(|(&id, o)| {
                if now >= o.since + whole {
                    Some((id, Closed::RequestBodyTimeout))
                } else if now >= o.last + idle {
                    Some((id, Closed::BodyTimeout))
                } else {
                    None
                }
            })
            .collect();
        if expired.is_empty() {
            return None;
        }
        if !self.read.at_boundary() {
            return Some(Cut::Close);
        }
        let mut frames = Vec::with_capacity(9 * expired.len());
        for (id, why) in expired {
            self.open.remove(&id);
            if let Some(m) = &self.metrics {
                m.connection_closed(why);
            }
            frames.extend_from_slice(&[0, 0, 0, HEADERS, END_HEADERS]);
            frames.extend_from_slice(&id.to_be_bytes());
        }
        Some(Cut::Inject(frames))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, len: usize) -> Vec<u8> {
        let mut f = (len as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend(std::iter::repeat_n(0u8, len));
        f
    }

    #[test]
    fn an_open_request_is_cut_at_its_deadlines_and_an_ended_one_is_not() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut w = H2Watch::new(s, 3 * s, None);
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(4, 0, 0, 6)); // SETTINGS
        bytes.extend(frame(HEADERS, END_HEADERS, 1, 10)); // a body follows
        bytes.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, 10)); // none
        bytes.extend(frame(HEADERS, END_HEADERS, 5, 10));
        bytes.extend(frame(DATA, END_STREAM, 5, 3)); // ended
                                                     // In pieces, as reads deliver them.
        for piece in bytes.chunks(7) {
            w.client_sent(piece, t0);
        }
        assert_eq!(w.next_deadline(), Some(t0 + s));
        assert_eq!(w.cut(t0 + s / 2), None);
        // Data keeps stream 1 alive past the idle time, not past the whole deadline.
        w.client_sent(&frame(DATA, 0, 1, 1), t0 + s / 2);
        assert_eq!(w.cut(t0 + s), None);
        let cut = w.cut(t0 + 3 * s);
        assert_eq!(
            cut,
            Some(Cut::Inject(vec![0, 0, 0, HEADERS, END_HEADERS, 0, 0, 0, 1]))
        );
        assert_eq!(w.next_deadline(), None);
    }

    #[test]
    fn the_response_end_ends_the_request_and_a_half_frame_closes_the_connection() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut w = H2Watch::new(s, 3 * s, None);
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(HEADERS, END_HEADERS, 1, 4));
        bytes.extend(frame(HEADERS, END_HEADERS, 3, 4));
        w.client_sent(&bytes, t0);
        w.server_sent(&frame(HEADERS, END_HEADERS | END_STREAM, 1, 2));
        w.client_sent(&frame(DATA, 0, 3, 100)[..20], t0);
        assert_eq!(w.cut(t0 + s), Some(Cut::Close));
    }
}
