//! `GET /v1/openapi.json`: served without a key, and in step with the code. Every route of
//! the router is documented and every documented operation is served; each documented request
//! body and query names exactly the fields its handler accepts (found by probing the handler
//! with an unknown field: serde's refusal lists the fields it knows).
//!
//! One SQLite database is enough: the document does not depend on the database.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use crate::common::{sqlite, App, ADMIN_KEY};

/// A path parameter's value when probing: a UUID nothing has.
const NO_SUCH_ID: &str = "00000000-0000-4000-8000-000000000000";

/// serde aliases (alias, name): accepted, and named in the documented field's description
/// rather than as properties of their own.
const ALIASES: &[(&str, &str)] = &[("is_default", "isDefault")];

/// The operations served without a key.
const PUBLIC: &[(&str, &str)] = &[
    ("GET", "/v1/openapi.json"),
    ("POST", "/v1/admin/users/invites/{id}/accept"),
];

async fn document(app: &App) -> Value {
    let (status, content_type, body) = app.call_raw("GET", "/v1/openapi.json", None, None).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(content_type, "application/json");
    serde_json::from_slice(&body).expect("the document is JSON")
}

/// Every (METHOD, path) the document describes.
fn operations(doc: &Value) -> BTreeMap<(String, String), Value> {
    let mut out = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("a path item") {
            if [
                "get", "put", "post", "delete", "patch", "head", "options", "trace",
            ]
            .contains(&method.as_str())
            {
                out.insert((method.to_uppercase(), path.clone()), op.clone());
            }
        }
    }
    out
}

/// A documented path with each parameter filled in.
fn concrete(path: &str) -> String {
    // `{id}/{action}` creates a key for `organisation/service`: the body is then read first.
    if path == "/v1/api-keys/{id}/{action}" {
        return "/v1/api-keys/organisation/service".to_owned();
    }
    let mut out = String::new();
    let mut rest = path;
    while let Some(start) = rest.find('{') {
        let end = rest[start..].find('}').expect("a closed parameter") + start;
        out.push_str(&rest[..start]);
        out.push_str(NO_SUCH_ID);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// A `$ref`'s schema, or the schema itself.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(r) => {
            let name = r
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("a schema reference: {r}"));
            let found = &doc["components"]["schemas"][name];
            assert!(found.is_object(), "{r} resolves");
            found
        }
        None => schema,
    }
}

/// The property names of an object schema, or of each object variant of a `oneOf`.
fn property_sets(doc: &Value, schema: &Value) -> Vec<Vec<String>> {
    let schema = resolve(doc, schema);
    if let Some(variants) = schema["oneOf"].as_array() {
        return variants
            .iter()
            .flat_map(|v| property_sets(doc, v))
            .collect();
    }
    match schema["properties"].as_object() {
        Some(props) => vec![sorted(props.keys().cloned())],
        None => Vec::new(),
    }
}

fn sorted(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = names.into_iter().collect();
    v.sort();
    v
}

/// The names serde lists when it refuses the unknown field `zz_probe` (`expected `a``,
/// `expected `a` or `b``, `expected one of `a`, `b``), or `None` for another answer.
fn refused_probe(message: &str) -> Option<Vec<String>> {
    let (_, rest) = message.split_once("unknown field `zz_probe`, ")?;
    if rest.starts_with("there are no fields") {
        return Some(Vec::new());
    }
    let (_, list) = rest.split_once("expected ")?;
    Some(sorted(
        list.split('`').skip(1).step_by(2).map(str::to_owned),
    ))
}

fn documented_query(op: &Value) -> Vec<String> {
    sorted(
        op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["in"] == "query")
            // `tags[name]=value` filters are read beside the named parameters.
            .filter(|p| p["style"] != "deepObject")
            .map(|p| p["name"].as_str().expect("a name").to_owned()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_is_served_without_a_key() {
    let app = App::start(sqlite()).await;
    let doc = document(&app).await;
    let version = doc["openapi"].as_str().expect("an openapi version");
    assert!(version.starts_with("3."), "{version}");
    assert!(doc["info"]["title"].is_string());
    // The interface version the spec describes, and the gateway's own release beside it.
    assert_eq!(doc["info"]["version"], "2.0.0");
    assert_eq!(doc["info"]["x-gateway-version"], env!("CARGO_PKG_VERSION"));
    // Built once: the same text each time, with or without a key.
    let (_, _, first) = app.call_raw("GET", "/v1/openapi.json", None, None).await;
    let (status, _, second) = app
        .call_raw("GET", "/v1/openapi.json", Some("not-a-key"), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(first, second);
    // It documents the key it asks for.
    assert_eq!(
        doc["components"]["securitySchemes"]["api_key"],
        json!({"type": "apiKey", "in": "header", "name": "x-gw-api-key",
               "description": "The API key (`x-portkey-api-key` is read too)."})
    );
    assert_eq!(doc["security"], json!([{"api_key": []}]));
    // Other methods on its path are refused as anywhere else.
    let (status, body) = app.call("POST", "/v1/openapi.json", None, None).await;
    assert_eq!(status, 405, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_is_documented_and_every_documented_operation_is_served() {
    let app = App::start(sqlite()).await;
    let doc = document(&app).await;
    let documented: BTreeSet<(String, String)> = operations(&doc).into_keys().collect();

    let table = admin::api::routes();
    let routes: BTreeSet<(String, String)> = table
        .iter()
        .map(|r| (r.method.to_string(), r.path.to_owned()))
        .collect();
    assert_eq!(routes.len(), table.len(), "a route is listed twice");
    let undocumented: Vec<_> = routes.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "routes without a #[utoipa::path] in ApiDoc: {undocumented:?}"
    );
    let unrouted: Vec<_> = documented.difference(&routes).collect();
    assert!(
        unrouted.is_empty(),
        "documented operations the router does not serve: {unrouted:?}"
    );
    assert!(documented.len() >= 80, "{} operations", documented.len());

    // The router itself serves each: a handler answers (401 without a key), not the fallbacks
    // (404 for an unknown path, 405 for a method the path does not take).
    for (method, path) in &documented {
        let uri = concrete(path);
        let (status, _, body) = app.call_raw(method, &uri, None, None).await;
        let body = String::from_utf8_lossy(&body);
        if PUBLIC.contains(&(method.as_str(), path.as_str())) {
            assert!(
                ![401, 404, 405].contains(&status),
                "{method} {uri}: {status} {body}"
            );
        } else {
            assert_eq!(status, 401, "{method} {uri}: {body}");
            assert!(body.contains("AB05"), "{method} {uri}: {body}");
        }
    }
    let (status, _) = app
        .call("PATCH", "/v1/api-keys", Some(ADMIN_KEY), None)
        .await;
    assert_eq!(status, 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_follow_the_conventions() {
    let app = App::start(sqlite()).await;
    let doc = document(&app).await;
    let declared: BTreeSet<&str> = doc["tags"]
        .as_array()
        .expect("tags")
        .iter()
        .map(|t| t["name"].as_str().expect("a tag name"))
        .collect();
    let mut ids = BTreeSet::new();
    for ((method, path), op) in operations(&doc) {
        let at = format!("{method} {path}");
        let id = op["operationId"].as_str().expect("an operationId");
        assert!(ids.insert(id.to_owned()), "{at}: operationId {id} repeats");
        let tags = op["tags"].as_array().expect("tags");
        assert_eq!(tags.len(), 1, "{at}: one tag");
        assert!(
            declared.contains(tags[0].as_str().unwrap()),
            "{at}: {tags:?}"
        );
        assert!(op["summary"].is_string(), "{at}: a summary");
        let responses = op["responses"].as_object().expect("responses");
        assert!(responses.contains_key("200"), "{at}: 200");
        for (status, resp) in responses {
            if status.starts_with('4') || status.starts_with('5') {
                let schema = match resp["$ref"].as_str() {
                    Some(r) => {
                        let name = r
                            .strip_prefix("#/components/responses/")
                            .expect("a response");
                        &doc["components"]["responses"][name]["content"]["application/json"]
                            ["schema"]
                    }
                    None => &resp["content"]["application/json"]["schema"],
                };
                assert_eq!(
                    schema["$ref"], "#/components/schemas/ErrorBody",
                    "{at} {status}: the error body"
                );
            }
        }
        // Path parameters: each one of the path, documented as required.
        let in_path: BTreeSet<String> = path
            .split('{')
            .skip(1)
            .map(|p| p.split('}').next().unwrap().to_owned())
            .collect();
        let documented: BTreeSet<String> = op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["in"] == "path")
            .inspect(|p| assert_eq!(p["required"], true, "{at}: {p}"))
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(in_path, documented, "{at}: path parameters");

        let public = PUBLIC.contains(&(method.as_str(), path.as_str()));
        if public {
            assert_eq!(op["security"], json!([]), "{at}: no key");
        } else {
            assert!(
                op.get("security").is_none(),
                "{at}: the key of the document"
            );
            for status in ["401", "403", "500"] {
                assert!(responses.contains_key(status), "{at}: {status}");
            }
            assert_eq!(
                responses.contains_key("413"),
                op.get("requestBody").is_some(),
                "{at}: 413 with a body"
            );
        }
    }
    // Every reference resolves.
    fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r);
                }
                m.values().for_each(|v| refs(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(!all.is_empty());
    for r in all {
        let pointer = r.strip_prefix('#').expect("a local reference");
        assert!(doc.pointer(pointer).is_some(), "{r} resolves");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_schemas_name_their_required_fields() {
    let app = App::start(sqlite()).await;
    let doc = document(&app).await;
    let schemas = &doc["components"]["schemas"];
    let body_of = |method: &str, path: &str| -> &Value {
        let op = &doc["paths"][path][method];
        resolve(
            &doc,
            &op["requestBody"]["content"]["application/json"]["schema"],
        )
    };
    let required = |schema: &Value| -> Vec<String> {
        sorted(
            schema["required"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| v.as_str().unwrap().to_owned()),
        )
    };
    let rate = body_of("post", "/v1/policies/rate-limits");
    assert_eq!(
        required(rate),
        ["conditions", "group_by", "type", "unit", "value"]
    );
    assert_eq!(rate["additionalProperties"], false);
    assert_eq!(
        required(body_of("post", "/v1/policies/usage-limits")),
        ["conditions", "credit_limit", "group_by", "type"]
    );
    assert_eq!(required(body_of("post", "/v1/admin/workspaces")), ["name"]);
    assert_eq!(required(body_of("post", "/v1/configs")), ["config", "name"]);
    assert_eq!(
        required(body_of("post", "/v1/admin/users/invites")),
        ["email", "role", "workspaces"]
    );
    assert_eq!(required(&schemas["CreateApiKey"]), ["name", "scopes"]);
    assert_eq!(required(&schemas["PolicyCondition"]), ["key", "value"]);
    assert_eq!(required(&schemas["RateLimit"]), ["type", "unit", "value"]);
    // Updates require nothing.
    assert!(required(body_of("put", "/v1/policies/rate-limits/{id}")).is_empty());
    // Enums carry their values.
    assert_eq!(schemas["RateUnit"]["enum"], json!(["rpm", "rph", "rpd"]));
    // Required query parameters.
    let audit = &doc["paths"]["/v1/audit-logs"]["get"]["parameters"];
    let required_params: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["required"] == true)
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(required_params, ["start_time", "end_time"]);
}

/// Every documented body and query names the fields the handler accepts, no more and no less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documented_fields_are_the_accepted_fields() {
    let app = App::start(sqlite()).await;
    let doc = document(&app).await;
    let mut bodies = 0;
    let mut queries = 0;
    for ((method, path), op) in operations(&doc) {
        let at = format!("{method} {path}");
        let public = PUBLIC.contains(&(method.as_str(), path.as_str()));
        let key = (!public).then_some(ADMIN_KEY);
        let uri = concrete(&path);

        // The query: an unknown parameter is refused with the list of the known ones.
        let probe = format!("{uri}?zz_probe=1");
        let (status, _, body) = app.call_raw(&method, &probe, key, None).await;
        let text = String::from_utf8_lossy(&body);
        let documented = documented_query(&op);
        match refused_probe(&text) {
            Some(accepted) => {
                assert_eq!(status, 400, "{at}: {text}");
                assert_eq!(accepted, documented, "{at}: the query parameters");
                queries += 1;
            }
            None => assert!(
                documented.is_empty(),
                "{at}: documents query parameters {documented:?} but ignores unknown ones: {status} {text}"
            ),
        }

        // The body: an unknown field is refused with the list of the known ones.
        let Some(schema) = op["requestBody"]["content"]["application/json"]["schema"].as_object()
        else {
            continue;
        };
        let sets = property_sets(&doc, &Value::Object(schema.clone()));
        assert!(!sets.is_empty(), "{at}: an object body");
        let (status, body) = app
            .call(&method, &uri, key, Some(json!({"zz_probe": 1})))
            .await;
        let message = body["data"]["message"].as_str().unwrap_or_default();
        let mut accepted = refused_probe(message)
            .unwrap_or_else(|| panic!("{at}: the body is not read first: {status} {body}"));
        assert_eq!(status, 400, "{at}: {body}");
        for (alias, name) in ALIASES {
            if let Some(i) = accepted.iter().position(|a| a == alias) {
                accepted.remove(i);
                let schema = resolve(
                    &doc,
                    &op["requestBody"]["content"]["application/json"]["schema"],
                );
                let description = schema["properties"][name]["description"]
                    .as_str()
                    .unwrap_or("");
                assert!(
                    description.contains(&format!("`{alias}`")),
                    "{at}: {name} names its alias {alias}: {description:?}"
                );
            }
        }
        assert!(
            sets.contains(&accepted),
            "{at}: accepts {accepted:?}, documents {sets:?}"
        );
        bodies += 1;
    }
    // What the probes covered (so that a change of error messages cannot pass unnoticed).
    assert!(bodies >= 30, "{bodies} bodies probed");
    assert!(queries >= 20, "{queries} queries probed");
}

/// A sample of answers has the documented shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_have_the_documented_shape() {
    let app = App::start(sqlite()).await;
    let doc = document(&app).await;
    let schemas = &doc["components"]["schemas"];
    let check = |name: &str, value: &Value| {
        let schema = &schemas[name];
        let props: BTreeSet<&str> = schema["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{name} has properties"))
            .keys()
            .map(String::as_str)
            .collect();
        let got: BTreeSet<&str> = value
            .as_object()
            .unwrap_or_else(|| panic!("{name}: an object, got {value}"))
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(got, props, "{name}: {value}");
    };
    let (status, created) = app
        .admin(
            "POST",
            "/v1/policies/rate-limits",
            Some(json!({"workspace_id": "default", "conditions": [{"key": "model", "value": "*"}],
                        "group_by": [{"key": "api_key"}], "type": "requests", "unit": "rpm", "value": 10})),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    check("Created", &created);
    let (status, key) = app
        .admin(
            "POST",
            "/v1/api-keys/organisation/service",
            Some(json!({"name": "k", "scopes": ["workspaces.list"]})),
        )
        .await;
    assert_eq!(status, 200, "{key}");
    check("ApiKeyCreated", &key);
    let (status, list) = app.admin("GET", "/v1/admin/workspaces", None).await;
    assert_eq!(status, 200, "{list}");
    check("List", &list);
    let (status, empty) = app
        .admin(
            "PUT",
            &format!(
                "/v1/policies/rate-limits/{}",
                created["id"].as_str().unwrap()
            ),
            Some(json!({"value": 20})),
        )
        .await;
    assert_eq!(status, 200, "{empty}");
    assert_eq!(empty, json!({}));
    assert_eq!(schemas["Empty"]["type"], "object");
    let (status, error) = app.admin("GET", "/v1/api-keys/x", None).await;
    assert_eq!(status, 400);
    check("ErrorBody", &error);
    check("ErrorData", &error["data"]);
}
