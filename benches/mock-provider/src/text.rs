//! Word-level text helpers: the mock counts "tokens" as whitespace-separated
//! words so tests can predict usage numbers exactly.

use std::fmt::Write;

/// Number of whitespace-separated words.
pub(crate) fn word_count(text: &str) -> usize {
    text.split_whitespace().count()
}

/// The first `max_words` words of `text` (inner whitespace kept, trailing
/// whitespace dropped), or `None` if `text` has no more than that many.
pub(crate) fn truncate_words(text: &str, max_words: usize) -> Option<&str> {
    let mut words = 0;
    let mut in_word = false;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            in_word = false;
        } else if !in_word {
            in_word = true;
            if words == max_words {
                return Some(text[..i].trim_end());
            }
            words += 1;
        }
    }
    None
}

/// Byte offsets where streamed pieces start: each piece is a word plus the
/// whitespace after it (leading whitespace goes with the first piece), so
/// concatenating the pieces gives `text` back exactly. Empty text has no
/// pieces.
pub(crate) fn piece_starts(text: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    if text.is_empty() {
        return starts;
    }
    starts.push(0);
    let mut seen_word = false;
    let mut in_word = false;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            in_word = false;
        } else if !in_word {
            in_word = true;
            if seen_word {
                starts.push(i);
            }
            seen_word = true;
        }
    }
    starts
}

/// `"w1 w2 ... wn"`: a predictable reply of exactly `n` words.
pub(crate) fn numbered_words(n: usize) -> String {
    let mut out = String::with_capacity(n.saturating_mul(7));
    for i in 1..=n {
        if i > 1 {
            out.push(' ');
        }
        // Writing to a String cannot fail.
        let _ = write!(out, "w{i}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation() {
        assert_eq!(truncate_words("a b  c d", 2), Some("a b"));
        assert_eq!(truncate_words("a b  c d", 3), Some("a b  c"));
        assert_eq!(truncate_words("a b", 2), None);
        assert_eq!(truncate_words("a b ", 2), None);
        assert_eq!(truncate_words("a b", 0), Some(""));
        assert_eq!(truncate_words("", 0), None);
    }

    #[test]
    fn pieces_concatenate_back() {
        for text in ["mock reply to: hi  there", " lead", "one", "", "a\nb\tc "] {
            let starts = piece_starts(text);
            let mut joined = String::new();
            for (k, &s) in starts.iter().enumerate() {
                let end = starts.get(k + 1).copied().unwrap_or(text.len());
                joined.push_str(&text[s..end]);
            }
            assert_eq!(joined, text);
            assert_eq!(
                starts.len(),
                word_count(text).max(usize::from(!text.is_empty()))
            );
        }
    }

    #[test]
    fn numbered() {
        assert_eq!(numbered_words(3), "w1 w2 w3");
        assert_eq!(numbered_words(0), "");
        assert_eq!(word_count(&numbered_words(1000)), 1000);
    }
}
