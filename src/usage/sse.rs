//! Stand-in until the streaming scanner lands.
use super::scan::JsonScan;
use std::sync::Arc;

pub struct SseScan {
    json: JsonScan,
    line: Vec<u8>,
    data: bool,
    found: Vec<Option<u64>>,
}

impl SseScan {
    pub fn new(paths: Arc<[Vec<String>]>) -> SseScan {
        let n = paths.len();
        SseScan {
            json: JsonScan::new(paths),
            line: Vec::new(),
            data: false,
            found: vec![None; n],
        }
    }
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                let line = std::mem::take(&mut self.line);
                let line = line.strip_suffix(b"\r").unwrap_or(&line);
                if line.is_empty() {
                    self.dispatch();
                } else if let Some(rest) = line.strip_prefix(b"data:") {
                    if self.data {
                        self.json.feed(b"\n");
                    }
                    self.json.feed(rest.strip_prefix(b" ").unwrap_or(rest));
                    self.data = true;
                }
            } else {
                self.line.push(b);
            }
        }
    }
    fn dispatch(&mut self) {
        self.json.end();
        for (i, f) in self.found.iter_mut().enumerate() {
            *f = (*f).max(self.json.found(i));
        }
        self.json.reset();
        self.data = false;
    }
    pub fn end(&mut self) {
        self.feed(b"\n");
        self.dispatch();
    }
    pub fn found(&self, i: usize) -> Option<u64> {
        self.found.get(i).copied().flatten()
    }
    pub fn held_bytes(&self) -> usize {
        self.line.capacity() + self.json.held_bytes()
    }
}
