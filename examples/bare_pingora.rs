//! Pingora and nothing else: every request proxied to one upstream, as `bench/compare.sh`'s floor
//! for what forwarding costs before ratelimit-proxy adds anything. The same Pingora, allocator,
//! threads and release profile as the proxy.
//!
//! `cargo run --release --example bare_pingora -- 127.0.0.1:8080 127.0.0.1:8000`

use async_trait::async_trait;
use pingora::prelude::*;
use std::net::SocketAddr;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Bare {
    upstream: SocketAddr,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

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
    let mut proxy = pingora::proxy::http_proxy_service(&server.configuration, Bare { upstream });
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.run_forever()
}
