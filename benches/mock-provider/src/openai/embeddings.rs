//! `POST /embeddings`: deterministic vectors derived from an FNV-1a hash of
//! each input and the position in the vector.

use http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{parse_json, ApiError, HandlerResult, Str};
use crate::body;
use crate::server::Ctx;
use crate::text;

/// Vector length when the request has no `dimensions`.
const DEFAULT_DIMENSIONS: u64 = 8;
const MAX_DIMENSIONS: u64 = 4096;
/// Most inputs in one request, as in OpenAI's API.
const MAX_INPUTS: usize = 2048;
const DEFAULT_MODEL: &str = "text-embedding-mock";

#[derive(Deserialize)]
struct EmbeddingsRequest<'a> {
    input: Value,
    #[serde(borrow, default)]
    model: Option<Str<'a>>,
    #[serde(default)]
    dimensions: Option<u64>,
    #[serde(borrow, default)]
    encoding_format: Option<Str<'a>>,
}

/// One thing to embed.
enum Item<'v> {
    Text(&'v str),
    Tokens(Vec<u64>),
}

impl Item<'_> {
    /// Words for text, number of tokens for token arrays.
    fn token_count(&self) -> u64 {
        match self {
            Item::Text(text) => text::word_count(text) as u64,
            Item::Tokens(tokens) => tokens.len() as u64,
        }
    }

    fn hash(&self) -> u64 {
        match self {
            Item::Text(text) => fnv1a(FNV_OFFSET, text.as_bytes()),
            Item::Tokens(tokens) => tokens
                .iter()
                .fold(FNV_OFFSET, |h, t| fnv1a(h, &t.to_le_bytes())),
        }
    }
}

#[derive(Serialize)]
struct EmbeddingList<'a> {
    object: &'static str,
    data: Vec<Embedding>,
    model: &'a str,
    usage: Usage,
}

#[derive(Serialize)]
struct Embedding {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector {
    Floats(Vec<f32>),
    Base64(String),
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: u64,
    total_tokens: u64,
}

pub(super) fn handle(_ctx: &Ctx<'_>, body: &[u8]) -> HandlerResult {
    let req: EmbeddingsRequest<'_> = parse_json(body)?;
    let dimensions = req.dimensions.unwrap_or(DEFAULT_DIMENSIONS);
    if dimensions == 0 || dimensions > MAX_DIMENSIONS {
        return Err(ApiError::invalid_param(
            "dimensions",
            format!("'dimensions' must be between 1 and {MAX_DIMENSIONS}, got {dimensions}"),
        ));
    }
    let base64 = match req.encoding_format.as_ref().map(Str::as_str) {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "encoding_format",
                format!("'encoding_format' must be 'float' or 'base64', got '{other}'"),
            ))
        }
    };
    let items = parse_input(&req.input)?;
    let mut tokens = 0u64;
    let data = items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            tokens += item.token_count();
            let vector = vector(item.hash(), dimensions);
            let embedding = if base64 {
                Vector::Base64(encode_f32_base64(&vector))
            } else {
                Vector::Floats(vector)
            };
            Embedding {
                object: "embedding",
                index,
                embedding,
            }
        })
        .collect();
    let list = EmbeddingList {
        object: "list",
        data,
        model: req.model.as_ref().map_or(DEFAULT_MODEL, Str::as_str),
        usage: Usage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    };
    Ok(body::json(StatusCode::OK, &list))
}

/// Accepts a string, an array of strings, one token array, or an array of
/// token arrays.
fn parse_input(input: &Value) -> Result<Vec<Item<'_>>, ApiError> {
    let invalid = || {
        ApiError::invalid_param(
            "input",
            "'input' must be a string, an array of strings, an array of integers, \
             or an array of integer arrays",
        )
    };
    let items = match input {
        Value::String(text) => vec![Item::Text(text)],
        Value::Array(values) if values.is_empty() => {
            return Err(ApiError::invalid_param(
                "input",
                "'input' must not be empty",
            ))
        }
        Value::Array(values) => match &values[0] {
            Value::String(_) => values
                .iter()
                .map(|v| v.as_str().map(Item::Text).ok_or_else(invalid))
                .collect::<Result<_, _>>()?,
            Value::Number(_) => vec![Item::Tokens(tokens(values).ok_or_else(invalid)?)],
            Value::Array(_) => values
                .iter()
                .map(|v| {
                    v.as_array()
                        .and_then(|a| tokens(a))
                        .map(Item::Tokens)
                        .ok_or_else(invalid)
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(invalid()),
        },
        _ => return Err(invalid()),
    };
    if items.len() > MAX_INPUTS {
        return Err(ApiError::invalid_param(
            "input",
            format!("at most {MAX_INPUTS} inputs are allowed"),
        ));
    }
    Ok(items)
}

fn tokens(values: &[Value]) -> Option<Vec<u64>> {
    values.iter().map(Value::as_u64).collect()
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// The vector this route returns for the text input `text`; the other
/// wire formats' embedding routes use it too, so a text embeds the same
/// whichever format asks.
pub(crate) fn text_vector(text: &str, dimensions: u64) -> Vec<f32> {
    vector(Item::Text(text).hash(), dimensions)
}

/// `dimensions` values in [-1, 1], one per position, from the item hash.
fn vector(item_hash: u64, dimensions: u64) -> Vec<f32> {
    (0..dimensions)
        .map(|pos| {
            let h = mix(fnv1a(item_hash, &pos.to_le_bytes()));
            // Top 24 bits give an exact f32 in [0, 1).
            let unit = (h >> 40) as f32 / (1u64 << 24) as f32;
            unit * 2.0 - 1.0
        })
        .collect()
}

/// SplitMix64 finalizer: FNV alone barely changes the high bits for
/// inputs that differ only in the last bytes.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Standard base64 (with padding) of the little-endian bytes of `values`,
/// as OpenAI's `encoding_format: "base64"` returns.
fn encode_f32_base64(values: &[f32]) -> String {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    base64(&bytes)
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let sextet = |shift: u32| char::from(ALPHABET[((n >> shift) & 63) as usize]);
        out.push(sextet(18));
        out.push(sextet(12));
        out.push(if chunk.len() > 1 { sextet(6) } else { '=' });
        out.push(if chunk.len() > 2 { sextet(0) } else { '=' });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (input, expected) in cases {
            assert_eq!(base64(input.as_bytes()), expected);
        }
    }

    #[test]
    fn vectors_are_deterministic_and_bounded() {
        let a = vector(Item::Text("hello").hash(), 64);
        assert_eq!(a, vector(Item::Text("hello").hash(), 64));
        assert_ne!(a, vector(Item::Text("hellp").hash(), 64));
        assert!(a.iter().all(|v| (-1.0..=1.0).contains(v)));
    }
}
