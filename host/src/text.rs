//! Text that came from outside the host (a sink, a producer's row) made safe to show: one
//! line, no control characters, bounded in length.
//!
//! A sink is untrusted code. Whatever it says reaches log lines, `last_error`, the terminal
//! of an operator running `outbox-host status`, and the status page; a newline in it could
//! forge a log line, an ESC could drive the terminal, U+202E could reverse what is shown.

use std::fmt::Write as _;

/// Appended to text cut at its budget.
pub const CLIPPED: &str = "…[clipped]";

/// Whether `c` must not reach a log line or a terminal as it is: C0 and C1 controls
/// (newlines and tabs included), DEL, and the Unicode format characters that reorder or
/// hide text (bidi overrides and isolates, zero-width marks, the BOM).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
}

/// `text` with every unsafe character written as a visible escape (`\n`, `\u{1b}`), on one
/// line, and at most `max_bytes` long (cut on a character boundary and marked [`CLIPPED`]).
pub fn printable(text: &str, max_bytes: usize) -> String {
    printable_within(text, max_bytes).0
}

/// [`printable`], and whether the text had to be clipped.
pub fn printable_within(text: &str, max_bytes: usize) -> (String, bool) {
    let mut out = String::with_capacity(text.len().min(max_bytes) + CLIPPED.len());
    for c in text.chars() {
        let before = out.len();
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if is_unsafe(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
        if out.len() > max_bytes {
            out.truncate(before);
            out.push_str(CLIPPED);
            return (out, true);
        }
    }
    (out, false)
}

/// An error message as it is stored in `last_error` (at most 512): the config's
/// credentials scrubbed (`redact::scrub`), one line, whitespace runs collapsed, unsafe
/// characters escaped, clipped on a character boundary.
pub fn short_error(message: &str) -> String {
    const MAX: usize = 500;
    let message = crate::redact::scrub(message);
    let one_line: String = message.split_whitespace().collect::<Vec<_>>().join(" ");
    printable(&one_line, MAX)
}

/// `text` cut to at most `max_chars` characters, the last of them `…` when it was cut (a
/// `last_error` column declared shorter than the host's errors).
pub fn clip_chars(text: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max_chars) {
        None => std::borrow::Cow::Borrowed(text),
        Some(_) => {
            let keep = text.char_indices().nth(max_chars.saturating_sub(1)).map_or(text.len(), |(at, _)| at);
            std::borrow::Cow::Owned(format!("{}…", &text[..keep]))
        }
    }
}

/// JSON text (as `serde_json` writes it) with the unsafe characters it leaves raw (DEL, C1
/// controls, bidi and zero-width marks) written as `\uXXXX` escapes: still the same JSON
/// value, but safe on a terminal.
pub fn json_for_terminal(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if is_unsafe(c) && c != '\n' {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A seeded xorshift generator, for tests that fuzz with the same inputs on every run.
#[cfg(test)]
pub(crate) fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_chars_counts_characters_and_marks_the_cut() {
        assert_eq!(clip_chars("héllo", 5), "héllo");
        assert_eq!(clip_chars("héllo wörld", 5), "héll…");
        assert_eq!(clip_chars("héllo wörld", 5).chars().count(), 5);
    }

    #[test]
    fn newlines_and_controls_become_visible_escapes() {
        let forged = "ok\n2026-01-01T00:00:00Z  INFO deliver{event_id=FORGED}: event delivered";
        assert_eq!(printable(forged, 1000).lines().count(), 1);
        assert!(printable(forged, 1000).starts_with("ok\\n2026"));
        assert_eq!(printable("a\u{1b}[2Jb\0c", 100), "a\\u{1b}[2Jb\\u{0}c");
        assert_eq!(printable("evil\u{202E}txt.exe", 100), "evil\\u{202e}txt.exe");
        assert_eq!(printable("tab\there\r", 100), "tab\\there\\r");
        assert_eq!(printable("plain text, ünïcödé", 100), "plain text, ünïcödé");
    }

    #[test]
    fn json_keeps_its_value_but_loses_raw_reordering_characters() {
        let value = serde_json::json!({ "last_error": "a\u{202E}b\u{1b}c\u{85}" });
        let text = json_for_terminal(&serde_json::to_string_pretty(&value).unwrap());
        assert!(!text.chars().any(|c| is_unsafe(c) && c != '\n'), "{text}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap(), value);
    }

    #[test]
    fn long_text_is_clipped_on_a_character_boundary() {
        let long = "é".repeat(100);
        let shown = printable(&long, 11);
        assert_eq!(shown, format!("{}{CLIPPED}", "é".repeat(5)));
        // An escape is never cut in half.
        assert_eq!(printable("abc\u{1b}", 5), format!("abc{CLIPPED}"));
    }
}
