//! A workspace's default guardrails (`defaults.input_guardrails` / `output_guardrails` in the
//! control plane), run for every request the workspace's keys and tokens make.
//!
//! Each item is the `id` of a hook in the plugin's `library` (what the control plane's API
//! stores: guardrail ids), or a whole hook object. They are resolved once per workspace and
//! snapshot version and kept; a workspace naming a guardrail the library lacks, or holding an
//! invalid hook, has its requests refused (500) rather than run unguarded.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use plugin_sdk::access::{AccessStore, Defaults};
use plugin_sdk::{ConfigIssue, GatewayError, Principal, RequestCx};

use super::config::{build_hooks, Allow, Hook, RawHook};
use super::DefaultHooks;

/// How many workspaces' resolved guardrails are kept.
const KEPT_WORKSPACES: u64 = 10_000;

/// Named hooks of the plugin's `library`, by id. `None`: the hook has no enabled check.
pub type Library = HashMap<String, Option<Arc<Hook>>>;

/// Builds the library: every hook needs an `id`, each id once.
pub fn library(raw: &[RawHook]) -> Result<Library, Vec<ConfigIssue>> {
    let mut issues = Vec::new();
    let mut seen = HashMap::new();
    for (i, hook) in raw.iter().enumerate() {
        match hook.id.as_deref() {
            None | Some("") => issues.push(ConfigIssue::new(
                format!("library[{i}].id"),
                "a library hook needs an id: workspaces name it by its id",
            )),
            Some(id) => {
                if let Some(first) = seen.insert(id.to_owned(), i) {
                    issues.push(ConfigIssue::new(
                        format!("library[{i}].id"),
                        format!("{id:?} is already the id of library[{first}]"),
                    ));
                }
            }
        }
    }
    let mut out = Library::new();
    for (i, hook) in raw.iter().enumerate() {
        match build_hooks(
            std::slice::from_ref(hook),
            &format!("library[{i}]"),
            NETWORK,
        ) {
            Ok(built) => {
                if let Some(id) = &hook.id {
                    out.insert(id.clone(), built.into_iter().next());
                }
            }
            Err(found) => issues.extend(found),
        }
    }
    if issues.is_empty() {
        Ok(out)
    } else {
        Err(issues)
    }
}

/// Operators write workspace guardrails: network checks (webhooks) are allowed.
const NETWORK: Allow = Allow { network: true };

struct Resolved {
    version: i64,
    hooks: Result<Arc<DefaultHooks>, String>,
}

/// Resolves the default guardrails of the requests' workspaces.
pub struct WorkspaceHooks {
    library: Library,
    access: Arc<dyn AccessStore>,
    kept: moka::sync::Cache<String, Arc<Resolved>>,
}

impl WorkspaceHooks {
    pub fn new(library: Library, access: Arc<dyn AccessStore>) -> WorkspaceHooks {
        WorkspaceHooks {
            library,
            access,
            kept: moka::sync::Cache::new(KEPT_WORKSPACES),
        }
    }

    /// The default guardrails of the request's workspace (its principal's), if it has any.
    pub fn of(&self, cx: &RequestCx) -> Result<Option<Arc<DefaultHooks>>, GatewayError> {
        let Some(workspace_id) = cx
            .extensions
            .get::<Principal>()
            .and_then(|p| p.workspace_id.as_deref())
        else {
            return Ok(None);
        };
        let version = self.access.version();
        let resolved = match self.kept.get(workspace_id) {
            Some(r) if r.version == version => r,
            _ => {
                let hooks = match self.access.workspace(workspace_id) {
                    Some(ws) => resolve(&ws.defaults, &self.library).map(Arc::new),
                    None => Ok(Arc::new(DefaultHooks::default())),
                };
                if let Err(problem) = &hooks {
                    tracing::warn!(
                        target: "gateway::guardrails",
                        workspace = workspace_id,
                        problem = problem.as_str(),
                        "the workspace's default guardrails cannot run; its requests are refused"
                    );
                }
                let r = Arc::new(Resolved { version, hooks });
                self.kept.insert(workspace_id.to_owned(), r.clone());
                r
            }
        };
        match &resolved.hooks {
            Ok(hooks) if hooks.before.is_empty() && hooks.after.is_empty() => Ok(None),
            Ok(hooks) => Ok(Some(hooks.clone())),
            Err(problem) => Err(GatewayError::internal(format!(
                "the workspace's default guardrails cannot run: {problem}"
            ))),
        }
    }
}

/// The hooks a workspace's defaults name, in order.
fn resolve(defaults: &Defaults, library: &Library) -> Result<DefaultHooks, String> {
    let mut out = DefaultHooks::default();
    for (field, items, into) in [
        (
            "defaults.input_guardrails",
            &defaults.input_guardrails,
            &mut out.before,
        ),
        (
            "defaults.output_guardrails",
            &defaults.output_guardrails,
            &mut out.after,
        ),
    ] {
        for (i, item) in items.iter().enumerate() {
            let at = format!("{field}[{i}]");
            match item {
                Value::String(id) => match library.get(id) {
                    Some(Some(hook)) => into.push(hook.clone()),
                    Some(None) => {}
                    None => {
                        return Err(format!(
                            "{at}: no guardrail {id:?} in the guardrails plugin's library"
                        ))
                    }
                },
                Value::Object(_) => {
                    let raw: RawHook =
                        serde_json::from_value(item.clone()).map_err(|e| format!("{at}: {e}"))?;
                    let built = build_hooks(std::slice::from_ref(&raw), &at, NETWORK).map_err(
                        |issues| {
                            issues
                                .iter()
                                .map(|i| format!("{}: {}", i.path, i.message))
                                .collect::<Vec<_>>()
                                .join("; ")
                        },
                    )?;
                    into.extend(built);
                }
                other => return Err(format!("{at}: a guardrail id or a hook, got {other}")),
            }
        }
    }
    Ok(out)
}
