//! `default.modelWhitelist` `{models, not = false}`: passes when the model the request names is
//! in the list (with `not`, when it is not). A request that names no model fails (an error).

use serde::Deserialize;
use serde_json::{json, Value};

use plugin_sdk::ConfigIssue;

use super::{params, Outcome};

#[derive(Debug)]
pub struct ModelWhitelist {
    models: Vec<String>,
    not: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelParams {
    models: Vec<String>,
    #[serde(default)]
    not: bool,
}

impl ModelWhitelist {
    pub fn parse(p: &Value) -> Result<Self, ConfigIssue> {
        let p: ModelParams = params(p)?;
        if p.models.is_empty() {
            return Err(ConfigIssue::new("models", "must hold at least one model"));
        }
        Ok(ModelWhitelist {
            models: p.models,
            not: p.not,
        })
    }

    pub fn run(&self, model: Option<&str>) -> Outcome {
        let Some(model) = model else {
            return Outcome::error(
                "the request names no model",
                json!({"allowedModels": self.models, "not": self.not}),
            );
        };
        let listed = self.models.iter().any(|m| m == model);
        Outcome::of(
            listed != self.not,
            json!({
                "requestedModel": model,
                "allowedModels": self.models,
                "not": self.not,
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn listed_models_pass() {
        // The test input's model is `gpt-test`.
        let c = parse("default.modelWhitelist", json!({"models": ["gpt-test"]}));
        assert!(run(&c, "").verdict);
        let c = parse("default.modelWhitelist", json!({"models": ["other"]}));
        let out = run(&c, "");
        assert!(!out.verdict);
        assert_eq!(out.data["requestedModel"], "gpt-test");
        let c = parse(
            "default.modelWhitelist",
            json!({"models": ["gpt-test"], "not": true}),
        );
        assert!(!run(&c, "").verdict);
        let Check::ModelWhitelist(m) = parse("default.modelWhitelist", json!({"models": ["a"]}))
        else {
            unreachable!()
        };
        assert!(m.run(None).error.is_some());
        assert_eq!(
            issue("default.modelWhitelist", json!({"models": []})).0,
            "models"
        );
    }

    use super::super::Check;
}
