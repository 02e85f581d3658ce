//! The provider table: every provider id the gateway knows, its wire format, default base URL
//! and how it expects the credential. Adding an OpenAI-compatible provider is one row here.

/// The request/response format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireFormat {
    /// OpenAI's Chat Completions, Embeddings and Moderations APIs.
    OpenAi,
    /// Anthropic's Messages API (chat only).
    Anthropic,
    /// Google's Gemini API (`generateContent`, `streamGenerateContent`, `batchEmbedContents`);
    /// Vertex AI serves the same format under a project and region.
    Gemini,
    /// AWS Bedrock's Converse and ConverseStream APIs, and InvokeModel for embeddings.
    Bedrock,
    /// Cohere's v2 Chat and Embed APIs.
    Cohere,
}

impl WireFormat {
    /// The name used in docs and the README's provider table.
    pub fn as_str(self) -> &'static str {
        match self {
            WireFormat::OpenAi => "openai",
            WireFormat::Anthropic => "anthropic",
            WireFormat::Gemini => "gemini",
            WireFormat::Bedrock => "bedrock",
            WireFormat::Cohere => "cohere",
        }
    }
}

/// How the provider wants the credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthStyle {
    /// `Authorization: Bearer <key>`; the key is required.
    Bearer,
    /// `Authorization: Bearer <key>` when a key is given; local servers run without one.
    OptionalBearer,
    /// The key in a header of this name (`api-key`, `x-api-key`...).
    Header(&'static str),
    /// AWS Signature Version 4 from the `aws_*` settings; no key is sent.
    SigV4,
}

/// One row of the provider table.
#[derive(Debug, Clone, Copy)]
pub struct ProviderSpec {
    /// The id used in `x-gw-provider` and configs.
    pub id: &'static str,
    pub name: &'static str,
    pub format: WireFormat,
    /// Base URL that the codec's path is appended to (for OpenAI's format, the client's path
    /// after `/v1`). `{name}` stands for the target's setting of that name (`{aws_region}`).
    pub base_url: &'static str,
    pub auth: AuthStyle,
}

const fn openai_compatible(
    id: &'static str,
    name: &'static str,
    base_url: &'static str,
) -> ProviderSpec {
    ProviderSpec {
        id,
        name,
        format: WireFormat::OpenAi,
        base_url,
        auth: AuthStyle::Bearer,
    }
}

const fn local_openai_compatible(
    id: &'static str,
    name: &'static str,
    base_url: &'static str,
) -> ProviderSpec {
    ProviderSpec {
        auth: AuthStyle::OptionalBearer,
        ..openai_compatible(id, name, base_url)
    }
}

/// Every provider the gateway knows, in the order `gateway` documents them.
pub static PROVIDERS: &[ProviderSpec] = &[
    openai_compatible("openai", "OpenAI", "https://api.openai.com/v1"),
    openai_compatible("groq", "Groq", "https://api.groq.com/openai/v1"),
    openai_compatible("together-ai", "Together AI", "https://api.together.xyz/v1"),
    openai_compatible(
        "fireworks-ai",
        "Fireworks AI",
        "https://api.fireworks.ai/inference/v1",
    ),
    openai_compatible("deepseek", "DeepSeek", "https://api.deepseek.com/v1"),
    openai_compatible("mistral-ai", "Mistral AI", "https://api.mistral.ai/v1"),
    openai_compatible(
        "perplexity-ai",
        "Perplexity AI",
        "https://api.perplexity.ai",
    ),
    openai_compatible("openrouter", "OpenRouter", "https://openrouter.ai/api/v1"),
    openai_compatible("x-ai", "xAI", "https://api.x.ai/v1"),
    openai_compatible(
        "deepinfra",
        "DeepInfra",
        "https://api.deepinfra.com/v1/openai",
    ),
    openai_compatible("cerebras", "Cerebras", "https://api.cerebras.ai/v1"),
    openai_compatible(
        "nebius",
        "Nebius AI Studio",
        "https://api.studio.nebius.ai/v1",
    ),
    openai_compatible("sambanova", "SambaNova", "https://api.sambanova.ai/v1"),
    openai_compatible("hyperbolic", "Hyperbolic", "https://api.hyperbolic.xyz/v1"),
    openai_compatible("novita-ai", "Novita AI", "https://api.novita.ai/v3/openai"),
    openai_compatible("lambda", "Lambda", "https://api.lambdalabs.com/v1"),
    openai_compatible(
        "github",
        "GitHub Models",
        "https://models.inference.ai.azure.com",
    ),
    openai_compatible(
        "nvidia",
        "NVIDIA NIM",
        "https://integrate.api.nvidia.com/v1",
    ),
    openai_compatible("moonshot", "Moonshot AI", "https://api.moonshot.cn/v1"),
    openai_compatible("zhipu", "Zhipu AI", "https://open.bigmodel.cn/api/paas/v4"),
    openai_compatible(
        "dashscope",
        "Alibaba DashScope",
        "https://dashscope.aliyuncs.com/compatible-mode/v1",
    ),
    openai_compatible(
        "huggingface",
        "Hugging Face",
        "https://router.huggingface.co/v1",
    ),
    openai_compatible(
        "featherless-ai",
        "Featherless AI",
        "https://api.featherless.ai/v1",
    ),
    openai_compatible(
        "siliconflow",
        "SiliconFlow",
        "https://api.siliconflow.cn/v1",
    ),
    openai_compatible(
        "inference-net",
        "Inference.net",
        "https://api.inference.net/v1",
    ),
    ProviderSpec {
        id: "anthropic",
        name: "Anthropic",
        format: WireFormat::Anthropic,
        base_url: "https://api.anthropic.com/v1",
        auth: AuthStyle::Header("x-api-key"),
    },
    ProviderSpec {
        id: "azure-openai",
        name: "Azure OpenAI",
        format: WireFormat::OpenAi,
        base_url: "https://{azure_resource_name}.openai.azure.com/openai",
        auth: AuthStyle::Header("api-key"),
    },
    ProviderSpec {
        id: "google",
        name: "Google Gemini",
        format: WireFormat::Gemini,
        base_url: "https://generativelanguage.googleapis.com/v1beta",
        auth: AuthStyle::Header("x-goog-api-key"),
    },
    ProviderSpec {
        id: "vertex-ai",
        name: "Google Vertex AI",
        format: WireFormat::Gemini,
        base_url: "https://{vertex_region}-aiplatform.googleapis.com/v1",
        auth: AuthStyle::Bearer,
    },
    ProviderSpec {
        id: "bedrock",
        name: "AWS Bedrock",
        format: WireFormat::Bedrock,
        base_url: "https://bedrock-runtime.{aws_region}.amazonaws.com",
        auth: AuthStyle::SigV4,
    },
    ProviderSpec {
        id: "cohere",
        name: "Cohere",
        format: WireFormat::Cohere,
        base_url: "https://api.cohere.com/v2",
        auth: AuthStyle::Bearer,
    },
    local_openai_compatible("ollama", "Ollama", "http://localhost:11434/v1"),
    local_openai_compatible("lm-studio", "LM Studio", "http://localhost:1234/v1"),
];

/// The row of a provider id.
pub fn find(id: &str) -> Option<&'static ProviderSpec> {
    PROVIDERS.iter().find(|p| p.id == id)
}

/// Every provider id, for error messages.
pub fn known_ids() -> String {
    PROVIDERS
        .iter()
        .map(|p| p.id)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::Endpoint;

    #[test]
    fn ids_are_unique_and_base_urls_parse() {
        let mut ids: Vec<_> = PROVIDERS.iter().map(|p| p.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), PROVIDERS.len());
        assert!(PROVIDERS.len() >= 20);
        for p in PROVIDERS {
            // Templated URLs are checked with their settings filled in.
            let url = p
                .base_url
                .replace("{azure_resource_name}", "res")
                .replace("{vertex_region}", "us-central1")
                .replace("{aws_region}", "us-east-1");
            assert!(
                !url.contains('{'),
                "{}: unknown setting in {}",
                p.id,
                p.base_url
            );
            let ep = Endpoint::parse(&url).unwrap_or_else(|e| panic!("{}: {e}", p.id));
            assert!(!ep.base_path.ends_with('/'), "{}", p.id);
        }
        assert_eq!(
            find("groq").unwrap().base_url,
            "https://api.groq.com/openai/v1"
        );
        assert!(find("nope").is_none());
    }
}
