//! Refused control-plane calls in the audit log.
//!
//! **When it runs.** Around every routed control-plane call (not the 404 and 405 fallbacks):
//! when the answer is 401 (no key, or an unknown, expired or rotated-away one) or 403 (a known
//! key without the right), the call is recorded with action `refused`, the resource type of
//! its route, the status, the client's address, method and URI, the key's id when the key
//! exists, and why (`request_body: {reason}`, the message the caller received). The presented
//! key is never recorded (it is only hashed to find the key). See
//! [`Store::record_refused`](crate::store::Store::record_refused).
//!
//! **Bounded.** Refusals cost the caller nothing, so their records must not be a lever to
//! flood the database: each router (one per gateway instance) records at most
//! [`RouterOptions::refused_records_per_second`] refusals one by one in each wall-clock second
//! (default [`DEFAULT_REFUSED_RECORDS_PER_SECOND`]). Beyond that a refusal is only counted;
//! once the second is over, the counts are written as at most one summary record per status
//! (`request_body: {summary: true, refused, first_at, last_at, records_per_second}`), so the
//! log still says how many were refused. At most `N + 2` records a second, whatever the load;
//! a refusal past the bound costs a lock and a counter, no query. The records of a second go
//! to its first `N` refusals, whoever makes them; counts not summarised yet when the process
//! stops are lost.
//!
//! Individual records are written before the answer is sent (the refused caller waits for
//! it); a failure to write is logged, never turned into another answer.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::{AppState, ClientAddr, API_KEY_HEADERS};
use crate::error::AdminError;
use crate::store::audit::is_secret_name;
use crate::store::{RefusalSummary, RefusedAttempt, Store};
use crate::time::{self, Timestamp};

/// How many refused calls a router records one by one per second by default.
pub const DEFAULT_REFUSED_RECORDS_PER_SECOND: u32 = 20;

/// How the router is built.
#[derive(Debug, Clone)]
pub struct RouterOptions {
    /// Refused calls (401, 403) recorded one by one in each second; the rest are counted and
    /// summarised. 0 records none one by one (only summaries). Default
    /// [`DEFAULT_REFUSED_RECORDS_PER_SECOND`].
    pub refused_records_per_second: u32,
    /// The verifier of JWTs, when the data plane has `jwt:` settings: tokens then read and
    /// list their workspace's resources. Default: empty (API keys only).
    pub tokens: plugin_sdk::access::TokenSlot,
}

impl Default for RouterOptions {
    fn default() -> Self {
        RouterOptions {
            refused_records_per_second: DEFAULT_REFUSED_RECORDS_PER_SECOND,
            tokens: plugin_sdk::access::TokenSlot::default(),
        }
    }
}

/// Refusals counted but not recorded, of one status.
#[derive(Debug, Clone, Copy)]
struct Counted {
    count: u64,
    first_at: Timestamp,
    last_at: Timestamp,
}

/// The bound's state.
#[derive(Debug, Default)]
struct Window {
    /// The wall-clock second (since the epoch) `written` counts in.
    second: u64,
    written: u32,
    /// Counted refusals not summarised yet: 401s, then 403s.
    counted: [Option<Counted>; 2],
    /// A task will write `counted` once the current second is over.
    flush_scheduled: bool,
}

/// What to do with one refusal.
#[derive(Debug, PartialEq, Eq)]
enum Admit {
    /// Record it.
    Record,
    /// Only count it; `true` when the caller must schedule the summary.
    Count(bool),
}

/// The per-router bound on refused-call records.
#[derive(Debug)]
pub struct RefusalAudit {
    per_second: u32,
    window: Mutex<Window>,
}

impl RefusalAudit {
    pub fn new(per_second: u32) -> RefusalAudit {
        RefusalAudit {
            per_second,
            window: Mutex::new(Window::default()),
        }
    }

    fn admit(&self, second: u64, status: u16, at: Timestamp) -> Admit {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if w.second != second {
            w.second = second;
            w.written = 0;
        }
        if w.written < self.per_second {
            w.written += 1;
            return Admit::Record;
        }
        let slot = &mut w.counted[usize::from(status != 401)];
        match slot {
            Some(c) => {
                c.count += 1;
                c.last_at = at;
            }
            None => {
                *slot = Some(Counted {
                    count: 1,
                    first_at: at,
                    last_at: at,
                })
            }
        }
        let schedule = !w.flush_scheduled;
        w.flush_scheduled = true;
        Admit::Count(schedule)
    }

    /// The counted refusals as summaries, emptied.
    fn take(&self) -> Vec<RefusalSummary> {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        w.flush_scheduled = false;
        let per_second = self.per_second;
        [401, 403]
            .into_iter()
            .zip(std::mem::take(&mut w.counted))
            .filter_map(|(status, c)| {
                c.map(|c| RefusalSummary {
                    status,
                    count: c.count,
                    first_at: c.first_at,
                    last_at: c.last_at,
                    per_second,
                })
            })
            .collect()
    }

    /// Waits until the current second is over, then writes the summaries.
    async fn flush_later(self: Arc<Self>, store: Store) {
        let into_second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_millis());
        let rest = 1000 - u64::from(into_second);
        tokio::time::sleep(Duration::from_millis(rest + 10)).await;
        for s in self.take() {
            if let Err(e) = store.record_refusal_summary(&s).await {
                tracing::warn!(error = %e, status = s.status, refused = s.count,
                    "could not record the summary of refused control-plane calls");
            }
        }
    }
}

/// The middleware: records the call when its answer is 401 or 403 (see the module doc).
pub(super) async fn audit(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let method = req.method().to_string();
    let uri = redacted_uri(req.uri());
    let resource_type = resource_type_of(req.uri().path());
    let client_ip = req
        .extensions()
        .get::<ClientAddr>()
        .and_then(|c| c.0)
        .map(|ip| ip.to_string());
    // Kept as sent (a cheap clone); hashed only if the call is refused and recorded.
    let presented = API_KEY_HEADERS
        .iter()
        .find_map(|h| req.headers().get(*h))
        .cloned();
    let request_id = super::request_id(req.headers());
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    if status != 401 && status != 403 {
        return resp;
    }
    let now = time::now();
    let second = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    match app.refusals.admit(second, status, now) {
        Admit::Record => {
            let reason = resp
                .extensions()
                .get::<AdminError>()
                .map_or_else(String::new, |e| e.message.clone());
            let key_hash = presented
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|k| !k.is_empty() && k.len() <= 512)
                .map(crate::keys::hash);
            let attempt = RefusedAttempt {
                method,
                uri,
                request_id,
                client_ip,
                status,
                resource_type,
                reason,
                key_hash,
            };
            if let Err(e) = app.store.record_refused(&attempt).await {
                tracing::warn!(error = %e, status, "could not record a refused control-plane call");
            }
        }
        Admit::Count(schedule) => {
            if schedule {
                tokio::spawn(app.refusals.clone().flush_later(app.store.clone()));
            }
        }
    }
    resp
}

/// The resource type of a routed path (or of its pattern), as the audit log names it for
/// writes. Segments are read by position, so an id never changes the type.
pub(super) fn resource_type_of(pattern: &str) -> &'static str {
    let rest = pattern.strip_prefix("/v1/").unwrap_or(pattern);
    let segments: Vec<&str> = rest.split('/').collect();
    match segments.as_slice() {
        ["admin", "workspaces", _, "users", ..] => "workspace_user",
        ["admin", "workspaces", _, "settings"] => "workspace_settings",
        ["admin", "workspaces", ..] => "workspace",
        ["admin", "settings"] => "organisation_settings",
        ["admin", "users", "invites", ..] => "invite",
        ["admin", "users", ..] => "user",
        ["api-keys", ..] => "api_key",
        ["audit-logs", ..] => "audit_log",
        ["logs", "exports", ..] => "log_export",
        ["logs", ..] => "log",
        ["configs", ..] => "config",
        ["guardrails", ..] => "guardrail",
        ["integrations", ..] => "integration",
        ["providers", ..] | ["virtual-keys", ..] => "provider",
        ["policies", "rate-limits", ..] => "rate_limits_policy",
        ["policies", "usage-limits", ..] => "usage_limits_policy",
        ["deployments", ..] => "deployment",
        _ => "control_plane",
    }
}

/// Path and query, with the values of secret-like query parameters (`api_key=...`) replaced:
/// a key sent in the wrong place is not kept either.
fn redacted_uri(uri: &http::Uri) -> String {
    let Some(query) = uri.query() else {
        return uri.path().to_owned();
    };
    let parts: Vec<String> = query
        .split('&')
        .map(|part| match part.split_once('=') {
            Some((name, _)) if is_secret_name(name) => format!("{name}=[REDACTED]"),
            _ => part.to_owned(),
        })
        .collect();
    format!("{}?{}", uri.path(), parts.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        chrono::DateTime::from_timestamp(secs, 0).unwrap()
    }

    #[test]
    fn at_most_n_a_second_are_recorded_and_the_rest_counted_per_status() {
        let bound = RefusalAudit::new(2);
        assert_eq!(bound.admit(10, 401, at(10)), Admit::Record);
        assert_eq!(bound.admit(10, 403, at(10)), Admit::Record);
        // Past the bound: counted, and the first of them schedules the summary.
        assert_eq!(bound.admit(10, 401, at(10)), Admit::Count(true));
        assert_eq!(bound.admit(10, 403, at(10)), Admit::Count(false));
        assert_eq!(bound.admit(10, 401, at(10)), Admit::Count(false));
        // A new second records again; counting goes on into the same summaries.
        assert_eq!(bound.admit(11, 401, at(11)), Admit::Record);
        assert_eq!(bound.admit(11, 401, at(11)), Admit::Record);
        assert_eq!(bound.admit(11, 401, at(11)), Admit::Count(false));
        let summaries = bound.take();
        assert_eq!(
            summaries,
            vec![
                RefusalSummary {
                    status: 401,
                    count: 3,
                    first_at: at(10),
                    last_at: at(11),
                    per_second: 2
                },
                RefusalSummary {
                    status: 403,
                    count: 1,
                    first_at: at(10),
                    last_at: at(10),
                    per_second: 2
                },
            ]
        );
        // Taken: nothing left, and the next excess schedules a new summary.
        assert!(bound.take().is_empty());
        assert_eq!(bound.admit(11, 403, at(11)), Admit::Count(true));
        // A bound of 0 records nothing one by one.
        let none = RefusalAudit::new(0);
        assert_eq!(none.admit(1, 401, at(1)), Admit::Count(true));
    }

    #[test]
    fn every_route_has_a_resource_type() {
        for r in super::super::routes() {
            let t = resource_type_of(r.path);
            if r.path == "/v1/openapi.json" {
                assert_eq!(t, "control_plane");
            } else {
                assert_ne!(t, "control_plane", "{} {}", r.method, r.path);
            }
        }
        assert_eq!(resource_type_of("/v1/admin/workspaces/{id}"), "workspace");
        // Concrete paths, whatever their ids are called.
        assert_eq!(
            resource_type_of("/v1/admin/workspaces/settings"),
            "workspace"
        );
        assert_eq!(
            resource_type_of("/v1/admin/workspaces/users/settings"),
            "workspace_settings"
        );
        assert_eq!(
            resource_type_of("/v1/api-keys/workspace/service"),
            "api_key"
        );
        assert_eq!(
            resource_type_of("/v1/admin/workspaces/{id}/users/{user_id}"),
            "workspace_user"
        );
        assert_eq!(resource_type_of("/v1/admin/users/invites/{id}"), "invite");
        assert_eq!(
            resource_type_of("/v1/logs/exports/{id}/start"),
            "log_export"
        );
        assert_eq!(
            resource_type_of("/v1/integrations/{slug}/models"),
            "integration"
        );
    }

    #[test]
    fn secret_query_values_are_not_kept() {
        let uri: http::Uri = "/v1/api-keys?page_size=5&api_key=sk-live-1&x-gw-api-key=k2"
            .parse()
            .unwrap();
        assert_eq!(
            redacted_uri(&uri),
            "/v1/api-keys?page_size=5&api_key=[REDACTED]&x-gw-api-key=[REDACTED]"
        );
        let uri: http::Uri = "/v1/configs".parse().unwrap();
        assert_eq!(redacted_uri(&uri), "/v1/configs");
    }
}
