//! The service behind the proxy: a small HTTP/1.1 server on an ephemeral port that answers 200 and
//! counts what reaches it, so a test can prove a rejected request never did.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct Upstream {
    pub addr: SocketAddr,
    hits: Arc<AtomicU64>,
}

impl Upstream {
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let hits = Arc::new(AtomicU64::new(0));
        let counter = hits.clone();
        // The thread ends with the test process; it holds nothing that needs cleaning up.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let counter = counter.clone();
                std::thread::spawn(move || serve(stream, &counter));
            }
        });
        Upstream { addr, hits }
    }

    /// Requests that reached the upstream so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }
}

/// Keep-alive HTTP/1.1: Pingora reuses upstream connections.
fn serve(stream: TcpStream, hits: &AtomicU64) {
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut content_length = 0usize;
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((name, value)) = l.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    content_length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; content_length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        hits.fetch_add(1, Ordering::SeqCst);
        if request_line.contains(" /slow") {
            // Long enough to still be in flight when a test signals the proxy.
            std::thread::sleep(std::time::Duration::from_millis(700));
        }
        let body = b"hello from upstream\n";
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        if writer
            .write_all(head.as_bytes())
            .and_then(|_| writer.write_all(body))
            .is_err()
        {
            return;
        }
    }
}
