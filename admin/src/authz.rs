//! Who may do what: the one place that decides.
//!
//! A request is made by a [`Principal`]: the key that authenticated it, the role behind that
//! key, its workspace when it is a workspace key, and the scopes it carries. [`allowed`] applies
//! the spec's tables:
//!
//! - an admin (organisation service) key acts on the whole organisation;
//! - a workspace key acts only inside its own workspace, and never on organisation settings,
//!   workspaces, users and permissions, audit logs or admin keys;
//! - keys are created by role: organisation owners and admins create admin keys and workspace
//!   keys in any workspace, workspace admins and managers create workspace keys in their
//!   workspace only, members create none (they may read their own user keys);
//! - feedback is written with a workspace key only;
//! - workspace admins and managers manage the members of their own workspace (a manager
//!   neither grants nor takes away the workspace admin role: [`may_set_workspace_role`]);
//!   members do not;
//! - managers and members see and write prompts and see analytics as the organisation's
//!   settings, overridden per workspace, say ([`allowed_with_settings`]);
//! - scopes narrow all of this: a key does only what its scopes name.

use std::collections::BTreeSet;
use std::fmt;

/// Roles in the organisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrgRole {
    Owner,
    Admin,
    Member,
}

impl OrgRole {
    pub fn as_str(self) -> &'static str {
        match self {
            OrgRole::Owner => "owner",
            OrgRole::Admin => "admin",
            OrgRole::Member => "member",
        }
    }

    pub fn parse(s: &str) -> Option<OrgRole> {
        Some(match s {
            "owner" => OrgRole::Owner,
            "admin" => OrgRole::Admin,
            "member" => OrgRole::Member,
            _ => return None,
        })
    }
}

/// Roles in a workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkspaceRole {
    Admin,
    Manager,
    Member,
}

impl WorkspaceRole {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkspaceRole::Admin => "admin",
            WorkspaceRole::Manager => "manager",
            WorkspaceRole::Member => "member",
        }
    }

    pub fn parse(s: &str) -> Option<WorkspaceRole> {
        Some(match s {
            "admin" => WorkspaceRole::Admin,
            "manager" => WorkspaceRole::Manager,
            "member" => WorkspaceRole::Member,
            _ => return None,
        })
    }

    /// Admins and managers manage the workspace's keys.
    fn manages(self) -> bool {
        matches!(self, WorkspaceRole::Admin | WorkspaceRole::Manager)
    }

    /// The order of the roles: member < manager < admin.
    fn rank(self) -> u8 {
        match self {
            WorkspaceRole::Member => 0,
            WorkspaceRole::Manager => 1,
            WorkspaceRole::Admin => 2,
        }
    }
}

/// The three kinds of API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyKind {
    /// An admin key: organisation-wide, owned by no user.
    OrganisationService,
    /// A workspace key owned by no user.
    WorkspaceService,
    /// A workspace key that acts for one user.
    WorkspaceUser,
}

impl KeyKind {
    pub const ALL: [KeyKind; 3] = [
        KeyKind::OrganisationService,
        KeyKind::WorkspaceService,
        KeyKind::WorkspaceUser,
    ];

    /// The stored and returned `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::OrganisationService => "organisation-service",
            KeyKind::WorkspaceService => "workspace-service",
            KeyKind::WorkspaceUser => "workspace-user",
        }
    }

    pub fn parse(s: &str) -> Option<KeyKind> {
        KeyKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// From the path `/api-keys/{type}/{sub-type}`.
    pub fn from_path(kind: &str, sub_kind: &str) -> Option<KeyKind> {
        match (kind, sub_kind) {
            ("organisation", "service") => Some(KeyKind::OrganisationService),
            ("workspace", "service") => Some(KeyKind::WorkspaceService),
            ("workspace", "user") => Some(KeyKind::WorkspaceUser),
            _ => None,
        }
    }

    pub fn is_workspace(self) -> bool {
        self != KeyKind::OrganisationService
    }

    /// The scope family that governs keys of this kind.
    fn scope_family(self) -> &'static str {
        match self {
            KeyKind::OrganisationService => "organisation_service_api_keys",
            KeyKind::WorkspaceService => "workspace_service_api_keys",
            KeyKind::WorkspaceUser => "workspace_user_api_keys",
        }
    }
}

/// What a principal reaches: the whole organisation, or one workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    Organisation {
        role: OrgRole,
    },
    Workspace {
        workspace_id: String,
        role: WorkspaceRole,
    },
}

/// The authenticated caller of a control-plane request.
#[derive(Debug, Clone)]
pub struct Principal {
    pub organisation_id: String,
    /// The key that authenticated the request.
    pub key_id: Option<String>,
    pub key_kind: Option<KeyKind>,
    /// The user behind the key: a user key's user, or the user who made a service key.
    pub user_id: Option<String>,
    pub access: Access,
    /// The scopes the key carries; `None` for a caller not limited by scopes.
    pub scopes: Option<BTreeSet<String>>,
    /// The organisation role of the user a workspace user key acts for; `None` for other
    /// callers (a service key acts for nobody, whoever made it).
    pub user_org_role: Option<OrgRole>,
}

impl Principal {
    /// The workspace a workspace key is confined to.
    pub fn workspace_id(&self) -> Option<&str> {
        match &self.access {
            Access::Workspace { workspace_id, .. } => Some(workspace_id),
            Access::Organisation { .. } => None,
        }
    }

    /// Whether the caller has an organisation owner's or admin's rights: an admin key, or the
    /// user key of an organisation owner or admin (confined to its workspace all the same).
    pub fn is_organisation_admin(&self) -> bool {
        let admin = |r: &OrgRole| matches!(r, OrgRole::Owner | OrgRole::Admin);
        match &self.access {
            Access::Organisation { role } => admin(role),
            Access::Workspace { .. } => {
                self.key_kind == Some(KeyKind::WorkspaceUser)
                    && self.user_org_role.as_ref().is_some_and(admin)
            }
        }
    }

    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.as_ref().is_none_or(|s| s.contains(scope))
    }

    /// `user_type` of the audit log: who acted.
    pub fn user_type(&self) -> &'static str {
        match self.key_kind {
            Some(KeyKind::WorkspaceUser) => "user",
            Some(_) => "api_key",
            None => "user",
        }
    }
}

/// The resources of the control plane, each governed by a scope family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    OrganisationSettings,
    OrganisationUsers,
    Workspaces,
    WorkspaceUsers,
    AuditLogs,
    Deployments,
    OrganisationIntegrations,
    ApiKeys(KeyKind),
    WorkspaceIntegrations,
    Configs,
    Providers,
    VirtualKeys,
    Policies,
    Prompts,
    Guardrails,
    McpServers,
    Mcp,
    Completions,
    Logs,
    Analytics,
    Feedback,
}

impl Resource {
    /// Resources that only an admin key reaches.
    pub fn organisation_only(self) -> bool {
        matches!(
            self,
            Resource::OrganisationSettings
                | Resource::OrganisationUsers
                | Resource::Workspaces
                | Resource::AuditLogs
                | Resource::Deployments
                | Resource::OrganisationIntegrations
                | Resource::ApiKeys(KeyKind::OrganisationService)
        )
    }

    /// Resources a workspace member (a user key of a member) may read and use but not change.
    pub fn members_read_only(self) -> bool {
        matches!(
            self,
            Resource::Configs
                | Resource::Guardrails
                | Resource::Providers
                | Resource::VirtualKeys
                | Resource::WorkspaceIntegrations
        )
    }

    /// The scope family, `None` for resources no scope governs (feedback).
    fn scope_family(self) -> Option<&'static str> {
        Some(match self {
            Resource::OrganisationSettings => "organisation_settings",
            Resource::OrganisationUsers => "organisation_users",
            Resource::Workspaces => "workspaces",
            Resource::WorkspaceUsers => "workspace_users",
            Resource::AuditLogs => "audit_logs",
            Resource::Deployments => "deployments",
            Resource::OrganisationIntegrations => "organisation_integrations",
            Resource::ApiKeys(kind) => kind.scope_family(),
            Resource::WorkspaceIntegrations => "workspace_integrations",
            Resource::Configs => "configs",
            Resource::Providers => "providers",
            Resource::VirtualKeys => "virtual_keys",
            Resource::Policies => "policies",
            Resource::Prompts => "prompts",
            Resource::Guardrails => "guardrails",
            Resource::McpServers => "mcp_servers",
            Resource::Mcp => "mcp",
            Resource::Completions => "completions",
            Resource::Logs => "logs",
            Resource::Analytics => "analytics",
            Resource::Feedback => return None,
        })
    }
}

/// What is done to a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    Read,
    Update,
    Delete,
    List,
    View,
    Export,
    Write,
    Invoke,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Read => "read",
            Op::Update => "update",
            Op::Delete => "delete",
            Op::List => "list",
            Op::View => "view",
            Op::Export => "export",
            Op::Write => "write",
            Op::Invoke => "invoke",
        }
    }

    fn reads(self) -> bool {
        matches!(self, Op::Read | Op::List | Op::View)
    }
}

/// One thing a principal asks to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action<'a> {
    pub resource: Resource,
    pub op: Op,
    /// The user a key belongs to, for actions on one user key (members may read their own).
    pub owner: Option<&'a str>,
}

impl<'a> Action<'a> {
    pub fn new(resource: Resource, op: Op) -> Action<'a> {
        Action {
            resource,
            op,
            owner: None,
        }
    }

    pub fn owned_by(mut self, owner: Option<&'a str>) -> Action<'a> {
        self.owner = owner;
        self
    }

    /// The scope that allows this action, e.g. `workspaces.create`.
    pub fn scope(&self) -> Option<String> {
        self.resource
            .scope_family()
            .map(|f| format!("{f}.{}", self.op.as_str()))
    }
}

/// Why an action was refused (a 403).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied(pub String);

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Denied> for crate::error::AdminError {
    fn from(d: Denied) -> Self {
        crate::error::AdminError::forbidden(d.0)
    }
}

fn deny(message: impl Into<String>) -> Result<(), Denied> {
    Err(Denied(message.into()))
}

/// Decides whether `principal` may do `action` on a resource of `resource_workspace` (`None`
/// for resources of the organisation itself, or for listings across the organisation).
pub fn allowed(
    principal: &Principal,
    action: &Action<'_>,
    resource_workspace: Option<&str>,
) -> Result<(), Denied> {
    let resource = action.resource;
    match &principal.access {
        Access::Organisation { role } => {
            if *role == OrgRole::Member {
                return deny("an organisation member has no administrative rights");
            }
            if resource == Resource::Feedback && !action.op.reads() {
                return deny("feedback is written with a workspace key");
            }
        }
        Access::Workspace { workspace_id, role } => {
            if resource.organisation_only() {
                return deny(format!(
                    "{} needs an admin key; a workspace key acts only inside its workspace",
                    action.scope().unwrap_or_default()
                ));
            }
            match resource_workspace {
                Some(ws) if ws == workspace_id => {}
                Some(_) => return deny("this key belongs to another workspace"),
                None => return deny("a workspace key acts only inside its workspace"),
            }
            // Workspace members use configs, providers and integrations; admins and managers
            // change them.
            if resource.members_read_only() && !role.manages() && !action.op.reads() {
                return deny(format!(
                    "workspace members read {} but do not change them; a workspace admin or manager does",
                    resource.scope_family().unwrap_or_default()
                ));
            }
            // Workspace admins and managers manage the members of their workspace.
            if resource == Resource::WorkspaceUsers && !role.manages() {
                return deny(
                    "workspace members do not manage members; a workspace admin or manager does",
                );
            }
            if let Resource::ApiKeys(_) = resource {
                let own_key =
                    action.owner.is_some() && action.owner == principal.user_id.as_deref();
                let member_reads_own = action.op.reads() && own_key;
                if !role.manages() && !member_reads_own {
                    return deny(
                        "workspace members do not manage API keys; a workspace admin or manager does",
                    );
                }
            }
        }
    }
    if let Some(scope) = action.scope() {
        if !principal.has_scope(&scope) {
            return deny(format!("the key lacks the scope {scope}"));
        }
    }
    Ok(())
}

/// Integrations. A workspace integration (`integration_workspace` is its workspace) is a
/// workspace resource: `workspace_integrations.*` in that workspace. An organisation integration
/// (`None`) is the admin key's (`organisation_integrations.*`), except that a workspace key may
/// read one enabled for its workspace (`shared_with_caller`), under `workspace_integrations.read`.
pub fn integration_allowed(
    principal: &Principal,
    op: Op,
    integration_workspace: Option<&str>,
    shared_with_caller: bool,
) -> Result<(), Denied> {
    match (integration_workspace, &principal.access) {
        (Some(ws), _) => allowed(
            principal,
            &Action::new(Resource::WorkspaceIntegrations, op),
            Some(ws),
        ),
        (None, Access::Workspace { workspace_id, .. }) if op.reads() && shared_with_caller => {
            allowed(
                principal,
                &Action::new(Resource::WorkspaceIntegrations, op),
                Some(workspace_id),
            )
        }
        (None, _) => allowed(
            principal,
            &Action::new(Resource::OrganisationIntegrations, op),
            None,
        ),
    }
}

/// The user a workspace user key belongs to, as seen from the key's workspace: their
/// organisation role and their explicit membership there (`None`: not a member; organisation
/// owners and admins reach every workspace without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyUser {
    pub org_role: OrgRole,
    pub membership: Option<WorkspaceRole>,
}

impl KeyUser {
    /// The role the user acts with in the workspace: organisation owners and admins are
    /// workspace admins everywhere; others have the role of their membership, or none.
    pub fn workspace_role(&self) -> Option<WorkspaceRole> {
        match self.org_role {
            OrgRole::Owner | OrgRole::Admin => Some(WorkspaceRole::Admin),
            OrgRole::Member => self.membership,
        }
    }
}

/// Whether the caller may act for `user` through a user key: make one for them, rotate or
/// update one of theirs, or fetch the value an automatic rotation gave it. The key then acts
/// as that user, so a workspace caller (a workspace admin or manager, or a service key, whose
/// role is manager) may do it only for explicit members of its workspace whose role is at
/// most its own, and never for the organisation's owners or admins. Organisation owners and
/// admins (admin keys and their own user keys) may do it for anyone. [`allowed`] is asked
/// first: this only narrows it.
pub fn may_act_for_user(principal: &Principal, user: &KeyUser) -> Result<(), Denied> {
    if principal.is_organisation_admin() {
        return Ok(());
    }
    let caller = match &principal.access {
        Access::Workspace { role, .. } => *role,
        Access::Organisation { .. } => {
            return deny("an organisation member has no administrative rights")
        }
    };
    if matches!(user.org_role, OrgRole::Owner | OrgRole::Admin) {
        return deny(format!(
            "the user is an organisation {}: only an organisation owner or admin acts on their keys",
            user.org_role.as_str()
        ));
    }
    match user.membership {
        None => deny("the user is not a member of the key's workspace"),
        Some(role) if role.rank() > caller.rank() => deny(format!(
            "the user is a workspace {}: a workspace {} acts only on the keys of members whose role is at most its own",
            role.as_str(),
            caller.as_str()
        )),
        Some(_) => Ok(()),
    }
}

/// A key may give a new key only scopes it holds itself.
pub fn may_grant(principal: &Principal, scopes: &BTreeSet<String>) -> Result<(), Denied> {
    match scopes.iter().find(|s| !principal.has_scope(s)) {
        Some(s) => deny(format!(
            "the key cannot grant the scope {s}, which it lacks"
        )),
        None => Ok(()),
    }
}

/// Whether the caller may give a workspace member the role `new` (`None`: remove them) when
/// they now have `current` (`None`: not a member yet). Only organisation admins (admin keys)
/// and workspace admins grant, change or take away the workspace admin role; a manager manages
/// managers and members.
pub fn may_set_workspace_role(
    principal: &Principal,
    current: Option<WorkspaceRole>,
    new: Option<WorkspaceRole>,
) -> Result<(), Denied> {
    let caller = match &principal.access {
        Access::Organisation { .. } => return Ok(()),
        Access::Workspace { role, .. } => *role,
    };
    if caller == WorkspaceRole::Admin {
        return Ok(());
    }
    if current == Some(WorkspaceRole::Admin) {
        return deny(
            "only an organisation or workspace admin changes or removes a workspace admin",
        );
    }
    if new == Some(WorkspaceRole::Admin) {
        return deny("only an organisation or workspace admin grants the workspace admin role");
    }
    Ok(())
}

/// Prompt and analytics access of workspace managers and members (the spec's settings, with
/// its defaults); owners and admins always have access. Writing prompts includes seeing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct AccessSettings {
    #[serde(rename = "membersViewPrompts")]
    pub members_view_prompts: bool,
    #[serde(rename = "membersWritePrompts")]
    pub members_write_prompts: bool,
    #[serde(rename = "managersViewPrompts")]
    pub managers_view_prompts: bool,
    #[serde(rename = "managersWritePrompts")]
    pub managers_write_prompts: bool,
    #[serde(rename = "membersViewAnalytics")]
    pub members_view_analytics: bool,
    #[serde(rename = "managersViewAnalytics")]
    pub managers_view_analytics: bool,
}

impl Default for AccessSettings {
    fn default() -> Self {
        AccessSettings {
            members_view_prompts: true,
            members_write_prompts: false,
            managers_view_prompts: true,
            managers_write_prompts: true,
            members_view_analytics: true,
            managers_view_analytics: true,
        }
    }
}

/// [`allowed`], then the access settings in force in the resource's workspace: for prompts
/// and analytics, a workspace manager or member (a workspace key) needs the setting of their
/// role. Admin keys and workspace admins are not limited by them.
pub fn allowed_with_settings(
    principal: &Principal,
    action: &Action<'_>,
    resource_workspace: Option<&str>,
    settings: &AccessSettings,
) -> Result<(), Denied> {
    allowed(principal, action, resource_workspace)?;
    let role = match &principal.access {
        Access::Organisation { .. } => return Ok(()),
        Access::Workspace { role, .. } => *role,
    };
    let s = settings;
    let (view, write, what) = match (action.resource, role) {
        (_, WorkspaceRole::Admin) => return Ok(()),
        (Resource::Prompts, WorkspaceRole::Manager) => {
            (s.managers_view_prompts, s.managers_write_prompts, "prompts")
        }
        (Resource::Prompts, WorkspaceRole::Member) => {
            (s.members_view_prompts, s.members_write_prompts, "prompts")
        }
        (Resource::Analytics, WorkspaceRole::Manager) => {
            (s.managers_view_analytics, false, "analytics")
        }
        (Resource::Analytics, WorkspaceRole::Member) => {
            (s.members_view_analytics, false, "analytics")
        }
        _ => return Ok(()),
    };
    let who = match role {
        WorkspaceRole::Manager => "managers",
        _ => "members",
    };
    let ok = if action.op.reads() {
        view || write
    } else {
        write
    };
    if ok {
        Ok(())
    } else {
        let verb = if action.op.reads() { "see" } else { "write" };
        deny(format!(
            "the workspace's settings do not let {who} {verb} {what}"
        ))
    }
}

/// Scope families and their actions, as the reference names them.
const SCOPE_FAMILIES: &[(&str, &[&str])] = &[
    ("organisation_users", CRUDL),
    ("organisation_service_api_keys", CRUDL),
    ("organisation_settings", &["read", "update"]),
    ("audit_logs", &["list"]),
    ("deployments", CRUDL),
    ("workspaces", CRUDL),
    ("workspace_service_api_keys", CRUDL),
    ("workspace_user_api_keys", CRUDL),
    ("workspace_users", CRUDL),
    ("prompts", CRUDL),
    ("configs", CRUDL),
    ("guardrails", CRUDL),
    ("virtual_keys", CRUDL),
    ("providers", CRUDL),
    ("policies", CRUDL),
    ("organisation_integrations", CRUDL),
    ("workspace_integrations", CRUDL),
    ("mcp_servers", CRUDL),
    ("mcp", &["invoke"]),
    ("completions", &["write"]),
    ("analytics", &["view"]),
    ("logs", &["export", "list", "view", "write"]),
];

const CRUDL: &[&str] = &["create", "read", "update", "delete", "list"];

/// Every scope a key may carry.
pub fn known_scopes() -> impl Iterator<Item = String> {
    SCOPE_FAMILIES
        .iter()
        .flat_map(|(family, ops)| ops.iter().map(move |op| format!("{family}.{op}")))
}

/// Scope families only an admin key can use.
fn organisation_only_family(family: &str) -> bool {
    matches!(
        family,
        "organisation_users"
            | "organisation_service_api_keys"
            | "organisation_settings"
            | "audit_logs"
            | "deployments"
            | "workspaces"
            | "organisation_integrations"
    )
}

/// The scopes a key of `kind` may carry: all of them for an admin key, the workspace ones for
/// a workspace key.
pub fn grantable_scopes(kind: KeyKind) -> BTreeSet<String> {
    known_scopes()
        .filter(|s| {
            !kind.is_workspace() || !organisation_only_family(s.split('.').next().unwrap_or(""))
        })
        .collect()
}

/// Checks requested scopes: each known (the spec's `deployments:create` spelling is read as
/// `deployments.create`) and usable by a key of `kind`. Returns them normalised and sorted.
pub fn check_scopes(kind: KeyKind, scopes: &[String]) -> Result<BTreeSet<String>, String> {
    let known: BTreeSet<String> = known_scopes().collect();
    let grantable = grantable_scopes(kind);
    let mut out = BTreeSet::new();
    for (i, raw) in scopes.iter().enumerate() {
        let scope = match raw.strip_prefix("deployments:") {
            Some(op) => format!("deployments.{op}"),
            None => raw.clone(),
        };
        if !known.contains(&scope) {
            return Err(format!(
                "scopes[{i}]: unknown scope {raw:?}; scopes are resource.action, e.g. configs.read"
            ));
        }
        if !grantable.contains(&scope) {
            return Err(format!(
                "scopes[{i}]: {raw:?} is for admin keys only; a {} key cannot carry it",
                kind.as_str()
            ));
        }
        out.insert(scope);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WS: &str = "ws-own";
    const OTHER: &str = "ws-other";
    const ME: &str = "user-me";
    const SOMEONE: &str = "user-else";

    fn org(role: OrgRole) -> Principal {
        Principal {
            organisation_id: "org".into(),
            key_id: Some("k".into()),
            key_kind: Some(KeyKind::OrganisationService),
            user_id: Some(ME.into()),
            access: Access::Organisation { role },
            scopes: Some(known_scopes().collect()),
            user_org_role: None,
        }
    }

    fn ws(role: WorkspaceRole) -> Principal {
        Principal {
            organisation_id: "org".into(),
            key_id: Some("k".into()),
            key_kind: Some(KeyKind::WorkspaceUser),
            user_id: Some(ME.into()),
            access: Access::Workspace {
                workspace_id: WS.into(),
                role,
            },
            scopes: Some(grantable_scopes(KeyKind::WorkspaceUser)),
            user_org_role: Some(OrgRole::Member),
        }
    }

    fn can(p: &Principal, resource: Resource, op: Op, in_ws: Option<&str>) -> bool {
        allowed(p, &Action::new(resource, op), in_ws).is_ok()
    }

    /// `policies.{create,read,update,delete,list}` (rate and usage limits policies), every
    /// role-by-action cell: an admin key in any workspace and across the organisation; a
    /// workspace key, whatever its role, in its own workspace only; an organisation member
    /// nowhere. Scopes narrow each cell to the actions they name.
    #[test]
    fn policies_by_role() {
        let ops = [Op::Create, Op::Read, Op::Update, Op::Delete, Op::List];
        // role: [in its own workspace, in another, across the organisation]
        let table = [
            ("org owner", org(OrgRole::Owner), [true, true, true]),
            ("org admin", org(OrgRole::Admin), [true, true, true]),
            ("org member", org(OrgRole::Member), [false, false, false]),
            ("ws admin", ws(WorkspaceRole::Admin), [true, false, false]),
            (
                "ws manager",
                ws(WorkspaceRole::Manager),
                [true, false, false],
            ),
            ("ws member", ws(WorkspaceRole::Member), [true, false, false]),
        ];
        for (role, p, want) in &table {
            for op in ops {
                for (in_ws, want) in [Some(WS), Some(OTHER), None].into_iter().zip(want) {
                    assert_eq!(
                        can(p, Resource::Policies, op, in_ws),
                        *want,
                        "{role} {op:?} in {in_ws:?}"
                    );
                }
            }
        }
        for op in ops {
            let scope = format!("policies.{}", op.as_str());
            assert!(known_scopes().any(|s| s == scope), "{scope}");
            assert!(grantable_scopes(KeyKind::WorkspaceService).contains(&scope));
            let mut manager = ws(WorkspaceRole::Manager);
            manager.scopes = Some([scope.clone()].into());
            let mut admin = org(OrgRole::Admin);
            admin.scopes = Some([scope.clone()].into());
            for other in ops {
                assert_eq!(
                    can(&manager, Resource::Policies, other, Some(WS)),
                    other == op,
                    "{scope} {other:?}"
                );
                assert_eq!(
                    can(&admin, Resource::Policies, other, Some(OTHER)),
                    other == op,
                    "{scope} {other:?}"
                );
            }
            let err = allowed(&manager, &Action::new(Resource::Policies, op), Some(OTHER));
            assert_eq!(err.unwrap_err().0, "this key belongs to another workspace");
        }
    }

    /// The spec's "key creation by role" table, every cell.
    #[test]
    fn key_creation_by_role() {
        use KeyKind::*;
        let owner = org(OrgRole::Owner);
        let admin = org(OrgRole::Admin);
        let org_member = org(OrgRole::Member);
        let manager = ws(WorkspaceRole::Manager);
        let ws_admin = ws(WorkspaceRole::Admin);
        let member = ws(WorkspaceRole::Member);
        let create = |p: &Principal, kind: KeyKind, in_ws: Option<&str>| {
            can(p, Resource::ApiKeys(kind), Op::Create, in_ws)
        };
        // role: (admin key, workspace key in own ws, in another ws)
        let table: [(&str, &Principal, bool, bool, bool); 6] = [
            ("organisation owner", &owner, true, true, true),
            ("organisation admin", &admin, true, true, true),
            ("organisation member", &org_member, false, false, false),
            ("workspace admin", &ws_admin, false, true, false),
            ("workspace manager", &manager, false, true, false),
            ("workspace member", &member, false, false, false),
        ];
        for (role, p, admin_key, own_ws, other_ws) in table {
            assert_eq!(
                create(p, OrganisationService, None),
                admin_key,
                "{role}: admin key"
            );
            for kind in [WorkspaceService, WorkspaceUser] {
                assert_eq!(create(p, kind, Some(WS)), own_ws, "{role}: {kind:?} own");
                assert_eq!(
                    create(p, kind, Some(OTHER)),
                    other_ws,
                    "{role}: {kind:?} other"
                );
            }
        }
    }

    /// The spec's "capabilities by key kind": organisation settings, workspace management and
    /// user/permission management need an admin key; configs, providers and analytics take
    /// either (a workspace key only in its workspace); feedback is written with a workspace key.
    #[test]
    fn capabilities_by_key_kind() {
        let admin = org(OrgRole::Admin);
        let manager = ws(WorkspaceRole::Manager);
        let member = ws(WorkspaceRole::Member);
        let admin_only = [
            (Resource::OrganisationSettings, Op::Read),
            (Resource::OrganisationSettings, Op::Update),
            (Resource::Workspaces, Op::Create),
            (Resource::Workspaces, Op::Read),
            (Resource::Workspaces, Op::Update),
            (Resource::Workspaces, Op::Delete),
            (Resource::Workspaces, Op::List),
            (Resource::OrganisationUsers, Op::Create),
            (Resource::OrganisationUsers, Op::List),
            (Resource::AuditLogs, Op::List),
            (Resource::Deployments, Op::Create),
            (Resource::OrganisationIntegrations, Op::Create),
        ];
        for (resource, op) in admin_only {
            assert!(can(&admin, resource, op, None), "admin {resource:?} {op:?}");
            assert!(
                can(&admin, resource, op, Some(WS)),
                "admin {resource:?} {op:?} in a workspace"
            );
            for p in [&manager, &member] {
                assert!(!can(p, resource, op, Some(WS)), "ws {resource:?} {op:?}");
                assert!(!can(p, resource, op, None), "ws {resource:?} {op:?}");
            }
        }
        let either = [
            (Resource::Configs, Op::Create),
            (Resource::Configs, Op::Read),
            (Resource::Configs, Op::List),
            (Resource::Providers, Op::Create),
            (Resource::Providers, Op::Delete),
            (Resource::Analytics, Op::View),
            (Resource::Policies, Op::Update),
            (Resource::VirtualKeys, Op::Create),
            (Resource::Logs, Op::Export),
            (Resource::WorkspaceIntegrations, Op::Update),
        ];
        for (resource, op) in either {
            assert!(can(&admin, resource, op, Some(WS)), "{resource:?} {op:?}");
            assert!(
                can(&admin, resource, op, Some(OTHER)),
                "{resource:?} {op:?}"
            );
            assert!(can(&admin, resource, op, None), "{resource:?} {op:?}");
            for p in [&manager, &member] {
                // Members only read configs, providers and integrations.
                let member_writes =
                    std::ptr::eq(p, &member) && resource.members_read_only() && !op.reads();
                assert_eq!(
                    can(p, resource, op, Some(WS)),
                    !member_writes,
                    "{resource:?} {op:?}"
                );
                assert!(!can(p, resource, op, Some(OTHER)), "{resource:?} {op:?}");
                assert!(!can(p, resource, op, None), "{resource:?} {op:?}");
            }
        }
        for op in [Op::Create, Op::Update] {
            assert!(!can(&admin, Resource::Feedback, op, Some(WS)));
            assert!(can(&manager, Resource::Feedback, op, Some(WS)));
            assert!(can(&member, Resource::Feedback, op, Some(WS)));
            assert!(!can(&member, Resource::Feedback, op, Some(OTHER)));
        }
    }

    #[test]
    fn members_read_only_their_own_user_keys() {
        let member = ws(WorkspaceRole::Member);
        let manager = ws(WorkspaceRole::Manager);
        let key = Resource::ApiKeys(KeyKind::WorkspaceUser);
        for op in [Op::Read, Op::List] {
            let own = Action::new(key, op).owned_by(Some(ME));
            let other = Action::new(key, op).owned_by(Some(SOMEONE));
            assert!(allowed(&member, &own, Some(WS)).is_ok());
            assert!(allowed(&member, &other, Some(WS)).is_err());
            assert!(allowed(&manager, &other, Some(WS)).is_ok());
            assert!(allowed(&member, &own, Some(OTHER)).is_err());
        }
        for op in [Op::Update, Op::Delete, Op::Create] {
            let own = Action::new(key, op).owned_by(Some(ME));
            assert!(allowed(&member, &own, Some(WS)).is_err(), "{op:?}");
            assert!(allowed(&manager, &own, Some(WS)).is_ok(), "{op:?}");
        }
        let service = Action::new(Resource::ApiKeys(KeyKind::WorkspaceService), Op::Read);
        assert!(allowed(&member, &service, Some(WS)).is_err());
    }

    #[test]
    fn scopes_narrow_every_right() {
        let mut admin = org(OrgRole::Owner);
        admin.scopes = Some(["workspaces.read".to_owned()].into());
        assert!(can(&admin, Resource::Workspaces, Op::Read, None));
        let err = allowed(&admin, &Action::new(Resource::Workspaces, Op::Create), None);
        assert_eq!(
            err.unwrap_err().0,
            "the key lacks the scope workspaces.create"
        );
        assert!(!can(
            &admin,
            Resource::ApiKeys(KeyKind::OrganisationService),
            Op::Create,
            None
        ));
        let mut manager = ws(WorkspaceRole::Manager);
        manager.scopes = Some(BTreeSet::new());
        assert!(!can(
            &manager,
            Resource::ApiKeys(KeyKind::WorkspaceUser),
            Op::Create,
            Some(WS)
        ));
        // Unscoped callers (none yet) are limited by their role alone.
        let mut unscoped = ws(WorkspaceRole::Manager);
        unscoped.scopes = None;
        assert!(can(&unscoped, Resource::Configs, Op::Delete, Some(WS)));
        // Feedback has no scope: the role decides.
        assert!(can(&manager, Resource::Feedback, Op::Create, Some(WS)));
    }

    #[test]
    fn a_key_grants_only_scopes_it_holds() {
        let mut p = org(OrgRole::Admin);
        p.scopes = Some(["configs.read".to_owned(), "configs.list".to_owned()].into());
        assert!(may_grant(&p, &["configs.read".to_owned()].into()).is_ok());
        let err = may_grant(&p, &["configs.delete".to_owned()].into()).unwrap_err();
        assert!(err.0.contains("configs.delete"), "{err}");
    }

    #[test]
    fn scopes_are_checked_against_the_known_set_and_the_key_kind() {
        let all: Vec<String> = known_scopes().collect();
        assert!(all.contains(&"logs.export".to_owned()));
        assert!(all.contains(&"virtual_keys.create".to_owned()));
        assert!(all.contains(&"mcp.invoke".to_owned()));
        let got = check_scopes(
            KeyKind::OrganisationService,
            &["workspaces.create".into(), "deployments:list".into()],
        )
        .unwrap();
        assert_eq!(
            got,
            [
                "deployments.list".to_owned(),
                "workspaces.create".to_owned()
            ]
            .into()
        );
        let err = check_scopes(
            KeyKind::WorkspaceUser,
            &["configs.read".into(), "nope".into()],
        )
        .unwrap_err();
        assert!(
            err.starts_with("scopes[1]: unknown scope \"nope\""),
            "{err}"
        );
        let err =
            check_scopes(KeyKind::WorkspaceService, &["workspaces.create".into()]).unwrap_err();
        assert!(err.contains("admin keys only"), "{err}");
        // Every scope an action of this slice asks for is a known one.
        let known: BTreeSet<String> = known_scopes().collect();
        let crudl = [Op::Create, Op::Read, Op::Update, Op::Delete, Op::List];
        let mut actions: Vec<Action> = vec![Action::new(Resource::AuditLogs, Op::List)];
        for op in crudl {
            actions.push(Action::new(Resource::Workspaces, op));
            for kind in KeyKind::ALL {
                actions.push(Action::new(Resource::ApiKeys(kind), op));
            }
        }
        for a in actions {
            let scope = a.scope().unwrap();
            assert!(known.contains(&scope), "{scope}");
        }
    }

    /// Users, invites, organisation settings, deployments and workspace settings need an admin
    /// key; workspace members are managed by the admin key and by workspace admins and
    /// managers in their own workspace. Every role against every cell.
    #[test]
    fn users_members_settings_deployments_by_role() {
        let crudl = [Op::Create, Op::Read, Op::Update, Op::Delete, Op::List];
        let mut cells = vec![
            (Resource::OrganisationSettings, Op::Read),
            (Resource::OrganisationSettings, Op::Update),
        ];
        for op in crudl {
            // Users and invites; deployments; workspaces (their settings read and update);
            // workspace members.
            cells.push((Resource::OrganisationUsers, op));
            cells.push((Resource::Deployments, op));
            cells.push((Resource::Workspaces, op));
            cells.push((Resource::WorkspaceUsers, op));
        }
        let principals = [
            ("organisation owner", org(OrgRole::Owner)),
            ("organisation admin", org(OrgRole::Admin)),
            ("organisation member", org(OrgRole::Member)),
            ("workspace admin", ws(WorkspaceRole::Admin)),
            ("workspace manager", ws(WorkspaceRole::Manager)),
            ("workspace member", ws(WorkspaceRole::Member)),
        ];
        let known: BTreeSet<String> = known_scopes().collect();
        for (name, p) in &principals {
            for &(resource, op) in &cells {
                let scope = Action::new(resource, op).scope().unwrap();
                assert!(known.contains(&scope), "{scope}");
                for place in [None, Some(WS), Some(OTHER)] {
                    let want = match *name {
                        "organisation owner" | "organisation admin" => true,
                        "workspace admin" | "workspace manager" => {
                            resource == Resource::WorkspaceUsers && place == Some(WS)
                        }
                        _ => false,
                    };
                    assert_eq!(
                        can(p, resource, op, place),
                        want,
                        "{name}: {scope} in {place:?}"
                    );
                }
            }
        }
        let err = allowed(
            &ws(WorkspaceRole::Member),
            &Action::new(Resource::WorkspaceUsers, Op::List),
            Some(WS),
        )
        .unwrap_err();
        assert!(
            err.0.contains("workspace members do not manage members"),
            "{err}"
        );
        // The scopes that go with it: a workspace key may carry workspace_users.*, not the
        // organisation's families; both spellings of the deployments scopes are read.
        assert!(check_scopes(KeyKind::WorkspaceUser, &["workspace_users.update".into()]).is_ok());
        for s in [
            "organisation_users.list",
            "organisation_settings.read",
            "deployments.read",
            "deployments:read",
        ] {
            assert!(
                check_scopes(KeyKind::WorkspaceService, &[s.into()]).is_err(),
                "{s}"
            );
        }
        let got = check_scopes(
            KeyKind::OrganisationService,
            &["deployments:create".into(), "deployments.delete".into()],
        )
        .unwrap();
        assert_eq!(
            got,
            [
                "deployments.create".to_owned(),
                "deployments.delete".to_owned()
            ]
            .into()
        );
        // A manager's key without the scope cannot manage members.
        let mut manager = ws(WorkspaceRole::Manager);
        manager.scopes = Some(["workspace_users.list".to_owned()].into());
        assert!(can(&manager, Resource::WorkspaceUsers, Op::List, Some(WS)));
        assert!(!can(
            &manager,
            Resource::WorkspaceUsers,
            Op::Create,
            Some(WS)
        ));
    }

    /// Who gives and takes away which workspace role: every caller, current role and new role.
    #[test]
    fn workspace_roles_are_granted_by_rank() {
        use WorkspaceRole::*;
        let roles = [None, Some(Member), Some(Manager), Some(Admin)];
        for (name, p) in [
            ("organisation admin", org(OrgRole::Admin)),
            ("workspace admin", ws(Admin)),
            ("workspace manager", ws(Manager)),
        ] {
            for current in roles {
                for new in roles {
                    let want = name != "workspace manager"
                        || (current != Some(Admin) && new != Some(Admin));
                    assert_eq!(
                        may_set_workspace_role(&p, current, new).is_ok(),
                        want,
                        "{name}: {current:?} -> {new:?}"
                    );
                }
            }
        }
    }

    /// Prompt and analytics access: owners, admins and workspace admins always; managers and
    /// members as the settings say, for every combination of the six settings.
    #[test]
    fn prompt_and_analytics_access_follow_the_settings() {
        let d = AccessSettings::default();
        assert!(d.members_view_prompts && !d.members_write_prompts);
        assert!(d.managers_view_prompts && d.managers_write_prompts);
        assert!(d.members_view_analytics && d.managers_view_analytics);
        let principals = [
            ("admin key", org(OrgRole::Admin)),
            ("workspace admin", ws(WorkspaceRole::Admin)),
            ("workspace manager", ws(WorkspaceRole::Manager)),
            ("workspace member", ws(WorkspaceRole::Member)),
        ];
        let cells = [
            (Resource::Prompts, Op::Read, true),
            (Resource::Prompts, Op::List, true),
            (Resource::Prompts, Op::Create, false),
            (Resource::Prompts, Op::Update, false),
            (Resource::Prompts, Op::Delete, false),
            (Resource::Analytics, Op::View, true),
        ];
        for bits in 0u8..64 {
            let s = AccessSettings {
                members_view_prompts: bits & 1 != 0,
                members_write_prompts: bits & 2 != 0,
                managers_view_prompts: bits & 4 != 0,
                managers_write_prompts: bits & 8 != 0,
                members_view_analytics: bits & 16 != 0,
                managers_view_analytics: bits & 32 != 0,
            };
            for (name, p) in &principals {
                for (resource, op, reads) in cells {
                    let (view, write) = match (*name, resource) {
                        ("workspace manager", Resource::Prompts) => {
                            (s.managers_view_prompts, s.managers_write_prompts)
                        }
                        ("workspace member", Resource::Prompts) => {
                            (s.members_view_prompts, s.members_write_prompts)
                        }
                        ("workspace manager", _) => (s.managers_view_analytics, false),
                        ("workspace member", _) => (s.members_view_analytics, false),
                        _ => (true, true),
                    };
                    let want = if reads { view || write } else { write };
                    let got =
                        allowed_with_settings(p, &Action::new(resource, op), Some(WS), &s).is_ok();
                    assert_eq!(got, want, "{name} {resource:?} {op:?} with {s:?}");
                    // The workspace rule still comes first.
                    let elsewhere =
                        allowed_with_settings(p, &Action::new(resource, op), Some(OTHER), &s);
                    assert_eq!(elsewhere.is_ok(), *name == "admin key");
                }
            }
        }
        // Other resources are not governed by these settings.
        let none = AccessSettings {
            members_view_prompts: false,
            members_write_prompts: false,
            managers_view_prompts: false,
            managers_write_prompts: false,
            members_view_analytics: false,
            managers_view_analytics: false,
        };
        let member = ws(WorkspaceRole::Member);
        let read_config = Action::new(Resource::Configs, Op::Read);
        assert!(allowed_with_settings(&member, &read_config, Some(WS), &none).is_ok());
        let err = allowed_with_settings(
            &member,
            &Action::new(Resource::Prompts, Op::Read),
            Some(WS),
            &none,
        )
        .unwrap_err();
        assert_eq!(
            err.0,
            "the workspace's settings do not let members see prompts"
        );
    }

    /// Configs, providers, virtual keys and workspace integrations, every role-by-action cell:
    /// an admin key anywhere; a workspace admin or manager everything in its own workspace; a
    /// workspace member reads and lists there but does not create, update or delete; an
    /// organisation member nothing. Organisation integrations are the admin key's, and a
    /// workspace key reads one shared with its workspace.
    #[test]
    fn configs_providers_integrations_by_role() {
        let resources = [
            Resource::Configs,
            Resource::Providers,
            Resource::VirtualKeys,
            Resource::WorkspaceIntegrations,
        ];
        let ops = [Op::Create, Op::Read, Op::Update, Op::Delete, Op::List];
        let principals = [
            ("organisation owner", org(OrgRole::Owner)),
            ("organisation admin", org(OrgRole::Admin)),
            ("organisation member", org(OrgRole::Member)),
            ("workspace admin", ws(WorkspaceRole::Admin)),
            ("workspace manager", ws(WorkspaceRole::Manager)),
            ("workspace member", ws(WorkspaceRole::Member)),
        ];
        for (name, p) in &principals {
            for resource in resources {
                for op in ops {
                    for place in [Some(WS), Some(OTHER), None] {
                        let want = match *name {
                            "organisation owner" | "organisation admin" => true,
                            "workspace admin" | "workspace manager" => place == Some(WS),
                            "workspace member" => place == Some(WS) && op.reads(),
                            _ => false,
                        };
                        assert_eq!(
                            can(p, resource, op, place),
                            want,
                            "{name}: {resource:?} {op:?} in {place:?}"
                        );
                    }
                }
            }
            for op in ops {
                // A workspace integration follows the workspace rule above.
                assert_eq!(
                    integration_allowed(p, op, Some(WS), false).is_ok(),
                    can(p, Resource::WorkspaceIntegrations, op, Some(WS)),
                    "{name}: workspace integration {op:?}"
                );
                // An organisation integration: the admin key; a workspace key reads it only
                // when it is shared with its workspace.
                let admin = matches!(*name, "organisation owner" | "organisation admin");
                let workspace_key = name.starts_with("workspace");
                for shared in [false, true] {
                    let want = admin || (workspace_key && shared && op.reads());
                    assert_eq!(
                        integration_allowed(p, op, None, shared).is_ok(),
                        want,
                        "{name}: organisation integration {op:?}, shared {shared}"
                    );
                }
            }
        }
        let err = allowed(
            &ws(WorkspaceRole::Member),
            &Action::new(Resource::Configs, Op::Update),
            Some(WS),
        )
        .unwrap_err();
        assert!(err.0.starts_with("workspace members read configs"), "{err}");
        // Scopes narrow each cell: a manager holding only configs.read reads and nothing else.
        let mut manager = ws(WorkspaceRole::Manager);
        manager.scopes = Some(["configs.read".to_owned()].into());
        assert!(can(&manager, Resource::Configs, Op::Read, Some(WS)));
        assert!(!can(&manager, Resource::Configs, Op::List, Some(WS)));
        assert!(!can(&manager, Resource::Providers, Op::Read, Some(WS)));
        let mut admin = org(OrgRole::Admin);
        admin.scopes = Some(["workspace_integrations.read".to_owned()].into());
        assert!(integration_allowed(&admin, Op::Read, Some(WS), false).is_ok());
        assert!(integration_allowed(&admin, Op::Read, None, false).is_err());
        for family in [
            "configs",
            "providers",
            "virtual_keys",
            "workspace_integrations",
        ] {
            for op in ops {
                let scope = format!("{family}.{}", op.as_str());
                assert!(
                    grantable_scopes(KeyKind::WorkspaceUser).contains(&scope),
                    "{scope}"
                );
            }
        }
        assert!(!grantable_scopes(KeyKind::WorkspaceService)
            .contains("organisation_integrations.create"));
    }

    /// Acting for a user through a user key: every caller against every kind of user.
    #[test]
    fn user_keys_only_for_members_at_or_below_the_caller() {
        use WorkspaceRole::*;
        let mut org_admin_user = ws(Admin);
        org_admin_user.user_org_role = Some(OrgRole::Admin);
        let mut service = ws(Manager);
        service.key_kind = Some(KeyKind::WorkspaceService);
        // A service key made by an owner acts for nobody: its maker's role does not count.
        service.user_org_role = Some(OrgRole::Owner);
        let callers = [
            ("admin key", org(OrgRole::Admin), 3),
            ("organisation admin's user key", org_admin_user, 3),
            ("workspace admin", ws(Admin), 2),
            ("workspace manager", ws(Manager), 1),
            ("service key", service, 1),
            ("workspace member", ws(Member), 0),
            ("organisation member", org(OrgRole::Member), -1),
        ];
        let mut users = Vec::new();
        for org_role in [OrgRole::Owner, OrgRole::Admin, OrgRole::Member] {
            for membership in [None, Some(Member), Some(Manager), Some(Admin)] {
                users.push(KeyUser {
                    org_role,
                    membership,
                });
            }
        }
        for (name, p, rank) in &callers {
            for user in &users {
                let want = match user {
                    _ if *rank == 3 => true,
                    KeyUser {
                        org_role: OrgRole::Member,
                        membership: Some(m),
                    } => i32::from(m.rank()) <= *rank,
                    _ => false,
                };
                assert_eq!(
                    may_act_for_user(p, user).is_ok(),
                    want,
                    "{name} for {user:?}"
                );
            }
        }
        let err = may_act_for_user(
            &ws(Manager),
            &KeyUser {
                org_role: OrgRole::Member,
                membership: Some(Admin),
            },
        )
        .unwrap_err();
        assert!(err.0.contains("at most its own"), "{err}");
    }
}
