//! A plain HTTP/2 client that sends exactly the header block a test asks for, byte for byte, as
//! `http::send_raw` does for HTTP/1.1: the `h2` crate (like any real client) refuses to send a
//! control byte in a value, which is what an attacker sends. One request per connection, over
//! cleartext (h2c with prior knowledge) or TLS (rustls, ALPN h2, trusting the test CA).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How the server ended one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A response with this status.
    Status(u16),
    /// `RST_STREAM` with this error code (1: PROTOCOL_ERROR).
    Reset(u32),
    /// `GOAWAY` before any response, with this error code.
    GoAway(u32),
    /// The connection closed before any of those.
    Closed,
}

impl Answer {
    /// Refused, by the proxy's 400 or by HTTP/2's own stream or connection error.
    pub fn refused(self) -> bool {
        matches!(
            self,
            Answer::Status(400) | Answer::Reset(_) | Answer::GoAway(_) | Answer::Closed
        )
    }
}

/// Where to send: cleartext, or TLS trusting `ca` (a PEM file) for `localhost`.
#[derive(Debug, Clone)]
pub enum Via {
    H2c(SocketAddr),
    Tls(SocketAddr, std::path::PathBuf),
}

/// A GET with `:authority` and `:path` as given (no `:authority` when `None`), then `fields`.
pub fn get(via: &Via, authority: Option<&[u8]>, path: &[u8], fields: &[(&[u8], &[u8])]) -> Answer {
    let mut block = Vec::new();
    literal(&mut block, b":method", b"GET");
    literal(&mut block, b":scheme", scheme(via));
    if let Some(a) = authority {
        literal(&mut block, b":authority", a);
    }
    literal(&mut block, b":path", path);
    for (name, value) in fields {
        literal(&mut block, name, value);
    }
    match via {
        Via::H2c(addr) => exchange(&mut connect(*addr), &block),
        Via::Tls(addr, ca) => exchange(&mut tls(*addr, ca), &block),
    }
}

fn scheme(via: &Via) -> &'static [u8] {
    match via {
        Via::H2c(_) => b"http",
        Via::Tls(..) => b"https",
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let tcp = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    tcp
}

fn tls(addr: SocketAddr, ca: &Path) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let name = ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    rustls::StreamOwned::new(conn, connect(addr))
}

/// An HPACK literal field without indexing, its name new and neither string Huffman-coded
/// (RFC 7541 §6.2.2): the bytes go on the wire as given.
fn literal(block: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    block.push(0x00);
    length(block, name.len());
    block.extend_from_slice(name);
    length(block, value.len());
    block.extend_from_slice(value);
}

/// An HPACK integer with a 7-bit prefix, the Huffman bit clear (RFC 7541 §5.1).
fn length(block: &mut Vec<u8>, mut n: usize) {
    if n < 127 {
        block.push(n as u8);
        return;
    }
    block.push(127);
    n -= 127;
    while n >= 128 {
        block.push((n % 128 + 128) as u8);
        n /= 128;
    }
    block.push(n as u8);
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(9 + payload.len());
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const GOAWAY: u8 = 7;
const END_STREAM_HEADERS: u8 = 0x5;

/// The preface, empty SETTINGS and the request on stream 1; then frames until its end.
fn exchange(s: &mut (impl Read + Write), block: &[u8]) -> Answer {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    out.extend(frame(HEADERS, END_STREAM_HEADERS, 1, block));
    if s.write_all(&out).and_then(|()| s.flush()).is_err() {
        return Answer::Closed;
    }
    // Bounded: each frame is read whole or the connection is over.
    for _ in 0..1000 {
        let mut head = [0u8; 9];
        if s.read_exact(&mut head).is_err() {
            return Answer::Closed;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        if s.read_exact(&mut payload).is_err() {
            return Answer::Closed;
        }
        let code = |p: &[u8], at: usize| {
            p.get(at..at + 4)
                .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        };
        match kind {
            SETTINGS if flags & 1 == 0 => {
                let _ = s
                    .write_all(&frame(SETTINGS, 1, 0, &[]))
                    .and_then(|()| s.flush());
            }
            HEADERS if stream == 1 => return Answer::Status(status(&payload, flags)),
            RST_STREAM if stream == 1 => return Answer::Reset(code(&payload, 0)),
            GOAWAY => return Answer::GoAway(code(&payload, 4)),
            DATA => {}
            _ => {}
        }
    }
    Answer::Closed
}

/// The `:status` that opens a response's header block, as an HTTP/2 server encodes it: an indexed
/// static entry (200, 204, 206, 304, 400, 404, 500) or a literal of the `:status` name, its value
/// plain or Huffman-coded digits.
fn status(payload: &[u8], flags: u8) -> u16 {
    // PADDED (0x8) and PRIORITY (0x20) come before the block.
    let mut p = payload;
    if flags & 0x8 != 0 {
        p = &p[1..];
    }
    if flags & 0x20 != 0 {
        p = &p[5..];
    }
    // Dynamic table size updates (001xxxxx) may lead.
    while p.first().is_some_and(|b| b & 0xe0 == 0x20) {
        p = &p[1..];
    }
    let first = p[0];
    if first & 0x80 != 0 {
        return match first & 0x7f {
            8 => 200,
            9 => 204,
            10 => 206,
            11 => 304,
            12 => 400,
            13 => 404,
            14 => 500,
            other => panic!("static index {other} is not a status"),
        };
    }
    let (huffman, len) = (p[1] & 0x80 != 0, (p[1] & 0x7f) as usize);
    let value = &p[2..2 + len];
    let digits = if huffman {
        huffman_digits(value)
    } else {
        String::from_utf8_lossy(value).to_string()
    };
    digits
        .parse()
        .unwrap_or_else(|_| panic!("status {digits:?}"))
}

/// Digits in HPACK's Huffman code: `0`-`2` are 5 bits (00000-00010), `3`-`9` 6 bits
/// (011001-011111); the rest is padding of ones.
fn huffman_digits(bytes: &[u8]) -> String {
    let bits: Vec<u8> = bytes
        .iter()
        .flat_map(|b| (0..8).rev().map(move |i| (b >> i) & 1))
        .collect();
    let take = |at: usize, n: usize| {
        bits.get(at..at + n)
            .map(|b| b.iter().fold(0u8, |v, bit| v << 1 | bit))
    };
    let (mut at, mut out) = (0, String::new());
    while let Some(five) = take(at, 5) {
        if five <= 2 {
            out.push((b'0' + five) as char);
            at += 5;
            continue;
        }
        match take(at, 6) {
            Some(six @ 0x19..=0x1f) => {
                out.push((b'3' + six - 0x19) as char);
                at += 6;
            }
            _ => break,
        }
    }
    out
}

#[test]
fn huffman_coded_statuses_are_read() {
    // "429": 011010 00010 011111, then ones.
    assert_eq!(
        huffman_digits(&[0b0110_1000, 0b0100_1111, 0b1111_1111]),
        "429"
    );
    assert_eq!(huffman_digits(&[0b0000_0000, 0b0011_1111]), "00");
}

/// An HTTP/2 client over h2c that opens `streams` POST requests, each with its head and the
/// first `sent` bytes of a `length`-byte body, then sends nothing more (a stalled upload). The
/// connection is returned open; what the server sends is read and dropped by a thread, so its
/// writes never block, and counted (`seen`).
pub struct Stalled {
    stream: TcpStream,
    seen: Arc<std::sync::Mutex<Seen>>,
}

/// What the server sent a `Stalled` client so far.
#[derive(Debug, Default, Clone, Copy)]
pub struct Seen {
    pub resets: u32,
    pub headers: u32,
    /// The server closed the connection.
    pub closed: bool,
}

impl Stalled {
    pub fn open(addr: SocketAddr, streams: u32, length: usize, sent: usize) -> Stalled {
        let mut s = connect(addr);
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        out.extend(frame(SETTINGS, 0, 0, &[]));
        for n in 0..streams {
            let id = 2 * n + 1;
            let mut block = Vec::new();
            literal(&mut block, b":method", b"POST");
            literal(&mut block, b":scheme", b"http");
            literal(&mut block, b":authority", addr.to_string().as_bytes());
            literal(&mut block, b":path", b"/upload");
            literal(&mut block, b"content-length", length.to_string().as_bytes());
            // END_HEADERS only: the body follows.
            out.extend(frame(HEADERS, 0x4, id, &block));
            out.extend(frame(DATA, 0, id, &vec![b'x'; sent]));
        }
        s.write_all(&out).expect("write the streams");
        let counts = Arc::new(std::sync::Mutex::new(Seen::default()));
        let mut reader = s.try_clone().unwrap();
        let seen = counts.clone();
        std::thread::spawn(move || {
            let _ = reader.set_read_timeout(None);
            let mut head = [0u8; 9];
            while reader.read_exact(&mut head).is_ok() {
                let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
                let mut payload = vec![0u8; len];
                if reader.read_exact(&mut payload).is_err() {
                    break;
                }
                let mut c = seen.lock().unwrap();
                match head[3] {
                    RST_STREAM => c.resets += 1,
                    HEADERS => c.headers += 1,
                    _ => {}
                }
            }
            seen.lock().unwrap().closed = true;
        });
        Stalled {
            stream: s,
            seen: counts,
        }
    }

    /// Sends `bytes` more of stream `id`'s body (no END_STREAM).
    pub fn send_data(&mut self, id: u32, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(&frame(DATA, 0, id, bytes))
    }

    /// What the server sent so far.
    pub fn seen(&self) -> Seen {
        *self.seen.lock().unwrap()
    }
}
