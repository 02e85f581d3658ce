//! Fixtures of the codecs' unit tests: requests decoded as the gateway decodes them, and
//! encoding through [`super::encode`] as a request to one provider would be.

use bytes::Bytes;
use serde_json::Value;

use plugin_sdk::llm::chat::ChatRequest;
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::{GatewayError, Route, Target};

use super::{table, Encoded, Outgoing};

/// A chat request body, decoded and validated; panics when it is not valid.
pub(crate) fn chat(body: Value) -> ChatRequest {
    match LlmRequest::decode(Route::ChatCompletions, body.to_string().as_bytes()).unwrap() {
        LlmRequest::Chat(c) => *c,
        _ => unreachable!("a chat route decodes to a chat request"),
    }
}

/// A target of `provider` with these settings (`vertex_region`, `aws_region`...).
pub(crate) fn target(provider: &str, settings: &[(&str, &str)]) -> Target {
    Target {
        provider: provider.into(),
        settings: settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Target::default()
    }
}

/// `body` on `route` encoded for a target of `provider` with these settings.
pub(crate) fn encode(
    provider: &str,
    route: Route,
    body: &Value,
    settings: &[(&str, &str)],
) -> Result<Encoded, GatewayError> {
    let raw = Bytes::from(body.to_string());
    let request = LlmRequest::decode(route, &raw).expect("the test body is valid");
    let target = target(provider, settings);
    let out = Outgoing {
        spec: table::find(provider).expect("the provider is in the table"),
        route,
        suffix: "",
        raw: &raw,
        request: &request,
        target: &target,
        strict: false,
    };
    super::encode(&out)
}
