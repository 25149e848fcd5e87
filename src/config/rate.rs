//! Refill rates: `"<number>/<s|m|h|d>"` parsed into an exact rational, so that the bucket
//! arithmetic (Lua and in-memory alike) works in integers and never drifts.

use std::fmt;

/// Largest integer a Lua number (an IEEE double) holds exactly.
pub const EXACT_LIMIT: u64 = 1 << 53;

/// A refill rate of `num` bucket units per microsecond, where one token is `scale` units.
///
/// `"10/s"` is 10 tokens per 1,000,000 µs = 1 token per 100,000 µs: scale 100,000, num 1.
/// The fraction is reduced, which keeps `capacity × scale` as small as the rate allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    scale: u64,
    num: u64,
    /// As written, for display: `tokens / 10^decimals` per `unit`.
    tokens: u64,
    decimals: u32,
    unit: char,
}

impl Rate {
    /// Parses `"<number>/<unit>"`; the error is a sentence for the config report.
    pub fn parse(text: &str) -> Result<Rate, String> {
        let expected =
            "expected \"<number>/<s|m|h|d>\" with a number > 0, e.g. \"10/s\" or \"0.5/m\"";
        let (number, unit) = text
            .trim()
            .split_once('/')
            .ok_or_else(|| format!("invalid rate {text:?}: {expected}"))?;
        let unit_us: u64 = match unit.trim() {
            "s" => 1_000_000,
            "m" => 60_000_000,
            "h" => 3_600_000_000,
            "d" => 86_400_000_000,
            _ => return Err(format!("invalid rate {text:?}: unit must be s, m, h or d")),
        };
        let number = number.trim();
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() && frac.is_empty() || !digits_ok(whole) || !digits_ok(frac) {
            return Err(format!("invalid rate {text:?}: {expected}"));
        }
        if frac.len() > 6 || whole.len() > 12 {
            return Err(format!(
                "invalid rate {text:?}: at most 12 digits before and 6 after the decimal point"
            ));
        }
        let tenths = 10u64.pow(frac.len() as u32);
        let tokens = format!("{whole}{frac}").parse::<u64>().unwrap_or(0);
        if tokens == 0 {
            return Err(format!("invalid rate {text:?}: the number must be > 0"));
        }
        let period_us = u128::from(unit_us) * u128::from(tenths);
        let g = gcd(u128::from(tokens), period_us);
        let scale =
            u64::try_from(period_us / g).map_err(|_| format!("invalid rate {text:?}: too slow"))?;
        let num = u64::try_from(u128::from(tokens) / g)
            .map_err(|_| format!("invalid rate {text:?}: too fast"))?;
        Ok(Rate {
            scale,
            num,
            tokens,
            decimals: frac.len() as u32,
            unit: unit.trim().chars().next().unwrap_or('s'),
        })
    }

    /// Units per token.
    pub fn scale(&self) -> u64 {
        self.scale
    }

    /// Units gained per microsecond.
    pub fn num(&self) -> u64 {
        self.num
    }

    /// Microseconds an empty bucket of `capacity` takes to fill, rounded up.
    pub fn fill_us(&self, capacity: u64) -> u64 {
        (u128::from(capacity) * u128::from(self.scale)).div_ceil(u128::from(self.num)) as u64
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tenths = 10u64.pow(self.decimals);
        let (whole, frac) = (self.tokens / tenths, self.tokens % tenths);
        if frac == 0 {
            write!(f, "{whole}/{}", self.unit)
        } else {
            let digits = format!("{frac:0width$}", width = self.decimals as usize);
            write!(f, "{whole}.{}/{}", digits.trim_end_matches('0'), self.unit)
        }
    }
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduces_to_exact_fractions() {
        let r = Rate::parse("10/s").unwrap();
        assert_eq!((r.scale(), r.num()), (100_000, 1));
        let r = Rate::parse("0.5/s").unwrap();
        assert_eq!((r.scale(), r.num()), (2_000_000, 1));
        let r = Rate::parse("3/s").unwrap();
        assert_eq!((r.scale(), r.num()), (1_000_000, 3));
        let r = Rate::parse("1000000/s").unwrap();
        assert_eq!((r.scale(), r.num()), (1, 1));
        let r = Rate::parse("1/d").unwrap();
        assert_eq!((r.scale(), r.num()), (86_400_000_000, 1));
        assert_eq!(r.fill_us(2), 172_800_000_000);
    }

    #[test]
    fn rejects_what_is_not_a_rate() {
        for bad in [
            "",
            "10",
            "10/x",
            "0/s",
            "-1/s",
            "1e3/s",
            "./s",
            "0.0000001/s",
            "abc/s",
        ] {
            assert!(Rate::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn displays_as_written() {
        assert_eq!(Rate::parse("0.5/m").unwrap().to_string(), "0.5/m");
        assert_eq!(Rate::parse("20/s").unwrap().to_string(), "20/s");
    }
}
