//! The usage event a client did not ask for, taken out of its stream.
//!
//! `stream_usage: request` asks an OpenAI-style stream for its usage on the client's behalf. The
//! answer then ends with one more chunk, whose `choices` is empty: a client that never asked for
//! it may read `choices[0]` of every chunk and fail on that one. So the proxy, having read the
//! usage from it, does not pass it on. Events are held only until their blank line (a few hundred
//! bytes each); one that grows past `MAX_EVENT` passes as it is.

use bytes::{Bytes, BytesMut};

/// An event larger than this is not a usage chunk: it passes without being looked at.
const MAX_EVENT: usize = 64 << 10;

#[derive(Default)]
pub struct StripUsage {
    /// The bytes of the event under way (up to `MAX_EVENT`).
    pending: BytesMut,
    /// The event under way passes as it is (it grew too large to be the usage chunk).
    passing: bool,
    /// Line ends in a row just seen (a CR LF is one), and the byte before.
    line_ends: u8,
    last: u8,
}

impl StripUsage {
    /// The part of `chunk` to send on: the complete events but the usage chunk; `end`: the
    /// stream ends here, and what is held goes too.
    pub fn filter(&mut self, chunk: &[u8], end: bool) -> Bytes {
        let mut out = BytesMut::with_capacity(chunk.len());
        let mut from = 0;
        for (i, &b) in chunk.iter().enumerate() {
            match b {
                b'\n' if self.last == b'\r' => {}
                b'\n' | b'\r' => self.line_ends += 1,
                _ => self.line_ends = 0,
            }
            self.last = b;
            // A blank line: the event ends here (with the LF of a CR LF, when it is here too).
            let crlf = b == b'\r' && chunk.get(i + 1) == Some(&b'\n');
            if self.line_ends >= 2 && !crlf {
                self.line_ends = 0;
                self.end_event(&chunk[from..=i], &mut out);
                from = i + 1;
            }
        }
        let rest = &chunk[from..];
        if self.passing {
            out.extend_from_slice(rest);
        } else {
            self.pending.extend_from_slice(rest);
            if self.pending.len() > MAX_EVENT {
                out.extend_from_slice(&self.pending.split());
                self.passing = true;
            }
        }
        if end {
            out.extend_from_slice(&self.pending.split());
        }
        out.freeze()
    }

    /// The event that `pending` began ends with `last`: sent on, unless it is the usage chunk.
    fn end_event(&mut self, last: &[u8], out: &mut BytesMut) {
        if std::mem::take(&mut self.passing) {
            out.extend_from_slice(last);
            return;
        }
        self.pending.extend_from_slice(last);
        let event = self.pending.split();
        if !is_usage_chunk(&event) {
            out.extend_from_slice(&event);
        }
    }
}

/// Whether the answer is an event stream whose length was not stated (a stated one cannot lose
/// an event on its way).
pub fn applies(resp: &pingora::http::ResponseHeader) -> bool {
    let stream = super::media_type(resp).eq_ignore_ascii_case("text/event-stream");
    stream && resp.status.is_success() && !resp.headers.contains_key(http::header::CONTENT_LENGTH)
}

/// Whether an event is the usage chunk: one `data:` JSON object with `choices: []` and a `usage`.
fn is_usage_chunk(event: &[u8]) -> bool {
    let mut data = Vec::new();
    for line in event.split(|&b| b == b'\n' || b == b'\r') {
        if let Some(v) = line.strip_prefix(b"data:") {
            if !data.is_empty() {
                data.push(b'\n');
            }
            data.extend_from_slice(v.strip_prefix(b" ").unwrap_or(v));
        }
    }
    let Ok(serde_json::Value::Object(doc)) = serde_json::from_slice(&data) else {
        return false;
    };
    doc.get("choices")
        .and_then(|c| c.as_array())
        .is_some_and(|c| c.is_empty())
        && doc.get("usage").is_some_and(|u| u.is_object())
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str =
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n\
        data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n\
        data: {\"choices\":[],\"usage\":{\"total_tokens\":12}}\n\n\
        data: [DONE]\n\n";

    fn expected() -> String {
        STREAM.replace(
            "data: {\"choices\":[],\"usage\":{\"total_tokens\":12}}\n\n",
            "",
        )
    }

    #[test]
    fn the_usage_chunk_is_taken_out_however_the_stream_is_split() {
        for split in 0..=STREAM.len() {
            let mut s = StripUsage::default();
            let (a, b) = STREAM.as_bytes().split_at(split);
            let mut out = s.filter(a, false).to_vec();
            out.extend_from_slice(&s.filter(b, true));
            assert_eq!(
                String::from_utf8(out).unwrap(),
                expected(),
                "split at {split}"
            );
        }
        let mut s = StripUsage::default();
        let mut out = Vec::new();
        for b in STREAM.as_bytes() {
            out.extend_from_slice(&s.filter(&[*b], false));
        }
        out.extend_from_slice(&s.filter(&[], true));
        assert_eq!(String::from_utf8(out).unwrap(), expected(), "byte by byte");
    }

    #[test]
    fn other_events_and_line_ends_pass_as_they_are() {
        let crlf = STREAM.replace('\n', "\r\n");
        let mut s = StripUsage::default();
        let out = s.filter(crlf.as_bytes(), true);
        assert_eq!(out, expected().replace('\n', "\r\n").as_bytes());
        let other = "event: x\ndata: {\"choices\":[],\"usage\":null}\n\n: comment\n\n";
        let mut s = StripUsage::default();
        assert_eq!(s.filter(other.as_bytes(), true), other.as_bytes());
        let unterminated = "data: {\"choices\":[],\"usage\":{\"total_tokens\":1}}";
        let mut s = StripUsage::default();
        assert_eq!(
            s.filter(unterminated.as_bytes(), true),
            unterminated.as_bytes()
        );
    }

    #[test]
    fn a_large_event_passes_unheld() {
        let big = format!(
            "data: {{\"x\":\"{}\"}}\n\ndata: [DONE]\n\n",
            "a".repeat(100_000)
        );
        let mut s = StripUsage::default();
        let first = s.filter(&big.as_bytes()[..70_000], false);
        assert_eq!(first.len(), 70_000, "passed on past the cap, not held");
        assert!(s.pending.capacity() <= 2 * MAX_EVENT);
        let rest = s.filter(&big.as_bytes()[70_000..], true);
        assert_eq!([&first[..], &rest[..]].concat(), big.as_bytes());
    }
}
