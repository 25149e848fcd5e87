//! The numbers at given paths of one JSON document read as it streams past, in memory that does
//! not grow with the document: a byte-at-a-time state machine that keeps only the key being
//! compared (no longer than the longest key of a path) and the number being read (20 digits).
//!
//! Choices where JSON leaves room:
//! - A number is charged rounded up (`2.1` → 3, `1e-400` → 1) and saturates at `u64::MAX`; a
//!   negative number is not found, but a negative zero (`-0`, `-0.0e5`) is zero.
//! - Duplicate keys: the largest value wins (usage is never under-charged).
//! - The scan stops at the first error and at nesting deeper than `MAX_DEPTH` (256); what it found
//!   before stands. A number counts once a delimiter (whitespace, `,`, `}`, `]`) or the end
//!   follows it: `01` or `1.5.2` is malformed, not 0 or 2.
//! - After the document only whitespace may follow; anything else stops the scan (which changes
//!   nothing found).
//! - Only the grammar is checked: invalid UTF-8 and raw control characters inside strings pass.
//!   A key with a lone surrogate escape matches no path (a path is valid UTF-8).

use memchr::memchr2;
use std::sync::Arc;

/// Containers nested deeper than this stop the scan; the nesting kinds fit in a fixed bitset.
const MAX_DEPTH: usize = 256;
/// Significant digits kept of a number: 20 hold every `u64`; later digits only round up.
const DIGITS: u8 = 20;
/// An exponent saturates here: any larger one makes a value saturate or round to 1 anyway.
const EXP_CAP: i64 = 1 << 40;

/// Finds numbers at given paths of one JSON document fed in pieces, keeping none of it.
pub struct JsonScan {
    paths: Arc<[Vec<String>]>,
    /// Indices of `paths` sorted by path: paths sharing a prefix are neighbours, a path first.
    order: Vec<usize>,
    longest_key: usize,
    found: Vec<Option<u64>>,
    state: State,
    /// Containers open around the current position.
    depth: usize,
    /// Bit `d`: the container at depth `d` is an object, else an array.
    objects: [u64; MAX_DEPTH / 64],
    /// `live[d]`: the range of `order` whose paths the value at depth `d` lies on. Only as long as
    /// the keys from the root match a path, so never longer than the longest path plus one.
    live: Vec<(usize, usize)>,
    /// The decoded key of an object on a path, while it can still equal a key of a path.
    key: Vec<u8>,
    text: Text,
    num: Num,
    /// The rest of `true`, `false` or `null` still to come.
    lit: &'static [u8],
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// A value must come (the root, after `:`, after `,` in an array).
    Value,
    ValueOrClose,
    KeyOrClose,
    Key,
    Colon,
    AfterValue,
    Str,
    Num,
    Lit,
    /// The top-level value is complete: only whitespace may follow.
    Done,
    /// An error, too deep, or ended: nothing more is read.
    Stopped,
}

/// Where a string being read is.
#[derive(Clone, Copy, Default)]
struct Text {
    key: bool,
    /// The string is a key decoded into `JsonScan::key` that can still equal a key of a path.
    decode: bool,
    esc: Esc,
    /// A high surrogate escape waiting for its low half (decoded keys only).
    high: Option<u16>,
}

#[derive(Clone, Copy, Default)]
enum Esc {
    #[default]
    No,
    Backslash,
    /// Hex digits read of a `\u` escape, and their value.
    Hex(u8, u16),
}

/// Where a number being read is, and its value so far: `(sig + f) * 10^(scale ± exp)` where the
/// dropped digits `f` in `[0, 1)` are non-zero exactly when `sticky`.
#[derive(Clone, Copy, Default)]
struct Num {
    part: Part,
    /// The number lies on a path: worth the arithmetic.
    live: bool,
    neg: bool,
    sig: u128,
    digits: u8,
    scale: i64,
    sticky: bool,
    exp: i64,
    exp_neg: bool,
}

/// The parts of a number; from `Int` on, a digit leaves the part as it is.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    #[default]
    Start,
    Sign,
    Zero,
    Dot,
    E,
    ESign,
    Int,
    Frac,
    Exp,
}

impl JsonScan {
    /// `paths[i]` is a list of object keys from the root, e.g. ["usage", "total_tokens"].
    /// Arrays are never part of a path (a value inside an array never matches).
    pub fn new(paths: Arc<[Vec<String>]>) -> JsonScan {
        let mut order: Vec<usize> = (0..paths.len()).collect();
        order.sort_by(|&a, &b| paths[a].cmp(&paths[b]));
        let longest_key = paths.iter().flatten().map(String::len).max().unwrap_or(0);
        let longest_path = paths.iter().map(Vec::len).max().unwrap_or(0);
        let mut scan = JsonScan {
            order,
            longest_key,
            found: vec![None; paths.len()],
            state: State::Value,
            depth: 0,
            objects: [0; MAX_DEPTH / 64],
            live: Vec::with_capacity(longest_path + 1),
            key: Vec::with_capacity(longest_key),
            text: Text::default(),
            num: Num::default(),
            lit: b"",
            paths,
        };
        scan.reset();
        scan
    }

    /// The next bytes of the document (any split: in the middle of a key, a number, an escape, a UTF-8 char).
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            i = match self.state {
                State::Stopped => return,
                State::Str => self.string(bytes, i),
                State::Num => self.number(bytes, i),
                _ => {
                    self.token(bytes[i]);
                    i + 1
                }
            };
        }
    }

    /// The document ended (a number still being read at the very end, e.g. a bare top-level number, completes here).
    pub fn end(&mut self) {
        if self.state == State::Num {
            self.finish_number();
        }
        self.state = State::Stopped;
    }

    /// Starts a new document with the same paths; what was found is forgotten.
    pub fn reset(&mut self) {
        self.found.fill(None);
        self.state = State::Value;
        self.depth = 0;
        self.live.clear();
        self.live.push((0, self.paths.len()));
        self.key.clear();
    }

    /// What was found at `paths[i]`, or None.
    pub fn found(&self, i: usize) -> Option<u64> {
        self.found.get(i).copied().flatten()
    }

    /// Bytes this scanner holds on the heap now (its buffers' capacities), for a test that proves memory is bounded.
    pub fn held_bytes(&self) -> usize {
        use std::mem::size_of;
        self.order.capacity() * size_of::<usize>()
            + self.found.capacity() * size_of::<Option<u64>>()
            + self.live.capacity() * size_of::<(usize, usize)>()
            + self.key.capacity()
    }

    /// One byte outside strings and numbers.
    fn token(&mut self, b: u8) {
        match self.state {
            State::Lit => match self.lit.split_first() {
                Some((&want, [])) if want == b => self.after_value(),
                Some((&want, rest)) if want == b => self.lit = rest,
                _ => self.stop(),
            },
            _ if matches!(b, b' ' | b'\t' | b'\n' | b'\r') => {}
            State::Value => self.value(b),
            State::ValueOrClose if b == b']' => self.close(),
            State::ValueOrClose => self.value(b),
            State::KeyOrClose if b == b'}' => self.close(),
            State::KeyOrClose | State::Key if b == b'"' => self.begin_key(),
            State::Colon if b == b':' => self.state = State::Value,
            State::AfterValue if b == b',' => {
                self.state = if self.in_object() {
                    State::Key
                } else {
                    State::Value
                };
            }
            State::AfterValue if b == if self.in_object() { b'}' } else { b']' } => self.close(),
            _ => self.stop(),
        }
    }

    fn value(&mut self, b: u8) {
        match b {
            b'{' => self.open(true),
            b'[' => self.open(false),
            b'"' => {
                self.text = Text::default();
                self.state = State::Str;
            }
            b'-' | b'0'..=b'9' => {
                self.num = Num {
                    live: self.on_path(),
                    ..Num::default()
                };
                self.state = State::Num;
                self.num_byte(b);
            }
            b't' => self.literal(b"rue"),
            b'f' => self.literal(b"alse"),
            b'n' => self.literal(b"ull"),
            _ => self.stop(),
        }
    }

    fn literal(&mut self, rest: &'static [u8]) {
        self.lit = rest;
        self.state = State::Lit;
    }

    fn open(&mut self, object: bool) {
        if self.depth == MAX_DEPTH {
            return self.stop();
        }
        let (word, bit) = (self.depth / 64, 1u64 << (self.depth % 64));
        if object {
            self.objects[word] |= bit;
        } else {
            self.objects[word] &= !bit;
        }
        self.depth += 1;
        self.state = if object {
            State::KeyOrClose
        } else {
            State::ValueOrClose
        };
    }

    fn close(&mut self) {
        self.depth -= 1;
        self.live.truncate(self.depth + 1);
        self.after_value();
    }

    fn in_object(&self) -> bool {
        let d = self.depth.wrapping_sub(1);
        self.depth > 0 && self.objects[d / 64] & (1 << (d % 64)) != 0
    }

    fn after_value(&mut self) {
        self.state = if self.depth == 0 {
            State::Done
        } else {
            State::AfterValue
        };
    }

    fn stop(&mut self) {
        self.state = State::Stopped;
    }

    /// Stops, and so has read all of `bytes`.
    fn stop_at(&mut self, bytes: &[u8]) -> usize {
        self.stop();
        bytes.len()
    }

    /// The value about to start lies exactly at the end of some path.
    fn on_path(&self) -> bool {
        let d = self.depth;
        self.live.len() == d + 1 && {
            let (lo, hi) = self.live[d];
            lo < hi && self.paths[self.order[lo]].len() == d
        }
    }

    /// A key starts in the object at depth `depth - 1`: it is decoded when that object lies on a
    /// path that goes deeper.
    fn begin_key(&mut self) {
        let d = self.depth - 1;
        self.live.truncate(d + 1);
        let decode = self.live.len() == d + 1 && {
            let (lo, hi) = self.live[d];
            lo < hi && self.paths[self.order[hi - 1]].len() > d
        };
        self.key.clear();
        self.text = Text {
            key: true,
            decode,
            ..Text::default()
        };
        self.state = State::Str;
    }

    /// A decoded key is complete: the paths it continues lie on the member's value.
    fn enter_key(&mut self) {
        let d = self.depth - 1;
        let (lo, hi) = self.live[d];
        let paths = &self.paths;
        let key = self.key.as_slice();
        let hit = |&p: &usize| paths[p].len() > d && paths[p][d].as_bytes() == key;
        let Some(first) = self.order[lo..hi].iter().position(hit) else {
            return;
        };
        let count = self.order[lo + first..hi]
            .iter()
            .take_while(|p| hit(p))
            .count();
        self.live.push((lo + first, lo + first + count));
    }

    /// Inside a string from `bytes[i]`; returns where it stopped reading.
    fn string(&mut self, bytes: &[u8], mut i: usize) -> usize {
        while i < bytes.len() {
            match self.text.esc {
                Esc::No => {
                    let rest = &bytes[i..];
                    let Some(n) = memchr2(b'"', b'\\', rest) else {
                        self.key_raw(rest);
                        return bytes.len();
                    };
                    self.key_raw(&rest[..n]);
                    i += n + 1;
                    if rest[n] == b'"' {
                        self.end_string();
                        return i;
                    }
                    self.text.esc = Esc::Backslash;
                }
                Esc::Backslash => {
                    let unit = match bytes[i] {
                        b'u' => None,
                        c @ (b'"' | b'\\' | b'/') => Some(c),
                        b'b' => Some(8),
                        b'f' => Some(12),
                        b'n' => Some(b'\n'),
                        b'r' => Some(b'\r'),
                        b't' => Some(b'\t'),
                        _ => return self.stop_at(bytes),
                    };
                    i += 1;
                    self.text.esc = Esc::Hex(0, 0);
                    if let Some(u) = unit {
                        self.text.esc = Esc::No;
                        self.key_unit(u16::from(u));
                    }
                }
                Esc::Hex(n, acc) => {
                    let Some(h) = char::from(bytes[i]).to_digit(16) else {
                        return self.stop_at(bytes);
                    };
                    i += 1;
                    let acc = acc << 4 | h as u16;
                    self.text.esc = if n == 3 {
                        self.key_unit(acc);
                        Esc::No
                    } else {
                        Esc::Hex(n + 1, acc)
                    };
                }
            }
        }
        i
    }

    fn end_string(&mut self) {
        if !self.text.key {
            return self.after_value();
        }
        if self.text.decode && self.text.high.is_none() {
            self.enter_key();
        }
        self.state = State::Colon;
    }

    /// Unescaped bytes of a string: kept when it is a key that can still match.
    fn key_raw(&mut self, raw: &[u8]) {
        if !self.text.decode || raw.is_empty() {
            return;
        }
        if self.text.high.is_some() {
            self.text.decode = false;
            return;
        }
        self.key_push(raw);
    }

    /// One UTF-16 unit from an escape, pairing surrogates.
    fn key_unit(&mut self, unit: u16) {
        if !self.text.decode {
            return;
        }
        let code = match (self.text.high.take(), unit) {
            (Some(high), 0xDC00..=0xDFFF) => {
                0x10000 + ((u32::from(high) - 0xD800) << 10) + (u32::from(unit) - 0xDC00)
            }
            (None, 0xD800..=0xDBFF) => {
                self.text.high = Some(unit);
                return;
            }
            (None, _) => u32::from(unit),
            (Some(_), _) => return self.text.decode = false,
        };
        match char::from_u32(code) {
            Some(c) => self.key_push(c.encode_utf8(&mut [0; 4]).as_bytes()),
            None => self.text.decode = false,
        }
    }

    fn key_push(&mut self, bytes: &[u8]) {
        if self.key.len() + bytes.len() > self.longest_key {
            self.text.decode = false;
        } else {
            self.key.extend_from_slice(bytes);
        }
    }

    /// Inside a number from `bytes[i]`; returns where it stopped reading.
    fn number(&mut self, bytes: &[u8], mut i: usize) -> usize {
        while i < bytes.len() {
            let b = bytes[i];
            // The fast path: a digit that only continues a number off every path.
            let same = b.is_ascii_digit() && !self.num.live && self.num.part >= Part::Int;
            if !same && !self.num_byte(b) {
                return i;
            }
            i += 1;
        }
        i
    }

    /// Reads `b` into the number; false (and the number finished) when `b` cannot continue it.
    fn num_byte(&mut self, b: u8) -> bool {
        let n = &mut self.num;
        let d = b.wrapping_sub(b'0');
        n.part = match (n.part, b) {
            (Part::Start, b'-') => {
                n.neg = true;
                Part::Sign
            }
            (Part::Start | Part::Sign, b'0') => Part::Zero,
            (Part::Start | Part::Sign, b'1'..=b'9') | (Part::Int, b'0'..=b'9') => {
                n.digit(d, false);
                Part::Int
            }
            (Part::Zero | Part::Int, b'.') => Part::Dot,
            (Part::Dot | Part::Frac, b'0'..=b'9') => {
                n.digit(d, true);
                Part::Frac
            }
            (Part::Zero | Part::Int | Part::Frac, b'e' | b'E') => Part::E,
            (Part::E, b'+') => Part::ESign,
            (Part::E, b'-') => {
                n.exp_neg = true;
                Part::ESign
            }
            (Part::E | Part::ESign | Part::Exp, b'0'..=b'9') => {
                n.exp = (n.exp * 10 + i64::from(d)).min(EXP_CAP);
                Part::Exp
            }
            // Only a delimiter ends a number: `01` or `1.5.2` is malformed, not 0 or 2.
            (_, b' ' | b'\t' | b'\n' | b'\r' | b',' | b'}' | b']') => {
                self.finish_number();
                return false;
            }
            _ => {
                self.stop();
                return false;
            }
        };
        true
    }

    fn finish_number(&mut self) {
        if !matches!(
            self.num.part,
            Part::Zero | Part::Int | Part::Frac | Part::Exp
        ) {
            return self.stop();
        }
        if let Some(v) = self.num.value().filter(|_| self.num.live) {
            let d = self.depth;
            let (lo, hi) = self.live[d];
            for &p in &self.order[lo..hi] {
                if self.paths[p].len() != d {
                    break;
                }
                self.found[p] = self.found[p].max(Some(v));
            }
        }
        self.after_value();
    }
}

impl Num {
    /// A digit of the integer part, or of the fraction.
    fn digit(&mut self, d: u8, frac: bool) {
        if !self.live {
            return;
        }
        if self.sig == 0 && d == 0 {
            // A leading zero: not significant, but it moves the point in a fraction.
            self.scale = self.scale.saturating_sub(i64::from(frac));
        } else if self.digits < DIGITS {
            self.sig = self.sig * 10 + u128::from(d);
            self.digits += 1;
            self.scale = self.scale.saturating_sub(i64::from(frac));
        } else {
            self.sticky |= d != 0;
            self.scale = self.scale.saturating_add(i64::from(!frac));
        }
    }

    /// The number rounded up and saturated; None when it is negative.
    fn value(&self) -> Option<u64> {
        if self.sig == 0 {
            return Some(0);
        }
        if self.neg {
            return None;
        }
        let e = if self.exp_neg {
            self.scale.saturating_sub(self.exp)
        } else {
            self.scale.saturating_add(self.exp)
        };
        let whole = match e {
            // `sig` is at least 1, so 10^21 and more is past `u64::MAX`.
            21.. => u128::MAX,
            0..=20 => (self.sig.saturating_mul(10u128.pow(e as u32)))
                .saturating_add(u128::from(self.sticky)),
            -20..=-1 => {
                let p = 10u128.pow(e.unsigned_abs() as u32);
                self.sig / p + u128::from(self.sig % p != 0 || self.sticky)
            }
            // `sig` has at most 20 digits: a positive fraction below 1.
            _ => 1,
        };
        Some(u64::try_from(whole).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
#[path = "scan_tests.rs"]
pub(super) mod tests;
