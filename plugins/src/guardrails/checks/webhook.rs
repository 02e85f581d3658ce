//! `default.webhook` `{webhookURL, headers = {}, timeout = 3000}`: asks a service of yours.
//!
//! The gateway POSTs JSON to `webhookURL` (http or https; redirects are not followed) with the
//! configured `headers` (an object of strings, or that object as a JSON string) and
//! `content-type: application/json`:
//!
//! ```json
//! {"eventType": "beforeRequestHook" | "afterRequestHook",
//!  "request": {"json": <request body>, "text": <checked text>},
//!  "response": {"json": <answer body>, "text": <checked text>}}   // output side only
//! ```
//!
//! and expects a 2xx answer `{"verdict": true|false, "data": <anything, optional>}`. The check's
//! verdict is the answer's `verdict`; its `data` is returned in the check's result.
//!
//! **Fails closed**: no answer within `timeout` milliseconds (default 3000, at most 60000), a
//! non-2xx status, or an answer without a boolean `verdict` make the check error, which counts
//! as failed (the reference gateway passes on a timeout; a guardrail that lets everything
//! through while its service is down is not one). Put the hook in `async` mode, or leave `deny`
//! off, where an unreachable service must not block traffic.
//!
//! The webhook is a network call: it does not run on streamed answers (its result says it was
//! skipped). A webhook may not rewrite the request or answer.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use plugin_sdk::egress::TrustedHost;
use plugin_sdk::ConfigIssue;

use super::{params, Input, Outcome};
use crate::guardrails::net::Net;
use crate::guardrails::results::Side;

/// An error with its causes (the egress policy's refusal is a cause of the client's error).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// The default and the largest timeout, in milliseconds.
const DEFAULT_TIMEOUT_MS: u64 = 3000;
const MAX_TIMEOUT_MS: u64 = 60_000;
/// The largest webhook answer read.
const MAX_ANSWER_BYTES: usize = 1 << 20;

#[derive(Debug)]
pub struct Webhook {
    url: reqwest::Url,
    headers: HeaderMap,
    timeout: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookParams {
    #[serde(rename = "webhookURL")]
    url: String,
    #[serde(default)]
    headers: Option<Value>,
    #[serde(default)]
    timeout: Option<u64>,
}

impl Webhook {
    pub fn parse(p: &Value) -> Result<Self, ConfigIssue> {
        let p: WebhookParams = params(p)?;
        let url = reqwest::Url::parse(&p.url)
            .map_err(|e| ConfigIssue::new("webhookURL", format!("not a valid URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(ConfigIssue::new(
                "webhookURL",
                "must be an http:// or https:// URL with a host",
            ));
        }
        let timeout_ms = p.timeout.unwrap_or(DEFAULT_TIMEOUT_MS);
        if !(1..=MAX_TIMEOUT_MS).contains(&timeout_ms) {
            return Err(ConfigIssue::new(
                "timeout",
                format!("must be between 1 and {MAX_TIMEOUT_MS} milliseconds"),
            ));
        }
        Ok(Webhook {
            url,
            headers: headers(p.headers)?,
            timeout: Duration::from_millis(timeout_ms),
        })
    }

    /// The webhook's host and port (trusted by the egress policy when the operator's file
    /// names it).
    pub fn host(&self) -> Option<TrustedHost> {
        Some(TrustedHost {
            host: self
                .url
                .host_str()?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_ascii_lowercase(),
            port: self.url.port_or_known_default(),
        })
    }

    pub async fn run(&self, input: &Input<'_>, net: &Net) -> Outcome {
        let (event, side_text) = match input.side {
            Side::Input => ("beforeRequestHook", "request"),
            Side::Output => ("afterRequestHook", "response"),
        };
        let mut body = Map::new();
        body.insert("eventType".into(), json!(event));
        body.insert(
            "request".into(),
            json!({
                "json": input.request,
                "text": if side_text == "request" { Some(input.text) } else { None },
            }),
        );
        if let Some(response) = input.response {
            body.insert(
                "response".into(),
                json!({"json": response, "text": input.text}),
            );
        }
        let about = json!({"webhookURL": self.url.as_str()});
        if let Err(why) = net.allows(&self.url) {
            return Outcome::error(why, about);
        }
        let send = net
            .http
            .post(self.url.clone())
            .headers(self.headers.clone())
            .timeout(self.timeout)
            .json(&body)
            .send();
        let answer = match send.await {
            Ok(a) => a,
            Err(e) if e.is_timeout() => {
                return Outcome::error(
                    format!(
                        "the webhook did not answer within {} ms",
                        self.timeout.as_millis()
                    ),
                    about,
                )
            }
            Err(e) => {
                return Outcome::error(format!("the webhook failed: {}", with_causes(&e)), about)
            }
        };
        let status = answer.status();
        let bytes = match read_bounded(answer).await {
            Ok(b) => b,
            Err(e) => return Outcome::error(format!("the webhook answer failed: {e}"), about),
        };
        if !status.is_success() {
            return Outcome::error(
                format!("the webhook answered status {}", status.as_u16()),
                about,
            );
        }
        let parsed: Option<Value> = serde_json::from_slice(&bytes).ok();
        let Some(verdict) = parsed
            .as_ref()
            .and_then(|v| v.get("verdict"))
            .and_then(Value::as_bool)
        else {
            return Outcome::error(
                "the webhook answer is not JSON with a boolean `verdict`",
                about,
            );
        };
        let data = parsed
            .as_ref()
            .and_then(|v| v.get("data"))
            .cloned()
            .unwrap_or(Value::Null);
        Outcome::of(
            verdict,
            json!({"webhookURL": self.url.as_str(), "responseData": data}),
        )
    }
}

/// Reads an answer body, refusing more than [`MAX_ANSWER_BYTES`].
async fn read_bounded(mut answer: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(chunk) = answer.chunk().await.map_err(|e| e.to_string())? {
        if out.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(format!(
                "the answer is larger than {MAX_ANSWER_BYTES} bytes"
            ));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The configured headers: an object of strings, or such an object written as a JSON string.
fn headers(value: Option<Value>) -> Result<HeaderMap, ConfigIssue> {
    let value = match value {
        None | Some(Value::Null) => return Ok(HeaderMap::new()),
        Some(Value::String(s)) => serde_json::from_str(&s).map_err(|e| {
            ConfigIssue::new("headers", format!("a string must hold a JSON object: {e}"))
        })?,
        Some(v) => v,
    };
    let Value::Object(map) = value else {
        return Err(ConfigIssue::new(
            "headers",
            "must be an object of header names to string values",
        ));
    };
    let mut out = HeaderMap::new();
    for (name, v) in map {
        let path = format!("headers.{name}");
        let Value::String(v) = v else {
            return Err(ConfigIssue::new(path, "must be a string"));
        };
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ConfigIssue::new(&path, "not a valid header name"))?;
        let v = HeaderValue::from_str(&v)
            .map_err(|_| ConfigIssue::new(&path, "not a valid header value"))?;
        out.insert(name, v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::testing::issue;
    use super::*;
    use serde_json::json;

    #[test]
    fn parameters_are_checked() {
        assert_eq!(issue("default.webhook", json!({})).0, "webhookURL");
        assert_eq!(
            issue("default.webhook", json!({"webhookURL": "not a url"})).0,
            "webhookURL"
        );
        assert_eq!(
            issue("default.webhook", json!({"webhookURL": "ftp://x.example/"})).0,
            "webhookURL"
        );
        assert_eq!(
            issue(
                "default.webhook",
                json!({"webhookURL": "http://x.example/", "timeout": 0})
            )
            .0,
            "timeout"
        );
        assert_eq!(
            issue(
                "default.webhook",
                json!({"webhookURL": "http://x.example/", "headers": {"x-a": 1}})
            )
            .0,
            "headers.x-a"
        );
        assert_eq!(
            issue(
                "default.webhook",
                json!({"webhookURL": "http://x.example/", "headers": {"bad name": "v"}})
            )
            .0,
            "headers.bad name"
        );
        let Ok(w) = Webhook::parse(&json!({
            "webhookURL": "https://x.example/hook",
            "headers": "{\"authorization\": \"Bearer k\"}"
        })) else {
            panic!("headers as a JSON string are accepted")
        };
        assert_eq!(w.headers["authorization"], "Bearer k");
        assert_eq!(w.timeout, Duration::from_millis(3000));
    }
}
