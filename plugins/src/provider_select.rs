//! `provider_select`: decides where a request goes from its headers.
//!
//! Exactly one of the four ways of the spec must be used:
//! 1. `x-gw-provider: @slug` (or the legacy `x-gw-virtual-key: slug`): a saved provider.
//! 2. `x-gw-provider: <id>` with `Authorization: Bearer <provider key>`.
//! 3. `x-gw-config`: an inline JSON config, or the id/slug of a saved config.
//! 4. `x-gw-custom-host` with `x-gw-provider: <id>` and `Authorization: Bearer <provider key>`.
//!
//! None, or two at once, is a 400 that says which headers to send. Runs in `on_request`; the
//! result is `RequestCx::plan`, which the router executes.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

use plugin_sdk::headers::GwHeader;
use plugin_sdk::store::{unknown_provider, ConfigStore, ProviderStore};
use plugin_sdk::{
    BuildCx, Flow, GatewayError, Phases, Plugin, PluginFactory, Principal, RequestCx, RoutePlan,
    Target,
};

/// `provider_select` takes no settings.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ProviderSelectConfig {}

pub struct ProviderSelect {
    providers: Arc<dyn ProviderStore>,
    configs: Arc<dyn ConfigStore>,
}

pub struct ProviderSelectFactory;

impl PluginFactory for ProviderSelectFactory {
    const KIND: &'static str = "provider_select";
    const SUMMARY: &'static str =
        "Chooses the provider from x-gw-provider, x-gw-virtual-key, x-gw-config or x-gw-custom-host";
    const EXAMPLE: &'static str = "- kind: provider_select";
    type Config = ProviderSelectConfig;

    fn build(_config: Self::Config, cx: &BuildCx) -> Result<Arc<dyn Plugin>, String> {
        Ok(Arc::new(ProviderSelect {
            providers: cx.providers.clone(),
            configs: cx.configs.clone(),
        }))
    }
}

plugin_sdk::register_plugin!(ProviderSelectFactory);

const HOW: &str = "send exactly one of: x-gw-provider: @<slug> (or x-gw-virtual-key: <slug>); \
x-gw-provider: <provider id> with Authorization: Bearer <key>; x-gw-config: <JSON or config id>; \
x-gw-custom-host: <url> with x-gw-provider: <provider id> and Authorization: Bearer <key>";

impl ProviderSelect {
    /// The plan from the headers alone, without consulting any default.
    pub fn plan(&self, cx: &RequestCx) -> Result<RoutePlan, GatewayError> {
        let gw = &cx.gw;
        let saved_ref = gw.provider.as_deref().and_then(|p| p.strip_prefix('@'));
        let provider_id = gw.provider.as_deref().filter(|p| !p.starts_with('@'));

        let mut ways = Vec::new();
        if saved_ref.is_some() {
            ways.push(GwHeader::PROVIDER.primary.to_owned() + ": @<slug>");
        }
        if gw.virtual_key.is_some() {
            ways.push(GwHeader::VIRTUAL_KEY.primary.to_owned());
        }
        if gw.config.is_some() {
            ways.push(GwHeader::CONFIG.primary.to_owned());
        }
        if gw.custom_host.is_some() {
            ways.push(GwHeader::CUSTOM_HOST.primary.to_owned());
        } else if provider_id.is_some() {
            ways.push(GwHeader::PROVIDER.primary.to_owned() + ": <provider id>");
        }
        if (saved_ref.is_some() || gw.virtual_key.is_some()) && gw.custom_host.is_some() {
            return Err(GatewayError::invalid_param(
                GwHeader::CUSTOM_HOST.primary,
                "a saved provider's key goes only to the host saved with it: send \
                 x-gw-custom-host with x-gw-provider: <provider id> and your own key instead",
            ));
        }
        match ways.len() {
            0 => return Err(no_provider("no provider was selected")),
            1 => {}
            _ => {
                return Err(no_provider(&format!(
                    "only one way of selecting a provider may be used, got {}",
                    ways.join(" and ")
                )))
            }
        }

        let who = cx.extensions.get::<Principal>();
        if let Some(slug) = saved_ref.or(gw.virtual_key.as_deref()) {
            let header = if saved_ref.is_some() {
                GwHeader::PROVIDER.primary
            } else {
                GwHeader::VIRTUAL_KEY.primary
            };
            // Not found and not the caller's answer alike: nothing tells that a slug exists
            // in another workspace.
            let record = self
                .providers
                .provider_for(slug, who)
                .ok_or_else(|| unknown_provider(header, slug))?;
            let mut target = Target::from_record(&record);
            target.api_key = target.api_key.or_else(|| bearer(cx));
            return Ok(RoutePlan::Single(target));
        }

        if let Some(raw) = gw.config.as_deref() {
            let config = if raw.starts_with('{') {
                serde_json::from_str::<Value>(raw)
                    .map(Arc::new)
                    .map_err(|e| {
                        GatewayError::invalid_param(
                            GwHeader::CONFIG.primary,
                            format!("x-gw-config is not valid JSON: {e}"),
                        )
                    })?
            } else {
                self.configs.config_for(raw, who).ok_or_else(|| {
                    GatewayError::invalid_param(
                        GwHeader::CONFIG.primary,
                        format!("no saved config has the id {raw:?}"),
                    )
                })?
            };
            // Every saved provider the config names, at any depth, before any other plugin
            // reads the plan (a limit counted against another workspace's provider would tell
            // it exists) and before anything is sent (not after a first fallback target).
            if let Some(slug) = plugin_sdk::target::saved_slugs(&config)
                .into_iter()
                .find(|slug| self.providers.provider_for(slug, who).is_none())
            {
                return Err(unknown_provider(GwHeader::CONFIG.primary, slug).with_code("AB01"));
            }
            return Ok(RoutePlan::Config(config));
        }

        let Some(provider) = provider_id else {
            return Err(GatewayError::invalid_param(
                GwHeader::PROVIDER.primary,
                "x-gw-custom-host needs x-gw-provider naming the provider whose format the host speaks",
            ));
        };
        Ok(RoutePlan::Single(Target {
            provider: provider.to_owned(),
            api_key: bearer(cx),
            custom_host: gw.custom_host.clone(),
            ..Target::default()
        }))
    }
}

#[async_trait]
impl Plugin for ProviderSelect {
    fn kind(&self) -> &'static str {
        ProviderSelectFactory::KIND
    }

    fn phases(&self) -> Phases {
        Phases::REQUEST
    }

    async fn on_request(&self, cx: &mut RequestCx) -> Result<Flow, GatewayError> {
        // An earlier plugin (an API key's default config, say) may already have decided.
        if cx.plan.is_none() {
            cx.plan = Some(self.plan(cx)?);
        }
        Ok(Flow::Continue)
    }
}

fn no_provider(what: &str) -> GatewayError {
    GatewayError::invalid_param(GwHeader::PROVIDER.primary, format!("{what}: {HOW}"))
}

/// The key of `Authorization: Bearer <key>`.
fn bearer(cx: &RequestCx) -> Option<String> {
    let value = cx.headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.trim().split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !key.trim().is_empty()).then(|| key.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_sdk::headers::GwHeaders;
    use plugin_sdk::store::ProviderRecord;
    use plugin_sdk::Route;
    use std::collections::BTreeMap;

    struct Saved;
    impl ProviderStore for Saved {
        fn provider(&self, slug: &str) -> Option<Arc<ProviderRecord>> {
            if slug == "theirs" {
                return Some(Arc::new(ProviderRecord {
                    slug: "theirs".into(),
                    provider: "openai".into(),
                    owner: Some(plugin_sdk::store::Owner {
                        organisation_id: "org".into(),
                        workspace_id: "ws-b".into(),
                    }),
                    ..ProviderRecord::default()
                }));
            }
            (slug == "prod").then(|| {
                Arc::new(ProviderRecord {
                    slug: "prod".into(),
                    provider: "groq".into(),
                    api_key: Some("saved-key".into()),
                    custom_host: None,
                    settings: BTreeMap::new(),
                    ..ProviderRecord::default()
                })
            })
        }
    }
    impl ConfigStore for Saved {
        fn config(&self, id: &str) -> Option<Arc<Value>> {
            (id == "pc-1").then(|| Arc::new(serde_json::json!({"provider": "openai"})))
        }
    }

    fn plan(pairs: &[(&str, &str)]) -> Result<RoutePlan, GatewayError> {
        let mut cx = RequestCx::new(
            "t".into(),
            Route::ChatCompletions,
            http::Method::POST,
            "/".into(),
        );
        for (k, v) in pairs {
            cx.headers.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        cx.gw = GwHeaders::parse(&cx.headers)?;
        let p = ProviderSelect {
            providers: Arc::new(Saved),
            configs: Arc::new(Saved),
        };
        p.plan(&cx)
    }

    /// Another workspace's provider, named anywhere in a config, is refused as an unknown one
    /// before any later plugin (a rate limit, a budget) reads the plan.
    #[test]
    fn a_config_naming_another_workspaces_provider_is_refused_at_once() {
        let mut cx = RequestCx::new(
            "t".into(),
            Route::ChatCompletions,
            http::Method::POST,
            "/".into(),
        );
        let nested = r#"{"strategy":{"mode":"fallback"},"targets":[{"provider":"@prod"},
            {"targets":[{"provider":"@theirs"}]}]}"#;
        cx.headers
            .insert("x-gw-config", nested.replace('\n', " ").parse().unwrap());
        cx.gw = GwHeaders::parse(&cx.headers).unwrap();
        cx.extensions.insert(plugin_sdk::Principal {
            method: plugin_sdk::access::AuthMethod::Jwt,
            organisation_id: Some("org".into()),
            workspace_id: Some("ws-a".into()),
            api_key_id: None,
            user_id: None,
            scopes: Vec::new(),
            rate_limits: Vec::new(),
            budgets: Vec::new(),
        });
        let p = ProviderSelect {
            providers: Arc::new(Saved),
            configs: Arc::new(Saved),
        };
        let err = p.plan(&cx).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("x-gw-config"));
        assert_eq!(err.message, "no saved provider has the slug \"theirs\"");
        // The owner's workspace may.
        if let Some(who) = cx.extensions.get_mut::<plugin_sdk::Principal>() {
            who.workspace_id = Some("ws-b".into());
        }
        assert!(p.plan(&cx).is_ok());
    }

    fn single(plan: RoutePlan) -> Target {
        match plan {
            RoutePlan::Single(t) => t,
            other => panic!("expected a single target, got {other:?}"),
        }
    }

    #[test]
    fn the_four_ways() {
        let t = single(plan(&[("x-gw-provider", "@prod")]).unwrap());
        assert_eq!(
            (t.provider.as_str(), t.api_key.as_deref()),
            ("groq", Some("saved-key"))
        );
        assert_eq!(t.slug.as_deref(), Some("prod"));

        let t = single(plan(&[("x-gw-virtual-key", "prod")]).unwrap());
        assert_eq!(t.provider, "groq");

        let t = single(
            plan(&[
                ("x-gw-provider", "openai"),
                ("authorization", "Bearer sk-1"),
            ])
            .unwrap(),
        );
        assert_eq!(
            (t.provider.as_str(), t.api_key.as_deref()),
            ("openai", Some("sk-1"))
        );
        assert_eq!(t.custom_host, None);

        match plan(&[("x-gw-config", r#"{"provider":"openai","api_key":"k"}"#)]).unwrap() {
            RoutePlan::Config(c) => assert_eq!(c["api_key"], "k"),
            other => panic!("{other:?}"),
        }
        match plan(&[("x-portkey-config", "pc-1")]).unwrap() {
            RoutePlan::Config(c) => assert_eq!(c["provider"], "openai"),
            other => panic!("{other:?}"),
        }

        let t = single(
            plan(&[
                ("x-gw-custom-host", "http://10.0.0.1:8000/v1"),
                ("x-gw-provider", "openai"),
                ("authorization", "Bearer sk-2"),
            ])
            .unwrap(),
        );
        assert_eq!(t.custom_host.as_deref(), Some("http://10.0.0.1:8000/v1"));
        assert_eq!(t.api_key.as_deref(), Some("sk-2"));
    }

    #[test]
    fn none_or_two_ways_is_a_400_that_says_what_to_send() {
        let err = plan(&[]).unwrap_err();
        assert_eq!(err.status().as_u16(), 400);
        assert!(err.message.contains("x-gw-virtual-key"), "{}", err.message);

        let err = plan(&[("x-gw-provider", "@prod"), ("x-gw-config", "pc-1")]).unwrap_err();
        assert!(err.message.contains("only one way"), "{}", err.message);

        let err = plan(&[("x-gw-provider", "openai"), ("x-gw-virtual-key", "prod")]).unwrap_err();
        assert_eq!(err.status().as_u16(), 400);

        let err = plan(&[("x-gw-custom-host", "http://h/v1")]).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("x-gw-provider"));

        let err = plan(&[("x-gw-provider", "@nope")]).unwrap_err();
        assert!(err.message.contains("nope"));

        let err = plan(&[("x-gw-config", "{broken")]).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("x-gw-config"));
        let err = plan(&[("x-gw-config", "pc-unknown")]).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("x-gw-config"));
    }
}
