//! How deep a YAML document nests, measured before the YAML parser sees it.
//!
//! libyaml (behind serde_yaml) spends time proportional to the nesting depth on every token of a
//! flow collection, so a 200 KB file of `[[[[…` took over a minute of CPU to refuse. A config
//! needs fewer than ten levels; this scan counts them in one pass over the bytes and stops the
//! document at [`MAX_DEPTH`] before any parsing.

/// Levels a document may nest: far beyond any config, far below what costs time.
pub const MAX_DEPTH: usize = 64;

/// The 1-based line where the document first nests deeper than [`MAX_DEPTH`], if it does.
///
/// Counted: flow collections (`[`, `{`), block indentation, and compact block sequences (`- - x`).
/// Quoted scalars and comments are skipped. The count can err high on odd but valid documents
/// (a deeply indented block scalar); it never errs low on nesting the parser would see.
pub fn too_deep(text: &str) -> Option<usize> {
    let mut flow = 0usize;
    // Columns of the block levels open at the start of the current line.
    let mut indents: Vec<usize> = Vec::new();
    let mut quote: Option<u8> = None;
    for (n, line) in text.lines().enumerate() {
        let bytes = line.as_bytes();
        let mut i = 0;
        if flow == 0 && quote.is_none() {
            let column = bytes.iter().take_while(|&&b| b == b' ').count();
            let rest = &bytes[column..];
            if !rest.is_empty() && rest[0] != b'#' {
                while indents.last().is_some_and(|&top| top >= column) {
                    indents.pop();
                }
                indents.push(column);
                // `- - x`: each indicator opens a sequence inside the previous one.
                i = column;
                while bytes.get(i) == Some(&b'-') && matches!(bytes.get(i + 1), Some(b' ') | None) {
                    i += 2;
                    while bytes.get(i) == Some(&b' ') {
                        i += 1;
                    }
                    indents.push(i);
                }
                if indents.len() > MAX_DEPTH {
                    return Some(n + 1);
                }
            }
        }
        while i < bytes.len() {
            let b = bytes[i];
            match quote {
                Some(b'\'') if b == b'\'' => {
                    // '' is an escaped quote inside a single-quoted scalar.
                    if bytes.get(i + 1) == Some(&b'\'') {
                        i += 1;
                    } else {
                        quote = None;
                    }
                }
                Some(b'"') if b == b'\\' => i += 1,
                Some(b'"') if b == b'"' => quote = None,
                Some(_) => {}
                None => match b {
                    b'#' if i == 0 || bytes[i - 1] == b' ' || bytes[i - 1] == b'\t' => break,
                    // A quote opens a scalar only where one can start; `it's` is plain.
                    b'\'' | b'"'
                        if i == 0
                            || matches!(bytes[i - 1], b' ' | b'\t' | b'[' | b'{' | b',' | b':') =>
                    {
                        quote = Some(b)
                    }
                    b'[' | b'{' => {
                        flow += 1;
                        if indents.len() + flow > MAX_DEPTH {
                            return Some(n + 1);
                        }
                    }
                    b']' | b'}' => flow = flow.saturating_sub(1),
                    _ => {}
                },
            }
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_pass() {
        let config = "listen: [\"0.0.0.0:8080\"]\nroutes:\n  - name: a   # [[[[ not counted\n    match: { path_prefix: \"/[{\" , methods: [GET] }\n    limits:\n      - { name: l, capacity: 1, refill: '1/s', key: [client_ip, \"header:X\"] }\n";
        assert_eq!(too_deep(config), None);
        assert_eq!(
            too_deep(&format!("a: {}{}", "[".repeat(60), "]".repeat(60))),
            None
        );
        assert_eq!(too_deep("a: it's [fine]\nb: 'don''t [[['\n"), None);
    }

    #[test]
    fn deep_documents_are_found_in_one_pass() {
        assert_eq!(
            too_deep(&format!("listen: {}", "[".repeat(200_000))),
            Some(1)
        );
        assert_eq!(
            too_deep(&format!("a:\n  b: {}", "{x: ".repeat(100))),
            Some(2)
        );
        assert_eq!(
            too_deep(&format!("routes:\n{}x", "- ".repeat(100_000))),
            Some(2)
        );
        let indented: String = (0..70)
            .map(|d| format!("{}k{d}:\n", " ".repeat(d)))
            .collect();
        assert_eq!(too_deep(&indented), Some(65));
    }
}
