//! Serving a TLS listener's certificates: a resolver of our own between Pingora and the pairs, so
//! that a reload can put renewed certificates in place for new connections without a restart
//! (Pingora's listener would read the files once), and several can be chosen by the name a client
//! asks for (SNI).

use super::unix_now;
use crate::config::{Listener, TlsListener};
use arc_swap::ArcSwap;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGaugeVec, Opts};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// What one TLS listener serves: the certificates a reload last put in place.
#[derive(Debug)]
pub struct Resolver {
    current: ArcSwap<Certificates>,
    /// The soonest notAfter of its leaves (Unix s).
    not_after: AtomicI64,
}

/// A listener's certificates, each with the names it is chosen for (lower case; `*.` wildcards).
#[derive(Debug)]
struct Certificates(Vec<(Vec<String>, Arc<CertifiedKey>)>);

impl Certificates {
    fn of(tls: &TlsListener) -> Arc<Certificates> {
        Arc::new(Certificates(
            tls.certs
                .iter()
                .map(|c| {
                    let names = c
                        .served
                        .names
                        .iter()
                        .map(|n| n.to_ascii_lowercase())
                        .collect();
                    (names, c.pair.0.clone())
                })
                .collect(),
        ))
    }

    /// The first certificate that carries `name`, else the first of all.
    fn choose(&self, name: Option<&str>) -> Option<&Arc<CertifiedKey>> {
        let by_name = name.and_then(|name| {
            self.0
                .iter()
                .find(|(names, _)| names.iter().any(|n| name_matches(n, name)))
        });
        by_name.or(self.0.first()).map(|(_, key)| key)
    }
}

/// Whether a certificate name (lower case) covers the name a client asked for: equal ignoring
/// case, or `*.example.com` for exactly one label before `example.com` (RFC 6125 §6.4.3).
fn name_matches(pattern: &str, asked: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(parent) => asked
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest.eq_ignore_ascii_case(parent)),
        None => pattern.eq_ignore_ascii_case(asked),
    }
}

/// The soonest expiry among a listener's certificates.
fn soonest(tls: &TlsListener) -> i64 {
    tls.certs
        .iter()
        .map(|c| c.served.not_after)
        .min()
        .unwrap_or(0)
}

impl Resolver {
    fn new(tls: &TlsListener) -> Arc<Resolver> {
        Arc::new(Resolver {
            current: ArcSwap::new(Certificates::of(tls)),
            not_after: AtomicI64::new(soonest(tls)),
        })
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.load().choose(hello.server_name()).cloned()
    }
}

/// Every TLS listener's resolver, by address: where a reload puts renewed certificates. Also the
/// collector of `ratelimit_tls_cert_expiry_seconds`, worked out at each scrape.
#[derive(Debug, Clone)]
pub struct Resolvers {
    listeners: Vec<(SocketAddr, Arc<Resolver>)>,
    expiry: IntGaugeVec,
}

impl Resolvers {
    /// A resolver for each TLS listener, serving its pair until a reload replaces it.
    pub fn new(listen: &[Listener]) -> Resolvers {
        let expiry = IntGaugeVec::new(
            Opts::new(
                "ratelimit_tls_cert_expiry_seconds",
                "Seconds until the certificate a TLS listener serves expires (negative: expired)",
            ),
            &["listener"],
        )
        .expect("a valid metric definition");
        Resolvers {
            listeners: listen
                .iter()
                .filter_map(|l| Some((l.addr, Resolver::new(l.tls.as_ref()?))))
                .collect(),
            expiry,
        }
    }

    /// The resolver of the TLS listener at `addr`.
    pub fn get(&self, addr: SocketAddr) -> Option<Arc<Resolver>> {
        self.listeners
            .iter()
            .find(|(a, _)| *a == addr)
            .map(|(_, r)| r.clone())
    }

    /// Each TLS listener and the seconds until its soonest certificate expires (negative once it
    /// has), now.
    pub fn expiries(&self) -> Vec<(SocketAddr, i64)> {
        let now = unix_now();
        self.listeners
            .iter()
            .map(|(addr, r)| (*addr, r.not_after.load(Ordering::Relaxed) - now))
            .collect()
    }

    /// New connections to `addr` get `tls`'s certificates from now on; `false` when no TLS
    /// listener is there.
    pub fn install(&self, addr: SocketAddr, tls: &TlsListener) -> bool {
        match self.get(addr) {
            Some(r) => {
                r.current.store(Certificates::of(tls));
                r.not_after.store(soonest(tls), Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}

impl Collector for Resolvers {
    fn desc(&self) -> Vec<&Desc> {
        self.expiry.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let now = unix_now();
        for (addr, r) in &self.listeners {
            let left = r.not_after.load(Ordering::Relaxed) - now;
            self.expiry
                .with_label_values(&[addr.to_string().as_str()])
                .set(left);
        }
        self.expiry.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_covers_one_label_and_names_ignore_case() {
        assert!(name_matches("api.example.com", "API.example.com"));
        assert!(name_matches("*.example.com", "a.example.com"));
        assert!(!name_matches("*.example.com", "example.com"));
        assert!(!name_matches("*.example.com", "a.b.example.com"));
        assert!(!name_matches("*.example.com", ".example.com"));
        assert!(!name_matches("api.example.com", "api.example.org"));
    }
}
