//! Client connections held to their limits, as a hostile client meets them: a head sent a byte at
//! a time, a kept-alive connection that idles, a body that stalls, more connections than allowed,
//! a flood at a low file-descriptor limit; pipelined requests served in order; a taken port that
//! stops the start; and a log no client can fill.
//!
//! The limits are short (hundreds of milliseconds) so that a closed connection is seen soon; the
//! bounds asserted are several times longer, since the point is that the connection is closed at
//! all (before this, none ever was).

use crate::scenarios::{Backend, Setup};
use crate::support::proxy::{Proxy, BIN};
use crate::support::upstream::Upstream;
use crate::support::{listening_sockets, wait_for};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROUTE: &str = "  - name: api\n    upstream: \"{upstream}\"\n";

/// 400 ms for a head, an idle keep-alive and a body read.
const SHORT: &str =
    "downstream:\n  header_timeout_ms: 400\n  idle_timeout_ms: 400\n  body_timeout_ms: 400\n";

/// How long a test waits for something the limits above must cause.
const SOON: Duration = Duration::from_secs(5);

fn closed(s: &Setup, reason: &str) -> u64 {
    s.proxy.metric(&format!(
        "ratelimit_connections_closed_total{{reason=\"{reason}\"}}"
    )) as u64
}

fn open_connections(s: &Setup) -> u64 {
    s.proxy.metric("ratelimit_connections_open") as u64
}

/// Reads what the server sends until it closes the connection, at most `limit`.
fn read_to_close(stream: &mut TcpStream, limit: Duration) -> Option<String> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => return Some(String::from_utf8_lossy(&got).into_owned()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Some(String::from_utf8_lossy(&got).into_owned()),
        }
    }
    None
}

/// Reads one response whose body is `Content-Length` long, leaving the connection open.
fn read_response(stream: &mut TcpStream) -> String {
    stream.set_read_timeout(Some(SOON)).unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).unwrap(), 1, "closed mid-response");
        got.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&got).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .expect("a Content-Length");
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).unwrap();
    head + &String::from_utf8_lossy(&body)
}

#[test]
fn a_head_sent_a_byte_at_a_time_is_cut_off_with_408() {
    let s = Setup::start_with_config(Backend::Memory, ROUTE, SHORT);
    let started = Instant::now();
    let mut slow: Vec<Option<TcpStream>> = (0..50)
        .map(|_| {
            let mut c = TcpStream::connect(s.proxy.addr).unwrap();
            c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n").unwrap();
            c.set_nonblocking(true).unwrap();
            Some(c)
        })
        .collect();
    let mut answers = Vec::new();
    // A header byte to every connection every 50 ms, as a slowloris client does, until the proxy
    // has closed them all.
    while slow.iter().any(Option::is_some) && started.elapsed() < SOON {
        for slot in &mut slow {
            let Some(c) = slot else { continue };
            let _ = c.write_all(b"X");
            let mut buf = [0u8; 1024];
            match c.read(&mut buf) {
                Ok(0) => *slot = None,
                Ok(n) => answers.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => *slot = None,
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        slow.iter().all(Option::is_none),
        "still open after {SOON:?}"
    );
    assert_eq!(answers.len(), 50, "{answers:?}");
    assert!(
        answers.iter().all(|a| a.starts_with("HTTP/1.1 408 ")),
        "{answers:?}"
    );
    assert_eq!(closed(&s, "header_timeout"), 50);
    wait_for("no open connection", SOON, || {
        (open_connections(&s) == 0).then_some(())
    });
    assert_eq!(s.upstream.hits(), 0);
}

#[test]
fn an_idle_keep_alive_is_closed_and_a_trickled_next_head_too() {
    let s = Setup::start_with_config(Backend::Memory, ROUTE, SHORT);
    // Idle after one request.
    let mut c = TcpStream::connect(s.proxy.addr).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    assert!(read_response(&mut c).starts_with("HTTP/1.1 200 "));
    let idle_from = Instant::now();
    assert_eq!(
        read_to_close(&mut c, SOON).as_deref(),
        Some(""),
        "closed, silently"
    );
    assert!(
        idle_from.elapsed() >= Duration::from_millis(350),
        "{:?}",
        idle_from.elapsed()
    );
    assert_eq!(closed(&s, "idle_timeout"), 1);

    // The next head begun at once, then a byte now and then: the head's deadline counts from
    // its first byte, not from each byte.
    let mut c = TcpStream::connect(s.proxy.addr).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    read_response(&mut c);
    c.set_nonblocking(true).unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        assert!(started.elapsed() < SOON, "still open: {answer:?}");
        let _ = c.write_all(b"G");
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(_) => break,
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
    assert_eq!(closed(&s, "header_timeout"), 1);
    assert_eq!(s.upstream.hits(), 2);
}

#[test]
fn a_stalled_body_is_cut_off_with_408() {
    let s = Setup::start_with_config(Backend::Memory, ROUTE, SHORT);
    let mut c = TcpStream::connect(s.proxy.addr).unwrap();
    c.write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n0123456789")
        .unwrap();
    let answer = read_to_close(&mut c, SOON).expect("closed within 5 s");
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
    assert_eq!(closed(&s, "body_timeout"), 1);
    assert_eq!(
        s.upstream.hits(),
        0,
        "the upstream never got a whole request"
    );
}

#[test]
fn connections_beyond_max_connections_are_closed_at_accept() {
    let s = Setup::start_with_config(
        Backend::Memory,
        ROUTE,
        "downstream:\n  max_connections: 5\n  header_timeout_ms: 30000\n",
    );
    // The start's readiness probe was a connection too: let it go first. (The scrapes of the
    // admin listener are not counted: it is another listener.)
    wait_for("no open connection", SOON, || {
        (open_connections(&s) == 0).then_some(())
    });
    let held: Vec<TcpStream> = (1..=5)
        .map(|n| {
            let c = TcpStream::connect(s.proxy.addr).unwrap();
            wait_for("the connection to count", SOON, || {
                (open_connections(&s) == n).then_some(())
            });
            c
        })
        .collect();
    let mut sixth = TcpStream::connect(s.proxy.addr).unwrap();
    assert_eq!(
        read_to_close(&mut sixth, SOON).as_deref(),
        Some(""),
        "closed at once, without a word"
    );
    assert_eq!(closed(&s, "max_connections"), 1);
    drop(held);
    wait_for("the five to close", SOON, || {
        (open_connections(&s) == 0).then_some(())
    });
    assert_eq!(s.proxy.get("/", &[]).status, 200, "room again");
}

/// The process may open only 160 files (it needs about 30 of them itself). 300 clients connect
/// and send nothing; the proxy keeps at most `max_connections` of them (each until its head
/// deadline) and closes the rest at accept: its admin listener answers throughout, and a new
/// client is served as soon as the limit sheds the idle ones. (A burst can still briefly find no
/// descriptor left for accept(); Pingora then pauses that listener for a second and says so.)
#[test]
fn a_flood_of_idle_connections_at_a_low_fd_limit_does_not_lock_clients_out() {
    let upstream = Upstream::start();
    let yaml = format!(
        "listen: \"{{listen}}\"\nadmin: \"{{admin}}\"\ndownstream:\n  max_connections: 40\n  header_timeout_ms: 1000\nroutes:\n{}",
        ROUTE.replace("{upstream}", &upstream.addr.to_string())
    );
    let proxy = Proxy::start_with_fd_limit(&yaml, 160);
    let flood: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect(proxy.addr).ok())
        .collect();
    assert_eq!(
        proxy.admin_get("/healthz").status,
        200,
        "the admin listener still accepts"
    );
    let served = wait_for("a new client to be served", Duration::from_secs(10), || {
        let r = crate::support::http::send_raw(
            proxy.addr,
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        );
        r.ok().filter(|r| r.status == 200)
    });
    assert_eq!(served.body, "hello from upstream\n");
    // Every connection of the flood is closed, at accept or by its head deadline; none lingers.
    let closed = |reason: &str| {
        proxy.metric(&format!(
            "ratelimit_connections_closed_total{{reason=\"{reason}\"}}"
        ))
    };
    wait_for(
        "the whole flood to be closed",
        Duration::from_secs(10),
        || {
            (closed("max_connections") + closed("header_timeout") >= flood.len() as f64)
                .then_some(())
        },
    );
    assert!(closed("max_connections") >= 100.0, "{}", proxy.report());
    let stderr = proxy.stderr();
    let pauses = stderr.matches("Accept() failed").count();
    assert!(pauses <= 10, "{pauses} accept failures:\n{stderr}");
    assert!(
        stderr.contains("downstream.max_connections is 40, which may need 180 file descriptors"),
        "the start says the limit is too low for the setting:\n{stderr}"
    );
    drop(flood);
}

fn start_on(listen: SocketAddr, admin: SocketAddr) -> (std::process::Output, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.yaml");
    std::fs::write(
        &path,
        format!("listen: \"{listen}\"\nadmin: \"{admin}\"\nroutes:\n  - {{ name: a, upstream: \"127.0.0.1:9\" }}\n"),
    )
    .unwrap();
    let started = Instant::now();
    let child = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (out, started.elapsed())
}

fn free_addr() -> SocketAddr {
    format!("127.0.0.1:{}", crate::support::free_port())
        .parse()
        .unwrap()
}

/// Starts the proxy on `listen` and `admin`, one of them `taken`: it must stop at once with exit
/// code 1 and one line that names the address, leaving no process answering `/healthz`.
fn assert_stops_on_taken(listen: SocketAddr, admin: SocketAddr, taken: SocketAddr, what: &str) {
    let (out, took) = start_on(listen, admin);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
    assert!(took < SOON, "{what}: took {took:?}");
    assert_eq!(
        stderr.lines().collect::<Vec<_>>(),
        [format!(
            "error: cannot start: cannot listen on {taken} ({what}): Address already in use (os error 98)"
        )],
        "{what}"
    );
}

/// A taken port, for the proxy or its admin listener, stops the start at once.
#[test]
fn a_taken_port_stops_the_start_with_one_line() {
    for what in ["proxy", "admin"] {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let taken_addr = taken.local_addr().unwrap();
        let (listen, admin) = match what {
            "proxy" => (taken_addr, free_addr()),
            _ => (free_addr(), taken_addr),
        };
        assert_stops_on_taken(listen, admin, taken_addr, what);
    }
}

/// Each worker thread accepts on its own socket (`SO_REUSEPORT`), and those sockets do not let a
/// second instance in beside the first: it stops as it would on any taken port.
#[test]
fn a_running_instance_has_a_socket_per_worker_and_no_second_one_joins_it() {
    let s = Setup::start(Backend::Memory, ROUTE);
    let sockets = crate::support::sockets_per_address(1);
    assert_eq!(listening_sockets(s.proxy.addr.port()), sockets);
    assert_stops_on_taken(s.proxy.addr, free_addr(), s.proxy.addr, "proxy");
    assert_eq!(listening_sockets(s.proxy.addr.port()), sockets);
    let answer = crate::support::http::get(s.proxy.addr, "/", &[]);
    assert_eq!(answer.status, 200);
}

#[test]
fn pipelined_requests_are_served_in_order() {
    let s = Setup::start(Backend::Memory, ROUTE);
    let mut c = TcpStream::connect(s.proxy.addr).unwrap();
    c.write_all(
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n\
          POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\
          GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let answers = read_to_close(&mut c, SOON).expect("closed after the last");
    assert_eq!(answers.matches("HTTP/1.1 200 ").count(), 3, "{answers}");
    assert_eq!(s.upstream.targets(), ["/a", "/b", "/c"]);
}

/// Clients that misbehave or go away write nothing at info or above (they are counted); an
/// upstream that is down is said once, not once per request.
#[test]
fn no_client_can_fill_the_log() {
    let dead = free_addr();
    let routes = format!("{ROUTE}  - name: dead\n    match: {{ path_prefix: \"/dead\" }}\n    upstream: \"{dead}\"\n");
    let routes = routes.replace(
        "  - name: api\n    upstream: \"{upstream}\"\n",
        "  - name: api\n    match: { path_prefix: \"/api\" }\n    upstream: \"{upstream}\"\n",
    );
    let s = Setup::start_with_config(
        Backend::Memory,
        &routes,
        &format!("{SHORT}  max_connections: 1000\n"),
    );
    for i in 0..100 {
        let mut c = TcpStream::connect(s.proxy.addr).unwrap();
        match i % 4 {
            // Gone mid-head.
            0 => c.write_all(b"GET /api HTTP/1.1\r\nHo").unwrap(),
            // Garbage.
            1 => {
                c.write_all(b"NOT HTTP AT ALL\r\n\r\n").unwrap();
                let _ = read_to_close(&mut c, SOON);
            }
            // Gone while the upstream answers.
            2 => c
                .write_all(b"GET /api/slow HTTP/1.1\r\nHost: a\r\n\r\n")
                .unwrap(),
            // Gone mid-body.
            _ => c
                .write_all(b"POST /api HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc")
                .unwrap(),
        }
        drop(c);
    }
    for _ in 0..20 {
        assert_eq!(s.proxy.get("/dead", &[]).status, 502);
    }
    wait_for("the resets to be counted", SOON, || {
        (closed(&s, "client_reset") >= 50).then_some(())
    });
    let log = s.proxy.stderr();
    let loud: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains(" ERROR ") || (l.contains(" WARN ") && !l.contains("no `redis:` section"))
        })
        .collect();
    assert_eq!(loud.len(), 1, "{log}");
    assert!(
        loud[0].contains(&format!("route dead: upstream {dead} is down for 10 s")),
        "{}",
        loud[0]
    );
}

#[test]
fn a_connection_serves_max_requests_per_connection_then_closes() {
    let s = Setup::start_with_config(
        Backend::Memory,
        ROUTE,
        "downstream:\n  max_requests_per_connection: 3\n",
    );
    let mut c = TcpStream::connect(s.proxy.addr).unwrap();
    for n in 1..=3 {
        c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        let response = read_response(&mut c).to_ascii_lowercase();
        assert!(response.starts_with("http/1.1 200 "), "{n}: {response}");
        assert_eq!(
            response.contains("connection: close"),
            n == 3,
            "{n}: {response}"
        );
    }
    assert_eq!(read_to_close(&mut c, SOON).as_deref(), Some(""));
    assert_eq!(s.upstream.hits(), 3);
}

#[test]
fn a_head_larger_than_1_mib_gets_431() {
    let s = Setup::start(Backend::Memory, ROUTE);
    let mut c = TcpStream::connect(s.proxy.addr).unwrap();
    let _ = c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: ");
    let _ = c.write_all(&vec![b'a'; 1 << 20]);
    let answer = read_to_close(&mut c, SOON).expect("closed");
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer:?}");
    assert_eq!(s.upstream.hits(), 0);
}

/// The admin listener has the same deadlines: a slow head there is cut off too.
#[test]
fn the_admin_listener_cuts_off_a_slow_head_too() {
    let s = Setup::start_with_config(Backend::Memory, ROUTE, SHORT);
    let mut c = TcpStream::connect(s.proxy.admin).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
    let answer = read_to_close(&mut c, SOON).expect("closed within 5 s");
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
    assert_eq!(s.proxy.admin_get("/healthz").status, 200);
    assert_eq!(
        closed(&s, "header_timeout"),
        0,
        "not the clients' connections"
    );
}

/// A body larger than any buffer, sent in pieces: it reaches the upstream whole, and the
/// connection serves the next request after it.
#[test]
fn a_large_body_reaches_the_upstream_whole_and_the_connection_goes_on() {
    let s = Setup::start(Backend::Memory, ROUTE);
    let body: Vec<u8> = (0..(1 << 20)).map(|i| b'a' + (i % 26) as u8).collect();
    let mut c = TcpStream::connect(s.proxy.addr).unwrap();
    c.write_all(
        format!(
            "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .unwrap();
    for piece in body.chunks(100_000) {
        c.write_all(piece).unwrap();
    }
    assert!(read_response(&mut c).starts_with("HTTP/1.1 200 "));
    assert_eq!(s.upstream.last_body(), body);
    c.write_all(b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    assert!(read_response(&mut c).starts_with("HTTP/1.1 200 "));
    assert_eq!(s.upstream.targets(), ["/up", "/next"]);
}

/// A body due whole within 1 s of its head, each read allowed 10 s.
const TRICKLE: &str = "downstream:\n  body_timeout_ms: 10000\n  request_body_timeout_ms: 1000\n";

/// Sends `piece` every 300 ms on `c` until the proxy closes it, at most `limit`: when it closed
/// (from the first piece), and what it said.
fn trickle(c: &mut TcpStream, piece: &[u8], limit: Duration) -> (Option<Duration>, String) {
    c.set_nonblocking(true).unwrap();
    let began = Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while began.elapsed() < limit {
        let _ = c.write_all(piece);
        let paced = Instant::now() + Duration::from_millis(300);
        while Instant::now() < paced {
            match c.read(&mut buf) {
                Ok(0) => return (Some(began.elapsed()), lossy(&answer)),
                Ok(n) => answer.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(_) => return (Some(began.elapsed()), lossy(&answer)),
            }
        }
    }
    (None, lossy(&answer))
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// One byte every 300 ms is well within a per-read timeout, and kept a request (and the upstream
/// connection under it) open for as long as the client liked. The whole body is due within
/// `request_body_timeout_ms` of its head, with `Content-Length` or chunked: past it, 408.
#[test]
fn a_body_trickled_a_byte_at_a_time_is_cut_off_at_its_deadline() {
    let s = Setup::start_with_config(Backend::Memory, ROUTE, TRICKLE);
    let heads: [(&str, &[u8], &[u8]); 2] = [
        (
            "content-length",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n",
            b"x",
        ),
        (
            "chunked",
            // The test upstream does not read chunked bodies: `/hold` keeps it from answering.
            b"POST /hold HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"1\r\nx\r\n",
        ),
    ];
    for (what, head, piece) in heads {
        let mut c = TcpStream::connect(s.proxy.addr).unwrap();
        c.write_all(head).unwrap();
        let (closed, answer) = trickle(&mut c, piece, Duration::from_secs(10));
        println!("HTTP/1.1 {what} body, a piece every 300 ms: closed after {closed:?}");
        let closed = closed.unwrap_or_else(|| panic!("{what}: still open after 10 s"));
        assert!(
            closed >= Duration::from_millis(900) && closed < Duration::from_millis(2500),
            "{what}: closed after {closed:?}"
        );
        assert!(answer.starts_with("HTTP/1.1 408 "), "{what}: {answer:?}");
    }
    assert_eq!(closed(&s, "request_body_timeout"), 2);
    assert_eq!(
        s.upstream.targets(),
        ["/hold"],
        "no body reached the upstream whole"
    );
    s.upstream.open(true);
    // A body that arrives in time is unaffected.
    let mut c = TcpStream::connect(s.proxy.addr).unwrap();
    c.write_all(
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .unwrap();
    assert!(read_response(&mut c).starts_with("HTTP/1.1 200 "));
    // Past the first body's deadline, the next request on the connection is served.
    std::thread::sleep(Duration::from_millis(1200));
    c.write_all(b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    assert!(read_response(&mut c).starts_with("HTTP/1.1 200 "));
}

/// The same deadline on a route whose requests go through the relay (a concurrency limit: the
/// lease lasts as long as the upstream's work): a trickled body is cut at its deadline with a 408
/// and counted, and the lease it held is given back.
#[test]
fn a_trickled_body_on_a_relayed_route_is_cut_off_at_its_deadline() {
    let route = "  - name: api\n    upstream: \"{upstream}\"\n    limits: [{ name: inflight, concurrency: 1, key: route }]\n";
    let s = Setup::start_with_config(Backend::Memory, route, TRICKLE);
    let mut c = TcpStream::connect(s.proxy.addr).unwrap();
    c.write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n")
        .unwrap();
    let (cut, answer) = trickle(&mut c, b"x", Duration::from_secs(10));
    println!("HTTP/1.1 body on a relayed route, a byte every 300 ms: closed after {cut:?}");
    let cut = cut.expect("still open after 10 s");
    assert!(
        cut >= Duration::from_millis(900) && cut < Duration::from_millis(2500),
        "closed after {cut:?}"
    );
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
    assert_eq!(closed(&s, "request_body_timeout"), 1);
    wait_for("the lease given back", Duration::from_secs(10), || {
        let mut c = TcpStream::connect(s.proxy.addr).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .unwrap();
        read_response(&mut c)
            .starts_with("HTTP/1.1 200 ")
            .then_some(())
    });
}
