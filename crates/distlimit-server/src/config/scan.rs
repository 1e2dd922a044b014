//! A linear pre-scan of a YAML file that bounds its flow nesting (`[`, `{`) before the parser
//! sees it.
//!
//! libyaml (under `serde_yaml_ng`) keeps one possible simple key per open flow collection and
//! walks them all at every token, so a file of nested `[[[[…` costs time quadratic in its depth:
//! 200 KB of them took 56 s to be refused. This scan costs one pass and refuses such a file at
//! the line where the depth passes [`MAX_FLOW_DEPTH`]. Block nesting needs no scan: the
//! deserializer refuses it past 128 levels, and it costs the parser linear time.

/// The deepest flow nesting (`[` and `{` inside one another) a YAML configuration file may
/// have. A descriptor written in flow style takes two levels (`[{…}]`), so this allows the
/// [`MAX_ENTRIES`](crate::check::MAX_ENTRIES) levels a request can reach.
pub const MAX_FLOW_DEPTH: usize = 2 * crate::check::MAX_ENTRIES + 2;

/// Where a file nests flow collections deeper than [`MAX_FLOW_DEPTH`]: its 1-based line.
pub(crate) fn too_deep(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut line = 1usize;
    let mut i = 0;
    // Whether the previous byte is a space or a line start (`#` starts a comment), and whether
    // it ends a token (a quote starts a quoted scalar).
    let mut after_space = true;
    let mut at_token_start = true;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'\n' => line += 1,
            b'#' if after_space => {
                while bytes.get(i + 1).is_some_and(|&c| c != b'\n') {
                    i += 1;
                }
            }
            b'\'' | b'"' if at_token_start => {
                // A quoted scalar: brackets inside are text. `''` and `\"` escape the quote.
                // Read to the end of the line at most: a quote misread here hides one line's
                // brackets, never the rest of the file (a continued scalar is counted, which
                // only errs towards refusing).
                while let Some(&c) = bytes.get(i + 1) {
                    if c == b'\n' {
                        break;
                    }
                    i += 1;
                    if b == b'"' && c == b'\\' {
                        i += usize::from(bytes.get(i + 1).is_some_and(|&n| n != b'\n'));
                    } else if c == b {
                        if b == b'\'' && bytes.get(i + 1) == Some(&b'\'') {
                            i += 1;
                        } else {
                            break;
                        }
                    }
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_FLOW_DEPTH {
                    return Some(line);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        // What the byte just consumed (a quoted scalar's closing quote ends no token).
        let last = bytes.get(i).copied().unwrap_or(b' ');
        after_space = matches!(last, b' ' | b'\t' | b'\r' | b'\n');
        at_token_start = after_space
            || matches!(last, b'[' | b'{' | b']' | b'}' | b',' | b':' | b'-' | b'?')
                && !matches!(b, b'\'' | b'"' | b'#');
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_flow_nesting_outside_quotes_and_comments() {
        let deep = MAX_FLOW_DEPTH + 1;
        assert_eq!(too_deep(&"[".repeat(MAX_FLOW_DEPTH)), None);
        // Closed collections do not add up.
        assert_eq!(too_deep(&"[]{}".repeat(10 * deep)), None);
        // Brackets in quoted scalars and comments are text.
        for text in [
            format!("a: '{}'", "[".repeat(deep)),
            format!("a: \"{}\"", "{".repeat(deep)),
            format!("a: 'it''s {}'", "[".repeat(deep)),
            format!("a: \"\\\" {}\"", "[".repeat(deep)),
            format!("a: 1 # {}", "[".repeat(deep)),
        ] {
            assert_eq!(too_deep(&text), None, "{text}");
        }
        // Refused at line 2, also after a quote on line 1 (in a plain scalar, or left open).
        for text in [
            format!("a: 1\nb: {}", "[{".repeat(deep)),
            format!("a: don't\nb: {}", "[".repeat(deep)),
            format!("a: 'open\nb: {}", "[".repeat(deep)),
            format!("a: x-'[\nb: {}", "[".repeat(deep)),
        ] {
            assert_eq!(too_deep(&text), Some(2), "{text}");
        }
    }
}
