//! What a limit charged by usage reads: where the response reports what a request used
//! (`charge_from_response`, one source or a weighted sum), and what the request reserves from its
//! own body up front (`reserve`).

use std::fmt;

/// A limit charged from the response (`charge_from_response`, `refund_unused`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// What the response reports, summed: each term taken once, times its weight.
    pub terms: Vec<Term>,
    /// Give back what the response used below the up-front cost.
    pub refund_unused: bool,
}

impl Charge {
    /// Whether every term is known once the response head is (headers only): then the charge is
    /// settled before the head goes out, and its headers tell the balance after it.
    pub fn at_head(&self) -> bool {
        self.terms
            .iter()
            .all(|t| matches!(t.from, UsageSource::Header(_)))
    }

    /// Whether a term reads `kind` of source.
    pub fn reads(&self, kind: impl Fn(&UsageSource) -> bool) -> bool {
        self.terms.iter().any(|t| kind(&t.from))
    }

    /// Parses one term, or the terms of `{ sum: [...] }`.
    pub fn parse(terms: &[String], refund_unused: bool) -> Result<Charge, String> {
        if terms.is_empty() {
            return Err("`sum` must list at least one source".into());
        }
        let terms = terms
            .iter()
            .map(|t| Term::parse(t))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Charge {
            terms,
            refund_unused,
        })
    }
}

impl fmt::Display for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(" + ")?;
            }
            write!(f, "{t}")?;
        }
        Ok(())
    }
}

/// One source of a charge and what each unit it reports counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub from: UsageSource,
    pub weight: u64,
}

impl Term {
    /// `<source>` or `<source> * <whole weight>`.
    pub fn parse(text: &str) -> Result<Term, String> {
        let (source, weight) = match text.split_once('*') {
            None => (text, 1),
            Some((source, weight)) => match weight.trim().parse::<u64>() {
                Ok(w) if (1..=1_000_000).contains(&w) => (source, w),
                _ => {
                    return Err(format!(
                        "{text:?}: a weight is a whole number from 1 to 1000000, e.g. \"json:usage.output_tokens * 4\""
                    ))
                }
            },
        };
        Ok(Term {
            from: UsageSource::parse(source.trim())?,
            weight,
        })
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.weight {
            1 => write!(f, "{}", self.from),
            w => write!(f, "{} * {w}", self.from),
        }
    }
}

/// Where a response reports its usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageSource {
    /// A response header, by lower-case name.
    Header(String),
    /// A trailer (HTTP/2, gRPC), by lower-case name.
    Trailer(String),
    /// A number in an `application/json` body, by its path of object keys.
    Json(Vec<String>),
    /// A number in the JSON `data:` events of a `text/event-stream` body: the largest one seen.
    Sse(Vec<String>),
}

impl UsageSource {
    /// Parses `header:<name>`, `trailer:<name>`, `json:<a.b.c>` or `sse:<a.b.c>`.
    pub fn parse(text: &str) -> Result<UsageSource, String> {
        let expected = "expected \"header:<name>\", \"trailer:<name>\", \"json:<path.to.number>\" \
                        or \"sse:<path.to.number>\"";
        let (kind, rest) = text
            .split_once(':')
            .ok_or_else(|| format!("{text:?}: {expected}"))?;
        let name_ok = !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
        match kind {
            "header" | "trailer" if !name_ok => Err(format!(
                "{text:?}: a header name is letters, digits, '-' and '_'"
            )),
            "header" => Ok(UsageSource::Header(rest.to_ascii_lowercase())),
            "trailer" => Ok(UsageSource::Trailer(rest.to_ascii_lowercase())),
            "json" => Ok(UsageSource::Json(json_path(text, rest)?)),
            "sse" => Ok(UsageSource::Sse(json_path(text, rest)?)),
            _ => Err(format!("{text:?}: {expected}")),
        }
    }
}

/// Object keys joined by `.`.
pub(super) fn json_path(text: &str, rest: &str) -> Result<Vec<String>, String> {
    let path: Vec<String> = rest.split('.').map(str::to_string).collect();
    if path.iter().any(String::is_empty) {
        return Err(format!(
            "{text:?}: a JSON path is keys joined by '.', e.g. json:usage.total_tokens"
        ));
    }
    Ok(path)
}

impl fmt::Display for UsageSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UsageSource::Header(name) => write!(f, "header:{name}"),
            UsageSource::Trailer(name) => write!(f, "trailer:{name}"),
            UsageSource::Json(path) => write!(f, "json:{}", path.join(".")),
            UsageSource::Sse(path) => write!(f, "sse:{}", path.join(".")),
        }
    }
}

/// What a request reserves up front from a number in its own JSON body (`reserve`: the most
/// its answer may use, such as `max_tokens`), beside the limit's `cost`. The usage the response
/// reports settles it; a request whose usage never arrives keeps it charged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserve {
    /// Paths of the request body; the first that holds a number is the reservation.
    pub paths: Vec<Vec<String>>,
    /// When no path holds a number (or the body is not JSON).
    pub default: u64,
    /// A larger number reserves this much.
    pub max: u64,
}

impl Reserve {
    /// Parses one `json:<path>`.
    pub fn path(text: &str) -> Result<Vec<String>, String> {
        match text.split_once(':') {
            Some(("json", rest)) => json_path(text, rest),
            _ => Err(format!(
                "{text:?}: a reservation is a number of the request's JSON body, e.g. \"json:max_tokens\""
            )),
        }
    }

    /// The reservation of a request whose body path `i` held `found` (the first found wins).
    pub fn amount(&self, found: Option<u64>) -> u64 {
        found.map_or(self.default, |n| n.min(self.max))
    }
}

impl fmt::Display for Reserve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let paths: Vec<String> = self
            .paths
            .iter()
            .map(|p| format!("json:{}", p.join(".")))
            .collect();
        write!(
            f,
            "{} (at most {}; {} when absent)",
            paths.join(" or "),
            self.max,
            self.default
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_are_a_source_and_a_whole_weight() {
        let t = Term::parse("json:usage.output_tokens * 4").unwrap();
        assert_eq!(
            t.from,
            UsageSource::Json(vec!["usage".into(), "output_tokens".into()])
        );
        assert_eq!(t.weight, 4);
        assert_eq!(t.to_string(), "json:usage.output_tokens * 4");
        assert_eq!(Term::parse("sse:usage.total_tokens").unwrap().weight, 1);
        for bad in [
            "json:a * 0",
            "json:a * 1.5",
            "json:a * x",
            "json:a *",
            "sse:",
            "sse:a..b",
        ] {
            assert!(Term::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_charge_is_settled_at_the_head_only_when_every_term_is_a_header() {
        let head = Charge::parse(&["header:x-a".into(), "header:x-b * 2".into()], false).unwrap();
        assert!(head.at_head());
        let mixed = Charge::parse(&["header:x-a".into(), "json:u".into()], false).unwrap();
        assert!(!mixed.at_head());
        assert_eq!(mixed.to_string(), "header:x-a + json:u");
    }

    #[test]
    fn a_reservation_is_the_number_found_capped_or_the_default() {
        let r = Reserve {
            paths: vec![Reserve::path("json:max_tokens").unwrap()],
            default: 100,
            max: 500,
        };
        assert_eq!(r.amount(Some(50)), 50);
        assert_eq!(r.amount(Some(5_000)), 500);
        assert_eq!(r.amount(None), 100);
        assert!(Reserve::path("header:x").is_err());
    }
}
