"""The OpenAI Python SDK against the gateway: every first-class route, plain and streamed.

Prints one line per check and a closing 'N passed, N failed' line; exits 1 on any failure.
"""
import json
import os
import sys

import openai
from openai import OpenAI

# The gateway's own key (the default pipeline authenticates every request).
GW_KEY = {"x-gw-api-key": os.environ["GW_API_KEY"]}

client = OpenAI(
    base_url=os.environ["GW_URL"],
    api_key="unused-the-saved-provider-has-the-key",
    default_headers={"x-gw-provider": "@mock", **GW_KEY},
)
passed = failed = 0


def check(name, fn):
    global passed, failed
    try:
        fn()
        print(f"ok   {name}")
        passed += 1
    except Exception as e:  # report every failure, keep going
        print(f"FAIL {name}: {e!r}")
        failed += 1


def chat():
    r = client.chat.completions.create(
        model="gpt-sdk", messages=[{"role": "user", "content": "hello sdk"}], n=2
    )
    assert r.choices[0].message.content == "mock reply to: hello sdk", r
    assert len(r.choices) == 2 and r.model == "gpt-sdk"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens > 0


def chat_stream():
    stream = client.chat.completions.create(
        model="gpt-sdk",
        messages=[{"role": "user", "content": "stream this"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage:
            usage = chunk.usage
    assert text == "mock reply to: stream this", text
    assert usage is not None and usage.completion_tokens > 0


def tools():
    r = client.chat.completions.create(
        model="gpt-sdk",
        messages=[{"role": "user", "content": "weather in Oslo?"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    )
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"


def embeddings():
    r = client.embeddings.create(model="emb", input=["a b", "c"], dimensions=5)
    assert len(r.data) == 2 and len(r.data[0].embedding) == 5, r
    assert r.usage.prompt_tokens == 3


def moderations():
    r = client.moderations.create(model="text-moderation-latest", input="I hate this attack")
    assert r.results[0].flagged and r.results[0].categories.violence
    # The model the SDK's own examples use today.
    r = client.moderations.create(model="omni-moderation-latest", input="I hate this attack")
    assert r.results[0].flagged, r


def validation_error():
    try:
        client.chat.completions.create(
            model="gpt-sdk", messages=[{"role": "user", "content": "x"}], temperature=3
        )
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == "temperature", e.body
        return
    raise AssertionError("temperature=3 was accepted")


def fallback_config():
    base = os.environ["MOCK_URL"]
    config = {
        "strategy": {"mode": "fallback"},
        "targets": [
            {"provider": "openai", "api_key": "sk", "custom_host": base.replace("/v1", "/x-mock/status=503/v1")},
            {"provider": "openai", "api_key": "sk", "custom_host": base},
        ],
    }
    routed = OpenAI(
        base_url=os.environ["GW_URL"],
        api_key="unused",
        default_headers={"x-gw-config": json.dumps(config), **GW_KEY},
    )
    raw = routed.chat.completions.with_raw_response.create(
        model="gpt-sdk", messages=[{"role": "user", "content": "fall back"}]
    )
    assert raw.headers["x-gw-last-used-option-index"] == "config.targets[1]", raw.headers
    assert raw.parse().choices[0].message.content == "mock reply to: fall back"


def routed_client(config, extra_headers=None):
    headers = {"x-gw-config": json.dumps(config)}
    headers.update(extra_headers or {})
    return OpenAI(base_url=os.environ["GW_URL"], api_key="unused", default_headers={**headers, **GW_KEY})


def mock_target(**fields):
    return {"provider": "openai", "api_key": "sk", "custom_host": os.environ["MOCK_URL"], **fields}


def weighted_split():
    config = {
        "strategy": {"mode": "loadbalance"},
        "targets": [mock_target(weight=3), mock_target(weight=1), mock_target(weight=0)],
    }
    seen = {}
    for _ in range(40):
        raw = routed_client(config).chat.completions.with_raw_response.create(
            model="gpt-sdk", messages=[{"role": "user", "content": "split"}]
        )
        index = raw.headers["x-gw-last-used-option-index"]
        seen[index] = seen.get(index, 0) + 1
    assert "config.targets[2]" not in seen, seen
    assert seen.get("config.targets[0]", 0) > seen.get("config.targets[1]", 0) > 0, seen


def conditional_on_metadata():
    config = {
        "strategy": {
            "mode": "conditional",
            "conditions": [{"query": {"metadata.tier": {"$eq": "paid"}}, "then": "paid"}],
            "default": "free",
        },
        "targets": [
            mock_target(name="paid", override_params={"model": "large"}),
            mock_target(name="free", override_params={"model": "small"}),
        ],
    }
    paid = routed_client(config, {"x-gw-metadata": json.dumps({"tier": "paid"})})
    r = paid.chat.completions.create(model="any", messages=[{"role": "user", "content": "x"}])
    assert r.model == "large", r.model
    free = routed_client(config, {"x-gw-metadata": json.dumps({"tier": "trial"})})
    r = free.chat.completions.create(model="any", messages=[{"role": "user", "content": "x"}])
    assert r.model == "small", r.model


# Every wire format, selected by headers alone: the SDK must not be able to tell them apart.
PROVIDERS = {
    "openai": ("gpt-4o-mini", {"Authorization": "Bearer sk-openai"}),
    "anthropic": ("claude-3-5-haiku-latest", {"Authorization": "Bearer sk-ant"}),
    "azure-openai": (
        "gpt-4o",
        {
            "Authorization": "Bearer azure-key",
            "x-gw-azure-resource-name": "res",
            "x-gw-azure-deployment-id": "dep-1",
            "x-gw-azure-api-version": "2024-10-21",
        },
    ),
    "google": ("gemini-2.0-flash", {"Authorization": "Bearer gemini-key"}),
    "vertex-ai": (
        "gemini-2.0-flash",
        {
            "Authorization": "Bearer ya29.token",
            "x-gw-vertex-project-id": "proj-1",
            "x-gw-vertex-region": "us-central1",
        },
    ),
    "bedrock": (
        "anthropic.claude-3-5-sonnet-20240620-v1:0",
        {
            "x-gw-aws-access-key-id": "AKIDMOCKPROVIDER",
            "x-gw-aws-secret-access-key": "mock/secret/access/key",
            "x-gw-aws-region": "us-east-1",
        },
    ),
    "cohere": ("command-r-plus", {"Authorization": "Bearer co-key"}),
}

EMBED_MODELS = {
    "openai": "text-embedding-3-small",
    "azure-openai": "text-embedding-3-small",
    "google": "text-embedding-004",
    "vertex-ai": "text-embedding-004",
    "bedrock": "cohere.embed-english-v3",
    "cohere": "embed-english-v3.0",
}

WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def provider_client(provider):
    model, headers = PROVIDERS[provider]
    headers = {"x-gw-provider": provider, **headers}
    # The SDK sends its api_key as the bearer; the headers above override it where needed.
    key = headers.pop("Authorization", "Bearer unused").split(" ", 1)[1]
    return model, OpenAI(base_url=os.environ["GW_URL"], api_key=key, default_headers={**headers, **GW_KEY})


def provider_checks(provider):
    def plain():
        model, c = provider_client(provider)
        raw = c.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "hello sdk"}]
        )
        assert raw.headers["x-gw-provider"] == provider, raw.headers
        r = raw.parse()
        assert r.choices[0].message.content == "mock reply to: hello sdk", r
        assert r.choices[0].finish_reason == "stop", r
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens > 0

    def streamed():
        model, c = provider_client(provider)
        stream = c.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "stream this"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage, finish = "", None, None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            if chunk.usage:
                usage = chunk.usage
        assert text == "mock reply to: stream this", text
        assert finish == "stop", finish
        assert usage is not None and usage.completion_tokens > 0, usage

    def tool_call():
        model, c = provider_client(provider)
        r = c.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "weather in Oslo?"}],
            tools=WEATHER,
            tool_choice="required",
        )
        call = r.choices[0].message.tool_calls[0]
        assert r.choices[0].finish_reason == "tool_calls", r
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"mock": True, "n": 1}

    def streamed_tool_call():
        model, c = provider_client(provider)
        stream = c.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "weather in Oslo?"}],
            tools=WEATHER,
            tool_choice="required",
            stream=True,
        )
        name, args = None, ""
        for chunk in stream:
            for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                assert call.index == 0
                name = name or call.function.name
                args += call.function.arguments or ""
        assert name == "get_weather", name
        assert json.loads(args) == {"mock": True, "n": 1}, args

    def embeddings():
        # The SDK asks for base64 unless told otherwise; every format must honour that.
        _, c = provider_client(provider)
        model = EMBED_MODELS[provider]
        r = c.embeddings.create(model=model, input=["first text", "second text"])
        assert [d.index for d in r.data] == [0, 1], r
        assert len(r.data[0].embedding) > 0 and isinstance(r.data[0].embedding[0], float)
        assert r.data[0].embedding != r.data[1].embedding

    checks = [
        (f"{provider}: chat", plain),
        (f"{provider}: chat stream", streamed),
        (f"{provider}: tool call", tool_call),
        (f"{provider}: streamed tool call", streamed_tool_call),
    ]
    if provider in EMBED_MODELS:
        checks.append((f"{provider}: embeddings", embeddings))
    return checks


for name, fn in [
    ("chat", chat),
    ("chat stream", chat_stream),
    ("tool calls", tools),
    ("embeddings", embeddings),
    ("moderations", moderations),
    ("validation error", validation_error),
    ("fallback config", fallback_config),
    ("weighted split", weighted_split),
    ("conditional on metadata", conditional_on_metadata),
    *[c for provider in PROVIDERS for c in provider_checks(provider)],
]:
    check(name, fn)
print(f"sdk-check: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
