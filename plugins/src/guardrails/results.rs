//! What guardrails report, in the reference gateway's shapes: each hook's result with its
//! checks' results, gathered under `hook_results`, and the two answers that carry them:
//!
//! - a failed hook with `deny: true` answers **446** with
//!   `{"error": {"message", "type": "hooks_failed", ...}, "hook_results": {...}}`;
//! - a failed hook without `deny` lets the answer through with status **246** and
//!   `hook_results` added to its JSON body.
//!
//! Results of both phases accumulate in the request's extensions ([`HookResults`]), so the
//! output phase can report the input phase's results too.

use std::time::{SystemTime, UNIX_EPOCH};

use http::StatusCode;
use serde::Serialize;
use serde_json::{json, Value};

use plugin_sdk::{PluginResponse, RequestCx};

/// The status of an answer refused by a guardrail.
pub const HOOKS_FAILED: u16 = 446;
/// The status of an answer let through although a guardrail failed.
pub const HOOKS_WARNED: u16 = 246;

/// One check's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    /// The check's id (`default.regexMatch`, `wasm.pii-redactor`...).
    pub id: String,
    /// `true`: the check passed.
    pub verdict: bool,
    /// What the check found (matches, counts...), for the client to read.
    pub data: Value,
    /// Set when the check could not run (a timeout, a trap, a bad parameter).
    pub error: Option<String>,
    /// Milliseconds the check took.
    pub execution_time: u64,
    /// RFC 3339 time the check ran.
    pub created_at: String,
}

/// One hook's outcome: its checks' results and the hook's own verdict (all checks passed).
#[derive(Debug, Clone, Serialize)]
pub struct HookResult {
    pub id: String,
    pub verdict: bool,
    pub deny: bool,
    #[serde(rename = "async")]
    pub is_async: bool,
    /// `guardrail` or `mutator`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Whether the hook rewrote the request or response (a redaction, a wasm rewrite).
    pub transformed: bool,
    pub checks: Vec<CheckResult>,
    pub execution_time: u64,
    /// The hook's `on_success` (when it passed) or `on_fail` (when it failed), as its config
    /// wrote it; left out when that is absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<Value>,
}

impl HookResult {
    /// Failed and refusing: the request or answer must not go on.
    pub fn blocks(&self) -> bool {
        !self.verdict && self.deny
    }
}

/// The results gathered for one request, kept in `RequestCx::extensions`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HookResults {
    pub before_request_hooks: Vec<HookResult>,
    pub after_request_hooks: Vec<HookResult>,
}

/// Which side of the request a hook checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// `before_request_hooks` / `input_guardrails`.
    Input,
    /// `after_request_hooks` / `output_guardrails`.
    Output,
}

impl HookResults {
    /// Adds results to a request's record.
    pub fn record(cx: &mut RequestCx, side: Side, results: Vec<HookResult>) {
        if cx.extensions.get::<HookResults>().is_none() {
            cx.extensions.insert(HookResults::default());
        }
        if let Some(all) = cx.extensions.get_mut::<HookResults>() {
            match side {
                Side::Input => all.before_request_hooks.extend(results),
                Side::Output => all.after_request_hooks.extend(results),
            }
        }
    }

    /// The results recorded for a request so far.
    pub fn of(cx: &RequestCx) -> HookResults {
        cx.extensions
            .get::<HookResults>()
            .cloned()
            .unwrap_or_default()
    }

    /// Whether any recorded hook failed (deny or not).
    pub fn any_failed(&self) -> bool {
        self.before_request_hooks
            .iter()
            .chain(&self.after_request_hooks)
            .any(|h| !h.verdict)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "before_request_hooks": self.before_request_hooks,
            "after_request_hooks": self.after_request_hooks,
        })
    }
}

/// The 446 answer for a request whose hooks refused it.
pub fn refused(results: &HookResults) -> PluginResponse {
    let body = json!({
        "error": {
            "message": "The guardrail checks defined in the request failed. \
                        The hook_results object says which checks failed and why.",
            "type": "hooks_failed",
            "param": null,
            "code": null,
        },
        "hook_results": results.to_json(),
    });
    let status = StatusCode::from_u16(HOOKS_FAILED).unwrap_or(StatusCode::BAD_REQUEST);
    PluginResponse::json(status, &body)
}

/// A JSON answer body with `hook_results` added (the body is left as is when it is not a JSON
/// object).
pub fn with_results(body: &[u8], results: &HookResults) -> Option<Vec<u8>> {
    // The body is the provider's JSON object, written once: the results go in before its
    // closing brace, without parsing and writing the whole answer again. A body that is not
    // plainly an object, or that has `hook_results` already, is rebuilt instead.
    let end = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
    let start = body.iter().position(|b| !b.is_ascii_whitespace())?;
    let plain = body[start] == b'{'
        && body[end] == b'}'
        && memchr::memmem::find(body, b"\"hook_results\"").is_none();
    if !plain {
        let mut value: Value = serde_json::from_slice(body).ok()?;
        value
            .as_object_mut()?
            .insert("hook_results".into(), results.to_json());
        return serde_json::to_vec(&value).ok();
    }
    let empty = body[start + 1..end].iter().all(u8::is_ascii_whitespace);
    let mut out = Vec::with_capacity(body.len() + 512);
    out.extend_from_slice(&body[..end]);
    out.extend_from_slice(if empty {
        b"\"hook_results\":"
    } else {
        b",\"hook_results\":"
    });
    serde_json::to_writer(&mut out, results).ok()?;
    out.push(b'}');
    Some(out)
}

/// The status 246, for answers let through with a failed hook.
pub fn warned_status() -> StatusCode {
    StatusCode::from_u16(HOOKS_WARNED).unwrap_or(StatusCode::OK)
}

/// Now, as RFC 3339 with millisecond precision, for `created_at`. Every check of a request
/// asks within the same millisecond or two: each thread keeps the last one it wrote.
pub fn now_rfc3339() -> String {
    thread_local! {
        static LAST: std::cell::RefCell<(u128, String)> = const { std::cell::RefCell::new((0, String::new())) };
    }
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let millis = d.as_millis();
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if last.0 != millis || last.1.is_empty() {
            *last = (millis, format_rfc3339(d));
        }
        last.1.clone()
    })
}

fn format_rfc3339(d: std::time::Duration) -> String {
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Year, month, day of a count of days since 1970-01-01 (the proleptic Gregorian calendar).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_become_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_778), (2026, 11, 21));
        assert!(now_rfc3339().ends_with('Z'));
        assert_eq!(
            format_rfc3339(std::time::Duration::from_millis(1_795_721_307_943)),
            "2026-11-26T19:28:27.943Z"
        );
    }

    #[test]
    fn results_join_the_answer_as_its_last_member() {
        let results = HookResults::default();
        let spliced = |body: &str| -> Value {
            serde_json::from_slice(&with_results(body.as_bytes(), &results).unwrap()).unwrap()
        };
        let got = spliced(" {\"id\": \"x\", \"choices\": [1]}\n");
        assert_eq!(got["id"], "x");
        assert_eq!(got["choices"], json!([1]));
        assert_eq!(got["hook_results"]["before_request_hooks"], json!([]));
        assert_eq!(
            spliced("{ }")["hook_results"]["after_request_hooks"],
            json!([])
        );
        // A body that already has hook_results is rebuilt, not given a second member.
        let got = spliced(r#"{"hook_results": 1, "a": 2}"#);
        assert_eq!(got["a"], 2);
        assert!(got["hook_results"].is_object());
        assert!(with_results(b"[1]", &results).is_none());
        assert!(with_results(b"not json", &results).is_none());
    }

    #[test]
    fn a_refusal_is_a_446_naming_the_failed_check() {
        let results = HookResults {
            before_request_hooks: vec![HookResult {
                id: "h1".into(),
                verdict: false,
                deny: true,
                is_async: false,
                kind: "guardrail".into(),
                transformed: false,
                checks: vec![CheckResult {
                    id: "default.contains".into(),
                    verdict: false,
                    data: json!({"found": ["secret"]}),
                    error: None,
                    execution_time: 0,
                    created_at: now_rfc3339(),
                }],
                execution_time: 0,
                action: None,
            }],
            after_request_hooks: vec![],
        };
        assert!(results.any_failed() && results.before_request_hooks[0].blocks());
        let r = refused(&results);
        assert_eq!(r.status.as_u16(), 446);
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["error"]["type"], "hooks_failed");
        assert_eq!(
            body["hook_results"]["before_request_hooks"][0]["checks"][0]["id"],
            "default.contains"
        );
        let with = with_results(br#"{"id":"x"}"#, &results).unwrap();
        let with: Value = serde_json::from_slice(&with).unwrap();
        assert_eq!(with["id"], "x");
        assert_eq!(with["hook_results"]["after_request_hooks"], json!([]));
        assert!(with_results(b"[1]", &results).is_none());
        assert_eq!(warned_status().as_u16(), 246);
    }
}
