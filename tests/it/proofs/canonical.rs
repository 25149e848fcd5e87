//! Paths put in canonical form (`canonical::normalize_path`): on random paths built from segments,
//! dots, slashes and escapes, the canonical form is a fixed point and never holds an empty or dot
//! segment; and every spelling that RFC 3986 (§6.2.2: escapes of unreserved characters, the case
//! of escapes, dot segments) or slash merging makes the same resource lands on the same route and
//! in the same bucket as the canonical path itself.

use super::check;
use proptest::prelude::*;
use proptest::sample::select;
use ratelimit_proxy::canonical::{normalize_path, EscapedSlashes};
use ratelimit_proxy::config::Config;
use ratelimit_proxy::key::{Identity, KeyPlan};
use ratelimit_proxy::route::RouteTable;

/// One character of a canonical segment, and how an equivalent spelling may write it.
#[derive(Debug, Clone)]
enum Token {
    /// Unreserved: raw in the canonical form, and may be escaped.
    Unreserved(char),
    /// A sub-delim or `:`/`@`: raw, and must stay raw (its escape means something else).
    Reserved(char),
    /// An escape that stays escaped: its hex digits may be in either case.
    Escape(u8),
}

#[derive(Debug, Clone)]
struct Spelling {
    segments: Vec<(Vec<Token>, Detour)>,
    trailing_slash: bool,
    /// Per token: escape an unreserved one, lowercase an escape's hex.
    flips: Vec<bool>,
}

/// What an equivalent spelling puts before a segment.
#[derive(Debug, Clone)]
enum Detour {
    None,
    /// `//`: a repeated slash.
    Slashes(usize),
    /// `./`
    Dot,
    /// `zz/../`: a segment and its undoing.
    Climb,
}

fn token() -> impl Strategy<Value = Token> {
    prop_oneof![
        6 => select("abcxyzABZ019-._~".chars().collect::<Vec<_>>()).prop_map(Token::Unreserved),
        2 => select("!$&'()*+,;=:@".chars().collect::<Vec<_>>()).prop_map(Token::Reserved),
        2 => select(vec![0x20u8, 0x22, 0x25, 0x3f, 0x23, 0xc3, 0xa9, 0x7b]).prop_map(Token::Escape),
    ]
}

fn detour() -> impl Strategy<Value = Detour> {
    prop_oneof![
        4 => Just(Detour::None),
        1 => (1usize..4).prop_map(Detour::Slashes),
        1 => Just(Detour::Dot),
        1 => Just(Detour::Climb),
    ]
}

fn spelling() -> impl Strategy<Value = Spelling> {
    (
        prop::collection::vec((prop::collection::vec(token(), 1..5), detour()), 1..6),
        any::<bool>(),
        prop::collection::vec(any::<bool>(), 32),
    )
        .prop_filter(
            "a segment of dots alone is a dot segment",
            |(segments, _, _)| {
                segments
                    .iter()
                    .all(|(tokens, _)| !tokens.iter().all(|t| matches!(t, Token::Unreserved('.'))))
            },
        )
        .prop_map(|(segments, trailing_slash, flips)| Spelling {
            segments,
            trailing_slash,
            flips,
        })
}

impl Spelling {
    /// The canonical form, written directly.
    fn canonical(&self) -> String {
        let mut out = String::new();
        for (tokens, _) in &self.segments {
            out.push('/');
            for t in tokens {
                match t {
                    Token::Unreserved(c) | Token::Reserved(c) => out.push(*c),
                    Token::Escape(b) => out.push_str(&format!("%{b:02X}")),
                }
            }
        }
        if self.trailing_slash {
            out.push('/');
        }
        out
    }

    /// The same resource, spelled with detours and escapes.
    fn spelled(&self) -> String {
        let mut flips = self.flips.iter().cycle();
        let mut out = String::new();
        for (tokens, detour) in &self.segments {
            match detour {
                Detour::None => {}
                Detour::Slashes(n) => out.push_str(&"/".repeat(*n)),
                Detour::Dot => out.push_str("/."),
                Detour::Climb => out.push_str("/zz/.."),
            }
            out.push('/');
            for t in tokens {
                let flip = *flips.next().unwrap();
                match t {
                    Token::Unreserved(c) if flip => out.push_str(&format!("%{:02x}", *c as u8)),
                    Token::Unreserved(c) | Token::Reserved(c) => out.push(*c),
                    Token::Escape(b) if flip => out.push_str(&format!("%{b:02x}")),
                    Token::Escape(b) => out.push_str(&format!("%{b:02X}")),
                }
            }
        }
        if self.trailing_slash {
            out.push('/');
        }
        out
    }
}

fn canonical(path: &str) -> Option<String> {
    normalize_path(path.as_bytes(), EscapedSlashes::Reject)
        .ok()
        .map(|c| c.into_owned())
}

/// What a route table and a path-keyed limit make of a canonical path.
struct Routing {
    table: RouteTable,
    keys: KeyPlan,
}

impl Routing {
    fn new() -> Routing {
        let yaml = "listen: \"127.0.0.1:1\"\nroutes:\n  - { name: a, match: { path_prefix: \"/a\" }, upstream: \"h:1\", limits: [{ name: p, capacity: 1, refill: 1/s, key: path }] }\n  - { name: x, match: { path_prefix: \"/x/\" }, upstream: \"h:1\" }\n  - { name: rest, upstream: \"h:1\" }\n";
        let config = Config::parse("t.yaml", yaml).unwrap();
        Routing {
            table: RouteTable::new(&config.routes),
            keys: KeyPlan::new("rl", &config.routes[0]),
        }
    }

    fn route_and_bucket(&self, path: &str) -> (Option<usize>, String) {
        (
            self.table.find(None, "GET", path),
            self.keys.key(0, &[Identity::Value(path.as_bytes())]),
        )
    }
}

#[test]
fn every_spelling_of_a_path_meets_its_canonical_form() {
    let routing = Routing::new();
    check(file!(), 2_000, spelling(), |s| {
        let want = s.canonical();
        prop_assert_eq!(canonical(&want), Some(want.clone()), "a fixed point");
        let spelled = s.spelled();
        let got = canonical(&spelled);
        prop_assert_eq!(
            got.as_deref(),
            Some(want.as_str()),
            "{} is {}",
            spelled,
            want
        );
        prop_assert_eq!(
            routing.route_and_bucket(got.as_deref().unwrap_or_default()),
            routing.route_and_bucket(&want)
        );
        Ok(())
    });
}

#[test]
fn any_path_that_has_a_canonical_form_is_canonical_once_and_for_all() {
    let piece = select(vec![
        "/", "/", ".", "..", "a", "b", "%2e", "%2E", "%41", "%7e", "%7E", "%zz", "%", "%2f", "%5c",
        "%00", "\\", "~", ":", "%20", "%c3%a9",
    ]);
    check(
        file!(),
        5_000,
        prop::collection::vec(piece, 0..12),
        |pieces| {
            let path = format!("/{}", pieces.concat());
            if let Some(c) = canonical(&path) {
                prop_assert_eq!(canonical(&c), Some(c.clone()), "{} is idempotent", path);
                for bad in ["//", "/./", "/../"] {
                    prop_assert!(!c.contains(bad), "{} gave {}", path, c);
                }
                prop_assert!(
                    !c.ends_with("/.") && !c.ends_with("/.."),
                    "{} gave {}",
                    path,
                    c
                );
                prop_assert!(c.starts_with('/'));
            }
            Ok(())
        },
    );
}
