//! What a request's own body says for usage: what each of its limits reserves (`reserve`), and
//! the streaming request asked to report its usage (`stream_usage: request`).

use super::scan::JsonScan;
use crate::config::Reserve;
use serde_json::Value;
use std::sync::Arc;

/// The most of a request body the proxy holds to read a reservation from or to rewrite: a larger
/// one is refused (413) on a route that needs it.
pub const MAX_BODY: usize = 32 << 20;

/// What each limit reserves for a request whose body is `body` (0 for a limit without `reserve`).
pub fn reservations<'a>(
    reserves: impl Iterator<Item = Option<&'a Reserve>> + Clone,
    body: &[u8],
) -> Vec<u64> {
    let paths: Vec<Vec<String>> = reserves
        .clone()
        .flatten()
        .flat_map(|r| r.paths.iter().cloned())
        .collect();
    let mut scan = JsonScan::new(Arc::from(paths));
    scan.feed(body);
    scan.end();
    let mut next = 0;
    reserves
        .map(|r| {
            let Some(r) = r else { return 0 };
            let found = (next..next + r.paths.len()).find_map(|i| scan.found(i));
            next += r.paths.len();
            r.amount(found)
        })
        .collect()
}

/// `body` with `"stream_options":{"include_usage":true}`, when it is a JSON object that asks for
/// a stream (`"stream": true`) without asking for its usage; `None` to send it as it is.
pub fn ask_stream_usage(body: &[u8]) -> Option<Vec<u8>> {
    let mut doc: Value = serde_json::from_slice(body).ok()?;
    let obj = doc.as_object_mut()?;
    if obj.get("stream") != Some(&Value::Bool(true)) {
        return None;
    }
    let usage = Value::Bool(true);
    match obj.get_mut("stream_options") {
        // The usual case: the object as written, one member added at its end.
        None => {
            let end = body.iter().rposition(|&b| b == b'}')?;
            let mut out = Vec::with_capacity(body.len() + 40);
            out.extend_from_slice(&body[..end]);
            out.extend_from_slice(br#","stream_options":{"include_usage":true}"#);
            out.extend_from_slice(&body[end..]);
            Some(out)
        }
        Some(Value::Object(o)) if o.get("include_usage") == Some(&usage) => None,
        // Asked not to, or spelled oddly: written anew, with usage asked for.
        Some(Value::Object(o)) => {
            o.insert("include_usage".into(), usage);
            serde_json::to_vec(&doc).ok()
        }
        Some(other) => {
            *other = serde_json::json!({ "include_usage": true });
            serde_json::to_vec(&doc).ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reserve(paths: &[&str], default: u64, max: u64) -> Reserve {
        Reserve {
            paths: paths.iter().map(|p| Reserve::path(p).unwrap()).collect(),
            default,
            max,
        }
    }

    #[test]
    fn each_limit_reserves_its_first_path_found_capped_or_its_default() {
        let a = reserve(&["json:max_completion_tokens", "json:max_tokens"], 10, 1000);
        let b = reserve(&["json:max_tokens"], 7, 30);
        let limits = [Some(&a), None, Some(&b)];
        let got = reservations(limits.iter().copied(), br#"{"max_tokens": 50}"#);
        assert_eq!(got, vec![50, 0, 30]);
        let got = reservations(
            limits.iter().copied(),
            br#"{"max_completion_tokens": 2.5, "max_tokens": 1}"#,
        );
        assert_eq!(got, vec![3, 0, 1]);
        let got = reservations(limits.iter().copied(), b"not json");
        assert_eq!(got, vec![10, 0, 7]);
        let got = reservations(limits.iter().copied(), br#"{"max_tokens": -5}"#);
        assert_eq!(got, vec![10, 0, 7], "a negative cap is no cap");
        let got = reservations(limits.iter().copied(), br#"{"max_tokens": 1e30}"#);
        assert_eq!(got, vec![1000, 0, 30], "an absurd cap reserves the most");
    }

    #[test]
    fn a_streaming_request_is_asked_for_its_usage_once() {
        let body = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"}"}]}"#;
        let out = ask_stream_usage(body).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], Value::Bool(true));
        assert_eq!(v["messages"][0]["content"], "}");
        assert!(
            out.starts_with(br#"{"model":"m","stream":true"#),
            "written as it was"
        );
        assert_eq!(ask_stream_usage(&out), None, "asked already");
        for (body, why) in [
            (&br#"{"stream":false}"#[..], "not a stream"),
            (br#"{"stream":"true"}"#, "a string is not true"),
            (br#"[{"stream":true}]"#, "not an object"),
            (br#"{"stream":true"#, "not JSON"),
        ] {
            assert_eq!(ask_stream_usage(body), None, "{why}");
        }
        let off = br#"{"stream":true,"stream_options":{"include_usage":false,"x":1}}"#;
        let v: Value = serde_json::from_slice(&ask_stream_usage(off).unwrap()).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], Value::Bool(true));
        assert_eq!(v["stream_options"]["x"], 1);
        let odd = br#"{"stream":true,"stream_options":null}"#;
        let v: Value = serde_json::from_slice(&ask_stream_usage(odd).unwrap()).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], Value::Bool(true));
    }
}
