//! Cleartext HTTP/2 with prior knowledge (`h2c: true`) beside HTTP/1.1 on one listener, each
//! request decided on its own; the preface refused where h2c is not on; and what bounds an HTTP/2
//! client: the stream limit it is told, and the idle timeout that closes its connection.

use crate::support::proxy::Proxy;
use crate::support::upstream::Upstream;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

fn config(upstream: &Upstream, extra: &str) -> String {
    format!(
        "listen:\n  - {{ address: \"{{listen}}\", h2c: true }}\nadmin: \"{{admin}}\"\n{extra}\
         routes:\n  - name: api\n    upstream: \"{}\"\n    \
         limits: [{{ name: per_key, capacity: 2, refill: \"1/h\", key: \"header:X-Api-Key\" }}]\n",
        upstream.addr
    )
}

/// curl with `args`: (HTTP version, status, lower-case response head).
fn curl(args: &[&str], url: &str) -> (String, u16, String) {
    let out = Command::new("curl")
        .args([
            "-s",
            "-i",
            "--max-time",
            "10",
            "-w",
            "\n%{http_version} %{http_code}",
        ])
        .args(args)
        .arg(url)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let last = text.lines().last().unwrap_or_default().to_string();
    let (version, status) = last.split_once(' ').unwrap_or_default();
    (
        version.to_string(),
        status.parse().unwrap_or(0),
        text.to_ascii_lowercase(),
    )
}

#[test]
fn h2c_with_prior_knowledge_is_limited_per_request_beside_http1() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&config(&upstream, ""));
    let url = format!("http://{}/hello", proxy.addr);
    let h2 = ["--http2-prior-knowledge", "-H", "X-Api-Key: alice"];

    let (version, status, head) = curl(&h2, &url);
    assert_eq!((version.as_str(), status), ("2", 200), "{head}");
    for field in [
        "x-ratelimit-remaining: 1",
        "ratelimit-policy:",
        "ratelimit:",
    ] {
        assert!(head.contains(field), "{field} in {head}");
    }
    assert_eq!(curl(&h2, &url).1, 200);
    let (version, status, head) = curl(&h2, &url);
    assert_eq!((version.as_str(), status), ("2", 429), "{head}");
    assert!(head.contains("retry-after: 3600"), "{head}");
    assert_eq!(
        upstream.hits(),
        2,
        "the refused stream never reached the upstream"
    );
    // The host of an HTTP/2 request is its :authority, told to the HTTP/1.1 upstream as Host.
    assert_eq!(upstream.last_header("host"), [proxy.addr.to_string()]);

    // HTTP/1.1 on the same listener, and the same buckets.
    let (version, status, _) = curl(&["--http1.1", "-H", "X-Api-Key: alice"], &url);
    assert_eq!((version.as_str(), status), ("1.1", 429));
    let (version, status, _) = curl(&["--http1.1", "-H", "X-Api-Key: bob"], &url);
    assert_eq!((version.as_str(), status), ("1.1", 200));
    assert_eq!(proxy.decisions("api", "rejected"), 2);
}

#[test]
fn the_http2_preface_is_refused_where_h2c_is_not_on() {
    let upstream = Upstream::start();
    let yaml = config(&upstream, "").replace(", h2c: true", "");
    let proxy = Proxy::start(&yaml);
    let mut s = TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer:?}");
    assert_eq!(upstream.hits(), 0);
    let (_, status, _) = curl(
        &["--http2-prior-knowledge", "-H", "X-Api-Key: a"],
        &format!("http://{}/hello", proxy.addr),
    );
    assert_ne!(status, 200, "no HTTP/2 without h2c: true");
}

#[test]
fn an_http2_client_is_told_the_stream_limit_and_closed_when_idle() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&config(
        &upstream,
        "downstream: { max_concurrent_streams: 7, idle_timeout_ms: 300 }\n",
    ));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        let (mut client, mut conn) = h2::client::handshake(tcp).await.unwrap();
        let request = http::Request::get(format!("http://{}/hello", proxy.addr))
            .header("x-api-key", "alice")
            .body(())
            .unwrap();
        let (response, _) = client.send_request(request, true).unwrap();
        // The connection is driven until the answer: by then the server's SETTINGS are in.
        let response = tokio::select! {
            r = response => r.unwrap(),
            end = &mut conn => panic!("the connection ended first: {end:?}"),
        };
        assert_eq!(response.status(), 200);
        drop(response);
        assert_eq!(conn.max_concurrent_send_streams(), 7);

        // Nothing in flight: the server closes the connection after the idle timeout.
        let idle_since = Instant::now();
        let ended = tokio::time::timeout(Duration::from_secs(20), &mut conn).await;
        assert!(ended.is_ok(), "an idle HTTP/2 connection was kept open");
        assert!(idle_since.elapsed() >= Duration::from_millis(250));
    });
}

/// One HTTP/2 request on a fresh h2c connection, with `:path` and `:authority` exactly as given
/// and `headers` beside them: its status.
fn h2_request(
    addr: std::net::SocketAddr,
    authority: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> u16 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(conn);
        let uri = http::Uri::builder()
            .scheme("http")
            .authority(authority)
            .path_and_query(path)
            .build()
            .unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let mut request = http::Request::get(uri).body(()).unwrap();
        for (name, value) in headers {
            request.headers_mut().append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_str(value).unwrap(),
            );
        }
        let (response, _) = client.send_request(request, true).unwrap();
        let response = tokio::time::timeout(Duration::from_secs(10), response)
            .await
            .expect("an answer")
            .unwrap();
        response.status().as_u16()
    })
}

/// Over HTTP/2 as over HTTP/1.1: every spelling of a limited path is counted on its route and
/// refused once the bucket is empty, and a Host that disagrees with `:authority` is a 400.
#[test]
fn http2_paths_and_authority_cannot_walk_around_a_limit() {
    let upstream = Upstream::start();
    let yaml = format!(
        "listen:\n  - {{ address: \"{{listen}}\", h2c: true }}\nadmin: \"{{admin}}\"\nroutes:\n  \
         - name: login\n    match: {{ path_prefix: \"/login\" }}\n    upstream: \"{0}\"\n    \
         limits: [{{ name: per_user, capacity: 1, refill: \"1/h\", key: \"header:x-user\" }}]\n  \
         - name: default\n    upstream: \"{0}\"\n",
        upstream.addr
    );
    let proxy = Proxy::start(&yaml);
    let host = proxy.addr.to_string();
    let user = [("x-user", "mallory")];
    assert_eq!(h2_request(proxy.addr, &host, "/login", &user), 200);
    assert_eq!(upstream.targets(), ["/login"]);
    for spelling in [
        "/login",
        "//login",
        "/./login",
        "/x/../login",
        "/%6cogin",
        "/%6Cogin?next=/",
        "/login/",
    ] {
        assert_eq!(
            h2_request(proxy.addr, &host, spelling, &user),
            429,
            "{spelling} walked around the limit"
        );
    }
    assert_eq!(upstream.hits(), 1, "no spelling reached the upstream");
    assert_eq!(proxy.decisions("login", "rejected"), 7);

    // A Host header that names another host than :authority: refused, not routed by either.
    assert_eq!(
        h2_request(
            proxy.addr,
            &host,
            "/other",
            &[("host", "elsewhere.example")]
        ),
        400
    );
    assert_eq!(upstream.hits(), 1);
    // Agreeing, it is served.
    assert_eq!(
        h2_request(proxy.addr, &host, "/other", &[("host", &host)]),
        200
    );
}

/// Half of HTTP/2's preface holds nothing: the connection is closed by the head deadline, as a
/// slow HTTP/1.1 head is (Pingora's HTTP/2 handshake has no deadline of its own).
#[test]
fn half_an_http2_preface_is_closed_by_the_header_deadline() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&config(
        &upstream,
        "downstream: { header_timeout_ms: 300, idle_timeout_ms: 60000 }\n",
    ));
    let mut s = TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\n").unwrap();
    let began = Instant::now();
    let mut sink = Vec::new();
    let read = s.read_to_end(&mut sink);
    assert!(read.is_ok(), "still open after 20 s: {read:?}");
    assert!(
        sink.is_empty(),
        "no HTTP/1.1 answer to an HTTP/2 client: {sink:?}"
    );
    assert!(began.elapsed() < Duration::from_secs(10));
    assert_eq!(
        proxy.metric("ratelimit_connections_closed_total{reason=\"header_timeout\"}"),
        1.0
    );
}

/// A limit keyed on `header:host` finds an HTTP/2 request's host in `:authority`, as it finds an
/// HTTP/1.1 request's in `Host`: a bucket per host, not one shared by every HTTP/2 client.
#[test]
fn a_host_keyed_limit_reads_the_authority_of_http2_requests() {
    let upstream = Upstream::start();
    let yaml = config(&upstream, "").replace("header:X-Api-Key", "header:host");
    let proxy = Proxy::start(&yaml);
    let statuses: Vec<u16> = ["a.test", "a.test", "a.test", "b.test"]
        .iter()
        .map(|host| h2_request(proxy.addr, host, "/x", &[]))
        .collect();
    assert_eq!(statuses, [200, 200, 429, 200]);
    assert_eq!(upstream.last_header("host"), ["b.test"]);
}

/// Only gRPC over HTTP/2 gets a gRPC-shaped refusal: gRPC-Web over HTTP/2, and `application/grpc`
/// over HTTP/1.1, get the route's ordinary 429 (a 200 would read as success to anything between).
#[test]
fn grpc_shaped_refusals_are_for_grpc_over_http2_only() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&config(&upstream, ""));
    let web = [
        ("content-type", "application/grpc-web-text"),
        ("x-api-key", "web"),
    ];
    let statuses: Vec<u16> = (0..3)
        .map(|_| h2_request(proxy.addr, "a.test", "/svc/M", &web))
        .collect();
    assert_eq!(statuses, [200, 200, 429]);
    let url = format!("http://{}/svc/M", proxy.addr);
    let h1 = [
        "--http1.1",
        "-H",
        "content-type: application/grpc",
        "-H",
        "X-Api-Key: h1",
    ];
    let statuses: Vec<u16> = (0..3).map(|_| curl(&h1, &url).1).collect();
    assert_eq!(statuses, [200, 200, 429]);
}

/// 4 HTTP/2 connections × 100 uploads that send their head and 10 bytes, then stall, against a
/// proxy that may open 160 files: each stream would hold an upstream connection, and 400 of them
/// ran the process out of descriptors (new clients timed out, the log filled with "Too many open
/// files"). Each request takes a place among `max_requests_in_flight` (fitted to the descriptors),
/// a connection's further streams only in the first half of them: the rest are answered 503, and
/// new clients and `/healthz` are served throughout.
#[test]
fn stalled_http2_uploads_cannot_take_every_descriptor() {
    use crate::support::h2raw::Stalled;
    let upstream = Upstream::start();
    let yaml = format!(
        "listen:\n  - {{ address: \"{{listen}}\", h2c: true }}\nadmin: \"{{admin}}\"\n\
         downstream: {{ max_connections: 40 }}\n\
         routes:\n  - name: api\n    upstream: \"{}\"\n",
        upstream.addr
    );
    let proxy = Proxy::start_with_fd_limit(&yaml, 160);
    let attack: Vec<Stalled> = (0..4)
        .map(|_| Stalled::open(proxy.addr, 100, 1_000_000, 10))
        .collect();
    // The attack has landed once every stream was forwarded or answered.
    let landed = Instant::now();
    let settled = (0..500).find_map(|_| {
        let answered: u32 = attack.iter().map(|a| a.seen().headers).sum();
        let forwarded = upstream.connections().1;
        if u64::from(answered) + forwarded >= 400 {
            return Some(landed.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
        None
    });
    let answered: u32 = attack.iter().map(|a| a.seen().headers).sum();
    let (_, held) = upstream.connections();
    let healthz = crate::support::http::send_raw(
        proxy.admin,
        format!(
            "GET /healthz HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            proxy.admin
        )
        .as_bytes(),
    )
    .map(|r| r.status);
    let began = Instant::now();
    let fresh = crate::support::http::send_raw(
        proxy.addr,
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    let took = began.elapsed();
    let fresh = fresh.map(|r| r.status);
    let log = proxy.stderr();
    let emfile = log.matches("Too many open files").count();
    println!(
        "stalled streams: settled after {settled:?}; upstream connections held {held}, streams \
         answered {answered}; /healthz {healthz:?}; a new client: {fresh:?} in {took:?}; \
         \"Too many open files\" {emfile} times"
    );
    assert!(
        settled.is_some(),
        "the streams were neither forwarded nor answered"
    );
    assert_eq!(healthz.ok(), Some(200));
    assert_eq!(fresh.ok(), Some(200), "a new client is served");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(held <= 40, "{held} upstream connections held");
    assert_eq!(emfile, 0, "{log}");
    assert!(
        proxy.metric("ratelimit_requests_shed_total{reason=\"max_requests_in_flight\"}") >= 300.0,
        "{}",
        proxy.report()
    );
    drop(attack);
}

/// An HTTP/2 upload that sends a byte every 300 ms, and a stream that opens a request and sends
/// nothing more. Pingora's HTTP/2 server reads bodies with no timeout: both held their stream,
/// their upstream connection and the connection (never idle while a stream is open) for ever.
/// Each is reset at its deadline (1 s: the whole body, and a stream with no frame), counted,
/// and the connection is then closed as idle.
#[test]
fn trickled_and_silent_http2_requests_are_reset_at_their_deadlines() {
    use crate::support::h2raw::Stalled;
    let upstream = Upstream::start();
    let cases = [
        (
            "a byte every 300 ms",
            "body_timeout_ms: 10000, request_body_timeout_ms: 1000",
            "request_body_timeout",
            true,
        ),
        (
            "no frame at all",
            "body_timeout_ms: 1000, request_body_timeout_ms: 60000",
            "body_timeout",
            false,
        ),
    ];
    for (what, limits, reason, trickle) in cases {
        let proxy = Proxy::start(&config(
            &upstream,
            &format!("downstream: {{ idle_timeout_ms: 500, {limits} }}\n"),
        ));
        let mut client = Stalled::open(proxy.addr, 1, 1_000_000, 10);
        let began = Instant::now();
        let mut reset = None;
        // Bounded: the reset, or 10 s.
        while began.elapsed() < Duration::from_secs(10) {
            if trickle {
                let _ = client.send_data(1, b"x");
            }
            let paced = Instant::now() + Duration::from_millis(300);
            while Instant::now() < paced && reset.is_none() {
                if client.seen().resets > 0 {
                    reset = Some(began.elapsed());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            if reset.is_some() {
                break;
            }
        }
        let closed = crate::support::wait_for(
            "the idle connection to close",
            Duration::from_secs(10),
            || client.seen().closed.then(|| began.elapsed()),
        );
        println!(
            "HTTP/2 request, {what}: reset after {reset:?}, connection closed after {closed:?}"
        );
        let reset = reset.unwrap_or_else(|| panic!("{what}: no reset within 10 s"));
        assert!(
            reset >= Duration::from_millis(900) && reset < Duration::from_millis(2500),
            "{what}: {reset:?}"
        );
        assert!(
            closed < reset + Duration::from_secs(3),
            "{what}: {closed:?}"
        );
        assert_eq!(
            proxy.metric(&format!(
                "ratelimit_connections_closed_total{{reason=\"{reason}\"}}"
            )),
            1.0,
            "{what}"
        );
        assert_eq!(
            proxy.metric("ratelimit_connections_closed_total{reason=\"client_reset\"}"),
            0.0,
            "{what}: the proxy's own reset is not the client's"
        );
    }
}
