//! Secrets inside saved routing configs: found, masked, sealed at rest and opened for the data
//! plane.
//!
//! A routing config may carry credentials inline: `api_key` (on any node of the target tree),
//! the AWS credentials (`aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`),
//! `vertex_service_account_json`, and the `headers` of the checks of its hooks
//! (`before_request_hooks`, `after_request_hooks` and their aliases `input_guardrails`,
//! `output_guardrails`; each header's value, or the whole `headers` when it is written as one
//! JSON string). These are the config's *secrets*, each named by its JSON Pointer
//! (`/targets/0/api_key`).
//!
//! Stored shape (`config_versions`): `config` holds the config with each secret replaced by its
//! mask ([`mask_value`]: `sk*******cd`, or `*******` for short or non-text values), which is
//! what the API shows; `secrets` holds a JSON object from pointer to the secret's ciphertext
//! (the integrations' cipher, the config's id and the pointer as associated data, so a value
//! moved to another config or place does not open). A row whose `secrets` is NULL was written
//! before secrets were sealed: the store seals such rows when it starts with a secret key
//! ([`super::Store::seal_legacy_config_secrets`]), and masks them when read until then.
//!
//! A saved guardrail (one hook) keeps the `headers` of its checks the same way ([`Body::Hook`]:
//! pointers from the hook, `/checks/0/parameters/headers/x-api-key`).
//!
//! Updates: a secret sent back as the mask the API showed keeps the stored secret (the one at
//! the same pointer, else the one stored anywhere in the config under the same field name whose
//! mask it is, when there is exactly one), as long as it still goes where it went: the same
//! `provider`, the same `custom_host` (its node's or the nearest ancestor's) and the same
//! `webhookURL`. Anyone who may update a config may not send a secret someone else entered to
//! a host of their choosing (the same rule as an integration's `custom_host`). A masked value
//! that matches no stored secret, or whose destination changed, is refused: a mask never
//! becomes a credential, nor travels.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::crypto::Cipher;
use crate::error::{AdminError, Result};
use crate::keys;

/// Fields whose values are credentials, wherever they appear in a config.
const SECRET_FIELDS: &[&str] = &[
    "api_key",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "vertex_service_account_json",
];

/// The lists of hooks, whose checks' `parameters.headers` are secrets.
const HOOK_FIELDS: &[&str] = &[
    "before_request_hooks",
    "after_request_hooks",
    "input_guardrails",
    "output_guardrails",
];

/// The mask of a value with fewer than 8 characters, or of a value that is not text.
const SHORT_MASK: &str = "*******";

/// Pointer -> ciphertext: the `secrets` column of a config version.
pub type Sealed = BTreeMap<String, String>;

/// What a sealed document is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// A routing config (`config_versions`).
    Config,
    /// One hook: a saved guardrail (`guardrails`).
    Hook,
}

impl Body {
    fn root(self) -> Place {
        match self {
            Body::Config => Place::Config,
            Body::Hook => Place::Hooks,
        }
    }

    /// What the associated data and messages call it.
    fn noun(self) -> &'static str {
        match self {
            Body::Config => "config",
            Body::Hook => "guardrail",
        }
    }

    /// The request field a secret's path is under (`config.` for a config's body).
    fn field_prefix(self) -> &'static str {
        match self {
            Body::Config => "config.",
            Body::Hook => "",
        }
    }
}

/// The pointers of every secret of `config`, in document order.
pub fn pointers(config: &Value) -> Vec<String> {
    pointers_in(Body::Config, config)
}

/// The pointers of every secret of a document of kind `body`, in document order.
pub fn pointers_in(body: Body, value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(value, &mut String::new(), body.root(), &mut out);
    out
}

/// Where the walk is: what a member's name means there.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Anywhere outside the hooks.
    Config,
    /// Inside a list of hooks.
    Hooks,
    /// The `parameters` of a check in a hook.
    Parameters,
}

fn walk(value: &Value, at: &mut String, place: Place, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (name, v) in map {
                let len = at.len();
                push_segment(at, name);
                if v.is_null() {
                    // Nothing to hide.
                } else if place == Place::Parameters && name == "headers" {
                    match v {
                        Value::Object(headers) => {
                            for (header, hv) in headers {
                                if !hv.is_null() {
                                    let len = at.len();
                                    push_segment(at, header);
                                    out.push(at.clone());
                                    at.truncate(len);
                                }
                            }
                        }
                        _ => out.push(at.clone()),
                    }
                } else if SECRET_FIELDS.contains(&name.as_str()) {
                    out.push(at.clone());
                } else {
                    let next = if HOOK_FIELDS.contains(&name.as_str()) {
                        Place::Hooks
                    } else if place != Place::Config && name == "parameters" {
                        Place::Parameters
                    } else if place == Place::Parameters {
                        Place::Hooks
                    } else {
                        place
                    };
                    walk(v, at, next, out);
                }
                at.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = at.len();
                at.push('/');
                at.push_str(&i.to_string());
                walk(item, at, place, out);
                at.truncate(len);
            }
        }
        _ => {}
    }
}

/// Appends `/name` escaped as RFC 6901 says (`~` is `~0`, `/` is `~1`).
fn push_segment(at: &mut String, name: &str) {
    at.push('/');
    at.push_str(&name.replace('~', "~0").replace('/', "~1"));
}

/// A pointer as a field path for messages: `/targets/0/api_key` -> `targets[0].api_key`.
pub fn field_path(pointer: &str) -> String {
    let mut out = String::new();
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if !segment.is_empty() && segment.chars().all(|c| c.is_ascii_digit()) {
            out.push_str(&format!("[{segment}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&segment);
        }
    }
    out
}

/// What the API shows instead of a secret: the integrations' mask for text (`sk*******cd`),
/// `*******` otherwise.
pub fn mask_value(secret: &Value) -> Value {
    match secret {
        Value::String(s) => Value::String(keys::mask(s)),
        _ => Value::String(SHORT_MASK.to_owned()),
    }
}

/// Whether a value has the shape of a mask ([`mask_value`]).
pub fn looks_masked(value: &Value) -> bool {
    let Value::String(s) = value else {
        return false;
    };
    let chars: Vec<char> = s.chars().collect();
    s == SHORT_MASK || (chars.len() == 11 && chars[2..9].iter().all(|c| *c == '*'))
}

/// `config` with every secret masked.
pub fn masked(config: &Value) -> Value {
    masked_in(Body::Config, config)
}

/// A document of kind `body` with every secret masked.
pub fn masked_in(body: Body, config: &Value) -> Value {
    let mut out = config.clone();
    for pointer in pointers_in(body, config) {
        if let Some(v) = out.pointer_mut(&pointer) {
            *v = mask_value(v);
        }
    }
    out
}

/// The associated data of a secret: the document and the pointer.
fn context(body: Body, config_id: &str, pointer: &str) -> String {
    format!("{}:{config_id}:{pointer}", body.noun())
}

/// `config` (in clear) as stored: masked, and its secrets sealed by pointer.
pub fn seal(cipher: Option<&Cipher>, config_id: &str, config: &Value) -> Result<(Value, Sealed)> {
    seal_in(Body::Config, cipher, config_id, config)
}

/// A document of kind `body` (in clear) as stored: masked, and its secrets sealed by pointer.
pub fn seal_in(
    body: Body,
    cipher: Option<&Cipher>,
    config_id: &str,
    config: &Value,
) -> Result<(Value, Sealed)> {
    let pointers = pointers_in(body, config);
    if pointers.is_empty() {
        return Ok((config.clone(), Sealed::new()));
    }
    let cipher = cipher.ok_or_else(|| {
        AdminError::internal(format!(
            "a {} with secrets (such as {}) cannot be stored: {} is not set",
            body.noun(),
            field_path(&pointers[0]),
            crate::crypto::SECRET_KEY_VAR
        ))
    })?;
    let mut stored = config.clone();
    let mut sealed = Sealed::new();
    for pointer in pointers {
        let Some(v) = stored.pointer_mut(&pointer) else {
            continue;
        };
        sealed.insert(
            pointer.clone(),
            cipher.encrypt(&v.to_string(), &context(body, config_id, &pointer)),
        );
        *v = mask_value(v);
    }
    Ok((stored, sealed))
}

/// The config in clear from its stored form. `sealed` is `None` for a row written before
/// secrets were sealed (its secrets are in clear already).
pub fn open(
    cipher: Option<&Cipher>,
    config_id: &str,
    stored: &Value,
    sealed: Option<&Sealed>,
) -> Result<Value> {
    open_in(Body::Config, cipher, config_id, stored, sealed)
}

/// A document of kind `body` in clear from its stored form.
pub fn open_in(
    body: Body,
    cipher: Option<&Cipher>,
    config_id: &str,
    stored: &Value,
    sealed: Option<&Sealed>,
) -> Result<Value> {
    let noun = body.noun();
    let mut config = stored.clone();
    let Some(sealed) = sealed.filter(|s| !s.is_empty()) else {
        return Ok(config);
    };
    let cipher = cipher.ok_or_else(|| {
        AdminError::internal(format!(
            "the secrets of {noun} {config_id} cannot be read: {} is not set",
            crate::crypto::SECRET_KEY_VAR
        ))
    })?;
    for (pointer, ciphertext) in sealed {
        let text = cipher.decrypt(ciphertext, &context(body, config_id, pointer))?;
        let value: Value = serde_json::from_str(&text).map_err(|_| {
            AdminError::internal(format!(
                "cannot read the secret {pointer} of {noun} {config_id}"
            ))
        })?;
        match config.pointer_mut(pointer) {
            Some(slot) => *slot = value,
            None => {
                return Err(AdminError::internal(format!(
                    "{noun} {config_id} has a secret at {pointer}, which its body lacks"
                )))
            }
        }
    }
    Ok(config)
}

/// The config a client sent, with each secret it sent back masked replaced by the stored
/// secret it masks (`current`: the stored config in clear, `Value::Null` for none). The same
/// pointer is tried first, then every stored secret under the same field name; a mask that
/// matches none, or several different secrets, is a 400 naming it (`config.<path>`).
pub fn unmask(sent: Value, current: &Value) -> Result<Value> {
    unmask_in(Body::Config, sent, current)
}

/// [`unmask`] for a document of kind `body`.
pub fn unmask_in(body: Body, mut sent: Value, current: &Value) -> Result<Value> {
    let stored: Vec<(String, Value)> = pointers_in(body, current)
        .into_iter()
        .filter_map(|p| current.pointer(&p).map(|v| (p, v.clone())))
        .collect();
    for pointer in pointers_in(body, &sent) {
        let goes_to = destination(&sent, &pointer);
        let Some(slot) = sent.pointer_mut(&pointer) else {
            continue;
        };
        if !looks_masked(slot) {
            continue;
        }
        // Only a secret that would still go where it went before.
        let same_place = stored.iter().find(|(p, v)| {
            *p == pointer && mask_value(v) == *slot && destination(current, p) == goes_to
        });
        let found = match same_place {
            Some((_, v)) => Some(v.clone()),
            None => {
                let name = last_segment(&pointer);
                let matches: Vec<&Value> = stored
                    .iter()
                    .filter(|(p, v)| {
                        last_segment(p) == name
                            && mask_value(v) == *slot
                            && destination(current, p) == goes_to
                    })
                    .map(|(_, v)| v)
                    .collect();
                match matches.first() {
                    Some(first) if matches.iter().all(|m| m == first) => Some((*first).clone()),
                    _ => None,
                }
            }
        };
        match found {
            Some(v) => *slot = v,
            None => {
                return Err(AdminError::field(
                    &format!("{}{}", body.field_prefix(), field_path(&pointer)),
                    format!(
                        "is a masked value that matches no stored secret of this {} going to \
                         the same provider and host: send the secret itself",
                        body.noun()
                    ),
                ))
            }
        }
    }
    Ok(sent)
}

/// Where the secret at `pointer` goes: the `provider`, `webhookURL` and Azure resource of the
/// nearest object above it that names one, and the nearest `custom_host` on the way up (a node
/// inherits its ancestors'). `Null` where there is none.
fn destination(config: &Value, pointer: &str) -> [Value; 4] {
    let mut out = [Value::Null, Value::Null, Value::Null, Value::Null];
    let mut at = pointer;
    while let Some(cut) = at.rfind('/') {
        at = &at[..cut];
        let Some(node) = config.pointer(at).and_then(Value::as_object) else {
            continue;
        };
        let keys = [
            "provider",
            "custom_host",
            "webhookURL",
            // `{resource}.openai.azure.com`: a host any Azure customer can own.
            "azure_resource_name",
        ];
        for (slot, key) in out.iter_mut().zip(keys) {
            if slot.is_null() {
                if let Some(v) = node.get(key) {
                    *slot = v.clone();
                }
            }
        }
    }
    out
}

fn last_segment(pointer: &str) -> &str {
    pointer.rsplit('/').next().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::SecretKey;
    use serde_json::json;

    fn config() -> Value {
        json!({
            "strategy": {"mode": "fallback"},
            "api_key": "sk-top-level-000000",
            "targets": [
                {"provider": "openai", "api_key": "sk-first-1111111111", "override_params": {"model": "m"}},
                {"provider": "bedrock", "aws_access_key_id": "AKIA0000", "aws_secret_access_key": "aws/secret",
                 "aws_session_token": "tok", "aws_region": "us-east-1"},
                {"strategy": {"mode": "loadbalance"}, "targets": [
                    {"provider": "vertex-ai", "vertex_service_account_json": {"private_key": "pk"},
                     "vertex_region": "eu"},
                    {"provider": "@saved", "api_key": null}
                ]}
            ],
            "before_request_hooks": [{"id": "h", "checks": [
                {"id": "default.webhook", "parameters": {"webhookURL": "https://h.example",
                    "headers": {"Authorization": "Bearer hook-secret", "x-team": "t"}}},
                {"id": "default.contains", "parameters": {"words": ["headers"]}}
            ]}],
            "output_guardrails": [{"checks": [{"id": "default.webhook",
                "parameters": {"headers": "{\"x-k\": \"v\"}"}}]}],
            "override_params": {"headers": {"not": "a secret"}}
        })
    }

    #[test]
    fn secrets_are_found_at_any_depth() {
        assert_eq!(
            pointers(&config()),
            [
                "/api_key",
                "/before_request_hooks/0/checks/0/parameters/headers/Authorization",
                "/before_request_hooks/0/checks/0/parameters/headers/x-team",
                "/output_guardrails/0/checks/0/parameters/headers",
                "/targets/0/api_key",
                "/targets/1/aws_access_key_id",
                "/targets/1/aws_secret_access_key",
                "/targets/1/aws_session_token",
                "/targets/2/targets/0/vertex_service_account_json",
            ]
        );
        assert_eq!(
            field_path("/targets/2/targets/0/vertex_service_account_json"),
            "targets[2].targets[0].vertex_service_account_json"
        );
        assert_eq!(field_path("/a~1b/x~0y"), "a/b.x~y");
        let mut odd = json!({"before_request_hooks": [{"checks": [{"parameters": {"headers": {"a/b": "v"}}}]}]});
        let p = pointers(&odd);
        assert_eq!(
            p,
            ["/before_request_hooks/0/checks/0/parameters/headers/a~1b"]
        );
        assert_eq!(odd.pointer_mut(&p[0]).unwrap(), "v");
    }

    #[test]
    fn sealed_configs_show_masks_and_open_to_the_original() {
        let cipher = Cipher::new(&SecretKey::generate());
        let clear = config();
        let (stored, sealed) = seal(Some(&cipher), "c1", &clear).unwrap();
        let text = stored.to_string() + &serde_json::to_string(&sealed).unwrap();
        for secret in [
            "sk-top-level-000000",
            "sk-first-1111111111",
            "AKIA0000",
            "aws/secret",
            "hook-secret",
            "\"pk\"",
        ] {
            assert!(!text.contains(secret), "{secret} at rest: {text}");
        }
        assert_eq!(stored["targets"][0]["api_key"], "sk*******11");
        assert_eq!(stored["targets"][1]["aws_session_token"], "*******");
        assert_eq!(
            stored["targets"][2]["targets"][0]["vertex_service_account_json"],
            "*******"
        );
        assert_eq!(stored["targets"][1]["aws_region"], "us-east-1");
        assert_eq!(stored["override_params"], clear["override_params"]);
        assert_eq!(stored, masked(&clear));
        assert_eq!(
            open(Some(&cipher), "c1", &stored, Some(&sealed)).unwrap(),
            clear
        );
        // Bound to the config.
        assert!(open(Some(&cipher), "c2", &stored, Some(&sealed)).is_err());
        // Without secrets, no key is needed.
        let plain = json!({"provider": "@x"});
        assert_eq!(
            seal(None, "c", &plain).unwrap(),
            (plain.clone(), Sealed::new())
        );
        assert!(seal(None, "c", &clear).is_err());
        // A row from before sealing is already in clear.
        assert_eq!(open(None, "c", &clear, None).unwrap(), clear);
    }

    #[test]
    fn masks_sent_back_keep_the_stored_secret() {
        let clear = config();
        let shown = masked(&clear);
        assert!(looks_masked(&shown["api_key"]));
        assert!(!looks_masked(&json!("sk-real-key")));
        assert_eq!(unmask(shown.clone(), &clear).unwrap(), clear);
        // A new secret replaces the old one; a moved target keeps its secret.
        let mut sent = shown.clone();
        sent["api_key"] = json!("sk-new-top-level");
        let first = sent["targets"][0].clone();
        sent["targets"] = json!([{"provider": "x"}, first]);
        let got = unmask(sent, &clear).unwrap();
        assert_eq!(got["api_key"], "sk-new-top-level");
        assert_eq!(got["targets"][1]["api_key"], "sk-first-1111111111");
        // A mask that matches nothing is refused, and never stored.
        let err = unmask(json!({"targets": [{"api_key": "ab*******yz"}]}), &clear).unwrap_err();
        assert_eq!(
            err.message,
            "config.targets[0].api_key: is a masked value that matches no stored secret of this config going to the same provider and host: send the secret itself"
        );
        assert!(unmask(json!({"api_key": "*******"}), &Value::Null).is_err());
        // Two different stored secrets with the same mask elsewhere: ambiguous.
        let twins = json!({"targets": [{"api_key": "sk-aaaa-zz"}, {"api_key": "sk-bbbb-zz"}]});
        assert!(unmask(json!({"api_key": "sk*******zz"}), &twins).is_err());
    }

    #[test]
    fn a_mask_does_not_take_its_secret_to_another_host_or_provider() {
        let stored = json!({"strategy": {"mode": "fallback"}, "custom_host": "https://a.example/v1",
            "targets": [{"provider": "openai", "api_key": "sk-entered-by-admin-42"}],
            "before_request_hooks": [{"checks": [{"id": "default.webhook", "parameters": {
                "webhookURL": "https://hook.example/", "headers": {"Authorization": "Bearer hook-secret-99"}}}]}]});
        let shown = masked(&stored);
        assert_eq!(unmask(shown.clone(), &stored).unwrap(), stored);
        let refused = |change: &dyn Fn(&mut Value)| {
            let mut sent = shown.clone();
            change(&mut sent);
            unmask(sent, &stored).unwrap_err().message
        };
        // Another host on the target, or on the group above it.
        let e = refused(&|c| c["targets"][0]["custom_host"] = json!("https://evil.example/v1"));
        assert!(e.starts_with("config.targets[0].api_key"), "{e}");
        refused(&|c| c["custom_host"] = json!("https://evil.example/v1"));
        // Another provider, or another Azure resource (a host any Azure customer can own).
        refused(&|c| c["targets"][0]["provider"] = json!("groq"));
        refused(&|c| c["targets"][0]["azure_resource_name"] = json!("attackers-resource"));
        // Moved under another group whose host differs.
        refused(&|c| {
            let target = c["targets"][0].clone();
            c["targets"] = json!([{"custom_host": "https://evil.example/v1",
                                   "strategy": {"mode": "fallback"}, "targets": [target]}]);
        });
        // A webhook's headers stay with its URL.
        let e = refused(&|c| {
            c["before_request_hooks"][0]["checks"][0]["parameters"]["webhookURL"] =
                json!("https://evil.example/")
        });
        assert!(e.contains("headers"), "{e}");
    }
}
