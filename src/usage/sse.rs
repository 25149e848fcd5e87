//! The usage in a `text/event-stream` body: its lines split as the WHATWG EventSource parser
//! splits them, and the value of every `data` line streamed into the event's [`JsonScan`], so
//! that nothing of the stream is kept (no line, no field name, no event).
//!
//! Choices where the spec leaves room, or where charging differs from a browser:
//! - An event not closed by a blank line is scanned all the same at the end of the stream (a
//!   browser drops it; a proxy must not under-charge).
//! - Each path's value is the largest over all events: streams repeat usage (`"usage":null`
//!   chunks, Anthropic's cumulative `output_tokens`), never split it into parts to add up.
//! - Bytes are not decoded: invalid UTF-8 reaches the JSON scan as it is (a browser would see
//!   U+FFFD; neither can match a key of a path).
//! - No field name is kept, however long: it is compared with `data` as it arrives.

use super::scan::JsonScan;
use memchr::memchr2;
use std::sync::Arc;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Scans the JSON of every `data:` event of a text/event-stream body fed in pieces, keeping none of it.
pub struct SseScan {
    scan: JsonScan,
    found: Vec<Option<u64>>,
    line: Line,
    /// Bytes of a leading byte-order mark matched so far; `BOM.len()` once past it.
    bom: usize,
    /// The last line ended with CR: an LF right after it ends no second line.
    cr: bool,
    /// The event has a data line: the next one is joined to it by a newline.
    data: bool,
}

/// Where in a line the stream is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Line {
    Start,
    /// The field name so far is the first `n` bytes of `data`.
    Field(usize),
    /// Just after `data:`, where one space is dropped.
    Space,
    /// The value of a data line, streamed to the scan.
    Data,
    /// A comment, or a field other than `data`: skipped to the end of the line.
    Skip,
}

impl SseScan {
    /// `paths` as for [`JsonScan::new`], looked for in every event.
    pub fn new(paths: Arc<[Vec<String>]>) -> SseScan {
        SseScan {
            found: vec![None; paths.len()],
            scan: JsonScan::new(paths),
            line: Line::Start,
            bom: 0,
            cr: false,
            data: false,
        }
    }

    /// The next bytes of the stream (any split: in a line end, a field name, the byte-order mark).
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while self.bom < BOM.len() {
            let Some((&b, rest)) = bytes.split_first() else {
                return;
            };
            if b == BOM[self.bom] {
                self.bom += 1;
                bytes = rest;
            } else {
                // Not a byte-order mark after all: what looked like one is read as text.
                let seen = std::mem::replace(&mut self.bom, BOM.len());
                self.lines(&BOM[..seen]);
            }
        }
        self.lines(bytes);
    }

    /// The stream ended: an event not closed by a blank line is scanned all the same (usage is never under-charged).
    pub fn end(&mut self) {
        if self.bom < BOM.len() {
            let seen = std::mem::replace(&mut self.bom, BOM.len());
            self.lines(&BOM[..seen]);
        }
        if self.line != Line::Start {
            self.end_line();
        }
        self.dispatch();
    }

    /// The largest value found at `paths[i]` in any event, or None.
    pub fn found(&self, i: usize) -> Option<u64> {
        self.found.get(i).copied().flatten()
    }

    /// Bytes this scanner holds on the heap now: the event's scanner and the largest values.
    pub fn held_bytes(&self) -> usize {
        self.scan.held_bytes() + self.found.capacity() * std::mem::size_of::<Option<u64>>()
    }

    fn lines(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            // A CR ended the last line (and set the line to `Start`): an LF right after is its end too.
            if std::mem::take(&mut self.cr) && b == b'\n' {
                i += 1;
                continue;
            }
            match self.line {
                Line::Start if b == b'\r' || b == b'\n' => {
                    self.cr = b == b'\r';
                    self.dispatch();
                    i += 1;
                }
                Line::Start if b == b':' => self.line = Line::Skip,
                Line::Start => self.line = Line::Field(0),
                Line::Field(4) if b == b':' => {
                    self.begin_data();
                    self.line = Line::Space;
                    i += 1;
                }
                Line::Field(n) if n < 4 && b == b"data"[n] => {
                    self.line = Line::Field(n + 1);
                    i += 1;
                }
                Line::Field(4) if b == b'\r' || b == b'\n' => {
                    // `data` alone: a data line with an empty value.
                    self.begin_data();
                    self.line = Line::Data;
                }
                Line::Field(_) => self.line = Line::Skip,
                Line::Space => {
                    self.line = Line::Data;
                    i += usize::from(b == b' ');
                }
                Line::Data | Line::Skip => {
                    let rest = &bytes[i..];
                    let n = memchr2(b'\r', b'\n', rest).unwrap_or(rest.len());
                    if self.line == Line::Data {
                        self.scan.feed(&rest[..n]);
                    }
                    i += n;
                    if let Some(&end) = rest.get(n) {
                        self.end_line();
                        self.cr = end == b'\r';
                        i += 1;
                    }
                }
            }
        }
    }

    fn begin_data(&mut self) {
        if self.data {
            self.scan.feed(b"\n");
        }
        self.data = true;
    }

    /// A line that was not blank ended.
    fn end_line(&mut self) {
        if self.line == Line::Field(4) {
            self.begin_data();
        }
        self.line = Line::Start;
    }

    /// A blank line, or the end of the stream: the event's data is complete.
    fn dispatch(&mut self) {
        if !std::mem::take(&mut self.data) {
            return;
        }
        self.scan.end();
        for (i, found) in self.found.iter_mut().enumerate() {
            *found = (*found).max(self.scan.found(i));
        }
        self.scan.reset();
    }
}

#[cfg(test)]
#[path = "sse_tests.rs"]
mod tests;
