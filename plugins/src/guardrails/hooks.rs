//! Running hooks on a request's input, an answer's output, and a stream as it goes.
//!
//! Hooks run in order; the checks of a hook run in order too, except those that call the
//! network, which run together once the others are done. A rewrite (redaction) is seen by
//! every later check and hook. A hook passes when all its checks pass (an error is a failure).
//! `async` hooks are started after the others, on the text they left, and do not hold the
//! request: their results are logged and counted, never returned.

use std::sync::Arc;
use std::time::Instant;

use futures_util::future::join_all;
use std::sync::OnceLock;

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use serde_json::Value;

use super::checks::{Check, Input, Outcome};
use super::config::Hook;
use super::results::{now_rfc3339, CheckResult, HookResult, Side};
use super::text::Subject;

/// What one side's hooks run on.
#[derive(Debug, Clone)]
pub struct Material {
    pub side: Side,
    pub subject: Subject,
    pub model: Option<String>,
    /// The request body.
    pub request: Body,
    /// The answer body, on the output side.
    pub response: Option<Body>,
    /// False for streamed answers.
    pub can_rewrite: bool,
    /// How many rewrites were applied to the subject (and the body it came from).
    pub rewrites: u32,
}

/// A body as bytes, parsed into JSON only when something needs the tree: a rewrite, or a
/// check that sends the body (a webhook). Most requests never parse it.
#[derive(Debug, Clone)]
pub struct Body {
    bytes: bytes::Bytes,
    json: Option<Value>,
}

impl Body {
    pub fn new(bytes: bytes::Bytes) -> Body {
        Body { bytes, json: None }
    }

    /// The body as JSON (`null` when it is not JSON), parsed on first use.
    pub fn json(&mut self) -> &mut Value {
        self.json
            .get_or_insert_with(|| serde_json::from_slice(&self.bytes).unwrap_or(Value::Null))
    }

    /// The JSON, if it was parsed.
    pub fn parsed(&self) -> Option<&Value> {
        self.json.as_ref()
    }
}

impl Material {
    fn apply(&mut self, texts: Vec<String>) {
        self.subject.set_texts(texts);
        let body = match self.side {
            Side::Input => Some(&mut self.request),
            Side::Output => self.response.as_mut(),
        };
        if let Some(body) = body {
            self.subject.write_into(body.json());
        }
        self.rewrites += 1;
    }

    /// Whether any check rewrote the subject.
    pub fn transformed(&self) -> bool {
        self.rewrites > 0
    }

    /// Parses the bodies, for checks that send them.
    fn parse_bodies(&mut self) {
        self.request.json();
        if let Some(response) = self.response.as_mut() {
            response.json();
        }
    }
}

/// Prometheus counters of hook outcomes. Labels are bounded: check ids come from the known
/// set, sides and outcomes are fixed words. Each label set's counter is looked up once and
/// kept (a lookup hashes its labels).
#[derive(Clone)]
pub struct GuardMetrics {
    /// `gw_guardrail_checks_total{check, side, verdict="pass"|"fail"|"error"|"skipped"}`
    checks: IntCounterVec,
    /// `gw_guardrail_hooks_total{side, outcome="pass"|"fail"|"deny"}`; async hooks included.
    hooks: IntCounterVec,
    /// The counters of `checks` by (known check, side, verdict), filled as they are first used.
    check_counters: Arc<[OnceLock<IntCounter>]>,
    /// The counters of `hooks` by (side, outcome).
    hook_counters: Arc<[OnceLock<IntCounter>]>,
}

const VERDICTS: [&str; 4] = ["pass", "fail", "error", "skipped"];
const OUTCOMES: [&str; 3] = ["pass", "fail", "deny"];

impl GuardMetrics {
    /// Registers the counters. A second `guardrails` entry in the pipeline finds them taken:
    /// its counts are then kept unexported, and a warning says so.
    pub fn register(registry: &Registry) -> Result<GuardMetrics, String> {
        let checks = IntCounterVec::new(
            Opts::new("gw_guardrail_checks_total", "Guardrail check outcomes"),
            &["check", "side", "verdict"],
        )
        .map_err(|e| e.to_string())?;
        let hooks = IntCounterVec::new(
            Opts::new("gw_guardrail_hooks_total", "Guardrail hook outcomes"),
            &["side", "outcome"],
        )
        .map_err(|e| e.to_string())?;
        let taken = registry.register(Box::new(checks.clone())).is_err()
            | registry.register(Box::new(hooks.clone())).is_err();
        if taken {
            tracing::warn!(
                target: "gateway::guardrails",
                "guardrail metrics are already registered (guardrails listed twice?); this \
                 entry's counts are not exported"
            );
        }
        let slots =
            |n: usize| -> Arc<[OnceLock<IntCounter>]> { (0..n).map(|_| OnceLock::new()).collect() };
        Ok(GuardMetrics {
            checks,
            hooks,
            check_counters: slots(super::checks::KNOWN.len() * 2 * VERDICTS.len()),
            hook_counters: slots(2 * OUTCOMES.len()),
        })
    }

    fn count(&self, side: Side, hook: &HookResult) {
        let side_index = usize::from(side == Side::Output);
        let side = side_label(side);
        for c in &hook.checks {
            let verdict = if c.error.is_some() {
                2
            } else if c.data.get("skipped") == Some(&Value::Bool(true)) {
                3
            } else if c.verdict {
                0
            } else {
                1
            };
            if let Some(known) = super::checks::KNOWN.iter().position(|k| *k == c.id) {
                let slot = (known * 2 + side_index) * VERDICTS.len() + verdict;
                self.check_counters[slot]
                    .get_or_init(|| {
                        self.checks.with_label_values(&[
                            super::checks::KNOWN[known],
                            side,
                            VERDICTS[verdict],
                        ])
                    })
                    .inc();
            }
        }
        let outcome = match (hook.verdict, hook.deny && !hook.is_async) {
            (true, _) => 0,
            (false, false) => 1,
            (false, true) => 2,
        };
        self.hook_counters[side_index * OUTCOMES.len() + outcome]
            .get_or_init(|| self.hooks.with_label_values(&[side, OUTCOMES[outcome]]))
            .inc();
    }
}

fn side_label(side: Side) -> &'static str {
    match side {
        Side::Input => "input",
        Side::Output => "output",
    }
}

/// Runs hooks; shared by every request of one plugin.
#[derive(Clone)]
pub struct Runner {
    /// The client of checks that call the network, held to the egress policy.
    pub net: super::net::Net,
    pub metrics: GuardMetrics,
}

impl Runner {
    /// Runs the synchronous hooks in order, then starts the `async` ones on what they left.
    /// Returns the synchronous hooks' results.
    pub async fn run(&self, hooks: &[Arc<Hook>], m: &mut Material) -> Vec<HookResult> {
        let mut results = Vec::new();
        for hook in hooks.iter().filter(|h| !h.is_async) {
            results.push(self.run_hook(hook, m).await);
        }
        let background: Vec<Arc<Hook>> = hooks.iter().filter(|h| h.is_async).cloned().collect();
        if !background.is_empty() {
            let runner = self.clone();
            let mut copy = m.clone();
            // An async hook never rewrites what was sent.
            copy.can_rewrite = false;
            spawn(async move {
                for hook in &background {
                    runner.run_hook(hook, &mut copy).await;
                }
            });
        }
        results
    }

    /// Runs one hook, counts and logs it.
    pub async fn run_hook(&self, hook: &Hook, m: &mut Material) -> HookResult {
        let started = Instant::now();
        let rewrites_before = m.rewrites;
        let mut slots: Vec<Option<CheckResult>> = hook.checks.iter().map(|_| None).collect();
        for (i, check) in hook.checks.iter().enumerate() {
            if !check.needs_network() {
                slots[i] = Some(self.local(check, m));
            }
        }
        if slots.iter().all(Option::is_some) {
            let result = hook_result(
                hook,
                slots.into_iter().flatten().collect(),
                m.rewrites > rewrites_before,
                started,
            );
            self.report(m.side, &result);
            return result;
        }
        m.parse_bodies();
        let input = input_of(m);
        let network = hook
            .checks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.needs_network())
            .map(|(i, c)| async move {
                let t = Instant::now();
                (i, c.id(), c.run(&input, &self.net).await, t)
            });
        for (i, id, outcome, t) in join_all(network).await {
            slots[i] = Some(check_result(id, outcome, t));
        }
        let checks = slots.into_iter().flatten().collect();
        let result = hook_result(hook, checks, m.rewrites > rewrites_before, started);
        self.report(m.side, &result);
        result
    }

    /// Runs one check without the network on the subject's checked text, applying its
    /// rewrite.
    fn local(&self, check: &Check, m: &mut Material) -> CheckResult {
        let t = Instant::now();
        let mut outcome = check.run_local(&input_of(m));
        if let Some(texts) = outcome.rewritten.take() {
            if m.can_rewrite {
                m.apply(texts);
            }
        }
        check_result(check.id(), outcome, t)
    }

    /// Runs hooks without waiting for anything (a finished stream): network checks are
    /// skipped, nothing is rewritten, `async` hooks are started.
    pub fn run_local(&self, hooks: &[Arc<Hook>], m: &mut Material) -> Vec<HookResult> {
        m.can_rewrite = false;
        let mut results = Vec::new();
        for hook in hooks.iter().filter(|h| !h.is_async) {
            let started = Instant::now();
            let checks = hook.checks.iter().map(|c| self.local(c, m)).collect();
            let result = hook_result(hook, checks, false, started);
            self.report(m.side, &result);
            results.push(result);
        }
        let background: Vec<Arc<Hook>> = hooks.iter().filter(|h| h.is_async).cloned().collect();
        if !background.is_empty() {
            let runner = self.clone();
            let mut copy = m.clone();
            spawn(async move {
                for hook in &background {
                    runner.run_hook(hook, &mut copy).await;
                }
            });
        }
        results
    }

    /// On the beginning of a streamed answer: the `deny` hooks that already failed for good,
    /// each with the checks that decided it.
    pub fn run_partial(&self, hooks: &[Arc<Hook>], text: &str) -> Vec<HookResult> {
        let mut results = Vec::new();
        for hook in hooks.iter().filter(|h| h.deny && !h.is_async) {
            let started = Instant::now();
            let failed: Vec<CheckResult> = hook
                .checks
                .iter()
                .filter_map(|c| {
                    let t = Instant::now();
                    c.run_partial(text).map(|mut o| {
                        if let Value::Object(map) = &mut o.data {
                            map.insert("partial".into(), Value::Bool(true));
                            map.insert("checkedBytes".into(), text.len().into());
                        }
                        check_result(c.id(), o, t)
                    })
                })
                .collect();
            if !failed.is_empty() {
                let result = hook_result(hook, failed, false, started);
                self.report(Side::Output, &result);
                results.push(result);
            }
        }
        results
    }

    fn report(&self, side: Side, result: &HookResult) {
        self.metrics.count(side, result);
        if result.verdict {
            tracing::debug!(target: "gateway::guardrails", hook = result.id.as_str(),
                side = side_label(side), is_async = result.is_async, "hook passed");
        } else {
            let failed: Vec<&str> = result
                .checks
                .iter()
                .filter(|c| !c.verdict)
                .map(|c| c.id.as_str())
                .collect();
            tracing::info!(target: "gateway::guardrails", hook = result.id.as_str(),
                side = side_label(side), deny = result.deny, is_async = result.is_async,
                failed = ?failed, "hook failed");
        }
    }
}

/// What a check reads. The bodies are there once parsed ([`Material::parse_bodies`], before
/// the checks that send them); local checks read only the text.
fn input_of(m: &Material) -> Input<'_> {
    Input {
        side: m.side,
        text: m.subject.text(),
        segments: m.subject.texts(),
        model: m.model.as_deref(),
        can_rewrite: m.can_rewrite,
        request: m.request.parsed().unwrap_or(&Value::Null),
        response: m.response.as_ref().and_then(Body::parsed),
    }
}

fn check_result(id: &str, outcome: Outcome, started: Instant) -> CheckResult {
    CheckResult {
        id: id.to_owned(),
        verdict: outcome.verdict && outcome.error.is_none(),
        data: outcome.data,
        error: outcome.error,
        execution_time: started.elapsed().as_millis() as u64,
        created_at: now_rfc3339(),
    }
}

fn hook_result(
    hook: &Hook,
    checks: Vec<CheckResult>,
    transformed: bool,
    started: Instant,
) -> HookResult {
    let verdict = checks.iter().all(|c| c.verdict);
    HookResult {
        id: hook.id.clone(),
        verdict,
        deny: hook.deny,
        is_async: hook.is_async,
        kind: hook.kind.as_str().to_owned(),
        transformed,
        checks,
        execution_time: started.elapsed().as_millis() as u64,
        action: if verdict {
            hook.on_success.clone()
        } else {
            hook.on_fail.clone()
        },
    }
}

/// Starts a task on the current runtime; without one (a unit test's plain thread), the work is
/// dropped with a warning rather than a panic.
fn spawn(work: impl std::future::Future<Output = ()> + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(work);
        }
        Err(_) => tracing::warn!(
            target: "gateway::guardrails",
            "async hooks need a runtime; they did not run"
        ),
    }
}
