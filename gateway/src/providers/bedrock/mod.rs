//! AWS Bedrock: chat through the Converse and ConverseStream APIs ([`converse`]), embeddings
//! through InvokeModel, every request signed with Signature Version 4 ([`sigv4`]).
//!
//! Paths, after `https://bedrock-runtime.{aws_region}.amazonaws.com`, with the model id
//! percent-encoded as one path segment (`:` -> `%3A`, `/` of an ARN -> `%2F`):
//! - chat: `/model/{modelId}/converse`; streamed chat: `/model/{modelId}/converse-stream`,
//!   answered as an AWS event stream ([`eventstream`]), not server-sent events;
//! - embeddings: `/model/{modelId}/invoke`, in the model family's own body. Amazon Titan
//!   (`amazon.titan-embed-*`): `{"inputText", "dimensions"?}` -> `{"embedding",
//!   "inputTextTokenCount"}`, one text per call. Cohere (`cohere.embed-*`): `{"texts",
//!   "input_type": "search_document"}` -> `{"embeddings": [[...]]}` (or `{"float": [[...]]}`).
//!
//! Other routes, and embeddings of other model families, are refused with a 400. The
//! credentials and region come from the target's `aws_access_key_id`, `aws_secret_access_key`,
//! `aws_session_token` (optional) and `aws_region` settings.

pub mod converse;
pub mod eventstream;
pub mod invoke;
pub mod sigv4;

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{json, Value};

use plugin_sdk::llm::embeddings::EmbeddingsRequest;
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::{GatewayError, Route, Target, Usage};

use super::chunks;
use super::request;
use super::{CallInfo, Decoded, Encoded, Outgoing, StreamDecoder, WireFormat};

const PROVIDER: &str = "bedrock";
/// The SigV4 service name of Bedrock's runtime API.
pub const SERVICE: &str = "bedrock";

/// Encodes a chat or embeddings request for Bedrock.
pub fn encode(out: &Outgoing<'_>) -> Result<Encoded, GatewayError> {
    match (out.route, out.request) {
        (Route::ChatCompletions, LlmRequest::Chat(req)) => {
            let model = model_segment(out.model())?;
            let body = converse::encode(req)?;
            if out.stream() {
                let mut encoded = Encoded::new(
                    body,
                    format!("/model/{model}/converse-stream"),
                    WireFormat::Bedrock,
                );
                encoded
                    .headers
                    .push(("accept", "application/vnd.amazon.eventstream".to_owned()));
                Ok(encoded)
            } else {
                Ok(Encoded::new(
                    body,
                    format!("/model/{model}/converse"),
                    WireFormat::Bedrock,
                ))
            }
        }
        (Route::Embeddings, LlmRequest::Embeddings(req)) => {
            let segment = model_segment(out.model())?;
            let body = encode_embeddings(req, out.model())?;
            Ok(Encoded::new(
                body,
                format!("/model/{segment}/invoke"),
                WireFormat::Bedrock,
            ))
        }
        (route, _) => Err(GatewayError::invalid(format!(
            "bedrock does not serve the {} route",
            route.as_str()
        ))),
    }
}

/// Decodes a whole 2xx answer of a chat or embeddings call.
pub fn decode(call: &CallInfo, body: &[u8]) -> Result<Decoded, GatewayError> {
    match call.route {
        Route::ChatCompletions => converse::decode(call, body),
        Route::Embeddings => decode_embeddings(call, body),
        route => Err(GatewayError::internal(format!(
            "bedrock does not serve the {} route",
            route.as_str()
        ))),
    }
}

/// The translator of a ConverseStream answer (binary event-stream frames).
pub fn stream(call: &CallInfo) -> Box<dyn StreamDecoder> {
    Box::new(converse::ConverseStream::new(call, chunks::new_id()))
}

/// The translator of an `invoke-with-response-stream` answer for an Anthropic-format client.
pub fn anthropic_events(_call: &CallInfo) -> Box<dyn StreamDecoder> {
    Box::new(invoke::AnthropicEvents::default())
}

/// Signs the final request with SigV4 as of now (see [`sigv4`]). Missing credentials or region
/// are the client's 400, naming the header that carries them.
pub fn sign(
    target: &Target,
    request: &mut plugin_sdk::plugin::UpstreamRequest,
) -> Result<(), GatewayError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    sign_at(target, request, now)
}

/// [`sign`] as of `unix_secs`.
pub fn sign_at(
    target: &Target,
    request: &mut plugin_sdk::plugin::UpstreamRequest,
    unix_secs: u64,
) -> Result<(), GatewayError> {
    let creds = sigv4::Credentials {
        access_key_id: required(target, "aws_access_key_id")?,
        secret_access_key: required(target, "aws_secret_access_key")?,
        session_token: target
            .setting("aws_session_token")
            .filter(|t| !t.is_empty()),
        region: required(target, "aws_region")?,
        service: SERVICE,
    };
    sigv4::sign_at(&creds, request, unix_secs)
}

/// A setting that must be there, or a 400 naming its `x-gw-...` header.
fn required<'a>(target: &'a Target, name: &str) -> Result<&'a str, GatewayError> {
    target
        .setting(name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            GatewayError::invalid_param(
                format!("x-gw-{}", name.replace('_', "-")),
                format!("bedrock needs the {name} setting to sign requests"),
            )
        })
}

/// The model id as one percent-encoded path segment.
fn model_segment(model: &str) -> Result<String, GatewayError> {
    if model.is_empty() {
        return Err(GatewayError::invalid_param(
            "model",
            "bedrock needs a model id (anthropic.claude-3-5-sonnet-20240620-v1:0, ...)",
        ));
    }
    let mut out = String::with_capacity(model.len() + 8);
    sigv4::uri_encode(model.as_bytes(), &mut out);
    Ok(out)
}

/// The embedding model families Bedrock's InvokeModel is spoken to in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EmbedFamily {
    Titan,
    Cohere,
}

/// The family of a model id; ids with a prefix (a cross-region profile, an ARN) count too.
fn embed_family(model: &str) -> Option<EmbedFamily> {
    if model.contains("amazon.titan-embed") {
        Some(EmbedFamily::Titan)
    } else if model.contains("cohere.embed") {
        Some(EmbedFamily::Cohere)
    } else {
        None
    }
}

fn encode_embeddings(req: &EmbeddingsRequest, model: &str) -> Result<Bytes, GatewayError> {
    let family = embed_family(model).ok_or_else(|| {
        GatewayError::invalid_param(
            "model",
            format!(
                "bedrock embeddings are served for amazon.titan-embed-* and cohere.embed-* \
                 models, not {model:?}"
            ),
        )
    })?;
    let texts = request::embedding_texts(&req.input, PROVIDER)?;
    let body = match family {
        EmbedFamily::Titan => {
            let [text] = texts.as_slice() else {
                return Err(GatewayError::invalid_param(
                    "input",
                    format!(
                        "amazon titan embedding models take one text per request, got {}",
                        texts.len()
                    ),
                ));
            };
            let mut body = json!({ "inputText": text });
            if let Some(d) = req.dimensions {
                body["dimensions"] = json!(d);
            }
            body
        }
        EmbedFamily::Cohere => json!({ "texts": texts, "input_type": "search_document" }),
    };
    Ok(Bytes::from(body.to_string()))
}

fn decode_embeddings(call: &CallInfo, body: &[u8]) -> Result<Decoded, GatewayError> {
    let answer: Value = serde_json::from_slice(body)
        .map_err(|e| chunks::bad_answer(PROVIDER, format!("the answer is not JSON ({e})")))?;
    let (vectors, usage) = match embed_family(&call.model) {
        Some(EmbedFamily::Titan) => {
            let vector = answer
                .get("embedding")
                .filter(|v| v.is_array())
                .ok_or_else(|| chunks::bad_answer(PROVIDER, "the answer has no embedding list"))?;
            let usage = Usage {
                prompt_tokens: answer["inputTextTokenCount"].as_u64().unwrap_or(0),
                completion_tokens: 0,
            };
            (vec![vector.clone()], usage)
        }
        Some(EmbedFamily::Cohere) => {
            let list = match &answer["embeddings"] {
                Value::Array(list) => list,
                Value::Object(by_type) => by_type
                    .get("float")
                    .and_then(Value::as_array)
                    .ok_or_else(|| {
                        chunks::bad_answer(PROVIDER, "the answer has no float embeddings")
                    })?,
                _ => {
                    return Err(chunks::bad_answer(
                        PROVIDER,
                        "the answer has no embeddings list",
                    ))
                }
            };
            if !list.iter().all(Value::is_array) {
                return Err(chunks::bad_answer(PROVIDER, "an embedding is not a list"));
            }
            let usage = Usage {
                prompt_tokens: answer["meta"]["billed_units"]["input_tokens"]
                    .as_u64()
                    .unwrap_or(0),
                completion_tokens: 0,
            };
            (list.clone(), usage)
        }
        None => {
            return Err(GatewayError::internal(format!(
                "bedrock embeddings of {:?} cannot be decoded",
                call.model
            )))
        }
    };
    Ok(Decoded {
        provisioned: false,
        body: chunks::embeddings(&call.model, vectors, usage),
        model: call.named_model(),
        usage: Some(usage),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing;
    use http::{HeaderMap, Method};
    use plugin_sdk::plugin::UpstreamRequest;

    fn encode_for(route: Route, body: Value) -> Result<Encoded, GatewayError> {
        testing::encode("bedrock", route, &body, &[])
    }

    fn call(route: Route, model: &str) -> CallInfo {
        CallInfo {
            provider: "bedrock",
            format: WireFormat::Bedrock,
            route,
            model: model.into(),
            include_usage: false,
            hidden_usage: false,
            base64_embeddings: false,
            strict: false,
            waive_provisioned_cost: false,
        }
    }

    #[test]
    fn chat_paths_carry_the_encoded_model_id() {
        let e = encode_for(
            Route::ChatCompletions,
            json!({"model": "anthropic.claude-3-5-sonnet-20240620-v1:0",
                "messages": [{"role": "user", "content": "hi"}]}),
        )
        .unwrap();
        assert_eq!(
            e.path,
            "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
        );
        assert_eq!(e.answer_format, WireFormat::Bedrock);
        assert!(e.headers.is_empty());
        let body: Value = serde_json::from_slice(&e.body).unwrap();
        assert_eq!(body["messages"][0]["content"][0]["text"], "hi");

        let e = encode_for(
            Route::ChatCompletions,
            json!({"model": "arn:aws:bedrock:us-east-1:123:inference-profile/us.meta.llama3",
                "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .unwrap();
        assert_eq!(
            e.path,
            "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123%3Ainference-profile%2Fus.meta.llama3/converse-stream"
        );
        assert_eq!(
            e.headers,
            vec![("accept", "application/vnd.amazon.eventstream".to_owned())]
        );

        let err = encode_for(
            Route::ChatCompletions,
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("model"));
    }

    #[test]
    fn other_routes_are_refused() {
        let err = encode_for(Route::Moderations, json!({"input": "x"})).unwrap_err();
        assert_eq!(err.status().as_u16(), 400);
        assert!(
            err.message.contains("bedrock does not serve"),
            "{}",
            err.message
        );
    }

    #[test]
    fn titan_embeddings_both_ways() {
        let model = "amazon.titan-embed-text-v2:0";
        let e = encode_for(
            Route::Embeddings,
            json!({"model": model, "input": "hello", "dimensions": 256}),
        )
        .unwrap();
        assert_eq!(e.path, "/model/amazon.titan-embed-text-v2%3A0/invoke");
        let body: Value = serde_json::from_slice(&e.body).unwrap();
        assert_eq!(body, json!({"inputText": "hello", "dimensions": 256}));
        let e = encode_for(Route::Embeddings, json!({"model": model, "input": ["one"]})).unwrap();
        let body: Value = serde_json::from_slice(&e.body).unwrap();
        assert_eq!(body, json!({"inputText": "one"}));

        let err = encode_for(
            Route::Embeddings,
            json!({"model": model, "input": ["a", "b"]}),
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("input"));
        assert!(
            err.message.contains("one text per request"),
            "{}",
            err.message
        );
        let err =
            encode_for(Route::Embeddings, json!({"model": model, "input": [1, 2]})).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("input"));

        let answer = json!({"embedding": [0.1, -0.2], "inputTextTokenCount": 3});
        let d = decode(
            &call(Route::Embeddings, model),
            answer.to_string().as_bytes(),
        )
        .unwrap();
        let out: Value = serde_json::from_slice(&d.body).unwrap();
        assert_eq!(out["object"], "list");
        assert_eq!(out["model"], model);
        assert_eq!(out["data"][0]["embedding"], json!([0.1, -0.2]));
        assert_eq!(out["data"][0]["index"], 0);
        assert_eq!(out["usage"]["prompt_tokens"], 3);
        assert_eq!(d.usage.unwrap().prompt_tokens, 3);

        let err = decode(&call(Route::Embeddings, model), b"{\"embeddings\": []}").unwrap_err();
        assert_eq!(err.status().as_u16(), 502);
    }

    #[test]
    fn cohere_embeddings_both_ways() {
        let model = "cohere.embed-english-v3";
        let e = encode_for(
            Route::Embeddings,
            json!({"model": model, "input": ["a", "b"]}),
        )
        .unwrap();
        assert_eq!(e.path, "/model/cohere.embed-english-v3/invoke");
        let body: Value = serde_json::from_slice(&e.body).unwrap();
        assert_eq!(
            body,
            json!({"texts": ["a", "b"], "input_type": "search_document"})
        );

        let c = call(Route::Embeddings, model);
        let plain = json!({"id": "x", "embeddings": [[0.1], [0.2]], "texts": ["a", "b"]});
        let d = decode(&c, plain.to_string().as_bytes()).unwrap();
        let out: Value = serde_json::from_slice(&d.body).unwrap();
        assert_eq!(out["data"][1]["embedding"], json!([0.2]));
        assert_eq!(out["data"][1]["index"], 1);
        assert_eq!(out["usage"]["prompt_tokens"], 0, "none reported, zero");

        let by_type = json!({"embeddings": {"float": [[0.5, 0.5]]},
            "meta": {"billed_units": {"input_tokens": 4}}});
        let d = decode(&c, by_type.to_string().as_bytes()).unwrap();
        let out: Value = serde_json::from_slice(&d.body).unwrap();
        assert_eq!(out["data"][0]["embedding"], json!([0.5, 0.5]));
        assert_eq!(out["usage"]["prompt_tokens"], 4);

        for bad in [
            &br#"{"embeddings": {"int8": [[1]]}}"#[..],
            br#"{"embeddings": [1, 2]}"#,
            b"nope",
        ] {
            assert_eq!(decode(&c, bad).unwrap_err().status().as_u16(), 502);
        }
    }

    #[test]
    fn embeddings_of_other_families_are_refused() {
        let err = encode_for(
            Route::Embeddings,
            json!({"model": "meta.llama3-8b-instruct-v1:0", "input": "x"}),
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("model"));
        assert_eq!(err.status().as_u16(), 400);
    }

    fn target(settings: &[(&str, &str)]) -> Target {
        testing::target("bedrock", settings)
    }

    fn bedrock_request() -> UpstreamRequest {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", "application/json".parse().unwrap());
        UpstreamRequest {
            method: Method::POST,
            url: "https://bedrock-runtime.eu-west-1.amazonaws.com/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
                .into(),
            headers,
            body: Bytes::from_static(b"{\"messages\":[]}"),
        }
    }

    #[test]
    fn signing_reads_the_settings_and_signs_the_sent_request() {
        let t = target(&[
            ("aws_access_key_id", "AKIDEXAMPLE"),
            (
                "aws_secret_access_key",
                "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            ),
            ("aws_session_token", "SESSION"),
            ("aws_region", "eu-west-1"),
        ]);
        let mut req = bedrock_request();
        sign_at(&t, &mut req, 1_440_938_160).unwrap();
        assert_eq!(req.headers["x-amz-security-token"], "SESSION");
        let auth = req.headers["authorization"].to_str().unwrap().to_owned();
        assert!(auth.starts_with(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/eu-west-1/bedrock/aws4_request, \
             SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date;x-amz-security-token, "
        ), "{auth}");

        // The signature is the one of the canonical request with `%253A` in the path.
        let creds = sigv4::Credentials {
            access_key_id: "AKIDEXAMPLE",
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            session_token: Some("SESSION"),
            region: "eu-west-1",
            service: "bedrock",
        };
        let hash = req.headers["x-amz-content-sha256"]
            .to_str()
            .unwrap()
            .to_owned();
        let s = sigv4::signature(
            "POST",
            &req.url,
            &req.headers,
            &hash,
            "20150830T123600Z",
            &creds,
        )
        .unwrap();
        assert!(s.canonical_request.starts_with(
            "POST\n/model/anthropic.claude-3-5-sonnet-20240620-v1%253A0/converse\n\n"
        ));
        assert!(s
            .canonical_request
            .contains("\nx-amz-security-token:SESSION\n"));
        assert_eq!(auth, s.authorization);

        // Signing again (a retry) replaces, never duplicates, the signature headers.
        sign_at(&t, &mut req, 1_440_938_161).unwrap();
        assert_eq!(req.headers.get_all("authorization").iter().count(), 1);
        assert_eq!(req.headers["x-amz-date"], "20150830T123601Z");
    }

    #[test]
    fn missing_settings_name_their_header() {
        let full = [
            ("aws_access_key_id", "AKID"),
            ("aws_secret_access_key", "SECRET"),
            ("aws_region", "us-east-1"),
        ];
        for (missing, header) in [
            ("aws_access_key_id", "x-gw-aws-access-key-id"),
            ("aws_secret_access_key", "x-gw-aws-secret-access-key"),
            ("aws_region", "x-gw-aws-region"),
        ] {
            let settings: Vec<_> = full
                .iter()
                .copied()
                .filter(|(k, _)| *k != missing)
                .collect();
            let err = sign(&target(&settings), &mut bedrock_request()).unwrap_err();
            assert_eq!(err.status().as_u16(), 400);
            assert_eq!(err.param.as_deref(), Some(header));
        }
        let mut req = bedrock_request();
        sign(&target(&full), &mut req).unwrap();
        assert!(req.headers.get("x-amz-security-token").is_none());
        assert!(req.headers.contains_key("authorization"));
    }
}
