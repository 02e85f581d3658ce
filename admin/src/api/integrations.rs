//! `/v1/integrations`: create (with its default provider), list (filters, tags), get, update,
//! delete, the workspaces an organisation integration is shared with (bulk update), and its
//! models (enabled, custom prices that the data plane prices requests through it with).
//!
//! An integration with a `workspace_id` belongs to that workspace; one without is the
//! organisation's, shared with the workspaces its `/workspaces` endpoint enables (or all of
//! them). Its secret (`key`, and the AWS secret settings) is stored encrypted and shown only
//! masked.

use std::collections::{BTreeMap, BTreeSet};

use axum::extract::State;
use axum::http::Uri;
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use utoipa::openapi::schema::ObjectBuilder;
use utoipa::{IntoParams, ToSchema};

use super::configs::{list_workspace, resolve_workspace};
use super::openapi::{one_of, tag, EmptyObject, ErrorBody, ListEnvelope, Object};
use super::{double_option, empty, list_envelope, AppState, Ctx, PathParams};
use crate::authz::{self, Action, Op, Principal, Resource};
use crate::error::{AdminError, Result};
use crate::keys;
use crate::store::{
    Integration, IntegrationChanges, IntegrationFilter, IntegrationModel, IntegrationWorkspace,
    ModelPricing, NewIntegration, NewProvider, Origin, Store, WorkspaceAccess,
    WorkspaceAccessChange, WorkspaceAccessChanges, AI_PROVIDER_IDS,
};
use crate::validate::{self, Page, RateLimit, UsageLimits, UsageLimitsInput};

/// The longest provider secret accepted.
const MAX_SECRET: usize = 8192;
/// The longest `custom_host`.
const MAX_URL: usize = 2048;
/// The most tags a resource carries.
const MAX_TAGS: usize = 50;
/// The longest tag name.
const MAX_TAG_KEY: usize = 100;
/// The most models one `PUT /integrations/{slug}/models` sets.
const MAX_MODELS_PER_UPDATE: usize = 1000;

/// `configurations` of an integration. On update a field set to `null` is removed and a field
/// left out is kept.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = IntegrationConfigurations)]
pub(super) struct Configurations {
    /// An http(s) URL the provider is reached at instead of its own (any provider).
    #[serde(default, deserialize_with = "double_option")]
    #[schema(format = "uri")]
    custom_host: Option<Option<String>>,
    /// `azure-openai` only.
    #[serde(default, deserialize_with = "double_option")]
    azure_resource_name: Option<Option<String>>,
    /// `azure-openai` only.
    #[serde(default, deserialize_with = "double_option")]
    azure_deployment_id: Option<Option<String>>,
    /// `azure-openai` only.
    #[serde(default, deserialize_with = "double_option")]
    azure_api_version: Option<Option<String>>,
    /// `vertex-ai` only.
    #[serde(default, deserialize_with = "double_option")]
    vertex_project_id: Option<Option<String>>,
    /// `vertex-ai` only.
    #[serde(default, deserialize_with = "double_option")]
    vertex_region: Option<Option<String>>,
    /// `vertex-ai` only.
    #[serde(
        default,
        rename = "skipPtuCostAttribution",
        deserialize_with = "double_option"
    )]
    skip_ptu_cost_attribution: Option<Option<bool>>,
    /// `bedrock` only.
    #[serde(default, deserialize_with = "double_option")]
    aws_access_key_id: Option<Option<String>>,
    /// `bedrock` only; stored encrypted, shown masked.
    #[serde(default, deserialize_with = "double_option")]
    aws_secret_access_key: Option<Option<String>>,
    /// `bedrock` only; stored encrypted, shown masked.
    #[serde(default, deserialize_with = "double_option")]
    aws_session_token: Option<Option<String>>,
    /// `bedrock` only.
    #[serde(default, deserialize_with = "double_option")]
    aws_region: Option<Option<String>>,
}

/// An `ai_provider_id`: one of the providers the gateway knows.
pub(super) fn ai_provider_schema() -> ObjectBuilder {
    one_of(AI_PROVIDER_IDS).description(Some("A provider the gateway knows."))
}

/// How a setting's value is checked.
#[derive(Clone, Copy)]
enum Check {
    /// An http(s) URL.
    Url,
    /// Goes into a host name: letters, digits and `-`.
    HostPart,
    /// Goes into a path: letters, digits, `-`, `_` and `.`, without `..`.
    PathPart,
    /// A secret: any printable text.
    Secret,
}

/// The string settings of `configurations`, in the order of [`Configurations::check`]'s values:
/// the name, the provider they apply to (`None`: any), and how they are checked (secrets are
/// stored encrypted).
const SETTINGS: [(&str, Option<&str>, Check); 10] = [
    ("custom_host", None, Check::Url),
    ("azure_resource_name", Some("azure-openai"), Check::HostPart),
    ("azure_deployment_id", Some("azure-openai"), Check::PathPart),
    ("azure_api_version", Some("azure-openai"), Check::PathPart),
    ("vertex_project_id", Some("vertex-ai"), Check::PathPart),
    ("vertex_region", Some("vertex-ai"), Check::HostPart),
    ("aws_access_key_id", Some("bedrock"), Check::PathPart),
    ("aws_secret_access_key", Some("bedrock"), Check::Secret),
    ("aws_session_token", Some("bedrock"), Check::Secret),
    ("aws_region", Some("bedrock"), Check::HostPart),
];

/// The checked settings: those stored in clear, and the secret ones (to be encrypted); `None`
/// values remove a setting on update.
#[derive(Debug, Default)]
pub(super) struct CheckedSettings {
    plain: BTreeMap<String, Option<Value>>,
    secret: BTreeMap<String, Option<String>>,
}

impl Configurations {
    /// Checks every given setting against `provider` (Azure settings for `azure-openai`,
    /// Vertex ones for `vertex-ai`, AWS ones for `bedrock`; `custom_host` for any).
    pub(super) fn check(self, provider: &str) -> Result<CheckedSettings> {
        let values = [
            self.custom_host,
            self.azure_resource_name,
            self.azure_deployment_id,
            self.azure_api_version,
            self.vertex_project_id,
            self.vertex_region,
            self.aws_access_key_id,
            self.aws_secret_access_key,
            self.aws_session_token,
            self.aws_region,
        ];
        let mut out = CheckedSettings::default();
        for ((name, only_for, check), value) in SETTINGS.into_iter().zip(values) {
            let secret = matches!(check, Check::Secret);
            let Some(value) = value else { continue };
            let field = format!("configurations.{name}");
            if let (Some(only), Some(_)) = (only_for, &value) {
                if only != provider {
                    return Err(AdminError::field(
                        &field,
                        format!("applies to {only} integrations only, not {provider}"),
                    ));
                }
            }
            if let Some(v) = &value {
                check_setting(&field, v, check)?;
            }
            if secret {
                out.secret.insert(name.to_owned(), value);
            } else {
                out.plain.insert(name.to_owned(), value.map(Value::String));
            }
        }
        if let Some(v) = self.skip_ptu_cost_attribution {
            if v.is_some() && provider != "vertex-ai" {
                return Err(AdminError::field(
                    "configurations.skipPtuCostAttribution",
                    format!("applies to vertex-ai integrations only, not {provider}"),
                ));
            }
            out.plain
                .insert("skipPtuCostAttribution".to_owned(), v.map(Value::Bool));
        }
        Ok(out)
    }
}

fn check_setting(field: &str, value: &str, check: Check) -> Result<()> {
    let max = match check {
        Check::Url => MAX_URL,
        Check::Secret => MAX_SECRET,
        Check::HostPart | Check::PathPart => validate::MAX_NAME,
    };
    validate::max_len(field, value, max)?;
    if value.is_empty() {
        return Err(AdminError::field(field, "must not be empty"));
    }
    let ok = match check {
        Check::Url => return check_url(field, value),
        Check::HostPart => value.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
        Check::PathPart => {
            !value.contains("..")
                && value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        }
        Check::Secret => value.chars().all(|c| c.is_ascii_graphic()),
    };
    if !ok {
        let what = match check {
            Check::HostPart => "letters, digits and -",
            Check::PathPart => "letters, digits, -, _ and . (not ..)",
            _ => "printable characters without spaces",
        };
        return Err(AdminError::field(field, format!("may hold only {what}")));
    }
    Ok(())
}

/// An http or https URL with a host.
fn check_url(field: &str, value: &str) -> Result<()> {
    let bad = || {
        AdminError::field(
            field,
            format!("must be an http(s) URL like https://host/v1, got {value:?}"),
        )
    };
    let uri: Uri = value.parse().map_err(|_| bad())?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http" | "https"), Some(a)) if !a.host().is_empty() && uri.query().is_none() => {
            Ok(())
        }
        _ => Err(bad()),
    }
}

/// A provider secret: 1 to 8192 printable characters.
pub(super) fn secret(field: &str, value: &str) -> Result<String> {
    check_setting(field, value, Check::Secret)?;
    Ok(value.to_owned())
}

/// An `ai_provider_id` the gateway knows.
pub(super) fn ai_provider(field: &str, id: &str) -> Result<String> {
    if AI_PROVIDER_IDS.contains(&id) {
        Ok(id.to_owned())
    } else {
        Err(AdminError::field(
            field,
            format!(
                "unknown provider {id:?}; known providers: {}",
                AI_PROVIDER_IDS.join(", ")
            ),
        ))
    }
}

/// A slug given by the client: 1 to 255 of `a-z A-Z 0-9 _ -`, and not a UUID (paths take
/// either).
pub(super) fn check_slug(field: &str, s: &str) -> Result<String> {
    validate::max_len(field, s, validate::MAX_NAME)?;
    if s.is_empty()
        || !s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(AdminError::field(
            field,
            format!("must match ^[a-zA-Z0-9_-]+$ (at most 255 characters), got {s:?}"),
        ));
    }
    if validate::is_uuid(s) {
        return Err(AdminError::field(field, "must not be a UUID"));
    }
    Ok(s.to_owned())
}

/// The lowercase letters and digits of a name, dashes between words, at most 40 characters
/// (`OpenAI prod` -> `openai-prod`); `fallback` when nothing is left.
pub(super) fn slug_base(name: &str, fallback: &str) -> String {
    let mut base = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            base.push(c.to_ascii_lowercase());
        } else if !base.is_empty() && !base.ends_with('-') {
            base.push('-');
        }
        if base.len() >= 40 {
            break;
        }
    }
    let base = base.trim_end_matches('-');
    if base.is_empty() {
        fallback.to_owned()
    } else {
        base.to_owned()
    }
}

/// Custom key-value tags: at most 50; names 1 to 100 of `a-z A-Z 0-9 _ - . :`; values at most
/// 255 characters.
pub(super) fn tags(
    field: &str,
    tags: BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>> {
    if tags.len() > MAX_TAGS {
        return Err(AdminError::field(
            field,
            format!("at most {MAX_TAGS} tags, got {}", tags.len()),
        ));
    }
    for (k, v) in &tags {
        tag_key(&format!("{field}.{k}"), k)?;
        validate::max_len(&format!("{field}.{k}"), v, validate::MAX_NAME)?;
    }
    Ok(tags)
}

fn tag_key(field: &str, k: &str) -> Result<()> {
    let ok = !k.is_empty()
        && k.len() <= MAX_TAG_KEY
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
    if ok {
        Ok(())
    } else {
        Err(AdminError::field(
            field,
            format!("a tag name is 1 to {MAX_TAG_KEY} of a-z, A-Z, 0-9, _, -, . and :, got {k:?}"),
        ))
    }
}

/// A list query with tag filters: the named parameters as `T` (unknown ones refused), and
/// every `tags[name]=value` pair (all must match).
pub(super) fn query_with_tags<T: DeserializeOwned>(
    uri: &Uri,
) -> Result<(T, Vec<(String, String)>)> {
    let raw = uri.query().unwrap_or("");
    let (mut tag_parts, mut rest) = (Vec::new(), Vec::new());
    for part in raw.split('&').filter(|p| !p.is_empty()) {
        let key = part
            .split('=')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        if key.starts_with("tags[") || key.starts_with("tags%5b") {
            tag_parts.push(part);
        } else {
            rest.push(part);
        }
    }
    let as_uri = |parts: &[&str]| -> Result<Uri> {
        format!("/?{}", parts.join("&"))
            .parse()
            .map_err(|_| AdminError::validation("invalid query"))
    };
    let query: T = validate::query(&as_uri(&rest)?)?;
    let pairs: Vec<(String, String)> = validate::query(&as_uri(&tag_parts)?)?;
    let mut tags = Vec::with_capacity(pairs.len());
    for (k, v) in pairs {
        let name = k
            .strip_prefix("tags[")
            .and_then(|n| n.strip_suffix(']'))
            .ok_or_else(|| {
                AdminError::validation(format!(
                    "invalid query: tag filters are written tags[name]=value, got {k:?}"
                ))
            })?;
        tag_key(&format!("tags[{name}]"), name)?;
        tags.push((name.to_owned(), v));
    }
    Ok((query, tags))
}

/// A new integration: a provider's credentials, for one workspace (`workspace_id`, or the
/// calling workspace key's) or for the organisation (an admin key without `workspace_id`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateIntegration {
    /// 1 to 255 characters.
    name: String,
    #[schema(schema_with = ai_provider_schema)]
    ai_provider_id: String,
    /// 1 to 255 of `a-z A-Z 0-9 _ -`, not a UUID; default: made from the name.
    #[serde(default)]
    #[schema(pattern = "^[a-zA-Z0-9_-]+$")]
    slug: Option<String>,
    /// The provider's secret (1 to 8192 printable characters); stored encrypted, shown masked.
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    description: Option<String>,
    /// A workspace id or slug.
    #[serde(default)]
    workspace_id: Option<String>,
    #[serde(default)]
    configurations: Option<Configurations>,
    /// Whether a provider is made from it at once (default `true`).
    #[serde(default)]
    create_default_provider: Option<bool>,
    /// The slug of that provider (not with `create_default_provider: false`).
    #[serde(default)]
    #[schema(pattern = "^[a-zA-Z0-9_-]+$")]
    default_provider_slug: Option<String>,
    /// At most 50; names 1 to 100 of `a-z A-Z 0-9 _ - . :`, values at most 255 characters.
    #[serde(default)]
    tags: Option<BTreeMap<String, String>>,
}

/// The fields to change; absent fields are kept, `configurations` are merged by name, `tags`
/// replaced.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct UpdateIntegration {
    #[serde(default)]
    name: Option<String>,
    #[serde(default, deserialize_with = "double_option")]
    description: Option<Option<String>>,
    /// A new secret; `null` removes it.
    #[serde(default, deserialize_with = "double_option")]
    key: Option<Option<String>>,
    #[serde(default)]
    configurations: Option<Configurations>,
    #[serde(default)]
    tags: Option<BTreeMap<String, String>>,
}

/// The named parameters of the list; `tags[name]=value` filters are read beside them.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Items per page: 0 to 100, default 50.
    #[serde(default)]
    #[param(minimum = 0, maximum = 100)]
    page_size: Option<i64>,
    /// The page, from 0.
    #[serde(default)]
    #[param(minimum = 0)]
    current_page: Option<i64>,
    /// Only the integrations usable in this workspace (id or slug).
    #[serde(default)]
    workspace_id: Option<String>,
    /// Only those of this provider.
    #[serde(default)]
    ai_provider_id: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct PageQuery {
    /// Items per page: 0 to 100, default 50.
    #[serde(default)]
    #[param(minimum = 0, maximum = 100)]
    page_size: Option<i64>,
    /// The page, from 0.
    #[serde(default)]
    #[param(minimum = 0)]
    current_page: Option<i64>,
}

/// The access of every workspace.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = IntegrationGlobalAccess)]
struct GlobalAccessInput {
    enabled: bool,
    #[serde(default)]
    usage_limits: Option<Vec<UsageLimitsInput>>,
    #[serde(default)]
    rate_limits: Option<Vec<RateLimit>>,
}

/// The access of one workspace.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = IntegrationWorkspaceAccess)]
struct WorkspaceInput {
    /// A workspace id or slug.
    id: String,
    enabled: bool,
    #[serde(default)]
    usage_limits: Option<Vec<UsageLimitsInput>>,
    #[serde(default)]
    rate_limits: Option<Vec<RateLimit>>,
    /// Whether enabling makes a provider in the workspace (default `true`).
    #[serde(default)]
    create_default_provider: Option<bool>,
    #[serde(default)]
    #[schema(pattern = "^[a-zA-Z0-9_-]+$")]
    default_provider_slug: Option<String>,
}

/// Which workspaces an organisation integration is shared with.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = UpdateIntegrationWorkspaces)]
struct UpdateWorkspaces {
    #[serde(default)]
    workspaces: Vec<WorkspaceInput>,
    #[serde(default)]
    global_workspace_access: Option<GlobalAccessInput>,
    /// With `global_workspace_access`: whether it replaces the access set per workspace.
    #[serde(default)]
    override_existing_workspace_access: Option<bool>,
}

/// A model's custom price: US dollars per million tokens, each finite and 0 or more.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ModelPricingConfig)]
struct PricingConfig {
    /// Per million input (prompt) tokens.
    #[schema(minimum = 0)]
    input_per_million: f64,
    /// Per million output (completion) tokens.
    #[schema(minimum = 0)]
    output_per_million: f64,
}

/// One model of an integration, set as given.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = IntegrationModelInput)]
struct ModelInput {
    /// The model id (`gpt-4o`, `anthropic.claude-3-haiku-20240307-v1:0`): 1 to 255 printable
    /// characters without spaces. One model per id whatever its case.
    slug: String,
    /// Whether the model is offered. Recorded and shown; the gateway does not refuse
    /// requests for a disabled model (its price, if any, still applies).
    enabled: bool,
    /// Its custom price; absent or `null`: none (the price tables apply). Requests through the
    /// integration's providers are priced by it first.
    #[serde(default)]
    pricing_config: Option<PricingConfig>,
}

/// Models to add or change; models not listed are kept.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = UpdateIntegrationModels)]
struct UpdateModels {
    /// At most 1000, each id once.
    models: Vec<ModelInput>,
}

/// `{id, slug, default_provider_slug, object}`: the new integration.
#[derive(ToSchema)]
#[allow(dead_code)] // described in the OpenAPI document, never built
struct IntegrationCreated {
    id: String,
    slug: String,
    /// The provider made from it, if one was.
    default_provider_slug: Option<String>,
    /// `integration`.
    object: String,
}

/// `{object: "list", total, data, global_workspace_access}`.
#[derive(ToSchema)]
#[allow(dead_code)] // described in the OpenAPI document, never built
struct IntegrationWorkspaceList {
    /// `list`.
    object: String,
    total: i64,
    /// Each workspace with its access (`enabled`, limits).
    data: Vec<Object>,
    /// The access of all workspaces.
    global_workspace_access: Option<Object>,
}

/// `POST /integrations` -> `{id, slug, default_provider_slug}`.
#[utoipa::path(
    post,
    path = "/v1/integrations",
    operation_id = "createIntegration",
    tag = tag::INTEGRATIONS,
    summary = "Create an integration",
    description = "With its default provider unless `create_default_provider` is false.",
    request_body = CreateIntegration,
    responses(
        (status = 200, description = "The new integration.", body = IntegrationCreated),
        (status = 400, description = "An invalid body.", body = ErrorBody),
        (status = 404, description = "No workspace `workspace_id` (AB02).", body = ErrorBody),
        (status = 409, description = "The slug is taken.", body = ErrorBody),
    )
)]
pub async fn create(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let body: CreateIntegration = ctx.json()?;
    let p = &ctx.principal;
    let org = &p.organisation_id;
    let name = validate::name("name", &body.name)?;
    let provider = ai_provider("ai_provider_id", &body.ai_provider_id)?;
    let given_slug = body
        .slug
        .as_deref()
        .map(|s| check_slug("slug", s))
        .transpose()?;
    let key = body.key.as_deref().map(|k| secret("key", k)).transpose()?;
    let settings = body.configurations.unwrap_or_default().check(&provider)?;
    let tags = tags("tags", body.tags.unwrap_or_default())?;
    let default_slug = body
        .default_provider_slug
        .as_deref()
        .map(|s| check_slug("default_provider_slug", s))
        .transpose()?;
    let wanted = body.create_default_provider;
    if wanted == Some(false) && default_slug.is_some() {
        return Err(AdminError::field(
            "default_provider_slug",
            "cannot be set when create_default_provider is false",
        ));
    }
    // A workspace key makes integrations of its workspace; an admin key makes organisation
    // integrations unless it names a workspace.
    let workspace_id = match (&body.workspace_id, p.workspace_id()) {
        (Some(ws), _) => Some(resolve_workspace(&app.store, org, ws).await?),
        (None, Some(own)) => Some(own.to_owned()),
        (None, None) => None,
    };
    authz::integration_allowed(p, Op::Create, workspace_id.as_deref(), false)?;

    let slug = match given_slug {
        Some(s) => s,
        None => free_integration_slug(&app.store, org, &slug_base(&name, "integration")).await?,
    };
    // The default provider goes to the integration's workspace, or for an organisation
    // integration to the organisation's `default` workspace, which it is shared with.
    let provider_ws = match &workspace_id {
        Some(ws) => Some(ws.clone()),
        None => app.store.workspace(org, "default").await?.map(|w| w.id),
    };
    let default_provider = match (wanted.unwrap_or(true), provider_ws) {
        (false, _) => None,
        (true, Some(ws)) => {
            // The provider is made with the caller's rights too.
            authz::allowed(p, &Action::new(Resource::Providers, Op::Create), Some(&ws))?;
            let slug = match default_slug {
                Some(s) => s,
                None if !app.store.provider_slug_taken(&slug).await? => slug.clone(),
                None => format!("{slug}-{}", keys::random_hex(6)),
            };
            Some(NewProvider {
                workspace_id: ws,
                integration_id: String::new(),
                slug,
                name: name.clone(),
                note: None,
                usage_limits: None,
                rate_limits: Vec::new(),
                expires_at: None,
                tags: BTreeMap::new(),
            })
        }
        (true, None) if wanted == Some(true) => {
            return Err(AdminError::field(
                "create_default_provider",
                "the organisation has no default workspace: name a workspace_id, or enable workspaces with PUT /integrations/{slug}/workspaces",
            ))
        }
        (true, None) => None,
    };
    let new = NewIntegration {
        workspace_id,
        slug,
        name,
        ai_provider_id: provider,
        description: validate::description(body.description)?,
        key,
        settings: settings
            .plain
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect::<Map<String, Value>>(),
        secret_settings: settings
            .secret
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect(),
        tags,
        origin: Origin::Api,
        default_provider,
    };
    let (integration, made) = app.store.create_integration(ctx.actor(), &new).await?;
    Ok(Json(json!({
        "id": integration.id,
        "slug": integration.slug,
        "default_provider_slug": made.map(|(_, slug)| slug),
        "object": "integration",
    })))
}

/// A free integration slug from `base`: `base` itself, else with a random suffix.
async fn free_integration_slug(store: &Store, org: &str, base: &str) -> Result<String> {
    if store.integration(org, base).await?.is_none() && !store.provider_slug_taken(base).await? {
        return Ok(base.to_owned());
    }
    Ok(format!("{base}-{}", keys::random_hex(6)))
}

/// `GET /integrations`: filters `workspace_id` (integrations usable there), `ai_provider_id`,
/// and `tags[name]=value` (each pair must match).
#[utoipa::path(
    get,
    path = "/v1/integrations",
    operation_id = "listIntegrations",
    tag = tag::INTEGRATIONS,
    summary = "List integrations",
    params(
        ListQuery,
        ("tags" = Option<BTreeMap<String, String>>, Query, style = DeepObject, explode, description = "`tags[name]=value`: only those with each tag."),
    ),
    responses(
        (status = 200, description = "A page of integrations (secrets masked).", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
        (status = 404, description = "No workspace `workspace_id` (AB02).", body = ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let (q, tag_filter): (ListQuery, _) = query_with_tags(&ctx.uri)?;
    let page = Page::new(q.page_size, q.current_page)?;
    let p = &ctx.principal;
    if let Some(id) = &q.ai_provider_id {
        ai_provider("ai_provider_id", id)?;
    }
    let workspace_id = list_workspace(&app.store, p, q.workspace_id.as_deref()).await?;
    match &workspace_id {
        Some(ws) => authz::allowed(
            p,
            &Action::new(Resource::WorkspaceIntegrations, Op::List),
            Some(ws),
        )?,
        None => authz::allowed(
            p,
            &Action::new(Resource::OrganisationIntegrations, Op::List),
            None,
        )?,
    }
    let filter = IntegrationFilter {
        workspace_id,
        ai_provider_id: q.ai_provider_id,
        tags: tag_filter,
    };
    let (total, list) = app
        .store
        .integrations(&p.organisation_id, &filter, page)
        .await?;
    Ok(list_envelope(
        total,
        list.iter().map(Integration::to_json).collect(),
    ))
}

/// `GET /integrations/{slug}`.
#[utoipa::path(
    get,
    path = "/v1/integrations/{slug}",
    operation_id = "getIntegration",
    tag = tag::INTEGRATIONS,
    summary = "Get an integration",
    params(
        ("slug" = String, Path, description = "The integration's slug or id."),
    ),
    responses(
        (status = 200, description = "The integration (secrets masked).", body = Object),
        (status = 404, description = "No such integration.", body = ErrorBody),
    )
)]
pub async fn get(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let integration = authorised(&app.store, &ctx.principal, &slug, Op::Read).await?;
    Ok(Json(integration.to_json()))
}

/// `PUT /integrations/{slug}`: name, description, key, configurations (merged by name),
/// tags (replaced).
#[utoipa::path(
    put,
    path = "/v1/integrations/{slug}",
    operation_id = "updateIntegration",
    tag = tag::INTEGRATIONS,
    summary = "Update an integration",
    params(
        ("slug" = String, Path, description = "The integration's slug or id."),
    ),
    request_body = UpdateIntegration,
    responses(
        (status = 200, description = "Updated.", body = EmptyObject),
        (status = 400, description = "An invalid body, or a new `custom_host` without the integration's credentials (`key`, secret settings) sent again by a caller who is not an organisation admin.", body = ErrorBody),
        (status = 404, description = "No such integration.", body = ErrorBody),
    )
)]
pub async fn update(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: UpdateIntegration = ctx.json()?;
    let integration = authorised(&app.store, &ctx.principal, &slug, Op::Update).await?;
    let settings = body
        .configurations
        .unwrap_or_default()
        .check(&integration.ai_provider_id)?;
    masks_are_not_credentials(&integration, body.key.as_ref(), &settings)?;
    if !ctx.principal.is_organisation_admin() {
        credentials_follow_the_host(&integration, &settings, body.key.is_some())?;
    }
    let changes = IntegrationChanges {
        name: body.name.map(|n| validate::name("name", &n)).transpose()?,
        description: body.description.map(validate::description).transpose()?,
        key: body
            .key
            .map(|k| k.map(|k| secret("key", &k)).transpose())
            .transpose()?,
        settings: settings.plain,
        secrets: settings.secret,
        tags: body.tags.map(|t| tags("tags", t)).transpose()?,
    };
    app.store
        .update_integration(ctx.actor(), &integration, &changes)
        .await?;
    Ok(empty())
}

/// The masked value the API shows is not a credential: sent back as `key` (or as a secret
/// setting) it would be stored as one. Leaving the field out keeps the stored secret.
fn masks_are_not_credentials(
    integration: &Integration,
    key: Option<&Option<String>>,
    settings: &CheckedSettings,
) -> Result<()> {
    let why = "is the masked value the API shows, not a credential: send the secret itself, or \
        leave the field out to keep the stored one";
    if let (Some(Some(sent)), Some(mask)) = (key, &integration.key_mask) {
        if sent == mask {
            return Err(AdminError::field("key", why));
        }
    }
    for (name, value) in &settings.secret {
        if value.is_some() && value.as_ref() == integration.secret_masks.get(name) {
            return Err(AdminError::field(&format!("configurations.{name}"), why));
        }
    }
    Ok(())
}

/// A new `custom_host` receives the integration's credentials with every request. Whoever
/// points it elsewhere must send those credentials again (`key`, and each stored secret
/// setting, or remove them), so that the credentials someone else entered, such as an
/// organisation admin's, never follow a host that a workspace admin or manager chose. An
/// organisation admin (`is_organisation_admin`, not asked here) changes the host alone.
/// Removing the host sends them back to the provider's own and needs nothing.
fn credentials_follow_the_host(
    integration: &Integration,
    settings: &CheckedSettings,
    key_sent: bool,
) -> Result<()> {
    // `custom_host`, and the Azure resource, which names a host any Azure customer can own
    // (`{resource}.openai.azure.com`). Other settings keep the key on the provider's own hosts.
    let moved = ["custom_host", "azure_resource_name"].iter().any(|name| {
        matches!(settings.plain.get(*name), Some(Some(new)) if integration.settings.get(*name) != Some(new))
    });
    if !moved {
        return Ok(());
    }
    let why = "changing custom_host sends the integration's stored credentials to the new \
        host: send them again in the same request (or ask an organisation admin to change the host)";
    if integration.key_mask.is_some() && !key_sent {
        return Err(AdminError::field("key", why));
    }
    if let Some(name) = integration
        .secret_masks
        .keys()
        .find(|name| !settings.secret.contains_key(*name))
    {
        return Err(AdminError::field(&format!("configurations.{name}"), why));
    }
    Ok(())
}

/// `DELETE /integrations/{slug}`: with the providers made from it.
#[utoipa::path(
    delete,
    path = "/v1/integrations/{slug}",
    operation_id = "deleteIntegration",
    tag = tag::INTEGRATIONS,
    summary = "Delete an integration",
    description = "With the providers made from it.",
    params(
        ("slug" = String, Path, description = "The integration's slug or id."),
    ),
    responses(
        (status = 200, description = "Deleted.", body = EmptyObject),
        (status = 404, description = "No such integration.", body = ErrorBody),
    )
)]
pub async fn delete(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let integration = authorised(&app.store, &ctx.principal, &slug, Op::Delete).await?;
    app.store
        .delete_integration(ctx.actor(), &integration)
        .await?;
    Ok(empty())
}

/// `GET /integrations/{slug}/workspaces`: every workspace with its access (`enabled`, limits),
/// and the access of all workspaces (`global_workspace_access`).
#[utoipa::path(
    get,
    path = "/v1/integrations/{slug}/workspaces",
    operation_id = "listIntegrationWorkspaces",
    tag = tag::INTEGRATIONS,
    summary = "List the workspaces of an integration",
    description = "Every workspace with its access (`enabled`, limits, and each usage limit's `current_usage`), and the access of all workspaces. The limits are enforced on the workspace's requests through every provider of the integration: one counter per workspace (under global access too).",
    params(
        ("slug" = String, Path, description = "The integration's slug or id."),
        PageQuery,
    ),
    responses(
        (status = 200, description = "A page of workspaces.", body = IntegrationWorkspaceList),
        (status = 400, description = "An invalid query.", body = ErrorBody),
        (status = 404, description = "No such integration.", body = ErrorBody),
    )
)]
pub async fn workspaces(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let q: PageQuery = ctx.query()?;
    let page = Page::new(q.page_size, q.current_page)?;
    let integration = authorised(&app.store, &ctx.principal, &slug, Op::Read).await?;
    if integration.is_organisation_wide() && ctx.principal.workspace_id().is_some() {
        // A workspace key sees the integration, not the other workspaces it is shared with.
        authz::integration_allowed(&ctx.principal, Op::Read, None, false)?;
    }
    let (total, list) = app.store.integration_workspaces(&integration, page).await?;
    Ok(Json(json!({
        "object": "list",
        "total": total,
        "data": list.iter().map(IntegrationWorkspace::to_json).collect::<Vec<_>>(),
        "global_workspace_access": integration.global_access_json(),
    })))
}

/// `PUT /integrations/{slug}/workspaces`: enables or disables the organisation integration per
/// workspace (with limits, and a default provider unless `create_default_provider` is false),
/// and for all workspaces (`global_workspace_access`).
#[utoipa::path(
    put,
    path = "/v1/integrations/{slug}/workspaces",
    operation_id = "updateIntegrationWorkspaces",
    tag = tag::INTEGRATIONS,
    summary = "Share an integration with workspaces",
    description = "Enables or disables an organisation integration per workspace (with limits, and a default provider unless `create_default_provider` is false), and for all workspaces.",
    params(
        ("slug" = String, Path, description = "The integration's slug or id."),
    ),
    request_body = UpdateWorkspaces,
    responses(
        (status = 200, description = "Updated.", body = EmptyObject),
        (status = 400, description = "An invalid body, or an integration of one workspace.", body = ErrorBody),
        (status = 404, description = "No such integration (AB08), or no workspace named in the body (AB02).", body = ErrorBody),
        (status = 409, description = "A default provider slug is taken.", body = ErrorBody),
    )
)]
pub async fn update_workspaces(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: UpdateWorkspaces = ctx.json()?;
    let p = &ctx.principal;
    let integration = authorised(&app.store, p, &slug, Op::Update).await?;
    if !integration.is_organisation_wide() {
        return Err(AdminError::validation(format!(
            "the integration {} belongs to one workspace; only organisation integrations are shared with workspaces",
            integration.slug
        )));
    }
    let global = body
        .global_workspace_access
        .map(|g| {
            Ok::<_, AdminError>(WorkspaceAccess {
                enabled: g.enabled,
                usage_limits: usage_limits(
                    "global_workspace_access.usage_limits",
                    g.usage_limits.unwrap_or_default(),
                )?,
                rate_limits: validate::rate_limits(
                    "global_workspace_access.rate_limits",
                    g.rate_limits.unwrap_or_default(),
                )?,
            })
        })
        .transpose()?;
    let mut seen = BTreeSet::new();
    let mut slugs = BTreeSet::new();
    let mut workspaces = Vec::with_capacity(body.workspaces.len());
    for (i, w) in body.workspaces.into_iter().enumerate() {
        let at = |f: &str| format!("workspaces[{i}].{f}");
        let ws = app
            .store
            .workspace(&p.organisation_id, &w.id)
            .await?
            .ok_or_else(|| {
                AdminError::reference(format!("{}: no workspace {:?}", at("id"), w.id))
            })?;
        if !seen.insert(ws.id.clone()) {
            return Err(AdminError::field(&at("id"), "repeats an earlier workspace"));
        }
        let default_slug = w
            .default_provider_slug
            .as_deref()
            .map(|s| check_slug(&at("default_provider_slug"), s))
            .transpose()?;
        let create = w.create_default_provider.unwrap_or(true);
        if default_slug.is_some() && (!create || !w.enabled) {
            return Err(AdminError::field(
                &at("default_provider_slug"),
                "needs enabled and create_default_provider true",
            ));
        }
        if let Some(s) = &default_slug {
            if !slugs.insert(s.clone()) {
                return Err(AdminError::field(
                    &at("default_provider_slug"),
                    "repeats an earlier workspace's slug",
                ));
            }
        }
        workspaces.push(WorkspaceAccessChange {
            workspace_id: ws.id,
            workspace_slug: ws.slug,
            enabled: w.enabled,
            usage_limits: usage_limits(&at("usage_limits"), w.usage_limits.unwrap_or_default())?,
            rate_limits: validate::rate_limits(
                &at("rate_limits"),
                w.rate_limits.unwrap_or_default(),
            )?,
            default_provider: (w.enabled && create).then_some(default_slug),
        });
    }
    let changes = WorkspaceAccessChanges {
        global,
        override_existing: body.override_existing_workspace_access.unwrap_or(false),
        workspaces,
    };
    app.store
        .update_integration_workspaces(ctx.actor(), &integration, &changes)
        .await?;
    Ok(empty())
}

/// `GET /integrations/{slug}/models`: the models of the integration, by id.
#[utoipa::path(
    get,
    path = "/v1/integrations/{slug}/models",
    operation_id = "listIntegrationModels",
    tag = tag::INTEGRATIONS,
    summary = "List the models of an integration",
    description = "Each model with whether it is enabled and its custom price (`pricing_config`: US dollars per million input and output tokens, or `null`).",
    params(
        ("slug" = String, Path, description = "The integration's slug or id."),
        PageQuery,
    ),
    responses(
        (status = 200, description = "A page of models: `{slug, enabled, pricing_config, object}`.", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
        (status = 404, description = "No such integration.", body = ErrorBody),
    )
)]
pub async fn models(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let q: PageQuery = ctx.query()?;
    let page = Page::new(q.page_size, q.current_page)?;
    let integration = authorised(&app.store, &ctx.principal, &slug, Op::Read).await?;
    let (total, list) = app.store.integration_models(&integration, page).await?;
    Ok(list_envelope(
        total,
        list.iter().map(IntegrationModel::to_json).collect(),
    ))
}

/// `PUT /integrations/{slug}/models`: sets each listed model (enabled, custom price); models
/// not listed are kept. Same rights as updating the integration.
#[utoipa::path(
    put,
    path = "/v1/integrations/{slug}/models",
    operation_id = "updateIntegrationModels",
    tag = tag::INTEGRATIONS,
    summary = "Enable models of an integration and price them",
    description = "Sets each listed model as given (added, or replacing the model of the same id); models not listed are kept. Requests through the integration's providers are priced by their `pricing_config` first, then by the gateway's price tables.",
    params(
        ("slug" = String, Path, description = "The integration's slug or id."),
    ),
    request_body = UpdateModels,
    responses(
        (status = 200, description = "Updated.", body = EmptyObject),
        (status = 400, description = "An invalid body, or more models than an integration lists.", body = ErrorBody),
        (status = 404, description = "No such integration.", body = ErrorBody),
    )
)]
pub async fn update_models(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: UpdateModels = ctx.json()?;
    let models = check_models(body.models)?;
    let integration = authorised(&app.store, &ctx.principal, &slug, Op::Update).await?;
    app.store
        .update_integration_models(ctx.actor(), &integration, &models)
        .await?;
    Ok(empty())
}

/// The models of a `PUT .../models` body, checked: at most [`MAX_MODELS_PER_UPDATE`]; ids of 1
/// to 255 printable characters without spaces, each once (in any case); prices finite and 0
/// or more.
fn check_models(list: Vec<ModelInput>) -> Result<Vec<IntegrationModel>> {
    if list.len() > MAX_MODELS_PER_UPDATE {
        return Err(AdminError::field(
            "models",
            format!(
                "at most {MAX_MODELS_PER_UPDATE} models per request, got {}",
                list.len()
            ),
        ));
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.into_iter().enumerate() {
        let at = |f: &str| format!("models[{i}].{f}");
        validate::max_len(&at("slug"), &m.slug, validate::MAX_NAME)?;
        if m.slug.is_empty() || !m.slug.chars().all(|c| c.is_ascii_graphic()) {
            return Err(AdminError::field(
                &at("slug"),
                format!(
                    "a model id is 1 to {} printable characters without spaces, got {:?}",
                    validate::MAX_NAME,
                    m.slug
                ),
            ));
        }
        if let Some(first) = seen.insert(m.slug.to_ascii_lowercase(), i) {
            return Err(AdminError::field(
                &at("slug"),
                format!("repeats models[{first}] ({:?})", m.slug),
            ));
        }
        let pricing = match m.pricing_config {
            None => None,
            Some(p) => {
                for (field, value) in [
                    ("input_per_million", p.input_per_million),
                    ("output_per_million", p.output_per_million),
                ] {
                    if !value.is_finite() || value < 0.0 {
                        return Err(AdminError::field(
                            &at(&format!("pricing_config.{field}")),
                            format!("must be a number of US dollars, 0 or more, got {value}"),
                        ));
                    }
                }
                Some(ModelPricing {
                    input_per_million: p.input_per_million,
                    output_per_million: p.output_per_million,
                })
            }
        };
        out.push(IntegrationModel {
            slug: m.slug,
            enabled: m.enabled,
            pricing,
        });
    }
    Ok(out)
}

fn usage_limits(field: &str, list: Vec<UsageLimitsInput>) -> Result<Vec<UsageLimits>> {
    list.into_iter()
        .enumerate()
        .map(|(i, u)| validate::usage_limits(&format!("{field}[{i}]"), u))
        .collect()
}

/// The integration of the path (slug or id) when the caller may do `op` to it. An
/// organisation integration not shared with a workspace key's workspace is not found for it.
pub(super) async fn authorised(
    store: &Store,
    p: &Principal,
    slug: &str,
    op: Op,
) -> Result<Integration> {
    let integration = store
        .integration(&p.organisation_id, slug)
        .await?
        .ok_or_else(|| AdminError::not_found(format!("no integration {slug:?}")))?;
    let shared = match (&integration.workspace_id, p.workspace_id()) {
        (None, Some(own)) => {
            let shared = store.integration_usable_in(&integration, own).await?;
            if !shared {
                return Err(AdminError::not_found(format!("no integration {slug:?}")));
            }
            shared
        }
        _ => false,
    };
    authz::integration_allowed(p, op, integration.workspace_id.as_deref(), shared)?;
    Ok(integration)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configurations(v: Value) -> Configurations {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn settings_belong_to_their_provider() {
        let ok = configurations(
            json!({"custom_host": "http://127.0.0.1:9/v1", "aws_region": "eu-west-1",
            "aws_secret_access_key": "s3cr3t/KEY+x", "aws_session_token": null}),
        )
        .check("bedrock")
        .unwrap();
        assert_eq!(ok.plain["aws_region"], Some(json!("eu-west-1")));
        assert_eq!(
            ok.secret["aws_secret_access_key"].as_deref(),
            Some("s3cr3t/KEY+x")
        );
        assert_eq!(ok.secret["aws_session_token"], None);
        let bad = [
            (
                json!({"aws_region": "us-east-1"}),
                "openai",
                "configurations.aws_region: applies to bedrock integrations only",
            ),
            (
                json!({"azure_resource_name": "a.b"}),
                "azure-openai",
                "configurations.azure_resource_name: may hold only letters, digits and -",
            ),
            (
                json!({"vertex_project_id": "p/../q"}),
                "vertex-ai",
                "configurations.vertex_project_id: may hold only",
            ),
            (
                json!({"custom_host": "ftp://x"}),
                "openai",
                "configurations.custom_host: must be an http(s) URL",
            ),
            (
                json!({"custom_host": "not a url"}),
                "openai",
                "configurations.custom_host: must be an http(s) URL",
            ),
            (
                json!({"custom_host": ""}),
                "openai",
                "configurations.custom_host: must not be empty",
            ),
            (
                json!({"skipPtuCostAttribution": true}),
                "openai",
                "applies to vertex-ai",
            ),
        ];
        for (v, provider, want) in bad {
            let err = configurations(v.clone()).check(provider).unwrap_err();
            assert!(
                err.message.starts_with(want) || err.message.contains(want),
                "{v}: {}",
                err.message
            );
        }
        assert!(serde_json::from_value::<Configurations>(json!({"colour": 1})).is_err());
    }

    #[test]
    fn models_are_checked_naming_the_field() {
        let body = |v: Value| -> Vec<ModelInput> {
            serde_json::from_value::<UpdateModels>(json!({ "models": v }))
                .unwrap()
                .models
        };
        let ok = check_models(body(json!([
            {"slug": "gpt-4o", "enabled": true, "pricing_config": {"input_per_million": 2.5, "output_per_million": 10}},
            {"slug": "anthropic.claude-3-haiku-20240307-v1:0", "enabled": false, "pricing_config": null},
            {"slug": "free", "enabled": true, "pricing_config": {"input_per_million": 0, "output_per_million": 0}},
        ])))
        .unwrap();
        assert_eq!(ok.len(), 3);
        assert_eq!(
            ok[0].pricing,
            Some(ModelPricing {
                input_per_million: 2.5,
                output_per_million: 10.0
            })
        );
        assert!(!ok[1].enabled && ok[1].pricing.is_none());
        let bad = [
            (json!([{"slug": "", "enabled": true}]), "models[0].slug: a model id is"),
            (json!([{"slug": "a b", "enabled": true}]), "models[0].slug: a model id is"),
            (
                json!([{"slug": "x".repeat(256), "enabled": true}]),
                "models[0].slug:",
            ),
            (
                json!([{"slug": "m", "enabled": true}, {"slug": "M", "enabled": false}]),
                "models[1].slug: repeats models[0]",
            ),
            (
                json!([{"slug": "m", "enabled": true, "pricing_config": {"input_per_million": -1, "output_per_million": 1}}]),
                "models[0].pricing_config.input_per_million: must be a number of US dollars, 0 or more, got -1",
            ),
        ];
        for (v, want) in bad {
            let err = check_models(body(v.clone())).unwrap_err();
            assert!(err.message.starts_with(want), "{v}: {}", err.message);
        }
        let many: Vec<Value> = (0..=MAX_MODELS_PER_UPDATE)
            .map(|i| json!({"slug": format!("m{i}"), "enabled": true}))
            .collect();
        let err = check_models(body(Value::Array(many))).unwrap_err();
        assert!(
            err.message.starts_with("models: at most 1000"),
            "{}",
            err.message
        );
        // A price is two numbers; enabled is required; unknown fields are refused.
        for v in [
            json!({"models": [{"slug": "m", "enabled": true, "pricing_config": {"input_per_million": 1}}]}),
            json!({"models": [{"slug": "m"}]}),
            json!({"models": [{"slug": "m", "enabled": true, "price": 1}]}),
            json!({}),
        ] {
            assert!(
                serde_json::from_value::<UpdateModels>(v.clone()).is_err(),
                "{v}"
            );
        }
    }

    #[test]
    fn slugs_tags_and_queries() {
        assert!(check_slug("slug", "my_openai-1").is_ok());
        assert!(check_slug("slug", "a b").is_err());
        assert!(check_slug("slug", "").is_err());
        assert!(check_slug("slug", &"x".repeat(256)).is_err());
        assert!(check_slug("slug", &"x".repeat(255)).is_ok());
        assert!(check_slug("slug", "5f0c7f1e-1d7a-4b8e-9d6e-0a1b2c3d4e5f").is_err());
        assert_eq!(slug_base("OpenAI  prod!", "x"), "openai-prod");
        assert_eq!(slug_base("!!", "integration"), "integration");
        let t: BTreeMap<String, String> = [("env".to_owned(), "prod".to_owned())].into();
        assert!(tags("tags", t).is_ok());
        let t: BTreeMap<String, String> = [("bad key".to_owned(), "v".to_owned())].into();
        assert!(tags("tags", t).is_err());
        let many: BTreeMap<String, String> =
            (0..51).map(|i| (format!("k{i}"), "v".to_owned())).collect();
        assert!(tags("tags", many).is_err());

        let uri: Uri = "/v1/integrations?page_size=5&tags[env]=prod&tags%5Bteam%5D=a%20b"
            .parse()
            .unwrap();
        let (q, t): (ListQuery, _) = query_with_tags(&uri).unwrap();
        assert_eq!(q.page_size, Some(5));
        assert_eq!(
            t,
            vec![("env".into(), "prod".into()), ("team".into(), "a b".into())]
        );
        let uri: Uri = "/v1/integrations?colour=red".parse().unwrap();
        assert!(query_with_tags::<ListQuery>(&uri).is_err());
        let uri: Uri = "/v1/integrations?tags[env=prod".parse().unwrap();
        assert!(query_with_tags::<ListQuery>(&uri).is_err());
    }
}
