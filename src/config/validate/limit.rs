//! One limit: its bucket, its rate, and what identifies a client.

use super::{at, Validator};
use crate::config::locate::Seg;
use crate::config::raw::{OneOrMany, RawLimit};
use crate::config::*;

impl Validator<'_> {
    pub(super) fn limit(&mut self, r: Option<&str>, base: &[Seg], raw: RawLimit) -> Option<Limit> {
        let before = self.problems.len();
        let name = self.name(r, base, raw.name);
        let capacity = match raw.capacity {
            None => {
                self.problem(
                    r,
                    at(base, &["capacity"]),
                    "is required: the bucket size (burst), an integer >= 1",
                );
                None
            }
            Some(0) => {
                self.problem(r, at(base, &["capacity"]), "must be an integer >= 1, got 0");
                None
            }
            Some(c) => Some(c),
        };
        let refill = match raw.refill.as_deref() {
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
        let key = self.key(r, base, raw.key);
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
        if let Some(cap) = capacity {
            if cost == 0 || cost > cap {
                self.problem(
                    r,
                    at(base, &["cost"]),
                    format!("must be between 1 and the capacity ({cap}), got {cost}"),
                );
            }
        }
        if let (Some(cap), Some(rate)) = (capacity, refill) {
            let units = u128::from(cap) * u128::from(rate.scale()) + u128::from(rate.num());
            if units > u128::from(EXACT_LIMIT) {
                self.problem(r, at(base, &["capacity"]), format!(
                    "capacity {cap} at refill {rate} needs more precision than the store's numbers hold exactly \
                     ({cap} × {} units > 2^53); lower the capacity or use a faster rate", rate.scale()
                ));
            }
        }
        (self.problems.len() == before).then(|| Limit {
            name,
            capacity: capacity.unwrap_or(1),
            refill: refill.expect("no problem means a rate"),
            key,
            on_missing_key,
            on_duplicate_key_header,
            shadow: raw.shadow.unwrap_or(false),
            cost,
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
