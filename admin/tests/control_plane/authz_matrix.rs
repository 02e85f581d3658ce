//! The authorisation matrix: every route of the control plane's route table
//! (`admin::api::routes()`) × every kind of caller × a target in the caller's own workspace, in
//! another workspace, or at the organisation level, against [`TABLE`], where each expected
//! outcome is written once.
//!
//! The callers, in the order of each group of [`TABLE`]:
//!
//! | | caller |
//! |---|---|
//! | `A` | the bootstrap admin key (every scope) |
//! | `s` | an admin key with only `workspaces.read` |
//! | `O` | the user key of an organisation admin (not a member) in workspace A |
//! | `W` | the user key of a workspace admin of A |
//! | `M` | the user key of a manager of A |
//! | `m` | the user key of a member of A |
//! | `S` | a workspace service key of A (role manager) |
//! | `n` | an admin key without scopes |
//!
//! Workspace keys carry every scope a workspace key may carry, so that their role and their
//! workspace decide. Two more callers, an expired key and a key rotated out (its transition
//! over), get a 401 on every route that asks for a key.
//!
//! Each row is `(method, path, variant, expected)`; `expected` holds three groups, for the
//! targets own workspace (A), other workspace (B) and organisation level, each one character
//! per caller or `-` where the route has no such target: `+` a 2xx answer, `3` 403, `4` 404,
//! `0` 400, `9` 409. What a target is depends on the route: the workspace of the resource of
//! the path, the workspace a body or query names (`workspace_id`), or, at the organisation
//! level, a resource of the organisation itself or a request naming no workspace.
//!
//! One database, set up once; routes that change or remove what they act on get a fresh
//! resource for each call. A mismatch names the route and prints the row as observed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};

use admin::authz::{grantable_scopes, KeyKind, OrgRole, WorkspaceRole};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::common::{App, TestDb, ADMIN_KEY};
use crate::integrations::app_with_key;

/// The callers that the groups of [`TABLE`] list, in order.
const CALLERS: [&str; 8] = [
    "admin key",
    "scoped admin key",
    "org admin's user key",
    "workspace admin",
    "manager",
    "member",
    "service key",
    "key without scopes",
];

/// Routes served without a key: every caller gets what anyone gets.
const PUBLIC: &[(&str, &str)] = &[
    ("GET", "/v1/openapi.json"),
    ("POST", "/v1/admin/users/invites/{id}/accept"),
];

#[rustfmt::skip]
const TABLE: &[(&str, &str, &str, &str)] = &[
    //         path                                                      variant                  own      other    organisation
    //                                                                                            AsOWMmSn AsOWMmSn AsOWMmSn
    ("GET",    "/v1/openapi.json",                                       "",                     "-        -        ++++++++"),
    ("GET",    "/v1/api-keys",                                           "",                     "+3+++++3 +3333333 +3+++++3"),
    ("GET",    "/v1/api-keys/{id}",                                      "",                     "+3+++3+3 +3333333 +3333333"),
    ("PUT",    "/v1/api-keys/{id}",                                      "",                     "+3+++3+3 +3333333 +3333333"),
    ("DELETE", "/v1/api-keys/{id}",                                      "",                     "+3+++3+3 +3333333 +3333333"),
    ("GET",    "/v1/api-keys/{id}/rotated-key",                          "",                     "+3+++3+3 +3333333 +3333333"),
    ("POST",   "/v1/api-keys/{id}/{action}",                             "organisation/service", "-        -        +3333333"),
    ("POST",   "/v1/api-keys/{id}/{action}",                             "workspace/service",    "+3+++3+3 +3333333 -"),
    ("POST",   "/v1/api-keys/{id}/{action}",                             "workspace/user",       "+3+++3+3 +3333333 -"),
    ("POST",   "/v1/api-keys/{id}/{action}",                             "rotate",               "+3+++3+3 +3333333 +3333333"),
    ("POST",   "/v1/api-keys/{id}/{action}/bulk",                        "organisation/service", "-        -        +3333333"),
    ("POST",   "/v1/api-keys/{id}/{action}/bulk",                        "workspace/service",    "+3+++3+3 +3333333 -"),
    ("POST",   "/v1/api-keys/{id}/{action}/bulk",                        "workspace/user",       "+3+++3+3 +3333333 -"),
    ("POST",   "/v1/admin/workspaces",                                   "",                     "-        -        +3333333"),
    ("GET",    "/v1/admin/workspaces",                                   "",                     "-        -        +3333333"),
    ("GET",    "/v1/admin/workspaces/{id}",                              "",                     "++333333 ++333333 -"),
    ("PUT",    "/v1/admin/workspaces/{id}",                              "",                     "+3333333 +3333333 -"),
    // Never workspace A itself: the matrix runs in it.
    ("DELETE", "/v1/admin/workspaces/{id}",                              "",                     "-        +3333333 -"),
    ("POST",   "/v1/admin/workspaces/{id}/users",                        "",                     "+3+++3+3 +3333333 -"),
    ("GET",    "/v1/admin/workspaces/{id}/users",                        "",                     "+3+++3+3 +3333333 -"),
    ("GET",    "/v1/admin/workspaces/{id}/users/{user_id}",              "",                     "+3+++3+3 +3333333 -"),
    ("PUT",    "/v1/admin/workspaces/{id}/users/{user_id}",              "",                     "+3+++3+3 +3333333 -"),
    ("DELETE", "/v1/admin/workspaces/{id}/users/{user_id}",              "",                     "+3+++3+3 +3333333 -"),
    ("GET",    "/v1/admin/workspaces/{id}/settings",                     "",                     "++333333 ++333333 -"),
    ("PUT",    "/v1/admin/workspaces/{id}/settings",                     "",                     "+3333333 +3333333 -"),
    ("GET",    "/v1/admin/settings",                                     "",                     "-        -        +3333333"),
    ("PUT",    "/v1/admin/settings",                                     "",                     "-        -        +3333333"),
    ("GET",    "/v1/admin/users",                                        "",                     "-        -        +3333333"),
    ("GET",    "/v1/admin/users/{id}",                                   "",                     "-        -        +3333333"),
    ("PUT",    "/v1/admin/users/{id}",                                   "",                     "-        -        +3333333"),
    ("DELETE", "/v1/admin/users/{id}",                                   "",                     "-        -        +3333333"),
    ("POST",   "/v1/admin/users/invites",                                "",                     "-        -        +3333333"),
    ("GET",    "/v1/admin/users/invites",                                "",                     "-        -        +3333333"),
    ("GET",    "/v1/admin/users/invites/{id}",                           "",                     "-        -        +3333333"),
    ("DELETE", "/v1/admin/users/invites/{id}",                           "",                     "-        -        +3333333"),
    ("POST",   "/v1/admin/users/invites/{id}/resend",                    "",                     "-        -        +3333333"),
    ("POST",   "/v1/admin/users/invites/{id}/accept",                    "",                     "-        -        ++++++++"),
    ("POST",   "/v1/deployments",                                        "",                     "-        -        +3333333"),
    ("GET",    "/v1/deployments",                                        "",                     "-        -        +3333333"),
    ("GET",    "/v1/deployments/{id}",                                   "",                     "-        -        +3333333"),
    ("PUT",    "/v1/deployments/{id}",                                   "",                     "-        -        +3333333"),
    ("DELETE", "/v1/deployments/{id}",                                   "",                     "-        -        +3333333"),
    ("GET",    "/v1/audit-logs",                                         "",                     "-        -        +3333333"),
    ("GET",    "/v1/logs",                                               "",                     "+3+++++3 +3333333 +3+++++3"),
    ("POST",   "/v1/logs",                                               "",                     "-        -        +3+++++3"),
    ("POST",   "/v1/logs/exports",                                       "",                     "+3+++++3 +3333333 +3+++++3"),
    ("GET",    "/v1/logs/exports",                                       "",                     "+3+++++3 +3333333 +3+++++3"),
    ("GET",    "/v1/logs/exports/{id}",                                  "",                     "+3+++++3 +3333333 +3333333"),
    ("PUT",    "/v1/logs/exports/{id}",                                  "",                     "+3+++++3 +3333333 +3333333"),
    ("POST",   "/v1/logs/exports/{id}/start",                            "",                     "+3+++++3 +3333333 +3333333"),
    ("POST",   "/v1/logs/exports/{id}/cancel",                           "",                     "+3+++++3 +3333333 +3333333"),
    ("GET",    "/v1/logs/exports/{id}/download",                         "",                     "+3+++++3 +3333333 +3333333"),
    ("GET",    "/v1/logs/{id}",                                          "",                     "+3+++++3 +3333333 -"),
    ("POST",   "/v1/configs",                                            "",                     "+3+++3+3 +3333333 +3+++3+3"),
    ("GET",    "/v1/configs",                                            "",                     "+3+++++3 +3333333 +3+++++3"),
    ("GET",    "/v1/configs/{slug}",                                     "",                     "+3+++++3 +3333333 -"),
    ("PUT",    "/v1/configs/{slug}",                                     "",                     "+3+++3+3 +3333333 -"),
    ("DELETE", "/v1/configs/{slug}",                                     "",                     "+3+++3+3 +3333333 -"),
    ("GET",    "/v1/configs/{slug}/versions",                            "",                     "+3+++++3 +3333333 -"),
    // Another workspace's guardrail is a 404 to workspace keys, as one that does not exist.
    ("POST",   "/v1/guardrails",                                         "",                     "+3+++3+3 +3333333 +3+++3+3"),
    ("GET",    "/v1/guardrails",                                         "",                     "+3+++++3 +3333333 +3+++++3"),
    ("GET",    "/v1/guardrails/{id}",                                    "",                     "+3+++++3 +3444443 -"),
    ("PUT",    "/v1/guardrails/{id}",                                    "",                     "+3+++3+3 +3444443 -"),
    ("DELETE", "/v1/guardrails/{id}",                                    "",                     "+3+++3+3 +3444443 -"),
    ("POST",   "/v1/integrations",                                       "",                     "+3+++3+3 +3333333 +3+++3+3"),
    ("GET",    "/v1/integrations",                                       "",                     "+3+++++3 +3333333 +3+++++3"),
    // At the organisation level: an integration of the organisation, shared with no workspace
    // (a 404 to workspace keys, which do not see it).
    ("GET",    "/v1/integrations/{slug}",                                "",                     "+3+++++3 +3333333 +3444443"),
    ("PUT",    "/v1/integrations/{slug}",                                "",                     "+3+++3+3 +3333333 +3444443"),
    ("DELETE", "/v1/integrations/{slug}",                                "",                     "+3+++3+3 +3333333 +3444443"),
    ("GET",    "/v1/integrations/{slug}/workspaces",                     "",                     "+3+++++3 +3333333 +3444443"),
    // Only organisation integrations are shared with workspaces: a 400 for a workspace's.
    ("PUT",    "/v1/integrations/{slug}/workspaces",                     "",                     "03000303 03333333 +3444443"),
    ("GET",    "/v1/integrations/{slug}/models",                         "",                     "+3+++++3 +3333333 +3444443"),
    ("PUT",    "/v1/integrations/{slug}/models",                         "",                     "+3+++3+3 +3333333 +3444443"),
    ("POST",   "/v1/providers",                                          "",                     "+3+++3+3 +3333333 +3+++3+3"),
    ("POST",   "/v1/providers/bulk",                                     "",                     "+3+++3+3 +3333333 +3+++3+3"),
    ("GET",    "/v1/providers",                                          "",                     "+3+++++3 +3333333 +3+++++3"),
    ("GET",    "/v1/providers/{slug}",                                   "",                     "+3+++++3 +3333333 -"),
    ("PUT",    "/v1/providers/{slug}",                                   "",                     "+3+++3+3 +3333333 -"),
    ("DELETE", "/v1/providers/{slug}",                                   "",                     "+3+++3+3 +3333333 -"),
    ("POST",   "/v1/virtual-keys",                                       "",                     "+3+++3+3 +3333333 +3+++3+3"),
    ("GET",    "/v1/virtual-keys",                                       "",                     "+3+++++3 +3333333 +3+++++3"),
    ("GET",    "/v1/virtual-keys/{slug}",                                "",                     "+3+++++3 +3333333 -"),
    ("PUT",    "/v1/virtual-keys/{slug}",                                "",                     "+3+++3+3 +3333333 -"),
    ("DELETE", "/v1/virtual-keys/{slug}",                                "",                     "+3+++3+3 +3333333 -"),
    // Naming no workspace: a workspace key's own; an admin key must name one (400).
    ("POST",   "/v1/policies/rate-limits",                               "",                     "+3+++++3 +3333333 00+++++0"),
    ("GET",    "/v1/policies/rate-limits",                               "",                     "+3+++++3 +3333333 +3+++++3"),
    ("GET",    "/v1/policies/rate-limits/{id}",                          "",                     "+3+++++3 +3333333 -"),
    ("PUT",    "/v1/policies/rate-limits/{id}",                          "",                     "+3+++++3 +3333333 -"),
    ("DELETE", "/v1/policies/rate-limits/{id}",                          "",                     "+3+++++3 +3333333 -"),
    ("GET",    "/v1/policies/rate-limits/{id}/entities",                 "",                     "+3+++++3 +3333333 -"),
    ("POST",   "/v1/policies/usage-limits",                              "",                     "+3+++++3 +3333333 00+++++0"),
    ("GET",    "/v1/policies/usage-limits",                              "",                     "+3+++++3 +3333333 +3+++++3"),
    ("GET",    "/v1/policies/usage-limits/{id}",                         "",                     "+3+++++3 +3333333 -"),
    ("PUT",    "/v1/policies/usage-limits/{id}",                         "",                     "+3+++++3 +3333333 -"),
    ("DELETE", "/v1/policies/usage-limits/{id}",                         "",                     "+3+++++3 +3333333 -"),
    ("GET",    "/v1/policies/usage-limits/{id}/entities",                "",                     "+3+++++3 +3333333 -"),
    // Nothing counted for the entity: a 404 once authorised.
    ("PUT",    "/v1/policies/usage-limits/{id}/entities/{entity}/reset", "",                     "43444443 43333333 -"),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Own,
    Other,
    Org,
}

const TARGETS: [Target; 3] = [Target::Own, Target::Other, Target::Org];

struct World {
    app: App,
    /// Workspace A (the callers') and B.
    a: String,
    b: String,
    callers: Vec<String>,
    /// An expired key and a key rotated out.
    dead: Vec<(&'static str, String)>,
    /// Shared resources by target (own, other, org), where the route reads them.
    shared: BTreeMap<&'static str, [String; 3]>,
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

fn fresh(prefix: &str) -> String {
    format!("{prefix}-{}", SEQ.fetch_add(1, Ordering::SeqCst))
}

fn index(t: Target) -> usize {
    match t {
        Target::Own => 0,
        Target::Other => 1,
        Target::Org => 2,
    }
}

impl World {
    fn ws(&self, t: Target) -> Option<&str> {
        match t {
            Target::Own => Some(&self.a),
            Target::Other => Some(&self.b),
            Target::Org => None,
        }
    }

    fn shared(&self, what: &str, t: Target) -> Option<String> {
        let v = &self
            .shared
            .get(what)
            .unwrap_or_else(|| panic!("no shared {what}"))[index(t)];
        (!v.is_empty()).then(|| v.clone())
    }

    async fn ok(&self, method: &str, path: &str, body: Value) -> Value {
        let (s, got) = self.app.admin(method, path, Some(body)).await;
        assert_eq!(s, 200, "setup: {method} {path}: {got}");
        got
    }

    /// A key made with the admin key: a workspace service key of `ws`, or an admin key.
    async fn key(&self, ws: Option<&str>) -> (String, String) {
        let (path, body) = match ws {
            Some(ws) => (
                "/v1/api-keys/workspace/service",
                json!({"name": "target", "workspace_id": ws, "scopes": []}),
            ),
            None => (
                "/v1/api-keys/organisation/service",
                json!({"name": "target", "scopes": []}),
            ),
        };
        self.app.key(ADMIN_KEY, path, body).await
    }

    async fn user(&self, ws: Option<&str>) -> String {
        let role = ws.map(|w| (w, WorkspaceRole::Member));
        self.app
            .user(
                &format!("{}@example.com", fresh("u")),
                OrgRole::Member,
                role,
            )
            .await
    }

    async fn workspace(&self) -> String {
        self.app.workspace(&fresh("ws")).await
    }

    async fn config(&self, ws: &str) -> String {
        let got = self
            .ok(
                "POST",
                "/v1/configs",
                json!({"name": "c", "config": {}, "workspace_id": ws}),
            )
            .await;
        got["slug"].as_str().unwrap().to_owned()
    }

    async fn guardrail(&self, ws: &str) -> String {
        let got = self
            .ok("POST", "/v1/guardrails", guardrail_body(Some(ws)))
            .await;
        got["slug"].as_str().unwrap().to_owned()
    }

    async fn integration(&self, ws: Option<&str>) -> String {
        let mut body = json!({"name": fresh("i"), "ai_provider_id": "openai", "key": "sk-target-000000",
                              "create_default_provider": false});
        if let Some(ws) = ws {
            body["workspace_id"] = json!(ws);
        }
        let got = self.ok("POST", "/v1/integrations", body).await;
        got["slug"].as_str().unwrap().to_owned()
    }

    async fn provider(&self, ws: &str) -> String {
        let integration = self.integration(Some(ws)).await;
        let got = self
            .ok(
                "POST",
                "/v1/providers",
                json!({"name": "p", "integration_id": integration, "workspace_id": ws}),
            )
            .await;
        got["slug"].as_str().unwrap().to_owned()
    }

    async fn virtual_key(&self, ws: &str) -> String {
        let got = self
            .ok(
                "POST",
                "/v1/virtual-keys",
                json!({"name": "v", "provider": "openai", "key": "sk-target-000000", "workspace_id": ws}),
            )
            .await;
        got["slug"].as_str().unwrap().to_owned()
    }

    async fn policy(&self, kind: &str, ws: &str) -> String {
        let got = self
            .ok(
                "POST",
                &format!("/v1/policies/{kind}"),
                policy_body(kind, Some(ws)),
            )
            .await;
        got["id"].as_str().unwrap().to_owned()
    }

    async fn export(&self, ws: Option<&str>) -> String {
        let got = self.ok("POST", "/v1/logs/exports", export_body(ws)).await;
        got["id"].as_str().unwrap().to_owned()
    }

    async fn deployment(&self) -> String {
        let got = self
            .ok("POST", "/v1/deployments", json!({"name": fresh("d")}))
            .await;
        got["id"].as_str().unwrap().to_owned()
    }

    async fn invite(&self) -> (String, String) {
        let got = self
            .ok(
                "POST",
                "/v1/admin/users/invites",
                json!({"email": format!("{}@example.com", fresh("inv")), "role": "member", "workspaces": []}),
            )
            .await;
        let link = got["invite_link"].as_str().unwrap();
        let token = link.split_once("token=").unwrap().1.to_owned();
        (got["id"].as_str().unwrap().to_owned(), token)
    }
}

fn policy_body(kind: &str, ws: Option<&str>) -> Value {
    let mut body = if kind == "rate-limits" {
        json!({"conditions": [{"key": "metadata._user", "value": "*"}], "group_by": [{"key": "metadata._user"}],
               "type": "requests", "unit": "rpm", "value": 100})
    } else {
        json!({"conditions": [{"key": "metadata._user", "value": "*"}], "group_by": [{"key": "metadata._user"}],
               "type": "cost", "credit_limit": 100})
    };
    if let Some(ws) = ws {
        body["workspace_id"] = json!(ws);
    }
    body
}

fn export_body(ws: Option<&str>) -> Value {
    let mut body = json!({"requested_data": ["id"]});
    if let Some(ws) = ws {
        body["workspace_id"] = json!(ws);
    }
    body
}

async fn world(db: TestDb) -> World {
    let app = app_with_key(db).await;
    let a = app.default_ws.clone();
    let b = app.workspace("B").await;
    let ws_scopes: Vec<String> = grantable_scopes(KeyKind::WorkspaceUser)
        .into_iter()
        .collect();
    let ws_scopes: Vec<&str> = ws_scopes.iter().map(String::as_str).collect();
    let in_a = |role| Some((a.as_str(), role));
    let org_admin = app
        .user("org-admin@example.com", OrgRole::Admin, None)
        .await;
    let ws_admin = app
        .user(
            "ws-admin@example.com",
            OrgRole::Member,
            in_a(WorkspaceRole::Admin),
        )
        .await;
    let manager = app
        .user(
            "manager@example.com",
            OrgRole::Member,
            in_a(WorkspaceRole::Manager),
        )
        .await;
    let member = app
        .user(
            "member@example.com",
            OrgRole::Member,
            in_a(WorkspaceRole::Member),
        )
        .await;
    let (_, scoped) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/organisation/service",
            json!({"name": "scoped", "scopes": ["workspaces.read"]}),
        )
        .await;
    let (_, no_scopes) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/organisation/service",
            json!({"name": "none", "scopes": []}),
        )
        .await;
    let (_, service) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "svc", "workspace_id": a, "scopes": ws_scopes}),
        )
        .await;
    let mut callers = vec![ADMIN_KEY.to_owned(), scoped];
    for user in [&org_admin, &ws_admin, &manager, &member] {
        callers.push(app.user_key(&a, user, &ws_scopes).await.1);
    }
    callers.push(service);
    callers.push(no_scopes);

    // An expired key: its expiry passed (the expiry worker has not marked it yet).
    let (expired_id, expired) = app.user_key(&a, &ws_admin, &ws_scopes).await;
    app.sql(
        "UPDATE api_keys SET expires_at = '2001-01-01T00:00:00.000Z' WHERE id = $1",
        &[&expired_id],
    )
    .await;
    // A key rotated out: rotated, and its transition over.
    let (old_id, old) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/organisation/service",
            json!({"name": "old", "scopes": ["workspaces.read"]}),
        )
        .await;
    let (s, b_) = app
        .admin(
            "POST",
            &format!("/v1/api-keys/{old_id}/rotate"),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, 200, "{b_}");
    app.sql(
        "UPDATE api_keys SET previous_key_expires_at = '2001-01-01T00:00:00.000Z' WHERE id = $1",
        &[&old_id],
    )
    .await;

    let mut w = World {
        app,
        a: a.clone(),
        b: b.clone(),
        callers,
        dead: vec![("expired key", expired), ("rotated-out key", old)],
        shared: BTreeMap::new(),
    };
    let own_other = |x: String, y: String| [x, y, String::new()];
    let key_a = w.key(Some(&a)).await.0;
    let key_b = w.key(Some(&b)).await.0;
    let key_org = w.key(None).await.0;
    w.shared.insert("key", [key_a, key_b, key_org]);
    let (ua, ub) = (w.user(Some(&a)).await, w.user(Some(&b)).await);
    w.shared.insert("member", own_other(ua, ub));
    let user = w.user(None).await;
    w.shared
        .insert("user", [String::new(), String::new(), user]);
    let (ca, cb) = (w.config(&a).await, w.config(&b).await);
    w.shared.insert("config", own_other(ca, cb));
    let (ga, gb) = (w.guardrail(&a).await, w.guardrail(&b).await);
    w.shared.insert("guardrail", own_other(ga, gb));
    let integrations = [
        w.integration(Some(&a)).await,
        w.integration(Some(&b)).await,
        w.integration(None).await,
    ];
    w.shared.insert("integration", integrations);
    let (pa, pb) = (w.provider(&a).await, w.provider(&b).await);
    w.shared.insert("provider", own_other(pa, pb));
    let (va, vb) = (w.virtual_key(&a).await, w.virtual_key(&b).await);
    w.shared.insert("virtual key", own_other(va, vb));
    for kind in ["rate-limits", "usage-limits"] {
        let (pa, pb) = (w.policy(kind, &a).await, w.policy(kind, &b).await);
        w.shared.insert(kind, own_other(pa, pb));
    }
    let exports = [
        w.export(Some(&a)).await,
        w.export(Some(&b)).await,
        w.export(None).await,
    ];
    w.shared.insert("export", exports);
    let deployment = w.deployment().await;
    w.shared
        .insert("deployment", [String::new(), String::new(), deployment]);
    let invite = w.invite().await.0;
    w.shared
        .insert("invite", [String::new(), String::new(), invite]);
    // A log in each workspace, written with a key of that workspace.
    let mut logs = Vec::new();
    for ws in [&a, &b] {
        let (_, writer) = w
            .app
            .key(
                ADMIN_KEY,
                "/v1/api-keys/workspace/service",
                json!({"name": "writer", "workspace_id": ws, "scopes": ["logs.write"]}),
            )
            .await;
        let (s, got) = w
            .app
            .call(
                "POST",
                "/v1/logs",
                Some(&writer),
                Some(json!({"request": {}, "response": {"status": 200}})),
            )
            .await;
        assert_eq!(s, 200, "{got}");
        logs.push(got["data"][0]["id"].as_str().unwrap().to_owned());
    }
    w.shared
        .insert("log", [logs[0].clone(), logs[1].clone(), String::new()]);
    w
}

/// The request of one cell: its path and body, or `None` when the route has no such target.
/// Routes that change or remove what they act on get a fresh resource.
async fn request(
    w: &World,
    method: &str,
    route: &str,
    variant: &str,
    t: Target,
) -> Option<(String, Option<Value>)> {
    let ws = w.ws(t);
    let query = |path: &str| match ws {
        Some(ws) => format!("{path}?workspace_id={ws}"),
        None => path.to_owned(),
    };
    let with_ws = |mut body: Value| {
        if let Some(ws) = ws {
            body["workspace_id"] = json!(ws);
        }
        body
    };
    let shared = |what: &str| w.shared(what, t);
    let none = None::<Value>;
    Some(match (method, route, variant) {
        ("GET", "/v1/openapi.json", _) if t == Target::Org => (route.to_owned(), none),
        ("GET", "/v1/api-keys", _) => (query(route), none),
        ("GET", "/v1/api-keys/{id}", _) => (format!("/v1/api-keys/{}", shared("key")?), none),
        // A key whose automatic rotation has left a value to fetch.
        ("GET", "/v1/api-keys/{id}/rotated-key", _) => {
            let id = w.key(ws).await.0;
            w.ok(
                "PUT",
                &format!("/v1/api-keys/{id}"),
                json!({"rotation_policy": {"next_rotation_at": "2001-01-01T00:00:00Z"}}),
            )
            .await;
            assert!(w.app.store.rotate_due_api_keys().await.unwrap() >= 1);
            (format!("/v1/api-keys/{id}/rotated-key"), none)
        }
        ("PUT", "/v1/api-keys/{id}", _) => (
            format!("/v1/api-keys/{}", w.key(ws).await.0),
            Some(json!({"name": "renamed"})),
        ),
        ("DELETE", "/v1/api-keys/{id}", _) => (format!("/v1/api-keys/{}", w.key(ws).await.0), none),
        ("POST", "/v1/api-keys/{id}/{action}", "rotate") => (
            format!("/v1/api-keys/{}/rotate", w.key(ws).await.0),
            Some(json!({})),
        ),
        ("POST", "/v1/api-keys/{id}/{action}", "organisation/service") if t == Target::Org => (
            "/v1/api-keys/organisation/service".to_owned(),
            Some(json!({"name": "k", "scopes": []})),
        ),
        ("POST", "/v1/api-keys/{id}/{action}", "workspace/service") => (
            "/v1/api-keys/workspace/service".to_owned(),
            Some(json!({"name": "k", "scopes": [], "workspace_id": ws?})),
        ),
        ("POST", "/v1/api-keys/{id}/{action}", "workspace/user") => (
            "/v1/api-keys/workspace/user".to_owned(),
            Some(
                json!({"name": "k", "scopes": [], "workspace_id": ws?, "user_id": w.user(ws).await}),
            ),
        ),
        ("POST", "/v1/api-keys/{id}/{action}/bulk", "organisation/service") if t == Target::Org => {
            (
                "/v1/api-keys/organisation/service/bulk".to_owned(),
                Some(json!({"keys": [{"name": "k", "scopes": []}]})),
            )
        }
        ("POST", "/v1/api-keys/{id}/{action}/bulk", "workspace/service") => (
            "/v1/api-keys/workspace/service/bulk".to_owned(),
            Some(json!({"keys": [{"name": "k", "scopes": [], "workspace_id": ws?}]})),
        ),
        ("POST", "/v1/api-keys/{id}/{action}/bulk", "workspace/user") => (
            "/v1/api-keys/workspace/user/bulk".to_owned(),
            Some(
                json!({"keys": [{"name": "k", "scopes": [], "workspace_id": ws?,
                                  "user_id": w.user(ws).await}]}),
            ),
        ),
        ("POST", "/v1/admin/workspaces", _) if t == Target::Org => {
            (route.to_owned(), Some(json!({"name": fresh("ws")})))
        }
        ("GET", "/v1/admin/workspaces", _) if t == Target::Org => (route.to_owned(), none),
        ("GET", "/v1/admin/workspaces/{id}", _) => (format!("/v1/admin/workspaces/{}", ws?), none),
        ("PUT", "/v1/admin/workspaces/{id}", _) => (
            format!("/v1/admin/workspaces/{}", ws?),
            Some(json!({"description": "d"})),
        ),
        // Never workspace A itself: the matrix runs in it.
        ("DELETE", "/v1/admin/workspaces/{id}", _) if t == Target::Other => (
            format!("/v1/admin/workspaces/{}", w.workspace().await),
            none,
        ),
        ("POST", "/v1/admin/workspaces/{id}/users", _) => (
            format!("/v1/admin/workspaces/{}/users", ws?),
            Some(json!({"users": [{"id": w.user(None).await, "role": "member"}]})),
        ),
        ("GET", "/v1/admin/workspaces/{id}/users", _) => {
            (format!("/v1/admin/workspaces/{}/users", ws?), none)
        }
        ("GET", "/v1/admin/workspaces/{id}/users/{user_id}", _) => (
            format!("/v1/admin/workspaces/{}/users/{}", ws?, shared("member")?),
            none,
        ),
        ("PUT", "/v1/admin/workspaces/{id}/users/{user_id}", _) => (
            format!("/v1/admin/workspaces/{}/users/{}", ws?, w.user(ws).await),
            Some(json!({"role": "manager"})),
        ),
        ("DELETE", "/v1/admin/workspaces/{id}/users/{user_id}", _) => (
            format!("/v1/admin/workspaces/{}/users/{}", ws?, w.user(ws).await),
            none,
        ),
        ("GET", "/v1/admin/workspaces/{id}/settings", _) => {
            (format!("/v1/admin/workspaces/{}/settings", ws?), none)
        }
        ("PUT", "/v1/admin/workspaces/{id}/settings", _) => (
            format!("/v1/admin/workspaces/{}/settings", ws?),
            Some(json!({"user_api_keys_per_workspace_max": null})),
        ),
        ("GET", "/v1/admin/settings", _) if t == Target::Org => (route.to_owned(), none),
        ("PUT", "/v1/admin/settings", _) if t == Target::Org => (
            route.to_owned(),
            Some(json!({"user_api_keys_per_workspace_max": null})),
        ),
        ("GET", "/v1/admin/users", _) if t == Target::Org => (route.to_owned(), none),
        ("GET", "/v1/admin/users/{id}", _) => {
            (format!("/v1/admin/users/{}", shared("user")?), none)
        }
        ("PUT", "/v1/admin/users/{id}", _) if t == Target::Org => (
            format!("/v1/admin/users/{}", w.user(None).await),
            Some(json!({"role": "member"})),
        ),
        ("DELETE", "/v1/admin/users/{id}", _) if t == Target::Org => {
            (format!("/v1/admin/users/{}", w.user(None).await), none)
        }
        ("POST", "/v1/admin/users/invites", _) if t == Target::Org => (
            route.to_owned(),
            Some(
                json!({"email": format!("{}@example.com", fresh("inv")), "role": "member", "workspaces": []}),
            ),
        ),
        ("GET", "/v1/admin/users/invites", _) if t == Target::Org => (route.to_owned(), none),
        ("GET", "/v1/admin/users/invites/{id}", _) => (
            format!("/v1/admin/users/invites/{}", shared("invite")?),
            none,
        ),
        ("DELETE", "/v1/admin/users/invites/{id}", _) if t == Target::Org => (
            format!("/v1/admin/users/invites/{}", w.invite().await.0),
            none,
        ),
        ("POST", "/v1/admin/users/invites/{id}/resend", _) if t == Target::Org => (
            format!("/v1/admin/users/invites/{}/resend", w.invite().await.0),
            Some(json!({})),
        ),
        ("POST", "/v1/admin/users/invites/{id}/accept", _) if t == Target::Org => {
            let (id, token) = w.invite().await;
            (
                format!("/v1/admin/users/invites/{id}/accept"),
                Some(json!({"token": token})),
            )
        }
        ("POST", "/v1/deployments", _) if t == Target::Org => {
            (route.to_owned(), Some(json!({"name": fresh("d")})))
        }
        ("GET", "/v1/deployments", _) if t == Target::Org => (route.to_owned(), none),
        ("GET", "/v1/deployments/{id}", _) => {
            (format!("/v1/deployments/{}", shared("deployment")?), none)
        }
        ("PUT", "/v1/deployments/{id}", _) => (
            format!("/v1/deployments/{}", shared("deployment")?),
            Some(json!({"deployment_config": {"region": "eu"}})),
        ),
        ("DELETE", "/v1/deployments/{id}", _) if t == Target::Org => {
            (format!("/v1/deployments/{}", w.deployment().await), none)
        }
        ("GET", "/v1/audit-logs", _) if t == Target::Org => (
            "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z"
                .to_owned(),
            none,
        ),
        ("GET", "/v1/logs", _) => (query(route), none),
        ("POST", "/v1/logs", _) if t == Target::Org => (
            route.to_owned(),
            Some(json!({"request": {}, "response": {"status": 200}})),
        ),
        ("GET", "/v1/logs/{id}", _) => (format!("/v1/logs/{}", shared("log")?), none),
        ("POST", "/v1/logs/exports", _) => (route.to_owned(), Some(export_body(ws))),
        ("GET", "/v1/logs/exports", _) => (query(route), none),
        ("GET", "/v1/logs/exports/{id}", _) => {
            (format!("/v1/logs/exports/{}", shared("export")?), none)
        }
        ("PUT", "/v1/logs/exports/{id}", _) => (
            format!("/v1/logs/exports/{}", shared("export")?),
            Some(json!({"description": "d"})),
        ),
        ("POST", "/v1/logs/exports/{id}/start", _) => (
            format!("/v1/logs/exports/{}/start", w.export(ws).await),
            Some(json!({})),
        ),
        ("POST", "/v1/logs/exports/{id}/cancel", _) => (
            format!("/v1/logs/exports/{}/cancel", w.export(ws).await),
            Some(json!({})),
        ),
        ("GET", "/v1/logs/exports/{id}/download", _) => {
            let id = w.export(ws).await;
            w.ok("POST", &format!("/v1/logs/exports/{id}/start"), json!({}))
                .await;
            (format!("/v1/logs/exports/{id}/download"), none)
        }
        ("POST", "/v1/configs", _) => (
            route.to_owned(),
            Some(with_ws(json!({"name": "c", "config": {}}))),
        ),
        ("GET", "/v1/configs", _) => (query(route), none),
        ("GET", "/v1/configs/{slug}", _) => (format!("/v1/configs/{}", shared("config")?), none),
        ("PUT", "/v1/configs/{slug}", _) => (
            format!("/v1/configs/{}", shared("config")?),
            Some(json!({"name": "renamed"})),
        ),
        ("DELETE", "/v1/configs/{slug}", _) => {
            (format!("/v1/configs/{}", w.config(ws?).await), none)
        }
        ("GET", "/v1/configs/{slug}/versions", _) => {
            (format!("/v1/configs/{}/versions", shared("config")?), none)
        }
        ("POST", "/v1/guardrails", _) => (route.to_owned(), Some(with_ws(guardrail_body(None)))),
        ("GET", "/v1/guardrails", _) => (query(route), none),
        ("GET", "/v1/guardrails/{id}", _) => {
            (format!("/v1/guardrails/{}", shared("guardrail")?), none)
        }
        ("PUT", "/v1/guardrails/{id}", _) => (
            format!("/v1/guardrails/{}", shared("guardrail")?),
            Some(json!({"name": "renamed"})),
        ),
        ("DELETE", "/v1/guardrails/{id}", _) => {
            (format!("/v1/guardrails/{}", w.guardrail(ws?).await), none)
        }
        ("POST", "/v1/integrations", _) => (
            route.to_owned(),
            Some(with_ws(
                json!({"name": fresh("i"), "ai_provider_id": "openai", "key": "sk-new-0000000",
                                "create_default_provider": false}),
            )),
        ),
        ("GET", "/v1/integrations", _) => (query(route), none),
        ("GET", "/v1/integrations/{slug}", _) => {
            (format!("/v1/integrations/{}", shared("integration")?), none)
        }
        ("PUT", "/v1/integrations/{slug}", _) => (
            format!("/v1/integrations/{}", shared("integration")?),
            Some(json!({"description": "d"})),
        ),
        ("DELETE", "/v1/integrations/{slug}", _) => (
            format!("/v1/integrations/{}", w.integration(ws).await),
            none,
        ),
        ("GET", "/v1/integrations/{slug}/workspaces", _) => (
            format!("/v1/integrations/{}/workspaces", shared("integration")?),
            none,
        ),
        ("PUT", "/v1/integrations/{slug}/workspaces", _) => (
            format!("/v1/integrations/{}/workspaces", shared("integration")?),
            Some(json!({"workspaces": []})),
        ),
        ("GET", "/v1/integrations/{slug}/models", _) => (
            format!("/v1/integrations/{}/models", shared("integration")?),
            none,
        ),
        ("PUT", "/v1/integrations/{slug}/models", _) => (
            format!("/v1/integrations/{}/models", shared("integration")?),
            Some(json!({"models": [{"slug": "m1", "enabled": true}]})),
        ),
        // At the organisation level: no workspace named, with an integration of workspace A
        // (the callers' own, and the admin key's default workspace).
        ("POST", "/v1/providers", _) => {
            let integration = w.shared(
                "integration",
                if t == Target::Org { Target::Own } else { t },
            );
            (
                route.to_owned(),
                Some(with_ws(
                    json!({"name": "p", "integration_id": integration?}),
                )),
            )
        }
        ("POST", "/v1/providers/bulk", _) => {
            let integration = w.shared(
                "integration",
                if t == Target::Org { Target::Own } else { t },
            );
            (
                route.to_owned(),
                Some(json!({"providers": [with_ws(
                    json!({"name": "p", "integration_id": integration?}),
                )]})),
            )
        }
        ("GET", "/v1/providers", _) => (query(route), none),
        ("GET", "/v1/providers/{slug}", _) => {
            (format!("/v1/providers/{}", shared("provider")?), none)
        }
        ("PUT", "/v1/providers/{slug}", _) => (
            format!("/v1/providers/{}", shared("provider")?),
            Some(json!({"note": "n"})),
        ),
        ("DELETE", "/v1/providers/{slug}", _) => {
            (format!("/v1/providers/{}", w.provider(ws?).await), none)
        }
        ("POST", "/v1/virtual-keys", _) => (
            route.to_owned(),
            Some(with_ws(
                json!({"name": "v", "provider": "openai", "key": "sk-new-0000000"}),
            )),
        ),
        ("GET", "/v1/virtual-keys", _) => (query(route), none),
        ("GET", "/v1/virtual-keys/{slug}", _) => {
            (format!("/v1/virtual-keys/{}", shared("virtual key")?), none)
        }
        ("PUT", "/v1/virtual-keys/{slug}", _) => (
            format!("/v1/virtual-keys/{}", shared("virtual key")?),
            Some(json!({"note": "n"})),
        ),
        ("DELETE", "/v1/virtual-keys/{slug}", _) => (
            format!("/v1/virtual-keys/{}", w.virtual_key(ws?).await),
            none,
        ),
        (_, p, _) if p.starts_with("/v1/policies/") => {
            let kind = if p.starts_with("/v1/policies/rate-limits") {
                "rate-limits"
            } else {
                "usage-limits"
            };
            let base = format!("/v1/policies/{kind}");
            match (method, p.strip_prefix(&base).unwrap_or_default()) {
                ("POST", "") => (base, Some(policy_body(kind, ws))),
                ("GET", "") => (query(&base), none),
                ("GET", "/{id}") => (format!("{base}/{}", shared(kind)?), none),
                ("PUT", "/{id}") => (
                    format!("{base}/{}", shared(kind)?),
                    Some(json!({"name": "renamed"})),
                ),
                ("DELETE", "/{id}") => (format!("{base}/{}", w.policy(kind, ws?).await), none),
                ("GET", "/{id}/entities") => (format!("{base}/{}/entities", shared(kind)?), none),
                ("PUT", "/{id}/entities/{entity}/reset") => (
                    format!(
                        "{base}/{}/entities/metadata._user:alice/reset",
                        shared(kind)?
                    ),
                    none,
                ),
                other => panic!("no request for {other:?}"),
            }
        }
        _ => return None,
    })
}

/// Sends a request; returns the status and the body as text (some answers are not JSON).
async fn send(
    app: &App,
    method: &str,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> (u16, String) {
    let body = body.map_or_else(Vec::new, |b| b.to_string().into_bytes());
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .header("x-gw-api-key", key)
        .body(axum::body::Body::from(body))
        .expect("a request");
    let resp = app.router.clone().oneshot(req).await.expect("infallible");
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("a body");
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// The class of a status, as [`TABLE`] writes it.
fn class(status: u16) -> char {
    match status {
        200..=299 => '+',
        400 => '0',
        401 => '1',
        403 => '3',
        404 => '4',
        409 => '9',
        _ => '?',
    }
}

async fn matrix(db: TestDb) {
    let w = world(db).await;
    let app = &w.app;

    // The table and the route table name the same routes.
    let routes: BTreeSet<(String, String)> = admin::api::routes()
        .iter()
        .map(|r| (r.method.to_string(), r.path.to_owned()))
        .collect();
    let rows: BTreeSet<(String, String)> = TABLE
        .iter()
        .map(|(m, p, _, _)| (m.to_string(), p.to_string()))
        .collect();
    let missing: Vec<_> = routes.difference(&rows).collect();
    let unknown: Vec<_> = rows.difference(&routes).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "routes without a row in TABLE: {missing:?}; rows of no route: {unknown:?}"
    );

    let mut mismatches = Vec::new();
    let mut cells = 0;
    for &(method, route, variant, expected) in TABLE {
        let groups: Vec<&str> = expected.split_whitespace().collect();
        assert_eq!(groups.len(), 3, "{method} {route} {variant}: three groups");
        let public = PUBLIC.contains(&(method, route));
        let mut observed = Vec::new();
        let mut differs = false;
        for (t, want) in TARGETS.into_iter().zip(&groups) {
            let mut got = String::new();
            // A request is made again only after one succeeded: a refusal changes nothing.
            let mut last: Option<(String, Option<Value>)> = None;
            for caller in &w.callers {
                let (path, body) = match last.take() {
                    Some(unchanged) => unchanged,
                    None => match request(&w, method, route, variant, t).await {
                        Some(r) => r,
                        None => {
                            got = "-".to_owned();
                            break;
                        }
                    },
                };
                let (status, answer) = send(app, method, &path, caller, body.clone()).await;
                let c = class(status);
                if c == '?' {
                    panic!("{method} {path}: {status} {answer}");
                }
                if c != '+' {
                    last = Some((path, body));
                }
                got.push(c);
                cells += 1;
            }
            // Keys that no longer work: 401 wherever a key is asked for.
            if got != "-" {
                for (name, key) in &w.dead {
                    let (path, body) = match &last {
                        Some((path, body)) if !public => (path.clone(), body.clone()),
                        _ => request(&w, method, route, variant, t).await.unwrap(),
                    };
                    let (status, answer) = send(app, method, &path, key, body).await;
                    let want_dead = if public {
                        got.chars().last().unwrap()
                    } else {
                        '1'
                    };
                    if class(status) != want_dead {
                        mismatches.push(format!(
                            "{method} {path} with the {name}: {status} {answer}"
                        ));
                    }
                    cells += 1;
                }
            }
            differs |= got != *want;
            observed.push(got);
        }
        assert!(
            observed.iter().any(|g| g != "-"),
            "{method} {route} {variant}: no target is tried"
        );
        if differs {
            mismatches.push(format!(
                "    ({method:?}, {route:?}, {variant:?}, \"{}\"),",
                observed.join(" ")
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} rows differ from TABLE ({cells} cells tried; callers: {CALLERS:?}); as observed:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

crate::on_both_databases!(matrix);

/// A guardrail of one check, in `ws` when given.
fn guardrail_body(ws: Option<&str>) -> Value {
    let mut body = json!({"name": "g", "checks": [{"id": "default.contains",
        "parameters": {"operator": "none", "words": ["x"]}}]});
    if let Some(ws) = ws {
        body["workspace_id"] = json!(ws);
    }
    body
}
