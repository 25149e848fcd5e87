//! What keeps the admin port for operators: a Host check against DNS rebinding, the headers every
//! admin response carries, and a cap on the calls that go to the store.
//!
//! The admin port answers on loopback (or a private address) without a token for reads. A page on
//! another origin can still reach it through the browser: DNS rebinding points the page's own name
//! at 127.0.0.1, and the browser then takes `/v1/routes` for that origin's. The browser sends the
//! page's name in `Host`, so the admin answers only a Host that is its own address, loopback, or a
//! name the operator listed. `/healthz` and `/readyz` say nothing worth stealing and must answer a
//! probe that comes through a port mapping: they are not checked.

use crate::canonical;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Store calls (`/v1/buckets`) the admin makes at once, across its connections: the store serves
/// the proxy's decisions first. Beyond it a call is answered 429 at once, never queued.
pub const STORE_CALLS: usize = 2;

/// The inline script and style of `status.html`, by their SHA-256 (base64), as
/// `Content-Security-Policy` allows them: nothing else runs or styles the page. Editing
/// `status.html` changes them; `tests/it/status_page.rs` checks them with openssl and says what
/// they must be.
const STATUS_SCRIPT: &str = "sha256-3uriPcXu2JbqB4FpYhxAH9h+SNA8ujbaR1RTgwHyNdE=";
const STATUS_STYLE: &str = "sha256-AMHsPjcpZvX8a41YXdM1nR7n7A3g4s8zMg4sngIO7iU=";

/// On every admin response. The policy allows only what the status page needs: its own inline
/// script and style (by hash), and its polls of this origin (`connect-src 'self'`); no frame may
/// hold it, no type is sniffed, no cache keeps an answer.
pub fn security_headers() -> [(&'static str, String); 4] {
    [
        (
            "content-security-policy",
            format!(
                "default-src 'none'; script-src '{STATUS_SCRIPT}'; style-src '{STATUS_STYLE}'; \
                 connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
                 frame-ancestors 'none'"
            ),
        ),
        ("x-frame-options", "DENY".into()),
        ("x-content-type-options", "nosniff".into()),
        ("cache-control", "no-store".into()),
    ]
}

/// The same headers as HTTP/1.1 lines, for the answers `downstream` writes itself (408, 431).
pub fn security_header_lines() -> String {
    security_headers()
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect()
}

/// Which Hosts the admin answers to.
#[derive(Debug, Clone)]
pub struct HostCheck {
    /// The admin's listening address: its IP (unless unspecified) and port are its own names.
    listen: SocketAddr,
    /// `admin.allowed_hosts`: a name, and its port when one was written.
    allowed: Vec<(String, Option<u16>)>,
}

impl HostCheck {
    /// `allowed`: `admin.allowed_hosts` as the config validated them.
    pub fn new(listen: SocketAddr, allowed: &[String]) -> HostCheck {
        let allowed = allowed
            .iter()
            .filter_map(|h| canonical::host(h.as_bytes()).ok())
            .map(|h| (h.name.into_owned(), h.port))
            .collect();
        HostCheck { listen, allowed }
    }

    /// Whether a request with this Host (`raw`), which came in on `local` (the address the client
    /// connected to), is the operator's: the admin's own address or loopback with its port, the
    /// connection's own address with its port (a listener on 0.0.0.0 reached by a probe at the
    /// pod's IP), or a listed name.
    pub fn allows(&self, raw: Option<&[u8]>, local: Option<SocketAddr>) -> bool {
        let Some(host) = raw.and_then(|r| canonical::host(r).ok()) else {
            return false;
        };
        let name = &*host.name;
        let listed = self
            .allowed
            .iter()
            .any(|(n, port)| n == name && port.is_none_or(|p| host.port == Some(p)));
        if listed {
            return true;
        }
        if host.port != Some(self.listen.port()) {
            return false;
        }
        let ip = match name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
            Some(v6) => v6.parse::<IpAddr>().ok(),
            None => name.parse::<IpAddr>().ok(),
        };
        match ip {
            None => name == "localhost",
            Some(ip) => {
                ip == IpAddr::from(Ipv4Addr::LOCALHOST)
                    || ip == IpAddr::from(Ipv6Addr::LOCALHOST)
                    || (!self.listen.ip().is_unspecified() && ip == self.listen.ip())
                    || local.is_some_and(|l| l.ip().to_canonical() == ip.to_canonical())
            }
        }
    }
}

/// The admin's share of the store.
#[derive(Debug, Clone)]
pub struct StoreCalls(std::sync::Arc<Semaphore>);

impl Default for StoreCalls {
    fn default() -> Self {
        StoreCalls(std::sync::Arc::new(Semaphore::new(STORE_CALLS)))
    }
}

impl StoreCalls {
    /// A place for one call, or `None` when [`STORE_CALLS`] are under way.
    pub fn try_enter(&self) -> Option<OwnedSemaphorePermit> {
        self.0.clone().try_acquire_owned().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_its_own_names_are_answered() {
        let check = HostCheck::new(
            "127.0.0.1:9090".parse().unwrap(),
            &["admin.internal".into(), "prom.internal:9443".into()],
        );
        let local = Some("127.0.0.1:9090".parse().unwrap());
        let allows = |h: &str| check.allows(Some(h.as_bytes()), local);
        for ok in [
            "127.0.0.1:9090",
            "localhost:9090",
            "LOCALHOST.:9090",
            "[::1]:9090",
            "admin.internal",
            "Admin.Internal:9090",
            "prom.internal:9443",
        ] {
            assert!(allows(ok), "{ok}");
        }
        for refused in [
            "evil.example:9090",
            "evil.example",
            "localhost",
            "127.0.0.1",
            "localhost:80",
            "127.0.0.2:9090",
            "prom.internal:9090",
            "localhost.evil.example:9090",
            "a/b",
            "",
        ] {
            assert!(!allows(refused), "{refused}");
        }
        assert!(!check.allows(None, local), "no Host");
    }

    #[test]
    fn a_listener_on_every_interface_answers_the_address_it_was_reached_at() {
        let check = HostCheck::new("0.0.0.0:9090".parse().unwrap(), &[]);
        let pod = Some("10.1.2.3:9090".parse().unwrap());
        assert!(check.allows(Some(b"10.1.2.3:9090"), pod));
        assert!(!check.allows(Some(b"10.9.9.9:9090"), pod));
        assert!(!check.allows(Some(b"0.0.0.0:9090"), pod));
    }

    #[test]
    fn store_calls_beyond_the_cap_are_refused_not_queued() {
        let calls = StoreCalls::default();
        let held: Vec<_> = (0..STORE_CALLS)
            .map(|_| calls.try_enter().unwrap())
            .collect();
        assert!(calls.try_enter().is_none());
        drop(held);
        assert!(calls.try_enter().is_some());
    }
}
