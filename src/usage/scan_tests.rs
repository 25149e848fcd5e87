use super::*;
use proptest::prelude::*;
use serde_json::{Number, Value};

pub(crate) fn paths(list: &[&[&str]]) -> Arc<[Vec<String>]> {
    list.iter()
        .map(|p| p.iter().map(|k| k.to_string()).collect())
        .collect()
}

/// The bound `held_bytes` must stay under: a few KiB, plus what the paths themselves need.
pub(crate) fn bound(paths: &[Vec<String>]) -> usize {
    4096 + paths.iter().flatten().map(String::len).sum::<usize>()
}

/// Scans `doc` fed in the given pieces (split at each of `cuts`); what was found at each path.
fn scan_cut(paths: &Arc<[Vec<String>]>, doc: &[u8], cuts: &[usize]) -> Vec<Option<u64>> {
    let mut scan = JsonScan::new(paths.clone());
    let mut at = 0;
    for &cut in cuts {
        let cut = cut.clamp(at, doc.len());
        scan.feed(&doc[at..cut]);
        at = cut;
    }
    scan.feed(&doc[at..]);
    scan.end();
    assert!(scan.held_bytes() < bound(paths));
    (0..paths.len()).map(|i| scan.found(i)).collect()
}

/// Scans `doc` whole and byte by byte, which must agree; what was found.
fn scan(paths: &Arc<[Vec<String>]>, doc: &str) -> Vec<Option<u64>> {
    let whole = scan_cut(paths, doc.as_bytes(), &[]);
    let bytes: Vec<usize> = (0..doc.len()).collect();
    assert_eq!(
        scan_cut(paths, doc.as_bytes(), &bytes),
        whole,
        "byte by byte: {doc}"
    );
    whole
}

/// The number `text` read as usage, through a member and as a bare document.
fn number(text: &str) -> Option<u64> {
    let member = scan(&paths(&[&["n"]]), &format!("{{\"n\":{text}}}"))[0];
    assert_eq!(scan(&paths(&[&[]]), text)[0], member, "bare {text}");
    member
}

/// The rounding rules applied to the whole text of a number, with strings: the reference.
pub(crate) fn reference_round(text: &str) -> Option<u64> {
    let (neg, t) = match text.strip_prefix('-') {
        Some(t) => (true, t),
        None => (false, text),
    };
    let (mantissa, exp) = t.split_once(['e', 'E']).unwrap_or((t, "0"));
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    if digits.bytes().all(|b| b == b'0') {
        return Some(0);
    }
    if neg {
        return None;
    }
    let (exp_neg, exp) = match exp.as_bytes()[0] {
        b'-' => (true, &exp[1..]),
        b'+' => (false, &exp[1..]),
        _ => (false, exp),
    };
    let exp = exp.trim_start_matches('0');
    let len = digits.len() as i64;
    let e = if exp.len() > 12 {
        len + 30
    } else {
        exp.parse().unwrap_or(0)
    };
    let point = (int.len() as i64 + if exp_neg { -e } else { e }).clamp(0, len + 30);
    let (whole, rest) = if point >= len {
        (digits + &"0".repeat((point - len) as usize), String::new())
    } else {
        let (w, r) = digits.split_at(point as usize);
        (w.to_string(), r.to_string())
    };
    let whole = whole.trim_start_matches('0');
    let mut v = match whole.len() {
        0 => 0,
        1..=20 => u64::try_from(whole.parse::<u128>().unwrap()).unwrap_or(u64::MAX),
        _ => u64::MAX,
    };
    if rest.bytes().any(|b| b != b'0') {
        v = v.saturating_add(1);
    }
    Some(v)
}

#[test]
fn a_number_counts_only_at_exactly_its_path() {
    let p = paths(&[&["usage", "total_tokens"], &["usage"], &["id"]]);
    let doc = r#"{"id":"x","total_tokens":9,"x":{"usage":{"total_tokens":8}},
        "choices":[{"usage":{"total_tokens":7}}],"usage":{"prompt_tokens":3,"total_tokens":53}}"#;
    assert_eq!(scan(&p, doc), [Some(53), None, None]);
    assert_eq!(scan(&p, r#"{"usage":{"total_tokens":{"a":1}}}"#), [None; 3]);
}

#[test]
fn only_a_non_negative_number_is_found() {
    let p = paths(&[&["n"]]);
    for v in [
        r#""7""#,
        "null",
        "true",
        "false",
        "{}",
        r#"{"n":1}"#,
        "[]",
        "[5]",
        "-5",
        "-0.5",
    ] {
        assert_eq!(scan(&p, &format!(r#"{{"n":{v}}}"#)), [None], "{v}");
    }
    assert_eq!(scan(&p, r#"{"n":7}"#), [Some(7)]);
}

#[test]
fn values_inside_arrays_never_match() {
    let p = paths(&[&["usage", "t"]]);
    assert_eq!(scan(&p, r#"{"usage":[{"t":5}]}"#), [None]);
    assert_eq!(scan(&p, r#"[{"usage":{"t":5}}]"#), [None]);
    assert_eq!(scan(&p, r#"{"usage":{"t":[5]}}"#), [None]);
    assert_eq!(
        scan(
            &p,
            r#"{"a":[{"usage":{"t":1}}],"usage":{"b":[1,{"t":2}],"t":3}}"#
        ),
        [Some(3)]
    );
}

#[test]
fn numbers_round_up_and_saturate() {
    let zeros = "0".repeat(10_000);
    let cases: &[(&str, Option<u64>)] = &[
        ("0", Some(0)),
        ("42", Some(42)),
        ("2.1", Some(3)),
        ("2.0", Some(2)),
        ("0.0", Some(0)),
        ("1e3", Some(1000)),
        ("1E+3", Some(1000)),
        ("1.5e1", Some(15)),
        ("2.5E-1", Some(1)),
        ("0e5", Some(0)),
        ("0.000e-99999999999999999999", Some(0)),
        ("1e-400", Some(1)),
        ("-0", Some(0)),
        ("-0.0", Some(0)),
        ("-0e7", Some(0)),
        ("-1", None),
        ("-1e-400", None),
        ("123456789012345678901234567890", Some(u64::MAX)),
        ("1e30", Some(u64::MAX)),
        ("1e20", Some(u64::MAX)),
        ("1e19", Some(10_000_000_000_000_000_000)),
        ("18446744073709551615", Some(u64::MAX)),
        ("18446744073709551614", Some(u64::MAX - 1)),
        ("18446744073709551616", Some(u64::MAX)),
        ("18446744073709551613.5", Some(u64::MAX - 1)),
        ("1844674407370955161.5e1", Some(u64::MAX)),
        (
            "12345678901234567890123e-3",
            Some(12_345_678_901_234_567_891),
        ),
        (
            "12345678901234567890000e-3",
            Some(12_345_678_901_234_567_890),
        ),
        ("123.000000000000000000000000000", Some(123)),
        ("123.0000000000000000000000000001", Some(124)),
        ("5e00000000000000000000001", Some(50)),
        ("5e100000000000000000000001", Some(u64::MAX)),
        ("5e-0000000000000000000000001", Some(1)),
        ("5e-100000000000000000000001", Some(1)),
    ];
    for &(text, want) in cases {
        assert_eq!(number(text), want, "{text}");
        assert_eq!(reference_round(text), want, "reference {text}");
    }
    let tiny = format!("0.{zeros}1");
    let huge = format!("1{zeros}");
    let fraction_of_huge = format!("1{zeros}e-10000");
    assert_eq!(number(&tiny), Some(1));
    assert_eq!(number(&huge), Some(u64::MAX));
    assert_eq!(number(&fraction_of_huge), Some(1));
    assert_eq!(number(&format!("7.{zeros}")), Some(7));
}

#[test]
fn a_malformed_number_stops_the_scan() {
    let p = paths(&[&["a"], &["b"]]);
    for bad in [
        "01", "1.", ".5", "1e", "1e+", "-", "+1", "1.e5", "--1", "-a", "1.5.2", "0x10", "2-",
        "1true",
    ] {
        assert_eq!(
            scan(&p, &format!(r#"{{"a":{bad},"b":1}}"#)),
            [None; 2],
            "{bad}"
        );
        assert_eq!(
            scan(&p, &format!(r#"{{"b":1,"a":{bad}}}"#)),
            [None, Some(1)],
            "{bad}"
        );
    }
}

#[test]
fn duplicate_keys_charge_the_largest() {
    let p = paths(&[&["usage", "t"]]);
    assert_eq!(scan(&p, r#"{"usage":{"t":5,"t":3}}"#), [Some(5)]);
    assert_eq!(
        scan(&p, r#"{"usage":{"t":3},"usage":{"t":5},"usage":{"t":4}}"#),
        [Some(5)]
    );
    assert_eq!(scan(&p, r#"{"usage":{"t":"9","t":2,"t":null}}"#), [Some(2)]);
}

#[test]
fn keys_are_compared_decoded() {
    let p = paths(&[&["usage"], &["us\"age"], &["😀"], &["a/b\n"], &["é"]]);
    let doc = r#"{"\u0075sage":1,"us\"age":2,"\ud83d\uDE00":3,"a\/b\n":4,"\u00e9":5}"#;
    assert_eq!(scan(&p, doc), [Some(1), Some(2), Some(3), Some(4), Some(5)]);
    assert_eq!(
        scan(&p, r#"{"😀":6,"é":7}"#),
        [None, None, Some(6), None, Some(7)]
    );
    // Neither a prefix, nor an extension, nor a lone surrogate, matches; none stops the scan.
    let doc = r#"{"usag":1,"usagee":2,"\ud83d":3,"\ude00":3,"\ud83dx":3,"\ud83d\n":3,"usage":9}"#;
    assert_eq!(scan(&p, doc)[0], Some(9));
    assert_eq!(scan(&paths(&[&[""]]), r#"{"x":1,"":2}"#), [Some(2)]);
    let short = paths(&[&["\t\u{8}\u{c}\r\n\\/\""]]);
    assert_eq!(scan(&short, r#"{"\t\b\f\r\n\\\/\"":8}"#), [Some(8)]);
}

#[test]
fn a_long_key_is_not_kept() {
    let p = paths(&[&["usage", "total_tokens"]]);
    let long = "u".repeat(1 << 16);
    let doc =
        format!(r#"{{"{long}":1,"usage":{{"{long}":2,"total_tokens!":4,"total_tokens":3}}}}"#);
    let mut scan = JsonScan::new(p.clone());
    let held = scan.held_bytes();
    for piece in doc.as_bytes().chunks(1) {
        scan.feed(piece);
        assert_eq!(
            scan.held_bytes(),
            held,
            "nothing grows past what `new` made"
        );
    }
    scan.end();
    assert_eq!(scan.found(0), Some(3));
}

#[test]
fn malformed_json_stops_and_keeps_what_was_found() {
    let p = paths(&[&["a"], &["b"], &["c"]]);
    assert_eq!(scan(&p, r#"{"a":1,"b":2 "c":3}"#), [Some(1), Some(2), None]);
    assert_eq!(scan(&p, r#"{"a":1,"b":"\x","c":3}"#), [Some(1), None, None]);
    assert_eq!(
        scan(&p, r#"{"a":1,"b":"\u12g4","c":3}"#),
        [Some(1), None, None]
    );
    assert_eq!(scan(&p, r#"{"a":1,"b":[2},"c":3}"#), [Some(1), None, None]);
    assert_eq!(scan(&p, r#"{"a":1,"b":tru,"c":3}"#), [Some(1), None, None]);
    assert_eq!(scan(&p, r#"{"a":1,,"c":3}"#), [Some(1), None, None]);
    assert_eq!(scan(&p, r#"{"a":1,"c":3,}"#), [Some(1), None, Some(3)]);
    assert_eq!(scan(&p, r#"{"a" 1}"#), [None; 3]);
    assert_eq!(scan(&p, r#"{"a":1"#), [Some(1), None, None]);
    // After the document only whitespace: a second document is not read.
    assert_eq!(
        scan(&p, " {\"a\":1} \r\n\t{\"b\":2}"),
        [Some(1), None, None]
    );
    assert_eq!(scan(&p, "{\"a\":1} \n"), [Some(1), None, None]);
    assert_eq!(scan(&p, "\u{feff}{\"a\":1}"), [None; 3]);
}

#[test]
fn nesting_deeper_than_the_cap_stops_the_scan() {
    let deep = |n: usize| format!("{}7{}", r#"{"a":"#.repeat(n), "}".repeat(n));
    let path = |n: usize| -> Arc<[Vec<String>]> { vec![vec!["a".to_string(); n]].into() };
    assert_eq!(
        scan_cut(&path(MAX_DEPTH), deep(MAX_DEPTH).as_bytes(), &[]),
        [Some(7)]
    );
    let too_deep = MAX_DEPTH + 1;
    assert_eq!(
        scan_cut(&path(too_deep), deep(too_deep).as_bytes(), &[]),
        [None]
    );
    let p = paths(&[&["n"], &["m"]]);
    let doc = format!(
        r#"{{"n":1,"x":{}{},"m":2}}"#,
        "[".repeat(300),
        "]".repeat(300)
    );
    assert_eq!(scan(&p, &doc), [Some(1), None]);
    let doc = format!(
        r#"{{"n":1,"x":{}{},"m":2}}"#,
        "[".repeat(255),
        "]".repeat(255)
    );
    assert_eq!(scan(&p, &doc), [Some(1), Some(2)]);
}

#[test]
fn any_value_may_be_the_document() {
    let root = paths(&[&[]]);
    assert_eq!(scan(&root, "42"), [Some(42)]);
    assert_eq!(scan(&root, " 4.2 \n"), [Some(5)]);
    for doc in [r#""42""#, "[42]", "{}", "true", "null", "", "  "] {
        assert_eq!(scan(&root, doc), [None], "{doc}");
    }
    let p = paths(&[&["a"]]);
    assert_eq!(scan(&p, r#""{\"a\":1}""#), [None]);
    assert_eq!(scan(&paths(&[]), r#"{"a":1}"#), Vec::<Option<u64>>::new());
}

#[test]
fn paths_that_share_a_prefix_are_all_followed() {
    let p = paths(&[
        &["u", "b"],
        &["u"],
        &["u", "a"],
        &["u", "a"],
        &["u", "a", "x"],
        &["v"],
    ]);
    let doc = r#"{"u":{"a":{"x":1},"b":2,"a":3},"v":4}"#;
    assert_eq!(
        scan(&p, doc),
        [Some(2), None, Some(3), Some(3), Some(1), Some(4)]
    );
}

#[test]
fn reset_forgets_and_scans_anew() {
    let p = paths(&[&["a"]]);
    let mut s = JsonScan::new(p);
    s.feed(br#"{"a":5} x"#);
    s.end();
    assert_eq!(s.found(0), Some(5));
    s.reset();
    assert_eq!(s.found(0), None);
    s.feed(br#"{"a":"#);
    s.feed(b"6}");
    s.end();
    assert_eq!((s.found(0), s.found(1)), (Some(6), None));
}

#[test]
fn a_five_mib_document_is_scanned_in_bounded_memory() {
    let p = paths(&[
        &["usage", "total_tokens"],
        &["usage", "prompt_tokens"],
        &["usage", "cost"],
        &["usage", "huge"],
    ]);
    let mut doc = String::from(r#"{"id":"x","choices":["#);
    let text = "lorem \\\"ipsum\\\" \\u00e9 ".repeat(4096);
    let mut n = 0;
    while doc.len() < 5 << 20 {
        let (open, close) = ("{\"a\":[".repeat(40), "]}".repeat(40));
        doc += &format!(r#"{{"text":"{text}","{text}":{open}1{close},"n":{n}}},"#);
        doc += &format!(r#"{{"usage":{{"total_tokens":1{}}}}},"#, "0".repeat(10_000));
        n += 1;
    }
    doc += &format!(
        r#"{{}}],"usage":{{"{}":1,"prompt_tokens":3,"#,
        "t".repeat(100_000)
    );
    let zeros = "0".repeat(10_000);
    doc +=
        &format!(r#""huge":1{zeros},"cost":0.{zeros}1,"total_tokens":53,"total_tokens":1.5e1}}}}"#);
    assert!(doc.len() > 5 << 20);
    let mut scan = JsonScan::new(p.clone());
    let (held, mut most) = (scan.held_bytes(), 0);
    for piece in doc.as_bytes().chunks(8191) {
        scan.feed(piece);
        most = most.max(scan.held_bytes());
    }
    scan.end();
    println!("5 MiB document: held_bytes at most {most}");
    assert!(most < bound(&p), "{most}");
    assert_eq!(most, held, "nothing grows past what `new` made");
    assert_eq!(
        (0..4).map(|i| scan.found(i)).collect::<Vec<_>>(),
        [Some(53), Some(3), Some(1), Some(u64::MAX)]
    );
}

/// Random keys and strings, with every character JSON may escape briefly.
const TEXT: &str = "[a-z\"\\\\/é😀\n\t\r\u{8}\u{c}]{0,6}";

/// A random document's keys come from this pool, so paths are often hit.
const KEYS: &[&str] = &[
    "usage",
    "total_tokens",
    "n",
    "",
    "us\"age",
    "😀",
    "é\\",
    "id",
];

pub(crate) fn test_paths() -> Arc<[Vec<String>]> {
    paths(&[
        &["usage", "total_tokens"],
        &["usage", "n"],
        &["n"],
        &[],
        &["usage"],
        &["us\"age", "😀", "n"],
        &["", "é\\"],
    ])
}

fn number_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..100_000).prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        (0.0..1e4f64).prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
    ]
}

/// Random documents in which the test paths are often planted with numbers.
pub(crate) fn document() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        4 => prop::sample::select(KEYS).prop_map(str::to_string),
        1 => TEXT,
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number_value(),
        TEXT.prop_map(Value::String),
    ];
    let tree = leaf.prop_recursive(4, 48, 5, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    });
    let plant = (0..test_paths().len(), number_value());
    (tree, prop::collection::vec(plant, 0..3)).prop_map(|(mut doc, plants)| {
        for (i, n) in plants {
            let mut at = &mut doc;
            for key in &test_paths()[i] {
                if !at.is_object() {
                    *at = Value::Object(Default::default());
                }
                at = at
                    .as_object_mut()
                    .unwrap()
                    .entry(key.clone())
                    .or_insert(Value::Null);
            }
            *at = n;
        }
        doc
    })
}

/// `doc` written as JSON with random whitespace and random (valid) escapes, from `seed`.
pub(crate) fn write(doc: &Value, seed: u64) -> String {
    let mut out = String::new();
    write_value(doc, &mut (seed | 1), &mut out);
    out
}

fn roll(rng: &mut u64, n: u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng % n
}

fn space(rng: &mut u64, out: &mut String) {
    for _ in 0..roll(rng, 3).saturating_sub(1) {
        out.push([' ', '\t', '\n', '\r'][roll(rng, 4) as usize]);
    }
}

fn write_str(s: &str, rng: &mut u64, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        let short = match c {
            '"' => Some('"'),
            '\\' => Some('\\'),
            '/' => Some('/'),
            '\n' => Some('n'),
            '\t' => Some('t'),
            '\r' => Some('r'),
            '\u{8}' => Some('b'),
            '\u{c}' => Some('f'),
            _ => None,
        };
        match (roll(rng, 3), short) {
            (0, Some(e)) => out.extend(['\\', e]),
            (1, _) => {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    let hex = if roll(rng, 2) == 0 {
                        format!("\\u{unit:04X}")
                    } else {
                        format!("\\u{unit:04x}")
                    };
                    out.push_str(&hex);
                }
            }
            (_, Some(_)) if c != '/' => {
                out.push_str(&serde_json::to_string(&c.to_string()).unwrap()[1..3])
            }
            _ => out.push(c),
        }
    }
    out.push('"');
}

fn write_value(v: &Value, rng: &mut u64, out: &mut String) {
    space(rng, out);
    match v {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                out.push_str(if i > 0 { "," } else { "" });
                write_value(item, rng, out);
            }
            space(rng, out);
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                out.push_str(if i > 0 { "," } else { "" });
                space(rng, out);
                write_str(k, rng, out);
                space(rng, out);
                out.push(':');
                write_value(item, rng, out);
            }
            space(rng, out);
            out.push('}');
        }
        Value::String(s) => write_str(s, rng, out),
        other => out.push_str(&other.to_string()),
    }
    space(rng, out);
}

fn at<'a>(mut v: &'a Value, path: &[String]) -> Option<&'a Value> {
    for key in path {
        v = v.as_object()?.get(key)?;
    }
    Some(v)
}

/// What serde_json finds at each path of `text` (written from `doc`), rounded by the rules. The
/// number's text comes from `doc`: serde_json's default float parsing may move the last digit.
pub(crate) fn reference(paths: &[Vec<String>], doc: &Value, text: &str) -> Vec<Option<u64>> {
    let parsed: Value = serde_json::from_str(text).expect("the writer writes JSON");
    paths
        .iter()
        .map(|path| {
            at(&parsed, path).filter(|v| v.is_number())?;
            reference_round(&at(doc, path)?.as_number()?.to_string())
        })
        .collect()
}

/// The text of a JSON number, with long runs of digits and zeros and large exponents.
fn number_text() -> impl Strategy<Value = String> {
    let int = prop_oneof!["0", "[1-9][0-9]{0,25}", "[1-9]0{0,30}"];
    let frac = prop::option::of(prop_oneof!["[0-9]{1,25}", "0{1,30}[1-9]?"]);
    let exp = prop::option::of((
        "[eE][-+]?",
        "0{0,25}",
        prop_oneof!["[0-9]{1,3}", "[1-9][0-9]{20,25}"],
    ));
    ("-?", int, frac, exp).prop_map(|(sign, int, frac, exp)| {
        let frac = frac.map(|f| format!(".{f}")).unwrap_or_default();
        let exp = exp
            .map(|(e, zeros, digits)| format!("{e}{zeros}{digits}"))
            .unwrap_or_default();
        format!("{sign}{int}{frac}{exp}")
    })
}

proptest! {
    #[test]
    fn documents_are_read_as_serde_json_reads_them(doc in document(), seed: u64) {
        let p = test_paths();
        let text = write(&doc, seed);
        prop_assert_eq!(scan_cut(&p, text.as_bytes(), &[]), reference(&p, &doc, &text), "{}", text);
    }

    #[test]
    fn any_split_of_a_document_reads_the_same(doc in document(), seed: u64, cuts in prop::collection::vec(0..2000usize, 0..8)) {
        let p = test_paths();
        let text = write(&doc, seed);
        let mut cuts = cuts;
        cuts.sort_unstable();
        prop_assert_eq!(scan_cut(&p, text.as_bytes(), &cuts), scan_cut(&p, text.as_bytes(), &[]));
    }

    #[test]
    fn numbers_are_rounded_as_the_reference_rounds(text in number_text()) {
        prop_assert_eq!(number(&text), reference_round(&text), "{}", text);
    }

    #[test]
    fn any_bytes_in_any_split_never_panic_and_stay_bounded(
        bytes in prop::collection::vec(prop_oneof![
            any::<u8>(),
            prop::sample::select(b"{}[]:,\"\\u0123456789.eE+-tfnrule ".to_vec()),
        ], 0..600),
        cuts in prop::collection::vec(0..600usize, 0..8),
    ) {
        let p = test_paths();
        let mut cuts = cuts;
        cuts.sort_unstable();
        prop_assert_eq!(scan_cut(&p, &bytes, &cuts), scan_cut(&p, &bytes, &[]));
    }
}
