//! Hooks named by id: the `library` of the pipeline entry, and the guardrails saved through the
//! control plane (`/v1/guardrails`, read from the access store's snapshot).
//!
//! A name is looked up when a request runs, first in the library, then among the saved
//! guardrails (by slug or id) that the list's owner may use ([`Scope`]). A saved guardrail is
//! built once per snapshot version and kept: building compiles regexes and schemas.
//!
//! Saved guardrails may use network checks (webhooks): they are written through the control
//! plane under the `guardrails.*` scopes, not sent with a request. Their hosts are held to the
//! egress policy like any host a request names; only the hosts the YAML file writes are trusted.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use plugin_sdk::access::AccessStore;
use plugin_sdk::store::usable_by;
use plugin_sdk::{ConfigIssue, Principal};

use super::config::{build_hooks, build_saved, Allow, Entry, Hook, RawHook};

/// How many saved guardrails' built hooks are kept.
const KEPT_GUARDRAILS: u64 = 10_000;

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

/// Operators and control-plane writers: network checks are allowed.
const NETWORK: Allow = Allow { network: true };

/// Checks a guardrail the control plane is about to save (`{type, checks, deny, async,
/// on_fail, on_success}`): the problems, each named by its field (`checks[0].parameters.rule`).
pub fn check_saved(hook: &Value) -> Result<(), String> {
    const AT: &str = "guardrail";
    let raw: RawHook = serde_path_to_error::deserialize(hook).map_err(|e| {
        let path = e.path().to_string();
        format!("{path}: {}", e.into_inner())
    })?;
    let issues = match build_hooks(std::slice::from_ref(&raw), AT, NETWORK) {
        Ok(_) => return Ok(()),
        Err(issues) => issues,
    };
    Err(issues
        .iter()
        .map(|i| {
            let path = i.path.strip_prefix("guardrail[0]").unwrap_or(&i.path);
            format!("{}: {}", path.trim_start_matches('.'), i.message)
        })
        .collect::<Vec<_>>()
        .join("; "))
}

/// Whose list names the guardrail, which decides the saved guardrails it may name.
#[derive(Clone, Copy)]
pub enum Scope<'a> {
    /// The pipeline's YAML: any saved guardrail.
    Operator,
    /// A workspace's defaults: that workspace's guardrails.
    Workspace(&'a str),
    /// A request's routing config: the guardrails its caller may use (its workspace's; any of
    /// its organisation's for an organisation key).
    Caller(Option<&'a Principal>),
}

/// Why a name did not resolve.
#[derive(Debug, PartialEq, Eq)]
pub enum Unresolved {
    /// No library hook and no saved guardrail the scope may use has this name.
    Unknown,
    /// The saved guardrail is stored but cannot run (its hook is refused).
    Invalid(String),
}

impl Unresolved {
    /// The problem, for the guardrail named `id` at `at`.
    pub fn describe(&self, id: &str, at: &str) -> String {
        match self {
            Unresolved::Unknown => format!(
                "{at}: no guardrail {id:?} (neither in the guardrails plugin's library nor \
                 saved in this workspace)"
            ),
            Unresolved::Invalid(problem) => {
                format!("{at}: the saved guardrail {id:?} cannot run: {problem}")
            }
        }
    }
}

struct Kept {
    version: i64,
    hook: Result<Option<Arc<Hook>>, String>,
}

/// Resolves names: the library, then saved guardrails.
pub struct Saved {
    library: Library,
    access: Arc<dyn AccessStore>,
    kept: moka::sync::Cache<String, Arc<Kept>>,
}

impl Saved {
    pub fn new(library: Library, access: Arc<dyn AccessStore>) -> Saved {
        Saved {
            library,
            access,
            kept: moka::sync::Cache::new(KEPT_GUARDRAILS),
        }
    }

    pub fn access(&self) -> &Arc<dyn AccessStore> {
        &self.access
    }

    /// The hook named `id` for `scope`; `None` when it has no enabled check.
    pub fn resolve(&self, id: &str, scope: Scope) -> Result<Option<Arc<Hook>>, Unresolved> {
        if let Some(hook) = self.library.get(id) {
            return Ok(hook.clone());
        }
        let saved = self.access.guardrail(id).ok_or(Unresolved::Unknown)?;
        let admitted = match scope {
            Scope::Operator => true,
            Scope::Workspace(ws) => saved.owner.workspace_id == ws,
            Scope::Caller(who) => usable_by(Some(&saved.owner), who),
        };
        if !admitted {
            return Err(Unresolved::Unknown);
        }
        let version = self.access.version();
        let kept = match self.kept.get(&saved.id) {
            Some(k) if k.version == version => k,
            _ => {
                let hook = serde_json::from_value::<RawHook>(saved.hook.clone())
                    .map_err(|e| e.to_string())
                    .and_then(|mut raw| {
                        // Results name a saved guardrail by its slug.
                        raw.id = Some(saved.slug.clone());
                        build_saved(&raw, &saved.slug, NETWORK)
                    })
                    .map(|h| h.map(Arc::new));
                let k = Arc::new(Kept { version, hook });
                self.kept.insert(saved.id.clone(), k.clone());
                k
            }
        };
        kept.hook.clone().map_err(Unresolved::Invalid)
    }

    /// Appends the hooks of `entries` to `out`, names resolved for `scope`. The first name that
    /// does not resolve is the error: where it was written, and the problem.
    pub fn extend(
        &self,
        out: &mut Vec<Arc<Hook>>,
        entries: &[Entry],
        scope: Scope,
    ) -> Result<(), (String, String)> {
        for entry in entries {
            match entry {
                Entry::Built(hook) => out.push(hook.clone()),
                Entry::Named { id, at } => match self.resolve(id, scope) {
                    Ok(Some(hook)) => out.push(hook),
                    Ok(None) => {}
                    Err(why) => return Err((at.clone(), why.describe(id, at))),
                },
            }
        }
        Ok(())
    }
}
