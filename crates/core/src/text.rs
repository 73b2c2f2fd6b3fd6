//! Text from outside (a driver, a cloud, a client) made safe to show: control
//! characters, invisible ones and bidirectional overrides escaped, so that a
//! value can neither forge a log line, reorder what a table or a terminal
//! shows, nor pass for another value that looks the same.

use std::borrow::Cow;

use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

/// Whether `c` must not reach a log line, a table or a terminal as it is,
/// nor be part of a name or an id: C0 and C1 controls (newline and tab
/// included) and DEL; format characters (Unicode's `Cf`: the characters
/// that change the direction of text, zero-width space and joiners, word
/// joiner, byte order mark, soft hyphen, tags, …); the other
/// default-ignorable code points, which show nothing either (variation
/// selectors, the combining grapheme joiner, Hangul fillers, …); and the
/// line and paragraph separators and spaces other than U+0020 (no-break,
/// ideographic, …), which pass for a plain space or a line end.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || (c.is_whitespace() && c != ' ')
        || c.general_category() == GeneralCategory::Format
        || is_default_ignorable(c)
}

/// Unicode's `Default_Ignorable_Code_Point` (DerivedCoreProperties.txt):
/// code points a renderer shows nothing for. The `Cf` ones are in
/// [`is_unsafe`] already; these are the rest, reserved ones included.
fn is_default_ignorable(c: char) -> bool {
    matches!(
        c,
        '\u{034f}'
            | '\u{115f}'..='\u{1160}'
            | '\u{17b4}'..='\u{17b5}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff0}'..='\u{fff8}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e0fff}'
    )
}

/// Whether `name` is a requestor berth takes: 1 to 128 characters, none
/// of them [`is_unsafe`] (so none invisible). The API checks a client's, and the store an inbox
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

/// An error and its sources, as one line: `a: b: c`, each source said once
/// (many errors repeat their source in their own message).
pub fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
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
    fn invisible_characters_are_unsafe_and_shown_escaped() {
        let invisible = [
            ('\u{200b}', "zero-width space"),
            ('\u{200c}', "zero-width non-joiner"),
            ('\u{200d}', "zero-width joiner"),
            ('\u{2060}', "word joiner"),
            ('\u{feff}', "byte order mark"),
            ('\u{ad}', "soft hyphen"),
            ('\u{180e}', "Mongolian vowel separator"),
            ('\u{2064}', "invisible plus"),
            ('\u{e0041}', "tag latin capital A"),
            ('\u{fe0f}', "variation selector 16"),
            ('\u{e0100}', "variation selector 17"),
            ('\u{34f}', "combining grapheme joiner"),
            ('\u{3164}', "Hangul filler"),
            ('\u{115f}', "Hangul choseong filler"),
            ('\u{600}', "Arabic number sign"),
            ('\u{fff9}', "interlinear annotation anchor"),
            ('\u{a0}', "no-break space"),
            ('\u{3000}', "ideographic space"),
            ('\u{2028}', "line separator"),
        ];
        for (c, name) in invisible {
            assert!(is_unsafe(c), "{name} U+{:04X}", u32::from(c));
            let shown = printable(&format!("ci{c}bot")).into_owned();
            assert_eq!(shown, format!("ci\\u{{{:x}}}bot", u32::from(c)), "{name}");
            assert!(!is_requestor(&format!("ci{c}")), "{name}");
        }
        // Letters, marks that show, symbols and the plain space stay.
        for ok in [
            "ci bot",
            "café",
            "ÅngströM",
            "日本語",
            "e\u{301}",
            "a-b_c.d",
            "→ ✓",
        ] {
            assert!(!ok.chars().any(is_unsafe), "{ok:?}");
            assert!(is_requestor(ok), "{ok:?}");
        }
    }

    #[test]
    fn truncates_on_a_character_boundary() {
        assert_eq!(truncated("abcdef", 10), "abcdef");
        assert_eq!(truncated("abcdef", 3), "abc…");
        assert_eq!(truncated("aé", 2), "a…");
    }
}
