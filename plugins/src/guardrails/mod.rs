//! `guardrails`: checks on a request's input and an answer's output, attached as hooks.
//!
//! Hooks (see [`config`] for their shape) come from three places, run in this order:
//!
//! 1. the pipeline entry: `before_request_hooks` / `after_request_hooks` (or their aliases
//!    `input_guardrails` / `output_guardrails`), validated when the gateway starts;
//! 2. workspace defaults: the `defaults.input_guardrails` / `output_guardrails` of the
//!    workspace of the request's key or token (read through the principal the `auth` plugin
//!    attached; each item a hook object or the id of a hook of this plugin's `library` or of a
//!    guardrail the workspace saved, see [`workspace`]), and a [`DefaultHooks`] value another
//!    plugin may put in the request's extensions;
//! 3. the request's routing config (`x-gw-config`, inline or saved): its top-level hook lists,
//!    validated per request (a bad one is a 400 naming its path). Hooks of nested targets are
//!    not read. A config names saved guardrails its caller may use (see [`saved`]). The config is known once `provider_select` ran, so this plugin must come after
//!    it in the pipeline.
//!
//! **Input** (`on_request`): the hooks run on the request's text (see [`text`]: for chat, the
//! last user message; for embeddings, the input). A failed `deny` hook answers 446 and the
//! provider is not called; a redaction rewrites the body before it is sent.
//!
//! **Output** (`on_response`, chat completions only): the hooks run on the first choice's
//! content. A failed `deny` hook replaces the answer with the 446; a redaction rewrites every
//! choice. Any answer that had hooks run carries `hook_results`; if any hook of either phase
//! failed without `deny`, its status is 246. Embeddings answers get the input phase's results
//! the same way; their output is not checked.
//!
//! **Streams** (`on_chunk`, chat completions): the content deltas of the first choice are
//! gathered as they pass. Every `stream_check_bytes` (default 256) the `deny` hooks' checks
//! whose failure no later text can undo run on the text so far (maximum counts, `contains`
//! with `none`, `regexMatch` with `not`, `containsCode` with `not`, PII); at the end (the
//! first `finish_reason`, or `[DONE]`) every hook runs on the whole text. A failed `deny` hook
//! ends the stream with one last event holding the 446 body (`error.type: hooks_failed` and
//! `hook_results`) in place of the rest. Other failures are only recorded (the status was
//! sent). Network checks (webhook, validUrls) are skipped on streams and say so in their
//! result, except in `async` hooks, which run them in the background. Nothing is rewritten
//! in a stream: a redacting PII check detects instead.
//!
//! Outcomes are counted in `gw_guardrail_checks_total{check,side,verdict}` and
//! `gw_guardrail_hooks_total{side,outcome}`; failed hooks are logged (target
//! `gateway::guardrails`).

pub mod checks;
pub mod config;
pub mod hooks;
pub mod net;
pub mod results;
pub mod saved;
pub mod text;
pub mod workspace;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;

use plugin_sdk::llm::LlmRequest;
use plugin_sdk::plugin::ResponseParts;
use plugin_sdk::{
    BuildCx, Chunk, ConfigIssue, Flow, GatewayError, Phases, Plugin, PluginFactory, Principal,
    RequestCx, Route, RoutePlan,
};

use config::{
    build_items, describe, hooks_of_config, parse_items, Allow, Entry, Hook, HookSet, RawHook,
};
use hooks::{Body, GuardMetrics, Material, Runner};
use results::{refused, warned_status, with_results, HookResult, HookResults, Side};
use saved::{Saved, Scope};
use text::Subject;
use workspace::WorkspaceHooks;

/// The `guardrails` pipeline entry.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct GuardrailsConfig {
    /// Hooks run on every request's input: hook objects, or ids naming a hook of `library` or
    /// a guardrail saved through the control plane (any workspace's: the operator chooses).
    /// Default: none.
    #[serde(default)]
    pub before_request_hooks: Option<Value>,
    /// Another name for `before_request_hooks`.
    #[serde(default)]
    pub input_guardrails: Option<Value>,
    /// Hooks run on every chat completion's output, as `before_request_hooks`. Default: none.
    #[serde(default)]
    pub after_request_hooks: Option<Value>,
    /// Another name for `after_request_hooks`.
    #[serde(default)]
    pub output_guardrails: Option<Value>,
    /// Named hooks that workspaces name in their default guardrails
    /// (`defaults.input_guardrails: [<id>]` in the control plane) and configs in their hook
    /// lists; each needs an `id`. A name is looked up here before the saved guardrails.
    /// Default: none.
    #[serde(default)]
    pub library: Vec<RawHook>,
    /// On streams, how many bytes of new text arrive between two early checks. Default: 256.
    #[serde(default = "default_stream_check_bytes")]
    pub stream_check_bytes: usize,
    /// Whether hooks sent with a request (`x-gw-config`, or a config saved through the control
    /// plane) may use checks that call the network (`default.webhook`, `default.validUrls`),
    /// which lets a client make the gateway send requests. Default: false. When true they go
    /// through the egress policy like every host a request names.
    #[serde(default)]
    pub request_network_checks: bool,
}

fn default_stream_check_bytes() -> usize {
    256
}

impl GuardrailsConfig {
    /// The hooks of one side, under whichever name was used, and the name.
    fn side(&self, side: Side) -> Vec<(&'static str, &Value)> {
        let [primary, alias] = config::side_keys(side);
        let (a, b) = match side {
            Side::Input => (&self.before_request_hooks, &self.input_guardrails),
            Side::Output => (&self.after_request_hooks, &self.output_guardrails),
        };
        [(primary, a), (alias, b)]
            .into_iter()
            .filter_map(|(name, hooks)| hooks.as_ref().map(|h| (name, h)))
            .collect()
    }

    /// Both sides' hooks, validated.
    fn hooks(&self) -> Result<HookSet, Vec<ConfigIssue>> {
        let mut issues = Vec::new();
        if self.stream_check_bytes == 0 {
            issues.push(ConfigIssue::new("stream_check_bytes", "must be at least 1"));
        }
        let mut sides = Vec::new();
        for side in [Side::Input, Side::Output] {
            let lists = self.side(side);
            if lists.len() > 1 {
                let [primary, alias] = config::side_keys(side);
                issues.push(ConfigIssue::new(
                    alias,
                    format!("give {primary} or {alias}, not both"),
                ));
            }
            let mut hooks = Vec::new();
            for (name, raw) in lists {
                let built = parse_items(raw, name)
                    .and_then(|items| build_items(&items, name, Allow { network: true }));
                match built {
                    Ok(h) => hooks.extend(h),
                    Err(found) => issues.extend(found),
                }
            }
            sides.push(hooks);
        }
        if !issues.is_empty() {
            return Err(issues);
        }
        let after = sides.pop().unwrap_or_default();
        let before = sides.pop().unwrap_or_default();
        Ok(HookSet { before, after })
    }
}

/// Workspace default hooks for one request, run after the pipeline's own and before the
/// request config's. Another plugin (the control plane's) inserts this into
/// `RequestCx::extensions` in its `on_request`, before this plugin runs.
#[derive(Debug, Clone, Default)]
pub struct DefaultHooks {
    pub before: Vec<Arc<Hook>>,
    pub after: Vec<Arc<Hook>>,
}

impl DefaultHooks {
    /// Builds default hooks from a JSON object with `before_request_hooks` /
    /// `after_request_hooks` (or the aliases), as a routing config writes them. Validate once
    /// and keep the result: building compiles regexes and schemas.
    /// Names of saved guardrails are refused here: they are resolved per request and owner.
    pub fn from_json(value: &Value) -> Result<DefaultHooks, Vec<ConfigIssue>> {
        let HookSet { before, after } = hooks_of_config(value, Allow { network: true })?;
        let built = |entries: Vec<Entry>| -> Result<Vec<Arc<Hook>>, Vec<ConfigIssue>> {
            entries
                .into_iter()
                .map(|e| match e {
                    Entry::Built(h) => Ok(h),
                    Entry::Named { at, .. } => Err(vec![ConfigIssue::new(
                        at,
                        "default hooks are whole hooks, not names of saved guardrails",
                    )]),
                })
                .collect()
        };
        Ok(DefaultHooks {
            before: built(before)?,
            after: built(after)?,
        })
    }
}

/// The request's own output hooks (defaults and config), read by the plugin instance that
/// read them in `on_request`.
#[derive(Clone)]
struct RequestHooks {
    owner: usize,
    after: Vec<Arc<Hook>>,
}

/// A stream's gathered text, per plugin instance.
#[derive(Clone, Default)]
struct StreamStates(Vec<(usize, StreamState)>);

#[derive(Clone, Default)]
struct StreamState {
    text: String,
    /// The text's length at the last early check.
    checked: usize,
    /// The final checks ran (or a hook stopped the stream).
    done: bool,
    /// The choices seen so far, by index, and whether each has finished.
    choices: Vec<(u64, bool)>,
}

/// Tells the plugin instances of one pipeline apart.
static INSTANCES: AtomicUsize = AtomicUsize::new(0);

pub struct Guardrails {
    instance: usize,
    before: Vec<Entry>,
    after: Vec<Entry>,
    saved: Arc<Saved>,
    runner: Runner,
    stream_check_bytes: usize,
    request_network_checks: bool,
    workspaces: WorkspaceHooks,
}

pub struct GuardrailsFactory;

impl PluginFactory for GuardrailsFactory {
    const KIND: &'static str = "guardrails";
    const SUMMARY: &'static str =
        "Runs guardrail hooks (regex, contains, counts, JSON, PII, webhook...) on input and output; 446 refuses, 246 warns";
    const EXAMPLE: &'static str = "- kind: guardrails          # after provider_select
  before_request_hooks:
    - id: no-pii
      type: mutator
      checks:
        - id: default.pii
          parameters: {redact: true}
  after_request_hooks:
    - id: short-answers
      deny: true
      checks:
        - id: default.wordCount
          parameters: {maxWords: 500}";
    type Config = GuardrailsConfig;

    fn validate(config: &Self::Config) -> Vec<ConfigIssue> {
        let mut issues = config.hooks().err().unwrap_or_default();
        issues.extend(saved::library(&config.library).err().unwrap_or_default());
        issues
    }

    fn build(config: Self::Config, cx: &BuildCx) -> Result<Arc<dyn Plugin>, String> {
        let HookSet { before, after } = config.hooks().map_err(|issues| describe(&issues))?;
        let library = saved::library(&config.library).map_err(|issues| describe(&issues))?;
        // The hosts of the webhooks this file configures are the operator's own: trusted.
        let mut egress = cx.egress.clone();
        let written = before.iter().chain(&after).filter_map(|e| match e {
            Entry::Built(hook) => Some(hook),
            Entry::Named { .. } => None,
        });
        for hook in written.chain(library.values().flatten()) {
            for host in hook.webhook_hosts() {
                egress.trust(host);
            }
        }
        let net = net::Net::new(egress)?;
        let saved = Arc::new(Saved::new(library, cx.access.clone()));
        Ok(Arc::new(Guardrails {
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
            before,
            after,
            saved: saved.clone(),
            runner: Runner {
                net,
                metrics: GuardMetrics::register(&cx.metrics)?,
            },
            stream_check_bytes: config.stream_check_bytes,
            request_network_checks: config.request_network_checks,
            workspaces: WorkspaceHooks::new(saved),
        }))
    }
}

plugin_sdk::register_plugin!(GuardrailsFactory);

impl Guardrails {
    /// The hooks of the request's routing config, if it has one, names resolved for its caller.
    fn config_hooks(&self, cx: &RequestCx) -> Result<DefaultHooks, GatewayError> {
        let set = self.config_entries(cx)?;
        let who = Scope::Caller(cx.extensions.get::<Principal>());
        let mut hooks = DefaultHooks::default();
        for (into, entries) in [
            (&mut hooks.before, &set.before),
            (&mut hooks.after, &set.after),
        ] {
            self.saved
                .extend(into, entries, who)
                .map_err(|(at, problem)| GatewayError::invalid_param(at, problem))?;
        }
        Ok(hooks)
    }

    /// The hook lists of the request's routing config, validated.
    fn config_entries(&self, cx: &RequestCx) -> Result<HookSet, GatewayError> {
        match &cx.plan {
            Some(RoutePlan::Config(config)) => hooks_of_config(
                config,
                Allow {
                    network: self.request_network_checks,
                },
            )
            .map_err(|issues| {
                let message = describe(&issues);
                let param = issues.first().map(|i| i.path.clone()).unwrap_or_default();
                GatewayError::invalid_param(param, format!("invalid hook in the config: {message}"))
            }),
            None if cx.gw.config.is_some() => Err(GatewayError::internal(
                "the guardrails plugin must come after provider_select in the pipeline to read \
                 the hooks of x-gw-config",
            )),
            _ => Ok(HookSet::default()),
        }
    }

    /// This plugin's own hooks of one side, names resolved.
    fn own(&self, entries: &[Entry]) -> Result<Vec<Arc<Hook>>, GatewayError> {
        let mut hooks = Vec::with_capacity(entries.len());
        self.saved
            .extend(&mut hooks, entries, Scope::Operator)
            .map_err(|(_, problem)| {
                GatewayError::internal(format!("the pipeline's guardrails cannot run: {problem}"))
            })?;
        Ok(hooks)
    }

    /// This plugin's output hooks for a request: its own, then the request's.
    fn after_hooks(&self, cx: &RequestCx) -> Result<Vec<Arc<Hook>>, GatewayError> {
        let mut hooks = self.own(&self.after)?;
        if let Some(r) = cx.extensions.get::<RequestHooks>() {
            if r.owner == self.instance {
                hooks.extend(r.after.iter().cloned());
            }
        }
        Ok(hooks)
    }

    /// Ends a stream: every hook on the whole text.
    fn finish_stream(&self, cx: &mut RequestCx, hooks: &[Arc<Hook>], text: String) -> Flow {
        let mut m = Material {
            side: Side::Output,
            subject: Subject::single(text),
            model: cx.requested_model().map(str::to_owned),
            request: Body::new(cx.body.clone()),
            response: None,
            can_rewrite: false,
            rewrites: 0,
        };
        let results = self.runner.run_local(hooks, &mut m);
        self.conclude(cx, Side::Output, results)
    }

    /// Records results; a blocking one answers the 446.
    fn conclude(&self, cx: &mut RequestCx, side: Side, results: Vec<HookResult>) -> Flow {
        let blocks = results.iter().any(HookResult::blocks);
        HookResults::record(cx, side, results);
        if blocks {
            Flow::Respond(refused(&HookResults::of(cx)))
        } else {
            Flow::Continue
        }
    }
}

#[async_trait]
impl Plugin for Guardrails {
    fn kind(&self) -> &'static str {
        GuardrailsFactory::KIND
    }

    fn phases(&self) -> Phases {
        Phases::REQUEST | Phases::RESPONSE | Phases::CHUNK
    }

    async fn on_request(&self, cx: &mut RequestCx) -> Result<Flow, GatewayError> {
        let mut before = self.own(&self.before)?;
        // A name of the output side that does not resolve refuses now, before the provider
        // is paid, not when the answer comes.
        if self.after.iter().any(|e| matches!(e, Entry::Named { .. })) {
            self.own(&self.after)?;
        }
        // The first guardrails entry of the pipeline takes the request's own hooks.
        if cx.extensions.get::<RequestHooks>().is_none() {
            let config = self.config_hooks(cx)?;
            let mut after = Vec::new();
            if let Some(ws) = self.workspaces.of(cx)? {
                before.extend(ws.before.iter().cloned());
                after.extend(ws.after.iter().cloned());
            }
            if let Some(defaults) = cx.extensions.get::<DefaultHooks>() {
                before.extend(defaults.before.iter().cloned());
                after.extend(defaults.after.iter().cloned());
            }
            before.extend(config.before);
            after.extend(config.after);
            cx.extensions.insert(RequestHooks {
                owner: self.instance,
                after,
            });
        }
        if before.is_empty() || matches!(cx.route, Route::Passthrough | Route::FineTuningJobs) {
            return Ok(Flow::Continue);
        }
        let Some(subject) = Subject::read_input(cx.route, &cx.body) else {
            return Ok(Flow::Continue);
        };
        let mut m = Material {
            side: Side::Input,
            subject,
            model: cx.requested_model().map(str::to_owned),
            request: Body::new(cx.body.clone()),
            response: None,
            can_rewrite: true,
            rewrites: 0,
        };
        let results = self.runner.run(&before, &mut m).await;
        if m.transformed() {
            let bytes = serde_json::to_vec(m.request.json())
                .map_err(|e| GatewayError::internal(format!("cannot encode the request: {e}")))?;
            cx.request = LlmRequest::decode(cx.route, &bytes)?;
            cx.body = Bytes::from(bytes);
        }
        Ok(self.conclude(cx, Side::Input, results))
    }

    async fn on_response(
        &self,
        cx: &mut RequestCx,
        response: &mut ResponseParts,
    ) -> Result<Flow, GatewayError> {
        if !response.status.is_success() {
            return Ok(Flow::Continue);
        }
        let after = self.after_hooks(cx)?;
        if matches!(cx.route, Route::ChatCompletions | Route::Messages) && !after.is_empty() {
            if let Some(subject) = Subject::read_output(&response.body) {
                let mut m = Material {
                    side: Side::Output,
                    subject,
                    model: cx.requested_model().map(str::to_owned),
                    request: Body::new(cx.body.clone()),
                    response: Some(Body::new(response.body.clone())),
                    can_rewrite: true,
                    rewrites: 0,
                };
                let results = self.runner.run(&after, &mut m).await;
                if m.transformed() {
                    if let Some(Ok(bytes)) =
                        m.response.as_mut().map(|b| serde_json::to_vec(b.json()))
                    {
                        response.body = Bytes::from(bytes);
                    }
                }
                if let Flow::Respond(r) = self.conclude(cx, Side::Output, results) {
                    return Ok(Flow::Respond(r));
                }
            }
        }
        // One entry writes the results into the answer: the first of the pipeline (the one
        // that took the request's own hooks), whose response phase runs last, after every other
        // entry recorded its own.
        let writes = cx
            .extensions
            .get::<RequestHooks>()
            .is_some_and(|r| r.owner == self.instance);
        let Some(all) = cx.extensions.get::<HookResults>().filter(|_| writes) else {
            return Ok(Flow::Continue);
        };
        if all.before_request_hooks.is_empty() && all.after_request_hooks.is_empty() {
            return Ok(Flow::Continue);
        }
        if let Some(body) = with_results(&response.body, all) {
            response.body = Bytes::from(body);
        }
        if all.any_failed() {
            response.status = warned_status();
        }
        Ok(Flow::Continue)
    }

    fn on_chunk(&self, cx: &mut RequestCx, chunk: &mut Chunk) -> Result<Flow, GatewayError> {
        let request_after = cx
            .extensions
            .get::<RequestHooks>()
            .is_some_and(|r| r.owner == self.instance && !r.after.is_empty());
        let anthropic = match cx.route {
            Route::ChatCompletions => false,
            Route::Messages => true,
            _ => return Ok(Flow::Continue),
        };
        if self.after.is_empty() && !request_after {
            return Ok(Flow::Continue);
        }
        let after = self.after_hooks(cx)?;
        if after.is_empty() {
            return Ok(Flow::Continue);
        }
        let mut states = cx.extensions.remove::<StreamStates>().unwrap_or_default();
        let at = match states.0.iter().position(|(i, _)| *i == self.instance) {
            Some(at) => at,
            None => {
                states.0.push((self.instance, StreamState::default()));
                states.0.len() - 1
            }
        };
        let state = &mut states.0[at].1;
        let mut flow = Flow::Continue;
        if !state.done {
            let end = if anthropic {
                gather_anthropic(&chunk.data, &mut state.text)
            } else {
                let choices = match &cx.request {
                    LlmRequest::Chat(chat) => chat.n.unwrap_or(1).max(1) as usize,
                    _ => 1,
                };
                gather(&chunk.data, &mut state.text, &mut state.choices, choices)
            };
            if end {
                state.done = true;
                let text = std::mem::take(&mut state.text);
                flow = self.finish_stream(cx, &after, text);
            } else if state.text.len() >= state.checked + self.stream_check_bytes {
                state.checked = state.text.len();
                let failed = self.runner.run_partial(&after, &state.text);
                if !failed.is_empty() {
                    state.done = true;
                    flow = self.conclude(cx, Side::Output, failed);
                }
            }
        }
        cx.extensions.insert(states);
        Ok(flow)
    }
}

/// The parts of a `chat.completion.chunk` event that the checks read.
#[derive(Deserialize)]
struct ChunkEvent {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    index: u64,
    #[serde(default)]
    delta: Option<ChunkDelta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct ChunkDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCallDelta>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    arguments: Option<String>,
}

/// The data of each `data:` line of some server-sent events.
fn data_lines(events: &[u8]) -> impl Iterator<Item = &[u8]> {
    events
        .split(|b| *b == b'\n')
        .filter_map(|line| line.strip_prefix(b"data:"))
        .map(<[u8]>::trim_ascii)
}

/// Adds what every choice says in some `chat.completion.chunk` events (content and tool-call
/// argument deltas) to `text`; `choices` tracks which choices have finished. True when the
/// stream's answer is complete: `[DONE]`, or all `expected` choices (the request's `n`) have a
/// `finish_reason`.
fn gather(
    events: &[u8],
    text: &mut String,
    choices: &mut Vec<(u64, bool)>,
    expected: usize,
) -> bool {
    let mut end = false;
    for data in data_lines(events) {
        if data == b"[DONE]" {
            end = true;
            continue;
        }
        let Ok(event) = serde_json::from_slice::<ChunkEvent>(data) else {
            continue;
        };
        for choice in event.choices {
            let at = match choices.iter().position(|(i, _)| *i == choice.index) {
                Some(at) => at,
                None => {
                    choices.push((choice.index, false));
                    choices.len() - 1
                }
            };
            if let Some(delta) = choice.delta {
                if let Some(content) = delta.content {
                    text.push_str(&content);
                }
                for call in delta.tool_calls {
                    if let Some(args) = call.function.and_then(|f| f.arguments) {
                        text.push_str(&args);
                    }
                }
            }
            if choice.finish_reason.is_some() {
                choices[at].1 = true;
            }
        }
    }
    end || (choices.len() >= expected && choices.iter().all(|(_, done)| *done))
}

/// The parts of an Anthropic stream event that the checks read.
#[derive(Deserialize)]
struct AnthropicEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    delta: Option<AnthropicDelta>,
}

#[derive(Deserialize)]
struct AnthropicDelta {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    partial_json: Option<String>,
}

/// Adds the text and tool-input deltas of some Anthropic Messages stream events to `text`; true
/// at `message_stop`.
fn gather_anthropic(events: &[u8], text: &mut String) -> bool {
    let mut end = false;
    for data in data_lines(events) {
        let Ok(event) = serde_json::from_slice::<AnthropicEvent>(data) else {
            continue;
        };
        match event.kind.as_str() {
            "content_block_delta" => {
                if let Some(delta) = event.delta {
                    if let Some(t) = delta.text.or(delta.partial_json) {
                        text.push_str(&t);
                    }
                }
            }
            "message_stop" => end = true,
            _ => {}
        }
    }
    end
}

#[cfg(test)]
mod tests;
