//! The service behind the proxy: a small HTTP/1.1 server on an ephemeral port that answers 200 and
//! counts what reaches it, so a test can prove a rejected request never did, and keeps every
//! request line and the last request's headers and body, so a test can see exactly what the proxy
//! forwarded. `/slow` takes 700 ms. `/hold` waits until the test opens the gate (`open`), so a
//! test controls how many requests are in flight. `/usage/header/<n>` reports `n` tokens used in
//! `x-usage-total-tokens`, `/usage/json/<n>` in a JSON body (`usage.total_tokens`), as LLM APIs
//! do. `/drip/<ms>` streams a chunk every 100 ms for that long. `start_tls` serves the same over
//! TLS (rustls, ALPN http/1.1).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Seen {
    hits: AtomicU64,
    /// Connections accepted, and those open now.
    accepted: AtomicU64,
    open_now: AtomicU64,
    /// Lower-case name and value of every header of the last request.
    last_headers: Mutex<Vec<(String, String)>>,
    /// The request line of every request, in order of arrival.
    lines: Mutex<Vec<String>>,
    /// The body of the last request.
    last_body: Mutex<Vec<u8>>,
    /// `/hold` requests being served now, and the most at once.
    in_flight: AtomicU64,
    most_in_flight: AtomicU64,
    /// Whether `/hold` requests may answer.
    open: (Mutex<bool>, std::sync::Condvar),
}

pub struct Upstream {
    pub addr: SocketAddr,
    seen: Arc<Seen>,
}

impl Upstream {
    pub fn start() -> Upstream {
        Upstream::start_with(None)
    }

    /// The same server over TLS with the PEM `cert` (chain) and `key`, offering only http/1.1 by
    /// ALPN. A connection whose handshake fails is never counted.
    pub fn start_tls(cert: &Path, key: &Path) -> Upstream {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect())
            .unwrap_or_else(|e| panic!("{}: {e}", cert.display()));
        let key =
            PrivateKeyDer::from_pem_file(key).unwrap_or_else(|e| panic!("{}: {e}", key.display()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("certificate and key");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Upstream::start_with(Some(Arc::new(config)))
    }

    fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let seen = Arc::new(Seen::default());
        let shared = seen.clone();
        // The thread ends with the test process; it holds nothing that needs cleaning up.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = shared.clone();
                let tls = tls.clone();
                seen.accepted.fetch_add(1, Ordering::SeqCst);
                seen.open_now.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let _open = OpenNow(seen.clone());
                    // One write per response and no Nagle: otherwise delayed ACKs add ~40 ms to
                    // every request.
                    let _ = stream.set_nodelay(true);
                    match tls {
                        None => serve(stream, &seen),
                        Some(config) => {
                            let Ok(conn) = rustls::ServerConnection::new(config) else {
                                return;
                            };
                            serve(rustls::StreamOwned::new(conn, stream), &seen);
                        }
                    }
                });
            }
        });
        Upstream { addr, seen }
    }

    /// `/hold` requests waiting for the gate now.
    pub fn in_flight(&self) -> u64 {
        self.seen.in_flight.load(Ordering::SeqCst)
    }

    /// The most `/hold` requests that were in flight at once.
    pub fn most_in_flight(&self) -> u64 {
        self.seen.most_in_flight.load(Ordering::SeqCst)
    }

    /// Lets `/hold` requests answer (`true`) or makes the next ones wait (`false`).
    pub fn open(&self, open: bool) {
        let (lock, wake) = &self.seen.open;
        *lock.lock().unwrap() = open;
        wake.notify_all();
    }

    /// Connections the proxy opened to the upstream so far, and those open now.
    pub fn connections(&self) -> (u64, u64) {
        (
            self.seen.accepted.load(Ordering::SeqCst),
            self.seen.open_now.load(Ordering::SeqCst),
        )
    }

    /// Requests that reached the upstream so far.
    pub fn hits(&self) -> u64 {
        self.seen.hits.load(Ordering::SeqCst)
    }

    /// The request target of every request that reached the upstream, in order.
    pub fn targets(&self) -> Vec<String> {
        self.seen
            .lines
            .lock()
            .unwrap()
            .iter()
            .map(|l| l.split(' ').nth(1).unwrap_or_default().to_string())
            .collect()
    }

    /// The body of the last request that reached the upstream.
    pub fn last_body(&self) -> Vec<u8> {
        self.seen.last_body.lock().unwrap().clone()
    }

    /// Every value of header `name` in the last request that reached the upstream.
    pub fn last_header(&self, name: &str) -> Vec<String> {
        let headers = self.seen.last_headers.lock().unwrap();
        headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// Keep-alive HTTP/1.1: Pingora reuses upstream connections. Over TLS the handshake happens on
/// the first read, so a refused one ends here before anything is counted.
/// Counts a connection open until its thread ends.
struct OpenNow(Arc<Seen>);

impl Drop for OpenNow {
    fn drop(&mut self) {
        self.0.open_now.fetch_sub(1, Ordering::SeqCst);
    }
}

fn serve(stream: impl Read + Write, seen: &Seen) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut content_length = 0usize;
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    content_length = value.trim().parse().unwrap_or(0);
                }
                headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
            }
        }
        // `Expect: 100-continue`: an interim response first, as servers do.
        if headers
            .iter()
            .any(|(n, v)| n == "expect" && v.eq_ignore_ascii_case("100-continue"))
        {
            let writer = reader.get_mut();
            if writer.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").is_err() {
                return;
            }
        }
        let mut body = vec![0; content_length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        *seen.last_headers.lock().unwrap() = headers;
        *seen.last_body.lock().unwrap() = body;
        seen.lines
            .lock()
            .unwrap()
            .push(request_line.trim_end().to_string());
        seen.hits.fetch_add(1, Ordering::SeqCst);
        if request_line.contains(" /slow") {
            // Long enough to still be in flight when a test signals the proxy, and longer than a
            // short read timeout.
            std::thread::sleep(std::time::Duration::from_millis(700));
        }
        if request_line.contains(" /hold") {
            let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            seen.most_in_flight.fetch_max(now, Ordering::SeqCst);
            let (lock, wake) = &seen.open;
            // Bounded: a test that forgets to open the gate still ends.
            let _ = wake
                .wait_timeout_while(
                    lock.lock().unwrap(),
                    std::time::Duration::from_secs(20),
                    |open| !*open,
                )
                .unwrap();
            seen.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        let path = request_line.split(' ').nth(1).unwrap_or("");
        if let Some(ms) = path
            .strip_prefix("/drip/")
            .and_then(|m| m.parse::<u64>().ok())
        {
            // A stream: a chunk every 100 ms for `ms`, as a model streams its answer.
            let writer = reader.get_mut();
            let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
            if writer.write_all(head.as_bytes()).is_err() {
                return;
            }
            let started = std::time::Instant::now();
            while started.elapsed() < std::time::Duration::from_millis(ms) {
                if writer
                    .write_all(b"6\r\ndata:\n\r\n")
                    .and_then(|_| writer.flush())
                    .is_err()
                {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            if writer.write_all(b"0\r\n\r\n").is_err() {
                return;
            }
            continue;
        }
        let (content_type, usage_header, body) = match path.strip_prefix("/usage/") {
            Some(rest) => match rest.split_once('/') {
                Some(("header", n)) => (
                    "text/plain",
                    format!("x-usage-total-tokens: {n}\r\n"),
                    "hello from upstream\n".to_string(),
                ),
                Some(("json", n)) => (
                    "application/json",
                    String::new(),
                    format!(
                        "{{\"id\":\"x\",\"usage\":{{\"prompt_tokens\":1,\"total_tokens\":{n}}}}}"
                    ),
                ),
                _ => ("text/plain", String::new(), "no usage here\n".to_string()),
            },
            None => (
                "text/plain",
                String::new(),
                "hello from upstream\n".to_string(),
            ),
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n{usage_header}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let writer = reader.get_mut();
        if writer.write_all(response.as_bytes()).is_err() || writer.flush().is_err() {
            return;
        }
    }
}
