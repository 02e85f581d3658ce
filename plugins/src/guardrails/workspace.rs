//! A workspace's default guardrails (`defaults.input_guardrails` / `output_guardrails` in the
//! control plane), run for every request the workspace's keys and tokens make.
//!
//! Each item names a hook (a string, or `{id}`: a hook of the plugin's `library`, or a guardrail
//! the workspace saved through `/v1/guardrails`), or is a whole hook object. They are resolved
//! once per workspace and snapshot version and kept; a workspace naming a guardrail that does
//! not resolve, or holding an invalid hook, has its requests refused (500) rather than run
//! unguarded.

use std::sync::Arc;

use serde_json::Value;

use plugin_sdk::access::Defaults;
use plugin_sdk::{GatewayError, Principal, RequestCx};

use super::config::{build_items, describe, parse_items, Allow};
use super::saved::{Saved, Scope};
use super::DefaultHooks;

/// How many workspaces' resolved guardrails are kept.
const KEPT_WORKSPACES: u64 = 10_000;

/// Workspace admins write their defaults through the control plane: network checks (webhooks)
/// are allowed, held to the egress policy.
const NETWORK: Allow = Allow { network: true };

struct Resolved {
    version: i64,
    hooks: Result<Arc<DefaultHooks>, String>,
}

/// Resolves the default guardrails of the requests' workspaces.
pub struct WorkspaceHooks {
    saved: Arc<Saved>,
    kept: moka::sync::Cache<String, Arc<Resolved>>,
}

impl WorkspaceHooks {
    pub fn new(saved: Arc<Saved>) -> WorkspaceHooks {
        WorkspaceHooks {
            saved,
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
        let access = self.saved.access();
        let version = access.version();
        let resolved = match self.kept.get(workspace_id) {
            Some(r) if r.version == version => r,
            _ => {
                let hooks = match access.workspace(workspace_id) {
                    Some(ws) => resolve(&ws.defaults, workspace_id, &self.saved).map(Arc::new),
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
fn resolve(defaults: &Defaults, workspace_id: &str, saved: &Saved) -> Result<DefaultHooks, String> {
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
        let list = Value::Array(items.clone());
        let entries = parse_items(&list, field)
            .and_then(|raw| build_items(&raw, field, NETWORK))
            .map_err(|issues| describe(&issues))?;
        saved
            .extend(into, &entries, Scope::Workspace(workspace_id))
            .map_err(|(_, problem)| problem)?;
    }
    Ok(out)
}
