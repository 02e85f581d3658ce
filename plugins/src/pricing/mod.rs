//! The price of an answer: a per-model table of US dollars per million input (prompt) and
//! output (completion) tokens, shipped with the gateway (`prices.json`, as published by the
//! providers, 2026) and overridable in YAML per provider or per saved provider (slug).
//!
//! Used by the `usage_limit` plugin to estimate a request's cost before it is sent and to price
//! it once the provider reported its usage; other plugins may price with
//! [`PriceTable::shipped`] too. A saved provider's own prices (its integration's priced
//! models, `ProviderRecord::model_prices`) come before any table: [`listed_price`] finds a
//! model among them the same way.
//!
//! A model is found in this order, the first hit winning:
//! 1. the provider's row for exactly that model;
//! 2. the provider's longest row that the model extends by a version: `@...` or `:...`, or
//!    `-`/`_` followed by a digit, `v<digit>`, `latest`, `preview`, `exp`, `beta` or `alpha`
//!    (`gpt-4o-2024-08-06` -> `gpt-4o`; `claude-3-5-sonnet-v2@20241022` -> `claude-3-5-sonnet`;
//!    `mistral-large-latest` -> `mistral-large`; but `gpt-4o-mini` is not a `gpt-4o`);
//! 3. the same two steps over every provider's rows (a provider without rows of its own,
//!    `azure-openai` or `openrouter`, serving a known model), the first row in table order
//!    winning when several providers list a model.
//!
//! Each step is tried with the model as given, then without a Bedrock cross-region prefix
//! (`us.anthropic.claude...`), then without a vendor path (`openai/gpt-4o` -> `gpt-4o`).
//! Names compare case-insensitively; a leading `models/` (Gemini) is ignored.

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use serde::Deserialize;

use plugin_sdk::store::ModelPrice;
use plugin_sdk::{ConfigIssue, FastMap, Usage};

/// The shipped table: see `prices.json`.
const SHIPPED: &str = include_str!("prices.json");

/// US dollars per million tokens of one model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    pub input_per_million: f64,
    pub output_per_million: f64,
}

impl Price {
    /// The cost of `usage` in US dollars.
    pub fn cost(&self, usage: Usage) -> f64 {
        (usage.prompt_tokens as f64 * self.input_per_million
            + usage.completion_tokens as f64 * self.output_per_million)
            / 1_000_000.0
    }
}

/// One row of a price table as written: in `prices.json` (with `provider`) or in the
/// `usage_limit` plugin's YAML `prices:` (with `provider` or `slug`).
///
/// ```yaml
/// prices:
///   - {provider: openai, model: gpt-4o, input_per_million: 2.5, output_per_million: 10}
///   - {slug: my-azure, model: gpt-4o, input_per_million: 2.75, output_per_million: 11}
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceOverride {
    /// A provider id (`openai`, `bedrock`...): the row replaces the shipped one of that
    /// provider and model, or adds one.
    #[serde(default)]
    pub provider: Option<String>,
    /// A saved provider's slug (`x-gw-provider: @slug`): the row applies to requests through
    /// that saved provider only, before any provider row.
    #[serde(default)]
    pub slug: Option<String>,
    /// The model id, or a prefix of dated ids (`gpt-4o` prices `gpt-4o-2024-08-06`).
    pub model: String,
    pub input_per_million: f64,
    pub output_per_million: f64,
}

impl PriceOverride {
    /// What is wrong with this row; `path` is where it was written (`prices[2]`).
    pub fn issues(&self, path: &str) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        match (&self.provider, &self.slug) {
            (Some(_), Some(_)) => issues.push(ConfigIssue::new(
                path,
                "give either `provider` or `slug`, not both",
            )),
            (None, None) => issues.push(ConfigIssue::new(
                path,
                "give `provider` (a provider id) or `slug` (a saved provider)",
            )),
            (Some(p), None) if p.trim().is_empty() => issues.push(ConfigIssue::new(
                format!("{path}.provider"),
                "must not be empty",
            )),
            (None, Some(s)) if s.trim().is_empty() => issues.push(ConfigIssue::new(
                format!("{path}.slug"),
                "must not be empty",
            )),
            _ => {}
        }
        if self.model.trim().is_empty() {
            issues.push(ConfigIssue::new(
                format!("{path}.model"),
                "must not be empty",
            ));
        }
        for (field, value) in [
            ("input_per_million", self.input_per_million),
            ("output_per_million", self.output_per_million),
        ] {
            if !value.is_finite() || value < 0.0 {
                issues.push(ConfigIssue::new(
                    format!("{path}.{field}"),
                    format!("must be a number of US dollars, 0 or more, got {value}"),
                ));
            }
        }
        issues
    }

    fn price(&self) -> Price {
        Price {
            input_per_million: self.input_per_million,
            output_per_million: self.output_per_million,
        }
    }
}

#[derive(Deserialize)]
struct ShippedFile {
    prices: Vec<PriceOverride>,
}

/// The rows of one provider (or saved provider, or all of them), indexed for lookup.
#[derive(Debug, Default, Clone)]
struct Models {
    exact: FastMap<String, Price>,
    /// Longest first, so the first prefix that matches is the longest.
    prefixes: Vec<(String, Price)>,
}

impl Models {
    fn insert(&mut self, model: &str, price: Price, replace: bool) {
        let model = model.trim().to_ascii_lowercase();
        if !replace && self.exact.contains_key(&model) {
            return;
        }
        self.exact.insert(model, price);
    }

    fn finish(&mut self) {
        self.prefixes = self.exact.iter().map(|(m, p)| (m.clone(), *p)).collect();
        // Longest first; ties by name so that lookups are deterministic.
        self.prefixes
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    }

    fn find(&self, model: &str) -> Option<Price> {
        if let Some(p) = self.exact.get(model) {
            return Some(*p);
        }
        self.prefixes
            .iter()
            .find(|(prefix, _)| {
                model
                    .strip_prefix(prefix.as_str())
                    .is_some_and(is_version_suffix)
            })
            .map(|(_, p)| *p)
    }
}

/// Per-model prices: the shipped table with the YAML's overrides applied.
#[derive(Debug, Clone, Default)]
pub struct PriceTable {
    /// Provider rows in table order (overrides replace in place or append).
    rows: Vec<(String, String, Price)>,
    by_provider: FastMap<String, Models>,
    by_slug: FastMap<String, Models>,
    any_provider: Models,
    /// Answers of [`price`](Self::price) already looked up: every request is priced, and a
    /// model without a row would otherwise scan every prefix row each time.
    found: Found,
}

/// Remembered lookups by provider, then model; bounded so that clients sending ever new model
/// names cannot grow it (past the bound, lookups are simply not remembered).
#[derive(Debug, Default)]
struct Found(RwLock<FastMap<String, FastMap<String, Option<Price>>>>);

impl Found {
    const MAX_ENTRIES: usize = 4096;

    fn get(&self, provider: &str, model: &str) -> Option<Option<Price>> {
        let found = self.0.read().ok()?;
        found.get(provider)?.get(model).copied()
    }

    fn remember(&self, provider: &str, model: &str, price: Option<Price>) {
        let Ok(mut found) = self.0.write() else {
            return;
        };
        if found.values().map(HashMap::len).sum::<usize>() >= Self::MAX_ENTRIES {
            return;
        }
        found
            .entry(provider.to_owned())
            .or_default()
            .insert(model.to_owned(), price);
    }
}

/// A copy of a table starts with nothing remembered (it may be given other rows).
impl Clone for Found {
    fn clone(&self) -> Self {
        Found::default()
    }
}

impl PriceTable {
    /// The table shipped with the gateway: a copy of [`shipped_ref`](Self::shipped_ref), to
    /// apply overrides to. Build it once, not per request.
    pub fn shipped() -> PriceTable {
        Self::shipped_ref().clone()
    }

    /// The table shipped with the gateway, parsed at the first call and shared.
    pub fn shipped_ref() -> &'static PriceTable {
        static SHIPPED_TABLE: OnceLock<PriceTable> = OnceLock::new();
        SHIPPED_TABLE.get_or_init(|| {
            // The file is part of the source and checked by a unit test: it always parses.
            let file: ShippedFile = serde_json::from_str(SHIPPED).unwrap_or_else(|e| {
                tracing::error!(error = %e, "the shipped price table is unreadable");
                ShippedFile { prices: Vec::new() }
            });
            let rows = file
                .prices
                .iter()
                .filter_map(|r| Some((r.provider.clone()?, r.model.clone(), r.price())))
                .collect();
            PriceTable::from_rows(rows, HashMap::new())
        })
    }

    /// This table with `overrides` applied: a provider row replaces the row of the same
    /// provider and model (or is added); a slug row applies to that saved provider only.
    /// Rows with neither (refused by validation) are ignored.
    pub fn with_overrides(self, overrides: &[PriceOverride]) -> PriceTable {
        let mut rows = self.rows;
        let mut slugs: HashMap<String, Vec<(String, Price)>> = HashMap::new();
        for (slug, models) in &self.by_slug {
            slugs.insert(
                slug.clone(),
                models.exact.iter().map(|(m, p)| (m.clone(), *p)).collect(),
            );
        }
        for o in overrides {
            let model = o.model.trim().to_ascii_lowercase();
            match (&o.provider, &o.slug) {
                (Some(provider), None) => {
                    let provider = provider.trim().to_ascii_lowercase();
                    match rows
                        .iter_mut()
                        .find(|(p, m, _)| *p == provider && m.to_ascii_lowercase() == model)
                    {
                        Some(row) => row.2 = o.price(),
                        None => rows.push((provider, model, o.price())),
                    }
                }
                (None, Some(slug)) => slugs
                    .entry(slug.trim().to_owned())
                    .or_default()
                    .push((model, o.price())),
                _ => {}
            }
        }
        PriceTable::from_rows(rows, slugs)
    }

    fn from_rows(
        rows: Vec<(String, String, Price)>,
        slugs: HashMap<String, Vec<(String, Price)>>,
    ) -> PriceTable {
        let mut by_provider: FastMap<String, Models> = FastMap::default();
        let mut any_provider = Models::default();
        for (provider, model, price) in &rows {
            by_provider
                .entry(provider.to_ascii_lowercase())
                .or_default()
                .insert(model, *price, true);
            // The first provider listing a model prices it for providers without rows.
            any_provider.insert(model, *price, false);
        }
        by_provider.values_mut().for_each(Models::finish);
        any_provider.finish();
        let by_slug = slugs
            .into_iter()
            .map(|(slug, models)| {
                let mut m = Models::default();
                for (model, price) in models {
                    m.insert(&model, price, true);
                }
                m.finish();
                (slug, m)
            })
            .collect();
        PriceTable {
            rows,
            by_provider,
            by_slug,
            any_provider,
            found: Found::default(),
        }
    }

    /// The price of `model` served by `provider` (a provider id), by the lookup order of the
    /// module doc; `None` when no row matches.
    pub fn price(&self, provider: &str, model: &str) -> Option<Price> {
        if let Some(price) = self.found.get(provider, model) {
            return price;
        }
        let price = self.look_up(provider, model);
        self.found.remember(provider, model, price);
        price
    }

    fn look_up(&self, provider: &str, model: &str) -> Option<Price> {
        let names = candidates(model);
        if let Some(models) = self.by_provider.get(&provider.trim().to_ascii_lowercase()) {
            if let Some(p) = names.iter().find_map(|m| models.find(m)) {
                return Some(p);
            }
        }
        names.iter().find_map(|m| self.any_provider.find(m))
    }

    /// The price through a saved provider: its slug's rows first, then [`price`](Self::price).
    pub fn price_for_target(
        &self,
        slug: Option<&str>,
        provider: &str,
        model: &str,
    ) -> Option<Price> {
        if let Some(models) = slug.and_then(|s| self.by_slug.get(s)) {
            if let Some(p) = candidates(model).iter().find_map(|m| models.find(m)) {
                return Some(p);
            }
        }
        self.price(provider, model)
    }

    /// The cost of `usage` in US dollars; `None` when the model has no price.
    pub fn cost(&self, provider: &str, model: &str, usage: Usage) -> Option<f64> {
        self.price(provider, model).map(|p| p.cost(usage))
    }

    /// The cost of `usage` through a saved provider (`slug`), whose own rows win.
    pub fn cost_for_target(
        &self,
        slug: Option<&str>,
        provider: &str,
        model: &str,
        usage: Usage,
    ) -> Option<f64> {
        self.price_for_target(slug, provider, model)
            .map(|p| p.cost(usage))
    }

    /// How many provider rows the table has.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// The price of `model` among a saved provider's own per-model prices (its integration's
/// priced models, [`ModelPrice`]), found as in a price table: the exact model first, then the
/// longest listed model it extends by a version (`gpt-4o` prices `gpt-4o-2024-08-06`), with the
/// model as given, without a Bedrock cross-region prefix, then without a vendor path; names
/// compare case-insensitively. `None` when no row matches. The rows are one integration's
/// (a few, usually): they are scanned, without allocating, rather than indexed.
pub fn listed_price(rows: &[ModelPrice], model: &str) -> Option<Price> {
    if rows.is_empty() {
        return None;
    }
    let price = |r: &ModelPrice| Price {
        input_per_million: r.input_per_million,
        output_per_million: r.output_per_million,
    };
    candidates(model).iter().find_map(|name| {
        if let Some(r) = rows
            .iter()
            .find(|r| r.model.trim().eq_ignore_ascii_case(name))
        {
            return Some(price(r));
        }
        let mut best: Option<(usize, &ModelPrice)> = None;
        for r in rows {
            let listed = r.model.trim();
            // `name` is lowercase; `get` refuses a cut inside a character.
            let extends = !listed.is_empty()
                && name
                    .get(..listed.len())
                    .is_some_and(|head| head.eq_ignore_ascii_case(listed))
                && is_version_suffix(&name[listed.len()..]);
            // The longest prefix; the first listed among equals.
            if extends && best.is_none_or(|(len, _)| listed.len() > len) {
                best = Some((listed.len(), r));
            }
        }
        best.map(|(_, r)| price(r))
    })
}

/// Whether `rest`, what follows a row's model name, names a version of that model rather than
/// another model (`-2024-08-06`, `@20241022`, `-v1:0`, `-latest`; not `-mini`).
fn is_version_suffix(rest: &str) -> bool {
    let mut chars = rest.chars();
    match chars.next() {
        Some('@' | ':') => true,
        Some('-' | '_') => {
            let tail = chars.as_str();
            let mut t = tail.chars();
            match t.next() {
                Some(c) if c.is_ascii_digit() => true,
                Some('v') => t.next().is_some_and(|c| c.is_ascii_digit()),
                Some(_) => {
                    let word = tail.split(['-', '_', '@', ':']).next().unwrap_or_default();
                    matches!(word, "latest" | "preview" | "exp" | "beta" | "alpha")
                }
                None => false,
            }
        }
        _ => false,
    }
}

/// The names a model is looked up by, most specific first.
fn candidates(model: &str) -> Vec<String> {
    let mut name = model.trim().to_ascii_lowercase();
    if let Some(rest) = name.strip_prefix("models/") {
        name = rest.to_owned();
    }
    let mut names = vec![name.clone()];
    // Bedrock cross-region inference profiles: `us.anthropic.claude-3-5-sonnet-...`.
    for region in [
        "us.", "eu.", "apac.", "us-gov.", "global.", "jp.", "au.", "ca.",
    ] {
        if let Some(rest) = name.strip_prefix(region) {
            if rest.contains('.') {
                names.push(rest.to_owned());
            }
        }
    }
    // A vendor path (`openai/gpt-4o`, `@openai/gpt-4o`): the model after it.
    if let Some((_, last)) = name.rsplit_once('/') {
        if !last.is_empty() {
            names.push(last.to_owned());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(prompt: u64, completion: u64) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
        }
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-12)
    }

    #[test]
    fn lookups_are_remembered_up_to_a_bound() {
        let table = PriceTable::shipped();
        let first = table.price("openai", "gpt-4o-2024-08-06");
        assert!(first.is_some());
        assert_eq!(table.found.get("openai", "gpt-4o-2024-08-06"), Some(first));
        assert_eq!(table.price("openai", "gpt-4o-2024-08-06"), first);
        assert_eq!(table.price("openai", "no-such-model"), None);
        assert_eq!(table.found.get("openai", "no-such-model"), Some(None));
        for i in 0..Found::MAX_ENTRIES + 10 {
            table.price("openai", &format!("model-{i}"));
        }
        let remembered: usize = table
            .found
            .0
            .read()
            .unwrap()
            .values()
            .map(HashMap::len)
            .sum();
        assert_eq!(remembered, Found::MAX_ENTRIES);
        // Past the bound, answers are still right, just not remembered.
        assert_eq!(
            table.price("openai", "gpt-4o"),
            table.look_up("openai", "gpt-4o")
        );
        assert!(table.clone().found.0.read().unwrap().is_empty());
    }

    #[test]
    fn the_shipped_table_parses_and_is_complete() {
        let file: ShippedFile = serde_json::from_str(SHIPPED).expect("prices.json parses");
        assert!(file.prices.len() >= 40, "{} rows", file.prices.len());
        for (i, row) in file.prices.iter().enumerate() {
            assert!(row.provider.is_some(), "row {i} names no provider");
            assert!(row.slug.is_none(), "row {i} names a slug");
            assert_eq!(row.issues(&format!("prices[{i}]")), Vec::new(), "row {i}");
        }
        let table = PriceTable::shipped();
        assert_eq!(table.len(), file.prices.len());
        for provider in [
            "openai",
            "anthropic",
            "google",
            "vertex-ai",
            "bedrock",
            "mistral-ai",
            "groq",
            "cohere",
            "deepseek",
        ] {
            assert!(
                table.by_provider.contains_key(provider),
                "no rows for {provider}"
            );
        }
    }

    #[test]
    fn cost_is_per_million_tokens() {
        let table = PriceTable::shipped();
        // gpt-4o: 2.5 in, 10 out.
        assert!(close(
            table.cost("openai", "gpt-4o", usage(1_000_000, 0)),
            2.5
        ));
        assert!(close(
            table.cost("openai", "gpt-4o", usage(2_000, 500)),
            (2_000.0 * 2.5 + 500.0 * 10.0) / 1e6
        ));
        assert!(close(table.cost("openai", "gpt-4o", usage(0, 0)), 0.0));
    }

    #[test]
    fn dated_models_take_the_longest_prefix_and_exact_rows_win() {
        let table = PriceTable::shipped();
        let mini = table.price("openai", "gpt-4o-mini").unwrap();
        assert_eq!(table.price("openai", "gpt-4o-mini-2024-07-18"), Some(mini));
        let four_o = table.price("openai", "gpt-4o").unwrap();
        assert_eq!(table.price("openai", "gpt-4o-2024-08-06"), Some(four_o));
        // An exact dated row beats its prefix.
        assert_eq!(
            table
                .price("openai", "gpt-4o-2024-05-13")
                .unwrap()
                .input_per_million,
            5.0
        );
        // Only a version extends a row: `gpt-4` does not price `gpt-4o-x`, `command-r` does
        // not price `command-r7b`, `gpt-4o` does not price an unknown `gpt-4o-future`.
        assert_eq!(table.price("openai", "gpt-4o-future"), None);
        assert_eq!(table.price("openai", "gpt-4o-latest"), Some(four_o));
        assert_eq!(
            table.price("mistral-ai", "mistral-large-2411"),
            table.price("mistral-ai", "mistral-large")
        );
        assert_eq!(
            table.price("x-ai", "grok-3-mini-beta"),
            table.price("x-ai", "grok-3-mini")
        );
        assert_eq!(
            table
                .price("cohere", "command-r7b-12-2024")
                .unwrap()
                .input_per_million,
            0.0375
        );
        assert_eq!(table.price("openai", "gpt-4omni"), None);
        // Case does not matter.
        assert_eq!(table.price("OpenAI", "GPT-4o"), Some(four_o));
    }

    #[test]
    fn providers_without_rows_price_by_model() {
        let table = PriceTable::shipped();
        let four_o = table.price("openai", "gpt-4o").unwrap();
        assert_eq!(
            table.price("azure-openai", "gpt-4o-2024-11-20"),
            Some(four_o)
        );
        assert_eq!(table.price("", "gpt-4o"), Some(four_o));
        // A vendor path and Gemini's `models/` are stripped.
        assert_eq!(table.price("openrouter", "openai/gpt-4o"), Some(four_o));
        assert_eq!(
            table.price("google", "models/gemini-2.5-flash"),
            table.price("google", "gemini-2.5-flash")
        );
        // A provider's own row beats another provider's: Vertex prices Gemini 2.0 Flash its way.
        assert_ne!(
            table.price("vertex-ai", "gemini-2.0-flash-001"),
            table.price("google", "gemini-2.0-flash-001")
        );
        // Bedrock ids, with and without a cross-region prefix.
        let haiku = table.price("bedrock", "anthropic.claude-3-haiku").unwrap();
        assert_eq!(
            table.price("bedrock", "anthropic.claude-3-haiku-20240307-v1:0"),
            Some(haiku)
        );
        assert_eq!(
            table.price("bedrock", "us.anthropic.claude-3-haiku-20240307-v1:0"),
            Some(haiku)
        );
        // Claude on Vertex: `claude-3-5-sonnet-v2@20241022`.
        assert!(table
            .price("vertex-ai", "claude-3-5-sonnet-v2@20241022")
            .is_some());
        assert_eq!(table.price("openai", "no-such-model"), None);
        assert_eq!(table.cost("openai", "no-such-model", usage(10, 10)), None);
    }

    #[test]
    fn overrides_replace_add_and_apply_per_slug() {
        let overrides = vec![
            PriceOverride {
                provider: Some("openai".into()),
                slug: None,
                model: "gpt-4o".into(),
                input_per_million: 1.0,
                output_per_million: 2.0,
            },
            PriceOverride {
                provider: Some("acme".into()),
                slug: None,
                model: "acme-1".into(),
                input_per_million: 3.0,
                output_per_million: 3.0,
            },
            PriceOverride {
                provider: None,
                slug: Some("my-azure".into()),
                model: "gpt-4o".into(),
                input_per_million: 7.0,
                output_per_million: 7.0,
            },
        ];
        let shipped = PriceTable::shipped();
        let table = shipped.clone().with_overrides(&overrides);
        assert_eq!(table.len(), shipped.len() + 1);
        assert_eq!(
            table
                .price("openai", "gpt-4o-2024-08-06")
                .unwrap()
                .input_per_million,
            1.0
        );
        // The replaced row also prices providers without rows.
        assert_eq!(
            table
                .price("azure-openai", "gpt-4o")
                .unwrap()
                .input_per_million,
            1.0
        );
        assert!(close(
            table.cost("acme", "acme-1-preview", usage(1_000_000, 1_000_000)),
            6.0
        ));
        // Through the saved provider, its own row wins; other slugs and no slug do not see it.
        assert!(close(
            table.cost_for_target(
                Some("my-azure"),
                "azure-openai",
                "gpt-4o",
                usage(1_000_000, 0)
            ),
            7.0
        ));
        assert!(close(
            table.cost_for_target(Some("other"), "azure-openai", "gpt-4o", usage(1_000_000, 0)),
            1.0
        ));
        assert!(close(
            table.cost_for_target(None, "openai", "gpt-4o", usage(1_000_000, 0)),
            1.0
        ));
        // A slug row for another model falls through to the provider's rows.
        assert!(close(
            table.cost_for_target(
                Some("my-azure"),
                "openai",
                "gpt-4o-mini",
                usage(1_000_000, 0)
            ),
            0.15
        ));
        // A slug row prices the dated versions of its model.
        assert!(close(
            table.cost_for_target(
                Some("my-azure"),
                "azure-openai",
                "gpt-4o-2024-11-20",
                usage(1_000_000, 0)
            ),
            7.0
        ));
        // Overriding again keeps the slug rows.
        let again = table.with_overrides(&[]);
        assert!(close(
            again.cost_for_target(Some("my-azure"), "openai", "gpt-4o", usage(1_000_000, 0)),
            7.0
        ));
    }

    #[test]
    fn listed_prices_match_like_the_table() {
        let row = |model: &str, input: f64| ModelPrice {
            model: model.into(),
            input_per_million: input,
            output_per_million: 2.0 * input,
        };
        let rows = vec![
            row("GPT-4o", 1.0),
            row("gpt-4o-mini", 3.0),
            row("anthropic.claude-3-haiku", 5.0),
            row("mock-model", 7.0),
        ];
        let input = |model: &str| listed_price(&rows, model).map(|p| p.input_per_million);
        // Exact, case-insensitive; the output price comes along.
        assert_eq!(
            listed_price(&rows, "gpt-4o"),
            Some(Price {
                input_per_million: 1.0,
                output_per_million: 2.0
            })
        );
        assert_eq!(input("mock-model"), Some(7.0));
        // A dated version takes the longest listed prefix; another model does not.
        assert_eq!(input("gpt-4o-2024-08-06"), Some(1.0));
        assert_eq!(input("gpt-4o-mini-2024-07-18"), Some(3.0));
        assert_eq!(input("gpt-4o-future"), None);
        assert_eq!(input("mock-model-2"), Some(7.0));
        // A vendor path and a cross-region prefix are stripped.
        assert_eq!(input("openai/gpt-4o"), Some(1.0));
        assert_eq!(
            input("us.anthropic.claude-3-haiku-20240307-v1:0"),
            Some(5.0)
        );
        assert_eq!(input("unlisted"), None);
        assert_eq!(listed_price(&[], "gpt-4o"), None);
    }

    #[test]
    fn override_rows_are_validated_naming_the_field() {
        let row =
            |provider: Option<&str>, slug: Option<&str>, model: &str, input: f64| PriceOverride {
                provider: provider.map(str::to_owned),
                slug: slug.map(str::to_owned),
                model: model.into(),
                input_per_million: input,
                output_per_million: 1.0,
            };
        let paths = |r: PriceOverride| -> Vec<String> {
            r.issues("prices[0]").into_iter().map(|i| i.path).collect()
        };
        assert!(paths(row(Some("openai"), None, "m", 1.0)).is_empty());
        assert_eq!(paths(row(None, None, "m", 1.0)), vec!["prices[0]"]);
        assert_eq!(
            paths(row(Some("a"), Some("b"), "m", 1.0)),
            vec!["prices[0]"]
        );
        assert_eq!(
            paths(row(Some("a"), None, " ", 1.0)),
            vec!["prices[0].model"]
        );
        assert_eq!(
            paths(row(Some("a"), None, "m", -1.0)),
            vec!["prices[0].input_per_million"]
        );
        assert_eq!(
            paths(row(Some("a"), None, "m", f64::NAN)),
            vec!["prices[0].input_per_million"]
        );
        assert_eq!(paths(row(None, Some(""), "m", 1.0)), vec!["prices[0].slug"]);
    }
}
