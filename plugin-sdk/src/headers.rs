//! The gateway's own request headers (`x-gw-*`, also accepted as `x-portkey-*`).
//!
//! Parsed once per request into [`GwHeaders`]; a header that is present but malformed is a 400
//! naming the header.

use std::collections::BTreeMap;

use http::{HeaderMap, HeaderName};

use crate::error::GatewayError;

/// The two prefixes of the gateway's headers. Clients of the reference product send `x-portkey-`.
pub const PREFIXES: [&str; 2] = ["x-gw-", "x-portkey-"];

macro_rules! gw_headers {
    ($($konst:ident => $suffix:literal),* $(,)?) => {
        /// A gateway header under both of its spellings.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct GwHeader {
            pub suffix: &'static str,
            pub primary: &'static str,
            pub alias: &'static str,
        }
        impl GwHeader {
            $(pub const $konst: GwHeader = GwHeader {
                suffix: $suffix,
                primary: concat!("x-gw-", $suffix),
                alias: concat!("x-portkey-", $suffix),
            };)*
            /// Every header the gateway knows, for documentation and tests.
            pub const ALL: &'static [GwHeader] = &[$(GwHeader::$konst),*];
        }
    };
}

gw_headers! {
    API_KEY => "api-key",
    PROVIDER => "provider",
    VIRTUAL_KEY => "virtual-key",
    CONFIG => "config",
    CUSTOM_HOST => "custom-host",
    TRACE_ID => "trace-id",
    METADATA => "metadata",
    CACHE_NAMESPACE => "cache-namespace",
    CACHE_FORCE_REFRESH => "cache-force-refresh",
    REQUEST_TIMEOUT => "request-timeout",
    FORWARD_HEADERS => "forward-headers",
    SPAN_ID => "span-id",
    PARENT_SPAN_ID => "parent-span-id",
    SPAN_NAME => "span-name",
    STRICT_OPENAI_COMPLIANCE => "strict-open-ai-compliance",
}

impl GwHeader {
    /// The header's value under either spelling (the `x-gw-` one wins), trimmed.
    pub fn get<'a>(&self, headers: &'a HeaderMap) -> Option<&'a str> {
        headers
            .get(self.primary)
            .or_else(|| headers.get(self.alias))
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    }
}

/// Provider settings sent as headers (`x-gw-aws-region`...), by header suffix. Each becomes the
/// target setting of the same name with `_` for `-` (`aws_region`).
pub const PROVIDER_SETTINGS: &[&str] = &[
    "azure-resource-name",
    "azure-deployment-id",
    "azure-api-version",
    "azure-model-name",
    "vertex-project-id",
    "vertex-region",
    "aws-access-key-id",
    "aws-secret-access-key",
    "aws-session-token",
    "aws-region",
];

/// Provider settings from headers, as (setting name, value). `Debug` shows names only: some
/// values are secrets.
#[derive(Clone, Default)]
pub struct ProviderSettings(pub Vec<(String, String)>);

impl std::fmt::Debug for ProviderSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, _)| k))
            .finish()
    }
}

/// True for a header in the gateway's own namespace, which is never sent upstream.
pub fn is_gateway_header(name: &HeaderName) -> bool {
    let name = name.as_str();
    PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The parsed gateway headers of one request.
#[derive(Debug, Clone, Default)]
pub struct GwHeaders {
    pub api_key: Option<String>,
    /// `@slug` (a saved provider) or a provider id (`openai`, `groq`...).
    pub provider: Option<String>,
    pub virtual_key: Option<String>,
    /// Inline JSON or the id/slug of a saved config.
    pub config: Option<String>,
    pub custom_host: Option<String>,
    pub trace_id: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub cache_namespace: Option<String>,
    pub cache_force_refresh: bool,
    pub request_timeout_ms: Option<u64>,
    /// Names (lower-case) of client headers to forward untouched to the provider.
    pub forward_headers: Vec<String>,
    pub span_id: Option<String>,
    pub parent_span_id: Option<String>,
    pub span_name: Option<String>,
    pub strict_openai_compliance: Option<bool>,
    /// Azure, Vertex and AWS settings (`x-gw-aws-region`...), for the provider they name.
    pub provider_settings: ProviderSettings,
}

impl GwHeaders {
    /// Parses the gateway headers; a malformed value is a 400 that names the header.
    ///
    /// One pass over the request's headers (most of which are not the gateway's), so the cost
    /// does not grow with the number of gateway headers known.
    pub fn parse(headers: &HeaderMap) -> Result<GwHeaders, GatewayError> {
        let mut gw = GwHeaders::default();
        // The x-gw- spelling wins over x-portkey-: remember which one set each field.
        let mut from_primary = [false; GwHeader::ALL.len()];
        for (name, value) in headers {
            let name = name.as_str();
            let (suffix, primary) = if let Some(s) = name.strip_prefix("x-gw-") {
                (s, true)
            } else if let Some(s) = name.strip_prefix("x-portkey-") {
                (s, false)
            } else {
                continue;
            };
            let Some(index) = GwHeader::ALL.iter().position(|h| h.suffix == suffix) else {
                if PROVIDER_SETTINGS.contains(&suffix) {
                    if let Some(value) =
                        value.to_str().ok().map(str::trim).filter(|v| !v.is_empty())
                    {
                        let name = suffix.replace('-', "_");
                        let settings = &mut gw.provider_settings.0;
                        // The x-gw- spelling wins over x-portkey-.
                        match settings.iter().position(|(k, _)| *k == name) {
                            Some(i) if primary => settings[i].1 = value.to_owned(),
                            Some(_) => {}
                            None => settings.push((name, value.to_owned())),
                        }
                    }
                }
                continue;
            };
            if from_primary[index] && !primary {
                continue;
            }
            let Some(value) = value.to_str().ok().map(str::trim).filter(|v| !v.is_empty()) else {
                continue;
            };
            from_primary[index] = primary;
            gw.set(GwHeader::ALL[index], value)?;
        }
        Ok(gw)
    }

    fn set(&mut self, header: GwHeader, value: &str) -> Result<(), GatewayError> {
        let text = Some(value.to_owned());
        match header {
            GwHeader::API_KEY => self.api_key = text,
            GwHeader::PROVIDER => self.provider = text,
            GwHeader::VIRTUAL_KEY => self.virtual_key = text,
            GwHeader::CONFIG => self.config = text,
            GwHeader::CUSTOM_HOST => self.custom_host = text,
            GwHeader::TRACE_ID => self.trace_id = text,
            GwHeader::METADATA => self.metadata = parse_metadata(value)?,
            GwHeader::CACHE_NAMESPACE => self.cache_namespace = text,
            GwHeader::CACHE_FORCE_REFRESH => self.cache_force_refresh = parse_bool(header, value)?,
            GwHeader::REQUEST_TIMEOUT => {
                self.request_timeout_ms = Some(
                    value
                        .parse::<u64>()
                        .ok()
                        .filter(|ms| *ms > 0)
                        .ok_or_else(|| {
                            GatewayError::invalid_param(
                                header.primary,
                                format!(
                            "{} must be a positive integer number of milliseconds, got {value:?}",
                            header.primary
                        ),
                            )
                        })?,
                )
            }
            GwHeader::FORWARD_HEADERS => self.forward_headers = parse_header_list(value)?,
            GwHeader::SPAN_ID => self.span_id = text,
            GwHeader::PARENT_SPAN_ID => self.parent_span_id = text,
            GwHeader::SPAN_NAME => self.span_name = text,
            GwHeader::STRICT_OPENAI_COMPLIANCE => {
                self.strict_openai_compliance = Some(parse_bool(header, value)?)
            }
            _ => {}
        }
        Ok(())
    }
}

fn parse_bool(header: GwHeader, value: &str) -> Result<bool, GatewayError> {
    if value.eq_ignore_ascii_case("true") {
        Ok(true)
    } else if value.eq_ignore_ascii_case("false") {
        Ok(false)
    } else {
        Err(GatewayError::invalid_param(
            header.primary,
            format!("{} must be true or false, got {value:?}", header.primary),
        ))
    }
}

/// `x-gw-metadata`: a JSON object whose values are strings (numbers and booleans are kept as
/// their JSON text; nested values are refused).
fn parse_metadata(raw: &str) -> Result<BTreeMap<String, String>, GatewayError> {
    let param = GwHeader::METADATA.primary;
    let value: serde_json::Value = serde_json::from_str(raw).map_err(|e| {
        GatewayError::invalid_param(param, format!("{param} must be a JSON object: {e}"))
    })?;
    let serde_json::Value::Object(map) = value else {
        return Err(GatewayError::invalid_param(
            param,
            format!("{param} must be a JSON object of strings"),
        ));
    };
    map.into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => Ok((k, s)),
            serde_json::Value::Number(n) => Ok((k, n.to_string())),
            serde_json::Value::Bool(b) => Ok((k, b.to_string())),
            _ => Err(GatewayError::invalid_param(
                format!("{param}.{k}"),
                format!("{param} values must be strings; {k:?} is not"),
            )),
        })
        .collect()
}

/// `x-gw-forward-headers`: a JSON array of names, or a comma-separated list.
fn parse_header_list(raw: &str) -> Result<Vec<String>, GatewayError> {
    let param = GwHeader::FORWARD_HEADERS.primary;
    let names: Vec<String> = if raw.starts_with('[') {
        serde_json::from_str(raw).map_err(|e| {
            GatewayError::invalid_param(param, format!("{param} must be a list of names: {e}"))
        })?
    } else {
        raw.split(',').map(|s| s.trim().to_owned()).collect()
    };
    names
        .into_iter()
        .filter(|n| !n.is_empty())
        .map(|n| {
            HeaderName::from_bytes(n.as_bytes())
                .map(|h| h.as_str().to_owned())
                .map_err(|_| {
                    GatewayError::invalid_param(param, format!("{n:?} is not a header name"))
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn both_prefixes_are_read_and_x_gw_wins() {
        let h = map(&[("x-portkey-provider", "groq"), ("x-portkey-trace-id", "t1")]);
        let gw = GwHeaders::parse(&h).unwrap();
        assert_eq!(gw.provider.as_deref(), Some("groq"));
        assert_eq!(gw.trace_id.as_deref(), Some("t1"));
        let h = map(&[("x-portkey-provider", "groq"), ("x-gw-provider", "openai")]);
        assert_eq!(
            GwHeaders::parse(&h).unwrap().provider.as_deref(),
            Some("openai")
        );
        let h = map(&[("x-gw-provider", "openai"), ("x-portkey-provider", "groq")]);
        assert_eq!(
            GwHeaders::parse(&h).unwrap().provider.as_deref(),
            Some("openai")
        );
    }

    #[test]
    fn provider_settings_are_read_under_both_prefixes_and_hidden_from_debug() {
        let h = map(&[
            ("x-portkey-aws-region", "eu-west-1"),
            ("x-gw-aws-region", "us-east-1"),
            ("x-gw-aws-secret-access-key", "s3cret"),
            ("x-portkey-azure-deployment-id", "dep"),
            ("x-gw-unknown-thing", "x"),
        ]);
        let gw = GwHeaders::parse(&h).unwrap();
        let get = |name: &str| {
            gw.provider_settings
                .0
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("aws_region"), Some("us-east-1"));
        assert_eq!(get("azure_deployment_id"), Some("dep"));
        assert_eq!(get("aws_secret_access_key"), Some("s3cret"));
        assert_eq!(gw.provider_settings.0.len(), 3);
        assert!(!format!("{gw:?}").contains("s3cret"));
    }

    #[test]
    fn metadata_must_be_an_object_of_scalars() {
        let ok = map(&[("x-gw-metadata", r#"{"_user":"ann","tier":3,"beta":true}"#)]);
        let gw = GwHeaders::parse(&ok).unwrap();
        assert_eq!(gw.metadata["_user"], "ann");
        assert_eq!(gw.metadata["tier"], "3");
        assert_eq!(gw.metadata["beta"], "true");
        for bad in ["{not json", "[1,2]", r#"{"a":{"b":1}}"#] {
            let err = GwHeaders::parse(&map(&[("x-gw-metadata", bad)])).unwrap_err();
            assert_eq!(err.status().as_u16(), 400, "{bad}");
            assert!(err.param.unwrap().starts_with("x-gw-metadata"));
        }
    }

    #[test]
    fn timeout_force_refresh_and_forward_headers_are_checked() {
        let h = map(&[
            ("x-gw-request-timeout", "1500"),
            ("x-gw-cache-force-refresh", "TRUE"),
            ("x-gw-forward-headers", "X-Custom-A, x-custom-b"),
        ]);
        let gw = GwHeaders::parse(&h).unwrap();
        assert_eq!(gw.request_timeout_ms, Some(1500));
        assert!(gw.cache_force_refresh);
        assert_eq!(gw.forward_headers, vec!["x-custom-a", "x-custom-b"]);
        let json_list = map(&[("x-gw-forward-headers", r#"["x-a","x-b"]"#)]);
        assert_eq!(
            GwHeaders::parse(&json_list).unwrap().forward_headers,
            vec!["x-a", "x-b"]
        );
        for (name, bad) in [
            ("x-gw-request-timeout", "soon"),
            ("x-gw-request-timeout", "0"),
            ("x-gw-cache-force-refresh", "yes"),
            ("x-gw-forward-headers", "bad header"),
        ] {
            let err = GwHeaders::parse(&map(&[(name, bad)])).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(name), "{name}: {bad}");
        }
    }
}
