//! Who the client is: the address a limit keys on when it says `client_ip`.
//!
//! Behind a load balancer the peer is the balancer, so the client is named in `X-Forwarded-For`.
//! Anyone can write that header, so only the hops we trust count: walking the list from the right
//! (the entry our peer appended) past every address in `trusted_proxies`, the first untrusted
//! address is the client. A client that prepends its own entries changes nothing: they are left of
//! the one our trusted proxy wrote. IPv6 clients can be grouped by prefix, since one host commonly
//! holds a whole /64 and could otherwise mint a bucket per address.

use std::net::IpAddr;
use std::str::FromStr;

/// An address block, `10.0.0.0/8` or `2001:db8::/32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an address or CIDR block"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        Ok(Cidr {
            addr: mask(addr, prefix),
            prefix,
        })
    }
}

impl Cidr {
    /// Wider than a /8 of IPv4 or a /32 of IPv6: no operator's own proxies span that much.
    pub fn is_wide(&self) -> bool {
        self.prefix < if self.addr.is_ipv4() { 8 } else { 32 }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
    }
}

/// `ip` with every bit past `prefix` cleared.
fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let keep = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::from((bits & keep).to_be_bytes())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let keep = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::from((bits & keep).to_be_bytes())
        }
    }
}

/// How the client address is found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientIdentity {
    pub trusted_proxies: Vec<Cidr>,
    /// IPv6 clients are keyed by this prefix (128: each address alone).
    pub ipv6_prefix: u8,
}

impl ClientIdentity {
    /// Whether `ip` is one of the proxies whose forwarding headers are believed.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted_proxies.iter().any(|c| c.contains(ip))
    }

    /// The client behind `peer`, given the request's `X-Forwarded-For` values in order.
    pub fn client<'a>(
        &self,
        peer: IpAddr,
        forwarded_for: impl Iterator<Item = &'a [u8]>,
    ) -> IpAddr {
        let peer = peer.to_canonical();
        let mut client = peer;
        if self.is_trusted(peer) {
            let hops: Vec<&[u8]> = forwarded_for
                .flat_map(|v| v.split(|b| *b == b','))
                .collect();
            for hop in hops.iter().rev() {
                let Some(ip) = std::str::from_utf8(hop)
                    .ok()
                    .and_then(|h| h.trim().parse::<IpAddr>().ok())
                else {
                    // Garbage where an address should be: nothing left of it can be trusted.
                    break;
                };
                client = ip.to_canonical();
                if !self.is_trusted(client) {
                    break;
                }
            }
        }
        self.group(client)
    }

    fn group(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V6(_) if self.ipv6_prefix < 128 => mask(ip, self.ipv6_prefix),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn identity(trusted: &[&str]) -> ClientIdentity {
        ClientIdentity {
            trusted_proxies: trusted.iter().map(|c| c.parse().unwrap()).collect(),
            ipv6_prefix: 128,
        }
    }

    #[test]
    fn cidrs_parse_and_match() {
        let c: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(c.contains(ip("10.1.200.3")));
        assert!(!c.contains(ip("10.2.0.1")));
        assert!(
            c.contains(ip("::ffff:10.1.0.9")),
            "v4-mapped v6 is the v4 address"
        );
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:1::1")) && !v6.contains(ip("10.1.0.1")));
        assert_eq!(
            "0.0.0.0/0"
                .parse::<Cidr>()
                .map(|c| c.contains(ip("1.2.3.4"))),
            Ok(true)
        );
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().is_wide());
        assert!(!"10.0.0.0/8".parse::<Cidr>().unwrap().is_wide());
        assert!("2000::/3".parse::<Cidr>().unwrap().is_wide());
        assert!(!"2001:db8::/32".parse::<Cidr>().unwrap().is_wide());
        assert!("bogus".parse::<Cidr>().is_err());
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_claims() {
        let id = identity(&["10.0.0.0/8"]);
        let xff: [&[u8]; 1] = [b"1.1.1.1"];
        assert_eq!(
            id.client(ip("203.0.113.9"), xff.into_iter()),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn the_rightmost_untrusted_hop_is_the_client() {
        let id = identity(&["10.0.0.0/8"]);
        // The client forged 6.6.6.6; our balancer 10.0.0.2 appended what it saw.
        let xff: [&[u8]; 2] = [b"6.6.6.6, 198.51.100.7", b"10.0.0.2"];
        assert_eq!(
            id.client(ip("10.0.0.1"), xff.into_iter()),
            ip("198.51.100.7")
        );
        // All trusted: the left-most trusted address is as far as we can see.
        let xff: [&[u8]; 1] = [b"10.9.9.9"];
        assert_eq!(id.client(ip("10.0.0.1"), xff.into_iter()), ip("10.9.9.9"));
        // Garbage stops the walk at the last good hop.
        let xff: [&[u8]; 1] = [b"1.2.3.4, not-an-ip, 10.0.0.3"];
        assert_eq!(id.client(ip("10.0.0.1"), xff.into_iter()), ip("10.0.0.3"));
    }

    #[test]
    fn ipv6_clients_group_by_prefix() {
        let id = ClientIdentity {
            trusted_proxies: vec![],
            ipv6_prefix: 64,
        };
        let none = std::iter::empty();
        assert_eq!(
            id.client(ip("2001:db8:1:2:aaaa::1"), none),
            ip("2001:db8:1:2::")
        );
        assert_eq!(
            id.client(ip("192.0.2.1"), std::iter::empty()),
            ip("192.0.2.1")
        );
    }
}
