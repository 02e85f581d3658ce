//! The control plane's OpenAPI document (OpenAPI 3.1), generated from the code: each handler's
//! `#[utoipa::path]` annotation, and `ToSchema` / `IntoParams` on the request bodies and
//! queries the handlers parse. Served at `GET /v1/openapi.json` without a key (it is
//! documentation), built once on the first request.
//!
//! Conventions kept in one place ([`Conventions`]): the API key security scheme (header
//! `x-gw-api-key`), and the error answers every authenticated operation can give (401, 403,
//! 500, and 413 for a body over [`super::MAX_BODY_BYTES`]); each annotation lists its own 200
//! and the other errors it can return (400, 404, 409). Errors all have the body
//! [`ErrorBody`].
//!
//! Every route of [`super::routes`] is described; the control-plane tests compare the two, and
//! probe the router with the document (each documented body and query names exactly the
//! fields its handler accepts).

use std::borrow::Cow;
use std::sync::OnceLock;

use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue};
use serde::Deserialize;
use serde_json::Value;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

use super::{
    api_keys, audit_logs, configs, deployments, guardrails, integrations, invites, logs, members,
    policies, providers, settings, users, workspaces,
};
use crate::error::AdminError;

/// The name of the API key security scheme (as in `security(("api_key" = []))` below).
pub const SECURITY_SCHEME: &str = "api_key";

/// The control plane's document. [`ApiDoc::openapi`] builds it (with [`Conventions`] applied);
/// [`document`] is its JSON, built once.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "AI gateway control plane",
        description = "Organisations, workspaces, users, API keys, policies, configs, \
            guardrails, integrations, providers, logs and the audit log of the gateway. Every path but this \
            document and the acceptance of an invite takes an API key in the `x-gw-api-key` \
            header. Errors answer `{\"success\": false, \"data\": {\"message\", \"errorCode\"}}`."
    ),
    paths(
        serve,
        api_keys::list,
        api_keys::get,
        api_keys::update,
        api_keys::delete,
        api_keys::create_or_rotate,
        api_keys::create_many,
        api_keys::rotated_key,
        workspaces::create,
        workspaces::list,
        workspaces::get,
        workspaces::update,
        workspaces::delete,
        members::add,
        members::list,
        members::get,
        members::update,
        members::delete,
        settings::get_organisation,
        settings::update_organisation,
        settings::get_workspace,
        settings::update_workspace,
        users::list,
        users::get,
        users::update,
        users::delete,
        invites::create,
        invites::list,
        invites::get,
        invites::delete,
        invites::resend,
        invites::accept,
        deployments::create,
        deployments::list,
        deployments::get,
        deployments::update,
        deployments::delete,
        audit_logs::list,
        logs::list,
        logs::insert,
        logs::get,
        logs::create_export,
        logs::list_exports,
        logs::get_export,
        logs::update_export,
        logs::start_export,
        logs::cancel_export,
        logs::download_export,
        configs::create,
        configs::list,
        configs::get,
        configs::update,
        configs::delete,
        configs::versions,
        guardrails::create,
        guardrails::list,
        guardrails::get,
        guardrails::update,
        guardrails::delete,
        integrations::create,
        integrations::list,
        integrations::get,
        integrations::update,
        integrations::delete,
        integrations::workspaces,
        integrations::update_workspaces,
        integrations::models,
        integrations::update_models,
        providers::create,
        providers::create_many,
        providers::list,
        providers::get,
        providers::update,
        providers::delete,
        providers::create_virtual_key,
        providers::list_virtual_keys,
        providers::get_virtual_key,
        providers::update_virtual_key,
        providers::delete_virtual_key,
        policies::create_rate_limits,
        policies::list_rate_limits,
        policies::get_rate_limits,
        policies::update_rate_limits,
        policies::delete_rate_limits,
        policies::rate_limits_entities,
        policies::create_usage_limits,
        policies::list_usage_limits,
        policies::get_usage_limits,
        policies::update_usage_limits,
        policies::delete_usage_limits,
        policies::usage_limits_entities,
        policies::reset_usage_limits_entity,
    ),
    components(schemas(ErrorBody)),
    modifiers(&Conventions),
    security(("api_key" = [])),
    tags(
        (name = tag::OPENAPI, description = "This document."),
        (name = tag::API_KEYS, description = "Organisation (admin) keys and workspace service and user keys."),
        (name = tag::WORKSPACES, description = "Workspaces of the organisation."),
        (name = tag::MEMBERS, description = "The users of a workspace and their roles."),
        (name = tag::SETTINGS, description = "Organisation settings and a workspace's overrides."),
        (name = tag::USERS, description = "The users of the organisation."),
        (name = tag::INVITES, description = "Invitations of new users."),
        (name = tag::DEPLOYMENTS, description = "Deployments of the gateway."),
        (name = tag::AUDIT_LOGS, description = "What was changed, by whom."),
        (name = tag::LOGS, description = "Request logs, and logs sent by other systems."),
        (name = tag::LOG_EXPORTS, description = "Exports of request logs as JSON lines."),
        (name = tag::CONFIGS, description = "Routing configs, versioned."),
        (name = tag::GUARDRAILS, description = "Guardrails: checks and actions that configs, workspace defaults and the gateway's YAML name by slug."),
        (name = tag::INTEGRATIONS, description = "Provider credentials, the workspaces they are shared with, and their models and prices."),
        (name = tag::PROVIDERS, description = "Providers: an integration made usable in a workspace, with limits."),
        (name = tag::VIRTUAL_KEYS, description = "Providers in their legacy shape (virtual keys)."),
        (name = tag::RATE_LIMITS, description = "Rate limits policies."),
        (name = tag::USAGE_LIMITS, description = "Usage limits policies (budgets)."),
    )
)]
pub struct ApiDoc;

/// The tags of the document, one per resource.
pub mod tag {
    pub const OPENAPI: &str = "OpenAPI";
    pub const API_KEYS: &str = "API keys";
    pub const WORKSPACES: &str = "Workspaces";
    pub const MEMBERS: &str = "Workspace members";
    pub const SETTINGS: &str = "Settings";
    pub const USERS: &str = "Users";
    pub const INVITES: &str = "User invites";
    pub const DEPLOYMENTS: &str = "Deployments";
    pub const AUDIT_LOGS: &str = "Audit logs";
    pub const LOGS: &str = "Logs";
    pub const LOG_EXPORTS: &str = "Log exports";
    pub const CONFIGS: &str = "Configs";
    pub const GUARDRAILS: &str = "Guardrails";
    pub const INTEGRATIONS: &str = "Integrations";
    pub const PROVIDERS: &str = "Providers";
    pub const VIRTUAL_KEYS: &str = "Virtual keys";
    pub const RATE_LIMITS: &str = "Rate limits policies";
    pub const USAGE_LIMITS: &str = "Usage limits policies";
}

/// The document as JSON: built on the first call (the first `GET /v1/openapi.json`), then kept
/// for the life of the process.
pub fn document() -> Result<&'static str, AdminError> {
    static DOCUMENT: OnceLock<Result<String, String>> = OnceLock::new();
    DOCUMENT
        .get_or_init(|| ApiDoc::openapi().to_json().map_err(|e| e.to_string()))
        .as_deref()
        .map_err(|e| {
            tracing::error!(error = %e, "the OpenAPI document does not serialise");
            AdminError::internal("internal error: the OpenAPI document could not be built")
        })
}

/// `GET /v1/openapi.json`: this document; no key needed.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "getOpenApiDocument",
    tag = tag::OPENAPI,
    summary = "Get this document",
    description = "The control plane's OpenAPI document. No key needed.",
    security(()),
    responses(
        (status = 200, description = "The OpenAPI 3.1 document of the control plane.", body = Object, content_type = "application/json"),
        (status = 500, description = "The document could not be built.", body = ErrorBody),
    )
)]
pub async fn serve() -> Response {
    match document() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            text,
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

/// The security scheme, the shared error answers, and public operations without security;
/// applied by [`ApiDoc::openapi`].
pub struct Conventions;

/// The shared error answers: (status, component name, description).
const COMMON_ERRORS: [(&str, &str, &str); 4] = [
    (
        "401",
        "Unauthorized",
        "No API key, or an unknown, revoked or expired one (AB05). Recorded in the audit log (action `refused`).",
    ),
    (
        "403",
        "Forbidden",
        "The key lacks the scope or the role this needs (AB03). Recorded in the audit log (action `refused`).",
    ),
    (
        "413",
        "PayloadTooLarge",
        "The request body is larger than the control plane reads (AB01).",
    ),
    (
        "500",
        "InternalError",
        "A fault of the gateway or its database (AB04).",
    ),
];

/// The version of the interface the document describes: the spec's, not the gateway's own
/// release (that one is `info.x-gateway-version`).
pub const INTERFACE_VERSION: &str = "2.0.0";

impl Modify for Conventions {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        openapi.info.version = INTERFACE_VERSION.to_owned();
        openapi
            .info
            .extensions
            .get_or_insert_with(Default::default)
            .insert(
                "x-gateway-version".to_owned(),
                serde_json::Value::from(env!("CARGO_PKG_VERSION")),
            );
        let components = openapi.components.get_or_insert_with(Default::default);
        components.security_schemes.insert(
            SECURITY_SCHEME.to_owned(),
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "x-gw-api-key",
                "The API key (`x-portkey-api-key` is read too).",
            ))),
        );
        for (status, name, description) in COMMON_ERRORS {
            let description = match status {
                "413" => format!("{description} Its limit: {} bytes.", super::MAX_BODY_BYTES),
                _ => description.to_owned(),
            };
            components.responses.insert(
                name.to_owned(),
                RefOr::T(error_response(&description).build()),
            );
        }
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
                &mut item.head,
                &mut item.options,
                &mut item.trace,
            ];
            for op in operations.into_iter().flatten() {
                add_common_errors(op);
            }
        }
    }
}

/// `security(())` in an annotation marks a public operation: it gets an empty list (no key)
/// and none of the key's errors. The others get the shared error answers they lack.
fn add_common_errors(op: &mut Operation) {
    if op.security.as_deref() == Some(&[SecurityRequirement::default()]) {
        op.security = Some(Vec::new());
        return;
    }
    for (status, name, _) in COMMON_ERRORS {
        if status == "413" && op.request_body.is_none() {
            continue;
        }
        op.responses
            .responses
            .entry(status.to_owned())
            .or_insert_with(|| RefOr::Ref(Ref::from_response_name(name)));
    }
}

fn error_response(description: &str) -> ResponseBuilder {
    ResponseBuilder::new().description(description).content(
        "application/json",
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name(ErrorBody::name())))
            .build(),
    )
}

/// The body of every error answer.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"success": false, "data": {"message": "name: must not be empty", "errorCode": "AB01"}}))]
pub struct ErrorBody {
    /// Always `false`.
    pub success: bool,
    pub data: ErrorData,
}

/// What went wrong.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorData {
    /// For the client; a problem with a field starts with its path (`rate_limits[0].value: ...`).
    pub message: String,
    /// AB01 invalid request (400, 405, 413), AB02 a named resource does not exist (404), AB03
    /// forbidden (403), AB04 internal (500), AB05 unauthorised (401), AB07 conflict (409),
    /// AB08 not found (404).
    #[serde(rename = "errorCode")]
    #[schema(pattern = "^AB0[1-9]$", example = "AB01")]
    pub error_code: String,
}

// ----- answers, for documentation -----

/// `{object: "list", total, data}`: a page of a listing.
#[derive(Debug, ToSchema)]
#[schema(as = List)]
pub struct ListEnvelope {
    /// `list`.
    pub object: String,
    /// How many there are in all (not only on this page).
    pub total: i64,
    /// The items of this page.
    pub data: Vec<Object>,
}

/// `{}`: the answer to an update or a delete.
#[derive(Debug, ToSchema)]
#[schema(as = Empty)]
pub struct EmptyObject {}

/// Any JSON object (the resource as stored; see the tag's description).
pub type Object = serde_json::Map<String, Value>;

/// `{id, object}`: something was made.
#[derive(Debug, ToSchema)]
pub struct Created {
    pub id: String,
    /// What was made (`policy_rate_limits`, `policy_usage_limits`).
    pub object: String,
}

/// `{id, slug, object}`: something named by a slug was made.
#[derive(Debug, ToSchema)]
pub struct CreatedWithSlug {
    pub id: String,
    pub slug: String,
    /// What was made (`provider`, `virtual-key`).
    pub object: String,
}

// ----- shared request types of `crate::validate` and `crate::store`, described here -----

/// A `$real` type is described by `$doc`, a mirror of its serde shape kept for the document
/// (the unit tests below check that both accept the same fields and values).
macro_rules! described_by {
    ($real:ty => $doc:ty) => {
        impl PartialSchema for $real {
            fn schema() -> RefOr<Schema> {
                <$doc as PartialSchema>::schema()
            }
        }
        impl ToSchema for $real {
            fn name() -> Cow<'static, str> {
                <$doc as ToSchema>::name()
            }
            fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
                <$doc as ToSchema>::schemas(schemas)
            }
        }
    };
}

described_by!(crate::validate::RateLimit => RateLimitDoc);
described_by!(crate::validate::RateLimitType => RateLimitTypeDoc);
described_by!(crate::validate::RateUnit => RateUnitDoc);
described_by!(crate::validate::UsageLimitsInput => UsageLimitsDoc);
described_by!(crate::validate::UsageType => UsageTypeDoc);
described_by!(crate::validate::PeriodicReset => PeriodicResetDoc);
described_by!(crate::store::logs::LogFilter => LogFilterDoc);

/// A rate limit: at most `value` requests or tokens per minute, hour or day.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RateLimit)]
pub struct RateLimitDoc {
    #[serde(rename = "type")]
    pub kind: RateLimitTypeDoc,
    pub unit: RateUnitDoc,
    /// At least 1; one limit per type and unit.
    #[schema(minimum = 1)]
    pub value: i64,
}

/// What a rate limit counts.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = RateLimitType)]
pub enum RateLimitTypeDoc {
    Requests,
    Tokens,
}

/// Per minute, hour or day.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = RateUnit)]
pub enum RateUnitDoc {
    Rpm,
    Rph,
    Rpd,
}

/// A usage limit (budget): `credit_limit` dollars (`cost`) or tokens, optionally reset weekly,
/// monthly or every `periodic_reset_days`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = UsageLimits)]
pub struct UsageLimitsDoc {
    /// At least 1.
    #[schema(minimum = 1)]
    pub credit_limit: i64,
    /// Default `cost`.
    #[serde(rename = "type", default)]
    pub kind: Option<UsageTypeDoc>,
    /// At least 1 and below `credit_limit`: an alert is sent past it.
    #[serde(default)]
    pub alert_threshold: Option<i64>,
    #[serde(default)]
    pub periodic_reset: Option<PeriodicResetDoc>,
    /// 1 to 365; not with `periodic_reset`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 365)]
    pub periodic_reset_days: Option<i64>,
    /// RFC 3339.
    #[serde(default)]
    #[schema(format = DateTime)]
    pub next_usage_reset_at: Option<String>,
    /// Read-only: accepted when sent back as read, and ignored.
    #[serde(default)]
    pub current_usage: Option<f64>,
}

/// What a usage limit counts.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = UsageType)]
pub enum UsageTypeDoc {
    Cost,
    Tokens,
}

/// When a usage limit resets.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = PeriodicReset)]
pub enum PeriodicResetDoc {
    Weekly,
    Monthly,
}

/// Which logs a listing or an export selects; absent fields do not filter.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = LogFilter)]
pub struct LogFilterDoc {
    /// A workspace id or slug.
    #[serde(default)]
    pub workspace_id: Option<String>,
    #[serde(default)]
    pub trace_id: Option<String>,
    #[serde(default)]
    pub api_key_id: Option<String>,
    /// An HTTP status, 100 to 599.
    #[serde(default)]
    #[schema(minimum = 100, maximum = 599)]
    pub status_code: Option<i64>,
    #[serde(default)]
    pub provider: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    /// RFC 3339: logs made at or after it.
    #[serde(default)]
    #[schema(format = DateTime)]
    pub time_of_generation_min: Option<String>,
    /// RFC 3339: logs made at or before it.
    #[serde(default)]
    #[schema(format = DateTime)]
    pub time_of_generation_max: Option<String>,
}

/// A string that is one of `values`.
pub(super) fn one_of(values: &[&str]) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values.iter().copied()))
}

/// A list of strings, each one of `values`.
pub(super) fn list_of(values: &[&str]) -> ArrayBuilder {
    ArrayBuilder::new().items(one_of(values))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;
    use serde_json::json;

    /// The names serde lists in its refusal of an unknown field or variant (`expected `a``,
    /// `expected `a` or `b``, `expected one of `a`, `b`, `c``).
    fn expected_names(message: &str) -> Vec<String> {
        let (_, list) = message
            .split_once("expected ")
            .unwrap_or_else(|| panic!("no expected names in {message:?}"));
        let mut names: Vec<String> = list
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        names.sort();
        names
    }

    fn accepted_fields<T: DeserializeOwned>() -> Vec<String> {
        let err = serde_json::from_value::<T>(json!({"zz_probe": 0}))
            .err()
            .expect("an unknown field is refused");
        expected_names(&err.to_string())
    }

    fn accepted_variants<T: DeserializeOwned>() -> Vec<String> {
        let err = serde_json::from_value::<T>(json!("zz_probe"))
            .err()
            .expect("an unknown variant is refused");
        expected_names(&err.to_string())
    }

    fn components() -> serde_json::Map<String, Value> {
        let doc: Value = serde_json::from_str(document().unwrap()).unwrap();
        doc["components"]["schemas"].as_object().unwrap().clone()
    }

    fn properties(schemas: &serde_json::Map<String, Value>, name: &str) -> Vec<String> {
        let mut names: Vec<String> = schemas[name]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{name} has properties"))
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    fn enum_values(schemas: &serde_json::Map<String, Value>, name: &str) -> Vec<String> {
        let mut names: Vec<String> = schemas[name]["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("{name} is an enum"))
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn mirrors_accept_what_the_real_types_accept() {
        use crate::store::logs::LogFilter;
        use crate::validate::{
            PeriodicReset, RateLimit, RateLimitType, RateUnit, UsageLimitsInput, UsageType,
        };
        let schemas = components();
        let structs = [
            (
                "RateLimit",
                accepted_fields::<RateLimit>(),
                accepted_fields::<RateLimitDoc>(),
            ),
            (
                "UsageLimits",
                accepted_fields::<UsageLimitsInput>(),
                accepted_fields::<UsageLimitsDoc>(),
            ),
            (
                "LogFilter",
                accepted_fields::<LogFilter>(),
                accepted_fields::<LogFilterDoc>(),
            ),
        ];
        for (name, real, doc) in structs {
            assert_eq!(real, doc, "{name}: the mirror's fields");
            assert_eq!(
                real,
                properties(&schemas, name),
                "{name}: the schema's properties"
            );
        }
        let enums = [
            (
                "RateLimitType",
                accepted_variants::<RateLimitType>(),
                accepted_variants::<RateLimitTypeDoc>(),
            ),
            (
                "RateUnit",
                accepted_variants::<RateUnit>(),
                accepted_variants::<RateUnitDoc>(),
            ),
            (
                "UsageType",
                accepted_variants::<UsageType>(),
                accepted_variants::<UsageTypeDoc>(),
            ),
            (
                "PeriodicReset",
                accepted_variants::<PeriodicReset>(),
                accepted_variants::<PeriodicResetDoc>(),
            ),
        ];
        for (name, real, doc) in enums {
            assert_eq!(real, doc, "{name}: the mirror's variants");
            assert_eq!(
                real,
                enum_values(&schemas, name),
                "{name}: the schema's values"
            );
        }
        // The same sample reads as both (types, not only names, agree).
        let usage = json!({"credit_limit": 10, "type": "tokens", "alert_threshold": 5,
            "periodic_reset": "weekly", "next_usage_reset_at": "2030-01-01T00:00:00Z", "current_usage": 1.5});
        serde_json::from_value::<UsageLimitsInput>(usage.clone()).unwrap();
        serde_json::from_value::<UsageLimitsDoc>(usage).unwrap();
        let rate = json!({"type": "requests", "unit": "rpm", "value": 5});
        serde_json::from_value::<RateLimit>(rate.clone()).unwrap();
        serde_json::from_value::<RateLimitDoc>(rate).unwrap();
        // Required: what has no default.
        assert_eq!(
            schemas["RateLimit"]["required"],
            json!(["type", "unit", "value"])
        );
        assert_eq!(schemas["UsageLimits"]["required"], json!(["credit_limit"]));
    }

    #[test]
    fn the_error_schema_is_the_error_body() {
        for e in [
            AdminError::field("name", "must not be empty"),
            AdminError::unauthorized("missing API key"),
            AdminError::conflict("taken"),
        ] {
            let body: ErrorBody = serde_json::from_value(e.body()).expect("an ErrorBody");
            assert!(!body.success);
            assert_eq!(body.data.error_code, e.code());
            assert_eq!(body.data.message, e.message);
        }
        let schemas = components();
        assert_eq!(properties(&schemas, "ErrorBody"), ["data", "success"]);
        assert_eq!(properties(&schemas, "ErrorData"), ["errorCode", "message"]);
    }

    #[test]
    fn the_document_is_built_once() {
        let a = document().unwrap();
        let b = document().unwrap();
        assert!(std::ptr::eq(a, b));
    }
}
