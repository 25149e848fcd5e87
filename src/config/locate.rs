//! Finds the line of a node in the YAML text, given its path (`routes[2].limits[0].capacity`).
//!
//! serde_yaml drops source positions once a document is parsed, but it attaches the position of the
//! node being read to any error raised while reading it. So we walk the text again along the path and
//! fail on purpose at the target: the error then says where the target is. One parser, every YAML
//! style (block, flow, anchors), and no second YAML crate.

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// One step of a path into the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// Renders a path the way a user reads it: `routes[0].limits[1].capacity`.
pub fn render(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

const FOUND: &str = "\u{0}located";

/// The 1-based line of the node at `path`; for a field that is missing, the line of the nearest
/// node that holds it (a missing `upstream` points at its route). `None` when nothing matches.
pub fn line_of(text: &str, path: &[Seg]) -> Option<usize> {
    (1..=path.len())
        .rev()
        .find_map(|n| exact_line(text, &path[..n]))
}

fn exact_line(text: &str, path: &[Seg]) -> Option<usize> {
    let de = serde_yaml::Deserializer::from_str(text);
    match Seek(path).deserialize(de) {
        Err(e) if e.to_string().contains(FOUND) => e.location().map(|l| l.line()),
        _ => None,
    }
}

struct Seek<'p>(&'p [Seg]);

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        match self.0 {
            // Found's visitor rejects every node, so the error carries this node's position.
            [] => d.deserialize_any(Found),
            _ => d.deserialize_any(Walk(self.0)),
        }
    }
}

struct Found;

impl Visitor<'_> for Found {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(FOUND)
    }
}

struct Walk<'p>(&'p [Seg]);

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map or a list on the path")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((Seg::Key(want), rest)) = self.0.split_first() else {
            return Ok(());
        };
        while let Some(key) = map.next_key::<serde_yaml::Value>()? {
            if key.as_str() == Some(want.as_str()) {
                return map.next_value_seed(Seek(rest));
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some((Seg::Index(want), rest)) = self.0.split_first() else {
            return Ok(());
        };
        for _ in 0..*want {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
        }
        seq.next_element_seed(Seek(rest)).map(|_| ())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
listen: \"0.0.0.0:8080\"
routes:
  - name: a
    limits:
      - name: l
        capacity: 0
  - { name: b, limits: [{ name: x, capacity: 5 }] }
";

    fn key(k: &str) -> Seg {
        Seg::Key(k.into())
    }

    #[test]
    fn finds_block_and_flow_nodes() {
        assert_eq!(line_of(DOC, &[key("listen")]), Some(1));
        let cap = [
            key("routes"),
            Seg::Index(0),
            key("limits"),
            Seg::Index(0),
            key("capacity"),
        ];
        assert_eq!(line_of(DOC, &cap), Some(6));
        assert_eq!(
            line_of(DOC, &[key("routes"), Seg::Index(1), key("name")]),
            Some(7)
        );
        assert_eq!(render(&cap), "routes[0].limits[0].capacity");
    }

    #[test]
    fn missing_paths_have_no_line() {
        assert_eq!(line_of(DOC, &[key("nope")]), None);
        assert_eq!(
            line_of(DOC, &[key("routes"), Seg::Index(0), key("upstream")]),
            Some(3)
        );
        assert_eq!(line_of("{unclosed", &[key("a")]), None);
    }
}
