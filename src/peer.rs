//! How the proxy reaches one upstream: the Pingora peer each request to it is sent with, built once
//! when the plan is compiled (scheme, TLS verification, timeouts), so a request only clones it.

use crate::config::{UpstreamScheme, UpstreamTimeouts, UpstreamTls};
use pingora::protocols::ALPN;
use pingora::upstreams::peer::HttpPeer;
use pingora::utils::tls::WrappedX509;
use std::net::SocketAddr;
use std::sync::Arc;

/// Requests multiplexed on one HTTP/2 connection to an upstream before Pingora opens another.
const UPSTREAM_H2_STREAMS: usize = 100;

/// The peer for the upstream `host` (as written in the config) at `addr`.
pub fn build(
    addr: SocketAddr,
    host: &str,
    scheme: UpstreamScheme,
    tls: &UpstreamTls,
    timeouts: UpstreamTimeouts,
) -> HttpPeer {
    let https = scheme == UpstreamScheme::Https;
    // Pingora skips verifying a certificate when the SNI is empty: an https upstream always
    // names the host its certificate must carry (an IP address is checked against the
    // certificate's IP names and sent as no SNI, as RFC 6066 asks).
    let sni = match (https, &tls.sni) {
        (false, _) => String::new(),
        (true, Some(sni)) => sni.clone(),
        (true, None) => host.to_string(),
    };
    let mut peer = HttpPeer::new(addr, https, sni);
    peer.options.connection_timeout = Some(timeouts.connect);
    peer.options.read_timeout = Some(timeouts.read);
    let options = &mut peer.options;
    match scheme {
        UpstreamScheme::Http => {}
        UpstreamScheme::Https => {
            // ALPN h2 first, as a browser would; the upstream settles it.
            options.alpn = ALPN::H2H1;
            options.max_h2_streams = UPSTREAM_H2_STREAMS;
            if let Some(ca) = &tls.ca {
                options.ca = Some(ca_list(&ca.certs));
                // Pingora reuses a connection for any peer of the same address, SNI and group:
                // a reloaded CA bundle must not reuse connections verified with the old one.
                peer.group_key = ca_group(&ca.certs);
            }
        }
        UpstreamScheme::H2c => {
            // HTTP/2 only: without TLS there is no ALPN, so the upstream is trusted to speak it.
            options.set_http_version(2, 2);
            options.max_h2_streams = UPSTREAM_H2_STREAMS;
        }
    }
    peer
}

/// A connection group for a CA bundle: a hash of its certificates, the top bit clear (health
/// probes set it for groups of their own).
fn ca_group(certs: &[rustls::pki_types::CertificateDer<'static>]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for der in certs {
        der.as_ref().hash(&mut h);
    }
    (h.finish() >> 1).max(1)
}

/// The CA list in Pingora's form. The certificates were parsed when the config was loaded, so
/// Pingora's parser (which panics on bad DER) only ever sees valid ones.
fn ca_list(certs: &[rustls::pki_types::CertificateDer<'static>]) -> Arc<[WrappedX509]> {
    certs
        .iter()
        .map(|der| WrappedX509::new(der.to_vec(), pingora::utils::tls::parse_x509))
        .collect()
}
