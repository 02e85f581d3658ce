//! `wasm_guardrail`: a third-party guardrail compiled to a WebAssembly component, run in a
//! sandbox on the requests and answers that pass the gateway.
//!
//! The component implements the world `gateway:guardrail/guardrail-plugin`, version 0.2.0
//! (`plugin-sdk/wit/guardrail/v0.2.0/world.wit`: messages and answers with their tool calls,
//! the API of the request) or 0.1.0 (text only); the host runs both ([`abi`]; a Rust SDK is in
//! `plugin-sdk/guest`). `POST /v1/chat/completions` and `POST /v1/messages` are checked (see
//! `subject` for what the guest sees of each); other routes pass untouched. Per phase:
//!
//! - `on_request` (side `input`): `check-request` with the request. `deny` refuses it (446,
//!   the provider is not called); `rewrite-messages` replaces the messages' text in the body
//!   sent upstream.
//! - `on_response` (side `output`): `check-response` with each choice (a 0.1.0 guest: each
//!   choice that has text). `deny` refuses the answer; `rewrite-text` replaces the choice's
//!   text. When a guardrail failed without `deny`, the answer goes out with status 246 and
//!   `hook_results`.
//! - `on_chunk` (side `output`, streams): one `stream-checker` per choice, fed each text delta
//!   and (0.2.0) each piece of tool-call arguments; `deny` ends the stream with the refusal as
//!   its last event; `rewrite-text` replaces the text delta.
//!
//! **Where calls run.** `on_request` and `on_response` run the guest on the blocking thread
//! pool (`spawn_blocking`): a guest may use its whole deadline, and the proxy's worker threads
//! each serve many connections, which must not stall for it. The hand-off costs a thread
//! wake-up, of the order of the call itself (10 to 30 us in a release build: a fresh instance,
//! `init`, the check). `on_chunk` is synchronous, so the stream checker runs inline; each
//! `push` reuses the stream's instance (under a microsecond plus the guest's own work) and is
//! bounded by the same deadline.
//!
//! **Limits.** Each call (a fresh instance's `init` and its check; each `push` and `finish`)
//! has `timeout_ms` (an epoch deadline, 1 ms granularity); each instance's memory is capped at
//! `memory_limit_mb`. A trap, a deadline hit, memory exhaustion or a verdict that does not fit
//! the check is an error: `on_error: fail_closed` refuses (446, the error in the check result),
//! `fail_open` lets the request through and records the error. Errors are logged (warn) and
//! counted (`gw_wasm_guardrail_calls_total{plugin, outcome}`).
//!
//! **Loading.** The component is compiled, linked and its `init` run when the config is
//! checked, so `gateway config check` reports a missing file, a module that is not a component,
//! a missing export (by name) or a config `init` refuses. [`load`] can be called again at any
//! time; [`WasmGuardrail::reload`] swaps in a freshly loaded component atomically (the gateway
//! has no reload trigger yet).

pub mod abi;
mod metrics;
mod runtime;
mod stream;
mod subject;
mod wasi;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use plugin_sdk::plugin::ResponseParts;
use plugin_sdk::{
    BuildCx, Chunk, ConfigIssue, Flow, GatewayError, Phases, Plugin, PluginFactory, PluginResponse,
    RequestCx, Route,
};

use crate::guardrails::results::{
    now_rfc3339, refused, warned_status, with_results, CheckResult, HookResult, HookResults, Side,
};
use abi::{Answer, Message, Request, Verdict};
pub use runtime::{CallError, MAX_MEMORY_MB};
use runtime::{CallLimits, Loaded, Shared};
pub use wasi::Grant;

/// Which phases a guardrail checks.
#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Sides {
    /// The request only.
    Input,
    /// The answer only (whole or streamed).
    Output,
    /// Both. The default.
    #[default]
    Both,
}

impl Sides {
    fn input(self) -> bool {
        self != Sides::Output
    }

    fn output(self) -> bool {
        self != Sides::Input
    }
}

/// What a guardrail that cannot give a verdict means.
#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Let it through; the error is recorded in the check result.
    FailOpen,
    /// Refuse with 446; the error is in the check result. The default.
    #[default]
    FailClosed,
}

/// The longest `timeout_ms`.
pub const MAX_TIMEOUT_MS: u64 = 10_000;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WasmGuardrailConfig {
    /// The hook's id in `hook_results`; the check is `wasm.<id>`. Also the `plugin` label of
    /// the metrics. Letters, digits, `_`, `-`, `.`; at most 64.
    pub id: String,
    /// The component: a `.wasm` file (or WAT text), relative to the working directory.
    pub path: PathBuf,
    /// Free JSON handed to the component's `init` as text. Default: `{}`.
    #[serde(default = "empty_object")]
    pub config: Value,
    /// `input`, `output` or `both`. Default: `both`.
    #[serde(default)]
    pub side: Sides,
    /// `true`: a `deny` verdict refuses with 446. `false`: the answer goes through with status
    /// 246 and the results attached. Default: `true`.
    #[serde(default = "yes")]
    pub deny: bool,
    /// `fail_open` or `fail_closed`: what a trap, a deadline, memory exhaustion or a bad
    /// verdict means. Default: `fail_closed`.
    #[serde(default)]
    pub on_error: OnError,
    /// Deadline of each call, in milliseconds (1 to 10000). Default: 50.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Memory limit of each instance, in MiB (1 to 256). Default: 16.
    #[serde(default = "default_memory_limit_mb")]
    pub memory_limit_mb: u64,
    /// WASI capabilities granted: `clock`, `random`, `stderr`. Default: none.
    #[serde(default)]
    pub grants: Vec<Grant>,
}

fn empty_object() -> Value {
    json!({})
}

fn yes() -> bool {
    true
}

fn default_timeout_ms() -> u64 {
    50
}

fn default_memory_limit_mb() -> u64 {
    16
}

/// The checks of a config that need no file.
fn check_fields(config: &WasmGuardrailConfig) -> Vec<ConfigIssue> {
    let mut issues = Vec::new();
    let id_ok = !config.id.is_empty()
        && config.id.len() <= 64
        && config
            .id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !id_ok {
        issues.push(ConfigIssue::new(
            "id",
            "must be 1 to 64 letters, digits, `_`, `-` or `.`",
        ));
    }
    if config.path.as_os_str().is_empty() {
        issues.push(ConfigIssue::new("path", "must name a .wasm component"));
    }
    if !(1..=MAX_TIMEOUT_MS).contains(&config.timeout_ms) {
        issues.push(ConfigIssue::new(
            "timeout_ms",
            format!("must be between 1 and {MAX_TIMEOUT_MS}"),
        ));
    }
    if !(1..=MAX_MEMORY_MB).contains(&config.memory_limit_mb) {
        issues.push(ConfigIssue::new(
            "memory_limit_mb",
            format!("must be between 1 and {MAX_MEMORY_MB}"),
        ));
    }
    issues
}

/// Loads a guardrail: compiles (or reuses the compiled) component, links it, and runs `init`
/// once with the config to have it refused now rather than on the first request. Can be
/// called again at any time (a reload).
pub fn load(config: &WasmGuardrailConfig) -> Result<Loaded, ConfigIssue> {
    let component = runtime::compile(&config.path).map_err(|e| ConfigIssue::new("path", e))?;
    let shared = Arc::new(Shared::new(config.id.clone(), &config.grants));
    let limits = CallLimits {
        timeout_ms: config.timeout_ms,
        memory_mb: config.memory_limit_mb,
    };
    let loaded = Loaded::link(
        &component,
        config.config.to_string(),
        shared,
        &config.grants,
        limits,
    )
    .map_err(|e| ConfigIssue::new("path", format!("{}: {e}", config.path.display())))?;
    match loaded.session() {
        Ok(_) => Ok(loaded),
        Err(CallError::Init(message)) => Err(ConfigIssue::new(
            "config",
            format!("the guardrail refused its config: {message}"),
        )),
        Err(e) => Err(ConfigIssue::new(
            "path",
            format!("{}: init failed: {e}", config.path.display()),
        )),
    }
}

/// A loaded wasm guardrail in the pipeline.
pub struct WasmGuardrail {
    config: WasmGuardrailConfig,
    loaded: ArcSwap<Loaded>,
    /// Tells this plugin's stream state apart from another wasm guardrail's.
    uid: u64,
}

impl WasmGuardrail {
    /// Builds the plugin from a valid config (compiling, linking and initializing the
    /// component).
    pub fn new(config: WasmGuardrailConfig) -> Result<WasmGuardrail, ConfigIssue> {
        static NEXT_UID: AtomicU64 = AtomicU64::new(0);
        let loaded = load(&config)?;
        Ok(WasmGuardrail {
            config,
            loaded: ArcSwap::from_pointee(loaded),
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Loads the component again from its path and swaps it in; requests in flight finish
    /// with the old one. On error the old one stays.
    pub fn reload(&self) -> Result<(), ConfigIssue> {
        let loaded = load(&self.config)?;
        self.loaded.store(Arc::new(loaded));
        Ok(())
    }

    /// The hook result of a phase's outcome.
    fn hook_result(&self, outcome: &PhaseOutcome) -> HookResult {
        let fail_open = self.config.on_error == OnError::FailOpen;
        let (verdict, deny, data) = match (&outcome.error, &outcome.denied) {
            (Some(e), _) => (
                fail_open,
                self.config.deny || !fail_open,
                json!({"verdict": "error", "outcome": e.label(), "on_error": if fail_open { "fail_open" } else { "fail_closed" }}),
            ),
            (None, Some(reason)) => (
                false,
                self.config.deny,
                json!({"verdict": "deny", "reason": reason}),
            ),
            (None, None) => (
                true,
                self.config.deny,
                json!({"verdict": if outcome.transformed { "rewrite" } else { "allow" }}),
            ),
        };
        let ms = outcome.elapsed.as_millis() as u64;
        HookResult {
            id: self.config.id.clone(),
            verdict,
            deny,
            is_async: false,
            kind: "guardrail".into(),
            transformed: outcome.transformed,
            checks: vec![CheckResult {
                id: format!("wasm.{}", self.config.id),
                verdict,
                data,
                error: outcome.error.as_ref().map(ToString::to_string),
                execution_time: ms,
                created_at: now_rfc3339(),
            }],
            execution_time: ms,
            action: None,
        }
    }

    /// Records a phase's outcome; the refusal to answer with when it blocks.
    fn conclude(
        &self,
        cx: &mut RequestCx,
        side: Side,
        outcome: &PhaseOutcome,
    ) -> Option<PluginResponse> {
        metrics::call(&self.config.id, outcome.label());
        if let Some(e) = &outcome.error {
            tracing::warn!(
                target: "gateway::wasm_guardrail",
                plugin = self.config.id.as_str(),
                trace_id = cx.trace_id.as_str(),
                outcome = e.label(),
                on_error = if self.config.on_error == OnError::FailOpen { "fail_open" } else { "fail_closed" },
                "wasm guardrail failed: {e}"
            );
        }
        let hook = self.hook_result(outcome);
        let blocks = hook.blocks();
        HookResults::record(cx, side, vec![hook]);
        blocks.then(|| refused(&HookResults::of(cx)))
    }
}

/// What one phase of a guardrail concluded.
#[derive(Debug, Default)]
struct PhaseOutcome {
    denied: Option<String>,
    error: Option<CallError>,
    transformed: bool,
    elapsed: Duration,
}

impl PhaseOutcome {
    fn label(&self) -> &'static str {
        match (&self.error, &self.denied) {
            (Some(e), _) => e.label(),
            (None, Some(_)) => "deny",
            (None, None) if self.transformed => "rewrite",
            (None, None) => "allow",
        }
    }
}

pub struct WasmGuardrailFactory;

impl PluginFactory for WasmGuardrailFactory {
    const KIND: &'static str = "wasm_guardrail";
    const SUMMARY: &'static str =
        "Runs a guardrail compiled to a WebAssembly component on chat requests, answers and streams (allow, deny, rewrite)";
    const EXAMPLE: &'static str = "- kind: wasm_guardrail
  id: pii
  path: target/guardrails/pii_redactor.wasm
  config: {}            # JSON handed to the component's init
  side: both            # input | output | both
  deny: true            # false: let failures through with status 246
  on_error: fail_closed # or fail_open
  timeout_ms: 50
  memory_limit_mb: 16
  grants: []            # clock, random, stderr";
    type Config = WasmGuardrailConfig;

    fn validate(config: &Self::Config) -> Vec<ConfigIssue> {
        let issues = check_fields(config);
        if !issues.is_empty() {
            return issues;
        }
        match load(config) {
            Ok(_) => Vec::new(),
            Err(issue) => vec![issue],
        }
    }

    fn build(config: Self::Config, cx: &BuildCx) -> Result<Arc<dyn Plugin>, String> {
        metrics::register(&cx.metrics)?;
        let plugin = WasmGuardrail::new(config).map_err(|i| {
            if i.path.is_empty() {
                i.message
            } else {
                format!("{}: {}", i.path, i.message)
            }
        })?;
        Ok(Arc::new(plugin))
    }
}

plugin_sdk::register_plugin!(WasmGuardrailFactory);

/// Runs a call on the blocking pool (inline when there is no runtime); with its duration.
async fn run_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, CallError> + Send + 'static,
) -> (Result<T, CallError>, Duration) {
    let started = Instant::now();
    let result = match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle
            .spawn_blocking(f)
            .await
            .unwrap_or_else(|e| Err(CallError::Trap(format!("the call did not complete: {e}")))),
        Err(_) => f(),
    };
    (result, started.elapsed())
}

/// What `check-request` decided, checked against the request.
#[derive(Debug)]
enum RequestDecision {
    Allow,
    Deny(String),
    Rewrite(Vec<Message>),
}

fn check_request(loaded: &Loaded, request: &Request) -> Result<RequestDecision, CallError> {
    let mut session = loaded.session()?;
    match session.check_request(request)? {
        Verdict::Allow => Ok(RequestDecision::Allow),
        Verdict::Deny(reason) => Ok(RequestDecision::Deny(reason)),
        Verdict::RewriteMessages(messages) => fit_rewrite(messages, request),
        Verdict::RewriteText(_) => Err(CallError::BadVerdict(
            "rewrite-text rewrites answers; check-request may only rewrite messages".into(),
        )),
    }
}

/// A request rewrite, if it gives every message of the request, in order, with its role.
fn fit_rewrite(messages: Vec<Message>, request: &Request) -> Result<RequestDecision, CallError> {
    let fits = messages.len() == request.messages.len()
        && messages
            .iter()
            .zip(&request.messages)
            .all(|(new, old)| new.role == old.role);
    if fits {
        Ok(RequestDecision::Rewrite(messages))
    } else {
        Err(CallError::BadVerdict(format!(
            "rewrite-messages must give the request's {} messages, in order, with their roles",
            request.messages.len()
        )))
    }
}

/// What `check-response` decided for the choices of an answer.
#[derive(Debug)]
enum ResponseDecision {
    Allow,
    Deny(String),
    /// New text by choice position.
    Rewrite(Vec<(usize, String)>),
}

fn check_response(
    loaded: &Loaded,
    request: &Request,
    answers: &[(usize, Answer)],
) -> Result<ResponseDecision, CallError> {
    let mut session = loaded.session()?;
    let mut rewrites = Vec::new();
    for (i, (position, answer)) in answers.iter().enumerate() {
        if i > 0 {
            session.arm();
        }
        match session.check_response(request, answer)? {
            Verdict::Allow => {}
            Verdict::Deny(reason) => return Ok(ResponseDecision::Deny(reason)),
            Verdict::RewriteText(new) => rewrites.push((*position, new)),
            Verdict::RewriteMessages(_) => {
                return Err(CallError::BadVerdict(
                    "rewrite-messages rewrites requests; check-response may only rewrite text"
                        .into(),
                ))
            }
        }
    }
    Ok(if rewrites.is_empty() {
        ResponseDecision::Allow
    } else {
        ResponseDecision::Rewrite(rewrites)
    })
}

#[async_trait]
impl Plugin for WasmGuardrail {
    fn kind(&self) -> &'static str {
        WasmGuardrailFactory::KIND
    }

    fn phases(&self) -> Phases {
        Phases::REQUEST | Phases::RESPONSE | Phases::CHUNK
    }

    /// Loads the component from its path again; requests already running keep the old one.
    fn reload(&self) -> Result<(), String> {
        WasmGuardrail::reload(self)
            .map_err(|e| format!("{} ({}): {}", self.config.id, e.path, e.message))
    }

    /// Checks the request (side `input`); may refuse it or rewrite its messages.
    async fn on_request(&self, cx: &mut RequestCx) -> Result<Flow, GatewayError> {
        if !self.config.side.input() {
            return Ok(Flow::Continue);
        }
        let Some(request) = subject::request(cx) else {
            return Ok(Flow::Continue);
        };
        let loaded = self.loaded.load_full();
        let sent = request.clone();
        let (result, elapsed) = run_blocking(move || check_request(&loaded, &sent)).await;
        let mut outcome = PhaseOutcome {
            elapsed,
            ..PhaseOutcome::default()
        };
        match result {
            Ok(RequestDecision::Allow) => {}
            Ok(RequestDecision::Deny(reason)) => outcome.denied = Some(reason),
            Ok(RequestDecision::Rewrite(messages)) => {
                match subject::rewrite_request(cx, &request, &messages) {
                    Ok(changed) => outcome.transformed = changed,
                    Err(e) => outcome.error = Some(CallError::BadVerdict(e)),
                }
            }
            Err(e) => outcome.error = Some(e),
        }
        Ok(match self.conclude(cx, Side::Input, &outcome) {
            Some(refusal) => Flow::Respond(refusal),
            None => Flow::Continue,
        })
    }

    /// Checks each choice of a whole answer (side `output`); may refuse it or rewrite it. Then,
    /// if any guardrail failed without refusing, marks the answer 246 with `hook_results`.
    async fn on_response(
        &self,
        cx: &mut RequestCx,
        response: &mut ResponseParts,
    ) -> Result<Flow, GatewayError> {
        let request = if self.config.side.output() && response.status.is_success() {
            subject::request(cx)
        } else {
            None
        };
        if let Some(request) = request {
            let body: Option<Value> = serde_json::from_slice(&response.body).ok();
            let answers = body
                .as_ref()
                .map(|b| subject::answers(cx.route, b))
                .unwrap_or_default();
            if let (Some(mut body), false) = (body, answers.is_empty()) {
                let loaded = self.loaded.load_full();
                let (result, elapsed) =
                    run_blocking(move || check_response(&loaded, &request, &answers)).await;
                let mut outcome = PhaseOutcome {
                    elapsed,
                    ..PhaseOutcome::default()
                };
                match result {
                    Ok(ResponseDecision::Allow) => {}
                    Ok(ResponseDecision::Deny(reason)) => outcome.denied = Some(reason),
                    Ok(ResponseDecision::Rewrite(rewrites)) => {
                        let put = rewrites.into_iter().try_for_each(|(position, text)| {
                            subject::rewrite_answer(cx.route, &mut body, position, text)
                        });
                        match put
                            .and_then(|()| serde_json::to_vec(&body).map_err(|e| e.to_string()))
                        {
                            Ok(bytes) => {
                                response.body = Bytes::from(bytes);
                                outcome.transformed = true;
                            }
                            Err(e) => outcome.error = Some(CallError::BadVerdict(e)),
                        }
                    }
                    Err(e) => outcome.error = Some(e),
                }
                if let Some(refusal) = self.conclude(cx, Side::Output, &outcome) {
                    return Ok(Flow::Respond(refusal));
                }
            }
        }
        let results = HookResults::of(cx);
        if results.any_failed() {
            if let Some(body) = with_results(&response.body, &results) {
                response.body = Bytes::from(body);
                response.status = warned_status();
            }
        }
        Ok(Flow::Continue)
    }

    /// Feeds each delta of a streamed answer to the choice's stream checker (side `output`).
    fn on_chunk(&self, cx: &mut RequestCx, chunk: &mut Chunk) -> Result<Flow, GatewayError> {
        if !self.config.side.output()
            || !matches!(cx.route, Route::ChatCompletions | Route::Messages)
        {
            return Ok(Flow::Continue);
        }
        Ok(match stream::check_chunk(self, cx, chunk) {
            Some(refusal) => Flow::Respond(refusal),
            None => Flow::Continue,
        })
    }
}
