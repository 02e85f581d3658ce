//! What is stored, how it is framed as bytes, and the one trait both backends implement.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};

use super::key::CacheKey;

/// A stored answer: always a 2xx, in the client's wire format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub status: u16,
    pub content_type: String,
    /// The body is a server-sent event stream (as relayed), not a complete JSON answer.
    pub sse: bool,
    /// An SSE chat stream that holds a usage chunk (`stream_options.include_usage`).
    pub usage_chunk: bool,
    /// When it was stored, in milliseconds since the Unix epoch: a request whose `max_age` is
    /// shorter than the entry's age is not answered from it.
    pub stored_at_ms: u64,
    /// The provider and model that answered, for the request log of a hit.
    pub provider: Option<String>,
    pub model: Option<String>,
    pub body: Bytes,
}

/// The first bytes of every framed entry; the digit is the framing's version.
const MAGIC: &[u8; 4] = b"GWC1";
const FLAG_SSE: u8 = 1;
const FLAG_USAGE_CHUNK: u8 = 2;

impl Entry {
    /// Bytes the entry holds, as the memory backend weighs it (body, strings and a fixed
    /// overhead for the key and bookkeeping).
    pub fn weight(&self) -> usize {
        self.body.len()
            + self.content_type.len()
            + self.provider.as_ref().map_or(0, String::len)
            + self.model.as_ref().map_or(0, String::len)
            + 128
    }

    /// The entry as bytes (the Redis value):
    ///
    /// ```text
    /// "GWC1" | flags u8 (1: sse, 2: usage chunk) | status u16 | stored_at_ms u64
    ///        | content-type, provider, model: each u16 length + UTF-8 (provider and model:
    ///          0xFFFF for none) | body: the rest
    /// ```
    ///
    /// Integers are big-endian. Strings longer than 65534 bytes are cut (they are header
    /// values and names, never that long).
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(self.weight());
        out.extend_from_slice(MAGIC);
        let mut flags = 0;
        if self.sse {
            flags |= FLAG_SSE;
        }
        if self.usage_chunk {
            flags |= FLAG_USAGE_CHUNK;
        }
        out.extend_from_slice(&[flags]);
        out.extend_from_slice(&self.status.to_be_bytes());
        out.extend_from_slice(&self.stored_at_ms.to_be_bytes());
        put_str(&mut out, Some(&self.content_type));
        put_str(&mut out, self.provider.as_deref());
        put_str(&mut out, self.model.as_deref());
        out.extend_from_slice(&self.body);
        out.freeze()
    }

    /// Reads an entry framed by [`Entry::encode`].
    pub fn decode(bytes: Bytes) -> Result<Entry, StoreError> {
        let corrupt = |why: &str| StoreError(format!("stored entry is corrupt: {why}"));
        if bytes.len() < 4 + 1 + 2 + 8 || &bytes[..4] != MAGIC {
            return Err(corrupt("unknown framing"));
        }
        let flags = bytes[4];
        let status = u16::from_be_bytes([bytes[5], bytes[6]]);
        let mut at = [0u8; 8];
        at.copy_from_slice(&bytes[7..15]);
        let stored_at_ms = u64::from_be_bytes(at);
        let mut pos = 15;
        let content_type = get_str(&bytes, &mut pos)
            .map_err(corrupt)?
            .ok_or_else(|| corrupt("no content type"))?;
        let provider = get_str(&bytes, &mut pos).map_err(corrupt)?;
        let model = get_str(&bytes, &mut pos).map_err(corrupt)?;
        if !(200..300).contains(&status) {
            return Err(corrupt("not a 2xx status"));
        }
        Ok(Entry {
            status,
            content_type,
            sse: flags & FLAG_SSE != 0,
            usage_chunk: flags & FLAG_USAGE_CHUNK != 0,
            stored_at_ms,
            provider,
            model,
            body: bytes.slice(pos..),
        })
    }
}

const NONE_LEN: u16 = u16::MAX;

fn put_str(out: &mut BytesMut, s: Option<&str>) {
    match s {
        None => out.extend_from_slice(&NONE_LEN.to_be_bytes()),
        Some(s) => {
            let mut end = s.len().min(usize::from(NONE_LEN - 1));
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            // `end` is at most 65534, so the cast keeps it.
            out.extend_from_slice(&(end as u16).to_be_bytes());
            out.extend_from_slice(&s.as_bytes()[..end]);
        }
    }
}

fn get_str(bytes: &[u8], pos: &mut usize) -> Result<Option<String>, &'static str> {
    let len_bytes = bytes.get(*pos..*pos + 2).ok_or("truncated")?;
    let len = u16::from_be_bytes([len_bytes[0], len_bytes[1]]);
    *pos += 2;
    if len == NONE_LEN {
        return Ok(None);
    }
    let s = bytes
        .get(*pos..*pos + usize::from(len))
        .ok_or("truncated")?;
    *pos += usize::from(len);
    String::from_utf8(s.to_vec())
        .map(Some)
        .map_err(|_| "a string is not UTF-8")
}

/// A backend failure: the lookup counts as a miss, the store is skipped, the request goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where entries are kept: in-process memory or Redis.
#[async_trait]
pub trait CacheStore: Send + Sync + 'static {
    /// `memory` or `redis`, for logs.
    fn name(&self) -> &'static str;

    /// The Redis store, whose lookup may join shared mode's admission
    /// ([`crate::limits::admission`]) and whose writes leave the request path; `None` for the
    /// others.
    fn redis(&self) -> Option<&super::redis::RedisStore> {
        None
    }

    /// The entry under this key, if one is kept and not expired.
    async fn get(&self, key: &CacheKey) -> Result<Option<Entry>, StoreError>;

    /// Keeps the entry for `ttl`, replacing any entry under the key.
    async fn put(&self, key: &CacheKey, entry: Entry, ttl: Duration) -> Result<(), StoreError>;

    /// Stores from a synchronous phase (`on_chunk`) without waiting; `done` is told the
    /// outcome. Default: `put` on a task of the current Tokio runtime (outside one, the entry
    /// is dropped and `done` told so).
    fn put_detached(
        self: Arc<Self>,
        key: CacheKey,
        entry: Entry,
        ttl: Duration,
        done: Box<dyn FnOnce(Result<(), StoreError>) + Send>,
    ) {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let result = self.put(&key, entry, ttl).await;
                    done(result);
                });
            }
            Err(_) => done(Err(StoreError("no async runtime to store on".to_owned()))),
        }
    }
}
