//! A TLS listener's certificate and key: read, checked to belong together, and described (the
//! names it serves, when it expires) for `--check` and the logs; and served through a resolver of
//! our own, so that a reload can put a renewed pair in place for new connections without a restart
//! (Pingora's listener would read the files once). A bad pair is a config problem, never a panic
//! inside Pingora.

use crate::config::{Listener, TlsListener};
use arc_swap::ArcSwap;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGaugeVec, Opts};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ClientHello as Hello;
use rustls::server::ResolvesServerCert;
use rustls::sign::CertifiedKey;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// A certificate chain with its key, ready to serve. Equal when the chains are.
#[derive(Clone)]
pub struct Pair(pub Arc<CertifiedKey>);

impl PartialEq for Pair {
    fn eq(&self, other: &Pair) -> bool {
        self.0.cert == other.0.cert
    }
}

impl Eq for Pair {}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pair({} certificates)", self.0.cert.len())
    }
}

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
    fn resolve(&self, hello: Hello<'_>) -> Option<Arc<CertifiedKey>> {
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

/// What a valid pair serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The leaf's DNS names and IP addresses (subjectAltName), else its common name.
    pub names: Vec<String>,
    /// The leaf's notAfter, in seconds since the Unix epoch.
    pub not_after: i64,
}

/// Why a pair cannot be served; `Cert` problems belong to the certificate file, `Key` ones to
/// the key file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {0}: {1}")]
    Cert(String, String),
    #[error("cannot read {0}: {1}")]
    Key(String, String),
    #[error("{key} is not the private key of the certificate in {cert}")]
    Mismatch { cert: String, key: String },
}

impl TlsError {
    /// Whether the key file is at fault (else the certificate file).
    pub fn is_key(&self) -> bool {
        matches!(self, TlsError::Key(..) | TlsError::Mismatch { .. })
    }
}

impl Served {
    /// `"for a.example, b.example, expires 2027-03-01 (87 days)"`, counted from `now` (Unix s).
    pub fn describe(&self, now: i64) -> String {
        let days = (self.not_after - now).div_euclid(86_400);
        let left = if self.not_after <= now {
            "EXPIRED".to_string()
        } else if days == 1 {
            "1 day".to_string()
        } else {
            format!("{days} days")
        };
        format!(
            "for {}, expires {} ({left})",
            self.names.join(", "),
            utc_date(self.not_after)
        )
    }
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The UTC calendar date of a Unix time, `YYYY-MM-DD` (the proleptic Gregorian calendar, as
/// X.509 times are).
fn utc_date(secs: i64) -> String {
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Reads `cert_file` (the chain, leaf first) and `key_file` and checks that the key is the leaf's.
pub fn load(cert_file: &Path, key_file: &Path) -> Result<(Served, Pair), TlsError> {
    let cert_name = cert_file.display().to_string();
    let key_name = key_file.display().to_string();
    let cert_err = |m: String| TlsError::Cert(cert_name.clone(), m);
    let key_err = |m: String| TlsError::Key(key_name.clone(), m);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| cert_err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| cert_err(e.to_string()))?;
    let Some(leaf) = certs.first() else {
        return Err(cert_err("no PEM certificate in it".into()));
    };
    let served = describe(leaf).map_err(cert_err)?;
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| key_err(e.to_string()))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| key_err(format!("unsupported private key: {e}")))?;
    let pair = CertifiedKey::new(certs, signer);
    if pair.keys_match().is_err() {
        return Err(TlsError::Mismatch {
            cert: cert_name,
            key: key_name,
        });
    }
    Ok((served, Pair(Arc::new(pair))))
}

/// Reads a CA file for verifying upstreams: one or more PEM certificates, each a valid X.509
/// certificate (Pingora parses them again per connection and would panic on one that is not).
pub fn load_ca(file: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    if certs.is_empty() {
        return Err(format!("no PEM certificate in {}", file.display()));
    }
    for der in &certs {
        describe(der).map_err(|e| format!("{}: {e}", file.display()))?;
    }
    Ok(certs)
}

/// The names and expiry of a DER certificate.
fn describe(der: &CertificateDer<'_>) -> Result<Served, String> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let mut names: Vec<String> = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(dns) => names.push((*dns).to_string()),
                GeneralName::IPAddress(ip) => match ip.len() {
                    4 => names.push(
                        std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*ip).unwrap()).to_string(),
                    ),
                    16 => names.push(
                        std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*ip).unwrap()).to_string(),
                    ),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    if names.is_empty() {
        names.extend(
            cert.subject()
                .iter_common_name()
                .filter_map(|cn| cn.as_str().ok().map(str::to_string)),
        );
    }
    Ok(Served {
        names,
        not_after: cert.validity().not_after.timestamp(),
    })
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

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(951_782_400), "2000-02-29");
        assert_eq!(utc_date(1_798_761_599), "2026-12-31");
        assert_eq!(utc_date(-1), "1969-12-31");
    }

    #[test]
    fn describes_names_expiry_and_days_left() {
        let s = Served {
            names: vec!["a.example".into(), "127.0.0.1".into()],
            not_after: 1_800_000_000,
        };
        assert_eq!(
            s.describe(1_800_000_000 - 10 * 86_400),
            "for a.example, 127.0.0.1, expires 2027-01-15 (10 days)"
        );
        assert!(s.describe(1_800_000_001).ends_with("(EXPIRED)"));
    }
}
