//! Stand-in until the streaming scanner lands: buffers and parses with serde_json.
use std::sync::Arc;

pub struct JsonScan {
    paths: Arc<[Vec<String>]>,
    buf: Vec<u8>,
    found: Vec<Option<u64>>,
}

impl JsonScan {
    pub fn new(paths: Arc<[Vec<String>]>) -> JsonScan {
        let n = paths.len();
        JsonScan {
            paths,
            buf: Vec::new(),
            found: vec![None; n],
        }
    }
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }
    pub fn end(&mut self) {
        let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&self.buf) else {
            return;
        };
        for (i, path) in self.paths.iter().enumerate() {
            let mut at = &doc;
            let mut ok = true;
            for k in path {
                match at.get(k) {
                    Some(v) => at = v,
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                let v = at.as_u64().or_else(|| {
                    at.as_f64()
                        .filter(|f| *f >= 0.0)
                        .map(|f| f.ceil().min(u64::MAX as f64) as u64)
                });
                self.found[i] = self.found[i].max(v);
            }
        }
    }
    pub fn reset(&mut self) {
        self.buf.clear();
        self.found.iter_mut().for_each(|f| *f = None);
    }
    pub fn found(&self, i: usize) -> Option<u64> {
        self.found.get(i).copied().flatten()
    }
    pub fn held_bytes(&self) -> usize {
        self.buf.capacity()
    }
}
