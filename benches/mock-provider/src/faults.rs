//! Fault injection controls, shared by every route and wire format.
//!
//! Faults come from `x-mock-*` request headers and from one or more
//! `/x-mock/<k=v;k=v>` path prefixes; headers win over prefixes.

use std::collections::HashMap;
use std::fmt::{self, Write};
use std::sync::Mutex;
use std::time::Duration;

use http::HeaderMap;

use crate::sse::StreamFaults;

/// Path prefix that carries a fault spec, e.g. `/x-mock/status=500/v1/...`.
const PREFIX: &str = "/x-mock/";

/// Upper bound for delays, so a typo cannot park a connection forever.
const MAX_DELAY_MS: u64 = 3_600_000;
/// Upper bound for `words`, so a typo cannot exhaust memory.
pub(crate) const MAX_WORDS: u64 = 1_000_000;

/// Status used by `fail_first` when no `status` is given.
const DEFAULT_FAIL_STATUS: u16 = 503;
/// `retry-after-ms` sent with injected 429/503 when none is given.
const DEFAULT_RETRY_AFTER_MS: u64 = 10;

/// Every fault knob; `None` means not requested.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FaultSpec {
    pub status: Option<u16>,
    pub retry_after_ms: Option<u64>,
    pub delay_ms: Option<u64>,
    pub chunk_delay_ms: Option<u64>,
    pub disconnect_after: Option<u64>,
    pub words: Option<u64>,
    pub fail_first: Option<u64>,
    /// `1`: Anthropic streams send an `error` event after the first content
    /// delta and end there. `0` is the same as not set.
    pub stream_error: Option<u64>,
}

/// The knobs by name: prefix key, header name, and the field they set.
const KNOBS: [(&str, &str); 8] = [
    ("status", "x-mock-status"),
    ("retry_after_ms", "x-mock-retry-after-ms"),
    ("delay_ms", "x-mock-delay-ms"),
    ("chunk_delay_ms", "x-mock-chunk-delay-ms"),
    ("disconnect_after", "x-mock-disconnect-after"),
    ("words", "x-mock-words"),
    ("fail_first", "x-mock-fail-first"),
    ("stream_error", "x-mock-stream-error"),
];

impl FaultSpec {
    pub(crate) fn is_empty(&self) -> bool {
        *self == FaultSpec::default()
    }

    /// Sets knob `key` (a prefix key, `-` accepted for `_`) from `value`.
    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let value = value.trim();
        let number = |max: u64| -> Result<u64, String> {
            match value.parse::<u64>() {
                Ok(n) if n <= max => Ok(n),
                Ok(_) => Err(format!(
                    "fault '{key}' must be at most {max}, got '{value}'"
                )),
                Err(_) => Err(format!(
                    "fault '{key}' must be a non-negative integer, got '{value}'"
                )),
            }
        };
        match key {
            "status" => {
                let n = number(599)?;
                if n < 200 {
                    return Err(format!(
                        "fault 'status' must be between 200 and 599, got '{value}'"
                    ));
                }
                self.status = Some(n as u16);
            }
            "retry_after_ms" => self.retry_after_ms = Some(number(MAX_DELAY_MS)?),
            "delay_ms" => self.delay_ms = Some(number(MAX_DELAY_MS)?),
            "chunk_delay_ms" => self.chunk_delay_ms = Some(number(MAX_DELAY_MS)?),
            "disconnect_after" => self.disconnect_after = Some(number(u64::MAX)?),
            "words" => self.words = Some(number(MAX_WORDS)?),
            "fail_first" => self.fail_first = Some(number(u64::MAX)?),
            "stream_error" => self.stream_error = Some(number(1)?),
            _ => {
                let known: Vec<&str> = KNOBS.iter().map(|(k, _)| *k).collect();
                return Err(format!(
                    "unknown fault '{key}' (known: {})",
                    known.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// Parses one prefix spec such as `status=500;delay_ms=300`.
    fn apply_prefix(&mut self, spec: &str) -> Result<(), String> {
        let decoded;
        let spec = if spec.contains('%') {
            decoded = percent_decode(spec);
            decoded.as_str()
        } else {
            spec
        };
        for pair in spec.split([';', ',']).filter(|p| !p.trim().is_empty()) {
            let Some((key, value)) = pair.split_once('=') else {
                return Err(format!("fault prefix entry '{pair}' is not key=value"));
            };
            let key = key.trim();
            if key.contains('-') {
                self.set(&key.replace('-', "_"), value)?;
            } else {
                self.set(key, value)?;
            }
        }
        Ok(())
    }

    /// Applies `x-mock-*` headers on top of what the prefix set.
    fn apply_headers(&mut self, headers: &HeaderMap) -> Result<(), String> {
        // One pass over the headers is cheaper than a lookup per knob, and
        // most requests carry no `x-mock-*` header at all.
        for (name, value) in headers {
            let name = name.as_str();
            if !name.starts_with("x-mock-") {
                continue;
            }
            let Some(&(key, _)) = KNOBS.iter().find(|(_, header)| *header == name) else {
                continue;
            };
            let value = value
                .to_str()
                .map_err(|_| format!("header '{name}' is not valid text"))?;
            self.set(key, value)?;
        }
        Ok(())
    }

    /// Stream pacing and disconnect settings, with `disconnect_after` only
    /// when `disconnect` says this request should fail.
    pub(crate) fn stream_faults(&self, disconnect: Option<u64>) -> StreamFaults {
        StreamFaults {
            chunk_delay: self.chunk_delay_ms.map(Duration::from_millis),
            disconnect_after: disconnect,
        }
    }

    pub(crate) fn delay(&self) -> Option<Duration> {
        self.delay_ms
            .filter(|&ms| ms > 0)
            .map(Duration::from_millis)
    }
}

/// Canonical `k=v;k=v` form, used to key `fail_first` counters so that
/// requests with the same effective faults share one counter.
impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values = [
            self.status.map(u64::from),
            self.retry_after_ms,
            self.delay_ms,
            self.chunk_delay_ms,
            self.disconnect_after,
            self.words,
            self.fail_first,
            self.stream_error,
        ];
        let mut first = true;
        for ((key, _), value) in KNOBS.iter().zip(values) {
            if let Some(value) = value {
                if !first {
                    f.write_char(';')?;
                }
                first = false;
                write!(f, "{key}={value}")?;
            }
        }
        Ok(())
    }
}

/// Splits leading `/x-mock/<spec>` segments off `path`, returning the specs
/// and the remaining route path (always starting with `/`).
pub(crate) fn split_prefixes(mut path: &str) -> (Vec<&str>, &str) {
    let mut specs = Vec::new();
    while let Some(rest) = path.strip_prefix(PREFIX) {
        match rest.find('/') {
            Some(end) => {
                specs.push(&rest[..end]);
                path = &rest[end..];
            }
            None => {
                specs.push(rest);
                path = "/";
            }
        }
    }
    (specs, path)
}

/// Merges prefix specs (in order) and then headers into one spec.
pub(crate) fn parse(prefix_specs: &[&str], headers: &HeaderMap) -> Result<FaultSpec, String> {
    let mut spec = FaultSpec::default();
    for prefix in prefix_specs {
        spec.apply_prefix(prefix)?;
    }
    spec.apply_headers(headers)?;
    Ok(spec)
}

/// What should go wrong with this particular request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Failure {
    /// Answer this status with an error body.
    pub status: Option<u16>,
    /// Value for the `retry-after-ms` header of injected 429/503.
    pub retry_after_ms: u64,
    /// Abort the connection (after this many events for streams).
    pub disconnect_after: Option<u64>,
    /// End streams that support it with an in-band error event.
    pub stream_error: bool,
}

/// Per-instance `fail_first` counters keyed by fault spec and route.
#[derive(Default)]
pub(crate) struct FailCounters {
    counts: Mutex<HashMap<String, u64>>,
}

impl FailCounters {
    /// Decides whether this request fails. Without `fail_first` the
    /// requested status/disconnect/stream error always apply; with it they
    /// apply (status defaulting to 503 when neither a disconnect nor a
    /// stream error is asked for) only to the first N requests with the same
    /// spec and route, and later ones succeed.
    pub(crate) fn failure(&self, spec: &FaultSpec, route: &str) -> Failure {
        let retry_after_ms = spec.retry_after_ms.unwrap_or(DEFAULT_RETRY_AFTER_MS);
        let stream_error = spec.stream_error.is_some_and(|v| v > 0);
        let Some(limit) = spec.fail_first else {
            return Failure {
                status: spec.status,
                retry_after_ms,
                disconnect_after: spec.disconnect_after,
                stream_error,
            };
        };
        let key = format!("{spec}|{route}");
        let seen = {
            let mut counts = self
                .counts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let count = counts.entry(key).or_insert(0);
            let seen = *count;
            *count = count.saturating_add(1);
            seen
        };
        if seen >= limit {
            return Failure {
                status: None,
                retry_after_ms,
                disconnect_after: None,
                stream_error: false,
            };
        }
        let status = match (spec.status, spec.disconnect_after.is_some() || stream_error) {
            (Some(status), _) => Some(status),
            (None, true) => None,
            (None, false) => Some(DEFAULT_FAIL_STATUS),
        };
        Failure {
            status,
            retry_after_ms,
            disconnect_after: spec.disconnect_after,
            stream_error,
        }
    }
}

/// Decodes `%XX` escapes; malformed escapes are kept as they are.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((hi * 16 + lo) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn prefixes_are_split_and_merged() {
        let (specs, route) = split_prefixes("/x-mock/status=500;delay_ms=30/v1/chat/completions");
        assert_eq!(specs, ["status=500;delay_ms=30"]);
        assert_eq!(route, "/v1/chat/completions");
        let (specs, route) = split_prefixes("/x-mock/a=1/x-mock/b=2");
        assert_eq!(specs, ["a=1", "b=2"]);
        assert_eq!(route, "/");

        let mut headers = HeaderMap::new();
        headers.insert("x-mock-status", HeaderValue::from_static("429"));
        let spec = parse(&["status=500;delay-ms=30", "words%3D4"], &headers).ok();
        let expected = FaultSpec {
            status: Some(429),
            delay_ms: Some(30),
            words: Some(4),
            ..FaultSpec::default()
        };
        assert_eq!(spec, Some(expected.clone()));
        assert_eq!(expected.to_string(), "status=429;delay_ms=30;words=4");
    }

    #[test]
    fn bad_values_are_errors() {
        let headers = HeaderMap::new();
        assert!(parse(&["status=abc"], &headers).is_err());
        assert!(parse(&["status=99"], &headers).is_err());
        assert!(parse(&["nope=1"], &headers).is_err());
        assert!(parse(&["status"], &headers).is_err());
        assert!(parse(&["delay_ms=-5"], &headers).is_err());
        assert!(parse(&["stream_error=2"], &headers).is_err());
    }

    #[test]
    fn fail_first_counts_per_spec_and_route() {
        let counters = FailCounters::default();
        let spec = FaultSpec {
            fail_first: Some(2),
            ..FaultSpec::default()
        };
        let statuses: Vec<_> = (0..3)
            .map(|_| counters.failure(&spec, "/chat").status)
            .collect();
        assert_eq!(statuses, [Some(503), Some(503), None]);
        assert_eq!(counters.failure(&spec, "/other").status, Some(503));

        // A stream error is a failure mode of its own: no default status.
        let spec = FaultSpec {
            fail_first: Some(1),
            stream_error: Some(1),
            ..FaultSpec::default()
        };
        let first = counters.failure(&spec, "/messages");
        assert_eq!((first.status, first.stream_error), (None, true));
        let second = counters.failure(&spec, "/messages");
        assert_eq!((second.status, second.stream_error), (None, false));
    }
}
