use super::*;
use crate::usage::scan::tests::{bound, document, paths, reference, test_paths, write};
use proptest::prelude::*;

/// Scans `body` fed in the given pieces (split at each of `cuts`); what was found.
fn scan_cut(paths: &Arc<[Vec<String>]>, body: &[u8], cuts: &[usize]) -> Vec<Option<u64>> {
    let mut scan = SseScan::new(paths.clone());
    let mut at = 0;
    for &cut in cuts {
        let cut = cut.clamp(at, body.len());
        scan.feed(&body[at..cut]);
        at = cut;
    }
    scan.feed(&body[at..]);
    scan.end();
    assert!(scan.held_bytes() < bound(paths));
    (0..paths.len()).map(|i| scan.found(i)).collect()
}

/// The stream read the plain way: split into lines per the spec, each event's data joined and
/// scanned whole. The reference the streaming reader must agree with.
fn spec(paths: &Arc<[Vec<String>]>, body: &[u8]) -> Vec<Option<u64>> {
    let body = body.strip_prefix(BOM).unwrap_or(body);
    let mut found = vec![None; paths.len()];
    let mut data: Option<Vec<u8>> = None;
    let mut dispatch = |data: &mut Option<Vec<u8>>| {
        if let Some(mut d) = data.take() {
            d.pop();
            let mut scan = JsonScan::new(paths.clone());
            scan.feed(&d);
            scan.end();
            for (i, f) in found.iter_mut().enumerate() {
                *f = (*f).max(scan.found(i));
            }
        }
    };
    let mut lines = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < body.len() {
        if body[i] == b'\r' || body[i] == b'\n' {
            lines.push(&body[start..i]);
            i += if body[i..].starts_with(b"\r\n") { 2 } else { 1 };
            start = i;
        } else {
            i += 1;
        }
    }
    lines.extend(Some(&body[start..]).filter(|l| !l.is_empty()));
    for line in lines {
        if line.is_empty() {
            dispatch(&mut data);
            continue;
        }
        let colon = line.iter().position(|&b| b == b':').unwrap_or(line.len());
        let value = line.get(colon + 1..).unwrap_or_default();
        if &line[..colon] == b"data" {
            let d = data.get_or_insert_with(Vec::new);
            d.extend_from_slice(value.strip_prefix(b" ").unwrap_or(value));
            d.push(b'\n');
        }
    }
    dispatch(&mut data);
    found
}

/// Scans `body` whole, byte by byte, and split in two everywhere, with LF, CRLF and CR line
/// ends; all must agree with each other and with the plain reading.
fn sse(paths: &Arc<[Vec<String>]>, body: &str) -> Vec<Option<u64>> {
    let whole = scan_cut(paths, body.as_bytes(), &[]);
    assert_eq!(whole, spec(paths, body.as_bytes()), "{body:?}");
    for ends in ["\r\n", "\r"] {
        let other = body.replace('\n', ends);
        assert_eq!(scan_cut(paths, other.as_bytes(), &[]), whole, "{other:?}");
    }
    let every: Vec<usize> = (0..body.len()).collect();
    assert_eq!(
        scan_cut(paths, body.as_bytes(), &every),
        whole,
        "byte by byte"
    );
    for cut in 0..=body.len().min(3000) {
        assert_eq!(
            scan_cut(paths, body.as_bytes(), &[cut]),
            whole,
            "split at {cut}"
        );
    }
    whole
}

const OPENAI_CHAT: &str = r#"data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{"content":" there! \"usage\": {\"total_tokens\": 999}"},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}

data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_06737a9306","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}

data: [DONE]

"#;

const OPENAI_RESPONSES: &str = r#"event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","created_at":1741290958,"status":"in_progress","error":null,"incomplete_details":null,"instructions":"You are a helpful assistant.","max_output_tokens":null,"model":"gpt-4.1-2025-04-14","output":[],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled","usage":null,"user":null,"metadata":{}}}

event: response.in_progress
data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","created_at":1741290958,"status":"in_progress","output":[],"usage":null}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","type":"message","status":"in_progress","role":"assistant","content":[]}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"delta":"Hi"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":5,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"delta":" there!"}

event: response.completed
data: {"type":"response.completed","sequence_number":8,"response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","created_at":1741290958,"status":"completed","error":null,"model":"gpt-4.1-2025-04-14","output":[{"id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi there!","annotations":[]}]}],"temperature":1.0,"top_p":1.0,"usage":{"input_tokens":37,"input_tokens_details":{"cached_tokens":0},"output_tokens":11,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":48},"user":null,"metadata":{}}}

"#;

const ANTHROPIC: &str = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}

event: message_stop
data: {"type":"message_stop"}

"#;

#[test]
fn openai_chat_stream_charges_the_final_usage_chunk() {
    let p = paths(&[
        &["usage", "total_tokens"],
        &["usage", "prompt_tokens"],
        &["usage", "completion_tokens"],
    ]);
    assert_eq!(sse(&p, OPENAI_CHAT), [Some(21), Some(9), Some(12)]);
}

#[test]
fn openai_responses_stream_charges_response_completed() {
    let p = paths(&[
        &["response", "usage", "total_tokens"],
        &["response", "usage", "input_tokens"],
        &["usage", "total_tokens"],
    ]);
    assert_eq!(sse(&p, OPENAI_RESPONSES), [Some(48), Some(37), None]);
}

#[test]
fn anthropic_stream_charges_input_at_start_and_cumulative_output_at_delta() {
    let p = paths(&[
        &["message", "usage", "input_tokens"],
        &["usage", "output_tokens"],
        &["message", "usage", "output_tokens"],
    ]);
    assert_eq!(sse(&p, ANTHROPIC), [Some(25), Some(15), Some(1)]);
}

#[test]
fn fields_are_read_as_the_spec_reads_them() {
    let p = paths(&[&["a"]]);
    for (body, want) in [
        ("data:{\"a\":5}\n\n", Some(5)),
        ("data: {\"a\":5}\n\n", Some(5)),
        ("data:  {\"a\":5}\n\n", Some(5)),
        ("data :{\"a\":5}\n\n", None),
        ("Data: {\"a\":5}\n\n", None),
        ("dat: {\"a\":5}\n\n", None),
        ("datas: {\"a\":5}\n\n", None),
        ("data{\"a\":5}\n\n", None),
        (": data: {\"a\":5}\n\n", None),
        ("event: data\nid: 1\nretry: 5\nfoo: {\"a\":6}\ndata: {\"a\":5}\n\n", Some(5)),
        // Several data lines are one document joined by newlines.
        ("data: {\"a\":\ndata: 7}\n\n", Some(7)),
        ("data: {\"a\":\n: a comment\nevent: x\ndata\ndata: 7}\n\n", Some(7)),
        ("data: {\"a\":1\ndata: 2}\n\n", Some(1)),
        // A blank line ends the event: the rest is another document.
        ("data: {\"a\":\n\ndata: 7}\n\n", None),
        // Not closed by a blank line: scanned at the end all the same.
        ("data: {\"a\":8}", Some(8)),
        ("data: {\"a\":8", Some(8)),
        ("data: {\"a\":8}\r", Some(8)),
        ("data: {\"a\":", None),
        // Not JSON, or not a number: nothing, and no harm to the events after.
        ("data: [DONE]\n\ndata: hello\n\ndata: {\"a\":\"9\"}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n", Some(2)),
        ("data: {\"a\":3}\n\ndata: {\"a\":9}\n\ndata: {\"a\":4}\n\n", Some(9)),
        ("\n\n\n:\n\n", None),
        ("", None),
    ] {
        assert_eq!(sse(&p, body), [want], "{body:?}");
    }
    let root = paths(&[&[]]);
    assert_eq!(sse(&root, "data\ndata: 5\n\n"), [Some(5)]);
    assert_eq!(sse(&root, "data: 5\ndata\n\n"), [Some(5)]);
    assert_eq!(sse(&root, "data: 5\ndata: 6\n\n"), [Some(5)]);
    assert_eq!(sse(&root, "data: 5\n\ndata: 6\n\n"), [Some(6)]);
    assert_eq!(sse(&root, "data"), [None]);
}

#[test]
fn a_cr_at_the_end_of_one_piece_and_an_lf_at_the_start_of_the_next_end_one_line() {
    let p = paths(&[&["a"]]);
    let mut scan = SseScan::new(p.clone());
    for piece in ["data: {\"a\":\r", "\ndata: 7}\r", "\n", "\r\n"] {
        scan.feed(piece.as_bytes());
    }
    assert_eq!(
        scan.found(0),
        Some(7),
        "dispatched by the blank line, before the end"
    );
    assert_eq!(sse(&p, "data: {\"a\":\rdata: 7}\r\r"), [Some(7)]);
    assert_eq!(sse(&p, "data: {\"a\":\n\rdata: 7}\r\r"), [None]);
}

#[test]
fn a_leading_byte_order_mark_is_ignored_and_only_there() {
    let p = paths(&[&["a"]]);
    assert_eq!(sse(&p, "\u{feff}data: {\"a\":5}\n\n"), [Some(5)]);
    assert_eq!(sse(&p, "\u{feff}\u{feff}data: {\"a\":5}\n\n"), [None]);
    assert_eq!(
        sse(&p, "data: {\"a\":1}\n\n\u{feff}data: {\"a\":5}\n\n"),
        [Some(1)]
    );
    assert_eq!(scan_cut(&p, b"\xEF\xBBdata: {\"a\":5}\n\n", &[1]), [None]);
    assert_eq!(
        scan_cut(&p, b"\xEF\xBB\ndata: {\"a\":5}\n\n", &[1, 2]),
        [Some(5)]
    );
    assert_eq!(scan_cut(&p, b"\xEF\xBB", &[1]), [None]);
}

#[test]
fn an_event_is_charged_once_a_blank_line_or_the_end_closes_it() {
    let p = paths(&[&["a"]]);
    let mut scan = SseScan::new(p);
    scan.feed(b"data: {\"a\":4}\n");
    assert_eq!(scan.found(0), None);
    scan.feed(b"\n");
    assert_eq!(scan.found(0), Some(4));
    scan.feed(b"data: {\"a\":6}\n");
    scan.end();
    assert_eq!(scan.found(0), Some(6));
}

#[test]
fn long_lines_of_any_field_are_not_kept() {
    let p = paths(&[&["usage", "total_tokens"]]);
    let long = "x".repeat(1 << 20);
    let body = format!(
        "{long}: 1\n:{long}\ndata{long}: 2\nevent: {long}\ndata: {{\"usage\":{{\"total_tokens\":3,\"{long}\":1}}}}\n\n"
    );
    let mut scan = SseScan::new(p);
    let held = scan.held_bytes();
    for piece in body.as_bytes().chunks(4096) {
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
fn a_five_mib_data_line_is_scanned_in_bounded_memory() {
    let p = paths(&[&["usage", "total_tokens"]]);
    let content = "tok \\\"en\\\" \\n ".repeat(400_000);
    let body = format!(
        "event: big\ndata: {{\"choices\":[{{\"delta\":{{\"content\":\"{content}\"}}}}],\"usage\":{{\"total_tokens\":77}}}}\n\ndata: [DONE]\n\n"
    );
    assert!(body.len() > 5 << 20);
    let mut scan = SseScan::new(p.clone());
    let (held, mut most) = (scan.held_bytes(), 0);
    for piece in body.as_bytes().chunks(16_381) {
        scan.feed(piece);
        most = most.max(scan.held_bytes());
    }
    scan.end();
    println!("5 MiB data line: held_bytes at most {most}");
    assert!(most < bound(&p), "{most}");
    assert_eq!(most, held, "nothing grows past what `new` made");
    assert_eq!(scan.found(0), Some(77));
}

#[test]
fn ten_thousand_events_are_scanned_in_bounded_memory() {
    let p = paths(&[
        &["usage", "output_tokens"],
        &["message", "usage", "input_tokens"],
    ]);
    let mut body = String::from(
        "event: message_start\ndata: {\"message\":{\"usage\":{\"input_tokens\":25}}}\n\n",
    );
    for i in 0..10_000 {
        body += &format!("event: content_block_delta\r\ndata: {{\"delta\":{{\"text\":\"tok{i}\"}},\"usage\":{{\"output_tokens\":{i}}}}}\r\n\r\n");
        if i % 1000 == 0 {
            body += ": ping\n\ndata: [DONE]\n\n";
        }
    }
    let mut scan = SseScan::new(p.clone());
    let (held, mut most) = (scan.held_bytes(), 0);
    for piece in body.as_bytes().chunks(997) {
        scan.feed(piece);
        most = most.max(scan.held_bytes());
    }
    scan.end();
    println!("10,000 events: held_bytes at most {most}");
    assert!(most < bound(&p), "{most}");
    assert_eq!(most, held, "nothing grows past what `new` made");
    assert_eq!((scan.found(0), scan.found(1)), (Some(9_999), Some(25)));
}

/// A stream of the given documents as events, each document's lines one data line, with other
/// fields, comments and `[DONE]` between them, in one line-ending style.
fn stream(
    docs: &[(serde_json::Value, u64)],
    style: usize,
    bom: bool,
    closed: bool,
) -> (String, Vec<String>) {
    let end = ["\n", "\r\n", "\r"][style % 3];
    let mut body = String::from(if bom { "\u{feff}" } else { "" });
    let mut texts = Vec::new();
    for (i, (doc, seed)) in docs.iter().enumerate() {
        let text = write(doc, *seed);
        body += &format!("event: e{i}{end}: comment{end}");
        for (j, line) in text.split(['\r', '\n']).enumerate() {
            let sep = if (seed >> j) & 1 == 0 { " " } else { "" };
            body += &format!("data:{sep}{line}{end}");
            if j == 1 {
                body += &format!("id: {i}{end}retry: 10{end}");
            }
        }
        texts.push(text);
        if closed || i + 1 < docs.len() {
            body += &format!("{end}data: [DONE]{end}{end}");
        }
    }
    (body, texts)
}

proptest! {
    #[test]
    fn streams_are_read_as_serde_json_reads_each_event(
        docs in prop::collection::vec((document(), any::<u64>()), 0..5),
        style in 0..3usize,
        bom: bool,
        closed: bool,
        cuts in prop::collection::vec(0..3000usize, 0..8),
    ) {
        let p = test_paths();
        let (body, texts) = stream(&docs, style, bom, closed);
        let mut want = vec![None; p.len()];
        for ((doc, _), text) in docs.iter().zip(&texts) {
            for (w, r) in want.iter_mut().zip(reference(&p, doc, text)) {
                *w = (*w).max(r);
            }
        }
        let mut cuts = cuts;
        cuts.sort_unstable();
        prop_assert_eq!(scan_cut(&p, body.as_bytes(), &cuts), want, "{:?}", body);
    }

    #[test]
    fn any_bytes_in_any_split_read_as_the_spec_reads_them(
        pieces in prop::collection::vec(prop::sample::select(vec![
            "data", "data:", ":", " ", "\r", "\n", "\r\n", "{\"n\":", "1", "}", "event: x",
            "[DONE]", "\u{feff}", "2.5", "{", "\"usage\":{\"n\":", "data: 7", "\"", "\u{e9}",
        ]), 0..60),
        bytes in prop::collection::vec(any::<u8>(), 0..8),
        cuts in prop::collection::vec(0..400usize, 0..8),
    ) {
        let p = test_paths();
        let mut body = pieces.concat().into_bytes();
        body.extend(bytes);
        let mut cuts = cuts;
        cuts.sort_unstable();
        prop_assert_eq!(scan_cut(&p, &body, &cuts), spec(&p, &body), "{:?}", String::from_utf8_lossy(&body));
    }
}
