//! Invites: made by an admin, accepted with the link's token by the person invited, which
//! makes the user, their workspace memberships and (when the invite says so) their workspace
//! keys in one transaction. The token is stored only as its SHA-256.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::audit::{self, AuditEntry, RequestMeta};
use super::changes::Change;
use super::users::OrgUser;
use super::{api_keys, bad_column, from_text, insert_user, to_text, Actor, NewKey, Store};
use crate::authz::{Access, KeyKind, OrgRole, Principal};
use crate::db::{Sql, Tx};
use crate::error::{is_unique_violation, AdminError, ErrorKind, Result};
use crate::keys;
use crate::time::{self, Timestamp};
use crate::validate::Page;

/// How long an invite link works (from its creation or its last resend).
pub const INVITE_VALIDITY_DAYS: i64 = 7;

/// A workspace the invited user joins, with their role there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InviteWorkspace {
    pub id: String,
    pub role: String,
}

/// An invite to make (its fields checked by the handler).
#[derive(Debug, Clone)]
pub struct NewInvite {
    /// In lowercase.
    pub email: String,
    pub role: OrgRole,
    pub workspaces: Vec<InviteWorkspace>,
    /// Scopes of the workspace keys made on acceptance; `None`: no keys.
    pub scopes: Option<BTreeSet<String>>,
}

/// A stored invite; `status` is as it reads now (a pending invite past its time is expired).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invite {
    pub id: String,
    pub organisation_id: String,
    pub email: String,
    pub role: String,
    pub workspaces: Vec<InviteWorkspace>,
    pub scopes: Option<Vec<String>>,
    pub status: String,
    pub invited_by: Option<String>,
    pub created_at: String,
    pub last_updated_at: String,
    pub expires_at: String,
    pub accepted_at: Option<String>,
}

impl Invite {
    pub fn to_json(&self) -> Value {
        json!({
            "object": "invite",
            "id": self.id,
            "email": self.email,
            "role": self.role,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
            "expires_at": self.expires_at,
            "accepted_at": self.accepted_at,
            "status": self.status,
            "invited_by": self.invited_by,
            "workspaces": self.workspaces,
            "workspace_api_key_details": self.scopes.as_ref().map(|s| json!({"scopes": s})),
        })
    }
}

/// Filters of `GET /admin/users/invites`.
#[derive(Debug, Clone, Default)]
pub struct InviteFilter {
    pub role: Option<OrgRole>,
    /// Part of the address, any case.
    pub email: Option<String>,
    /// `pending`, `cancelled`, `accepted` or `expired`.
    pub status: Option<String>,
}

/// What accepting an invite made: the user, and each workspace key with its raw value (shown
/// this once).
#[derive(Debug, Clone)]
pub struct Accepted {
    pub user: OrgUser,
    /// (key id, raw key, workspace id).
    pub keys: Vec<(String, String, String)>,
}

const COLUMNS: &str = "id, organisation_id, email, role, workspaces, scopes, status, invited_by,
    created_at, last_updated_at, expires_at, accepted_at";

fn from_row(r: &AnyRow, now: &str) -> Result<Invite> {
    let status: String = r.try_get("status")?;
    let expires_at: String = r.try_get("expires_at")?;
    let scopes: Option<String> = r.try_get("scopes")?;
    let status = if status == "pending" && expires_at.as_str() <= now {
        "expired".to_owned()
    } else {
        status
    };
    Ok(Invite {
        id: r.try_get("id")?,
        organisation_id: r.try_get("organisation_id")?,
        email: r.try_get("email")?,
        role: r.try_get("role")?,
        workspaces: from_text("invites.workspaces", &r.try_get::<String, _>("workspaces")?)?,
        scopes: scopes
            .map(|s| from_text("invites.scopes", &s))
            .transpose()?,
        status,
        invited_by: r.try_get("invited_by")?,
        created_at: r.try_get("created_at")?,
        last_updated_at: r.try_get("last_updated_at")?,
        expires_at,
        accepted_at: r.try_get("accepted_at")?,
    })
}

/// The "improved error" of an invite for someone already in the organisation.
async fn refuse_existing_user(tx: &mut Tx, organisation_id: &str, email: &str) -> Result<()> {
    let existing: Option<String> = sqlx::query_scalar(
        "SELECT id FROM users WHERE organisation_id = $1 AND LOWER(email) = LOWER($2)",
    )
    .bind(organisation_id)
    .bind(email)
    .fetch_optional(&mut **tx)
    .await?;
    match existing {
        Some(id) => Err(already_member(email, &id)),
        None => Ok(()),
    }
}

fn already_member(email: &str, user_id: &str) -> AdminError {
    AdminError::conflict(format!(
        "{email} is already a member of the organisation (user {user_id}): change their role with \
         PUT /v1/admin/users/{user_id}, or add them to a workspace with \
         POST /v1/admin/workspaces/{{id}}/users"
    ))
}

fn expiry_from(now: Timestamp) -> String {
    time::format(now + chrono::Duration::days(INVITE_VALIDITY_DAYS))
}

impl Store {
    /// Makes an invite; returns its id and the token of its link (never available again).
    /// 409 when the address already belongs to the organisation or has a pending invite.
    pub async fn create_invite(
        &self,
        actor: Actor<'_>,
        new: &NewInvite,
    ) -> Result<(String, String)> {
        let org = &actor.principal.organisation_id;
        let id = uuid::Uuid::new_v4().to_string();
        let token = keys::generate();
        let now_t = time::now();
        let now = time::format(now_t);
        let mut tx = self.db.begin_write().await?;
        refuse_existing_user(&mut tx, org, &new.email).await?;
        // A pending invite past its time no longer holds the address.
        sqlx::query(
            "UPDATE invites SET status = 'expired', last_updated_at = $1
             WHERE organisation_id = $2 AND email = $3 AND status = 'pending' AND expires_at <= $1",
        )
        .bind(&now)
        .bind(org)
        .bind(&new.email)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO invites (id, organisation_id, email, role, workspaces, scopes, token_hash,
                 status, invited_by, created_at, last_updated_at, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8, $9, $9, $10)",
        )
        .bind(&id)
        .bind(org)
        .bind(&new.email)
        .bind(new.role.as_str())
        .bind(to_text(&new.workspaces))
        .bind(new.scopes.as_ref().map(to_text))
        .bind(keys::hash(&token))
        .bind(actor.principal.user_id.clone())
        .bind(&now)
        .bind(expiry_from(now_t))
        .execute(&mut *tx)
        .await
        .map_err(|e| {
            if is_unique_violation(&e) {
                AdminError::conflict(format!(
                    "{} already has a pending invite: resend it (POST \
                     /v1/admin/users/invites/{{id}}/resend) or delete it first",
                    new.email
                ))
            } else {
                e.into()
            }
        })?;
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("create", "invite").resource(&id),
        )
        .await?;
        tx.commit().await?;
        Ok((id, token))
    }

    /// Invites of the organisation, newest first, and how many match in all.
    pub async fn invites(
        &self,
        organisation_id: &str,
        filter: &InviteFilter,
        page: Page,
    ) -> Result<(i64, Vec<Invite>)> {
        let now = time::format(time::now());
        let mut cond = Sql::new(" FROM invites WHERE organisation_id = ");
        cond.text(organisation_id);
        if let Some(role) = filter.role {
            cond.push(" AND role = ").text(role.as_str());
        }
        if let Some(email) = &filter.email {
            cond.push(" AND LOWER(email) LIKE ")
                .text(super::contains_pattern(email))
                .push(" ESCAPE '\\'");
        }
        match filter.status.as_deref() {
            None => {}
            Some("pending") => {
                cond.push(" AND status = 'pending' AND expires_at > ")
                    .text(now.clone());
            }
            Some("expired") => {
                cond.push(" AND (status = 'expired' OR (status = 'pending' AND expires_at <= ")
                    .text(now.clone())
                    .push("))");
            }
            Some(other) => {
                cond.push(" AND status = ").text(other);
            }
        }
        cond.select_page(&self.db, COLUMNS, "created_at DESC, id DESC", page, |r| {
            from_row(r, &now)
        })
        .await
    }

    /// One invite of the organisation.
    pub async fn invite(&self, organisation_id: &str, id: &str) -> Result<Option<Invite>> {
        let now = time::format(time::now());
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM invites WHERE id = $1 AND organisation_id = $2"
        )))
        .bind(id)
        .bind(organisation_id)
        .fetch_optional(self.db.pool())
        .await?;
        row.as_ref().map(|r| from_row(r, &now)).transpose()
    }

    /// Cancels a pending (or expired) invite: its link stops working. 409 for an invite that
    /// was accepted or cancelled.
    pub async fn cancel_invite(&self, actor: Actor<'_>, invite: &Invite) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        let done = sqlx::query(
            "UPDATE invites SET status = 'cancelled', last_updated_at = $1
             WHERE id = $2 AND organisation_id = $3 AND status IN ('pending', 'expired')",
        )
        .bind(time::format(time::now()))
        .bind(&invite.id)
        .bind(&invite.organisation_id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(self.settled(invite).await?);
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("delete", "invite").resource(&invite.id),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Gives a pending or expired invite a new token and a new week; returns the token (the
    /// previous link stops working).
    pub async fn resend_invite(&self, actor: Actor<'_>, invite: &Invite) -> Result<String> {
        let token = keys::generate();
        let now_t = time::now();
        let now = time::format(now_t);
        let mut tx = self.db.begin_write().await?;
        refuse_existing_user(&mut tx, &invite.organisation_id, &invite.email).await?;
        let done = sqlx::query(
            "UPDATE invites SET token_hash = $1, status = 'pending', expires_at = $2,
                 last_updated_at = $3
             WHERE id = $4 AND organisation_id = $5 AND status IN ('pending', 'expired')",
        )
        .bind(keys::hash(&token))
        .bind(expiry_from(now_t))
        .bind(&now)
        .bind(&invite.id)
        .bind(&invite.organisation_id)
        .execute(&mut *tx)
        .await
        .map_err(|e| {
            if is_unique_violation(&e) {
                AdminError::conflict(format!(
                    "{} has a newer pending invite; resend that one",
                    invite.email
                ))
            } else {
                e.into()
            }
        })?;
        if done.rows_affected() == 0 {
            return Err(self.settled(invite).await?);
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("resend", "invite").resource(&invite.id),
        )
        .await?;
        tx.commit().await?;
        Ok(token)
    }

    /// The 409 (or 404) for an invite that is no longer pending.
    async fn settled(&self, invite: &Invite) -> Result<AdminError> {
        let now = self.invite(&invite.organisation_id, &invite.id).await?;
        Ok(match now.map(|i| i.status) {
            None => AdminError::not_found(format!("no invite {}", invite.id)),
            Some(status) => AdminError::conflict(format!("the invite is already {status}")),
        })
    }

    /// Accepts an invite with its link's token: makes the user (with `first_name` and
    /// `last_name`), their memberships of the invite's workspaces that still exist and, when
    /// the invite has `workspace_api_key_details`, a workspace user key in each. 404 for no
    /// invite, 401 for a token that does not match, 409 for an invite that is not pending or
    /// an address that already belongs to the organisation.
    pub async fn accept_invite(
        &self,
        id: &str,
        token: &str,
        first_name: Option<String>,
        last_name: Option<String>,
        request: &RequestMeta,
    ) -> Result<Accepted> {
        let now_t = time::now();
        let now = time::format(now_t);
        let mut tx = self.db.begin_write().await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS}, token_hash FROM invites WHERE id = $1"
        )))
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| AdminError::not_found(format!("no invite {id}")))?;
        let invite = from_row(&row, &now)?;
        let hash: String = row.try_get("token_hash")?;
        if hash != keys::hash(token) {
            return Err(AdminError::unauthorized(
                "the invite token does not match (a resent invite has a new link)",
            ));
        }
        match invite.status.as_str() {
            "pending" => {}
            "expired" => {
                return Err(AdminError::conflict(
                    "the invite has expired: ask an admin to resend it",
                ))
            }
            other => {
                return Err(AdminError::conflict(format!(
                    "the invite is already {other}"
                )))
            }
        }
        let org = invite.organisation_id.clone();
        refuse_existing_user(&mut tx, &org, &invite.email).await?;
        let claimed = sqlx::query(
            "UPDATE invites SET status = 'accepted', accepted_at = $1, last_updated_at = $1
             WHERE id = $2 AND status = 'pending' AND expires_at > $1",
        )
        .bind(&now)
        .bind(&invite.id)
        .execute(&mut *tx)
        .await?;
        if claimed.rows_affected() == 0 {
            return Err(AdminError::conflict(
                "the invite was accepted or withdrawn meanwhile",
            ));
        }
        let role =
            OrgRole::parse(&invite.role).ok_or_else(|| bad_column("invites.role", &invite.role))?;
        let user = insert_user(&mut tx, &org, &invite.email, role)
            .await
            .map_err(|e| match e.kind {
                ErrorKind::Conflict => AdminError::conflict(format!(
                    "{} is already a member of the organisation",
                    invite.email
                )),
                _ => e,
            })?;
        sqlx::query("UPDATE users SET first_name = $1, last_name = $2 WHERE id = $3")
            .bind(first_name)
            .bind(last_name)
            .bind(&user.id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE invites SET user_id = $1 WHERE id = $2")
            .bind(&user.id)
            .bind(&invite.id)
            .execute(&mut *tx)
            .await?;

        // From here on the new user acts: the audit log records them.
        let principal = Principal {
            organisation_id: org.clone(),
            key_id: None,
            key_kind: None,
            user_id: Some(user.id.clone()),
            access: Access::Organisation { role },
            scopes: Some(BTreeSet::new()),
            user_org_role: None,
        };
        let actor = Actor {
            principal: &principal,
            request,
        };
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("accept", "invite").resource(&invite.id),
        )
        .await?;
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("create", "user").resource(&user.id),
        )
        .await?;
        let scopes = invite.scopes.clone().unwrap_or_default();
        let mut joined = Vec::new();
        for w in &invite.workspaces {
            // A workspace deleted since the invite is skipped.
            let exists: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM workspaces WHERE id = $1 AND organisation_id = $2",
            )
            .bind(&w.id)
            .bind(&org)
            .fetch_one(&mut *tx)
            .await?;
            if exists == 0 {
                continue;
            }
            sqlx::query(
                "INSERT INTO workspace_members (workspace_id, user_id, role, scopes, created_at,
                     last_updated_at)
                 VALUES ($1, $2, $3, $4, $5, $5)",
            )
            .bind(&w.id)
            .bind(&user.id)
            .bind(&w.role)
            .bind(to_text(&scopes))
            .bind(&now)
            .execute(&mut *tx)
            .await?;
            audit::insert(
                &mut tx,
                actor,
                &AuditEntry::new("create", "workspace_user")
                    .resource(&user.id)
                    .workspace(Some(&w.id)),
            )
            .await?;
            joined.push(w.id.clone());
        }
        let mut made = Vec::new();
        if let Some(scopes) = &invite.scopes {
            let text: String =
                sqlx::query_scalar("SELECT settings FROM organisations WHERE id = $1")
                    .bind(&org)
                    .fetch_one(&mut *tx)
                    .await?;
            let settings: super::OrganisationSettings = from_text("organisations.settings", &text)?;
            let expires_at = settings
                .api_key_default_expiry_days
                .map(|d| now_t + chrono::Duration::days(d));
            for ws in &joined {
                let key = NewKey {
                    kind: KeyKind::WorkspaceUser,
                    name: "Made on accepting an invite".into(),
                    description: None,
                    workspace_id: Some(ws.clone()),
                    user_id: Some(user.id.clone()),
                    created_by_user_id: Some(user.id.clone()),
                    scopes: scopes.iter().cloned().collect(),
                    rate_limits: Vec::new(),
                    usage_limits: None,
                    defaults: json!({}),
                    alert_emails: Vec::new(),
                    rotation_policy: None,
                    expires_at,
                };
                let raw = keys::generate();
                let key_id = api_keys::insert(&mut tx, &org, &key, &raw).await?;
                audit::insert(
                    &mut tx,
                    actor,
                    &AuditEntry::new("create", "api_key")
                        .resource(&key_id)
                        .workspace(Some(ws)),
                )
                .await?;
                made.push((key_id, raw, ws.clone()));
            }
        }
        // The new user's keys join the data plane.
        if !made.is_empty() {
            let changes: Vec<Change> = made
                .iter()
                .map(|(id, _, _)| Change::ApiKey(id.clone()))
                .collect();
            self.data_plane_changed(&mut tx, &changes).await?;
        }
        tx.commit().await?;
        if !made.is_empty() {
            self.after_data_plane_change().await;
        }
        let user = self
            .org_user(&org, &user.id)
            .await?
            .ok_or_else(|| AdminError::not_found("the new user was removed meanwhile"))?;
        Ok(Accepted { user, keys: made })
    }
}
