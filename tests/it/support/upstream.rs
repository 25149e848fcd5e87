//! The service behind the proxy: a small HTTP/1.1 server on an ephemeral port that answers 200 and
//! counts what reaches it, so a test can prove a rejected request never did, and keeps every
//! request line and the last request's headers and body, so a test can see exactly what the proxy
//! forwarded. `/slow` takes 700 ms.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Seen {
    hits: AtomicU64,
    /// Lower-case name and value of every header of the last request.
    last_headers: Mutex<Vec<(String, String)>>,
    /// The request line of every request, in order of arrival.
    lines: Mutex<Vec<String>>,
    /// The body of the last request.
    last_body: Mutex<Vec<u8>>,
}

pub struct Upstream {
    pub addr: SocketAddr,
    seen: Arc<Seen>,
}

impl Upstream {
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let seen = Arc::new(Seen::default());
        let shared = seen.clone();
        // The thread ends with the test process; it holds nothing that needs cleaning up.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = shared.clone();
                std::thread::spawn(move || serve(stream, &seen));
            }
        });
        Upstream { addr, seen }
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

/// Keep-alive HTTP/1.1: Pingora reuses upstream connections.
fn serve(stream: TcpStream, seen: &Seen) {
    // One write per response and no Nagle: otherwise delayed ACKs add ~40 ms to every request.
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
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
        let body = "hello from upstream\n";
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}
