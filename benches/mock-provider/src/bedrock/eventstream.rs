//! `application/vnd.amazon.eventstream` framing, as Bedrock's streaming
//! responses use it.
//!
//! One message:
//!
//! ```text
//! total length (u32 BE) | headers length (u32 BE) | CRC32 of those 8 bytes (u32 BE)
//! headers | payload | CRC32 of everything before (u32 BE)
//! ```
//!
//! Each header is its name length (u8), the name, the value type (7 for a
//! string) and, for strings, the value length (u16 BE) and the value. The
//! mock only sends string headers.

use bytes::Bytes;
use serde::Serialize;

/// The prelude (two lengths and their CRC) plus the trailing message CRC.
const OVERHEAD: usize = 16;
/// Header value type of a UTF-8 string.
const STRING: u8 = 7;
/// Source of the `p` padding field real events carry (AWS pads payloads
/// with a random-length string so their size says little about the text).
const PADDING: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/// Encodes one message with string `headers` and `payload`.
pub(crate) fn frame(headers: &[(&str, &str)], payload: &[u8]) -> Bytes {
    let headers_len: usize = headers
        .iter()
        .map(|(name, value)| 1 + name.len() + 1 + 2 + value.len())
        .sum();
    let total = OVERHEAD + headers_len + payload.len();
    let mut buf = Vec::with_capacity(total);
    // Frames are a few hundred bytes; u32 lengths cannot overflow here, nor
    // can the header names (fixed, short) and values (short) overflow u8/u16.
    buf.extend_from_slice(&(total as u32).to_be_bytes());
    buf.extend_from_slice(&(headers_len as u32).to_be_bytes());
    let prelude_crc = crc32fast::hash(&buf);
    buf.extend_from_slice(&prelude_crc.to_be_bytes());
    for (name, value) in headers {
        buf.push(name.len() as u8);
        buf.extend_from_slice(name.as_bytes());
        buf.push(STRING);
        buf.extend_from_slice(&(value.len() as u16).to_be_bytes());
        buf.extend_from_slice(value.as_bytes());
    }
    buf.extend_from_slice(payload);
    let message_crc = crc32fast::hash(&buf);
    buf.extend_from_slice(&message_crc.to_be_bytes());
    Bytes::from(buf)
}

/// An event message: `:event-type` `event_type`, a JSON payload.
pub(crate) fn event(event_type: &str, payload: &[u8]) -> Bytes {
    frame(
        &[
            (":event-type", event_type),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload,
    )
}

/// An exception message: `:exception-type` `exception_type` (such as
/// `throttlingException`), payload `{"message": message}`.
pub(crate) fn exception(exception_type: &str, message: &str) -> Bytes {
    #[derive(Serialize)]
    struct Body<'a> {
        message: &'a str,
    }
    let payload = serde_json::to_vec(&Body { message }).unwrap_or_default();
    frame(
        &[
            (":exception-type", exception_type),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        &payload,
    )
}

/// `value` (a struct or map) serialized with a `p` padding field added.
/// `seq` varies the padding's length from event to event, as AWS's does.
pub(crate) fn padded_json<T: Serialize>(value: &T, seq: usize) -> Vec<u8> {
    #[derive(Serialize)]
    struct Padded<'a, T> {
        #[serde(flatten)]
        value: &'a T,
        p: &'static str,
    }
    let len = 1 + (seq * 7) % PADDING.len();
    let p = &PADDING[..len];
    serde_json::to_vec(&Padded { value, p }).unwrap_or_else(|_| b"{}".to_vec())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A decoded message: string headers and payload.
    #[derive(Debug)]
    pub(crate) struct Message {
        pub(crate) headers: Vec<(String, String)>,
        pub(crate) payload: Vec<u8>,
    }

    impl Message {
        pub(crate) fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        }
    }

    fn be32(bytes: &[u8]) -> u32 {
        u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }

    /// Decodes a stream of messages, checking both CRCs and the lengths.
    pub(crate) fn decode(mut buf: &[u8]) -> Vec<Message> {
        let mut out = Vec::new();
        while !buf.is_empty() {
            let total = be32(&buf[0..4]) as usize;
            let headers_len = be32(&buf[4..8]) as usize;
            assert_eq!(be32(&buf[8..12]), crc32fast::hash(&buf[..8]), "prelude CRC");
            assert!(total >= OVERHEAD + headers_len && total <= buf.len());
            let (message, rest) = buf.split_at(total);
            assert_eq!(
                be32(&message[total - 4..]),
                crc32fast::hash(&message[..total - 4]),
                "message CRC"
            );
            let mut h = &message[12..12 + headers_len];
            let mut headers = Vec::new();
            while !h.is_empty() {
                let name_len = h[0] as usize;
                let name = String::from_utf8(h[1..1 + name_len].to_vec()).unwrap();
                assert_eq!(h[1 + name_len], STRING);
                let at = 2 + name_len;
                let value_len = u16::from_be_bytes([h[at], h[at + 1]]) as usize;
                let value = String::from_utf8(h[at + 2..at + 2 + value_len].to_vec()).unwrap();
                headers.push((name, value));
                h = &h[at + 2 + value_len..];
            }
            let payload = message[12 + headers_len..total - 4].to_vec();
            out.push(Message { headers, payload });
            buf = rest;
        }
        out
    }

    /// Two messages from a published encoder example, byte for byte: one
    /// without headers, one with a `content-type` string header.
    #[test]
    fn matches_known_encodings() {
        let payload = br#"{"foo": "bar"}"#;
        let mut expected = vec![0, 0, 0, 30, 0, 0, 0, 0, 186, 242, 246, 138];
        expected.extend_from_slice(payload);
        expected.extend_from_slice(&[174, 114, 88, 228]);
        assert_eq!(frame(&[], payload).as_ref(), expected.as_slice());

        let mut expected = vec![0, 0, 0, 62, 0, 0, 0, 32, 64, 93, 249, 70, 12];
        expected.extend_from_slice(b"content-type");
        expected.extend_from_slice(&[7, 0, 16]);
        expected.extend_from_slice(b"application/json");
        expected.extend_from_slice(payload);
        expected.extend_from_slice(&[111, 162, 191, 59]);
        assert_eq!(
            frame(&[("content-type", "application/json")], payload).as_ref(),
            expected.as_slice()
        );
    }

    #[test]
    fn events_decode_back() {
        let mut stream = event("messageStart", br#"{"role":"assistant"}"#).to_vec();
        stream.extend_from_slice(&exception("throttlingException", "slow down"));
        let messages = decode(&stream);
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0].header(":event-type"), Some("messageStart"));
        assert_eq!(messages[0].header(":message-type"), Some("event"));
        assert_eq!(
            messages[0].header(":content-type"),
            Some("application/json")
        );
        assert_eq!(messages[0].payload, br#"{"role":"assistant"}"#);
        assert_eq!(
            messages[1].header(":exception-type"),
            Some("throttlingException")
        );
        assert_eq!(messages[1].header(":message-type"), Some("exception"));
        assert_eq!(messages[1].payload, br#"{"message":"slow down"}"#);
    }

    #[test]
    fn padding_is_a_field() {
        #[derive(Serialize)]
        struct Start {
            role: &'static str,
        }
        let json: serde_json::Value =
            serde_json::from_slice(&padded_json(&Start { role: "assistant" }, 3)).unwrap();
        assert_eq!(json["role"], "assistant");
        assert!(json["p"].as_str().is_some_and(|p| !p.is_empty()));
    }
}
