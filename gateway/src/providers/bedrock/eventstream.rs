//! AWS event stream framing (`application/vnd.amazon.eventstream`), the binary framing of
//! Bedrock's ConverseStream answers.
//!
//! A frame: total length (u32 BE, the whole frame), headers length (u32 BE), CRC32 of those 8
//! bytes, the headers, the payload, and a CRC32 of everything before it. A header: name length
//! (u8), name, value type (u8), value. Both CRCs are checked; a frame longer than [`MAX_FRAME`]
//! is refused. Network reads may cut a frame anywhere: partial frames are held until complete.

use std::fmt;

/// The longest frame accepted (16 MiB); longer means a corrupt length or a hostile peer.
pub const MAX_FRAME: usize = 16 * 1024 * 1024;
/// Total length, headers length, prelude CRC.
const PRELUDE: usize = 12;
/// A frame with no headers and no payload: the prelude and the message CRC.
const MIN_FRAME: usize = PRELUDE + 4;

/// Why a stream cannot be read any further.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    PreludeCrc,
    MessageCrc,
    TooLong(usize),
    BadLength(String),
    BadHeader(String),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::PreludeCrc => f.write_str("a frame's prelude CRC does not match"),
            FrameError::MessageCrc => f.write_str("a frame's message CRC does not match"),
            FrameError::TooLong(n) => write!(
                f,
                "a frame of {n} bytes is longer than the {MAX_FRAME} accepted"
            ),
            FrameError::BadLength(why) | FrameError::BadHeader(why) => f.write_str(why),
        }
    }
}

/// One decoded frame: its string-valued headers (headers of other types are skipped) and its
/// payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

impl Message {
    /// The value of a string header (`:message-type`, `:event-type`...).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Cuts frames out of a byte stream read by read.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    /// Where the next frame starts in `buf`; the bytes before it are consumed.
    start: usize,
}

impl FrameDecoder {
    /// Adds a network read.
    pub fn push(&mut self, read: &[u8]) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(read);
    }

    /// Whether bytes of an incomplete frame are held.
    pub fn has_partial(&self) -> bool {
        self.start < self.buf.len()
    }

    /// The next complete frame, `None` when more bytes are needed. After an error the stream
    /// cannot be resynchronised: the caller stops reading it.
    pub fn next_message(&mut self) -> Result<Option<Message>, FrameError> {
        let rest = &self.buf[self.start..];
        if rest.len() < PRELUDE {
            return Ok(None);
        }
        let total = be_len(&rest[0..4]);
        let headers_len = be_len(&rest[4..8]);
        // The prelude is checked before waiting for the rest: a corrupt length must not make
        // the decoder wait for (and buffer) bytes that will never form a frame.
        if crc32fast::hash(&rest[..8]) != crc_at(&rest[8..12]) {
            return Err(FrameError::PreludeCrc);
        }
        if total > MAX_FRAME {
            return Err(FrameError::TooLong(total));
        }
        if total < MIN_FRAME || headers_len > total - MIN_FRAME {
            return Err(FrameError::BadLength(format!(
                "a frame of {total} bytes cannot hold {headers_len} bytes of headers"
            )));
        }
        if rest.len() < total {
            return Ok(None);
        }
        let frame = &rest[..total];
        let (body, crc) = frame.split_at(total - 4);
        if crc32fast::hash(body) != crc_at(crc) {
            return Err(FrameError::MessageCrc);
        }
        let headers = parse_headers(&body[PRELUDE..PRELUDE + headers_len])?;
        let payload = body[PRELUDE + headers_len..].to_vec();
        self.start += total;
        Ok(Some(Message { headers, payload }))
    }
}

/// A big-endian CRC32 field.
fn crc_at(b: &[u8]) -> u32 {
    b.iter().fold(0u32, |n, byte| (n << 8) | u32::from(*byte))
}

/// A big-endian length field (u32 or u16).
fn be_len(b: &[u8]) -> usize {
    b.iter()
        .fold(0usize, |n, byte| (n << 8) | usize::from(*byte))
}

/// Takes the next `n` bytes of a header block.
fn take<'a>(block: &mut &'a [u8], n: usize) -> Result<&'a [u8], FrameError> {
    if block.len() < n {
        return Err(FrameError::BadHeader(
            "a frame's headers are cut short".into(),
        ));
    }
    let (head, tail) = block.split_at(n);
    *block = tail;
    Ok(head)
}

/// The string headers of a header block; values of the other types are skipped by their length.
fn parse_headers(mut block: &[u8]) -> Result<Vec<(String, String)>, FrameError> {
    let mut headers = Vec::new();
    while !block.is_empty() {
        let name_len = usize::from(take(&mut block, 1)?[0]);
        let name = String::from_utf8_lossy(take(&mut block, name_len)?).into_owned();
        let kind = take(&mut block, 1)?[0];
        let fixed = match kind {
            0 | 1 => Some(0), // bool true / false: no value bytes
            2 => Some(1),     // byte
            3 => Some(2),     // short
            4 => Some(4),     // int
            5 | 8 => Some(8), // long, timestamp
            9 => Some(16),    // uuid
            6 | 7 => None,    // bytes, string: u16 length first
            other => {
                return Err(FrameError::BadHeader(format!(
                    "header {name:?} has the unknown value type {other}"
                )))
            }
        };
        match fixed {
            Some(n) => {
                take(&mut block, n)?;
            }
            None => {
                let len = be_len(take(&mut block, 2)?);
                let value = take(&mut block, len)?;
                if kind == 7 {
                    headers.push((name, String::from_utf8_lossy(value).into_owned()));
                }
            }
        }
    }
    Ok(headers)
}

/// Test-only encoder: frames built the way AWS builds them.
#[cfg(test)]
pub mod testing {
    /// A header of any type: name, type byte and value bytes (with the u16 length for types 6
    /// and 7 already included).
    pub fn header(name: &str, kind: u8, value: &[u8]) -> Vec<u8> {
        let mut out = vec![u8::try_from(name.len()).unwrap()];
        out.extend_from_slice(name.as_bytes());
        out.push(kind);
        out.extend_from_slice(value);
        out
    }

    /// A string header.
    pub fn string_header(name: &str, value: &str) -> Vec<u8> {
        let mut v = u16::try_from(value.len()).unwrap().to_be_bytes().to_vec();
        v.extend_from_slice(value.as_bytes());
        header(name, 7, &v)
    }

    /// A frame from a raw header block and a payload, with correct CRCs.
    pub fn raw_frame(headers: &[u8], payload: &[u8]) -> Vec<u8> {
        let total = u32::try_from(12 + headers.len() + payload.len() + 4).unwrap();
        let mut out = total.to_be_bytes().to_vec();
        out.extend_from_slice(&u32::try_from(headers.len()).unwrap().to_be_bytes());
        let prelude_crc = crc32fast::hash(&out);
        out.extend_from_slice(&prelude_crc.to_be_bytes());
        out.extend_from_slice(headers);
        out.extend_from_slice(payload);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    /// A frame with string headers.
    pub fn frame(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
        let block: Vec<u8> = headers
            .iter()
            .flat_map(|(n, v)| string_header(n, v))
            .collect();
        raw_frame(&block, payload)
    }

    /// A Bedrock `event` frame.
    pub fn event(event_type: &str, payload: &str) -> Vec<u8> {
        frame(
            &[
                (":event-type", event_type),
                (":content-type", "application/json"),
                (":message-type", "event"),
            ],
            payload.as_bytes(),
        )
    }

    /// A Bedrock `exception` frame.
    pub fn exception(exception_type: &str, message: &str) -> Vec<u8> {
        let payload = serde_json::json!({ "message": message }).to_string();
        frame(
            &[
                (":exception-type", exception_type),
                (":content-type", "application/json"),
                (":message-type", "exception"),
            ],
            payload.as_bytes(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    fn decode_all(reads: &[&[u8]]) -> (Vec<Message>, Option<FrameError>) {
        let mut d = FrameDecoder::default();
        let mut out = Vec::new();
        for read in reads {
            d.push(read);
            loop {
                match d.next_message() {
                    Ok(Some(m)) => out.push(m),
                    Ok(None) => break,
                    Err(e) => return (out, Some(e)),
                }
            }
        }
        (out, None)
    }

    #[test]
    fn frames_decode_whatever_the_reads() {
        let mut bytes = event("messageStart", r#"{"role":"assistant"}"#);
        bytes.extend(frame(&[], b""));
        bytes.extend(exception("throttlingException", "slow down"));
        let (whole, err) = decode_all(&[&bytes]);
        assert_eq!(err, None);
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[0].header(":event-type"), Some("messageStart"));
        assert_eq!(whole[0].header(":message-type"), Some("event"));
        assert_eq!(whole[0].payload, br#"{"role":"assistant"}"#);
        assert_eq!(
            whole[1],
            Message {
                headers: vec![],
                payload: vec![]
            }
        );
        assert_eq!(
            whole[2].header(":exception-type"),
            Some("throttlingException")
        );
        // Every cut point, and every read size.
        for cut in 0..=bytes.len() {
            let (split, err) = decode_all(&[&bytes[..cut], &bytes[cut..]]);
            assert_eq!((split, err), (whole.clone(), None), "cut at {cut}");
        }
        for step in 1..=17 {
            let reads: Vec<&[u8]> = bytes.chunks(step).collect();
            assert_eq!(decode_all(&reads).0, whole, "reads of {step}");
        }
        let mut d = FrameDecoder::default();
        d.push(&bytes[..5]);
        assert_eq!(d.next_message(), Ok(None));
        assert!(d.has_partial());
        d.push(&bytes[5..]);
        while let Ok(Some(_)) = d.next_message() {}
        assert!(!d.has_partial());
    }

    #[test]
    fn headers_of_every_type_are_skipped_or_read() {
        let mut block = Vec::new();
        block.extend(header("t", 0, &[]));
        block.extend(header("f", 1, &[]));
        block.extend(header("b", 2, &[7]));
        block.extend(header("s", 3, &[0, 7]));
        block.extend(header("i", 4, &[0, 0, 0, 7]));
        block.extend(header("l", 5, &[0; 8]));
        block.extend(header("bytes", 6, &[0, 3, 1, 2, 3]));
        block.extend(header("ts", 8, &[0; 8]));
        block.extend(header("uuid", 9, &[0; 16]));
        block.extend(string_header(":event-type", "metadata"));
        let (msgs, err) = decode_all(&[&raw_frame(&block, b"{}")]);
        assert_eq!(err, None);
        assert_eq!(
            msgs[0].headers,
            vec![(":event-type".to_owned(), "metadata".to_owned())]
        );
        assert_eq!(msgs[0].payload, b"{}");

        let bad_type = header("x", 10, &[]);
        let (_, err) = decode_all(&[&raw_frame(&bad_type, b"")]);
        assert!(matches!(err, Some(FrameError::BadHeader(_))), "{err:?}");
        let cut = string_header("x", "long value");
        let (_, err) = decode_all(&[&raw_frame(&cut[..cut.len() - 2], b"")]);
        assert!(matches!(err, Some(FrameError::BadHeader(_))), "{err:?}");
    }

    #[test]
    fn corrupt_frames_are_errors() {
        let good = event("messageStop", r#"{"stopReason":"end_turn"}"#);

        let mut bad = good.clone();
        bad[2] ^= 1; // the total length: the prelude CRC no longer matches
        assert_eq!(decode_all(&[&bad]).1, Some(FrameError::PreludeCrc));

        let mut bad = good.clone();
        let n = bad.len();
        bad[n - 6] ^= 0x20; // a payload byte
        assert_eq!(decode_all(&[&bad]).1, Some(FrameError::MessageCrc));

        // An error stops at the bad frame; the good frame before it was read.
        let mut two = good.clone();
        two.extend(bad);
        let (msgs, err) = decode_all(&[&two]);
        assert_eq!((msgs.len(), err), (1, Some(FrameError::MessageCrc)));

        // A huge length (with a valid prelude CRC) is refused at once, not buffered for.
        let mut huge = u32::try_from(MAX_FRAME + 1).unwrap().to_be_bytes().to_vec();
        huge.extend_from_slice(&0u32.to_be_bytes());
        let crc = crc32fast::hash(&huge);
        huge.extend_from_slice(&crc.to_be_bytes());
        assert_eq!(
            decode_all(&[&huge]).1,
            Some(FrameError::TooLong(MAX_FRAME + 1))
        );

        // Headers longer than the frame.
        let mut lying = 16u32.to_be_bytes().to_vec();
        lying.extend_from_slice(&1u32.to_be_bytes());
        let crc = crc32fast::hash(&lying);
        lying.extend_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            decode_all(&[&lying]).1,
            Some(FrameError::BadLength(_))
        ));
    }
}
