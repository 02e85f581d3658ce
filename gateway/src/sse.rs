//! Server-sent events, split incrementally: network reads may cut an event anywhere, so bytes
//! are held until the blank line that ends an event arrives.

use bytes::{Bytes, BytesMut};

/// The most bytes of one unfinished event held while waiting for its blank line: a provider
/// that never ends an event cannot make the gateway hold more. The largest events seen in
/// practice (a Responses API `response.completed` repeating the whole answer) stay far below.
pub const MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

/// Splits a byte stream into whole events (each including its terminating blank line).
#[derive(Debug, Default)]
pub struct EventSplitter {
    pending: BytesMut,
    overflowed: bool,
}

impl EventSplitter {
    /// Adds a network read; returns the bytes of every event it completed (possibly empty).
    /// Once an unfinished event passes [`MAX_EVENT_BYTES`] the splitter drops what it holds
    /// and takes nothing more: [`EventSplitter::overflowed`] says so, and the stream must end.
    pub fn push(&mut self, data: &[u8]) -> Bytes {
        if self.overflowed {
            return Bytes::new();
        }
        let scan_from = self.pending.len().saturating_sub(3);
        self.pending.extend_from_slice(data);
        let events = match last_event_end(&self.pending, scan_from) {
            Some(end) => self.pending.split_to(end).freeze(),
            None => Bytes::new(),
        };
        if self.pending.len() > MAX_EVENT_BYTES {
            self.overflowed = true;
            self.pending = BytesMut::new();
        }
        events
    }

    /// Whether an event grew past [`MAX_EVENT_BYTES`] without ending.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// What remains at the end of the stream (an event with no terminating blank line).
    pub fn finish(&mut self) -> Bytes {
        self.pending.split().freeze()
    }
}

/// The end (exclusive) of the last complete event in `buf`, searching from `from`.
fn last_event_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut end = None;
    let mut i = from;
    while let Some(pos) = memchr::memchr(b'\n', &buf[i..]) {
        let nl = i + pos;
        // An event ends at "\n\n" or "\n\r\n".
        if buf.get(nl + 1) == Some(&b'\n') {
            end = Some(nl + 2);
        } else if buf.get(nl + 1) == Some(&b'\r') && buf.get(nl + 2) == Some(&b'\n') {
            end = Some(nl + 3);
        }
        i = nl + 1;
    }
    end
}

/// Characters of generated text in stream events: the JSON string values of the fields that
/// carry it (`content`, `text`, `arguments`, `partial_json`, `thinking`, `refusal`,
/// `reasoning_content`), escapes (`\n`, `\uXXXX`) counted as one character.
pub fn text_chars(events: &[u8]) -> u64 {
    const FIELDS: [&[u8]; 7] = [
        b"\"content\":\"",
        b"\"text\":\"",
        b"\"arguments\":\"",
        b"\"partial_json\":\"",
        b"\"thinking\":\"",
        b"\"refusal\":\"",
        b"\"reasoning_content\":\"",
    ];
    let mut chars = 0;
    for field in FIELDS {
        for at in memchr::memmem::find_iter(events, field) {
            chars += string_chars(&events[at + field.len()..]);
        }
    }
    chars
}

/// Characters of a JSON string's body up to its closing quote.
fn string_chars(body: &[u8]) -> u64 {
    let mut chars = 0;
    let mut i = 0;
    while i < body.len() {
        match body[i] {
            b'"' => break,
            // An escape is one character: `\uXXXX` as well as `\n`.
            b'\\' if body.get(i + 1) == Some(&b'u') => i += 5,
            b'\\' => i += 1,
            // UTF-8 continuation bytes are part of the character before them.
            b if b & 0xC0 == 0x80 => {
                i += 1;
                continue;
            }
            _ => {}
        }
        chars += 1;
        i += 1;
    }
    chars
}

/// The `data:` payloads of whole events, joined per event with `\n` as the SSE spec says.
pub fn event_data(events: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut current: Option<Vec<u8>> = None;
    for line in events.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            if let Some(data) = current.take() {
                out.push(data);
            }
            continue;
        }
        if let Some(value) = line.strip_prefix(b"data:") {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            match &mut current {
                Some(data) => {
                    data.push(b'\n');
                    data.extend_from_slice(value);
                }
                None => current = Some(value.to_vec()),
            }
        }
    }
    if let Some(data) = current {
        out.push(data);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &[u8] =
        b"data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\n: comment\n\ndata: [DONE]\n\n";

    #[test]
    fn any_split_yields_the_same_events() {
        let whole = {
            let mut s = EventSplitter::default();
            let out = s.push(STREAM);
            assert!(s.finish().is_empty());
            out
        };
        assert_eq!(&whole[..], STREAM);
        for cut1 in 0..STREAM.len() {
            for cut2 in cut1..STREAM.len() {
                let mut s = EventSplitter::default();
                let mut got = Vec::new();
                for part in [&STREAM[..cut1], &STREAM[cut1..cut2], &STREAM[cut2..]] {
                    let events = s.push(part);
                    // Only whole events come out.
                    assert!(
                        events.is_empty()
                            || events.ends_with(b"\n\n")
                            || events.ends_with(b"\r\n\r\n")
                    );
                    got.extend_from_slice(&events);
                }
                assert_eq!(got, STREAM, "cuts {cut1} {cut2}");
            }
        }
    }

    #[test]
    fn data_payloads() {
        let data = event_data(STREAM);
        assert_eq!(
            data,
            vec![
                b"{\"a\":1}".to_vec(),
                b"{\"b\":2}".to_vec(),
                b"[DONE]".to_vec()
            ]
        );
        assert_eq!(event_data(b"data: a\ndata: b\n\n"), vec![b"a\nb".to_vec()]);
    }

    #[test]
    fn an_event_that_never_ends_is_dropped_at_the_cap() {
        let mut s = EventSplitter::default();
        assert_eq!(&s.push(b"data: {\"a\":1}\n\n")[..], b"data: {\"a\":1}\n\n");
        let piece = vec![b'x'; 1024 * 1024];
        let mut fed = 0;
        while !s.overflowed() {
            assert!(s.push(&piece).is_empty());
            fed += piece.len();
            assert!(fed <= MAX_EVENT_BYTES + piece.len(), "never overflowed");
        }
        // Nothing is held or taken afterwards, even a whole event.
        assert!(s.pending.is_empty());
        assert!(s.push(b"\n\ndata: b\n\n").is_empty());
        assert!(s.finish().is_empty());
    }

    #[test]
    fn generated_text_is_counted_in_characters() {
        let events = "data: {\"choices\":[{\"delta\":{\"content\":\"héllo \\\"x\\\"\"}}]}\n\n\
                      data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}}]}\n\n\
                      data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"a\\u00e9b\"}}\n\n";
        // "héllo \"x\"" is 9 characters, "{}" 2, "a\u00e9b" 3.
        assert_eq!(text_chars(events.as_bytes()), 14);
        assert_eq!(
            text_chars(b"data: {\"usage\":{\"prompt_tokens\":3}}\n\n"),
            0
        );
    }

    proptest::proptest! {
        #[test]
        fn any_split_of_any_stream_gives_the_same_events(
            stream in proptest::collection::vec(
                proptest::sample::select(b"data: x\n\r:{}".to_vec()), 0..200),
            cuts in proptest::collection::vec(0usize..200, 0..8),
        ) {
            let mut whole = EventSplitter::default();
            let mut expected = whole.push(&stream).to_vec();
            expected.extend_from_slice(&whole.finish());
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(stream.len())).collect();
            cuts.sort_unstable();
            let mut split = EventSplitter::default();
            let mut got = Vec::new();
            let mut from = 0;
            for cut in cuts.into_iter().chain([stream.len()]) {
                let events = split.push(&stream[from..cut]);
                proptest::prop_assert!(
                    events.is_empty() || events.ends_with(b"\n\n") || events.ends_with(b"\n\r\n")
                );
                got.extend_from_slice(&events);
                from = cut;
            }
            got.extend_from_slice(&split.finish());
            proptest::prop_assert_eq!(got, expected);
        }
    }
}
