//! Hooks as written (raw) and as run (validated).
//!
//! A hook, in the pipeline YAML or a request's routing config:
//!
//! ```yaml
//! id: no-secrets            # default: where it was written (before_request_hooks[0])
//! type: guardrail           # or mutator; default guardrail
//! deny: true                # a failed hook refuses with 446; default false (246)
//! async: false              # true: run beside the request, results only logged and counted
//! checks:
//!   - id: default.regexMatch
//!     parameters: {rule: "(?i)secret", not: true}
//!     is_enabled: true      # default true; disabled checks are skipped
//! on_fail: {feedback: {value: -1, weight: 1}}     # optional, reported with the result
//! on_success: {feedback: {value: 1, weight: 1}}   # optional, reported with the result
//! ```
//!
//! In place of a hook, a list may name a saved one: its id as a string (`"pg-nopii-3f9c2e"`),
//! or an object holding only `id` (and optionally `type`). Names are looked up when a request
//! runs: in the `guardrails` plugin's `library`, then among the guardrails saved through the
//! control plane (`/v1/guardrails`) that the list's owner may use (see `saved`).
//!
//! A hook whose checks are all disabled is skipped. WebAssembly guardrails (`wasm.*` ids) are
//! not hook checks: each is its own `wasm_guardrail` pipeline entry, and naming one in a hook is
//! an error that says so.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use plugin_sdk::egress::TrustedHost;
use plugin_sdk::ConfigIssue;

use super::checks::Check;
use super::results::Side;

/// `guardrail` or `mutator`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum HookKind {
    /// Checks and reports.
    #[default]
    Guardrail,
    /// May also rewrite the text (a redacting `default.pii` check).
    Mutator,
}

impl HookKind {
    pub fn as_str(self) -> &'static str {
        match self {
            HookKind::Guardrail => "guardrail",
            HookKind::Mutator => "mutator",
        }
    }
}

/// A hook as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHook {
    /// Names the hook in results. Default: its place (`before_request_hooks[0]`).
    #[serde(default)]
    pub id: Option<String>,
    /// Default: `guardrail`.
    #[serde(rename = "type", default)]
    pub kind: HookKind,
    pub checks: Vec<RawCheck>,
    /// Refuse (446) when the hook fails. Default: false (the answer goes on with 246).
    #[serde(default)]
    pub deny: bool,
    /// Run without holding the request; results are logged and counted only. Default: false.
    #[serde(rename = "async", default)]
    pub is_async: bool,
    /// Reported with the hook's result when it fails.
    #[serde(default)]
    pub on_fail: Option<Value>,
    /// Reported with the hook's result when it passes.
    #[serde(default)]
    pub on_success: Option<Value>,
}

/// A check as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCheck {
    pub id: String,
    /// The check's parameters (camelCase, as each check documents). Default: none.
    #[serde(default)]
    pub parameters: Value,
    /// Default: true.
    #[serde(default = "enabled")]
    pub is_enabled: bool,
}

fn enabled() -> bool {
    true
}

/// A validated hook, ready to run.
#[derive(Debug)]
pub struct Hook {
    pub id: String,
    pub kind: HookKind,
    pub deny: bool,
    pub is_async: bool,
    pub on_fail: Option<Value>,
    pub on_success: Option<Value>,
    /// The enabled checks of this plugin, in order.
    pub checks: Vec<Check>,
}

impl Hook {
    /// Whether any check calls the network.
    pub fn needs_network(&self) -> bool {
        self.checks.iter().any(Check::needs_network)
    }

    /// The hosts (with ports) of this hook's webhooks.
    pub fn webhook_hosts(&self) -> impl Iterator<Item = TrustedHost> + '_ {
        self.checks.iter().filter_map(|c| match c {
            Check::Webhook(w) => w.host(),
            _ => None,
        })
    }
}

/// Which kinds of checks a hook list may use.
#[derive(Debug, Clone, Copy)]
pub struct Allow {
    /// Checks that call the network (`default.webhook`, `default.validUrls`).
    pub network: bool,
}

/// One item of a hook list as written: a hook, or the name of a saved one.
#[derive(Debug, Clone)]
pub enum RawItem {
    Hook(RawHook),
    /// A library hook's id, or a saved guardrail's slug or id.
    Named(String),
}

/// One item of a hook list, validated.
#[derive(Debug, Clone)]
pub enum Entry {
    Built(Arc<Hook>),
    /// Resolved when a request runs; `at` is where it was written (`input_guardrails[1]`).
    Named {
        id: String,
        at: String,
    },
}

/// Reads the items of a hook list written at `path`: each a hook object, a string naming a
/// saved guardrail, or `{id}` naming one. Problems carry their full path.
pub fn parse_items(value: &Value, path: &str) -> Result<Vec<RawItem>, Vec<ConfigIssue>> {
    let Value::Array(list) = value else {
        return Err(vec![ConfigIssue::new(
            path,
            "must be a list of hooks (objects) or of saved guardrail ids (strings)",
        )]);
    };
    let mut items = Vec::new();
    let mut issues = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let at = format!("{path}[{i}]");
        match item {
            Value::String(id) if id.trim().is_empty() => {
                issues.push(ConfigIssue::new(at, "a guardrail id must not be empty"))
            }
            Value::String(id) => items.push(RawItem::Named(id.clone())),
            Value::Object(map) if !map.contains_key("checks") => match map.get("id") {
                Some(Value::String(id)) if !id.trim().is_empty() => {
                    let extra: Vec<&String> =
                        map.keys().filter(|k| *k != "id" && *k != "type").collect();
                    match extra.first() {
                        None => items.push(RawItem::Named(id.clone())),
                        Some(key) => issues.push(ConfigIssue::new(
                            format!("{at}.{key}"),
                            "a hook without checks names a saved guardrail and takes only its \
                             id: the saved guardrail holds its checks and actions",
                        )),
                    }
                }
                _ => issues.push(ConfigIssue::new(
                    format!("{at}.checks"),
                    "a hook needs checks, or an id naming a saved guardrail",
                )),
            },
            Value::Object(_) => match serde_path_to_error::deserialize::<_, RawHook>(item) {
                Ok(raw) => items.push(RawItem::Hook(raw)),
                Err(e) => {
                    let inner = e.path().to_string();
                    let message = e.into_inner().to_string();
                    let path = match (inner.as_str(), missing_field(&message)) {
                        (".", Some(field)) => format!("{at}.{field}"),
                        (".", None) => at,
                        (p, Some(field)) => format!("{}.{field}", join(&at, p)),
                        (p, None) => join(&at, p),
                    };
                    issues.push(ConfigIssue::new(path, message));
                }
            },
            _ => issues.push(ConfigIssue::new(
                at,
                "must be a hook (an object) or a saved guardrail's id (a string)",
            )),
        }
    }
    if issues.is_empty() {
        Ok(items)
    } else {
        Err(issues)
    }
}

/// Validates the items of a hook list written at `path`: hooks are built, names kept.
pub fn build_items(
    items: &[RawItem],
    path: &str,
    allow: Allow,
) -> Result<Vec<Entry>, Vec<ConfigIssue>> {
    let mut out = Vec::new();
    let mut issues = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("{path}[{i}]");
        match item {
            RawItem::Named(id) => out.push(Entry::Named { id: id.clone(), at }),
            RawItem::Hook(raw) => match build_hook(raw, &at, allow) {
                Ok(Some(h)) => out.push(Entry::Built(Arc::new(h))),
                Ok(None) => {}
                Err(found) => issues.extend(found),
            },
        }
    }
    if issues.is_empty() {
        Ok(out)
    } else {
        Err(issues)
    }
}

/// Builds one saved hook (a library entry, or a guardrail saved through the control plane)
/// named `id`: `None` when it holds no enabled check.
pub fn build_saved(raw: &RawHook, id: &str, allow: Allow) -> Result<Option<Hook>, String> {
    build_hook(raw, id, allow)
        .map(|hook| {
            hook.map(|mut h| {
                h.id = raw.id.clone().unwrap_or_else(|| id.to_owned());
                h
            })
        })
        .map_err(|issues| describe(&issues))
}

/// Issues as one line: `path: message; path: message`.
pub fn describe(issues: &[ConfigIssue]) -> String {
    issues
        .iter()
        .map(|i| format!("{}: {}", i.path, i.message))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Validates a list of hooks written at `path` (`before_request_hooks`). Every problem is
/// reported with its full path (`before_request_hooks[0].checks[1].parameters.rule`).
pub fn build_hooks(
    raw: &[RawHook],
    path: &str,
    allow: Allow,
) -> Result<Vec<Arc<Hook>>, Vec<ConfigIssue>> {
    let mut hooks = Vec::new();
    let mut issues = Vec::new();
    for (i, hook) in raw.iter().enumerate() {
        let at = format!("{path}[{i}]");
        match build_hook(hook, &at, allow) {
            Ok(Some(h)) => hooks.push(Arc::new(h)),
            Ok(None) => {}
            Err(found) => issues.extend(found),
        }
    }
    if issues.is_empty() {
        Ok(hooks)
    } else {
        Err(issues)
    }
}

/// Validates one hook; `None` when it holds no enabled check of this plugin.
fn build_hook(raw: &RawHook, at: &str, allow: Allow) -> Result<Option<Hook>, Vec<ConfigIssue>> {
    let mut issues = Vec::new();
    if raw.checks.is_empty() {
        issues.push(ConfigIssue::new(
            format!("{at}.checks"),
            "a hook needs at least one check",
        ));
    }
    if let Some(id) = &raw.id {
        if id.trim().is_empty() {
            issues.push(ConfigIssue::new(format!("{at}.id"), "must not be empty"));
        }
    }
    for (field, value) in [("on_fail", &raw.on_fail), ("on_success", &raw.on_success)] {
        if let Some(v) = value {
            if let Err(x) = check_action(v) {
                issues.push(ConfigIssue::new(
                    join(&format!("{at}.{field}"), &x.path),
                    x.message,
                ));
            }
        }
    }
    let mut checks = Vec::new();
    for (j, check) in raw.checks.iter().enumerate() {
        let check_at = format!("{at}.checks[{j}]");
        if check.id.starts_with("wasm.") {
            issues.push(ConfigIssue::new(
                format!("{check_at}.id"),
                "WebAssembly guardrails are not hook checks: add a `wasm_guardrail` entry to \
                 the pipeline instead",
            ));
            continue;
        }
        match Check::parse(&check.id, &check.parameters) {
            Ok(c) if c.needs_network() && !allow.network => issues.push(ConfigIssue::new(
                format!("{check_at}.id"),
                format!(
                    "{} calls the network, which this gateway does not allow for hooks sent \
                     with a request (guardrails: request_network_checks)",
                    c.id()
                ),
            )),
            Ok(c) => {
                if check.is_enabled {
                    checks.push(c);
                }
            }
            Err(x) if x.path.is_empty() => {
                issues.push(ConfigIssue::new(format!("{check_at}.id"), x.message));
            }
            Err(x) => issues.push(ConfigIssue::new(
                join(&format!("{check_at}.parameters"), &x.path),
                x.message,
            )),
        }
    }
    if !issues.is_empty() {
        return Err(issues);
    }
    if checks.is_empty() {
        return Ok(None);
    }
    Ok(Some(Hook {
        id: raw.id.clone().unwrap_or_else(|| at.to_owned()),
        kind: raw.kind,
        deny: raw.deny,
        is_async: raw.is_async,
        on_fail: raw.on_fail.clone(),
        on_success: raw.on_success.clone(),
        checks,
    }))
}

/// `on_fail` / `on_success`: an object; its `feedback`, when given, is
/// `{value: -10..=10, weight: 0..=1, metadata: {...}}`, each optional. Other keys are kept as
/// written.
fn check_action(v: &Value) -> Result<(), ConfigIssue> {
    let Value::Object(map) = v else {
        return Err(ConfigIssue::new(
            "",
            "must be an object, like {feedback: {value: -1, weight: 1}}",
        ));
    };
    let Some(feedback) = map.get("feedback") else {
        return Ok(());
    };
    let Value::Object(feedback) = feedback else {
        return Err(ConfigIssue::new(
            "feedback",
            "must be an object {value, weight, metadata}",
        ));
    };
    for (key, v) in feedback {
        let ok = match key.as_str() {
            "value" => v.as_f64().is_some_and(|x| (-10.0..=10.0).contains(&x)),
            "weight" => v.as_f64().is_some_and(|x| (0.0..=1.0).contains(&x)),
            "metadata" => v.is_object(),
            _ => {
                return Err(ConfigIssue::new(
                    format!("feedback.{key}"),
                    "unknown field; expected value, weight or metadata",
                ))
            }
        };
        if !ok {
            let want = match key.as_str() {
                "value" => "a number from -10 to 10",
                "weight" => "a number from 0 to 1",
                _ => "an object",
            };
            return Err(ConfigIssue::new(
                format!("feedback.{key}"),
                format!("must be {want}"),
            ));
        }
    }
    Ok(())
}

fn join(prefix: &str, rest: &str) -> String {
    match rest {
        "" => prefix.to_owned(),
        r if r.starts_with('[') => format!("{prefix}{r}"),
        r => format!("{prefix}.{r}"),
    }
}

/// The names a hook list may be written under, per side: the reference's name first.
pub fn side_keys(side: Side) -> [&'static str; 2] {
    match side {
        Side::Input => ["before_request_hooks", "input_guardrails"],
        Side::Output => ["after_request_hooks", "output_guardrails"],
    }
}

/// The validated hooks of both sides.
#[derive(Debug, Clone, Default)]
pub struct HookSet {
    pub before: Vec<Entry>,
    pub after: Vec<Entry>,
}

/// The hooks of a request's routing config (its top level; nested targets' hooks are not
/// read). Problems are reported with their path in the config.
pub fn hooks_of_config(config: &Value, allow: Allow) -> Result<HookSet, Vec<ConfigIssue>> {
    let mut issues = Vec::new();
    let mut sides = Vec::new();
    for side in [Side::Input, Side::Output] {
        let mut hooks = Vec::new();
        let keys = side_keys(side);
        if keys.iter().all(|k| config.get(k).is_some()) {
            issues.push(ConfigIssue::new(
                keys[1],
                format!("give {} or {}, not both", keys[0], keys[1]),
            ));
        }
        for key in keys {
            let Some(value) = config.get(key) else {
                continue;
            };
            match parse_items(value, key).and_then(|items| build_items(&items, key, allow)) {
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

fn missing_field(message: &str) -> Option<&str> {
    message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ALL: Allow = Allow { network: true };

    fn paths(config: Value) -> Vec<String> {
        hooks_of_config(&config, ALL)
            .unwrap_err()
            .into_iter()
            .map(|i| i.path)
            .collect()
    }

    #[test]
    fn a_config_s_hooks_are_read_with_defaults() {
        let config = json!({
            "provider": "openai",
            "input_guardrails": [{
                "checks": [
                    {"id": "default.contains", "parameters": {"words": ["x"]}},
                    {"id": "default.wordCount", "parameters": {"maxWords": 2}, "is_enabled": false}
                ],
                "on_fail": {"feedback": {"value": -1, "weight": 1}}
            }],
            "after_request_hooks": [{"id": "out", "type": "mutator", "deny": true, "async": true,
                "checks": [{"id": "default.pii", "parameters": {"redact": true}}]},
                {"checks": [{"id": "default.pii", "is_enabled": false}]}]
        });
        let HookSet {
            before: input,
            after: output,
        } = hooks_of_config(&config, ALL).unwrap();
        let built = |entries: Vec<Entry>| -> Vec<Arc<Hook>> {
            entries
                .into_iter()
                .map(|e| match e {
                    Entry::Built(h) => h,
                    Entry::Named { id, .. } => panic!("{id} is a name"),
                })
                .collect()
        };
        let (input, output) = (built(input), built(output));
        assert_eq!(input.len(), 1);
        let h = &input[0];
        assert_eq!(h.id, "input_guardrails[0]");
        assert_eq!(h.kind, HookKind::Guardrail);
        assert!(!h.deny && !h.is_async);
        assert_eq!(
            h.checks.len(),
            1,
            "disabled and foreign checks are not run here"
        );
        assert_eq!(h.on_fail.as_ref().unwrap()["feedback"]["value"], -1);
        assert_eq!(output.len(), 1, "a hook of only disabled checks is skipped");
        assert!(output[0].deny && output[0].is_async);
        assert_eq!(output[0].kind, HookKind::Mutator);
        assert!(hooks_of_config(&json!({}), ALL).unwrap().before.is_empty());
    }

    #[test]
    fn problems_name_their_path() {
        assert_eq!(
            paths(json!({"before_request_hooks": [{"checks": [
                {"id": "default.contains", "parameters": {"words": ["a"]}},
                {"id": "default.regexMatch", "parameters": {"rule": "("}}
            ]}]})),
            vec!["before_request_hooks[0].checks[1].parameters.rule"]
        );
        assert_eq!(
            paths(json!({"after_request_hooks": [{"checks": [{"id": "default.nope"}]}]})),
            vec!["after_request_hooks[0].checks[0].id"]
        );
        let issues = hooks_of_config(
            &json!({"after_request_hooks": [{"checks": [{"id": "wasm.pii"}]}]}),
            ALL,
        )
        .unwrap_err();
        assert_eq!(issues[0].path, "after_request_hooks[0].checks[0].id");
        assert!(issues[0].message.contains("wasm_guardrail"));
        assert_eq!(
            paths(
                json!({"before_request_hooks": [{"checks": [{"id": "default.pii", "parameters": {}}], "dney": true}]})
            ),
            vec!["before_request_hooks[0].dney"]
        );
        assert_eq!(
            paths(json!({"before_request_hooks": [{"checks": [{"parameters": {}}]}]})),
            vec!["before_request_hooks[0].checks[0].id"]
        );
        assert_eq!(
            paths(json!({"before_request_hooks": {"checks": []}})),
            vec!["before_request_hooks"]
        );
        assert_eq!(
            paths(json!({"output_guardrails": [{"checks": []}], "after_request_hooks": []})),
            vec!["output_guardrails", "output_guardrails[0].checks"]
        );
        assert_eq!(
            paths(
                json!({"before_request_hooks": [{"checks": [{"id": "default.pii"}],
                "on_fail": {"feedback": {"value": 50}}, "on_success": 3}]})
            ),
            vec![
                "before_request_hooks[0].on_fail.feedback.value",
                "before_request_hooks[0].on_success"
            ]
        );
    }

    #[test]
    fn saved_guardrails_are_named_by_string_or_id_only() {
        let set = hooks_of_config(
            &json!({"input_guardrails": ["pg-a", {"id": "pg-b", "type": "guardrail"},
                {"checks": [{"id": "default.pii"}]}]}),
            ALL,
        )
        .unwrap();
        let names: Vec<(String, String)> = set
            .before
            .iter()
            .filter_map(|e| match e {
                Entry::Named { id, at } => Some((id.clone(), at.clone())),
                Entry::Built(_) => None,
            })
            .collect();
        assert_eq!(
            names,
            vec![
                ("pg-a".to_owned(), "input_guardrails[0]".to_owned()),
                ("pg-b".to_owned(), "input_guardrails[1]".to_owned())
            ]
        );
        assert!(matches!(set.before[2], Entry::Built(_)));
        assert_eq!(
            paths(json!({"before_request_hooks": [{"id": "pg-a", "deny": true}]})),
            vec!["before_request_hooks[0].deny"],
            "a name takes no actions: the saved guardrail holds them"
        );
        assert_eq!(
            paths(json!({"before_request_hooks": ["", {"type": "guardrail"}, 3]})),
            vec![
                "before_request_hooks[0]",
                "before_request_hooks[1].checks",
                "before_request_hooks[2]"
            ]
        );
    }

    #[test]
    fn network_checks_may_be_refused() {
        let config = json!({"before_request_hooks": [{"checks": [
            {"id": "default.webhook", "parameters": {"webhookURL": "http://127.0.0.1:9/"}}
        ]}]});
        let issues = hooks_of_config(&config, Allow { network: false }).unwrap_err();
        assert_eq!(issues[0].path, "before_request_hooks[0].checks[0].id");
        assert!(issues[0].message.contains("request_network_checks"));
    }
}
