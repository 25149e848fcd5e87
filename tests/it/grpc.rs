//! A real gRPC client and server (Python grpcio, `support/grpc_peer.py`) through the real proxy:
//! calls of every kind (unary, server, client and bidirectional streaming) pass to an `h2c://`
//! upstream with the rate-limit fields as metadata, and the calls beyond capacity fail with
//! RESOURCE_EXHAUSTED (not the UNAVAILABLE a plain 429 maps to), over h2c and over TLS; a store
//! that is down on a fail-closed route is UNAVAILABLE.

use crate::support::proxy::Proxy;
use crate::support::tls::certificates;
use crate::support::{free_port, wait_for};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

const PEER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/support/grpc_peer.py");

/// The gRPC server, for as long as the test holds it: it exits when its stdin closes.
struct GrpcServer {
    child: Child,
    _stdin: ChildStdin,
    port: u16,
}

impl GrpcServer {
    fn start() -> GrpcServer {
        GrpcServer::start_with(&[])
    }

    /// Serving TLS with the certificate and key in `dir` (`server.crt`, `server.key`).
    fn start_tls(dir: &Path) -> GrpcServer {
        GrpcServer::start_with(&[
            dir.join("server.crt").display().to_string(),
            dir.join("server.key").display().to_string(),
        ])
    }

    fn start_with(tls: &[String]) -> GrpcServer {
        let mut child = Command::new("python3")
            .args([PEER, "server"])
            .args(tls)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 with grpcio (scripts/test installs it)");
        let stdin = child.stdin.take().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the gRPC server did not say its port: {line:?}"));
        GrpcServer {
            child,
            _stdin: stdin,
            port,
        }
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one call ended with, as the client saw it.
#[derive(Debug)]
struct Outcome {
    method: String,
    code: String,
    details: String,
    replies: usize,
    metadata: Vec<(String, String)>,
}

impl Outcome {
    fn meta(&self, name: &str) -> Option<&str> {
        self.metadata
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Runs the client against `target` for each `METHOD:KEY` call, in order.
fn calls(target: &str, ca: Option<&Path>, specs: &[&str]) -> Vec<Outcome> {
    let mut cmd = Command::new("python3");
    cmd.args([PEER, "client", target]);
    if let Some(ca) = ca {
        cmd.arg("--ca").arg(ca);
    }
    let mut child = cmd
        .args(specs)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    // Each call has a 10 s deadline: a client still running after a minute is stuck, and the
    // test says so rather than waiting for ever.
    wait_for("the gRPC client to exit", Duration::from_secs(60), || {
        child.try_wait().expect("the gRPC client").map(|_| ())
    });
    let out = child.wait_with_output().expect("python3");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "client: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outcomes: Vec<Outcome> = text.lines().map(parse).collect();
    assert_eq!(outcomes.len(), specs.len(), "{text}");
    outcomes
}

/// One JSON line of the client, read with the few rules its output needs (flat strings, one
/// list of strings, one object of strings).
fn parse(line: &str) -> Outcome {
    let field = |name: &str| -> String {
        let start = line
            .find(&format!("\"{name}\": \""))
            .unwrap_or_else(|| panic!("{name} in {line}"))
            + name.len()
            + 5;
        json_string(&line[start..]).0
    };
    let metadata_at = line.find("\"metadata\": {").expect("metadata") + 13;
    let mut metadata = Vec::new();
    let mut rest = &line[metadata_at..];
    while let Some(start) = rest.find('"') {
        if rest[..start].contains('}') {
            break;
        }
        let (name, used) = json_string(&rest[start + 1..]);
        rest = &rest[start + 1 + used..];
        let v = rest.find('"').expect("a value");
        let (value, used) = json_string(&rest[v + 1..]);
        rest = &rest[v + 1 + used..];
        metadata.push((name, value));
    }
    let replies_at = line.find("\"replies\": [").expect("replies") + 12;
    let replies_end = replies_at + line[replies_at..].find(']').unwrap();
    Outcome {
        method: field("method"),
        code: field("code"),
        details: field("details"),
        replies: line[replies_at..replies_end].matches('"').count() / 2,
        metadata,
    }
}

/// A JSON string's text from just after its opening quote: (text, bytes used with the closing
/// quote).
fn json_string(s: &str) -> (String, usize) {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return (out, i + 1),
            '\\' => {
                if let Some((_, e)) = chars.next() {
                    out.push(match e {
                        'n' => '\n',
                        other => other,
                    });
                }
            }
            c => out.push(c),
        }
    }
    panic!("unterminated JSON string: {s}")
}

fn route(upstream_port: u16) -> String {
    route_to(&format!("h2c://127.0.0.1:{upstream_port}"))
}

fn route_to(upstream: &str) -> String {
    format!(
        "routes:\n  - name: grpc-orders\n    match: {{ path_prefix: \"/orders.v1.Orders/\" }}\n    \
         upstream: \"{upstream}\"\n    \
         limits: [{{ name: per_client, capacity: 2, refill: \"1/h\", key: \"header:x-api-key\" }}]\n"
    )
}

/// Each kind of call, three times for one key: two pass with their replies, the third is refused
/// the way gRPC clients understand.
fn three_of_each_kind(target: &str, ca: Option<&Path>) {
    let specs = [
        "Get:a", "Get:a", "Get:a", "List:b", "List:b", "List:b", "Upload:c", "Upload:c",
        "Upload:c", "Chat:d", "Chat:d", "Chat:d",
    ];
    let outcomes = calls(target, ca, &specs);
    for (i, o) in outcomes.iter().enumerate() {
        let expected_replies = match o.method.as_str() {
            "List" | "Chat" => 3,
            _ => 1,
        };
        match i % 3 {
            0 | 1 => {
                assert_eq!(o.code, "OK", "{o:?}");
                assert_eq!(o.replies, expected_replies, "{o:?}");
                let left = if i % 3 == 0 { "1" } else { "0" };
                assert_eq!(o.meta("x-ratelimit-remaining"), Some(left), "{o:?}");
                assert_eq!(o.meta("x-ratelimit-limit"), Some("2"), "{o:?}");
            }
            _ => {
                assert_eq!(o.code, "RESOURCE_EXHAUSTED", "{o:?}");
                assert_eq!(o.replies, 0, "{o:?}");
                assert_eq!(
                    o.details,
                    "limit \"per_client\" of route \"grpc-orders\" is exhausted; retry in 3600 s",
                    "{o:?}"
                );
                assert_eq!(o.meta("retry-after"), Some("3600"), "{o:?}");
                assert_eq!(o.meta("x-ratelimit-remaining"), Some("0"), "{o:?}");
                assert_eq!(
                    o.meta("ratelimit"),
                    Some("\"per_client\";r=0;t=3600"),
                    "{o:?}"
                );
                assert!(o.meta("ratelimit-policy").is_some(), "{o:?}");
            }
        }
    }
}

#[test]
fn grpc_calls_beyond_capacity_fail_with_resource_exhausted_over_h2c() {
    let server = GrpcServer::start();
    let yaml = format!(
        "listen:\n  - {{ address: \"{{listen}}\", h2c: true }}\nadmin: \"{{admin}}\"\n{}",
        route(server.port)
    );
    let proxy = Proxy::start(&yaml);
    three_of_each_kind(&proxy.addr.to_string(), None);
    assert_eq!(proxy.decisions("grpc-orders", "allowed"), 8);
    assert_eq!(proxy.decisions("grpc-orders", "rejected"), 4);
}

#[test]
fn grpc_calls_beyond_capacity_fail_with_resource_exhausted_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let server = GrpcServer::start();
    let yaml = format!(
        "listen:\n  - address: \"{{listen}}\"\n    tls: {{ cert_file: \"{}\", key_file: \"{}\" }}\n\
         admin: \"{{admin}}\"\n{}",
        dir.path().join("server.crt").display(),
        dir.path().join("server.key").display(),
        route(server.port)
    );
    let proxy = Proxy::start(&yaml);
    let target = format!("localhost:{}", proxy.addr.port());
    three_of_each_kind(&target, Some(&dir.path().join("ca.crt")));
    assert_eq!(proxy.decisions("grpc-orders", "rejected"), 4);
}

#[test]
fn a_grpc_call_on_a_fail_closed_route_with_redis_down_is_unavailable() {
    let server = GrpcServer::start();
    // Nothing listens there: every decision fails, and the route fails closed.
    let yaml = format!(
        "listen:\n  - {{ address: \"{{listen}}\", h2c: true }}\nadmin: \"{{admin}}\"\n\
         redis: {{ url: \"redis://127.0.0.1:{}\", timeout_ms: 200 }}\non_redis_error: closed\n{}",
        free_port(),
        route(server.port)
    );
    let proxy = Proxy::start(&yaml);
    let outcomes = calls(&proxy.addr.to_string(), None, &["Get:a", "Chat:a"]);
    for o in &outcomes {
        assert_eq!(o.code, "UNAVAILABLE", "{o:?}");
        assert_eq!(o.details, "rate-limit store unavailable", "{o:?}");
    }
    assert_eq!(proxy.decisions("grpc-orders", "fail_closed"), 2);
}

/// A call without the key that a `deny` limit needs is UNAUTHENTICATED, not RESOURCE_EXHAUSTED:
/// waiting will not help, credentials will; no rate-limit metadata goes with it.
#[test]
fn a_grpc_call_without_its_key_is_unauthenticated() {
    let server = GrpcServer::start();
    let yaml = format!(
        "listen:\n  - {{ address: \"{{listen}}\", h2c: true }}\nadmin: \"{{admin}}\"\n{}",
        route(server.port).replace(
            "key: \"header:x-api-key\"",
            "key: \"header:x-api-key\", on_missing_key: deny"
        )
    );
    let proxy = Proxy::start(&yaml);
    let outcomes = calls(&proxy.addr.to_string(), None, &["Get:", "Chat:", "Get:a"]);
    for o in &outcomes[..2] {
        assert_eq!(o.code, "UNAUTHENTICATED", "{o:?}");
        assert_eq!(o.replies, 0, "{o:?}");
        assert_eq!(
            o.details,
            "limit \"per_client\" of route \"grpc-orders\" needs a key this request does not carry",
            "{o:?}"
        );
        assert_eq!(o.meta("retry-after"), None, "{o:?}");
        assert_eq!(o.meta("ratelimit"), None, "{o:?}");
    }
    assert_eq!(outcomes[2].code, "OK", "{:?}", outcomes[2]);
    assert_eq!(proxy.decisions("grpc-orders", "rejected"), 2);
}

/// `key: path` is a bucket per gRPC method: one method's calls run out together, whoever makes
/// them, while another method is untouched.
#[test]
fn a_path_keyed_limit_is_a_bucket_per_grpc_method() {
    let server = GrpcServer::start();
    let yaml = format!(
        "listen:\n  - {{ address: \"{{listen}}\", h2c: true }}\nadmin: \"{{admin}}\"\n{}",
        route(server.port).replace("key: \"header:x-api-key\"", "key: path")
    );
    let proxy = Proxy::start(&yaml);
    let codes: Vec<String> = calls(
        &proxy.addr.to_string(),
        None,
        &["Get:x", "Get:y", "Get:z", "List:x", "List:y", "Chat:z"],
    )
    .into_iter()
    .map(|o| o.code)
    .collect();
    assert_eq!(
        codes,
        ["OK", "OK", "RESOURCE_EXHAUSTED", "OK", "OK", "OK"],
        "per method, not per client"
    );
}

/// An `https://` upstream that speaks HTTP/2 (a gRPC server over TLS, verified with a private CA):
/// ALPN settles on h2, and calls of every kind pass and are limited as over h2c.
#[test]
fn grpc_calls_reach_a_tls_upstream_over_http2() {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let server = GrpcServer::start_tls(dir.path());
    let routes = route_to(&format!("https://localhost:{}", server.port)).replace(
        "    limits:",
        &format!(
            "    upstream_tls: {{ ca_file: \"{}\" }}\n    limits:",
            dir.path().join("ca.crt").display()
        ),
    );
    let yaml = format!(
        "listen:\n  - {{ address: \"{{listen}}\", h2c: true }}\nadmin: \"{{admin}}\"\n{routes}"
    );
    let proxy = Proxy::start(&yaml);
    three_of_each_kind(&proxy.addr.to_string(), None);
}

/// A proxy (h2c) in front of `server` whose route has 100 tokens charged from the
/// `x-usage-total-tokens` trailer.
fn charged_by_trailer(server: &GrpcServer) -> Proxy {
    Proxy::start(&format!(
        "listen:\n  - {{ address: \"{{listen}}\", h2c: true }}\nadmin: \"{{admin}}\"\n\
         routes:\n  - name: grpc-orders\n    match: {{ path_prefix: \"/orders.v1.Orders/\" }}\n    \
         upstream: \"h2c://127.0.0.1:{}\"\n    \
         limits: [{{ name: tokens, capacity: 100, refill: \"1/h\", key: \"header:x-api-key\", \
         charge_from_response: \"trailer:x-usage-total-tokens\" }}]\n",
        server.port
    ))
}

/// Usage a gRPC upstream reports in a trailer is charged once the call ends (after the trailers
/// passed through): the next call sees the balance after it.
#[test]
fn usage_reported_in_a_grpc_trailer_is_charged_after_the_call() {
    let server = GrpcServer::start();
    let proxy = charged_by_trailer(&server);
    let target = proxy.addr.to_string();
    let first = calls(&target, None, &["Usage:k"]);
    assert_eq!(first[0].code, "OK", "{:?}", first[0]);
    assert_eq!(
        first[0].meta("x-usage-total-tokens"),
        Some("42"),
        "the trailer reaches the client"
    );
    assert_eq!(
        first[0].meta("x-ratelimit-remaining"),
        Some("99"),
        "up front: 1"
    );
    let charged = "ratelimit_usage_charged_total{limit=\"tokens\",route=\"grpc-orders\"}";
    wait_for("the charge", Duration::from_secs(10), || {
        (proxy.metric(charged) == 42.0).then_some(())
    });
    let second = calls(&target, None, &["Get:k"]);
    assert_eq!(
        second[0].meta("x-ratelimit-remaining"),
        Some("57"),
        "100 - 42 - 1: {:?}",
        second[0]
    );
}

/// A gRPC client that cancels its call before the trailers that report the usage (RST_STREAM
/// after the first reply) is charged all the same: the proxy reads the call to its end. A key
/// with 100 tokens and calls of 50 gets at most 3 calls to the upstream, each charged its 50.
#[test]
fn a_grpc_client_that_cancels_before_the_trailers_is_charged_them() {
    let server = GrpcServer::start();
    let proxy = charged_by_trailer(&server);
    let target = proxy.addr.to_string();
    let charged = "ratelimit_usage_charged_total{limit=\"tokens\",route=\"grpc-orders\"}";
    let unreported = "ratelimit_usage_unreported_total{limit=\"tokens\",route=\"grpc-orders\"}";
    let mut codes = Vec::new();
    for i in 1..=8u64 {
        codes.push(calls(&target, None, &["SlowUsageCancel:k"])[0].code.clone());
        wait_for(
            &format!("call {i} decided, and settled if admitted"),
            Duration::from_secs(10),
            || {
                let allowed = proxy.decisions("grpc-orders", "allowed");
                let rejected = proxy.decisions("grpc-orders", "rejected");
                let settled = proxy.metric(charged) / 50.0 + proxy.metric(unreported);
                (allowed + rejected >= i && settled >= allowed as f64).then_some(())
            },
        );
    }
    let allowed = proxy.decisions("grpc-orders", "allowed");
    eprintln!(
        "codes {codes:?}; allowed {allowed}; charged {}",
        proxy.metric(charged)
    );
    assert!(allowed <= 3, "100 tokens, calls of 50: {allowed} admitted");
    assert_eq!(
        proxy.metric(unreported),
        0.0,
        "every cancelled call was charged"
    );
    assert_eq!(proxy.metric(charged), 50.0 * allowed as f64);
}
