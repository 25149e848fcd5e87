//! Pingora and nothing else: every request proxied to one upstream, as `bench/compare.sh`'s floor
//! for what forwarding costs before ratelimit-proxy adds anything. The same Pingora, allocator,
//! threads and release profile as the proxy.
//!
//! `cargo run --release --example bare_pingora -- 127.0.0.1:8080 127.0.0.1:8000`
//!
//! With a third argument `refuse`, every request is answered 429 from `request_filter` instead,
//! with a short body and nothing else: the floor under the proxy's refusals (the hot key's path).

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
    let mut proxy =
        pingora::proxy::http_proxy_service(&server.configuration, Bare { upstream, refuse });
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.run_forever()
}
