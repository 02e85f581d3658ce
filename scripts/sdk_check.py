"""The OpenAI Python SDK against the gateway: every first-class route, plain and streamed.

Prints one line per check and a closing 'N passed, N failed' line; exits 1 on any failure.
"""
import json
import os
import sys

import openai
from openai import OpenAI

client = OpenAI(
    base_url=os.environ["GW_URL"],
    api_key="unused-the-saved-provider-has-the-key",
    default_headers={"x-gw-provider": "@mock"},
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
        default_headers={"x-gw-config": json.dumps(config)},
    )
    raw = routed.chat.completions.with_raw_response.create(
        model="gpt-sdk", messages=[{"role": "user", "content": "fall back"}]
    )
    assert raw.headers["x-gw-last-used-option-index"] == "config.targets[1]", raw.headers
    assert raw.parse().choices[0].message.content == "mock reply to: fall back"


def routed_client(config, extra_headers=None):
    headers = {"x-gw-config": json.dumps(config)}
    headers.update(extra_headers or {})
    return OpenAI(base_url=os.environ["GW_URL"], api_key="unused", default_headers=headers)


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
]:
    check(name, fn)
print(f"sdk-check: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
