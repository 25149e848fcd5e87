//! A deliberately plain HTTP/1.1 client: one request per connection, the bytes the test wrote,
//! the response as it came.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether any rate-limit header is present.
    pub fn has_ratelimit_headers(&self) -> bool {
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "ratelimit",
            "ratelimit-policy",
            "retry-after",
        ]
        .iter()
        .any(|h| self.header(h).is_some())
    }
}

/// GET `path` with extra `headers`.
pub fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    request(addr, "GET", path, headers)
}

pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    request_to(addr, "test.local", method, path, headers)
}

/// `request` with this Host (the admin port answers only its own names).
pub fn request_to(
    addr: SocketAddr,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Response {
    let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (name, value) in headers {
        raw.push_str(&format!("{name}: {value}\r\n"));
    }
    raw.push_str("\r\n");
    send_raw(addr, raw.as_bytes()).unwrap_or_else(|e| panic!("{method} {path} via {addr}: {e}"))
}

/// Sends `raw` as is and reads the response until the server closes.
pub fn send_raw(addr: SocketAddr, raw: &[u8]) -> std::io::Result<Response> {
    exchange(addr, raw, false)
}

/// Like `send_raw`, then closes the sending side, so a server waiting for the rest of a
/// truncated request sees the end instead of waiting for it.
pub fn send_raw_half_closed(addr: SocketAddr, raw: &[u8]) -> std::io::Result<Response> {
    exchange(addr, raw, true)
}

fn exchange(addr: SocketAddr, raw: &[u8], half_close: bool) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(raw)?;
    if half_close {
        stream.shutdown(std::net::Shutdown::Write)?;
    }
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line in {text:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Response {
        status,
        headers,
        body: body.to_string(),
    })
}
