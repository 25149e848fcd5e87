//! One limit: its bucket (or quota), and what identifies a client.

use super::{at, Validator};
use crate::config::locate::Seg;
use crate::config::raw::{OneOrMany, RawLimit, RawQuota};
use crate::config::*;

/// The longest a concurrency lease may be held without its request ending.
const MAX_LEASE_MS: u64 = 86_400_000;

impl Validator<'_> {
    pub(super) fn limit(
        &mut self,
        r: Option<&str>,
        base: &[Seg],
        mut raw: RawLimit,
    ) -> Option<Limit> {
        let before = self.problems.len();
        let name = self.name(r, base, raw.name.take());
        let allowance = match (raw.quota.take(), raw.concurrency) {
            (Some(_), Some(_)) => {
                self.problem(
                    r,
                    at(base, &["concurrency"]),
                    "cannot be combined with `quota` in one limit: make each a limit of its own",
                );
                None
            }
            (Some(quota), None) => self.quota(r, base, &raw.capacity, &raw.refill, quota),
            (None, Some(max)) => self.concurrency(r, base, &raw, max),
            (None, None) => self.bucket(r, base, raw.capacity, raw.refill.as_deref()),
        };
        if raw.lease_ms.is_some() && raw.concurrency.is_none() {
            self.problem(
                r,
                at(base, &["lease_ms"]),
                "belongs to a `concurrency` limit: only a request in flight holds a lease",
            );
        }
        let key = self.key(r, base, raw.key.take());
        let on_missing_key = self
            .word(
                r,
                at(base, &["on_missing_key"]),
                raw.on_missing_key.as_deref(),
            )
            .unwrap_or(MissingKey::Shared);
        let on_duplicate_key_header = self
            .word(
                r,
                at(base, &["on_duplicate_key_header"]),
                raw.on_duplicate_key_header.as_deref(),
            )
            .unwrap_or_default();
        let cost = raw.cost.unwrap_or(1);
        if let (Some(Allowance::Concurrency { .. }), Some(c)) = (allowance, raw.cost) {
            if c != 1 {
                self.problem(
                    r,
                    at(base, &["cost"]),
                    format!("a request holds one lease of a `concurrency` limit, got {c}"),
                );
            }
        } else if let Some(allowance) = allowance {
            let cap = allowance.capacity();
            let what = match allowance {
                Allowance::Bucket { .. } => "the capacity",
                Allowance::Quota { .. } => "the quota's amount",
                Allowance::Concurrency { .. } => "the concurrency",
            };
            if cost == 0 || cost > cap {
                self.problem(
                    r,
                    at(base, &["cost"]),
                    format!("must be between 1 and {what} ({cap}), got {cost}"),
                );
            }
        }
        let charge = self.charge(r, base, &raw, allowance);
        let reserve = self.reserve(r, base, &raw, allowance, cost, charge.is_some());
        (self.problems.len() == before).then(|| Limit {
            name,
            allowance: allowance.expect("no problem means an allowance"),
            key,
            on_missing_key,
            on_duplicate_key_header,
            shadow: raw.shadow.unwrap_or(false),
            cost,
            charge,
            reserve,
        })
    }

    /// `charge_from_response` and `refund_unused`.
    fn charge(
        &mut self,
        r: Option<&str>,
        base: &[Seg],
        raw: &RawLimit,
        allowance: Option<Allowance>,
    ) -> Option<Charge> {
        let Some(given) = &raw.charge_from_response else {
            if raw.refund_unused.is_some() {
                self.problem(
                    r,
                    at(base, &["refund_unused"]),
                    "belongs to a limit with `charge_from_response`",
                );
            }
            return None;
        };
        if matches!(allowance, Some(Allowance::Concurrency { .. })) {
            self.problem(
                r,
                at(base, &["charge_from_response"]),
                "a `concurrency` limit counts requests in flight, not what they use",
            );
            return None;
        }
        let (terms, field) = match charge_terms(given) {
            Some(Ok(one)) => (vec![one], vec!["charge_from_response"]),
            Some(Err(sum)) => (sum, vec!["charge_from_response", "sum"]),
            None => {
                self.problem(
                    r,
                    at(base, &["charge_from_response"]),
                    "expected a source such as \"json:usage.total_tokens\", or { sum: [sources] }",
                );
                return None;
            }
        };
        match Charge::parse(&terms, raw.refund_unused.unwrap_or(false)) {
            Ok(charge) => Some(charge),
            Err(msg) => {
                self.problem(r, at(base, &field), msg);
                None
            }
        }
    }

    /// `reserve`, `reserve_default` and `reserve_max`: what a request reserves from its body.
    fn reserve(
        &mut self,
        r: Option<&str>,
        base: &[Seg],
        raw: &RawLimit,
        allowance: Option<Allowance>,
        cost: u64,
        charged: bool,
    ) -> Option<Reserve> {
        let Some(given) = &raw.reserve else {
            for (field, given) in [
                ("reserve_default", raw.reserve_default.is_some()),
                ("reserve_max", raw.reserve_max.is_some()),
            ] {
                if given {
                    self.problem(r, at(base, &[field]), "belongs to a limit with `reserve`");
                }
            }
            return None;
        };
        if !charged {
            self.problem(
                r,
                at(base, &["reserve"]),
                "a reservation is settled by the usage the response reports: give the limit a \
                 `charge_from_response`",
            );
            return None;
        }
        let listed = match given {
            OneOrMany::One(one) => vec![(one, at(base, &["reserve"]))],
            OneOrMany::Many(many) => many
                .iter()
                .enumerate()
                .map(|(i, p)| (p, [at(base, &["reserve"]), vec![Seg::Index(i)]].concat()))
                .collect(),
        };
        if listed.is_empty() {
            self.problem(
                r,
                at(base, &["reserve"]),
                "must name at least one JSON path",
            );
        }
        let mut paths = Vec::new();
        for (text, path) in listed {
            match Reserve::path(text) {
                Ok(p) => paths.push(p),
                Err(msg) => self.problem(r, path, msg),
            }
        }
        let capacity = allowance?.capacity();
        let most = capacity.saturating_sub(cost);
        let max = raw.reserve_max.unwrap_or(most);
        if max > most {
            self.problem(
                r,
                at(base, &["reserve_max"]),
                format!(
                    "a request reserving {max} beside its cost {cost} could never be admitted \
                     (capacity {capacity}): at most {most}"
                ),
            );
            return None;
        }
        // A request that names no cap may use the most: it reserves the most unless told.
        let default = raw.reserve_default.unwrap_or(max);
        if default > max {
            self.problem(
                r,
                at(base, &["reserve_default"]),
                format!("must be at most reserve_max ({max}), got {default}"),
            );
            return None;
        }
        Some(Reserve {
            paths,
            default,
            max,
        })
    }

    /// A token bucket's `capacity` and `refill`.
    fn bucket(
        &mut self,
        r: Option<&str>,
        base: &[Seg],
        capacity: Option<u64>,
        refill: Option<&str>,
    ) -> Option<Allowance> {
        let capacity = match capacity {
            None => {
                self.problem(
                    r,
                    at(base, &["capacity"]),
                    "is required: the bucket size (burst), an integer >= 1 (or give the limit a `quota`)",
                );
                None
            }
            Some(0) => {
                self.problem(r, at(base, &["capacity"]), "must be an integer >= 1, got 0");
                None
            }
            Some(c) => Some(c),
        };
        let refill = match refill {
            None => {
                self.problem(
                    r,
                    at(base, &["refill"]),
                    "is required: the sustained rate, e.g. \"10/s\"",
                );
                None
            }
            Some(text) => match Rate::parse(text) {
                Ok(rate) => Some(rate),
                Err(msg) => {
                    self.problem(r, at(base, &["refill"]), msg);
                    None
                }
            },
        };
        let (capacity, refill) = (capacity?, refill?);
        let units = u128::from(capacity) * u128::from(refill.scale()) + u128::from(refill.num());
        if units > u128::from(EXACT_LIMIT) {
            self.problem(r, at(base, &["capacity"]), format!(
                "capacity {capacity} at refill {refill} needs more precision than the store's numbers hold exactly \
                 ({capacity} × {} units > 2^53); lower the capacity or use a faster rate", refill.scale()
            ));
            return None;
        }
        Some(Allowance::Bucket { capacity, refill })
    }

    /// A calendar quota: `{ amount, period }`, alone (a quota does not refill, so a bucket's
    /// numbers beside it would say two things at once).
    fn quota(
        &mut self,
        r: Option<&str>,
        base: &[Seg],
        capacity: &Option<u64>,
        refill: &Option<String>,
        raw: RawQuota,
    ) -> Option<Allowance> {
        for (field, given) in [
            ("capacity", capacity.is_some()),
            ("refill", refill.is_some()),
        ] {
            if given {
                self.problem(
                    r,
                    at(base, &[field]),
                    "cannot be combined with `quota` in one limit: a quota is whole again at each \
                     period's boundary and does not refill; make it a limit of its own",
                );
            }
        }
        let amount = match raw.amount {
            None | Some(0) => {
                self.problem(
                    r,
                    at(base, &["quota", "amount"]),
                    "is required: how much one key may use per period, an integer >= 1",
                );
                None
            }
            Some(a) if a > EXACT_LIMIT => {
                self.problem(
                    r,
                    at(base, &["quota", "amount"]),
                    format!("must be at most 2^53 (the store's exact numbers), got {a}"),
                );
                None
            }
            Some(a) => Some(a),
        };
        let period = match raw.period.as_deref() {
            None => {
                let words: Vec<&str> = Period::words().collect();
                self.problem(
                    r,
                    at(base, &["quota", "period"]),
                    format!("is required: {}", crate::words::choices(&words)),
                );
                None
            }
            Some(text) => self.word(r, at(base, &["quota", "period"]), Some(text)),
        };
        if capacity.is_some() || refill.is_some() {
            return None;
        }
        Some(Allowance::Quota {
            amount: amount?,
            period: period?,
        })
    }

    /// A concurrency limit: `concurrency: N`, alone (a lease is held, not refilled).
    fn concurrency(
        &mut self,
        r: Option<&str>,
        base: &[Seg],
        raw: &RawLimit,
        max: u64,
    ) -> Option<Allowance> {
        let mut ok = true;
        for (field, given) in [
            ("capacity", raw.capacity.is_some()),
            ("refill", raw.refill.is_some()),
        ] {
            if given {
                self.problem(
                    r,
                    at(base, &[field]),
                    "cannot be combined with `concurrency` in one limit: a request holds a lease \
                     while in flight, nothing refills; make the bucket a limit of its own",
                );
                ok = false;
            }
        }
        if max == 0 || max > EXACT_LIMIT {
            self.problem(
                r,
                at(base, &["concurrency"]),
                format!("must be an integer between 1 and 2^53, got {max}"),
            );
            ok = false;
        }
        if let Some(ms) = raw.lease_ms.filter(|ms| !(1..=MAX_LEASE_MS).contains(ms)) {
            self.problem(
                r,
                at(base, &["lease_ms"]),
                format!(
                    "must be between 1 and {MAX_LEASE_MS} (a day): how long a lease that a dead \
                     proxy never released is held, got {ms}"
                ),
            );
            ok = false;
        }
        ok.then_some(Allowance::Concurrency {
            max,
            lease_ms: raw.lease_ms,
        })
    }

    /// One key part or a list of them (a composite key); `route` stands alone.
    fn key(&mut self, r: Option<&str>, base: &[Seg], raw: Option<OneOrMany>) -> Vec<KeySource> {
        let (parts, listed) = match raw {
            None => return vec![KeySource::ClientIp],
            Some(OneOrMany::One(one)) => (vec![one], false),
            Some(OneOrMany::Many(many)) => (many, true),
        };
        let path = |i: usize| match listed {
            true => [at(base, &["key"]), vec![Seg::Index(i)]].concat(),
            false => at(base, &["key"]),
        };
        if parts.is_empty() {
            self.problem(r, at(base, &["key"]), "must name at least one key part");
        }
        let key: Vec<KeySource> = parts
            .iter()
            .enumerate()
            .filter_map(|(i, part)| {
                let source = part.parse::<KeySource>();
                if let Err(message) = &source {
                    self.problem(r, path(i), message.clone());
                }
                source.ok()
            })
            .collect();
        if key.len() > 1 && key.contains(&KeySource::Route) {
            self.problem(
                r,
                at(base, &["key"]),
                "`route` is one bucket for every client: it cannot be combined",
            );
        }
        key
    }
}

/// `charge_from_response` as written: one source (`Ok`), the sources of `{ sum: [...] }` (`Err`),
/// or neither.
fn charge_terms(given: &serde_yaml::Value) -> Option<Result<String, Vec<String>>> {
    use serde_yaml::Value;
    match given {
        Value::String(one) => Some(Ok(one.clone())),
        Value::Mapping(m) if m.len() == 1 => match m.get("sum")? {
            Value::Sequence(terms) => terms
                .iter()
                .map(|t| t.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(Err),
            _ => None,
        },
        _ => None,
    }
}
