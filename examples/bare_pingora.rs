//! Pingora and nothing else: every request proxied to one upstream, as `bench/compare.sh`'s floor
//! for what forwarding costs before ratelimit-proxy adds anything. The same Pingora, allocator,
//! threads and release profile as the proxy.
//!
//! `cargo run --release --example bare_pingora -- 127.0.0.1:8080 127.0.0.1:8000`
//!
//! With a third argument `refuse`, every request is answered 429 from `request_filter` instead,
//! with a short body and nothing else: the floor under the proxy's refusals (the hot key's path).
//!
//! With `PER_THREAD=1` in the environment it runs as the proxy does: one single-threaded service
//! per CPU, each with its own `SO_REUSEPORT` socket and upstream pool, instead of one service whose
//! threads share them.

use async_trait::async_trait;
use pingora::prelude::*;
use std::net::SocketAddr;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Bare {
    upstream: SocketAddr,
    refuse: bool,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn request_filter(&self, session: &mut Session, _: &mut ()) -> Result<bool> {
        if !self.refuse {
            return Ok(false);
        }
        let body = bytes::Bytes::from_static(b"429 Too Many Requests\n");
        let mut resp = ResponseHeader::build_no_case(429, Some(2))?;
        resp.insert_header("content-type", "text/plain")?;
        resp.insert_header("content-length", body.len())?;
        session.write_response_header(Box::new(resp), false).await?;
        session.write_response_body(Some(body), true).await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _: &mut Session, _: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }
}

/// A service that binds its own sockets instead of sharing the server's table, where a second
/// service on the same address would find the first one's socket.
struct OwnSocket<S>(S);

#[async_trait]
impl<S: pingora::services::Service> pingora::services::Service for OwnSocket<S> {
    async fn start_service(
        &mut self,
        _: Option<pingora::server::ListenFds>,
        shutdown: pingora::server::ShutdownWatch,
        listeners_per_fd: usize,
    ) {
        self.0.start_service(None, shutdown, listeners_per_fd).await
    }

    fn name(&self) -> &str {
        self.0.name()
    }

    fn threads(&self) -> Option<usize> {
        self.0.threads()
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:8080".into());
    let upstream: SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:8000".into())
        .parse()
        .expect("upstream: IP:port");
    let refuse = args.next().is_some_and(|a| a == "refuse");
    let conf = pingora::server::configuration::ServerConf {
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        work_stealing: false,
        ..Default::default()
    };
    let mut server = pingora::server::Server::new_with_opt_and_conf(
        pingora::server::configuration::Opt::default(),
        conf,
    );
    server.bootstrap();
    let conf = server.configuration.clone();
    let service = || pingora::proxy::http_proxy_service(&conf, Bare { upstream, refuse });
    if std::env::var_os("PER_THREAD").is_some_and(|v| v == "1") {
        for _ in 0..conf.threads {
            let mut proxy = service();
            let mut options = pingora::listeners::TcpSocketOptions::default();
            options.so_reuseport = Some(true);
            proxy.add_tcp_with_settings(&listen, options);
            proxy.threads = Some(1);
            server.add_service(OwnSocket(proxy));
        }
    } else {
        let mut proxy = service();
        proxy.add_tcp(&listen);
        server.add_service(proxy);
    }
    server.run_forever()
}
