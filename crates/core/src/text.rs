//! Text from outside (a driver, a cloud, a client) made safe to show: control
//! characters and bidirectional overrides escaped, so that a value can
//! neither forge a log line nor reorder what a table or a terminal shows.

use std::borrow::Cow;

/// Whether `c` must not reach a log line, a table or a terminal as it is:
/// C0 and C1 controls (newline and tab included), DEL, the line and
/// paragraph separators, and the characters that change the direction of
/// text (U+061C, U+200E/F, U+202A–E, U+2066–9).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// Whether `name` is a requestor berth takes: 1 to 128 characters, none
/// of them [`is_unsafe`]. The API checks a client's, and the store an inbox
/// entry's (written by another process, or by hand).
pub fn is_requestor(name: &str) -> bool {
    (1..=128).contains(&name.chars().count()) && !name.chars().any(is_unsafe)
}

/// `text` with every [`is_unsafe`] character escaped (`\n`, `\r`, `\t`,
/// otherwise `\u{…}`); borrowed when there is nothing to escape.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if is_unsafe(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `text` cut to at most `max` bytes on a character boundary, with `…`
/// appended when something was cut.
pub fn truncated(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    Cow::Owned(format!("{}…", &text[..cut]))
}

/// What a panic said, from its payload (a `&str` or a `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_could_forge_or_reorder() {
        let cases = [
            ("plain text", "plain text"),
            ("two\nlines", "two\\nlines"),
            ("cr\rtab\t", "cr\\rtab\\t"),
            ("esc\u{1b}[31m", "esc\\u{1b}[31m"),
            ("abc\u{202e}fed", "abc\\u{202e}fed"),
            ("isolate\u{2066}x\u{2069}", "isolate\\u{2066}x\\u{2069}"),
            ("c1\u{85}", "c1\\u{85}"),
            ("ünïcödé ok", "ünïcödé ok"),
        ];
        for (input, want) in cases {
            assert_eq!(printable(input), want, "{input:?}");
        }
        assert!(matches!(printable("fine"), Cow::Borrowed(_)));
    }

    #[test]
    fn truncates_on_a_character_boundary() {
        assert_eq!(truncated("abcdef", 10), "abcdef");
        assert_eq!(truncated("abcdef", 3), "abc…");
        assert_eq!(truncated("aé", 2), "a…");
    }
}
