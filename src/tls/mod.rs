//! A TLS listener's certificates and keys: read, checked to belong together, and described (the
//! names each serves, when it expires) for `--check` and the logs; CA files for verifying
//! upstreams. A bad pair or CA file is a config problem, never a panic inside Pingora. Serving them
//! is `resolver`'s.

mod resolver;

pub use resolver::{Resolver, Resolvers};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use std::path::Path;
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
    let (year, month, day) = crate::calendar::civil_from_days(secs.div_euclid(86_400));
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
