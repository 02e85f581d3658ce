//! Which requests a policy governs, and which of its counters a request is charged to.
//!
//! A rate or usage limits policy has `conditions` (which requests it applies to) and `group_by`
//! keys (each distinct combination of their values has its own counter, named by its value
//! key). Both are evaluated against a [`Subject`]: the few facts about a request that policies
//! can name, gathered once per request by [`Subject::of`].
//!
//! Rules (the control plane's "Policies" reference and [`Condition`]):
//! - every condition must match (AND);
//! - a condition's value lists alternatives separated by commas (OR), each trimmed;
//! - `*` matches any request that has a value for the key;
//! - a value ending in `*` matches by prefix (`gpt-4*`);
//! - a request matching any of the condition's `excludes` (same syntax) does not match;
//! - a request without a value for the condition's key does not match;
//! - `model` values of the form `@provider/model` match the request's model qualified by the
//!   provider it goes to (the saved provider's slug, else the provider id); other values match
//!   the bare model name. A request whose body says `@provider/model` matches both forms.
//!
//! Values are compared exactly (case-sensitive).

use std::borrow::Cow;
use std::collections::BTreeMap;

use plugin_sdk::access::{Condition, Principal};
use plugin_sdk::{RequestCx, RoutePlan};
use serde_json::Value;

/// What policy conditions and group_by keys are evaluated against, gathered once per request.
///
/// Keys ([`Subject::get`]): `api_key`, `workspace_id`, `metadata.<name>`, `provider`,
/// `virtual_key`, `config`, `model`. An empty value counts as no value.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// The API key's id (from the [`Principal`]); `None` under JWT or without auth.
    pub api_key_id: Option<&'a str>,
    /// The caller's workspace (from the [`Principal`]).
    pub workspace_id: Option<&'a str>,
    /// The request's metadata (`x-gw-metadata`, with the key's defaults when auth merged them).
    pub metadata: &'a BTreeMap<String, String>,
    /// The saved provider slug when `@slug`/virtual key was used, else the provider id.
    pub provider: Option<&'a str>,
    /// The saved provider slug, when one was used.
    pub virtual_key: Option<&'a str>,
    /// The saved config id/slug when `x-gw-config` named one (inline JSON has none).
    pub config: Option<&'a str>,
    /// The requested model, as the body names it.
    pub model: Option<&'a str>,
}

impl<'a> Subject<'a> {
    /// Gathers the subject of a request: the [`Principal`] the auth plugin put in
    /// `cx.extensions` (none: no key and no workspace), the metadata and config of `cx.gw`, the
    /// provider from `cx.plan` (or, before provider selection ran, from the headers) and the
    /// body's model.
    ///
    /// The provider of a routing config is its top-level `provider` (or `virtual_key`) when it
    /// names one; a config that spreads requests over several targets has no single provider
    /// when limits are checked, so `provider`/`virtual_key` conditions do not match it.
    pub fn of(cx: &'a RequestCx) -> Subject<'a> {
        let principal = cx.extensions.get::<Principal>();
        let (provider, virtual_key) = match &cx.plan {
            Some(RoutePlan::Single(t)) => match t.slug.as_deref() {
                Some(slug) => (Some(slug), Some(slug)),
                None => (Some(t.provider.as_str()), None),
            },
            Some(RoutePlan::Config(config)) => provider_of_config(config),
            None => provider_of_headers(cx),
        };
        let config = cx
            .gw
            .config
            .as_deref()
            .filter(|c| !c.trim_start().starts_with('{'));
        Subject {
            api_key_id: principal.and_then(|p| p.api_key_id.as_deref()),
            workspace_id: principal.and_then(|p| p.workspace_id.as_deref()),
            metadata: &cx.gw.metadata,
            provider: non_empty(provider),
            virtual_key: non_empty(virtual_key),
            config: non_empty(config),
            model: non_empty(cx.requested_model()),
        }
    }

    /// The request's value for a condition or group_by key: `api_key`, `workspace_id`,
    /// `metadata.<name>`, `provider`, `virtual_key`, `config`, `model`. `None` for a key the
    /// request has no (or an empty) value for, and for unknown keys.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        let value = match key {
            "api_key" => self.api_key_id,
            "workspace_id" => self.workspace_id,
            "provider" => self.provider,
            "virtual_key" => self.virtual_key,
            "config" => self.config,
            "model" => self.model,
            _ => {
                let name = key.strip_prefix("metadata.")?;
                self.metadata.get(name).map(String::as_str)
            }
        };
        non_empty(value)
    }

    /// The model without an `@provider/` prefix.
    fn bare_model(&self) -> Option<&'a str> {
        let model = self.model?;
        match model.strip_prefix('@') {
            // `@provider/model` as sent: its bare form is the part after the first `/`.
            Some(rest) => rest
                .split_once('/')
                .map(|(_, m)| m)
                .filter(|m| !m.is_empty()),
            None => Some(model),
        }
    }

    /// The model qualified by the provider it goes to (`@provider/model`), when both are known.
    fn qualified_model(&self) -> Option<Cow<'a, str>> {
        let model = self.model?;
        if model.starts_with('@') {
            return Some(Cow::Borrowed(model));
        }
        self.provider.map(|p| Cow::Owned(format!("@{p}/{model}")))
    }
}

fn non_empty(v: Option<&str>) -> Option<&str> {
    v.filter(|v| !v.is_empty())
}

/// `(provider, virtual_key)` of a config that names one provider at its top level.
fn provider_of_config(config: &Value) -> (Option<&str>, Option<&str>) {
    if let Some(p) = config.get("provider").and_then(Value::as_str) {
        return match p.strip_prefix('@') {
            Some(slug) => (Some(slug), Some(slug)),
            None => (Some(p), None),
        };
    }
    match config.get("virtual_key").and_then(Value::as_str) {
        Some(slug) => (Some(slug), Some(slug)),
        None => (None, None),
    }
}

/// `(provider, virtual_key)` from `x-gw-provider` / `x-gw-virtual-key`, for a pipeline where
/// limits run before provider selection.
fn provider_of_headers(cx: &RequestCx) -> (Option<&str>, Option<&str>) {
    if let Some(p) = cx.gw.provider.as_deref() {
        return match p.strip_prefix('@') {
            Some(slug) => (Some(slug), Some(slug)),
            None => (Some(p), None),
        };
    }
    match cx.gw.virtual_key.as_deref() {
        Some(slug) => (Some(slug), Some(slug)),
        None => (None, None),
    }
}

/// One alternative of a condition value: exact, or a prefix when it ends in `*` (`*` alone
/// matches everything).
fn pattern_matches(pattern: &str, value: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => value.starts_with(prefix),
        None => pattern == value,
    }
}

/// The alternatives of a value list: comma-separated, trimmed, empty ones dropped.
fn alternatives(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|p| !p.is_empty())
}

/// Whether one alternative matches the request's value for `key`. For `model`, an
/// `@provider/...` pattern is tested against the qualified model, any other against the bare one.
fn alternative_matches(key: &str, pattern: &str, s: &Subject) -> bool {
    if key == "model" && pattern != "*" {
        return if pattern.starts_with('@') {
            s.qualified_model()
                .is_some_and(|q| pattern_matches(pattern, &q))
        } else {
            s.bare_model().is_some_and(|b| pattern_matches(pattern, b))
        };
    }
    s.get(key).is_some_and(|v| pattern_matches(pattern, v))
}

/// Whether one condition matches: the request has a value for its key, one of the value's
/// alternatives matches it and none of `excludes` does.
fn condition_matches(c: &Condition, s: &Subject) -> bool {
    if s.get(&c.key).is_none() {
        return false;
    }
    if !alternatives(&c.value).any(|p| alternative_matches(&c.key, p, s)) {
        return false;
    }
    let excluded = c
        .excludes
        .iter()
        .flatten()
        .flat_map(|e| alternatives(e))
        .any(|p| alternative_matches(&c.key, p, s));
    !excluded
}

/// Whether every condition matches the request (AND across conditions; no conditions: every
/// request matches).
pub fn matches(conditions: &[Condition], s: &Subject) -> bool {
    conditions.iter().all(|c| condition_matches(c, s))
}

/// The counter a policy charges this request to: its `group_by` keys with the request's
/// values ([`plugin_sdk::access::value_key`]). A key the request has no value for counts as
/// the empty value, so leaving a value out (`metadata._user`) cannot dodge the policy: every
/// such request shares one counter. An empty `group_by` gives the empty key: one counter for
/// every matching request.
pub fn value_key(group_by: &[String], s: &Subject) -> String {
    plugin_sdk::access::value_key(
        group_by
            .iter()
            .map(|key| (key.as_str(), s.get(key).unwrap_or(""))),
    )
}

/// Whether a policy of `workspace_id` governs this request (the request's workspace is the
/// policy's). A request without a workspace (an organisation key, no auth) is governed by none.
pub fn in_workspace(policy_workspace: &str, s: &Subject) -> bool {
    s.workspace_id == Some(policy_workspace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_sdk::access::AuthMethod;
    use plugin_sdk::headers::GwHeaders;
    use plugin_sdk::llm::{ChatRequest, LlmRequest};
    use plugin_sdk::{Route, Target};
    use std::sync::Arc;

    fn cond(key: &str, value: &str) -> Condition {
        Condition {
            key: key.into(),
            value: value.into(),
            excludes: None,
        }
    }

    fn cond_ex(key: &str, value: &str, excludes: &[&str]) -> Condition {
        Condition {
            excludes: Some(excludes.iter().map(|e| e.to_string()).collect()),
            ..cond(key, value)
        }
    }

    fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn subject<'a>(metadata: &'a BTreeMap<String, String>) -> Subject<'a> {
        Subject {
            api_key_id: Some("key-1"),
            workspace_id: Some("ws-1"),
            metadata,
            provider: Some("openai"),
            virtual_key: None,
            config: None,
            model: Some("gpt-4o"),
        }
    }

    #[test]
    fn get_reads_every_key() {
        let m = meta(&[("_user", "alice"), ("empty", "")]);
        let s = Subject {
            virtual_key: Some("prod"),
            config: Some("pc-1"),
            ..subject(&m)
        };
        assert_eq!(s.get("api_key"), Some("key-1"));
        assert_eq!(s.get("workspace_id"), Some("ws-1"));
        assert_eq!(s.get("metadata._user"), Some("alice"));
        assert_eq!(s.get("metadata.empty"), None, "empty is no value");
        assert_eq!(s.get("metadata.nope"), None);
        assert_eq!(s.get("provider"), Some("openai"));
        assert_eq!(s.get("virtual_key"), Some("prod"));
        assert_eq!(s.get("config"), Some("pc-1"));
        assert_eq!(s.get("model"), Some("gpt-4o"));
        assert_eq!(s.get("unknown"), None);
        assert_eq!(s.get("metadata"), None);
    }

    #[test]
    fn conditions_are_anded() {
        let m = meta(&[("_user", "alice")]);
        let s = subject(&m);
        assert!(matches(&[], &s), "no conditions match everything");
        assert!(matches(
            &[cond("metadata._user", "alice"), cond("model", "gpt-4o")],
            &s
        ));
        assert!(!matches(
            &[cond("metadata._user", "alice"), cond("model", "gpt-3.5")],
            &s
        ));
        assert!(!matches(
            &[cond("metadata._user", "bob"), cond("model", "gpt-4o")],
            &s
        ));
    }

    #[test]
    fn comma_separated_values_are_ored_and_trimmed() {
        let m = meta(&[("env", "prod")]);
        let s = subject(&m);
        assert!(matches(&[cond("metadata.env", "dev, prod")], &s));
        assert!(matches(&[cond("metadata.env", "prod,dev")], &s));
        assert!(!matches(&[cond("metadata.env", "dev,staging")], &s));
        assert!(
            !matches(&[cond("metadata.env", " , ")], &s),
            "no alternatives"
        );
    }

    #[test]
    fn star_means_the_request_has_the_key() {
        let m = meta(&[("_user", "alice")]);
        let s = subject(&m);
        assert!(matches(&[cond("metadata._user", "*")], &s));
        assert!(!matches(&[cond("metadata.team", "*")], &s));
        assert!(matches(&[cond("api_key", "*")], &s));
        let jwt = Subject {
            api_key_id: None,
            ..s
        };
        assert!(!matches(&[cond("api_key", "*")], &jwt));
        assert!(matches(&[cond("model", "*")], &s));
        let no_model = Subject { model: None, ..s };
        assert!(!matches(&[cond("model", "*")], &no_model));
    }

    #[test]
    fn trailing_star_is_a_prefix() {
        let m = meta(&[("team", "research-ml")]);
        let s = subject(&m);
        assert!(matches(&[cond("metadata.team", "research-*")], &s));
        assert!(!matches(&[cond("metadata.team", "sales-*")], &s));
        assert!(matches(&[cond("model", "gpt-4*")], &s));
        assert!(!matches(&[cond("model", "claude*")], &s));
        // A star elsewhere is a literal character.
        assert!(!matches(&[cond("metadata.team", "res*ml")], &s));
    }

    #[test]
    fn excludes_never_match() {
        let m = meta(&[("_user", "alice")]);
        let s = subject(&m);
        assert!(!matches(&[cond_ex("metadata._user", "*", &["alice"])], &s));
        assert!(matches(&[cond_ex("metadata._user", "*", &["bob"])], &s));
        assert!(!matches(&[cond_ex("model", "gpt-*", &["gpt-4*"])], &s));
        assert!(!matches(&[cond_ex("model", "*", &["bob,gpt-4o"])], &s));
        assert!(!matches(&[cond_ex("model", "*", &["@openai/*"])], &s));
        assert!(matches(&[cond_ex("model", "*", &["@groq/*"])], &s));
    }

    #[test]
    fn a_missing_key_does_not_match() {
        let m = meta(&[]);
        let s = Subject {
            provider: None,
            ..subject(&m)
        };
        assert!(!matches(&[cond("metadata._user", "alice")], &s));
        assert!(!matches(&[cond("provider", "openai")], &s));
        assert!(!matches(&[cond("config", "*")], &s));
        assert!(!matches(&[cond("virtual_key", "*")], &s));
        // Even a condition made only of excludes needs the key.
        assert!(!matches(&[cond_ex("metadata._user", "*", &["x"])], &s));
    }

    #[test]
    fn model_matches_bare_and_provider_forms() {
        let m = meta(&[]);
        let s = subject(&m);
        assert!(matches(&[cond("model", "gpt-4o")], &s));
        assert!(matches(&[cond("model", "@openai/gpt-4o")], &s));
        assert!(matches(&[cond("model", "@openai/gpt-*")], &s));
        assert!(matches(&[cond("model", "@openai/*")], &s));
        assert!(!matches(&[cond("model", "@groq/gpt-4o")], &s));
        // A saved provider is named by its slug.
        let saved = Subject {
            provider: Some("prod-openai"),
            virtual_key: Some("prod-openai"),
            ..s
        };
        assert!(matches(&[cond("model", "@prod-openai/gpt-4o")], &saved));
        assert!(!matches(&[cond("model", "@openai/gpt-4o")], &saved));
        // The body may itself say @provider/model.
        let qualified = Subject {
            model: Some("@prod/gpt-4o"),
            provider: None,
            ..s
        };
        assert!(matches(&[cond("model", "gpt-4o")], &qualified));
        assert!(matches(&[cond("model", "@prod/gpt-4o")], &qualified));
        assert!(matches(
            &[cond("model", "gpt-4o-mini, @prod/*")],
            &qualified
        ));
        assert!(!matches(&[cond("model", "@other/gpt-4o")], &qualified));
        // Without a known provider only the bare form can match.
        let unknown = Subject {
            provider: None,
            ..s
        };
        assert!(matches(&[cond("model", "gpt-4o")], &unknown));
        assert!(!matches(&[cond("model", "@openai/gpt-4o")], &unknown));
    }

    #[test]
    fn value_keys_follow_group_by_order() {
        let m = meta(&[("_user", "alice")]);
        let s = subject(&m);
        assert_eq!(
            value_key(&["metadata._user".into()], &s),
            "metadata._user:alice"
        );
        assert_eq!(
            value_key(&["api_key".into(), "model".into()], &s),
            "api_key:key-1|model:gpt-4o"
        );
        assert_eq!(
            value_key(&["model".into(), "api_key".into()], &s),
            "model:gpt-4o|api_key:key-1"
        );
        // No value: the empty one, shared by every request without it.
        assert_eq!(value_key(&["metadata.team".into()], &s), "metadata.team:");
        assert_eq!(value_key(&[], &s), "");
    }

    #[test]
    fn workspace_of_the_policy() {
        let m = meta(&[]);
        let s = subject(&m);
        assert!(in_workspace("ws-1", &s));
        assert!(!in_workspace("ws-2", &s));
        let org = Subject {
            workspace_id: None,
            ..s
        };
        assert!(!in_workspace("ws-1", &org));
    }

    fn cx() -> RequestCx {
        RequestCx::new(
            "t".into(),
            Route::ChatCompletions,
            http::Method::POST,
            "/v1/chat/completions".into(),
        )
    }

    fn chat(model: &str) -> LlmRequest {
        let body =
            format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
        let req: ChatRequest = serde_json::from_str(&body).expect("chat request");
        LlmRequest::Chat(Box::new(req))
    }

    #[test]
    fn subject_of_a_request() {
        let mut cx = cx();
        cx.extensions.insert(Principal {
            method: AuthMethod::ApiKey(plugin_sdk::access::KeyKind::WorkspaceService),
            organisation_id: Some("org".into()),
            workspace_id: Some("ws-9".into()),
            api_key_id: Some("k-9".into()),
            user_id: None,
            scopes: vec![],
            rate_limits: vec![],
            budgets: vec![],
        });
        let mut headers = http::HeaderMap::new();
        headers.insert("x-gw-metadata", r#"{"_user":"ann"}"#.parse().unwrap());
        headers.insert("x-gw-config", "pc-7".parse().unwrap());
        cx.gw = GwHeaders::parse(&headers).unwrap();
        cx.request = chat("gpt-4o-mini");
        cx.plan = Some(RoutePlan::Single(Target {
            provider: "openai".into(),
            slug: Some("prod".into()),
            ..Target::default()
        }));
        let s = Subject::of(&cx);
        assert_eq!(s.api_key_id, Some("k-9"));
        assert_eq!(s.workspace_id, Some("ws-9"));
        assert_eq!(s.get("metadata._user"), Some("ann"));
        assert_eq!(s.provider, Some("prod"));
        assert_eq!(s.virtual_key, Some("prod"));
        assert_eq!(s.config, Some("pc-7"));
        assert_eq!(s.model, Some("gpt-4o-mini"));
    }

    #[test]
    fn subject_provider_from_plan_config_or_headers() {
        let mut cx = cx();
        let s = Subject::of(&cx);
        assert_eq!(
            (s.api_key_id, s.workspace_id, s.provider),
            (None, None, None)
        );

        cx.plan = Some(RoutePlan::Single(Target {
            provider: "groq".into(),
            ..Target::default()
        }));
        let s = Subject::of(&cx);
        assert_eq!((s.provider, s.virtual_key), (Some("groq"), None));

        cx.plan = Some(RoutePlan::Config(Arc::new(
            serde_json::json!({"provider": "@team-a"}),
        )));
        let s = Subject::of(&cx);
        assert_eq!(
            (s.provider, s.virtual_key),
            (Some("team-a"), Some("team-a"))
        );

        cx.plan = Some(RoutePlan::Config(Arc::new(serde_json::json!({
            "strategy": {"mode": "fallback"},
            "targets": [{"provider": "openai"}, {"provider": "groq"}]
        }))));
        let s = Subject::of(&cx);
        assert_eq!(s.provider, None);

        // Inline JSON configs have no id.
        let mut headers = http::HeaderMap::new();
        headers.insert("x-gw-config", r#"{"provider":"openai"}"#.parse().unwrap());
        headers.insert("x-gw-provider", "@slug-h".parse().unwrap());
        cx.gw = GwHeaders::parse(&headers).unwrap();
        cx.plan = None;
        let s = Subject::of(&cx);
        assert_eq!(s.config, None);
        assert_eq!(
            (s.provider, s.virtual_key),
            (Some("slug-h"), Some("slug-h"))
        );
    }

    proptest::proptest! {
        /// Two different value tuples of one policy never share a counter.
        #[test]
        fn value_keys_are_injective(
            keys in proptest::collection::vec("metadata\\.[a-c|:]{1,3}", 1..4),
            a in proptest::collection::vec("[a|:\\\\]{0,4}", 4),
            b in proptest::collection::vec("[a|:\\\\]{0,4}", 4),
        ) {
            let key_of = |values: &[String]| {
                plugin_sdk::access::value_key(
                    keys.iter().zip(values).map(|(k, v)| (k.as_str(), v.as_str())),
                )
            };
            let (a, b) = (&a[..keys.len()], &b[..keys.len()]);
            proptest::prop_assert_eq!(a == b, key_of(a) == key_of(b));
        }
    }
}
