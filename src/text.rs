//! Numbers and addresses as text, both ways, without the formatting machinery: the request path
//! writes a client address and a few numbers on every request (`X-Forwarded-For`, keys, the
//! `RateLimit` field, a refusal's body) and reads decimal numbers from clients and from Redis.

use std::net::IpAddr;

/// Appends `n` in decimal.
pub fn decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(decimal_str(n, &mut [0; 20]).as_bytes());
}

/// `n` in decimal, written into `buf`.
pub fn decimal_str(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&buf[at..]).unwrap_or("0")
}

/// A decimal number: ASCII digits only, no sign, not empty, at most 19 digits (so no overflow).
pub fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0, |n, &d| n * 10 + u64::from(d - b'0')))
}

/// Appends `ip` as `Display` writes it; IPv4 by hand.
pub fn ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(ip) => {
            for (i, octet) in ip.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                decimal(out, octet.into());
            }
        }
        IpAddr::V6(ip) => {
            use std::io::Write;
            let _ = write!(out, "{ip}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_is_written_as_display_writes_it() {
        for addr in [
            "0.0.0.0",
            "10.0.255.7",
            "255.255.255.255",
            "::1",
            "2001:db8::ff00:42:8329",
        ] {
            let addr: IpAddr = addr.parse().unwrap();
            let mut out = Vec::new();
            ip(&mut out, addr);
            assert_eq!(out, addr.to_string().into_bytes());
        }
    }

    #[test]
    fn decimal_writes_and_digits_reads_every_width() {
        for n in [0, 7, 10, 99, 12345, 999_999_999_999_999_999, u64::MAX] {
            let mut out = b"x".to_vec();
            decimal(&mut out, n);
            assert_eq!(out, format!("x{n}").into_bytes());
            if n < 10_000_000_000_000_000_000 {
                assert_eq!(digits(&out[1..]), Some(n));
            }
        }
        for bad in [&b""[..], b"-1", b"+1", b"1 ", b"12345678901234567890"] {
            assert_eq!(digits(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
