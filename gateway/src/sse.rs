//! Server-sent events, split incrementally: network reads may cut an event anywhere, so bytes
//! are held until the blank line that ends an event arrives.

use bytes::{Bytes, BytesMut};

/// Splits a byte stream into whole events (each including its terminating blank line).
#[derive(Debug, Default)]
pub struct EventSplitter {
    pending: BytesMut,
}

impl EventSplitter {
    /// Adds a network read; returns the bytes of every event it completed (possibly empty).
    pub fn push(&mut self, data: &[u8]) -> Bytes {
        let scan_from = self.pending.len().saturating_sub(3);
        self.pending.extend_from_slice(data);
        match last_event_end(&self.pending, scan_from) {
            Some(end) => self.pending.split_to(end).freeze(),
            None => Bytes::new(),
        }
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
}
